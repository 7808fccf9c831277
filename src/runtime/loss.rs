//! The training losses: mean softmax cross-entropy (logits possibly split over
//! their class dimension) and mean squared error (the output possibly split),
//! each returning the global loss and the output's cotangent in the output's
//! layout, held as addends over the axes the output is replicated on.

use super::exec::{Exec, R};
use crate::spec::Loss;
use crate::types::TType;
use candle_core::{DType, Tensor};

fn ce<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
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
    match kind {
        Loss::SoftmaxCrossEntropy => cross_entropy(ex, out, ot, labels, rows, stage_axis),
        Loss::Mse => mse(ex, out, ot, labels, rows, stage_axis),
    }
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
    let split: Vec<String> = ot.dims.iter().flat_map(|d| d.axes.clone()).collect();
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
    logits: &Tensor,
    lt: &TType,
    labels: &Tensor,
    rows: usize,
    stage_axis: Option<&str>,
) -> R<(f64, Tensor)> {
    let topo = ex.comm.topo();
    let vaxes = lt.dims[lt.rank() - 1].axes.clone();
    let vloc = logits.dims()[logits.rank() - 1];
    let (vi, _) = topo.shard_index(ex.rank, &vaxes);
    let off = (vi * vloc) as i64;
    let d = candle_core::D::Minus1;
    let m = logits.max_keepdim(d).map_err(ce)?;
    let m = ex.comm.pmax(ex.rank, &m, &vaxes).map_err(ce)?;
    let e = logits.broadcast_sub(&m).and_then(|x| x.exp()).map_err(ce)?;
    let se = e.sum_keepdim(d).map_err(ce)?;
    let se = ex.comm.psum(ex.rank, &se, &vaxes).map_err(ce)?;
    let lse = se.log().and_then(|l| l.add(&m)).map_err(ce)?;
    // One-hot of the labels inside this device's vocabulary window.
    let lab: Vec<i64> = labels
        .flatten_all()
        .and_then(|t| t.to_vec1::<i64>())
        .map_err(ce)?;
    let mut oh = vec![0f64; lab.len() * vloc];
    for (r, l) in lab.iter().enumerate() {
        let k = l - off;
        if k >= 0 && (k as usize) < vloc {
            oh[r * vloc + k as usize] = 1.0;
        }
    }
    let oh = Tensor::from_vec(oh, logits.dims(), logits.device())
        .and_then(|t| t.to_dtype(logits.dtype()))
        .map_err(ce)?;
    let tgt = logits.mul(&oh).and_then(|x| x.sum_keepdim(d)).map_err(ce)?;
    let tgt = ex.comm.psum(ex.rank, &tgt, &vaxes).map_err(ce)?;
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
    // d loss / d logits, held as addends over the axes the logits are replicated on
    // (not a pipeline's stage axis: only the last stage computes them).
    let (_, rep) = topo.replication(lt, stage_axis);
    let p = e.broadcast_div(&se).map_err(ce)?;
    let ct = p
        .sub(&oh)
        .and_then(|x| x / (rows * rep) as f64)
        .map_err(ce)?;
    Ok((loss, ct))
}
