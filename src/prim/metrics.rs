//! The metrics a `train` logs beside its loss (`metrics: [accuracy, auc]`),
//! as an op lowering appends after the loss ([`crate::step::attach`]): the
//! sums accuracy and AUC are computed from, summed over the devices (f64).
//! Nothing flows back through it; the runtime turns the sums into the
//! metrics' values ([`Metric::value`]).

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::objective::{classes, psum_vec, row_axes, split_axes};
use super::{Def, Forward, Kind, Primitive, R};
use crate::spec::{Loss, Metric, AUC_BINS};
use crate::types::TType;
use candle_core::Tensor;

pub const DEFS: &[Def] = &[
    Def {
        name: "metrics",
        kind: Kind::Operator,
        signature: "train M on mesh { metrics: [accuracy, auc] }",
        rule: "appended after the loss by lowering: the sums each metric is computed from (right and all for accuracy, positives and negatives per probability bin for AUC), summed over the devices; no gradient",
        check: None,
        examples: &[],
        differentiable: false,
        same_on_one_device: true,
    },
];

/// The metrics' sums of the output (operand 0) against the targets (operand
/// 1), in order, [`Metric::sums`] each.
#[derive(Clone, Debug, PartialEq)]
pub struct Metrics {
    pub loss: Loss,
    pub metrics: Vec<Metric>,
    /// The loss's `ignore_index`: rows with this target are not counted.
    pub ignore: Option<i64>,
}

impl Metrics {
    /// Accuracy of logits: a row is right when its target's logit is the
    /// largest (ties count).
    fn class_accuracy(
        &self,
        k: &Kernel,
        logits: &Tensor,
        lt: &TType,
        labels: &Tensor,
    ) -> R<Vec<f64>> {
        let (vaxes, off) = classes(k, logits, lt)?;
        let m = super::reduce_fast::max_last_keepdim(logits).map_err(ce)?;
        let m = k.comm.pmax(k.rank, &m, &vaxes).map_err(ce)?;
        // Each row's logit at its label, gathered where the logits are (0
        // outside this device's classes): only the labels and the count of
        // right rows cross to the host.
        let lab = crate::kernels::host::read::<i64>(labels).map_err(ce)?;
        let v = logits.dims().last().copied().unwrap_or(0);
        let rows = lab.len();
        if rows == 0 || v == 0 || logits.elem_count() != rows * v {
            return Ok(vec![0.0, rows as f64]);
        }
        let (mut idx, mut inside) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
        for l in &lab {
            let c = l - off;
            let here = c >= 0 && (c as usize) < v;
            idx.push(if here { c as u32 } else { 0 });
            inside.push(u8::from(here));
        }
        let dev = logits.device();
        let f64 = candle_core::DType::F64;
        let local = (|| {
            let idx = Tensor::from_vec(idx, (rows, 1), dev)?;
            let inside = Tensor::from_vec(inside, (rows, 1), dev)?;
            let got = logits
                .contiguous()?
                .reshape((rows, v))?
                .gather(&idx, 1)?
                .to_dtype(f64)?;
            inside.where_cond(&got, &got.zeros_like()?)
        })()
        .map_err(ce)?;
        let tgt = k.comm.psum(k.rank, &local, &vaxes).map_err(ce)?;
        // Rows whose target is the ignored id count neither as right nor at all.
        let counted: Vec<f64> = lab
            .iter()
            .map(|l| f64::from(u8::from(Some(*l) != self.ignore)))
            .collect();
        let all: f64 = counted.iter().sum();
        let right = m
            .to_dtype(f64)
            .and_then(|m| m.reshape((rows, 1)))
            .and_then(|m| tgt.ge(&m))
            .and_then(|r| r.to_dtype(f64))
            .and_then(|r| match self.ignore {
                Some(_) => r.mul(&Tensor::from_vec(counted, (rows, 1), dev)?),
                None => Ok(r),
            })
            .and_then(|r| r.sum_all())
            .and_then(|r| crate::kernels::host::scalar(&r))
            .map_err(ce)?;
        Ok(vec![right, all])
    }

    /// Accuracy (the logit's sign is the target's) and AUC (σ(z) binned by
    /// target) of a binary output.
    fn binary(&self, z: &Tensor, y: &Tensor) -> R<Vec<f64>> {
        let zs = Kernel::f64s(z)?;
        let ys = Kernel::f64s(y)?;
        let mut sums = Vec::new();
        for m in &self.metrics {
            match m {
                Metric::Accuracy => {
                    let right = zs
                        .iter()
                        .zip(&ys)
                        .filter(|(z, y)| (**z > 0.0) == (**y > 0.5))
                        .count();
                    sums.extend([right as f64, zs.len() as f64]);
                }
                Metric::Auc => {
                    let mut h = vec![0.0; 2 * AUC_BINS];
                    for (z, y) in zs.iter().zip(&ys) {
                        let p = 1.0 / (1.0 + (-z).exp());
                        let bin = ((p * AUC_BINS as f64) as usize).min(AUC_BINS - 1);
                        h[if *y > 0.5 { bin } else { AUC_BINS + bin }] += 1.0;
                    }
                    sums.extend(h);
                }
            }
        }
        Ok(sums)
    }
}

impl Primitive for Metrics {
    fn name(&self) -> &'static str {
        "metrics"
    }
    fn attrs(&self) -> Vec<String> {
        self.metrics.iter().map(|m| m.name().to_string()).collect()
    }
    fn accumulates(&self) -> bool {
        true
    }
    fn backward_comms(&self) -> bool {
        false
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], _out: &TType) -> R<Forward> {
        let (out, ot, y) = (x[0], ts[0], x[1]);
        let sums = match self.loss {
            Loss::SoftmaxCrossEntropy => {
                if self.metrics.contains(&Metric::Accuracy) {
                    let s = self.class_accuracy(k, out, ot, y)?;
                    psum_vec(k, s, &row_axes(ot))?
                } else {
                    Vec::new()
                }
            }
            Loss::SigmoidBinaryCrossEntropy => {
                let s = self.binary(out, y)?;
                psum_vec(k, s, &split_axes(ot))?
            }
            Loss::Mse | Loss::Function => Vec::new(),
        };
        let n = sums.len();
        Forward::of(Tensor::from_vec(sums, n, k.dev).map_err(ce)?)
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], _out: &TType) -> Option<Cost> {
        Cost::flops(c.local_numel(ts[0])?)
    }
}
