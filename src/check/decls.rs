//! Checks of the declarative items the spec does not cover — features against
//! their tables, a `train`'s batch against the model's inputs and pipeline —
//! and the plan of a trained model.

use super::{Checker, Val};
use crate::ast::{self, ExprKind, OptValue};
use crate::diag::{did_you_mean, Problem};
use crate::source::Span;

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

impl<'p> Checker<'p> {
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
        for t in &self.spec.tables {
            let (Some(vocab), Some(dim)) = (t.vocab, t.dim) else {
                continue;
            };
            let devices = t.axis.as_ref().map_or(1, |a| mesh.size(a)).max(1);
            let parts = devices.saturating_mul(mesh.sparsecores.max(1));
            let pad = |x: i64, m: i64| {
                ((x.max(0) as u64).div_ceil(m.max(1) as u64) as i64).saturating_mul(m)
            };
            let rows = pad(vocab, 8 * parts) / devices;
            let bytes = rows as f64 * pad(dim, 8) as f64 * 4.0;
            let slots = t.optimizer.as_ref().map_or(0, |o| o.slot_count()) as f64;
            plan.params += bytes;
            plan.grads += bytes;
            plan.optimizer_state += bytes * slots;
        }
    }

    /// The SparseCore stacks of the tables, per sharding axis.
    fn plan_stacks(&mut self, plan: &mut crate::plan::Plan, mesh: &crate::resolve::Mesh) {
        let sc = mesh.sparsecores.max(1) as usize;
        let mut by_axis: std::collections::BTreeMap<String, Vec<crate::embed::TableInfo>> =
            Default::default();
        for t in &self.spec.tables {
            let (Some(vocab), Some(dim)) = (t.vocab, t.dim) else {
                continue;
            };
            by_axis
                .entry(t.axis.clone().unwrap_or_default())
                .or_default()
                .push(crate::embed::TableInfo {
                    name: t.name.clone(),
                    vocab: vocab.max(1) as usize,
                    dim: dim.max(1) as usize,
                    optimizer: t
                        .optimizer
                        .as_ref()
                        .map_or(String::new(), |o| o.name().to_string()),
                    combiner: t.combiner.name().to_string(),
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

    pub(super) fn check_features(&mut self) {
        let tables = self.prog.tables.clone();
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

    pub(super) fn check_train(&mut self, t: &crate::spec::Train) {
        let prog = self.prog;
        // The spec reported an unknown model or mesh; it has neither here.
        let (Some(decl), Some(mesh)) = (prog.layers.get(&t.model).cloned(), prog.mesh(&t.mesh))
        else {
            return;
        };
        self.mesh = Some(mesh);
        // The model runs on microbatches of batch / accumulate.
        let mut batch = t.micro_batch().map(|b| b as i64);
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
                        let span = t.batch_span.unwrap_or(t.model_span);
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
        let optimizer = match &t.optimizer.kind {
            crate::spec::OptKind::Sgd { momentum, .. } if *momentum > 0.0 => {
                "sgd+momentum".to_string()
            }
            _ => t.optimizer.name().to_string(),
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
                    span: t.model_span,
                    ty: ty.to_string(),
                    op: "the loss".into(),
                    axes: Self::axes_text(&axes),
                });
            }
        }
    }
}
