//! Stage 5: the training data. Each `train` names a data source; the files it reads
//! (`arrays(path)`, `text(path)`, or `--data PATH`) are read here, once, and checked
//! against the lowered program's input and label types, so a wrong shape, dtype or
//! an id outside the vocabulary is a diagnostic from `shardc check`, not a crash
//! (or a silent zero embedding) in step 1. `shardc run` trains on exactly what this
//! stage loaded.

use crate::arrays::Array;
use crate::ast::{Expr, ExprKind, TrainDecl};
use crate::check::Checked;
use crate::diag::{Diagnostic, Problem};
use crate::resolve::Program;
use crate::source::{SourceMap, Span};
use crate::spmd::{self, Op};
use std::path::{Path, PathBuf};

/// Distinct characters of the built-in corpus: the vocabulary of `shakespeare_chars`.
pub fn char_vocab(text: &str) -> Vec<char> {
    let mut v: Vec<char> = text.chars().collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// Inputs in forward-parameter order, labels, and the held-out pair for `eval`.
#[derive(Clone, Debug)]
pub struct ArrayData {
    pub inputs: Vec<Array>,
    pub labels: Array,
    pub eval: Option<(Vec<Array>, Array)>,
}

/// What one `train` reads from files.
#[derive(Clone, Debug)]
pub enum Loaded {
    Arrays(Box<ArrayData>),
    /// Word ids of a text file (as `shakespeare_words`) and the window length.
    Text {
        ids: Vec<u32>,
        seq: usize,
    },
}

#[derive(Clone, Debug)]
pub struct TrainData {
    pub model: String,
    pub data: Loaded,
}

/// Check every `train`'s data; `flag` is `--data PATH`, which replaces the files'
/// `data:` sources. Returns the diagnostics, what was loaded, and the files read.
pub fn check(
    program: &Program,
    checked: &Checked,
    sources: &SourceMap,
    flag: Option<&Path>,
) -> (Vec<Diagnostic>, Vec<TrainData>, Vec<PathBuf>) {
    let mut cx = Cx {
        problems: vec![],
        loaded: vec![],
        read: vec![],
    };
    for t in &program.trains {
        // Without a lowered program (the file has errors) there is nothing to fit.
        let Some(prog) = checked.programs.iter().find(|p| p.model == t.model.name) else {
            continue;
        };
        let shape = Shapes::of(program, t, prog);
        cx.train(t, &shape, sources, flag);
    }
    let diags = cx.problems.into_iter().map(|p| p.diagnostic()).collect();
    (diags, cx.loaded, cx.read)
}

/// The global shapes the data must have, with the batch at its full size.
struct Shapes {
    /// Forward parameter names and global shapes (dim 0 the batch).
    inputs: Vec<(String, Vec<usize>, bool)>,
    /// Rows the embedding consuming each integer input has (its vocabulary).
    input_vocab: Vec<Option<usize>>,
    /// Inputs a `lookup` reads, where negative ids pad ragged samples.
    padded: Vec<bool>,
    labels: Vec<usize>,
    classes: usize,
    /// `loss: mse`: the labels are targets shaped like the output, any numbers.
    regression: bool,
    eval: Option<Span>,
}

impl Shapes {
    fn of(program: &Program, t: &TrainDecl, prog: &spmd::Program) -> Shapes {
        let batch = t
            .options
            .expr("batch")
            .and_then(|e| match e.kind {
                ExprKind::Int(v) => Some(v.max(1) as usize),
                _ => None,
            })
            .unwrap_or(1);
        let size = |d: &crate::types::Dim| {
            d.size
                .substitute(&prog.bound)
                .and_then(|p| p.as_const())
                .unwrap_or(1)
                .max(0) as usize
        };
        let full = |dims: &[crate::types::Dim]| -> Vec<usize> {
            dims.iter()
                .enumerate()
                .map(|(i, d)| if i == 0 { batch } else { size(d) })
                .collect()
        };
        let names: Vec<String> = program
            .layers
            .get(&t.model.name)
            .and_then(|l| {
                l.members.iter().find_map(|m| match m {
                    crate::ast::Member::Fn(f) if f.name.name == "forward" => {
                        Some(f.params.iter().map(|p| p.0.name.clone()).collect())
                    }
                    _ => None,
                })
            })
            .unwrap_or_default();
        let mut inputs = Vec::new();
        let mut input_vocab = Vec::new();
        let mut padded = Vec::new();
        for (id, n) in prog.nodes.iter().enumerate() {
            let Op::Input(i) = n.op else { continue };
            // One input is `x`, as in seeds 000 and 003; several go by their names.
            let name = names.get(i).cloned().unwrap_or_else(|| format!("x{i}"));
            inputs.push((name, full(&n.ty.dims), !n.ty.dtype.is_float()));
            let vocab = prog.nodes.iter().find_map(|m| match &m.op {
                Op::Builtin(b, _)
                    if (b == "embed" || b == "lookup") && m.args.get(1) == Some(&(id as u32)) =>
                {
                    m.args
                        .first()
                        .and_then(|w| prog.nodes.get(*w as usize))
                        .and_then(|w| w.ty.dims.first())
                        .map(size)
                }
                _ => None,
            });
            input_vocab.push(vocab);
            padded.push(prog.nodes.iter().any(|m| {
                matches!(&m.op, Op::Builtin(b, _) if b == "lookup")
                    && m.args.get(1) == Some(&(id as u32))
            }));
        }
        if inputs.len() == 1 {
            inputs[0].0 = "x".into();
        }
        let out = prog.output.and_then(|o| prog.nodes.get(o as usize));
        let regression = crate::runtime::train::Loss::of(t) == crate::runtime::train::Loss::Mse;
        let (labels, classes) = match out {
            Some(o) if regression => (full(&o.ty.dims), 1),
            Some(o) if o.ty.rank() > 0 => (
                full(&o.ty.dims[..o.ty.rank() - 1]),
                o.ty.dims.last().map(size).unwrap_or(1),
            ),
            _ => (vec![batch], 1),
        };
        Shapes {
            inputs,
            input_vocab,
            padded,
            labels,
            classes,
            regression,
            eval: t.options.get("eval").map(|v| v.span()),
        }
    }
}

struct Cx {
    problems: Vec<Problem>,
    loaded: Vec<TrainData>,
    read: Vec<PathBuf>,
}

impl Cx {
    fn train(&mut self, t: &TrainDecl, shape: &Shapes, sources: &SourceMap, flag: Option<&Path>) {
        let model = t.model.name.clone();
        if let Some(path) = flag {
            let span = t.options.get("data").map_or(t.model.span, |v| v.span());
            let shown = format!("--data {}", path.display());
            if let Some(data) = self.arrays(path, &shown, span, shape) {
                self.loaded.push(TrainData { model, data });
            }
            return;
        }
        let Some(e) = t.options.expr("data") else {
            return;
        };
        let Some((name, args)) = e.as_call() else {
            return;
        };
        let arg = |k: &str| args.iter().find(|a| a.0 == k).map(|a| a.1);
        if shape.regression && matches!(name, "text" | "shakespeare_words" | "shakespeare_chars") {
            self.problems.push(Problem::DataMismatch {
                span: e.span,
                path: name.to_string(),
                label: "data named here",
                message: format!(
                    "gives token ids as labels, but `loss: mse` needs numeric targets shaped like the output, {}",
                    dims(&shape.labels)
                ),
                help: Some("train with `data: arrays(path: ...)` holding those targets as `y`, or with `loss: softmax_cross_entropy`".into()),
            });
            return;
        }
        let int = |k: &str| {
            arg(k).and_then(|e| match e.kind {
                ExprKind::Int(v) => Some(v),
                _ => None,
            })
        };
        let dir = sources
            .get(t.span.file)
            .path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        match name {
            "arrays" => {
                let Some((written, span)) = self.path_arg(arg("path"), e.span) else {
                    return;
                };
                if let Some(data) = self.arrays(&dir.join(&written), &written, span, shape) {
                    self.loaded.push(TrainData { model, data });
                }
            }
            "text" => {
                let Some((written, span)) = self.path_arg(arg("path"), e.span) else {
                    return;
                };
                let full = dir.join(&written);
                self.read.push(full.clone());
                let text = match std::fs::read_to_string(&full) {
                    Ok(t) => t,
                    Err(err) => {
                        self.problems.push(Problem::DataUnreadable {
                            span,
                            path: written,
                            reason: match err.kind() {
                                std::io::ErrorKind::NotFound => "no such file".into(),
                                std::io::ErrorKind::InvalidData => "not UTF-8 text".into(),
                                _ => err.to_string(),
                            },
                        });
                        return;
                    }
                };
                let vocab = int("vocab").unwrap_or(shape.classes as i64).max(1) as usize;
                let seq = int("seq").unwrap_or(16).max(1) as usize;
                let vspan = arg("vocab").map_or(e.span, |v| v.span);
                if !self.vocab_fits(vocab, vspan, shape, true) {
                    return;
                }
                let ids = crate::runtime::data::words(&text, vocab);
                // Training windows come from the first 90%: it must hold one.
                if ids.len() * 9 / 10 < seq + 2 {
                    self.problems.push(Problem::DataMismatch {
                        span,
                        path: written,
                        label: "data named here",
                        message: format!(
                            "holds {} words, too few for windows of {seq} (the first 90% must hold {} words)",
                            ids.len(),
                            seq + 2
                        ),
                        help: Some("use a longer text or a shorter `seq`".into()),
                    });
                    return;
                }
                self.loaded.push(TrainData {
                    model,
                    data: Loaded::Text { ids, seq },
                });
            }
            "shakespeare_words" | "synthetic" => {
                // Synthetic ids are inputs only; its labels are below `classes`.
                if let (Some(v), Some(x)) = (int("vocab"), arg("vocab")) {
                    self.vocab_fits(v.max(1) as usize, x.span, shape, name != "synthetic");
                }
            }
            "shakespeare_chars" => {
                let n = char_vocab(crate::runtime::data::SHAKESPEARE).len();
                self.vocab_fits(n, e.span, shape, true);
            }
            _ => {}
        }
    }

    /// The `path:` argument, which must be a string.
    fn path_arg(&mut self, e: Option<&Expr>, call: Span) -> Option<(String, Span)> {
        match e {
            Some(Expr {
                kind: ExprKind::Str(s),
                span,
            }) => Some((s.clone(), *span)),
            Some(other) => {
                self.problems.push(Problem::BadValue {
                    span: other.span,
                    message: "`path` must be a string".into(),
                    help: Some("write `path: \"data/train.npz\"` (relative to this file)".into()),
                });
                None
            }
            None => {
                self.problems.push(Problem::BadValue {
                    span: call,
                    message: "this data source needs `path`".into(),
                    help: Some("write `path: \"data/train.npz\"` (relative to this file)".into()),
                });
                None
            }
        }
    }

    /// Ids below `vocab` must be valid embedding rows (and labels, when the
    /// source's labels are ids too).
    fn vocab_fits(&mut self, vocab: usize, span: Span, shape: &Shapes, labels: bool) -> bool {
        let rows = shape.input_vocab.iter().flatten().min().copied();
        let (limit, what) = match rows {
            Some(r) if r < shape.classes || !labels => (r, "embedding rows"),
            None if !labels => return true,
            _ => (shape.classes, "output classes"),
        };
        if vocab > limit {
            self.problems.push(Problem::DataOutOfRange {
                span,
                message: format!(
                    "this source gives ids up to {}, but the model has {limit} {what}",
                    vocab - 1
                ),
                label: format!("{vocab} ids"),
                help: format!("use a vocabulary of at most {limit}, or widen the model"),
            });
            return false;
        }
        true
    }

    fn arrays(&mut self, path: &Path, shown: &str, span: Span, shape: &Shapes) -> Option<Loaded> {
        self.read.push(path.to_path_buf());
        let all = match crate::arrays::read(path) {
            Ok(a) => a,
            Err(reason) => {
                self.problems.push(Problem::DataUnreadable {
                    span,
                    path: shown.to_string(),
                    reason,
                });
                return None;
            }
        };
        let names: Vec<&str> = all.iter().map(|a| a.name.as_str()).collect();
        let holds = format!("it holds {}", quote_list(&names));
        let mut ok = true;
        let mut steps: Option<(usize, String)> = None;
        let mut get = |cx: &mut Cx,
                       name: &str,
                       want: &[usize],
                       int: bool,
                       vocab: Option<(usize, &str, bool)>|
         -> Option<Array> {
            let Some(a) = all.iter().find(|a| a.name == name) else {
                cx.problems.push(Problem::DataMismatch {
                    span,
                    path: shown.to_string(),
                    message: format!("has no array `{name}`"),
                    label: "data named here",
                    help: Some(holds.clone()),
                });
                return None;
            };
            let stepped = a.shape.len() == want.len() + 1 && a.shape[1..] == *want;
            if a.shape != want && !stepped {
                cx.problems.push(Problem::DataMismatch {
                    span,
                    path: shown.to_string(),
                    label: "data named here",
                    message: format!(
                        "has `{name}` shaped {}, but the model needs {} (one batch, reused every step) or [steps, {}]",
                        dims(&a.shape),
                        dims(want),
                        dims(want).trim_matches(['[', ']'])
                    ),
                    help: None,
                });
                return None;
            }
            if stepped {
                match &steps {
                    Some((n, other)) if *n != a.shape[0] => {
                        cx.problems.push(Problem::DataMismatch {
                            span,
                            path: shown.to_string(),
                            label: "data named here",
                            message: format!(
                                "has {} batches in `{name}` but {n} in `{other}`",
                                a.shape[0]
                            ),
                            help: Some("every array must hold the same number of batches".into()),
                        });
                        return None;
                    }
                    None => steps = Some((a.shape[0], name.to_string())),
                    _ => {}
                }
            }
            if int && !a.int {
                cx.problems.push(Problem::DataMismatch {
                    span,
                    path: shown.to_string(),
                    message: format!(
                        "has `{name}` as {}, but the model reads integer ids from it",
                        a.dtype
                    ),
                    label: "data named here",
                    help: Some("store ids as int32 or int64".into()),
                });
                return None;
            }
            if let Some((limit, what, pad)) = vocab {
                if let Some((i, v)) = a
                    .values
                    .iter()
                    .enumerate()
                    .find(|(_, v)| (**v < 0.0 && !pad) || **v >= limit as f64)
                {
                    cx.problems.push(Problem::DataOutOfRange {
                        span,
                        message: format!(
                            "`{name}` holds the id {v} at {}, outside the model's {limit} {what}",
                            index(i, &a.shape)
                        ),
                        label: format!("from {shown}"),
                        help: format!("{what} are 0 to {}", limit.saturating_sub(1)),
                    });
                    return None;
                }
            }
            Some(a.clone())
        };
        let mut take = |cx: &mut Cx, suffix: &str| -> Option<(Vec<Array>, Array)> {
            let mut inputs = Vec::new();
            for (k, (name, want, int)) in shape.inputs.iter().enumerate() {
                let vocab = shape.input_vocab.get(k).copied().flatten();
                let pad = shape.padded.get(k).copied().unwrap_or(false);
                let a = get(
                    cx,
                    &format!("{name}{suffix}"),
                    want,
                    *int,
                    vocab.map(|v| (v, "embedding rows", pad)),
                );
                inputs.push(a);
            }
            // Class ids for a classifier; any numbers for a regression.
            let y = match shape.regression {
                true => get(cx, &format!("y{suffix}"), &shape.labels, false, None),
                false => get(
                    cx,
                    &format!("y{suffix}"),
                    &shape.labels,
                    true,
                    Some((shape.classes, "classes", false)),
                ),
            };
            let inputs: Option<Vec<Array>> = inputs.into_iter().collect();
            Some((inputs?, y?))
        };
        let main = take(self, "");
        ok &= main.is_some();
        let mut eval = None;
        if let Some(espan) = shape.eval {
            if all.iter().any(|a| a.name.ends_with("_eval")) {
                eval = take(self, "_eval");
                ok &= eval.is_some();
            } else {
                self.problems.push(Problem::DataMismatch {
                    span: espan,
                    path: shown.to_string(),
                    message: "has no held-out arrays for `eval`".into(),
                    label: "asks for held-out data",
                    help: Some(format!(
                        "add {} with the same shapes, or remove `eval`",
                        quote_list(
                            &shape
                                .inputs
                                .iter()
                                .map(|i| format!("{}_eval", i.0))
                                .chain(["y_eval".to_string()])
                                .collect::<Vec<_>>()
                                .iter()
                                .map(String::as_str)
                                .collect::<Vec<_>>()
                        )
                    )),
                });
                ok = false;
            }
        }
        let (inputs, labels) = main?;
        ok.then(|| {
            Loaded::Arrays(Box::new(ArrayData {
                inputs,
                labels,
                eval,
            }))
        })
    }
}

fn dims(s: &[usize]) -> String {
    let v: Vec<String> = s.iter().map(|d| d.to_string()).collect();
    format!("[{}]", v.join(", "))
}

/// The multi-index of flat element `i` in row-major `shape`.
fn index(mut i: usize, shape: &[usize]) -> String {
    let mut idx = vec![0; shape.len()];
    for (k, d) in shape.iter().enumerate().rev() {
        let d = (*d).max(1);
        idx[k] = i % d;
        i /= d;
    }
    dims(&idx)
}

fn quote_list(names: &[&str]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
    match q.len() {
        0 => "nothing".into(),
        1 => q[0].clone(),
        n => format!("{} and {}", q[..n - 1].join(", "), q[n - 1]),
    }
}
