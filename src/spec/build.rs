//! Reading `train` and `table` declarations into typed values, with a
//! diagnostic for every field that is unknown, missing, or of the wrong kind.

use super::{
    Checkpoint, Data, Eval, Fdo, Loss, Metric, OptKind, Optimizer, Schedule, Spec, Table, Train,
};
use crate::ast::{self, Expr, ExprKind, OptValue, Options};
use crate::diag::{did_you_mean, Diagnostic, Problem};
use crate::embed::{Combiner, Overflow};
use crate::init::Init;
use crate::resolve::Program;
use crate::source::{SourceMap, Span};
use std::path::Path;

/// Data sources and their arguments.
pub const DATA: &[(&str, &[&str])] = &[
    ("shakespeare_words", &["vocab", "seq"]),
    ("shakespeare_chars", &["seq"]),
    ("text", &["path", "seq", "vocab"]),
    ("arrays", &["path"]),
    ("synthetic", &["classes", "vocab"]),
    ("clicks", &["vocab"]),
];
/// `train`'s options.
pub const TRAIN_FIELDS: &[&str] = &[
    "data",
    "batch",
    "steps",
    "loss",
    "metrics",
    "optimizer",
    "log_every",
    "seed",
    "clip_grad_norm",
    "accumulate",
    "eval",
    "checkpoint",
    "fdo",
    "precision",
];
/// A `table`'s options.
pub const TABLE_FIELDS: &[&str] = &[
    "vocab",
    "dim",
    "init",
    "combiner",
    "optimizer",
    "frozen",
    "max_ids_per_partition",
    "max_unique_ids_per_partition",
    "stack_max_ids_per_partition",
    "stack_max_unique_ids_per_partition",
    "suggested_buffer_size",
    "overflow",
    "shard",
];

/// The typed specification of every `train` and table of a resolved program,
/// and the problems found on the way.
pub fn build(prog: &Program, sources: &SourceMap) -> (Spec, Vec<Diagnostic>) {
    let mut b = Builder {
        prog,
        problems: Vec::new(),
    };
    let tables = prog.tables.iter().map(|t| b.table(t)).collect();
    let trains = prog
        .trains
        .iter()
        .filter_map(|t| b.train(t, sources))
        .collect();
    let diags = b.problems.into_iter().map(|p| p.diagnostic()).collect();
    (Spec { trains, tables }, diags)
}

struct Builder<'a> {
    prog: &'a Program,
    problems: Vec<Problem>,
}

fn num(e: &Expr) -> Option<f64> {
    match &e.kind {
        ExprKind::Float(v) => Some(*v),
        ExprKind::Int(v) => Some(*v as f64),
        ExprKind::Neg(x) => num(x).map(|v| -v),
        _ => None,
    }
}

/// A call-shaped option value: `adam(lr: 0.005)` or a bare name `adam`.
fn call_parts(e: &Expr) -> Option<(&str, Span, Vec<&ast::Arg>)> {
    match &e.kind {
        ExprKind::Name(n) => Some((n, e.span, vec![])),
        ExprKind::Call(c, args) => match &c.kind {
            ExprKind::Name(n) => Some((n, c.span, args.iter().collect())),
            _ => None,
        },
        _ => None,
    }
}

/// The named expression arguments of a call-shaped value.
fn named_args(e: &Expr) -> Vec<(&str, &Expr)> {
    e.as_call().map(|(_, a)| a).unwrap_or_default()
}

impl Builder<'_> {
    fn report(&mut self, p: Problem) {
        self.problems.push(p);
    }

    /// An integer literal or constant.
    fn int_value(&self, e: &Expr) -> Option<i64> {
        match &e.kind {
            ExprKind::Int(x) => Some(*x),
            ExprKind::Name(n) => self.prog.consts.get(n).map(|c| c.0),
            _ => None,
        }
    }

    fn opt_int(&mut self, v: &OptValue, what: &str, min: i64) -> Option<i64> {
        let val = match v {
            OptValue::Expr(e) => self.int_value(e),
            _ => None,
        };
        match val {
            Some(x) if x >= min => Some(x),
            _ => {
                self.report(Problem::BadValue {
                    span: v.span(),
                    message: format!("`{what}` must be an integer of at least {min}"),
                    help: None,
                });
                None
            }
        }
    }

    fn opt_num(&mut self, v: &OptValue, what: &str, positive: bool) -> Option<f64> {
        let val = match v {
            OptValue::Expr(e) => match &e.kind {
                ExprKind::Float(x) => Some(*x),
                ExprKind::Int(x) => Some(*x as f64),
                _ => None,
            },
            _ => None,
        };
        match val {
            Some(x) if !positive || x > 0.0 => Some(x),
            _ => {
                let req = if positive {
                    "a positive number"
                } else {
                    "a number"
                };
                self.report(Problem::BadValue {
                    span: v.span(),
                    message: format!("`{what}` must be {req}"),
                    help: None,
                });
                None
            }
        }
    }

    fn check_fields(
        &mut self,
        opts: &Options,
        known: &[&str],
        required: &[&str],
        what: &str,
        at: Span,
    ) {
        let mut seen: Vec<&str> = Vec::new();
        for (k, _) in &opts.entries {
            if seen.contains(&k.name.as_str()) {
                self.report(Problem::Field {
                    span: k.span,
                    message: format!("`{}` is given twice", k.name),
                    known: vec![],
                });
            }
            seen.push(&k.name);
            if !known.contains(&k.name.as_str()) {
                let msg = match did_you_mean(&k.name, known.iter().copied()) {
                    Some(s) => format!("unknown {what} field `{}` (did you mean `{s}`?)", k.name),
                    None => format!("unknown {what} field `{}`", k.name),
                };
                self.report(Problem::Field {
                    span: k.span,
                    message: msg,
                    known: known.iter().map(|s| s.to_string()).collect(),
                });
            }
        }
        for r in required {
            if opts.get(r).is_none() {
                self.report(Problem::Field {
                    span: at,
                    message: format!("missing {what} field `{r}`"),
                    known: vec![],
                });
            }
        }
    }

    /// `name(arg: value, ...)` against a table of choices and their arguments:
    /// the name when it is one of them (its arguments checked).
    fn check_choice<'e>(
        &mut self,
        v: &'e OptValue,
        kind: &'static str,
        table: &[(&'static str, &[&str])],
    ) -> Option<&'e str> {
        let OptValue::Expr(e) = v else {
            self.report(Problem::WrongKind {
                span: v.span(),
                expected: format!("a {kind}"),
                found: "an options block".into(),
            });
            return None;
        };
        let Some((name, nspan, args)) = call_parts(e) else {
            self.report(Problem::WrongKind {
                span: e.span,
                expected: format!("a {kind} like `{}(...)`", table[0].0),
                found: "an expression".into(),
            });
            return None;
        };
        let Some((_, known)) = table.iter().find(|(n, _)| *n == name) else {
            self.report(Problem::UnknownChoice {
                span: nspan,
                kind,
                name: name.into(),
                known: table.iter().map(|t| t.0).collect(),
            });
            return None;
        };
        for a in args {
            match a {
                ast::Arg::Named(k, val) => {
                    if !known.contains(&k.name.as_str()) {
                        self.report(Problem::NamedArg {
                            span: k.span,
                            callee: name.into(),
                            name: k.name.clone(),
                            known: known.iter().map(|s| s.to_string()).collect(),
                            missing: false,
                        });
                        continue;
                    }
                    if k.name == "lr" {
                        if let OptValue::Expr(le) = val {
                            if matches!(le.kind, ExprKind::Call(..) | ExprKind::Name(_)) {
                                if let Some(s) = self.check_choice(
                                    val,
                                    "learning-rate schedule",
                                    Schedule::NAMES,
                                ) {
                                    self.check_schedule(s, le);
                                }
                                continue;
                            }
                        }
                    }
                    if k.name == "path" {
                        if !matches!(
                            val,
                            OptValue::Expr(Expr {
                                kind: ExprKind::Str(_),
                                ..
                            })
                        ) {
                            self.report(Problem::BadValue {
                                span: val.span(),
                                message: "`path` must be a string".into(),
                                help: None,
                            });
                        }
                        continue;
                    }
                    if k.name == "nesterov" {
                        if !matches!(val, OptValue::Expr(Expr { kind: ExprKind::Name(b), .. }) if b == "true" || b == "false")
                        {
                            self.report(Problem::BadValue {
                                span: val.span(),
                                message: "`nesterov` must be `true` or `false`".into(),
                                help: None,
                            });
                        }
                        continue;
                    }
                    if ["vocab", "seq", "warmup", "decay", "stable", "classes"]
                        .contains(&k.name.as_str())
                    {
                        self.opt_int(val, &k.name, 1);
                    } else {
                        let nonneg_ok = [
                            "momentum",
                            "weight_decay",
                            "init",
                            "end",
                            "initial_accumulator",
                            "l1",
                            "l2",
                            "lr_power",
                            "value",
                            "b1",
                            "b2",
                        ]
                        .contains(&k.name.as_str());
                        if let Some(x) = self.opt_num(val, &k.name, !nonneg_ok) {
                            if (k.name == "b1" || k.name == "b2") && !(0.0..1.0).contains(&x) {
                                self.report(Problem::BadValue {
                                    span: val.span(),
                                    message: format!("`{}` must be in [0, 1)", k.name),
                                    help: None,
                                });
                            }
                        }
                    }
                }
                other => self.report(Problem::WrongKind {
                    span: other.span(),
                    expected: "a named argument like `lr: 0.001`".into(),
                    found: "a positional argument".into(),
                }),
            }
        }
        Some(name)
    }

    /// A schedule's required arguments are present (`check_choice` checks
    /// each value).
    fn check_schedule(&mut self, name: &str, e: &Expr) {
        let args = named_args(e);
        for k in Schedule::required(name) {
            if !args.iter().any(|a| a.0 == *k) {
                self.report(Problem::NamedArg {
                    span: e.span,
                    callee: name.into(),
                    name: k.to_string(),
                    known: Schedule::required(name)
                        .iter()
                        .map(|s| s.to_string())
                        .collect(),
                    missing: true,
                });
            }
        }
    }

    /// A checked optimizer expression as a typed value (defaults for what it
    /// leaves out).
    fn optimizer(&self, name: &str, e: &Expr) -> Optimizer {
        let args = named_args(e);
        let get = |k: &str, default: f64| {
            args.iter()
                .find(|a| a.0 == k)
                .and_then(|a| num(a.1))
                .unwrap_or(default)
        };
        let lr = match args.iter().find(|a| a.0 == "lr").map(|a| a.1) {
            None => Schedule::Constant(1e-3),
            Some(v) => match v.as_call() {
                Some((name, a)) => Schedule::build(name, &|k: &str| {
                    a.iter().find(|x| x.0 == k).and_then(|x| num(x.1))
                }),
                None => Schedule::Constant(num(v).unwrap_or(1e-3)),
            },
        };
        let (b1, b2, eps) = (get("b1", 0.9), get("b2", 0.999), get("eps", 1e-8));
        // optax.adagrad's and TensorFlow FTRL's starting accumulator.
        let acc = get("initial_accumulator", 0.1);
        let kind = match name {
            "sgd" => OptKind::Sgd {
                momentum: get("momentum", 0.0),
                nesterov: args.iter().any(|a| {
                    a.0 == "nesterov" && matches!(&a.1.kind, ExprKind::Name(n) if n == "true")
                }),
            },
            "adamw" => OptKind::AdamW {
                b1,
                b2,
                eps,
                weight_decay: get("weight_decay", 1e-4),
            },
            "adagrad" => OptKind::Adagrad {
                initial_accumulator: acc,
                eps,
            },
            "ftrl" => OptKind::Ftrl {
                lr_power: get("lr_power", -0.5),
                l1: get("l1", 0.0),
                l2: get("l2", 0.0),
                initial_accumulator: acc,
            },
            _ => OptKind::Adam { b1, b2, eps },
        };
        Optimizer { kind, lr }
    }

    fn train(&mut self, t: &ast::TrainDecl, sources: &SourceMap) -> Option<Train> {
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
        self.check_fields(
            &t.options,
            TRAIN_FIELDS,
            &["batch", "steps", "optimizer"],
            "train",
            t.model.span.to(t.mesh.span),
        );
        let o = &t.options;
        let mut batch = o.get("batch").and_then(|v| self.opt_int(v, "batch", 1));
        if let (Some(b), Some(v)) = (batch, o.get("batch")) {
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
        if let (Some(b), Some(v)) = (batch, o.get("accumulate")) {
            if let Some(k) = self.opt_int(v, "accumulate", 1) {
                if b % k != 0 {
                    self.report(Problem::BadValue { span: v.span(), message: format!("batch {b} cannot be split into {k} equal microbatches"), help: Some(format!("use a batch that is a multiple of {k}, or accumulate over a divisor of {b}")) });
                    batch = None;
                } else {
                    accumulate = k as usize;
                }
            }
        }
        let mut steps = 10;
        let mut log_every = 1;
        for f in ["steps", "log_every"] {
            if let Some(v) = o.get(f) {
                if let Some(n) = self.opt_int(v, f, 1) {
                    let n = usize::try_from(n).unwrap_or(usize::MAX);
                    if f == "steps" && n > super::MAX_STEPS {
                        self.report(Problem::BadValue {
                            span: v.span(),
                            message: format!(
                                "{n} steps are more than the {} one run may take",
                                super::MAX_STEPS
                            ),
                            help: Some(
                                "train in several runs with `checkpoint` and `--resume`".into(),
                            ),
                        });
                    } else if f == "steps" {
                        steps = n;
                    } else {
                        log_every = n;
                    }
                }
            }
        }
        let seed = match o.get("seed") {
            Some(v) => self.opt_int(v, "seed", 0).unwrap_or(0) as u64,
            None => 0,
        };
        let clip = o
            .get("clip_grad_norm")
            .and_then(|v| self.opt_num(v, "clip_grad_norm", true));
        let mut optimizer = Optimizer::default();
        if let Some(v) = o.get("optimizer") {
            if let Some(name) = self.check_choice(v, "optimizer", Optimizer::NAMES) {
                if name == "ftrl" {
                    self.report(Problem::BadValue {
                        span: v.span(),
                        message: "`ftrl` is an optimizer for embedding tables only".into(),
                        help: Some(
                            "give the table `optimizer: ftrl(...)` and the model `adam` or `sgd`"
                                .into(),
                        ),
                    });
                }
                if let OptValue::Expr(e) = v {
                    optimizer = self.optimizer(name, e);
                }
            }
        }
        let dir = sources
            .get(t.span.file)
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let data = match o.get("data") {
            Some(v) => match self.check_choice(v, "data source", DATA) {
                Some(name) => match v {
                    OptValue::Expr(e) => self.data(name, e, &dir),
                    _ => None,
                },
                None => None,
            },
            None => None,
        };
        let mut loss = Loss::SoftmaxCrossEntropy;
        let mut loss_fn = None;
        if let Some(v) = o.get("loss") {
            match v {
                OptValue::Expr(Expr {
                    kind: ExprKind::Name(n),
                    span,
                }) => match Loss::from_name(n) {
                    Some(l) => loss = l,
                    None if n != "forward" && has_fn(decl, n) => {
                        loss = Loss::Function;
                        loss_fn = Some(n.clone());
                    }
                    None => self.report(Problem::UnknownChoice {
                        span: *span,
                        kind: "loss",
                        name: n.clone(),
                        known: Loss::NAMES.to_vec(),
                    }),
                },
                other => self.report(Problem::WrongKind {
                    span: other.span(),
                    expected: "a loss name".into(),
                    found: "something else".into(),
                }),
            }
        }
        let mut precision = super::Precision::F32;
        if let Some(v) = o.get("precision") {
            match v {
                OptValue::Expr(Expr {
                    kind: ExprKind::Name(n),
                    span,
                }) => match super::Precision::from_name(n) {
                    Some(p) => precision = p,
                    None => self.report(Problem::UnknownChoice {
                        span: *span,
                        kind: "precision",
                        name: n.clone(),
                        known: super::Precision::NAMES.to_vec(),
                    }),
                },
                other => self.report(Problem::WrongKind {
                    span: other.span(),
                    expected: "a precision (f32, bf16 or f16)".into(),
                    found: "something else".into(),
                }),
            }
        }
        let metrics = o
            .get("metrics")
            .map(|v| self.metrics(v, loss, loss_fn.as_deref(), o.get("loss").map(|l| l.span())))
            .unwrap_or_default();
        let block = |b: &mut Builder, name: &str, fields: &[&str], req: &[&str]| {
            let mut every = None;
            let mut count = None;
            let mut keep = None;
            let mut dir_v = None;
            let mut headroom = None;
            match o.get(name) {
                Some(OptValue::Options(opts)) => {
                    b.check_fields(opts, fields, req, name, opts.span);
                    for (k, v) in &opts.entries {
                        match k.name.as_str() {
                            "every" | "steps" | "keep" => {
                                let n = b.opt_int(v, &k.name, 1).map(|n| n as usize);
                                match k.name.as_str() {
                                    "every" => every = every.or(n),
                                    "steps" => count = count.or(n),
                                    _ => keep = keep.or(n),
                                }
                            }
                            "dir" => match v {
                                OptValue::Expr(Expr {
                                    kind: ExprKind::Str(s),
                                    span,
                                }) => dir_v = dir_v.or(Some((s.clone(), *span))),
                                _ => b.report(Problem::BadValue {
                                    span: v.span(),
                                    message: "`dir` must be a string".into(),
                                    help: None,
                                }),
                            },
                            "headroom" => headroom = headroom.or(b.opt_num(v, "headroom", true)),
                            _ => {}
                        }
                    }
                }
                Some(other) => b.report(Problem::WrongKind {
                    span: other.span(),
                    expected: format!("an options block `{name}: {{ every: N, ... }}`"),
                    found: "a value".into(),
                }),
                None => {}
            }
            (every, count, keep, dir_v, headroom)
        };
        let (every, count, _, _, _) = block(self, "eval", &["every", "steps"], &["every"]);
        let eval = every.map(|every| Eval {
            every,
            steps: count.unwrap_or(1),
        });
        let (every, _, keep, cdir, _) = block(
            self,
            "checkpoint",
            &["every", "keep", "dir"],
            &["every", "dir"],
        );
        let checkpoint_dir_span = cdir.as_ref().map(|d| d.1);
        let checkpoint = match (every, cdir) {
            (Some(every), Some((d, _))) => Some(Checkpoint {
                every,
                keep: keep.unwrap_or(1),
                dir: d.into(),
            }),
            _ => None,
        };
        let (every, _, _, fdir, headroom) = block(
            self,
            "fdo",
            &["every", "dir", "headroom"],
            &["every", "dir"],
        );
        let fdo_dir_span = fdir.as_ref().map(|d| d.1);
        let fdo = every.map(|every| Fdo {
            every,
            dir: fdir.map_or_else(|| "fdo".into(), |d| d.0).into(),
            headroom: headroom.unwrap_or(1.0),
        });
        Some(Train {
            model: t.model.name.clone(),
            model_span: t.model.span,
            mesh: t.mesh.name.clone(),
            mesh_span: t.mesh.span,
            mesh_kind: mesh.kind.clone(),
            sparsecores: mesh.sparsecores.max(1) as usize,
            span: t.span,
            batch: batch.map(|b| b as usize),
            batch_span: o.get("batch").map(|v| v.span()),
            steps,
            accumulate,
            accumulate_span: o.get("accumulate").map(|v| v.span()),
            seed,
            log_every,
            loss,
            loss_span: o.get("loss").map(|v| v.span()),
            loss_fn: loss_fn.clone(),
            metrics,
            optimizer,
            clip,
            eval,
            eval_span: o.get("eval").map(|v| v.span()),
            checkpoint,
            checkpoint_dir_span,
            data,
            data_span: o.get("data").map(|v| v.span()),
            fdo,
            fdo_dir_span,
            precision,
        })
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
        let items = match v {
            OptValue::Expr(Expr {
                kind: ExprKind::List(items),
                ..
            }) => items,
            other => {
                self.report(Problem::WrongKind {
                    span: other.span(),
                    expected: "a list of metrics like `[accuracy]`".into(),
                    found: "something else".into(),
                });
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for item in items {
            let Some((name, span)) = item.as_name() else {
                self.report(Problem::WrongKind {
                    span: item.span(),
                    expected: "a metric name".into(),
                    found: match item {
                        ast::ListItem::Expr(_) => "an expression",
                        ast::ListItem::Dim(_) => "a dimension",
                    }
                    .into(),
                });
                continue;
            };
            let Some(m) = Metric::from_name(name) else {
                self.report(Problem::UnknownChoice {
                    span,
                    kind: "metric",
                    name: name.into(),
                    known: Metric::NAMES.to_vec(),
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

    /// A checked data source as a typed value.
    fn data(&mut self, name: &str, e: &Expr, dir: &Path) -> Option<Data> {
        let args = named_args(e);
        let arg = |k: &str| args.iter().find(|a| a.0 == k).map(|a| a.1);
        let int = |b: &Builder, k: &str| {
            arg(k)
                .and_then(|e| b.int_value(e))
                .filter(|v| *v >= 1)
                .map(|v| v as usize)
        };
        let span_of = |k: &str| arg(k).map(|e| e.span);
        Some(match name {
            "shakespeare_words" => Data::ShakespeareWords {
                vocab: int(self, "vocab"),
                vocab_span: span_of("vocab"),
                seq: int(self, "seq").unwrap_or(16),
            },
            "shakespeare_chars" => Data::ShakespeareChars {
                seq: int(self, "seq").unwrap_or(64),
            },
            "text" | "arrays" => {
                let (written, path_span) = match arg("path") {
                    Some(Expr {
                        kind: ExprKind::Str(s),
                        span,
                    }) => (s.clone(), *span),
                    // Not a string: reported with the choice's arguments.
                    Some(_) => return None,
                    None => {
                        self.report(Problem::BadValue {
                            span: e.span,
                            message: "this data source needs `path`".into(),
                            help: Some(
                                "write `path: \"data/train.npz\"` (relative to this file)".into(),
                            ),
                        });
                        return None;
                    }
                };
                let path = dir.join(&written);
                if name == "arrays" {
                    Data::Arrays {
                        path,
                        written,
                        path_span,
                    }
                } else {
                    Data::Text {
                        path,
                        written,
                        path_span,
                        seq: int(self, "seq").unwrap_or(16),
                        vocab: int(self, "vocab"),
                        vocab_span: span_of("vocab"),
                    }
                }
            }
            "clicks" => Data::Clicks {
                vocab: int(self, "vocab"),
                vocab_span: span_of("vocab"),
            },
            _ => Data::Synthetic {
                classes: int(self, "classes"),
                classes_span: span_of("classes"),
                vocab: int(self, "vocab"),
                vocab_span: span_of("vocab"),
            },
        })
    }

    fn table(&mut self, t: &ast::TableDecl) -> Table {
        self.check_fields(
            &t.options,
            TABLE_FIELDS,
            &["vocab", "dim"],
            "table",
            t.name.span,
        );
        let mut table = Table {
            name: t.name.name.clone(),
            span: t.name.span,
            vocab: None,
            dim: None,
            init: Init::Normal(1.0),
            combiner: Combiner::Sum,
            optimizer: None,
            frozen: false,
            max_ids: None,
            max_unique_ids: None,
            stack_max_ids: None,
            stack_max_unique_ids: None,
            suggested_buffer: None,
            overflow: Overflow::Error,
            axis: None,
        };
        for (k, v) in &t.options.entries {
            match k.name.as_str() {
                "vocab" => table.vocab = self.opt_int(v, &k.name, 1),
                "dim" => table.dim = self.opt_int(v, &k.name, 1),
                "max_ids_per_partition" => table.max_ids = self.opt_int(v, &k.name, 1),
                "max_unique_ids_per_partition" => {
                    table.max_unique_ids = self.opt_int(v, &k.name, 1)
                }
                "stack_max_ids_per_partition" => {
                    table.stack_max_ids = self.opt_int(v, &k.name, 1)
                }
                "stack_max_unique_ids_per_partition" => {
                    table.stack_max_unique_ids = self.opt_int(v, &k.name, 1)
                }
                "suggested_buffer_size" => table.suggested_buffer = self.opt_int(v, &k.name, 1),
                "combiner" => match v {
                    OptValue::Expr(Expr {
                        kind: ExprKind::Name(n),
                        span,
                    }) => match Combiner::parse(n) {
                        Some(c) => table.combiner = c,
                        None => self.report(Problem::UnknownCombiner {
                            span: *span,
                            name: n.clone(),
                        }),
                    },
                    OptValue::Expr(Expr {
                        kind: ExprKind::Str(n),
                        span,
                    }) => self.report(Problem::UnknownCombiner {
                        span: *span,
                        name: n.clone(),
                    }),
                    _ => self.report(Problem::UnknownCombiner {
                        span: v.span(),
                        name: "?".into(),
                    }),
                },
                "optimizer" => {
                    if let Some(name) = self.check_choice(v, "optimizer", Optimizer::NAMES) {
                        if let OptValue::Expr(e) = v {
                            table.optimizer = Some(self.optimizer(name, e));
                        }
                    }
                }
                "overflow" => match v {
                    OptValue::Expr(Expr {
                        kind: ExprKind::Name(n),
                        ..
                    }) if Overflow::parse(n).is_some() => {
                        table.overflow = Overflow::parse(n).unwrap_or(Overflow::Error)
                    }
                    _ => self.report(Problem::TableField { span: v.span(), message: "`overflow` must be `error`, `drop` or `grow`".into(), help: Some("`error` stops with a diagnostic, `drop` drops ids beyond the limit and counts them, `grow` raises the limit and re-plans".into()) }),
                },
                "init" => match v {
                    OptValue::Expr(e) => match Init::parse(e) {
                        Ok(i) => table.init = i,
                        Err(p) => self.report(*p),
                    },
                    OptValue::Options(o) => self.report(Problem::WrongKind {
                        span: o.span,
                        expected: "an initializer like `normal(0.02)`".into(),
                        found: "an options block".into(),
                    }),
                },
                "shard" => table.axis = self.shard(v),
                "frozen" => match v {
                    OptValue::Expr(Expr {
                        kind: ExprKind::Name(b),
                        ..
                    }) if b == "true" || b == "false" => table.frozen = b == "true",
                    _ => self.report(Problem::TableField {
                        span: v.span(),
                        message: "`frozen` must be `true` or `false`".into(),
                        help: Some("`frozen: true` keeps the table's rows fixed: looked up, never updated".into()),
                    }),
                },
                _ => {}
            }
        }
        if table.frozen {
            let span_of = |k: &str| t.options.entries.iter().find(|(n, _)| n.name == k);
            if let (Some((_, opt)), Some((f, _))) = (span_of("optimizer"), span_of("frozen")) {
                self.report(Problem::FrozenTableOptimizer {
                    span: opt.span(),
                    table: table.name.clone(),
                    frozen: f.span,
                });
            }
        }
        // `max_unique_ids_per_partition` may exceed `max_ids_per_partition`, as
        // in the library: the smaller limit binds first.
        table
    }

    /// `shard: rows(axis)`: the axis.
    fn shard(&mut self, v: &OptValue) -> Option<String> {
        let mut axis = None;
        let ok = match v {
            OptValue::Expr(Expr {
                kind: ExprKind::Call(c, args),
                ..
            }) => matches!(&c.kind, ExprKind::Name(n) if n == "rows") && args.len() == 1,
            _ => false,
        };
        if let OptValue::Expr(Expr {
            kind: ExprKind::Call(_, args),
            ..
        }) = v
        {
            if let Some(ast::Arg::Pos(Expr {
                kind: ExprKind::Name(ax),
                span,
            })) = args.first()
            {
                let meshes = &self.prog.meshes;
                if !meshes.iter().any(|m| m.axis(ax).is_some()) {
                    let m = meshes.first();
                    self.report(Problem::UnknownAxis {
                        span: *span,
                        axis: ax.clone(),
                        mesh: m.map(|m| (m.name.clone(), m.name_span)),
                        axes: m.map(|m| m.axis_names()).unwrap_or_default(),
                    });
                }
                axis = Some(ax.clone());
            }
        }
        if !ok {
            self.report(Problem::TableField { span: v.span(), message: "`shard` must be `rows(axis)`".into(), help: Some("tables are MOD-sharded by rows over a mesh axis and the SparseCores of each device: `shard: rows(device)`".into()) });
            return None;
        }
        axis
    }
}

/// Whether the layer declares a function `name`.
fn has_fn(decl: &ast::LayerDecl, name: &str) -> bool {
    decl.members
        .iter()
        .any(|m| matches!(m, ast::Member::Fn(f) if f.name.name == name))
}
