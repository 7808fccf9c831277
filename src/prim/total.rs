//! `step_total(w)`: the sum of a data value over the whole step — every
//! microbatch of `accumulate` and of a pipeline, every device — divided by
//! the step's microbatches. It is the normaliser of a weighted or per-token
//! loss: `sum(w * l) / step_total(w)` in a loss function is the weighted mean
//! over the step's full batch, so accumulation, pipelines and any mesh give
//! the loss and gradients of one device on the whole batch (a step's loss is
//! the mean of its microbatches' losses, and each divides by the same total).
//!
//! A microbatch cannot see the others, so the runtime computes the totals
//! before the step's passes (`runtime::passes::step_totals`, from the data
//! alone: the checker refuses an operand that depends on a weight, a table
//! or the model's output, E0230) and the kernel reads its node's
//! ([`Kernel::total`]). Without them
//! (one microbatch, a generated test, evaluation) the kernel sums its
//! operand here: its local sum, added over the axes it is split over.

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, known_named, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::types::TType;
use candle_core::{DType, Tensor};

pub const DEFS: &[Def] = &[Def {
    name: "step_total",
    kind: Kind::Function,
    signature: "step_total(w)",
    rule: "a float tensor of the data (the targets, a loss function's weights, the inputs, and what is computed from them alone: E0230) → a replicated scalar: its sum over the whole step (every microbatch of `accumulate` and of a pipeline, every device) divided by the step's microbatches, so `sum(w * l) / step_total(w)` in a loss function is the weighted mean over the full batch on any mesh and accumulation; no gradient flows through it",
    check: Some(check),
    examples: &["{x: f32[4, 6]} / step_total(cast({m: i32[4, 6]}, f32) + 1.0)"],
    differentiable: false,
    same_on_one_device: true,
}];

#[derive(Clone, Debug, PartialEq)]
pub struct StepTotal;

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 1, 1) || !known_named(cx, c, &[]) {
        return None;
    }
    let t = cx.tensor(c.pos[0], "`step_total`")?;
    if !t.dtype.is_float() {
        cx.report(crate::diag::Problem::DType {
            span: c.pos[0].span,
            expected: "a float type (`cast(w, f32)`)".into(),
            found: t.dtype.name().into(),
            other: None,
        });
        return None;
    }
    if !cx.need_reduced(&t, c.name, c.pos[0]) {
        return None;
    }
    Typed::new(TType::scalar(t.dtype), StepTotal)
}

/// The axes a value of type `t` is split over.
fn split_axes(t: &TType) -> Vec<String> {
    t.dims.iter().flat_map(|d| d.axes.clone()).collect()
}

/// This device's piece of `x` (of type `t`) summed, then added over the axes
/// `t` is split over: the value's sum on every device, in f64.
pub fn global_sum(k: &Kernel, x: &Tensor, t: &TType) -> R<f64> {
    let local = x
        .to_dtype(DType::F64)
        .and_then(|v| v.sum_all())
        .and_then(|v| v.reshape(1))
        .map_err(ce)?;
    let all = k.comm.psum(k.rank, &local, &split_axes(t)).map_err(ce)?;
    Kernel::f64s(&all)?
        .first()
        .copied()
        .ok_or_else(|| crate::fault::Fault::Shape("an empty sum".into()))
}

impl Primitive for StepTotal {
    fn name(&self) -> &'static str {
        "step_total"
    }

    fn accumulates(&self) -> bool {
        true
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], _out: &TType) -> R<Forward> {
        let v = match k.total {
            Some(v) => v,
            None => global_sum(k, x[0], ts[0])?,
        };
        // In the operand's type, as every other op's result.
        Forward::of(
            Tensor::new(v, k.dev)
                .and_then(|t| t.to_dtype(x[0].dtype()))
                .map_err(ce)?,
        )
    }

    fn vjp(&self, _k: &Kernel, _g: &Grad) -> R<Vec<Option<Tensor>>> {
        Ok(vec![None])
    }

    fn backward_comms(&self) -> bool {
        false
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        // The sum of one number per device over the axes the operand is split
        // over (the runtime's total before the passes is the same collective).
        let comms = split_axes(ts[0])
            .iter()
            .filter_map(|ax| c.ring("all-reduce", ax, out, 2.0))
            .collect();
        Some(Cost { flops: 0.0, comms })
    }
}
