//! The layout change the checker inserts where a value's layout differs from
//! the one asked for (an annotation, a parameter or return type, an op that
//! needs a dimension whole): pending reductions are all-reduced or
//! reduce-scattered, dimensions gathered, moved (all-to-all) or sliced.
//!
//! [`plan`] is the one place that decides which collectives a layout change
//! takes and what they move: the checker reports them (N0001, or E0216 where
//! collectives must be explicit) and `shardc plan` counts them.

use super::cost::{bytes, Bytes, CommCost, Cost, CostCx};
use super::kernel::Kernel;
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::ReduceOp;
use crate::types::{Poly, TType};
use candle_core::Tensor;
use std::collections::BTreeMap;

pub const DEFS: &[Def] = &[Def {
    name: "reshard",
    kind: Kind::Operator,
    signature: "let y: f32[B@dp, D@_] = x",
    rule: "where an annotation, a parameter or return type asks for another layout: all-gather, all-reduce (`psum`), reduce-scatter, all-to-all, or a free local slice, each reported as N0001 (E0216 in strict mode or in a `local` block)",
    check: None,
    examples: &[],
    differentiable: true,
    same_on_one_device: true,
}];

/// An inserted layout change: its operand's type to the node's type.
#[derive(Clone, Debug, PartialEq)]
pub struct Reshard;

/// One collective a layout change takes: what (`all-gather over `dp``), the
/// type it starts from, and the bytes each device moves.
#[derive(Clone, Debug)]
pub struct Event {
    pub what: String,
    pub kind: &'static str,
    pub axes: Vec<String>,
    pub from: String,
    pub bytes: Bytes,
    /// The call that writes it explicitly, as the text before and after the
    /// value (`psum(` … `, mp)`): E0216's quick fix.
    pub call: (String, String),
}

/// Why a layout change is impossible.
pub enum Refusal {
    /// The target owes a reduction over `axis` that the value does not.
    NotOwed { expected: TType, axis: String },
}

/// Move `got` to the layout `target` (per dim: `None` keeps the value's axes)
/// with the pending reductions `want_pending`: the resulting type and the
/// collectives on the way, in order.
pub fn plan(
    got: &TType,
    target: &[Option<Vec<String>>],
    want_pending: &BTreeMap<String, ReduceOp>,
    axis_size: &dyn Fn(&str) -> i64,
    bound: &BTreeMap<String, Poly>,
) -> Result<(TType, Vec<Event>), Refusal> {
    let mut t = got.clone();
    let mut events: Vec<Event> = Vec::new();
    let bytes_of = |t: &TType, f: f64| bytes(t, f, bound, axis_size);
    // 1. Pending reductions the target does not keep.
    let owed: Vec<(String, ReduceOp)> = t
        .pending
        .iter()
        .filter(|(a, _)| !want_pending.contains_key(*a))
        .map(|(a, o)| (a.clone(), *o))
        .collect();
    for (axis, op) in owed {
        let n = axis_size(&axis) as f64;
        let into = target
            .iter()
            .position(|d| d.as_ref().is_some_and(|ax| ax.contains(&axis)));
        let from = t.to_string();
        t.pending.remove(&axis);
        match (op, into) {
            (ReduceOp::Sum, Some(i)) if !t.dims[i].axes.contains(&axis) => {
                let before = bytes_of(&t, (n - 1.0) / n);
                t.dims[i].axes.push(axis.clone());
                events.push(Event {
                    what: format!("reduce-scatter (psum_scatter over `{axis}`)"),
                    kind: "reduce-scatter",
                    call: ("psum_scatter(".into(), format!(", {axis}, dim: {i})")),
                    axes: vec![axis],
                    from,
                    bytes: before,
                });
            }
            _ => {
                let b = bytes_of(&t, 2.0 * (n - 1.0) / n);
                events.push(Event {
                    what: format!(
                        "all-reduce ({} over `{axis}`)",
                        super::rules::reduce_name(op)
                    ),
                    kind: "all-reduce",
                    call: (
                        format!("{}(", super::rules::reduce_name(op)),
                        format!(", {axis})"),
                    ),
                    axes: vec![axis],
                    from,
                    bytes: b,
                });
            }
        }
    }
    // Pending reductions the target expects but the value does not have.
    for (a, op) in want_pending {
        if t.pending.get(a) != Some(op) {
            let mut expected = got.clone();
            expected.pending = want_pending.clone();
            return Err(Refusal::NotOwed {
                expected,
                axis: a.clone(),
            });
        }
    }
    // 2. Per-dimension layout changes.
    for i in 0..t.rank() {
        let Some(Some(want)) = target.get(i) else {
            continue;
        };
        if &t.dims[i].axes == want {
            continue;
        }
        // Axes leaving this dim: moved to another dim (all-to-all) or gathered.
        let leaving: Vec<String> = t.dims[i]
            .axes
            .iter()
            .filter(|a| !want.contains(a))
            .cloned()
            .collect();
        for a in leaving {
            let n = axis_size(&a) as f64;
            let from = t.to_string();
            let dest = target
                .iter()
                .enumerate()
                .position(|(j, d)| j != i && d.as_ref().is_some_and(|x| x.contains(&a)));
            t.dims[i].axes.retain(|x| *x != a);
            match dest {
                Some(j) => {
                    let b = bytes_of(&t, (n - 1.0) / n / n);
                    t.dims[j].axes.push(a.clone());
                    events.push(Event {
                        what: format!("all-to-all over `{a}`"),
                        kind: "all-to-all",
                        call: ("all_to_all(".into(), format!(", {a}, from: {i}, to: {j})")),
                        axes: vec![a],
                        from,
                        bytes: b,
                    });
                }
                None => {
                    let b = bytes_of(&t, (n - 1.0) / n);
                    events.push(Event {
                        what: format!("all-gather over `{a}`"),
                        kind: "all-gather",
                        call: ("all_gather(".into(), format!(", {a})")),
                        axes: vec![a],
                        from,
                        bytes: b,
                    });
                }
            }
        }
        // Axes arriving: a local slice, no communication.
        for a in want {
            if !t.dims[i].axes.contains(a) && !t.all_axes().contains(&a.as_str()) {
                t.dims[i].axes.push(a.clone());
            }
        }
        t.dims[i].axes = want
            .iter()
            .filter(|a| t.dims[i].axes.contains(a))
            .cloned()
            .collect();
    }
    Ok((t, events))
}

/// The collectives a reshard from `from` to `to` takes (every dim of `to` asked
/// for), as plan entries.
pub fn comms(c: &CostCx, from: &TType, to: &TType) -> Vec<CommCost> {
    let target: Vec<Option<Vec<String>>> = to.dims.iter().map(|d| Some(d.axes.clone())).collect();
    match plan(from, &target, &to.pending, &|a| c.axis_size(a), c.bound) {
        Ok((_, events)) => events
            .into_iter()
            .filter_map(|e| {
                e.bytes.num.map(|b| CommCost {
                    kind: e.kind.into(),
                    axes: e.axes,
                    bytes: b,
                    explicit: false,
                })
            })
            .collect(),
        Err(_) => vec![],
    }
}

impl Primitive for Reshard {
    fn name(&self) -> &'static str {
        "reshard"
    }
    fn render(&self, args: &[String]) -> String {
        format!("reshard {}", args.join(""))
    }
    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        Forward::of(k.reshard(x[0], ts[0], out)?)
    }
    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        Ok(vec![Some(k.reshard_t(g.g, g.ts[0], g.out)?)])
    }
    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        Some(Cost {
            flops: 0.0,
            comms: comms(c, ts[0], out),
        })
    }
}
