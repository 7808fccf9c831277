//! The built-in training losses as ops of
//! the program: lowering appends them after the model's output (see
//! [`crate::step::attach`]), so the step's forward pass computes the loss,
//! its backward starts from it, and the plan counts its work and collectives
//! like any other op's.
//!
//! - `loss` ([`Objective`]): the mean softmax cross-entropy of logits (their
//!   class dimension possibly split over devices: only each row's max, sum of
//!   exponentials and target logit cross them), the mean squared error, or
//!   the mean sigmoid binary cross-entropy, of the model's output against the
//!   step's targets. Its value is an f64 scalar, the same on every device. It
//!   is the root of backward, whose cotangent is exactly 1 on every device;
//!   its derivative holds the output's cotangent as addends over the axes the
//!   output is replicated on (not a pipeline's stage axis: only the last
//!   stage computes it).
//!
//! The metrics logged beside the loss are [`super::metrics`].

use super::cost::{Cost, CostCx};
use super::cross_entropy_fast as fast;
use super::kernel::{ce, Kernel};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::spec::Loss;
use crate::types::TType;
use candle_core::{DType, Tensor};

pub const DEFS: &[Def] = &[
    Def {
        name: "loss",
        kind: Kind::Operator,
        signature: "train M on mesh { loss: softmax_cross_entropy }",
        rule: "appended after the model's output by lowering, for a built-in `loss:` (`softmax_cross_entropy`, `mse`, `sigmoid_binary_cross_entropy`): the mean over every target of the output against the step's targets, an f64 scalar on every device, the root of backward",
        check: None,
        examples: &[],
        differentiable: true,
        same_on_one_device: true,
    },
];

/// A built-in loss of the output (operand 0) against the targets (operand 1):
/// the mean over `rows` targets (label rows for cross-entropy, output
/// elements otherwise). With `ignore` (cross-entropy's `ignore_index`), rows
/// whose target is that id add nothing, and the mean is over the targets
/// that count in the whole step ([`Kernel::counted`]), so every microbatch,
/// device and stage divides by the same number.
#[derive(Clone, Debug, PartialEq)]
pub struct Objective {
    pub loss: Loss,
    pub rows: usize,
    pub ignore: Option<i64>,
}

/// The axes an output's elements are split over (its devices' sums cover it).
pub(super) fn split_axes(ot: &TType) -> Vec<String> {
    ot.dims.iter().flat_map(|d| d.axes.clone()).collect()
}

/// The axes the label rows of logits of type `lt` are split over.
pub(super) fn row_axes(lt: &TType) -> Vec<String> {
    lt.dims[..lt.rank().saturating_sub(1)]
        .iter()
        .flat_map(|d| d.axes.clone())
        .collect()
}

/// The class window of logits of type `lt` on this device: the axes the
/// classes are split over, and the first class here.
pub(super) fn classes(k: &Kernel, logits: &Tensor, lt: &TType) -> R<(Vec<String>, i64)> {
    let vaxes = lt
        .dims
        .last()
        .map(|d| d.axes.clone())
        .ok_or("the logits have no class dimension")?;
    let vloc = logits.dims().last().copied().unwrap_or(0);
    let (vi, _) = k.topo().shard_index(k.rank, &vaxes);
    Ok((vaxes, (vi * vloc) as i64))
}

/// `local` summed over `axes`, as f64s.
pub(super) fn psum_vec(k: &Kernel, local: Vec<f64>, axes: &[String]) -> R<Vec<f64>> {
    if local.is_empty() {
        return Ok(local);
    }
    let n = local.len();
    let t = Tensor::from_vec(local, n, k.dev).map_err(ce)?;
    k.comm
        .psum(k.rank, &t, axes)
        .and_then(|t| crate::kernels::host::read::<f64>(&t))
        .map_err(ce)
}

/// A reduced f64 scalar's value.
fn scalar(t: &Tensor) -> R<f64> {
    let v = crate::kernels::host::read::<f64>(t).map_err(ce)?;
    v.first()
        .copied()
        .ok_or_else(|| crate::fault::Fault::Shape("an empty scalar".into()))
}

impl Objective {
    /// What the summed loss is divided by: the targets of the microbatch, or
    /// with `ignore` the step's targets that count (per microbatch).
    fn denominator(&self, k: &Kernel) -> f64 {
        match self.ignore {
            Some(_) => k.counted.unwrap_or(self.rows as f64),
            None => self.rows as f64,
        }
    }

    /// 1 for each label row that counts and 0 for an ignored one, shaped
    /// `dims` in `dtype` (`None` without `ignore`).
    fn row_mask(&self, lab: &[i64], dims: &[usize], like: &Tensor) -> R<Option<Tensor>> {
        let Some(skip) = self.ignore else {
            return Ok(None);
        };
        let m: Vec<f32> = lab
            .iter()
            .map(|l| f32::from(u8::from(*l != skip)))
            .collect();
        Tensor::from_vec(m, dims, like.device())
            .and_then(|t| t.to_dtype(like.dtype()))
            .map(Some)
            .map_err(ce)
    }

    /// Mean softmax cross-entropy over all label rows; saves exp(x − max)
    /// and the global row sums for the derivative.
    fn cross_entropy(
        &self,
        k: &Kernel,
        logits: &Tensor,
        lt: &TType,
        labels: &Tensor,
    ) -> R<Forward> {
        let (vaxes, off) = classes(k, logits, lt)?;
        let m = super::reduce_fast::max_last_keepdim(logits).map_err(ce)?;
        let m = k.comm.pmax(k.rank, &m, &vaxes).map_err(ce)?;
        let lab: Vec<i64> = crate::kernels::host::read::<i64>(labels).map_err(ce)?;
        // exp(x − max), its row sums and each row's target logit (fused for f32).
        let mask = self.row_mask(&lab, m.dims(), logits)?;
        let r = fast::Rows::new(logits, &m, lab, off).map_err(ce)?;
        let se = k.comm.psum(k.rank, &r.se, &vaxes).map_err(ce)?;
        let lse = se.log().and_then(|l| l.add(&m)).map_err(ce)?;
        let tgt = k.comm.psum(k.rank, &r.tgt, &vaxes).map_err(ce)?;
        let local = lse
            .sub(&tgt)
            .and_then(|x| match &mask {
                Some(mask) => x.mul(mask),
                None => Ok(x),
            })
            .and_then(|x| x.sum_all())
            .and_then(|x| x.to_dtype(DType::F64))
            .map_err(ce)?;
        // Rows are split over the label dims' axes: sum over those devices.
        let total = k.comm.psum(k.rank, &local, &row_axes(lt)).map_err(ce)?;
        let loss = crate::kernels::host::scalar(&total).map_err(ce)? / self.denominator(k);
        Ok(Forward {
            y: Tensor::new(loss, k.dev).map_err(ce)?,
            saved: vec![r.e, se],
        })
    }

    /// Mean squared error over all elements of the (global) output; only the
    /// sum of squares crosses devices.
    fn mse(&self, k: &Kernel, out: &Tensor, ot: &TType, y: &Tensor) -> R<Forward> {
        let local = out
            .sub(y)
            .and_then(|d| d.sqr())
            .and_then(|x| x.sum_all())
            .and_then(|x| x.to_dtype(DType::F64))
            .map_err(ce)?;
        let total = k.comm.psum(k.rank, &local, &split_axes(ot)).map_err(ce)?;
        let loss = crate::kernels::host::scalar(&total).map_err(ce)? / self.rows.max(1) as f64;
        Forward::of(Tensor::new(loss, k.dev).map_err(ce)?)
    }

    /// Mean sigmoid binary cross-entropy over all output elements (logits)
    /// against 0/1 targets shaped like them: softplus(z) − y·z, computed as
    /// max(z, 0) − y·z + ln(1 + e^−|z|).
    fn binary_cross_entropy(&self, k: &Kernel, z: &Tensor, ot: &TType, y: &Tensor) -> R<Forward> {
        let y = y.to_dtype(z.dtype()).map_err(ce)?;
        let per = z
            .relu()
            .and_then(|r| r.sub(&z.mul(&y)?))
            .and_then(|r| r.add(&(z.abs()?.neg()?.exp()? + 1.0)?.log()?))
            .map_err(ce)?;
        let local = per
            .sum_all()
            .and_then(|x| x.to_dtype(DType::F64))
            .map_err(ce)?;
        let total = k.comm.psum(k.rank, &local, &split_axes(ot)).map_err(ce)?;
        let loss = crate::kernels::host::scalar(&total).map_err(ce)? / self.rows.max(1) as f64;
        Forward::of(Tensor::new(loss, k.dev).map_err(ce)?)
    }
}

impl Primitive for Objective {
    fn name(&self) -> &'static str {
        "loss"
    }
    fn attrs(&self) -> Vec<String> {
        let mut a = vec![
            self.loss.name().to_string(),
            format!("mean over {}", self.rows),
        ];
        if let Some(i) = self.ignore {
            a.push(format!("ignoring target {i}"));
        }
        a
    }
    fn accumulates(&self) -> bool {
        true
    }
    fn backward_comms(&self) -> bool {
        false
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], _out: &TType) -> R<Forward> {
        let (out, ot, y) = (x[0], ts[0], x[1]);
        match self.loss {
            Loss::SoftmaxCrossEntropy => self.cross_entropy(k, out, ot, y),
            Loss::Mse => self.mse(k, out, ot, y),
            Loss::SigmoidBinaryCrossEntropy => self.binary_cross_entropy(k, out, ot, y),
            Loss::Function => Err("a loss function is the model's own program, not `loss`".into()),
        }
    }

    /// The output's cotangent from the loss's (`g`, 1 at the root), held as
    /// addends over the axes the output is replicated on.
    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let (out, ot, y) = (g.x[0], g.ts[0], g.x[1]);
        let (_, rep) = k.topo().replication(ot, k.stage_axis);
        let v = scalar(g.g)?;
        let n = self.rows.max(1);
        let d = match self.loss {
            Loss::SoftmaxCrossEntropy => {
                let [e, se] = g.saved else {
                    return Err("the loss's forward saved nothing".into());
                };
                let (_, off) = classes(k, out, ot)?;
                let lab: Vec<i64> = crate::kernels::host::read::<i64>(y).map_err(ce)?;
                let mask = self.row_mask(&lab, se.dims(), out)?;
                let r = fast::Rows::resume(e.clone(), out, lab, off).map_err(ce)?;
                let d = r
                    .grad(se, v / (self.denominator(k) * rep as f64), None)
                    .map_err(ce)?;
                match mask {
                    Some(mask) => d.broadcast_mul(&mask).map_err(ce)?,
                    None => d,
                }
            }
            Loss::Mse => {
                let diff = out.sub(y).map_err(ce)?;
                (diff * (2.0 * v / (n * rep) as f64)).map_err(ce)?
            }
            Loss::SigmoidBinaryCrossEntropy => {
                let y = y.to_dtype(out.dtype()).map_err(ce)?;
                let sig = (out.neg().and_then(|t| t.exp()).map_err(ce)? + 1.0)
                    .and_then(|t| t.recip())
                    .map_err(ce)?;
                sig.sub(&y)
                    .and_then(|t| t / ((n * rep) as f64 / v))
                    .map_err(ce)?
            }
            Loss::Function => return Err("a loss function has no `loss` op".into()),
        };
        Ok(vec![Some(d), None])
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], _out: &TType) -> Option<Cost> {
        let ot = ts[0];
        let numel = c.local_numel(ot)?;
        let mut comms = Vec::new();
        if self.loss == Loss::SoftmaxCrossEntropy {
            let mut rows = ot.clone();
            rows.dims.pop();
            for ax in &ot.dims.last()?.axes {
                // max, sum of exponentials and target logit per row.
                comms.extend(c.ring("all-reduce", ax, &rows, 6.0));
            }
        }
        // exp / square, the sum, and the derivative's pass.
        Some(Cost {
            flops: 4.0 * numel,
            comms,
        })
    }
}
