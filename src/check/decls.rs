//! Checks of the declarative items: embedding tables, features and `train`.

use super::{Checker, Val};
use crate::ast::{self, Expr, ExprKind, OptValue, Options, TrainDecl};
use crate::diag::{did_you_mean, Problem};
use crate::source::Span;

const OPT_ARGS: &[(&str, &[&str])] = &[
    ("sgd", &["lr", "momentum", "nesterov"]),
    ("adam", &["lr", "b1", "b2", "eps"]),
    ("adamw", &["lr", "b1", "b2", "eps", "weight_decay"]),
    ("adagrad", &["lr", "initial_accumulator", "eps"]),
    (
        "ftrl",
        &["lr", "lr_power", "l1", "l2", "initial_accumulator"],
    ),
];
const SCHEDULES: &[(&str, &[&str])] = &[
    ("constant", &["value"]),
    ("warmup_cosine", &["init", "peak", "warmup", "decay", "end"]),
];
const DATA: &[(&str, &[&str])] = &[
    ("shakespeare_words", &["vocab", "seq"]),
    ("shakespeare_chars", &["seq"]),
    ("text", &["path", "seq", "vocab"]),
    ("arrays", &["path"]),
    ("synthetic", &["classes", "vocab"]),
];
const LOSSES: &[&str] = &["softmax_cross_entropy", "mse"];
const TRAIN_FIELDS: &[&str] = &[
    "data",
    "batch",
    "steps",
    "loss",
    "optimizer",
    "log_every",
    "seed",
    "clip_grad_norm",
    "accumulate",
    "eval",
    "checkpoint",
    "fdo",
];
const TABLE_FIELDS: &[&str] = &[
    "vocab",
    "dim",
    "init",
    "combiner",
    "optimizer",
    "max_ids_per_partition",
    "max_unique_ids_per_partition",
    "suggested_buffer_size",
    "overflow",
    "shard",
];

/// A `repeat(n, Layer, stages: axis, microbatches: m, schedule: s)` member.
pub(super) struct Staged {
    pub axis: String,
    pub schedule: String,
    pub microbatches: Option<i64>,
    pub microbatches_span: Option<Span>,
    pub span: Span,
}

pub(super) fn staged_repeat(decl: &ast::LayerDecl) -> Option<Staged> {
    decl.members.iter().find_map(|m| {
        let ast::Member::Sub { value, .. } = m else {
            return None;
        };
        let ExprKind::Call(c, args) = &value.kind else {
            return None;
        };
        if !matches!(&c.kind, ExprKind::Name(n) if n == "repeat") {
            return None;
        }
        let named = |k: &str| {
            args.iter().find_map(|a| match a {
                ast::Arg::Named(n, OptValue::Expr(e)) if n.name == k => Some(e),
                _ => None,
            })
        };
        let axis = match named("stages").map(|e| &e.kind) {
            Some(ExprKind::Name(a)) => a.clone(),
            _ => return None,
        };
        let mb = named("microbatches");
        Some(Staged {
            axis,
            schedule: match named("schedule").map(|e| &e.kind) {
                Some(ExprKind::Name(s)) => s.clone(),
                _ => "gpipe".into(),
            },
            microbatches: mb.and_then(|e| match e.kind {
                ExprKind::Int(v) => Some(v),
                _ => None,
            }),
            microbatches_span: mb.map(|e| e.span),
            span: value.span,
        })
    })
}

fn is_name_in(v: &OptValue, names: &[&str]) -> bool {
    matches!(v, OptValue::Expr(Expr { kind: ExprKind::Name(n), .. }) if names.contains(&n.as_str()))
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

impl<'p> Checker<'p> {
    fn opt_int(&mut self, v: &OptValue, what: &str, min: i64) -> Option<i64> {
        let val = match v {
            OptValue::Expr(e) => match &e.kind {
                ExprKind::Int(x) => Some(*x),
                ExprKind::Name(n) => self.prog.consts.get(n).map(|c| c.0),
                _ => None,
            },
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

    /// `name(arg: value, ...)` against a table of choices and their arguments.
    fn check_choice(
        &mut self,
        v: &OptValue,
        kind: &'static str,
        table: &[(&'static str, &[&str])],
    ) -> Option<String> {
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
                                self.check_choice(val, "learning-rate schedule", SCHEDULES);
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
                    if ["vocab", "seq", "warmup", "decay", "classes"].contains(&k.name.as_str()) {
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
        Some(name.to_string())
    }

    /// Weights, gradients, optimizer state and gradient synchronisation, from the
    /// model's instance tree (a repeated layer counts once per repetition).
    fn finish_plan(
        &mut self,
        plan: &mut crate::plan::Plan,
        inst: &std::rc::Rc<super::Inst>,
        optimizer: &str,
    ) {
        let slots = match optimizer {
            "adam" | "adamw" | "ftrl" => 2.0,
            "adagrad" | "sgd+momentum" => 1.0,
            _ => 0.0,
        };
        plan.optimizer =
            format!("{optimizer}: {slots} slot(s) per parameter, in the parameter's layout");
        type W = (
            crate::types::TType,
            crate::types::TType,
            f64,
            Option<String>,
        );
        let mut weights: Vec<W> = Vec::new();
        // A pipelined stack is split over its stage axis: each device holds n/|pp|
        // layers, and those weights are not replicated over that axis.
        fn walk(c: &Checker, i: &super::Inst, m: f64, stage: Option<String>, out: &mut Vec<W>) {
            for (stored, used, _) in i.weights.values() {
                out.push((stored.clone(), used.clone(), m, stage.clone()));
            }
            for v in i.subs.values() {
                match v {
                    Val::Layer(li) => walk(c, li, m, stage.clone(), out),
                    Val::Repeat(n, li, st) => {
                        let k = st.as_ref().map_or(1, |a| c.axis_size(a)).max(1);
                        walk(
                            c,
                            li,
                            m * (*n / k) as f64,
                            st.clone().or(stage.clone()),
                            out,
                        )
                    }
                    _ => {}
                }
            }
        }
        walk(self, inst, 1.0, None, &mut weights);
        let mut sync: std::collections::BTreeMap<(String, Vec<String>), f64> = Default::default();
        for (stored, used, m, stage) in &weights {
            let Some(n) = self.local_numel(stored) else {
                continue;
            };
            let bytes = n * stored.dtype.bytes() as f64;
            plan.params += bytes * m;
            plan.grads += bytes * m;
            plan.optimizer_state += bytes * m * slots;
            if stored != used {
                if let Some(u) = self.local_numel(used) {
                    let ub = u * used.dtype.bytes() as f64;
                    plan.gathered_params = plan.gathered_params.max(ub);
                    let fsdp: Vec<String> = stored
                        .all_axes()
                        .into_iter()
                        .filter(|a| !used.all_axes().contains(a))
                        .map(|s| s.to_string())
                        .collect();
                    let k: f64 = fsdp.iter().map(|a| self.axis_size(a) as f64).product();
                    *sync
                        .entry(("param all-gather (FSDP, fwd + bwd)".into(), fsdp.clone()))
                        .or_default() += 2.0 * ub * (k - 1.0) / k * m;
                    *sync
                        .entry(("grad reduce-scatter (FSDP)".into(), fsdp))
                        .or_default() += ub * (k - 1.0) / k * m;
                }
            }
            // Replicated over an axis: the gradient is partial over it (data parallel,
            // and tensor-parallel replicas such as LayerNorm scales).
            let rep: Vec<String> = self
                .mesh
                .map(|mm| {
                    mm.axes
                        .iter()
                        .filter(|a| {
                            a.1 > 1
                                && !stored.all_axes().contains(&a.0.as_str())
                                && stage.as_deref() != Some(a.0.as_str())
                        })
                        .map(|a| a.0.clone())
                        .collect()
                })
                .unwrap_or_default();
            if !rep.is_empty() {
                let k: f64 = rep.iter().map(|a| self.axis_size(a) as f64).product();
                *sync.entry(("grad all-reduce".into(), rep)).or_default() +=
                    2.0 * bytes * (k - 1.0) / k * m;
            }
        }
        // Merge per-op rows that are the same collective at the same place.
        let mut merged: Vec<crate::plan::Comm> = Vec::new();
        for c in plan.comms.drain(..) {
            match merged.iter_mut().find(|x| {
                x.kind == c.kind
                    && x.axes == c.axes
                    && x.source == c.source
                    && x.bytes == c.bytes
                    && x.explicit == c.explicit
            }) {
                Some(x) => x.count += c.count,
                None => merged.push(c),
            }
        }
        for ((kind, axes), bytes) in sync {
            merged.push(crate::plan::Comm {
                kind,
                axes,
                bytes,
                count: 1,
                span: Span::default(),
                source: "optimizer step".into(),
                explicit: true,
            });
        }
        plan.comms = merged;
    }

    /// Embedding tables: rows MOD-sharded over `devices × sparsecores` partitions,
    /// vocabularies padded to multiples of 8·N and dims to multiples of 8 (SparseCore).
    fn plan_tables(&mut self, plan: &mut crate::plan::Plan, mesh: &crate::resolve::Mesh) {
        self.plan_stacks(plan, mesh);
        for t in &self.prog.tables.clone() {
            let int = |c: &Checker, k: &str| match t.options.get(k) {
                Some(OptValue::Expr(e)) => match &e.kind {
                    ExprKind::Int(v) => Some(*v),
                    ExprKind::Name(n) => c.prog.consts.get(n).map(|v| v.0),
                    _ => None,
                },
                _ => None,
            };
            let (Some(vocab), Some(dim)) = (int(self, "vocab"), int(self, "dim")) else {
                continue;
            };
            let axis = match t.options.get("shard") {
                Some(OptValue::Expr(Expr {
                    kind: ExprKind::Call(_, args),
                    ..
                })) => match args.first() {
                    Some(ast::Arg::Pos(Expr {
                        kind: ExprKind::Name(a),
                        ..
                    })) => Some(a.clone()),
                    _ => None,
                },
                _ => None,
            };
            let devices = axis.as_ref().map_or(1, |a| mesh.size(a)).max(1);
            let parts = devices.saturating_mul(mesh.sparsecores.max(1));
            let pad = |x: i64, m: i64| {
                ((x.max(0) as u64).div_ceil(m.max(1) as u64) as i64).saturating_mul(m)
            };
            let rows = pad(vocab, 8 * parts) / devices;
            let bytes = rows as f64 * pad(dim, 8) as f64 * 4.0;
            let slots = match t.options.get("optimizer") {
                Some(OptValue::Expr(e)) => match call_parts(e).map(|p| p.0) {
                    Some("adam" | "ftrl") => 2.0,
                    Some("adagrad") => 1.0,
                    _ => 0.0,
                },
                _ => 0.0,
            };
            plan.params += bytes;
            plan.grads += bytes;
            plan.optimizer_state += bytes * slots;
        }
    }

    /// The SparseCore stacks of the tables, per sharding axis.
    fn plan_stacks(&mut self, plan: &mut crate::plan::Plan, mesh: &crate::resolve::Mesh) {
        let int = |c: &Checker, o: &ast::Options, k: &str| match o.get(k) {
            Some(OptValue::Expr(e)) => match &e.kind {
                ExprKind::Int(v) => Some(*v),
                ExprKind::Name(n) => c.prog.consts.get(n).map(|v| v.0),
                _ => None,
            },
            _ => None,
        };
        let sc = mesh.sparsecores.max(1) as usize;
        let mut by_axis: std::collections::BTreeMap<String, Vec<crate::embed::TableInfo>> =
            Default::default();
        for t in &self.prog.tables {
            let (Some(vocab), Some(dim)) =
                (int(self, &t.options, "vocab"), int(self, &t.options, "dim"))
            else {
                continue;
            };
            let axis = match t.options.expr("shard").map(|e| &e.kind) {
                Some(ExprKind::Call(_, args)) => match args.first() {
                    Some(ast::Arg::Pos(Expr {
                        kind: ExprKind::Name(a),
                        ..
                    })) => a.clone(),
                    _ => String::new(),
                },
                _ => String::new(),
            };
            let name = |k: &str| match t.options.expr(k) {
                Some(e) => call_parts(e).map_or(String::new(), |p| p.0.to_string()),
                None => String::new(),
            };
            by_axis
                .entry(axis)
                .or_default()
                .push(crate::embed::TableInfo {
                    name: t.name.name.clone(),
                    vocab: vocab.max(1) as usize,
                    dim: dim.max(1) as usize,
                    optimizer: name("optimizer"),
                    combiner: name("combiner"),
                    activation_bytes: 0.0,
                });
        }
        for (axis, infos) in by_axis {
            let devices = if axis.is_empty() {
                1
            } else {
                mesh.size(&axis).max(1) as usize
            };
            for st in crate::embed::stack(&infos, devices.saturating_mul(sc), sc, None) {
                plan.stacks.push(crate::plan::StackPlan {
                    bytes_per_device: st.rows_per_shard() as f64 * (sc * st.dim * 4) as f64,
                    name: st.name.clone(),
                    dim: st.dim,
                    partitions: st.partitions,
                    rows_per_shard: st.rows_per_shard(),
                    tables: st
                        .tables
                        .iter()
                        .map(|t| {
                            (
                                t.name.clone(),
                                t.vocab,
                                t.padded_vocab,
                                t.row_offset_in_shard,
                                t.shard_rotation,
                            )
                        })
                        .collect(),
                });
            }
        }
    }

    pub(super) fn check_tables_and_features(&mut self) {
        let tables = self.prog.tables.clone();
        for t in &tables {
            self.check_fields(
                &t.options,
                TABLE_FIELDS,
                &["vocab", "dim"],
                "table",
                t.name.span,
            );
            for (k, v) in &t.options.entries {
                match k.name.as_str() {
                    "vocab" | "dim" => {
                        self.opt_int(v, &k.name, 1);
                    }
                    "max_ids_per_partition"
                    | "max_unique_ids_per_partition"
                    | "suggested_buffer_size" => {
                        self.opt_int(v, &k.name, 1);
                    }
                    "combiner" => match v {
                        OptValue::Expr(Expr {
                            kind: ExprKind::Name(n),
                            span,
                        }) if ["sum", "mean", "sqrtn"].contains(&n.as_str()) => {
                            let _ = span;
                        }
                        OptValue::Expr(Expr {
                            kind: ExprKind::Name(n),
                            span,
                        })
                        | OptValue::Expr(Expr {
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
                        self.check_choice(v, "optimizer", OPT_ARGS);
                    }
                    "overflow" if !is_name_in(v, &["error", "drop", "grow"]) => {
                        self.report(Problem::TableField { span: v.span(), message: "`overflow` must be `error`, `drop` or `grow`".into(), help: Some("`error` stops with a diagnostic, `drop` drops ids beyond the limit and counts them, `grow` raises the limit and re-plans".into()) });
                    }
                    "init" => {
                        if let OptValue::Expr(e) = v {
                            self.check_initializer(e);
                        }
                    }
                    "shard" => {
                        let ok = match v {
                            OptValue::Expr(Expr {
                                kind: ExprKind::Call(c, args),
                                ..
                            }) => {
                                matches!(&c.kind, ExprKind::Name(n) if n == "rows")
                                    && args.len() == 1
                            }
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
                            }
                        }
                        if !ok {
                            self.report(Problem::TableField { span: v.span(), message: "`shard` must be `rows(axis)`".into(), help: Some("tables are MOD-sharded by rows over a mesh axis and the SparseCores of each device: `shard: rows(device)`".into()) });
                        }
                    }
                    _ => {}
                }
            }
            if let (Some(OptValue::Expr(a)), Some(OptValue::Expr(b))) = (
                t.options.get("max_unique_ids_per_partition"),
                t.options.get("max_ids_per_partition"),
            ) {
                if let (ExprKind::Int(u), ExprKind::Int(m)) = (&a.kind, &b.kind) {
                    if u > m {
                        self.report(Problem::TableField { span: a.span, message: format!("`max_unique_ids_per_partition` ({u}) exceeds `max_ids_per_partition` ({m})"), help: Some("unique ids are a subset of all ids".into()) });
                    }
                }
            }
        }
        for f in self.prog.features.clone() {
            let Some(table) = tables.iter().find(|t| t.name.name == f.table.name) else {
                let sug = did_you_mean(&f.table.name, tables.iter().map(|t| t.name.name.as_str()));
                self.report(Problem::UnknownName {
                    span: f.table.span,
                    name: f.table.name.clone(),
                    what: "table",
                    suggestion: sug,
                });
                continue;
            };
            if f.ty.dtype.is_float() {
                self.report(Problem::FeatureTable {
                    span: f.ty.dtype_span,
                    message: format!(
                        "feature `{}` has float ids (`{}`)",
                        f.name.name,
                        f.ty.dtype.name()
                    ),
                    label: "in this feature",
                    table: (table.name.span, "table declared here"),
                });
            }
            if f.ty.dims.len() != 2 {
                self.report(Problem::FeatureTable {
                    span: f.ty.span,
                    message: format!(
                        "feature `{}` must be `[samples, valency]`, found rank {}",
                        f.name.name,
                        f.ty.dims.len()
                    ),
                    label: "in this feature",
                    table: (table.name.span, "table declared here"),
                });
            }
        }
    }

    pub(super) fn check_train(&mut self, t: &TrainDecl) {
        let prog = self.prog;
        let Some(decl) = prog.layers.get(&t.model.name).cloned() else {
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
            return;
        };
        if !decl.is_model {
            self.report(Problem::WrongKind {
                span: t.model.span,
                expected: "a model".into(),
                found: format!("the layer `{}` (declare it with `model`)", t.model.name),
            });
            return;
        }
        let Some(mesh) = prog.mesh(&t.mesh.name) else {
            self.report(Problem::UnknownName {
                span: t.mesh.span,
                name: t.mesh.name.clone(),
                what: "mesh",
                suggestion: did_you_mean(&t.mesh.name, prog.meshes.iter().map(|m| m.name.as_str())),
            });
            return;
        };
        self.mesh = Some(mesh);
        self.check_fields(
            &t.options,
            TRAIN_FIELDS,
            &["batch", "steps", "optimizer"],
            "train",
            t.model.span.to(t.mesh.span),
        );
        let o = &t.options;
        let mut batch = o.get("batch").and_then(|v| self.opt_int(v, "batch", 1));
        // With `accumulate: k`, the model runs on microbatches of batch / k.
        if let (Some(b), Some(v)) = (batch, o.get("accumulate")) {
            if let Some(k) = self.opt_int(v, "accumulate", 1) {
                if b % k != 0 {
                    self.report(Problem::BadValue { span: v.span(), message: format!("batch {b} cannot be split into {k} equal microbatches"), help: Some(format!("use a batch that is a multiple of {k}, or accumulate over a divisor of {b}")) });
                    batch = None;
                } else {
                    batch = Some(b / k);
                }
            }
        }
        for f in ["steps", "log_every"] {
            if let Some(v) = o.get(f) {
                self.opt_int(v, f, 1);
            }
        }
        if let Some(v) = o.get("seed") {
            self.opt_int(v, "seed", 0);
        }
        if let Some(v) = o.get("clip_grad_norm") {
            self.opt_num(v, "clip_grad_norm", true);
        }
        if let Some(v) = o.get("optimizer") {
            if let Some(name) = self.check_choice(v, "optimizer", OPT_ARGS) {
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
            }
        }
        if let Some(v) = o.get("data") {
            self.check_choice(v, "data source", DATA);
        }
        if let Some(v) = o.get("loss") {
            match v {
                OptValue::Expr(Expr {
                    kind: ExprKind::Name(n),
                    span,
                }) if !LOSSES.contains(&n.as_str()) => {
                    self.report(Problem::UnknownChoice {
                        span: *span,
                        kind: "loss",
                        name: n.clone(),
                        known: LOSSES.to_vec(),
                    });
                }
                OptValue::Expr(Expr {
                    kind: ExprKind::Name(_),
                    ..
                }) => {}
                other => self.report(Problem::WrongKind {
                    span: other.span(),
                    expected: "a loss name".into(),
                    found: "something else".into(),
                }),
            }
        }
        for (block, fields, req) in [
            ("eval", &["every", "steps"][..], &["every"][..]),
            (
                "checkpoint",
                &["every", "keep", "dir"][..],
                &["every", "dir"][..],
            ),
            (
                "fdo",
                &["every", "dir", "headroom"][..],
                &["every", "dir"][..],
            ),
        ] {
            match o.get(block) {
                Some(OptValue::Options(b)) => {
                    self.check_fields(b, fields, req, block, b.span);
                    for (k, v) in &b.entries {
                        match k.name.as_str() {
                            "every" | "steps" | "keep" => {
                                self.opt_int(v, &k.name, 1);
                            }
                            "dir"
                                if !matches!(
                                    v,
                                    OptValue::Expr(Expr {
                                        kind: ExprKind::Str(_),
                                        ..
                                    })
                                ) =>
                            {
                                self.report(Problem::BadValue {
                                    span: v.span(),
                                    message: "`dir` must be a string".into(),
                                    help: None,
                                });
                            }
                            "headroom" => {
                                self.opt_num(v, "headroom", true);
                            }
                            _ => {}
                        }
                    }
                }
                Some(other) => self.report(Problem::WrongKind {
                    span: other.span(),
                    expected: format!("an options block `{block}: {{ every: N, ... }}`"),
                    found: "a value".into(),
                }),
                None => {}
            }
        }
        self.bound.clear();
        // The batch is split over the axes written on the model input's first
        // dimension; check that before binding it, so the error is about the batch.
        let fwd = decl.members.iter().find_map(|m| match m {
            ast::Member::Fn(f) if f.name.name == "forward" => Some(f),
            _ => None,
        });
        // A pipelined stack runs the (micro)batch in `microbatches` pieces: the model
        // is checked and lowered for one of them.
        let staged = staged_repeat(&decl);
        self.pipeline_microbatches = None;
        self.stack_acts = None;
        self.pipeline_schedule = staged
            .as_ref()
            .map_or(String::new(), |s| s.schedule.clone());
        if let (Some(b), Some(st)) = (batch, &staged) {
            let stages = self.axis_size(&st.axis).max(1);
            let m = st.microbatches.unwrap_or(stages);
            let span = st.microbatches_span.unwrap_or(st.span);
            if m < 1 {
                // Reported where `repeat` is checked.
                batch = None;
            } else if b % m != 0 {
                self.report(Problem::BadValue {
                    span,
                    message: format!("the batch of {b} examples per step (after `accumulate`) cannot be split into {m} pipeline microbatches"),
                    help: Some(format!("use a number of microbatches that divides {b}, or a batch that is a multiple of {m}")),
                });
                batch = None;
            } else {
                batch = Some(b / m);
                self.pipeline_microbatches = Some(m as usize);
                if m < stages {
                    self.report(Problem::FewMicrobatches {
                        span,
                        microbatches: m as usize,
                        stages: stages as usize,
                    });
                }
            }
        }
        if let (Some(b), Some(f)) = (batch, fwd) {
            if let Some((_, te)) = f.params.first() {
                if let Some(ast::DimSpec::Dim {
                    axes: Some(axes), ..
                }) = te.dims.first()
                {
                    let names: Vec<String> = axes.iter().map(|a| a.name.clone()).collect();
                    let n = self.axes_product(&names);
                    if n > 1 && b % n != 0 {
                        let span = o.get("batch").map_or(t.model.span, |v| v.span());
                        self.report(Problem::BatchIndivisible {
                            span,
                            batch: b,
                            axes: Self::axes_text(&names),
                            n,
                            mesh_span: mesh.name_span,
                        });
                        batch = None;
                    }
                }
            }
        }
        let optimizer = match o.get("optimizer") {
            Some(OptValue::Expr(e)) => call_parts(e).map_or(String::new(), |(n, _, args)| {
                let momentum = args
                    .iter()
                    .any(|a| matches!(a, ast::Arg::Named(k, _) if k.name == "momentum"));
                if n == "sgd" && momentum {
                    "sgd+momentum".into()
                } else {
                    n.to_string()
                }
            }),
            _ => String::new(),
        };
        self.plan = Some(crate::plan::Plan {
            model: decl.name.name.clone(),
            mesh: mesh.name.clone(),
            mesh_axes: mesh.axes.iter().map(|a| (a.0.clone(), a.1)).collect(),
            batch,
            optimizer: optimizer.clone(),
            ..Default::default()
        });
        self.emit = Some(crate::spmd::Program {
            model: decl.name.name.clone(),
            mesh: mesh.axes.iter().map(|a| (a.0.clone(), a.1)).collect(),
            ..Default::default()
        });
        self.param_nodes.clear();
        self.path.clear();
        let errors_before = self.diags.iter().filter(|d| d.is_error()).count();
        let checked = self.check_model(&decl, batch);
        let plan = self.plan.take();
        if let Some(mut prog) = self.emit.take() {
            if self.diags.iter().filter(|d| d.is_error()).count() == errors_before
                && checked.is_some()
            {
                prog.bound = self.bound.clone();
                self.out.programs.push(prog);
            }
        }
        let Some((inst, out, _)) = checked else {
            return;
        };
        if let Some(mut plan) = plan {
            if !self.diags.iter().any(|d| d.is_error()) {
                self.finish_plan(&mut plan, &inst, &optimizer);
                if let (Some(st), Some(m)) = (&staged, self.pipeline_microbatches) {
                    use crate::runtime::pipeline as pl;
                    let stages = self.axis_size(&st.axis).max(1) as usize;
                    let ticks = pl::timeline(&st.schedule, stages, m);
                    let in_flight: Vec<usize> =
                        (0..stages).map(|k| pl::in_flight(&ticks, k)).collect();
                    // Each stage keeps, per microbatch in flight, its layers' share
                    // of one microbatch's activations; the first also those before
                    // the stack, the last those after it.
                    let (pre, upto) = self.stack_acts.unwrap_or((0.0, plan.activations));
                    let (stack, post) = (upto - pre, plan.activations - upto);
                    let activations: Vec<f64> = in_flight
                        .iter()
                        .enumerate()
                        .map(|(k, n)| {
                            let own = stack
                                + if k == 0 { pre } else { 0.0 }
                                + if k + 1 == stages { post } else { 0.0 };
                            own * *n as f64
                        })
                        .collect();
                    plan.activations = activations.first().copied().unwrap_or(plan.activations);
                    plan.pipeline = Some(crate::plan::PipelinePlan {
                        axis: st.axis.clone(),
                        stages,
                        microbatches: m,
                        schedule: st.schedule.clone(),
                        bubble: pl::bubble(&ticks),
                        in_flight,
                        activations,
                        timeline: pl::draw(&ticks),
                    });
                }
                self.plan_tables(&mut plan, mesh);
                self.out.plans.push(plan);
            }
        }
        if let Val::T(ty) = out {
            if !ty.pending.is_empty() {
                let axes: Vec<String> = ty.pending.keys().cloned().collect();
                self.report(Problem::PendingUsed {
                    span: t.model.span,
                    ty: ty.to_string(),
                    op: "the loss".into(),
                    axes: Self::axes_text(&axes),
                });
            }
        }
    }
}
