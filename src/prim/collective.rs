//! Collectives written in the source (inside `local` blocks, as in `shard_map`),
//! and the gathers of FSDP's sharded parameters: each with its typing rule, its
//! transpose (psum ↔ psum, all_gather ↔ psum_scatter, all_to_all ↔ the reverse
//! all_to_all, ppermute ↔ the inverse permutation, pmax/pmin route the
//! cotangent to the extremum) and the bytes it moves.

use super::cost::{CommCost, Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{
    arity, axis_arg, dim_index, int_of, known_named, rank_error, reduce_name, Call, Rules, Typed,
};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::ReduceOp;
use crate::diag::Problem;
use crate::types::TType;
use candle_core::Tensor;

macro_rules! def {
    ($name:literal, $sig:literal, $rule:literal, $check:ident, [$($ex:literal),*], $same:literal) => {
        Def {
            name: $name,
            kind: Kind::Collective,
            signature: $sig,
            rule: $rule,
            check: Some($check),
            examples: &[$($ex),*],
            differentiable: true,
            same_on_one_device: $same,
        }
    };
}

pub const DEFS: &[Def] = &[
    def!("psum", "psum(x, ax, ...)", "removes a pending sum over the axes (all pending sums if none is named). Over an axis that splits a dim of `x`, E0215. A value with nothing pending is summed as it is on each device (per-device statistics)", reducing, ["psum({x: f32[4, 6] partial(a)}, a)", "psum({x: f32[4, 6]}, a)"], false),
    def!("pmean", "pmean(x, ax)", "`psum` divided by the axis size", reducing, ["pmean({x: f32[4, 6] partial(a)}, a)"], false),
    def!("pmax", "pmax(x, ax)", "removes a pending max", reducing, ["pmax({x: f32[4, 6] partial(max: a)}, a)"], false),
    def!("pmin", "pmin(x, ax)", "removes a pending min", reducing, ["pmin({x: f32[4, 6] partial(min: a)}, a)"], false),
    def!("reduce", "reduce(x)", "all-reduces every pending reduction (sums, maxima, minima); no-op when none (for layers used both column- and row-parallel)", reduce, ["reduce({x: f32[4, 6] partial(a)})", "reduce({x: f32[4, 6]})"], true),
    def!("all_gather", "all_gather(x, ax, dim: k)", "dim `k` (default: the dim split over `ax`) must have `ax` as its innermost axis; it becomes whole", all_gather, ["all_gather({x: f32[4, 6]}, a)", "all_gather({x: f32[4, 6]}, a, dim: 1)"], true),
    def!("psum_scatter", "psum_scatter(x, ax, dim: k)", "`x` owes a sum over `ax`; the result is reduced with dim `k` (default 0) split over `ax`", psum_scatter, ["psum_scatter({x: f32[4, 6] partial(a)}, a, dim: 1)"], true),
    def!("all_to_all", "all_to_all(x, ax, from: i, to: j)", "moves the split over `ax` from dim `i` to dim `j`", all_to_all, ["all_to_all({x: f32[4, 6]}, a, from: 0, to: 1)"], true),
    def!("ppermute", "ppermute(x, ax, shift: k)", "each device's block goes to the device `k` further along `ax` (cyclically); type unchanged", ppermute, ["ppermute({x: f32[4, 6]}, a, shift: 1)", "ppermute({x: f32[4, 6]}, a, shift: -1)"], false),
];

#[derive(Clone, Debug, PartialEq)]
pub enum Collective {
    /// Reductions over axes (`psum`, `pmax`, `pmin`, `pmean` divides by the
    /// group's size), one op per axis group, in order.
    Reduce {
        name: &'static str,
        groups: Vec<(ReduceOp, Vec<String>)>,
        mean: bool,
    },
    /// `all_gather` and `psum_scatter` (a reshard from the operand's type to
    /// the result's), and FSDP's gather of a parameter stored split.
    Relayout {
        name: &'static str,
        axes: Vec<String>,
    },
    AllToAll {
        axis: String,
    },
    Ppermute {
        axis: String,
        shift: i64,
    },
}

fn reducing(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    let name = c.name;
    if c.pos.is_empty() {
        arity(cx, c, 1, 8);
        return None;
    }
    if !known_named(cx, c, &[]) {
        return None;
    }
    let mut t = cx.tensor(c.pos[0], &format!("`{name}`"))?;
    let want = match name {
        "pmax" => ReduceOp::Max,
        "pmin" => ReduceOp::Min,
        _ => ReduceOp::Sum,
    };
    let axes: Vec<String> = if c.pos.len() == 1 {
        let a: Vec<String> = t
            .pending
            .iter()
            .filter(|(_, o)| **o == want)
            .map(|(a, _)| a.clone())
            .collect();
        if a.is_empty() {
            cx.report_traced(Problem::BadCollective { span: c.span(), message: format!("`{name}` of a value with no pending {} (`{t}`)", want.name()), help: format!("name the axis to reduce a value that differs per device (`{name}(x, axis)`), or remove the `{name}`") }, c.pos[0]);
            return None;
        }
        a
    } else {
        let mut v = Vec::new();
        for x in &c.pos[1..] {
            v.push(axis_arg(cx, x)?);
        }
        v
    };
    for a in &axes {
        match t.pending.get(a) {
            Some(o) if *o == want => {
                t.pending.remove(a);
            }
            Some(o) => {
                cx.report_traced(
                    Problem::BadCollective {
                        span: c.span(),
                        message: format!(
                            "`{name}` over `{a}` of a value with a pending {} over `{a}`",
                            o.name()
                        ),
                        help: format!("use `{}`", reduce_name(*o)),
                    },
                    c.pos[0],
                );
                return None;
            }
            None if t.all_axes().contains(&a.as_str()) => {
                cx.report_traced(Problem::BadCollective { span: c.span(), message: format!("`{name}` over `{a}` of a value split over `{a}` (`{t}`)"), help: format!("to assemble the pieces use `all_gather(x, {a})`; to reduce them, reduce over the dimension first (`sum(x, dim)`)") }, c.pos[0]);
                return None;
            }
            None => {
                // Explicit reduction of a per-device (varying) value, e.g. a
                // loss or a statistic inside a local block: allowed.
            }
        }
    }
    let name: &'static str = match name {
        "pmax" => "pmax",
        "pmin" => "pmin",
        "pmean" => "pmean",
        _ => "psum",
    };
    Typed::new(
        t,
        Collective::Reduce {
            name,
            groups: vec![(want, axes)],
            mean: name == "pmean",
        },
    )
}

fn reduce(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    // Explicit all-reduce of whatever is pending (identity when nothing is):
    // lets a generic layer serve both column- and row-parallel use.
    if !arity(cx, c, 1, 1) || !known_named(cx, c, &[]) {
        return None;
    }
    let mut t = cx.tensor(c.pos[0], "`reduce`")?;
    // Axes owing the same reduction reduce together, in the order they are owed.
    let mut groups: Vec<(ReduceOp, Vec<String>)> = Vec::new();
    for (a, op) in &t.pending {
        match groups.iter_mut().find(|g| g.0 == *op) {
            Some(g) => g.1.push(a.clone()),
            None => groups.push((*op, vec![a.clone()])),
        }
    }
    t.pending.clear();
    Typed::new(
        t,
        Collective::Reduce {
            name: "reduce",
            groups,
            mean: false,
        },
    )
}

fn all_gather(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) || !known_named(cx, c, &["dim"]) {
        return None;
    }
    let mut t = cx.tensor(c.pos[0], "`all_gather`")?;
    let a = axis_arg(cx, c.pos[1])?;
    let dim = match c.named_expr("dim") {
        Some(d) => Some(dim_index(cx, d, t.rank())?),
        None => t.dims.iter().position(|d| d.axes.contains(&a)),
    };
    match dim {
        Some(k) if t.dims[k].axes.last() == Some(&a) => {
            t.dims[k].axes.pop();
            Typed::new(
                t,
                Collective::Relayout {
                    name: "all_gather",
                    axes: vec![a],
                },
            )
        }
        _ => {
            cx.report_traced(Problem::BadCollective { span: c.span(), message: format!("`all_gather` over `{a}`, but no dimension of `{t}` is split (innermost) over `{a}`"), help: "an all_gather assembles a dimension that is split over the axis; check which axis splits which dimension".into() }, c.pos[0]);
            None
        }
    }
}

fn psum_scatter(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) || !known_named(cx, c, &["dim"]) {
        return None;
    }
    let mut t = cx.tensor(c.pos[0], "`psum_scatter`")?;
    let a = axis_arg(cx, c.pos[1])?;
    if t.pending.get(&a) != Some(&ReduceOp::Sum) {
        cx.report_traced(Problem::BadCollective { span: c.span(), message: format!("`psum_scatter` over `{a}` of a value with no pending sum over `{a}` (`{t}`)"), help: "psum_scatter reduces a partial value and splits the result; to split a whole value use a layout annotation".into() }, c.pos[0]);
        return None;
    }
    let k = match c.named_expr("dim") {
        Some(d) => dim_index(cx, d, t.rank())?,
        None => 0,
    };
    if t.rank() == 0 {
        rank_error(cx, c.pos[0], 1, &t);
        return None;
    }
    t.pending.remove(&a);
    t.dims[k].axes.push(a.clone());
    let d = t.dims[k].clone();
    if !cx.check_dim(&d, c.span(), &format!("dimension {k}")) {
        return None;
    }
    Typed::new(
        t,
        Collective::Relayout {
            name: "psum_scatter",
            axes: vec![a],
        },
    )
}

fn all_to_all(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) || !known_named(cx, c, &["from", "to"]) {
        return None;
    }
    let mut t = cx.tensor(c.pos[0], "`all_to_all`")?;
    let a = axis_arg(cx, c.pos[1])?;
    let (Some(fe), Some(te)) = (c.named_expr("from"), c.named_expr("to")) else {
        cx.report(Problem::NamedArg {
            span: c.span(),
            callee: c.name.into(),
            name: "from` and `to".into(),
            known: vec![],
            missing: true,
        });
        return None;
    };
    let f = dim_index(cx, fe, t.rank())?;
    let to = dim_index(cx, te, t.rank())?;
    if t.dims[f].axes.last() != Some(&a) {
        cx.report_traced(
            Problem::BadCollective {
                span: fe.span,
                message: format!(
                    "`all_to_all` from dimension {f}, which is not split over `{a}` in `{t}`"
                ),
                help: "`from` names the dimension currently split over the axis".into(),
            },
            c.pos[0],
        );
        return None;
    }
    t.dims[f].axes.pop();
    t.dims[to].axes.push(a.clone());
    let d = t.dims[to].clone();
    if !cx.check_dim(&d, te.span, &format!("dimension {to}")) {
        return None;
    }
    Typed::new(t, Collective::AllToAll { axis: a })
}

fn ppermute(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) || !known_named(cx, c, &["shift"]) {
        return None;
    }
    let t = cx.tensor(c.pos[0], "`ppermute`")?;
    let axis = axis_arg(cx, c.pos[1])?;
    let shift = match c.named_expr("shift") {
        None => 1,
        Some(e) => match int_of(e) {
            Some(k) => k,
            None => {
                cx.report(Problem::WrongKind {
                    span: e.span,
                    expected: "an integer shift like `shift: -1`".into(),
                    found: "an expression".into(),
                });
                return None;
            }
        },
    };
    Typed::new(t, Collective::Ppermute { axis, shift })
}

/// For an all-to-all: the dim that loses the axis (its minor axis) and the dim
/// that gains it (as its minor axis).
fn moved_axis(xt: &TType, out: &TType, a: &str) -> Option<(usize, usize)> {
    let from = (0..xt.rank()).find(|&i| {
        xt.dims[i].axes.len() == out.dims[i].axes.len() + 1
            && xt.dims[i].axes.last().is_some_and(|x| x == a)
    })?;
    let to = (0..xt.rank()).find(|&i| {
        out.dims[i].axes.len() == xt.dims[i].axes.len() + 1
            && out.dims[i].axes.last().is_some_and(|x| x == a)
    })?;
    Some((from, to))
}

impl Collective {
    fn reduce(
        &self,
        k: &Kernel,
        x: &Tensor,
        groups: &[(ReduceOp, Vec<String>)],
        mean: bool,
    ) -> R<Tensor> {
        let mut t = x.clone();
        for (op, axes) in groups {
            t = match op {
                ReduceOp::Sum => k.comm.psum(k.rank, &t, axes),
                ReduceOp::Max => k.comm.pmax(k.rank, &t, axes),
                ReduceOp::Min => k
                    .comm
                    .pmax(k.rank, &t.neg().map_err(ce)?, axes)
                    .and_then(|t| t.neg()),
            }
            .map_err(ce)?;
            if mean {
                let n: usize = axes.iter().map(|a| k.size(a)).product();
                t = (t / n as f64).map_err(ce)?;
            }
        }
        Ok(t)
    }
}

impl Primitive for Collective {
    fn name(&self) -> &'static str {
        match self {
            Collective::Reduce { name, .. } | Collective::Relayout { name, .. } => name,
            Collective::AllToAll { .. } => "all_to_all",
            Collective::Ppermute { .. } => "ppermute",
        }
    }

    fn attrs(&self) -> Vec<String> {
        match self {
            Collective::Reduce { groups, .. } => {
                groups.iter().flat_map(|g| g.1.iter().cloned()).collect()
            }
            Collective::Relayout { axes, .. } => axes.clone(),
            Collective::AllToAll { axis } => vec![axis.clone()],
            Collective::Ppermute { axis, shift } => vec![axis.clone(), format!("shift: {shift}")],
        }
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        let x = x[0];
        Forward::of(match self {
            Collective::Reduce { groups, mean, .. } => self.reduce(k, x, groups, *mean)?,
            Collective::Relayout { .. } => k.reshard(x, ts[0], out)?,
            Collective::AllToAll { axis } => match moved_axis(ts[0], out, axis) {
                Some((from, to)) => k.comm.all_to_all(k.rank, x, axis, to, from).map_err(ce)?,
                None => k.reshard(x, ts[0], out)?,
            },
            Collective::Ppermute { axis, shift } => {
                k.comm.ppermute(k.rank, x, axis, *shift).map_err(ce)?
            }
        })
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let ct = g.g;
        let d = match self {
            Collective::Reduce { groups, mean, .. } => {
                // The value before and after each group's reduction (recomputed
                // when there are several groups).
                let mut vals = vec![g.x[0].clone()];
                for (i, grp) in groups.iter().enumerate() {
                    if i + 1 == groups.len() {
                        vals.push(g.y.clone());
                    } else {
                        let next = self.reduce(k, &vals[i], std::slice::from_ref(grp), *mean)?;
                        vals.push(next);
                    }
                }
                let mut ct = ct.clone();
                for (i, (op, axes)) in groups.iter().enumerate().rev() {
                    ct = match op {
                        ReduceOp::Sum => {
                            let s = k.comm.psum(k.rank, &ct, axes).map_err(ce)?;
                            if *mean {
                                let n: usize = axes.iter().map(|a| k.size(a)).product();
                                (s / n as f64).map_err(ce)?
                            } else {
                                s
                            }
                        }
                        // The whole cotangent of the (replicated) result goes to
                        // the devices holding the extremum, split evenly between ties.
                        ReduceOp::Max | ReduceOp::Min => {
                            let mask = vals[i]
                                .eq(&vals[i + 1])
                                .and_then(|m| m.to_dtype(ct.dtype()))
                                .map_err(ce)?;
                            let count = k.comm.psum(k.rank, &mask, axes).map_err(ce)?;
                            let total = k.comm.psum(k.rank, &ct, axes).map_err(ce)?;
                            (total * mask).and_then(|t| t / count).map_err(ce)?
                        }
                    };
                }
                ct
            }
            Collective::Relayout { .. } => k.reshard_t(ct, g.ts[0], g.out)?,
            Collective::AllToAll { axis } => match moved_axis(g.ts[0], g.out, axis) {
                Some((from, to)) => k.comm.all_to_all(k.rank, ct, axis, from, to).map_err(ce)?,
                None => k.reshard_t(ct, g.ts[0], g.out)?,
            },
            // A permutation's transpose is its inverse.
            Collective::Ppermute { axis, shift } => {
                k.comm.ppermute(k.rank, ct, axis, -shift).map_err(ce)?
            }
        };
        Ok(vec![Some(d)])
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        let mut comms: Vec<CommCost> = Vec::new();
        match self {
            Collective::Reduce { groups, .. } => {
                for (_, axes) in groups {
                    for a in axes {
                        comms.extend(c.ring("all-reduce", a, out, 2.0));
                    }
                }
            }
            Collective::Relayout { name, axes } => {
                for a in axes {
                    comms.extend(match *name {
                        "psum_scatter" => c.ring("reduce-scatter", a, ts[0], 1.0),
                        _ => c.ring("all-gather", a, out, 1.0),
                    });
                }
            }
            Collective::AllToAll { axis } => {
                // Each device sends all of its piece but the 1/n it keeps.
                comms.extend(c.ring("all-to-all", axis, ts[0], 1.0));
            }
            Collective::Ppermute { axis, .. } => {
                if let Some(b) = c.bytes(ts[0], 1.0) {
                    comms.push(CommCost {
                        kind: "ppermute".into(),
                        axes: vec![axis.clone()],
                        bytes: b,
                        explicit: true,
                    });
                }
            }
        }
        Some(Cost { flops: 0.0, comms })
    }
}
