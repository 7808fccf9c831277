//! Where a layout can be written into a file, and the file with one written
//! in. A decision ([`Var`]) is one dimension of one layer or model (`H` of
//! `LlamaLM`'s instantiation, `4*D` of an MLP), the model's `shard_params`,
//! a `repeat`'s `checkpoint:` or the run's precision; its [`Site`]s are every
//! place in the root file where it is written, which all take the same choice
//! so that the types agree. A dimension the user annotated anywhere in a layer
//! is the user's constraint: none of its places is a decision.

use crate::ast::{self, Arg, BinOp, DimSpec, Expr, ExprKind, ListItem, Member};
use crate::vocab::Pipe;
use std::collections::BTreeMap;

/// What a decision sets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A dimension's mesh axes (`@tp`, `@(dp, tp)`).
    Dim,
    /// The model's parameters stored split over an axis (`shard_params(dp)`).
    Fsdp,
    /// A `repeat`'s blocks recomputed in the backward pass (`checkpoint: full`).
    Checkpoint,
    /// The run's precision (`precision: bf16`), when `--allow-bf16` lets it change.
    Precision,
    /// A `repeat`'s blocks in pipeline stages over an axis, with a schedule
    /// and a microbatch count (`stages: pp, schedule: zbv, microbatches: 8`),
    /// when `--pipeline` lets the search cut the stack.
    Pipeline,
}

/// Whether a pipeline decision offers a schedule, and what it writes after
/// the schedule's name (`interleaved, chunks: 2`). Every schedule of the
/// registry is named here (no default), so a new one is a decision to make,
/// not one left out.
pub fn searched_schedule(p: Pipe) -> Option<&'static str> {
    match p {
        // 1F1B's bubble with every microbatch's activations held: never better.
        Pipe::GPipe => None,
        Pipe::OneFOneB | Pipe::ZbH1 | Pipe::Zbv => Some(""),
        Pipe::Interleaved => Some(", chunks: 2"),
    }
}

/// Examples per data-parallel replica in one microbatch that a pipeline
/// decision offers: its microbatch counts are the step's batch over each
/// possible replica count times one of these.
pub const PER_REPLICA: &[u64] = &[1, 2, 4];

/// What a pipeline decision is chosen for: the mesh's axes with their sizes
/// and the batch a step runs (after `accumulate`; `None` when the file does
/// not say).
pub struct Staging<'a> {
    pub mesh: &'a [(String, i64)],
    pub batch: Option<u64>,
}

/// A `repeat(...)` of a layer: where its closing parenthesis is, the start
/// of its line, and what it already says.
struct Repeat {
    close: usize,
    line: usize,
    checkpointed: bool,
    staged: bool,
}

/// One place a decision writes text: `text` inserted at byte `at` of the root
/// file, and for a dimension written as an expression with `+` or `-`
/// (`D - 1`), a `(` at `open` so that the axis applies to all of it.
#[derive(Clone, Debug)]
pub struct Site {
    pub at: usize,
    pub open: Option<usize>,
}

/// One choice of a decision, as written and as named in the reasons.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// What is inserted at each site (empty for the first choice: nothing).
    pub text: String,
    /// `@tp`, `unsharded`, `shard_params(dp)`, `checkpoint: full`, ...
    pub label: String,
}

/// One decision of the search.
#[derive(Clone, Debug)]
pub struct Var {
    pub kind: Kind,
    /// The layer or model it belongs to.
    pub scope: String,
    /// `H`, `4*D`; for the others the word the choice sets.
    pub key: String,
    pub sites: Vec<Site>,
    /// The choices, "nothing written" first.
    pub choices: Vec<Choice>,
    /// Where its reason is written: the start of the line of its first site.
    pub line: usize,
    /// A dimension of the trained model's input (the batch): data
    /// parallelism, searched first.
    pub input: bool,
}

/// Every decision the search may take in `file` (the root file's syntax
/// tree) for the trained `model`, over a mesh with these axes; with
/// `--pipeline`, each `repeat`'s stages too, over `pipeline`'s mesh.
pub fn collect(
    file: &ast::File,
    text: &str,
    model: &str,
    axes: &[String],
    train: Option<&ast::TrainDecl>,
    bf16: bool,
    pipeline: Option<&Staging>,
) -> Vec<Var> {
    let layers: BTreeMap<&str, &ast::LayerDecl> = file
        .items
        .iter()
        .filter_map(|i| match i {
            ast::Item::Layer(l) => Some((l.name.name.as_str(), l)),
            _ => None,
        })
        .collect();
    let consts: Vec<&str> = file
        .items
        .iter()
        .filter_map(|i| match i {
            ast::Item::Const(c) => Some(c.name.name.as_str()),
            _ => None,
        })
        .collect();
    let mut vars = Vec::new();
    // The model, then each layer of the root file it instantiates, in the
    // order first met (deterministic).
    let mut order: Vec<&str> = Vec::new();
    let mut todo = vec![model];
    while let Some(name) = todo.pop() {
        if order.contains(&name) {
            continue;
        }
        let Some(decl) = layers.get(name) else {
            continue;
        };
        order.push(name);
        let mut called = Vec::new();
        for m in &decl.members {
            if let Member::Sub { value, .. } = m {
                callees(value, &mut called);
            }
        }
        for c in called.into_iter().rev() {
            todo.push(c);
        }
    }
    for name in order {
        let Some(decl) = layers.get(name) else {
            continue;
        };
        vars.extend(in_layer(decl, text, axes, name == model, &consts, pipeline));
    }
    // Without a `repeat` in this file, the model's `checkpoint(full)`
    // reaches those of the files it imports.
    if let Some(decl) = layers.get(model) {
        let written = decl
            .members
            .iter()
            .any(|m| matches!(m, Member::Directive { name, .. } if name.name == "checkpoint"));
        if !written && !vars.iter().any(|v| v.kind == Kind::Checkpoint) {
            vars.push(Var {
                kind: Kind::Checkpoint,
                scope: model.to_string(),
                key: "checkpoint".into(),
                sites: vec![Site {
                    at: opening(text, decl.name.span.end as usize),
                    open: None,
                }],
                choices: vec![
                    none("no checkpointing"),
                    Choice {
                        text: "\n  checkpoint(full)".into(),
                        label: "checkpoint(full)".into(),
                    },
                ],
                line: line_start(text, decl.span.start as usize),
                input: false,
            });
        }
    }
    if let Some(t) = train.filter(|_| bf16) {
        if t.options.get("precision").is_none() {
            let at = opening(text, t.options.span.start as usize);
            vars.push(Var {
                kind: Kind::Precision,
                scope: t.model.name.clone(),
                key: "precision".into(),
                sites: vec![Site { at, open: None }],
                choices: vec![
                    none("precision as written"),
                    Choice {
                        text: "\n  precision: bf16".into(),
                        label: "precision: bf16".into(),
                    },
                ],
                line: line_start(text, t.span.start as usize),
                input: false,
            });
        }
    }
    vars
}

/// The layer names a sublayer's value instantiates (`Block` in
/// `repeat(L, Block(D))`).
fn callees<'a>(e: &'a Expr, out: &mut Vec<&'a str>) {
    if let ExprKind::Call(callee, args) = &e.kind {
        if let ExprKind::Name(n) = &callee.kind {
            out.push(n);
        }
        for a in args {
            if let Arg::Pos(x) = a {
                callees(x, out);
            }
        }
    }
}

/// The decisions of one layer (or the model).
fn in_layer(
    decl: &ast::LayerDecl,
    text: &str,
    axes: &[String],
    is_model: bool,
    consts: &[&str],
    pipeline: Option<&Staging>,
) -> Vec<Var> {
    let scope = decl.name.name.clone();
    let mut found = Found::default();
    let mut repeats = Vec::new();
    let mut fsdp_written = false;
    for m in &decl.members {
        match m {
            Member::Weight { ty, .. } => found.ty(ty, text),
            Member::Sub { value, .. } => found.instantiation(value, text, &mut repeats),
            Member::Directive { name, .. } => fsdp_written |= name.name == "shard_params",
            Member::Fn(f) => {
                for (_, t) in &f.params {
                    found.ty(t, text);
                    if is_model && f.name.name == "forward" {
                        for d in &t.dims {
                            if let DimSpec::Dim { size, .. } = d {
                                found.inputs.push(key(text, size.span().range()));
                            }
                        }
                    }
                }
                if let Some(t) = &f.ret {
                    found.ty(t, text);
                }
                found.block(&f.body, text);
            }
        }
    }
    let mut vars: Vec<Var> = Vec::new();
    for (key, places) in found.dims {
        if places.iter().any(|p| p.is_none()) || places.is_empty() {
            continue; // the user's constraint
        }
        // In a layer, a size bound by the call (the batch, the sequence of
        // `forward(x: f32[B, T, D])`) follows its caller: only the layer's
        // parameters and the file's constants are its own decisions.
        let own = |w: &str| decl.params.iter().any(|p| p.name == w) || consts.contains(&w);
        if !is_model && !words(&key).iter().all(|w| own(w)) {
            continue;
        }
        let sites: Vec<Site> = places.into_iter().flatten().collect();
        let tuples = !found.exprs.contains(&key);
        let input = found.inputs.contains(&key);
        let first = sites
            .iter()
            .map(|s| s.open.unwrap_or(s.at))
            .min()
            .unwrap_or(0);
        vars.push(Var {
            kind: Kind::Dim,
            scope: scope.clone(),
            key,
            sites,
            choices: dim_choices(axes, tuples),
            line: line_start(text, first),
            input,
        });
    }
    // In the order they are written: the reasons and the search read in that order.
    vars.sort_by_key(|v| (v.line, v.sites.first().map_or(0, |s| s.at)));
    for r in repeats {
        if let Some(st) = pipeline.filter(|_| !r.staged) {
            vars.push(pipeline_var(&scope, r.close, r.line, st));
        }
        if r.checkpointed {
            continue;
        }
        let (at, line) = (r.close, r.line);
        vars.push(Var {
            kind: Kind::Checkpoint,
            scope: scope.clone(),
            key: "checkpoint".into(),
            sites: vec![Site { at, open: None }],
            choices: vec![
                none("no checkpointing"),
                Choice {
                    text: ", checkpoint: full".into(),
                    label: "checkpoint: full".into(),
                },
            ],
            line,
            input: false,
        });
    }
    let at = opening(text, decl.name.span.end as usize);
    let line = line_start(text, decl.span.start as usize);
    if is_model && !fsdp_written {
        let mut choices = vec![none("parameters replicated")];
        for a in axes {
            choices.push(Choice {
                text: format!("\n  shard_params({a})"),
                label: format!("shard_params({a})"),
            });
        }
        vars.push(Var {
            kind: Kind::Fsdp,
            scope,
            key: "shard_params".into(),
            sites: vec![Site { at, open: None }],
            choices,
            line,
            input: false,
        });
    }
    vars
}

/// A `repeat`'s pipeline decision: not pipelined, or its stages over each
/// axis of more than one device, with each schedule offered
/// ([`searched_schedule`]) and each microbatch count [`microbatch_counts`]
/// gives; the checker refuses what does not divide.
fn pipeline_var(scope: &str, close: usize, line: usize, st: &Staging) -> Var {
    let mut choices = vec![none("not pipelined")];
    for (a, size) in st.mesh.iter().filter(|(_, n)| *n > 1) {
        let stages = *size as u64;
        for &pipe in Pipe::ALL {
            let Some(args) = searched_schedule(pipe) else {
                continue;
            };
            let s = format!("{}{args}", pipe.name());
            for m in microbatch_counts(st, a, stages) {
                if pipe.needs_multiple() && !m.is_multiple_of(stages) {
                    continue;
                }
                let text = format!("stages: {a}, schedule: {s}, microbatches: {m}");
                choices.push(Choice {
                    text: format!(", {text}"),
                    label: text,
                });
            }
        }
    }
    Var {
        kind: Kind::Pipeline,
        scope: scope.to_string(),
        key: "stages".into(),
        sites: vec![Site {
            at: close,
            open: None,
        }],
        choices,
        line,
        input: false,
    }
}

/// The microbatch counts of a pipeline over `axis` (`stages` devices), in
/// ascending order: the step's batch over `r · k`, for every replica count
/// `r` the other axes can make (the product of any of them) and every `k`
/// of [`PER_REPLICA`], where that divides and gives at least one microbatch
/// per stage. A file whose batch is not known gets 1, 2 and 4 per stage.
pub fn microbatch_counts(st: &Staging, axis: &str, stages: u64) -> Vec<u64> {
    let Some(b) = st.batch.filter(|b| *b > 0) else {
        return vec![stages, 2 * stages, 4 * stages];
    };
    let others: Vec<u64> = st
        .mesh
        .iter()
        .filter(|(a, n)| a != axis && *n > 1)
        .map(|(_, n)| *n as u64)
        .collect();
    let mut replicas = vec![1u64];
    for n in others {
        let more: Vec<u64> = replicas.iter().map(|r| r.saturating_mul(n)).collect();
        replicas.extend(more);
    }
    let mut out: Vec<u64> = replicas
        .iter()
        .flat_map(|r| PER_REPLICA.iter().map(move |k| r.saturating_mul(*k)))
        .filter(|d| b.is_multiple_of(*d))
        .map(|d| b / d)
        .filter(|m| *m >= stages)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

fn none(label: &str) -> Choice {
    Choice {
        text: String::new(),
        label: label.into(),
    }
}

/// Unsharded, each axis, and (where the places allow `@(a, b)`) every group
/// of two or more axes in the mesh's order.
fn dim_choices(axes: &[String], tuples: bool) -> Vec<Choice> {
    let mut out = vec![none("unsharded")];
    for a in axes {
        out.push(Choice {
            text: format!("@{a}"),
            label: format!("@{a}"),
        });
    }
    if tuples && axes.len() >= 2 && axes.len() <= 4 {
        let n = axes.len();
        for mask in 1u32..(1 << n) {
            if mask.count_ones() < 2 {
                continue;
            }
            let group: Vec<&str> = (0..n)
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| axes[i].as_str())
                .collect();
            let t = format!("@({})", group.join(", "));
            out.push(Choice {
                text: t.clone(),
                label: t,
            });
        }
    }
    out
}

/// The dimensions found in one layer: by key, each place (`None`: one the
/// user annotated), and the keys written somewhere as an expression
/// argument (where `@(a, b)` cannot be written).
#[derive(Default)]
struct Found {
    dims: BTreeMap<String, Vec<Option<Site>>>,
    exprs: Vec<String>,
    /// Keys of the model's `forward` parameters' dimensions.
    inputs: Vec<String>,
}

/// The names in a key (`4*D/H`: `D`, `H`).
fn words(key: &str) -> Vec<&str> {
    key.split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|w| {
            w.chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
        })
        .collect()
}

impl Found {
    fn add(&mut self, size: &ast::DimExpr, axes: &Option<Vec<ast::Ident>>, text: &str) {
        let span = size.span();
        let key = key(text, span.range());
        let place = match axes {
            // `@_` is the user's too, but only for this place.
            Some(a) if a.is_empty() => return,
            Some(_) => None,
            None => Some(Site {
                at: span.end as usize,
                open: None,
            }),
        };
        self.dims.entry(key).or_default().push(place);
    }

    fn ty(&mut self, t: &ast::TypeExpr, text: &str) {
        for d in &t.dims {
            if let DimSpec::Dim { size, axes, .. } = d {
                self.add(size, axes, text);
            }
        }
    }

    fn block(&mut self, b: &ast::Block, text: &str) {
        for l in &b.lets {
            if let Some(t) = &l.ty {
                self.ty(t, text);
            }
            self.expr(&l.value, text);
        }
        if let Some(r) = &b.result {
            self.expr(r, text);
        }
    }

    /// The dimensions of shape lists (`reshape(x, [B, T * D])`) in a body.
    fn expr(&mut self, e: &Expr, text: &str) {
        match &e.kind {
            ExprKind::List(items) => {
                for i in items {
                    match i {
                        ListItem::Dim(DimSpec::Dim { size, axes, .. }) => {
                            self.add(size, axes, text)
                        }
                        ListItem::Dim(DimSpec::Ellipsis(_)) => {}
                        ListItem::Expr(x) => self.expr(x, text),
                    }
                }
            }
            ExprKind::Neg(x) | ExprKind::Member(x, _) => self.expr(x, text),
            ExprKind::Bin(a, _, b) => {
                self.expr(a, text);
                self.expr(b, text);
            }
            ExprKind::Call(c, args) => {
                self.expr(c, text);
                for a in args {
                    match a {
                        Arg::Pos(x) => self.expr(x, text),
                        Arg::Named(_, ast::OptValue::Expr(x)) => self.expr(x, text),
                        Arg::Named(..) => {}
                        Arg::Arrow(a, b, _) => {
                            self.add(&a.size, &a.axes, text);
                            self.add(&b.size, &b.axes, text);
                        }
                    }
                }
            }
            ExprKind::Index(x, _) => self.expr(x, text),
            ExprKind::Local(_, b) => self.block(b, text),
            ExprKind::Float(_) | ExprKind::Int(_) | ExprKind::Str(_) | ExprKind::Name(_) => {}
        }
    }

    /// A sublayer's instantiation: its size arguments, and each `repeat`
    /// without `checkpoint:` (where `, checkpoint: full` would go).
    fn instantiation(&mut self, e: &Expr, text: &str, repeats: &mut Vec<Repeat>) {
        let ExprKind::Call(callee, args) = &e.kind else {
            return;
        };
        let is_repeat = matches!(&callee.kind, ExprKind::Name(n) if n == "repeat");
        for a in args {
            match a {
                Arg::Pos(x) if is_size(x) => {
                    let k = key(text, x.span.range());
                    let wide = matches!(&x.kind, ExprKind::Bin(_, BinOp::Add | BinOp::Sub, _));
                    let site = Site {
                        at: x.span.end as usize,
                        open: wide.then_some(x.span.start as usize),
                    };
                    self.dims.entry(k.clone()).or_default().push(Some(site));
                    self.exprs.push(k);
                }
                Arg::Pos(Expr {
                    kind: ExprKind::Bin(x, BinOp::MatMul, _),
                    ..
                }) if is_size(x) => {
                    let k = key(text, x.span.range());
                    self.dims.entry(k.clone()).or_default().push(None);
                    self.exprs.push(k);
                }
                Arg::Pos(x) => self.instantiation(x, text, repeats),
                Arg::Arrow(a, b, _) => {
                    self.add(&a.size, &a.axes, text);
                    self.add(&b.size, &b.axes, text);
                }
                Arg::Named(..) => {}
            }
        }
        let named = |w: &str| {
            args.iter()
                .any(|a| matches!(a, Arg::Named(k, _) if k.name == w))
        };
        if is_repeat && e.span.end > 0 {
            // Before the closing parenthesis.
            repeats.push(Repeat {
                close: e.span.end as usize - 1,
                line: line_start(text, e.span.start as usize),
                checkpointed: named("checkpoint"),
                staged: named("stages"),
            });
        }
    }
}

/// A size written as an expression: names, whole numbers, `+ - * /`.
fn is_size(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Name(_) | ExprKind::Int(_) => true,
        ExprKind::Bin(a, op, b) => {
            matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div)
                && is_size(a)
                && is_size(b)
        }
        _ => false,
    }
}

/// A dimension's text without spaces: `4 * D` and `4*D` are one decision.
fn key(text: &str, r: std::ops::Range<usize>) -> String {
    text.get(r)
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect()
}

/// Just after the first `{` at or after `from`.
fn opening(text: &str, from: usize) -> usize {
    text.get(from..)
        .and_then(|t| t.find('{'))
        .map_or(from, |i| from + i + 1)
}

pub fn line_start(text: &str, at: usize) -> usize {
    text.get(..at)
        .and_then(|t| t.rfind('\n'))
        .map_or(0, |i| i + 1)
}

/// `text` with choice `pick[i]` of each decision written in.
pub fn write(text: &str, vars: &[Var], pick: &[usize]) -> String {
    write_with(text, vars, pick, Vec::new())
}

/// [`write`], and `extra` replacements (start, end, text) of the same text:
/// at one offset, an extra comes before a decision's text, and the first
/// decision's before a later one's.
pub fn write_with(
    text: &str,
    vars: &[Var],
    pick: &[usize],
    extra: Vec<(usize, usize, String)>,
) -> String {
    // (start, end, class, index, text): extras are class 0, decisions 1.
    let mut edits: Vec<(usize, usize, u8, usize, String)> = extra
        .into_iter()
        .enumerate()
        .map(|(i, (a, b, t))| (a, b, 0, i, t))
        .collect();
    for (n, (v, &c)) in vars.iter().zip(pick).enumerate() {
        let Some(choice) = v.choices.get(c).filter(|c| !c.text.is_empty()) else {
            continue;
        };
        for s in &v.sites {
            match s.open {
                Some(o) => {
                    edits.push((o, o, 1, n, "(".into()));
                    edits.push((s.at, s.at, 1, n, format!("){}", choice.text)));
                }
                None => edits.push((s.at, s.at, 1, n, choice.text.clone())),
            }
        }
    }
    // From the end, so that earlier offsets stay valid; at one offset the
    // last applied comes first in the text.
    edits.sort_by_key(|e| std::cmp::Reverse((e.0, e.2, e.3)));
    let mut out = text.to_string();
    for (start, end, _, _, t) in edits {
        if end <= out.len() && out.is_char_boundary(start) && out.is_char_boundary(end) {
            out.replace_range(start..end, &t);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(axes: &[(&str, i64)]) -> Vec<(String, i64)> {
        axes.iter().map(|(a, n)| (a.to_string(), *n)).collect()
    }

    #[test]
    fn microbatch_counts_divide_the_batch_per_replica_count() {
        let m = mesh(&[("dp", 16), ("pp", 8), ("tp", 8)]);
        let st = Staging {
            mesh: &m,
            batch: Some(1536),
        };
        // 1536 over r·k for r in {1, 16, 8, 128} and k in {1, 2, 4}, at
        // least one microbatch per stage (1536 / 512 = 3 is not).
        assert_eq!(
            microbatch_counts(&st, "pp", 8),
            [12, 24, 48, 96, 192, 384, 768, 1536]
        );
        // A batch the replica counts do not divide gives only what divides.
        let st = Staging {
            mesh: &m,
            batch: Some(24),
        };
        assert_eq!(microbatch_counts(&st, "pp", 8), [12, 24]);
        let st = Staging {
            mesh: &m,
            batch: None,
        };
        assert_eq!(microbatch_counts(&st, "pp", 8), [8, 16, 32]);
    }

    #[test]
    fn a_pipeline_is_offered_over_axes_of_more_than_one_device() {
        let m = mesh(&[("dp", 2), ("pp", 1)]);
        let st = Staging {
            mesh: &m,
            batch: Some(6),
        };
        let v = pipeline_var("M", 0, 0, &st);
        let labels: Vec<&str> = v.choices.iter().map(|c| c.label.as_str()).collect();
        // 6 and 3 microbatches over `dp` (6 / 4 does not divide); interleaved
        // only with a multiple of the stages; GPipe never; nothing over `pp`.
        assert_eq!(
            labels,
            [
                "not pipelined",
                "stages: dp, schedule: one_f_one_b, microbatches: 3",
                "stages: dp, schedule: one_f_one_b, microbatches: 6",
                "stages: dp, schedule: interleaved, chunks: 2, microbatches: 6",
                "stages: dp, schedule: zb_h1, microbatches: 3",
                "stages: dp, schedule: zb_h1, microbatches: 6",
                "stages: dp, schedule: zbv, microbatches: 3",
                "stages: dp, schedule: zbv, microbatches: 6",
            ]
        );
    }
}
