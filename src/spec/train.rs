//! Reading a `train` declaration into its typed value: each option through
//! its registry tag ([`crate::vocab::TRAIN_OPTIONS`]; an exhaustive `match`
//! collects what the source wrote for each), then read in the order the
//! options depend on one another (the batch before its accumulation, the
//! loss before the metrics).

use super::build::{named_args, Builder};
use super::{Checkpoint, Data, Eval, Fdo, Loss, Metric, Optimizer, Precision, Train};
use crate::ast::{self, Expr, ExprKind, OptValue};
use crate::diag::{did_you_mean, Problem};
use crate::source::{SourceMap, Span};
use crate::vocab::{
    DataSource, Entry, LogSink, TrainOption, Value, DATA_SOURCES, LOG_SINKS, LOSSES, METRICS,
    OPTIMIZERS, PRECISIONS, TRAIN_OPTIONS,
};
use std::path::Path;

/// What a `train` wrote for each option (the first, when one is given
/// twice: reported with the fields).
#[derive(Default)]
struct Written<'a> {
    data: Option<&'a OptValue>,
    batch: Option<&'a OptValue>,
    steps: Option<&'a OptValue>,
    loss: Option<&'a OptValue>,
    metrics: Option<&'a OptValue>,
    optimizer: Option<&'a OptValue>,
    log_every: Option<&'a OptValue>,
    log: Option<&'a OptValue>,
    seed: Option<&'a OptValue>,
    clip: Option<&'a OptValue>,
    accumulate: Option<&'a OptValue>,
    eval: Option<&'a OptValue>,
    checkpoint: Option<&'a OptValue>,
    fdo: Option<&'a OptValue>,
    precision: Option<&'a OptValue>,
}

impl<'a> Written<'a> {
    fn of(opts: &'a ast::Options) -> Written<'a> {
        let mut w = Written::default();
        for (k, v) in &opts.entries {
            // An unknown option was reported with the fields.
            let Some(o) = TrainOption::from_name(&k.name) else {
                continue;
            };
            let slot = match o {
                TrainOption::Data => &mut w.data,
                TrainOption::Batch => &mut w.batch,
                TrainOption::Steps => &mut w.steps,
                TrainOption::Loss => &mut w.loss,
                TrainOption::Metrics => &mut w.metrics,
                TrainOption::Optimizer => &mut w.optimizer,
                TrainOption::LogEvery => &mut w.log_every,
                TrainOption::Log => &mut w.log,
                TrainOption::Seed => &mut w.seed,
                TrainOption::ClipGradNorm => &mut w.clip,
                TrainOption::Accumulate => &mut w.accumulate,
                TrainOption::Eval => &mut w.eval,
                TrainOption::Checkpoint => &mut w.checkpoint,
                TrainOption::Fdo => &mut w.fdo,
                TrainOption::Precision => &mut w.precision,
            };
            slot.get_or_insert(v);
        }
        w
    }
}

/// The fields of an options-block option (`checkpoint: { every, keep, dir }`),
/// as the source gives them (the first of each).
#[derive(Default)]
struct Block {
    counts: Vec<(&'static str, usize)>,
    numbers: Vec<(&'static str, f64)>,
    dir: Option<(String, Span)>,
}

impl Block {
    fn count(&self, name: &str) -> Option<usize> {
        self.counts.iter().find(|c| c.0 == name).map(|c| c.1)
    }
    fn number(&self, name: &str) -> Option<f64> {
        self.numbers.iter().find(|c| c.0 == name).map(|c| c.1)
    }
}

impl<'a> Builder<'a> {
    /// A checked `train` declaration as a typed value (`None`: its model or
    /// mesh is not one, reported).
    pub(super) fn train(&mut self, t: &ast::TrainDecl, sources: &SourceMap) -> Option<Train> {
        let (decl, mesh) = self.model_and_mesh(t)?;
        self.check_fields(&t.options, &TRAIN_OPTIONS, t.model.span.to(t.mesh.span));
        let w = Written::of(&t.options);
        let span = |v: Option<&OptValue>| v.map(|v| v.span());
        let (batch, accumulate) = self.batch(&w);
        let steps = self.count(w.steps, TrainOption::Steps, 10, Some(super::MAX_STEPS));
        let log_every = self.count(w.log_every, TrainOption::LogEvery, 1, None);
        let seed = match w.seed {
            Some(v) => self.opt_int(v, "seed", 0).unwrap_or(0) as u64,
            None => 0,
        };
        let clip = w
            .clip
            .and_then(|v| self.opt_num(v, TrainOption::ClipGradNorm.name(), true));
        let optimizer = self.train_optimizer(w.optimizer);
        let dir = sources
            .get(t.span.file)
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let data = w.data.and_then(|v| {
            let word = self.check_choice(v, &DATA_SOURCES)?;
            match v {
                OptValue::Expr(e) => self.data(word.tag, e, &dir),
                OptValue::Options(_) => None,
            }
        });
        let LossChoice {
            loss,
            function: loss_fn,
            ignore: loss_ignore,
        } = self.loss(w.loss, decl);
        let precision = self.precision(w.precision);
        let log = w.log.map_or_else(
            || LOG_SINKS.defs.iter().map(|d| d.tag).collect(),
            |v| self.log_sinks(v),
        );
        let metrics = w
            .metrics
            .map(|v| self.metrics(v, loss, loss_fn.as_deref(), span(w.loss)))
            .unwrap_or_default();
        let eval_block = self.block(w.eval, TrainOption::Eval);
        let eval = eval_block.count("every").map(|every| Eval {
            every,
            steps: eval_block.count("steps").unwrap_or(1),
        });
        let ck = self.block(w.checkpoint, TrainOption::Checkpoint);
        let checkpoint_dir_span = ck.dir.as_ref().map(|d| d.1);
        let checkpoint = match (ck.count("every"), &ck.dir) {
            (Some(every), Some((d, _))) => Some(Checkpoint {
                every,
                keep: ck.count("keep").unwrap_or(1),
                dir: d.into(),
            }),
            _ => None,
        };
        let fdo_block = self.block(w.fdo, TrainOption::Fdo);
        let fdo_dir_span = fdo_block.dir.as_ref().map(|d| d.1);
        let fdo = fdo_block.count("every").map(|every| Fdo {
            every,
            dir: fdo_block
                .dir
                .as_ref()
                .map_or_else(|| "fdo".into(), |d| d.0.clone())
                .into(),
            headroom: fdo_block.number("headroom").unwrap_or(1.0),
        });
        Some(Train {
            model: t.model.name.clone(),
            model_span: t.model.span,
            mesh: t.mesh.name.clone(),
            mesh_span: t.mesh.span,
            mesh_kind: mesh.kind.clone(),
            sparsecores: mesh.sparsecores.max(1) as usize,
            span: t.span,
            batch,
            batch_span: span(w.batch),
            steps,
            accumulate,
            accumulate_span: span(w.accumulate),
            seed,
            log_every,
            log,
            loss,
            loss_span: span(w.loss),
            loss_fn,
            loss_ignore,
            metrics,
            optimizer,
            clip,
            eval,
            eval_span: span(w.eval),
            checkpoint,
            checkpoint_dir_span,
            data,
            data_span: span(w.data),
            fdo,
            fdo_dir_span,
            precision,
        })
    }

    /// The trained model's declaration and the mesh, both known.
    fn model_and_mesh(
        &mut self,
        t: &ast::TrainDecl,
    ) -> Option<(&'a ast::LayerDecl, &'a crate::resolve::Mesh)> {
        let prog = self.prog;
        let Some(decl) = prog.layers.get(&t.model.name) else {
            let models: Vec<&str> = prog
                .layers
                .values()
                .filter(|l| l.is_model)
                .map(|l| l.name.name.as_str())
                .collect();
            self.report(Problem::UnknownName {
                span: t.model.span,
                name: t.model.name.clone(),
                what: "model",
                suggestion: did_you_mean(&t.model.name, models),
            });
            return None;
        };
        if !decl.is_model {
            self.report(Problem::WrongKind {
                span: t.model.span,
                expected: "a model".into(),
                found: format!("the layer `{}` (declare it with `model`)", t.model.name),
            });
            return None;
        }
        let Some(mesh) = prog.mesh(&t.mesh.name) else {
            self.report(Problem::UnknownName {
                span: t.mesh.span,
                name: t.mesh.name.clone(),
                what: "mesh",
                suggestion: did_you_mean(&t.mesh.name, prog.meshes.iter().map(|m| m.name.as_str())),
            });
            return None;
        };
        Some((decl, mesh))
    }

    /// `batch` (at most [`super::MAX_BATCH`]) and `accumulate` (dividing it).
    fn batch(&mut self, w: &Written) -> (Option<usize>, usize) {
        let mut batch = w.batch.and_then(|v| self.opt_int(v, "batch", 1));
        if let (Some(b), Some(v)) = (batch, w.batch) {
            if b > super::MAX_BATCH {
                self.report(Problem::BadValue {
                    span: v.span(),
                    message: format!(
                        "batch {b} is more than the {} examples a step may hold",
                        super::MAX_BATCH
                    ),
                    help: Some("use a smaller batch, or `accumulate` microbatches".into()),
                });
                batch = None;
            }
        }
        let mut accumulate = 1;
        if let (Some(b), Some(v)) = (batch, w.accumulate) {
            if let Some(k) = self.opt_int(v, "accumulate", 1) {
                if b % k != 0 {
                    self.report(Problem::BadValue { span: v.span(), message: format!("batch {b} cannot be split into {k} equal microbatches"), help: Some(format!("use a batch that is a multiple of {k}, or accumulate over a divisor of {b}")) });
                    batch = None;
                } else {
                    accumulate = k as usize;
                }
            }
        }
        (batch.map(|b| b as usize), accumulate)
    }

    /// A count option (`steps`, `log_every`): at least 1, at most `most`.
    fn count(
        &mut self,
        v: Option<&OptValue>,
        o: TrainOption,
        default: usize,
        most: Option<usize>,
    ) -> usize {
        let Some(v) = v else { return default };
        let Some(n) = self.opt_int(v, o.name(), 1) else {
            return default;
        };
        let n = usize::try_from(n).unwrap_or(usize::MAX);
        match most {
            Some(most) if n > most => {
                self.report(Problem::BadValue {
                    span: v.span(),
                    message: format!("{n} steps are more than the {most} one run may take"),
                    help: Some("train in several runs with `checkpoint` and `--resume`".into()),
                });
                default
            }
            _ => n,
        }
    }

    /// The run's optimizer (not one for tables only).
    fn train_optimizer(&mut self, v: Option<&OptValue>) -> Optimizer {
        let Some(v) = v else {
            return Optimizer::default();
        };
        let Some(word) = self.check_choice(v, &OPTIMIZERS) else {
            return Optimizer::default();
        };
        if word.tag.tables_only() {
            self.report(Problem::BadValue {
                span: v.span(),
                message: format!("`{}` is an optimizer for embedding tables only", word.name),
                help: Some(format!(
                    "give the table `optimizer: {}(...)` and the model `adam` or `sgd`",
                    word.name
                )),
            });
        }
        match v {
            OptValue::Expr(e) => self.optimizer(word.tag, e),
            OptValue::Options(_) => Optimizer::default(),
        }
    }

    /// `loss:` a built-in loss (with its arguments:
    /// `softmax_cross_entropy(ignore_index: -100)`), or a `fn` of the model.
    fn loss(&mut self, v: Option<&OptValue>, decl: &ast::LayerDecl) -> LossChoice {
        let builtin = |loss| LossChoice {
            loss,
            ..LossChoice::default()
        };
        match v {
            None => LossChoice::default(),
            Some(OptValue::Expr(Expr {
                kind: ExprKind::Name(n),
                span,
            })) => match Loss::from_name(n) {
                Some(l) => builtin(l),
                None if n != "forward" && has_fn(decl, n) => LossChoice {
                    loss: Loss::Function,
                    function: Some(n.clone()),
                    ignore: None,
                },
                None => {
                    self.report(Problem::UnknownChoice {
                        span: *span,
                        kind: LOSSES.what,
                        name: n.clone(),
                        known: LOSSES.names(),
                    });
                    LossChoice::default()
                }
            },
            Some(
                v @ OptValue::Expr(
                    e @ Expr {
                        kind: ExprKind::Call(..),
                        ..
                    },
                ),
            ) => {
                let Some(word) = self.check_choice(v, &LOSSES) else {
                    return LossChoice::default();
                };
                let ignore = super::build::named_args(e)
                    .into_iter()
                    .find(|a| a.0 == "ignore_index")
                    .and_then(|a| self.int_value(a.1));
                LossChoice {
                    loss: word.tag,
                    function: None,
                    ignore,
                }
            }
            Some(other) => {
                self.report(Problem::WrongKind {
                    span: other.span(),
                    expected: "a loss name".into(),
                    found: "something else".into(),
                });
                LossChoice::default()
            }
        }
    }

    /// `precision: bf16`.
    fn precision(&mut self, v: Option<&OptValue>) -> Precision {
        match v {
            None => Precision::default(),
            Some(OptValue::Expr(Expr {
                kind: ExprKind::Name(n),
                span,
            })) => Precision::from_name(n).unwrap_or_else(|| {
                self.report(Problem::UnknownChoice {
                    span: *span,
                    kind: PRECISIONS.what,
                    name: n.clone(),
                    known: PRECISIONS.names(),
                });
                Precision::default()
            }),
            Some(other) => {
                let names: Vec<String> = PRECISIONS.names().iter().map(|n| n.to_string()).collect();
                self.report(Problem::WrongKind {
                    span: other.span(),
                    expected: format!("a precision ({})", or_list(&names)),
                    found: "something else".into(),
                });
                Precision::default()
            }
        }
    }

    /// An options-block option (`eval`, `checkpoint`, `fdo`), its fields
    /// checked against the registry's.
    fn block(&mut self, v: Option<&OptValue>, o: TrainOption) -> Block {
        let mut b = Block::default();
        let name = o.name();
        let opts = match v {
            Some(OptValue::Options(opts)) => opts,
            Some(other) => {
                self.report(Problem::WrongKind {
                    span: other.span(),
                    expected: format!("an options block `{name}: {{ every: N, ... }}`"),
                    found: "a value".into(),
                });
                return b;
            }
            None => return b,
        };
        self.check_block(opts, o.def(), opts.span);
        for (k, v) in &opts.entries {
            // An unknown field was reported with the fields.
            let Some(arg) = o.def().arg(&k.name) else {
                continue;
            };
            let first = b.count(arg.name).is_none() && b.number(arg.name).is_none();
            match (arg.value, v) {
                (Value::Count, _) => {
                    if let Some(n) = self.opt_int(v, arg.name, 1) {
                        b.counts.extend(first.then_some((arg.name, n as usize)));
                    }
                }
                (Value::Number | Value::Positive, _) => {
                    let positive = arg.value == Value::Positive;
                    if let Some(x) = self.opt_num(v, arg.name, positive) {
                        b.numbers.extend(first.then_some((arg.name, x)));
                    }
                }
                (
                    Value::Path,
                    OptValue::Expr(Expr {
                        kind: ExprKind::Str(s),
                        span,
                    }),
                ) => {
                    b.dir.get_or_insert((s.clone(), *span));
                }
                (
                    Value::Path
                    | Value::Name
                    | Value::Unit
                    | Value::Flag
                    | Value::Integer
                    | Value::Lr
                    | Value::Patterns
                    | Value::Scales,
                    _,
                ) => self.check_arg(arg.value, arg.name, v),
            }
        }
        b
    }

    /// The names of a list option (`[accuracy, auc]`) with their spans; a
    /// value that is not a list (`list` says what was expected) or an item
    /// that is not a name (`item`) is reported and left out.
    fn name_list<'v>(&mut self, v: &'v OptValue, list: &str, item: &str) -> Vec<(&'v str, Span)> {
        let items = match v {
            OptValue::Expr(Expr {
                kind: ExprKind::List(items),
                ..
            }) => items,
            other => {
                self.report(Problem::WrongKind {
                    span: other.span(),
                    expected: list.into(),
                    found: "something else".into(),
                });
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for it in items {
            match it.as_name() {
                Some(named) => out.push(named),
                None => self.report(Problem::WrongKind {
                    span: it.span(),
                    expected: item.into(),
                    found: match it {
                        ast::ListItem::Expr(_) => "an expression",
                        ast::ListItem::Dim(_) => "a dimension",
                    }
                    .into(),
                }),
            }
        }
        out
    }

    /// `metrics: [accuracy, auc]`: known names, each once, each defined for
    /// the run's loss.
    fn metrics(
        &mut self,
        v: &OptValue,
        loss: Loss,
        loss_fn: Option<&str>,
        loss_span: Option<Span>,
    ) -> Vec<Metric> {
        let mut out = Vec::new();
        for (name, span) in
            self.name_list(v, "a list of metrics like `[accuracy]`", "a metric name")
        {
            let Some(m) = Metric::from_name(name) else {
                self.report(Problem::UnknownChoice {
                    span,
                    kind: METRICS.what,
                    name: name.into(),
                    known: METRICS.names(),
                });
                continue;
            };
            if out.contains(&m) {
                self.report(Problem::BadValue {
                    span,
                    message: format!("`{name}` is listed twice"),
                    help: Some("list each metric once".into()),
                });
            } else if !m.fits(loss) {
                self.report(Problem::MetricLoss {
                    span,
                    metric: m.name(),
                    loss: loss_fn.unwrap_or(loss.name()).to_string(),
                    loss_span,
                });
            } else {
                out.push(m);
            }
        }
        out
    }

    /// `log: [jsonl, tensorboard]`: each sink once (an empty list logs nothing
    /// but the progress lines).
    fn log_sinks(&mut self, v: &OptValue) -> Vec<LogSink> {
        let mut out = Vec::new();
        let names = self.name_list(
            v,
            "a list of logs like `[jsonl, tensorboard]`",
            "a log name",
        );
        for (name, span) in names {
            let Some(sink) = LOG_SINKS.find(name) else {
                self.report(Problem::UnknownChoice {
                    span,
                    kind: LOG_SINKS.what,
                    name: name.into(),
                    known: LOG_SINKS.names(),
                });
                continue;
            };
            if out.contains(&sink.tag) {
                self.report(Problem::BadValue {
                    span,
                    message: format!("`{name}` is listed twice"),
                    help: Some("list each log once".into()),
                });
            } else {
                out.push(sink.tag);
            }
        }
        out
    }

    /// A checked data source as a typed value (the registry's defaults for
    /// what it leaves out).
    fn data(&mut self, kind: DataSource, e: &Expr, dir: &Path) -> Option<Data> {
        let args = named_args(e);
        let arg = |k: &str| args.iter().find(|a| a.0 == k).map(|a| a.1);
        let int = |b: &Builder, k: &str| {
            arg(k)
                .and_then(|e| b.int_value(e))
                .filter(|v| *v >= 1)
                .map(|v| v as usize)
        };
        // A count left out: the registry's default.
        let count = |b: &Builder, k: &str| {
            int(b, k).unwrap_or_else(|| {
                kind.def()
                    .arg(k)
                    .and_then(|a| a.omitted.number())
                    .map_or(1, |v| v as usize)
            })
        };
        let span_of = |k: &str| arg(k).map(|e| e.span);
        // `path`: checked (a string, present) with the choice's arguments.
        let path_of = |k: &str| match arg(k) {
            Some(Expr {
                kind: ExprKind::Str(s),
                span,
            }) => Some((dir.join(s), s.clone(), *span)),
            _ => None,
        };
        let path = || path_of("path");
        let flag = |k: &str| arg(k).and_then(super::build::flag).unwrap_or(false);
        Some(match kind {
            DataSource::ShakespeareWords => Data::ShakespeareWords {
                vocab: int(self, "vocab"),
                vocab_span: span_of("vocab"),
                seq: count(self, "seq"),
            },
            DataSource::ShakespeareChars => Data::ShakespeareChars {
                seq: count(self, "seq"),
            },
            DataSource::Text => {
                let (path, written, path_span) = path()?;
                Data::Text {
                    path,
                    written,
                    path_span,
                    seq: count(self, "seq"),
                    vocab: int(self, "vocab"),
                    vocab_span: span_of("vocab"),
                }
            }
            DataSource::Tokens => {
                let (path, written, path_span) = path()?;
                Data::Tokens {
                    path,
                    written,
                    path_span,
                    eval_path: path_of("eval_path"),
                    seq: count(self, "seq"),
                    uint32: flag("uint32"),
                    sequential: flag("sequential"),
                    eval: arg("eval").and_then(super::build::num).unwrap_or(0.1),
                    column: match arg("column") {
                        Some(Expr {
                            kind: ExprKind::Str(s),
                            span,
                        }) => Some((s.clone(), *span)),
                        _ => None,
                    },
                    tokenizer: path_of("tokenizer"),
                }
            }
            DataSource::Arrays => {
                let (path, written, path_span) = path()?;
                Data::Arrays {
                    path,
                    written,
                    path_span,
                }
            }
            DataSource::Clicks => Data::Clicks {
                vocab: int(self, "vocab"),
                vocab_span: span_of("vocab"),
            },
            DataSource::Synthetic => Data::Synthetic {
                classes: int(self, "classes"),
                classes_span: span_of("classes"),
                vocab: int(self, "vocab"),
                vocab_span: span_of("vocab"),
            },
        })
    }
}

/// `a, b or c`.
/// What `loss:` names: a built-in loss and its `ignore_index`, or a
/// function of the model.
#[derive(Default)]
struct LossChoice {
    loss: Loss,
    function: Option<String>,
    ignore: Option<i64>,
}

fn or_list(names: &[String]) -> String {
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

/// Whether the layer declares a function `name`.
fn has_fn(decl: &ast::LayerDecl, name: &str) -> bool {
    decl.members
        .iter()
        .any(|m| matches!(m, ast::Member::Fn(f) if f.name.name == name))
}
