//! Stage 7 (lower): the whole training step as one program. The SPMD program
//! ([`crate::spmd`]) holds the forward pass and, derived from its primitives'
//! derivatives, the backward one ([`crate::spmd::backward`]); a [`Step`] adds
//! what happens after them, per parameter, as data: gradients summed over the
//! step's microbatches, reduced over the axes the parameter is replicated on,
//! clipped by the global norm, and updated by the parameter's optimizer with
//! its slots. The runtime executes this description, the plan counts it, and
//! `shardc lower` prints it: none of them restates which axes a gradient is
//! summed over, which parameters step, or which slots they keep.

use crate::mesh::Topology;
use crate::prim::Prim;
use crate::source::{SourceMap, Span};
use crate::spec::{Loss, Metric, OptKind, Optimizer};
use crate::spmd::backward::{Act, Backward};
use crate::spmd::{LossNodes, Nid, Op, Param, Program, Seed};
use crate::types::{Poly, TType};
use std::fmt::Write as _;

/// What a step does after the forward and backward passes.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    /// The loss the output is trained with, and the metrics logged beside it.
    pub loss: Loss,
    pub metrics: Vec<Metric>,
    /// Chunks of microbatches whose gradients add up before the update
    /// (`accumulate`), and microbatches per pipeline pass (1 without one).
    pub accumulate: usize,
    pub microbatches: usize,
    /// Gradients scaled to this global L2 norm when above it.
    pub clip: Option<f64>,
    /// Mixed precision: the type the passes compute in, cast from the master
    /// weights at each step (whose gradients come back in the master type);
    /// `None`: the passes use the parameters as stored.
    pub compute: Option<candle_core::DType>,
    /// Per parameter of the program, in order.
    pub params: Vec<ParamStep>,
}

/// One parameter's part of the step.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamStep {
    /// The pipeline stage holding it (`None`: every device holds it).
    pub stage: Option<usize>,
    /// The mesh axes its gradient is summed over: those it is replicated on
    /// among the devices holding it (empty: nothing to reduce, or frozen).
    pub reduce: Vec<String>,
    /// How many devices hold each piece (the product of `reduce`'s sizes).
    pub copies: usize,
    /// Its optimizer, as it steps this parameter (its groups applied;
    /// frozen parameters: [`OptKind::Frozen`], no step).
    pub optimizer: Optimizer,
    /// Where its optimizer needs the whole matrix (Muon) and the parameter
    /// is split: per split dimension, the axes its update is gathered over
    /// before the step (each device then keeps its piece).
    pub gather: Vec<(usize, Vec<String>)>,
}

impl ParamStep {
    pub fn frozen(&self) -> bool {
        self.optimizer.kind == OptKind::Frozen
    }
}

/// How a `train` trains its program: what [`Step::of`] reads.
pub struct Training<'a> {
    pub loss: Loss,
    pub metrics: &'a [Metric],
    pub accumulate: usize,
    pub clip: Option<f64>,
    /// The passes' type under mixed precision (see [`Step::compute`]).
    pub compute: Option<candle_core::DType>,
    /// The optimizer stepping a parameter (a table may have its own; a
    /// frozen parameter's is [`Optimizer::frozen`]).
    pub optimizer: &'a dyn Fn(&Param) -> Optimizer,
}

impl Step {
    /// The step of `prog` trained as `how` says.
    pub fn of(prog: &Program, how: &Training) -> Step {
        let topo = Topology::of(&prog.mesh);
        let stages = prog.param_stages();
        let rows = prog.rows_params();
        let params = prog
            .params
            .iter()
            .zip(&stages)
            .enumerate()
            .map(|(k, (p, stage))| {
                let optimizer = if p.frozen {
                    Optimizer::frozen()
                } else {
                    param_optimizer(&(how.optimizer)(p), p, rows[k])
                };
                let gather = if crate::optim::rule(&optimizer).whole_matrix() {
                    p.stored
                        .dims
                        .iter()
                        .enumerate()
                        .filter(|(_, d)| !d.axes.is_empty())
                        .map(|(i, d)| (i, d.axes.clone()))
                        .collect()
                } else {
                    Vec::new()
                };
                let staged = stage.and(prog.pipeline.as_ref()).map(|pp| pp.axis.as_str());
                let (reduce, copies) = topo.replication(&p.stored, staged);
                let reduce = if optimizer.kind == OptKind::Frozen {
                    Vec::new()
                } else {
                    reduce
                };
                ParamStep {
                    stage: *stage,
                    reduce,
                    copies,
                    optimizer,
                    gather,
                }
            })
            .collect();
        Step {
            loss: how.loss,
            metrics: how.metrics.to_vec(),
            accumulate: how.accumulate.max(1),
            microbatches: prog.pipeline.as_ref().map_or(1, |p| p.microbatches.max(1)),
            clip: how.clip,
            compute: how.compute,
            params,
        }
    }

    /// The step a `train` declaration specifies for its program (an
    /// embedding table steps with its own optimizer when it names one).
    pub fn of_train(prog: &Program, t: &crate::spec::Train, spec: &crate::spec::Spec) -> Step {
        let optimizer = |p: &Param| {
            spec.tables
                .iter()
                .find(|tb| p.name.strip_prefix("tables.") == Some(tb.name.as_str()))
                .and_then(|tb| tb.optimizer.clone())
                .unwrap_or_else(|| t.optimizer.clone())
        };
        Step::of(
            prog,
            &Training {
                loss: t.loss,
                metrics: &t.metrics,
                accumulate: t.accumulate,
                clip: t.clip,
                compute: match t.precision {
                    crate::spec::Precision::F32 => None,
                    crate::spec::Precision::BF16 => Some(candle_core::DType::BF16),
                    crate::spec::Precision::F16 => Some(candle_core::DType::F16),
                },
                optimizer: &optimizer,
            },
        )
    }

    /// The optimizers' slots, for the plan: `2 slot(s) per parameter`, or
    /// per optimizer where parameters step with different ones (Muon's
    /// AdamW).
    pub fn slots_summary(&self) -> String {
        let mut seen: Vec<(&'static str, usize)> = Vec::new();
        for p in self.params.iter().filter(|p| !p.frozen()) {
            let n = crate::optim::rule(&p.optimizer).slots().count();
            let name = p.optimizer.name();
            if !seen.contains(&(name, n)) {
                seen.push((name, n));
            }
        }
        match seen.as_slice() {
            [] => "no slots".to_string(),
            [(_, n)] => format!("{n} slot(s) per parameter"),
            many => many
                .iter()
                .map(|(name, n)| format!("{n} slot(s) per {name} parameter"))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// Microbatches a step sums gradients over.
    pub fn passes(&self) -> usize {
        self.accumulate * self.microbatches
    }

    /// The step as `shardc lower` prints it after the forward program: the
    /// backward pass, the gradients' reductions, clipping and the updates.
    pub fn render(&self, prog: &Program, sources: &SourceMap) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "  loss {} of %{} ({} microbatch(es) a step)",
            self.loss.name(),
            prog.output.map_or("?".into(), |o| o.to_string()),
            self.passes()
        );
        render_backward(&mut s, prog, sources);
        let _ = writeln!(
            s,
            "gradients (summed over the microbatches, then over each parameter's replicas):"
        );
        for (p, st) in prog.params.iter().zip(&self.params) {
            let how = if st.frozen() {
                "frozen: no gradient".to_string()
            } else if st.reduce.is_empty() {
                "one copy: no reduction".to_string()
            } else {
                format!(
                    "all-reduce (psum) over ({}), {} copies",
                    st.reduce.join(", "),
                    st.copies
                )
            };
            let _ = writeln!(
                s,
                "  grad {:<28} {:<32} {how}",
                p.name,
                p.stored.to_string()
            );
        }
        match self.clip {
            Some(c) => {
                let _ = writeln!(s, "clip: every gradient × min(1, {c} / global L2 norm)");
            }
            None => {
                let _ = writeln!(s, "clip: none");
            }
        }
        let _ = match self.compute {
            Some(c) => writeln!(
                s,
                "precision: each step casts the master weights to {} working copies for the passes; \
                 their gradients come back in the master type before the all-reduces; the update and its slots stay in it",
                c.as_str()
            ),
            None => writeln!(s, "precision: the passes use the parameters as stored"),
        };
        let _ = writeln!(s, "update:");
        for (p, st) in prog.params.iter().zip(&self.params) {
            if st.frozen() {
                continue;
            }
            let o = &st.optimizer;
            let hyper: Vec<String> = o
                .hyperparameters()
                .into_iter()
                .map(|(k, v)| format!("{k} {}", short(&v)))
                .collect();
            let slots = crate::optim::rule(o).slots().names();
            let scale = if o.lr_scale == 1.0 {
                String::new()
            } else {
                format!(" × {}", o.lr_scale)
            };
            let gather = if st.gather.is_empty() {
                String::new()
            } else {
                let axes: Vec<String> = st.gather.iter().flat_map(|g| g.1.clone()).collect();
                format!("; its update all-gathered over ({}) first", axes.join(", "))
            };
            let _ = writeln!(
                s,
                "  {:<33} {}({}), lr {}{scale}; slots [{}] {}{gather}",
                p.name,
                o.name(),
                hyper.join(", "),
                o.lr,
                slots.join(", "),
                slot_type(&p.stored)
            );
        }
        s
    }
}

/// A hyperparameter as a person writes it: `1e-8`, not `0.00000001`.
fn short(v: &str) -> String {
    match v.parse::<f64>() {
        Ok(x) if x != 0.0 && (x.abs() < 1e-3 || x.abs() >= 1e6) => format!("{x:e}"),
        _ => v.to_string(),
    }
}

/// A slot's type: the parameter's stored layout.
fn slot_type(t: &TType) -> String {
    t.to_string()
}

/// The backward actions, one line each.
fn render_backward(s: &mut String, prog: &Program, sources: &SourceMap) {
    let bwd = Backward::of(prog);
    let _ = writeln!(
        s,
        "backward ({} actions, reverse mode from the loss's cotangent):",
        bwd.acts.len()
    );
    for b in &bwd.acts {
        let node = &prog.nodes[b.node];
        let line = match &b.act {
            Act::Grad(p) => format!(
                "grad {} += ∂%{}",
                prog.params.get(*p).map_or("?", |p| p.name.as_str()),
                b.node
            ),
            Act::Vjp { wants } => {
                let to: Vec<String> = node
                    .args
                    .iter()
                    .zip(wants)
                    .filter(|(_, w)| **w)
                    .map(|(a, _)| format!("∂%{a}"))
                    .collect();
                let name = match &node.op {
                    Op::Prim(p) => p.get().name(),
                    _ => "?",
                };
                let zero = if b.zero_if_absent {
                    ""
                } else {
                    " (skipped without one)"
                };
                format!("∂%{} → {} by vjp {name}{zero}", b.node, to.join(", "))
            }
        };
        let at = if node.span == crate::source::Span::default() {
            String::new()
        } else {
            sources.describe(node.span)
        };
        let _ = writeln!(s, "  {line:<60} {at}");
    }
}

/// Append the step's loss to `prog`, lowered for a `train` with `loss` and
/// `metrics`: the targets, the built-in loss (or the model's loss function,
/// inlined with the output and the targets as its inputs) and the metrics'
/// sums. Backward then starts at the loss ([`LossNodes::root`]). Targets
/// equal to `ignore` count neither in the loss nor in the metrics.
pub fn attach(prog: &mut Program, loss: Loss, ignore: Option<i64>, metrics: &[Metric], span: Span) {
    if prog.objective.is_some() {
        return;
    }
    let (Some(out), Some(targets_t)) = (prog.output, prog.targets(loss)) else {
        return;
    };
    let start = prog.nodes.len() as Nid;
    let targets = prog.add(Op::Targets, vec![], targets_t.ty.clone(), span);
    let weights = match loss {
        Loss::Function => prog
            .weights()
            .map(|(name, ty)| (prog.add(Op::Weights, vec![], ty, span), name)),
        _ => None,
    };
    let rows = prog.elements(&targets_t.ty);
    let (root, seed) = match (loss, prog.loss.take()) {
        (Loss::Function, Some(f)) => {
            match inline(prog, &f, [out, targets], weights.as_ref().map(|w| w.0)) {
                Some(root) => (root, Seed::Addends),
                None => {
                    prog.loss = Some(f);
                    return;
                }
            }
        }
        (Loss::Function, None) => return,
        (builtin, f) => {
            prog.loss = f;
            let op = Prim::Objective(crate::prim::objective::Objective {
                loss: builtin,
                rows,
                ignore,
            });
            let ty = TType::scalar(crate::ast::DType::F64);
            (
                prog.add(Op::Prim(op), vec![out, targets], ty, span),
                Seed::One,
            )
        }
    };
    let sums: usize = metrics.iter().map(|m| m.sums()).sum();
    let metrics = (!metrics.is_empty()).then(|| {
        let op = Prim::Metrics(crate::prim::metrics::Metrics {
            loss,
            metrics: metrics.to_vec(),
            ignore,
        });
        let mut ty = TType::scalar(crate::ast::DType::F64);
        ty.dims
            .push(crate::types::Dim::replicated(Poly::constant(sums as i64)));
        prog.add(Op::Prim(op), vec![out, targets], ty, span)
    });
    prog.objective = Some(LossNodes {
        start,
        targets,
        weights,
        root,
        metrics,
        seed,
    });
}

/// The loss function's program `f` appended to `prog`, its input 0 the
/// output, its input 1 the targets and its input 2 the weights (when it
/// takes them); returns its result's node.
fn inline(
    prog: &mut Program,
    f: &Program,
    [out, targets]: [Nid; 2],
    weights: Option<Nid>,
) -> Option<Nid> {
    let mut map: Vec<Nid> = Vec::with_capacity(f.nodes.len());
    for n in &f.nodes {
        let id = match &n.op {
            Op::Input(0) => out,
            Op::Input(1) => targets,
            Op::Input(2) => weights?,
            Op::Prim(_) => {
                let args = n
                    .args
                    .iter()
                    .map(|a| map.get(*a as usize).copied())
                    .collect::<Option<Vec<Nid>>>()?;
                prog.add(n.op.clone(), args, n.ty.clone(), n.span)
            }
            // A loss function reads no parameters and has at most three inputs.
            Op::Input(_) | Op::Param(_) | Op::Targets | Op::Weights => return None,
        };
        map.push(id);
    }
    map.get(f.output? as usize).copied()
}

/// The optimizer that steps parameter `p` of a run whose optimizer is
/// `base`: its parameter groups applied ([`Optimizer::for_param`]), and
/// Muon's AdamW for what Muon leaves out (weights that are not 2-D, rows of
/// an embedding or a table: `rows`).
pub fn param_optimizer(base: &Optimizer, p: &Param, rows: bool) -> Optimizer {
    let mut o = base.for_param(&p.name);
    if let Some(adamw) = o.kind.muon_fallback() {
        if p.stored.rank() != 2 || rows {
            o.kind = adamw;
            if base
                .groups
                .no_decay
                .iter()
                .any(|n| p.name.contains(n.as_str()))
            {
                o.kind = o.kind.without_decay();
            }
        }
    }
    o
}

/// What the step adds to the checker's report on `prog` trained as `t`: a
/// parameter group's name that matches no parameter (W0003), and the
/// all-gathers an optimizer needing whole matrices inserts for split
/// weights (N0001, like any inserted collective).
pub fn check(
    prog: &Program,
    t: &crate::spec::Train,
    spec: &crate::spec::Spec,
) -> Vec<crate::diag::Problem> {
    let mut out = Vec::new();
    for (name, option, span) in &t.optimizer.groups.written {
        if prog.params.iter().any(|p| p.name.contains(name.as_str())) {
            continue;
        }
        // The names paths are made of (`blocks.0.ln.scale`: `blocks`, `ln`,
        // `scale`), the closest first.
        let mut parts: Vec<&str> = Vec::new();
        for p in &prog.params {
            for c in p.name.split('.').filter(|c| c.parse::<u64>().is_err()) {
                if !parts.contains(&c) {
                    parts.push(c);
                }
            }
        }
        let closest = crate::diag::did_you_mean(name, parts.iter().copied());
        let mut near: Vec<String> = closest.iter().cloned().collect();
        near.extend(
            parts
                .iter()
                .filter(|c| Some(**c) != closest.as_deref())
                .take(8)
                .map(|c| c.to_string()),
        );
        out.push(crate::diag::Problem::UnmatchedGroup {
            span: *span,
            pattern: name.clone(),
            option,
            model: prog.model.clone(),
            near,
        });
    }
    let step = Step::of_train(prog, t, spec);
    let cx = crate::prim::CostCx {
        mesh: &prog.mesh,
        bound: &prog.bound,
    };
    for (p, st) in prog.params.iter().zip(&step.params) {
        let axes: Vec<String> = st.gather.iter().flat_map(|g| g.1.clone()).collect();
        if axes.is_empty() {
            continue;
        }
        let mut whole = p.stored.clone();
        for d in &mut whole.dims {
            d.axes.clear();
        }
        out.push(crate::diag::Problem::Reshard {
            span: p.span,
            what: format!(
                "all-gather over `{}` of `{}`'s update, for {}",
                axes.join("`, `"),
                p.name,
                st.optimizer.name()
            ),
            from: p.stored.to_string(),
            to: whole.to_string(),
            bytes: crate::units::human_bytes(gathered_bytes(&cx, &p.stored)),
        });
    }
    out
}

/// The bytes each device receives gathering a split value of type `t` whole.
pub fn gathered_bytes(cx: &crate::prim::CostCx, t: &TType) -> f64 {
    let local = cx.local_numel(t).unwrap_or(0.0);
    let copies: i64 = t.dims.iter().map(|d| cx.axes_product(&d.axes)).product();
    local * (copies.max(1) - 1) as f64 * t.dtype.bytes() as f64
}
