//! The training losses: mean softmax cross-entropy (logits possibly split over
//! their class dimension), mean squared error and mean sigmoid binary
//! cross-entropy (the output possibly split), each returning the global loss
//! and the output's cotangent in the output's layout, held as addends over the
//! axes the output is replicated on, and the sums the step's metrics
//! (accuracy, AUC) are computed from, summed over the devices.

use super::exec::{Exec, R};
use crate::prim::cross_entropy_fast as fast;
use crate::prim::Kernel;
use crate::spec::{Loss, Metric, AUC_BINS};
use crate::types::TType;
use candle_core::{DType, Tensor};

fn ce<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// A step's loss, the output's cotangent and the metrics' global sums (in the
/// order of the metrics asked for, [`Metric::sums`] each).
pub struct Scored {
    pub loss: f64,
    pub ct: Tensor,
    pub sums: Vec<f64>,
}

/// The training loss of `out` against `labels` (see [`Loss`]) and its cotangent.
pub fn loss_fn(
    kind: Loss,
    ex: &Exec,
    out: &Tensor,
    ot: &TType,
    labels: &Tensor,
    rows: usize,
    stage_axis: Option<&str>,
) -> R<(f64, Tensor)> {
    let s = score(kind, &[], ex, out, ot, labels, rows, stage_axis)?;
    Ok((s.loss, s.ct))
}

/// The loss, its cotangent and the sums of `metrics` (each defined for `kind`:
/// the spec checks it, E0308).
#[allow(clippy::too_many_arguments)]
pub fn score(
    kind: Loss,
    metrics: &[Metric],
    ex: &Exec,
    out: &Tensor,
    ot: &TType,
    labels: &Tensor,
    rows: usize,
    stage_axis: Option<&str>,
) -> R<Scored> {
    // Mixed precision: losses are computed in f32 from the 16-bit output,
    // and the cotangent goes back in the output's type.
    if super::precision::is_half(out.dtype()) {
        let mut wex = ex.with_program(ex.prog);
        wex.dtype = DType::F32;
        let wide = super::precision::widen(out).map_err(ce)?;
        let y = super::precision::widen(labels).map_err(ce)?;
        let mut s = score(kind, metrics, &wex, &wide, ot, &y, rows, stage_axis)?;
        s.ct = s.ct.to_dtype(out.dtype()).map_err(ce)?;
        return Ok(s);
    }
    match kind {
        Loss::SoftmaxCrossEntropy => cross_entropy(ex, metrics, out, ot, labels, rows, stage_axis),
        Loss::Mse => {
            let (loss, ct) = mse(ex, out, ot, labels, rows, stage_axis)?;
            Ok(Scored {
                loss,
                ct,
                sums: Vec::new(),
            })
        }
        Loss::SigmoidBinaryCrossEntropy => {
            binary_cross_entropy(ex, metrics, out, ot, labels, rows, stage_axis)
        }
        Loss::Function => {
            let (loss, ct) = function(ex, out, labels, stage_axis)?;
            Ok(Scored {
                loss,
                ct,
                sums: Vec::new(),
            })
        }
    }
}

/// The model's loss function (the program's `loss`): run forward on the
/// output and the targets, then backward from its scalar, whose cotangent is
/// 1 held as addends over the devices it is replicated on (not a pipeline's
/// stage axis: only the last stage computes it). Its value is the same on
/// every device (the checker made it a reduced scalar).
fn function(
    ex: &Exec,
    out: &Tensor,
    labels: &Tensor,
    stage_axis: Option<&str>,
) -> R<(f64, Tensor)> {
    let lp = ex
        .prog
        .loss
        .as_deref()
        .ok_or("the program has no loss function")?;
    let mut lex = ex.with_program(lp);
    lex.stage = None;
    let tape = lex
        .forward(&[], &[out.clone(), labels.clone()], None)
        .map_err(String::from)?;
    let o = lp.output.ok_or("the loss function has no result")? as usize;
    let value = &tape.vals[o];
    let loss = value
        .to_dtype(DType::F64)
        .and_then(|v| v.flatten_all())
        .and_then(|v| v.to_vec1::<f64>())
        .map_err(ce)?
        .first()
        .copied()
        .ok_or("the loss function's result is empty")?;
    let (_, rep) = ex.comm.topo().replication(&lp.nodes[o].ty, stage_axis);
    let seed = (value.ones_like().map_err(ce)? / rep as f64).map_err(ce)?;
    // The inputs come first; the cotangents of values before the range are
    // returned, not consumed.
    let is_input = |n: &crate::spmd::Node| matches!(n.op, crate::spmd::Op::Input(_));
    let start = lp.nodes.iter().rposition(is_input).map_or(0, |i| i + 1);
    let cts = lex.backward_to_inputs(&tape, &[(o, seed)], start..lp.nodes.len())?;
    // The loss's backward runs before the model's: the most either holds.
    let mut held = ex.held.get();
    held.cotangents = held.cotangents.max(lex.held.get().cotangents);
    ex.held.set(held);
    let input = lp
        .nodes
        .iter()
        .position(|n| n.op == crate::spmd::Op::Input(0));
    let ct = match input.and_then(|i| cts.get(i).cloned().flatten()) {
        Some(ct) => ct,
        None => out.zeros_like().map_err(ce)?,
    };
    Ok((loss, ct))
}

/// The axes an output's elements are split over (its devices' sums cover it).
fn split_axes(ot: &TType) -> Vec<String> {
    ot.dims.iter().flat_map(|d| d.axes.clone()).collect()
}

/// `local` summed over `axes`.
fn psum_vec(ex: &Exec, local: Vec<f64>, axes: &[String]) -> R<Vec<f64>> {
    if local.is_empty() {
        return Ok(local);
    }
    let n = local.len();
    let t = Tensor::from_vec(local, n, &ex.dev).map_err(ce)?;
    ex.comm
        .psum(ex.rank, &t, axes)
        .and_then(|t| t.to_vec1::<f64>())
        .map_err(ce)
}

/// Mean sigmoid binary cross-entropy over all `n` output elements (logits)
/// against 0/1 targets shaped like them: softplus(z) − y·z, computed as
/// max(z, 0) − y·z + ln(1 + e^−|z|). The cotangent is (σ(z) − y)/n, held as
/// addends over the axes the output is replicated on. Accuracy counts the
/// elements whose logit's sign is the target's; AUC bins σ(z) by target.
#[allow(clippy::too_many_arguments)]
fn binary_cross_entropy(
    ex: &Exec,
    metrics: &[Metric],
    z: &Tensor,
    ot: &TType,
    y: &Tensor,
    n: usize,
    stage_axis: Option<&str>,
) -> R<Scored> {
    let topo = ex.comm.topo();
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
    let split = split_axes(ot);
    let total = ex.comm.psum(ex.rank, &local, &split).map_err(ce)?;
    let loss = total.to_scalar::<f64>().map_err(ce)? / n.max(1) as f64;
    let sig = (z.neg().and_then(|t| t.exp()).map_err(ce)? + 1.0)
        .and_then(|t| t.recip())
        .map_err(ce)?;
    let (_, rep) = topo.replication(ot, stage_axis);
    let ct = sig
        .sub(&y)
        .and_then(|t| t / (n.max(1) * rep) as f64)
        .map_err(ce)?;
    let mut sums = Vec::new();
    if !metrics.is_empty() {
        let zs = Kernel::f64s(z)?;
        let ys = Kernel::f64s(&y)?;
        for m in metrics {
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
        sums = psum_vec(ex, sums, &split)?;
    }
    Ok(Scored { loss, ct, sums })
}

/// Mean squared error over all `n` elements of the (global) output; only the
/// sum of squares crosses devices. The cotangent, 2(out − y)/n, is held as
/// addends over the axes the output is replicated on, like cross-entropy's.
fn mse(
    ex: &Exec,
    out: &Tensor,
    ot: &TType,
    y: &Tensor,
    n: usize,
    stage_axis: Option<&str>,
) -> R<(f64, Tensor)> {
    let topo = ex.comm.topo();
    let diff = out.sub(y).map_err(ce)?;
    let local = diff
        .sqr()
        .and_then(|x| x.sum_all())
        .and_then(|x| x.to_dtype(DType::F64))
        .map_err(ce)?;
    let split = split_axes(ot);
    let total = ex.comm.psum(ex.rank, &local, &split).map_err(ce)?;
    let loss = total.to_scalar::<f64>().map_err(ce)? / n.max(1) as f64;
    let (_, rep) = topo.replication(ot, stage_axis);
    let ct = (diff * (2.0 / (n.max(1) * rep) as f64)).map_err(ce)?;
    Ok((loss, ct))
}

/// Mean softmax cross-entropy over all label rows, with logits possibly split over
/// the vocabulary (seed 001): only the max, the sum of exponentials and the target
/// logit cross devices. Returns the global loss and the logits' cotangent.
fn cross_entropy(
    ex: &Exec,
    metrics: &[Metric],
    logits: &Tensor,
    lt: &TType,
    labels: &Tensor,
    rows: usize,
    stage_axis: Option<&str>,
) -> R<Scored> {
    let topo = ex.comm.topo();
    let vaxes = lt.dims[lt.rank() - 1].axes.clone();
    let vloc = logits.dims()[logits.rank() - 1];
    let (vi, _) = topo.shard_index(ex.rank, &vaxes);
    let off = (vi * vloc) as i64;
    let m = crate::prim::reduce_fast::max_last_keepdim(logits).map_err(ce)?;
    let m = ex.comm.pmax(ex.rank, &m, &vaxes).map_err(ce)?;
    let lab: Vec<i64> = labels
        .flatten_all()
        .and_then(|t| t.to_vec1::<i64>())
        .map_err(ce)?;
    // exp(x − max), its row sums and each row's target logit (fused for f32).
    let r = fast::Rows::new(logits, &m, lab, off).map_err(ce)?;
    let se = ex.comm.psum(ex.rank, &r.se, &vaxes).map_err(ce)?;
    let lse = se.log().and_then(|l| l.add(&m)).map_err(ce)?;
    let tgt = ex.comm.psum(ex.rank, &r.tgt, &vaxes).map_err(ce)?;
    // A row is right when its target's logit is the largest (ties count).
    let mut sums = Vec::new();
    if metrics.contains(&Metric::Accuracy) {
        let (t, mx) = (Kernel::f64s(&tgt)?, Kernel::f64s(&m)?);
        let right = t.iter().zip(&mx).filter(|(t, m)| *t >= *m).count();
        sums.extend([right as f64, t.len() as f64]);
    }
    let local = lse
        .sub(&tgt)
        .and_then(|x| x.sum_all())
        .and_then(|x| x.to_dtype(DType::F64))
        .map_err(ce)?;
    // Rows are split over the label dims' axes: sum over those devices.
    let raxes: Vec<String> = lt.dims[..lt.rank() - 1]
        .iter()
        .flat_map(|d| d.axes.clone())
        .collect();
    let total = ex.comm.psum(ex.rank, &local, &raxes).map_err(ce)?;
    let loss = total.to_scalar::<f64>().map_err(ce)? / rows as f64;
    let sums = psum_vec(ex, sums, &raxes)?;
    // d loss / d logits, held as addends over the axes the logits are replicated on
    // (not a pipeline's stage axis: only the last stage computes them).
    let (_, rep) = topo.replication(lt, stage_axis);
    let ct = r.grad(&se, 1.0 / (rows * rep) as f64, None).map_err(ce)?;
    Ok(Scored { loss, ct, sums })
}
