//! `softmax_cross_entropy(logits, labels)`: the mean over label rows of
//! −log softmax(logits)[label], a replicated scalar; and
//! `softmax_cross_entropy_rows(logits, labels)`: each row's value, laid out
//! like the logits' rows (what a weighted or per-token loss sums, see
//! [`super::total`]). The class dim may stay split over devices: only each
//! row's max, sum of exponentials and target logit cross them; rows split
//! over devices are summed over them (the mean only).

use super::cost::{Cost, CostCx};
use super::cross_entropy_fast as fast;
use super::kernel::{ce, Kernel};
use super::rules::{arity, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::diag::Problem;
use crate::types::TType;
use candle_core::Tensor;

pub const DEFS: &[Def] = &[
    Def {
        name: "softmax_cross_entropy",
        kind: Kind::Function,
        signature: "softmax_cross_entropy(logits, labels)",
        rule: "labels shaped like the logits without their last dim; a replicated scalar, the mean over label rows. With the class dim split, only the row max and sum-exp are reduced across devices",
        check: Some(check_mean),
        examples: &["softmax_cross_entropy({x: f32[4, 6]}, {y: i32[4]})"],
        differentiable: true,
        same_on_one_device: true,
    },
    Def {
        name: "softmax_cross_entropy_rows",
        kind: Kind::Function,
        signature: "softmax_cross_entropy_rows(logits, labels)",
        rule: "labels shaped like the logits without their last dim; each label row's −log softmax(logits)[label], shaped and split like the labels in the logits' row layout (`sum(w * softmax_cross_entropy_rows(z, y)) / step_total(w)` is a weighted or masked mean). With the class dim split, only the row max and sum-exp are reduced across devices",
        check: Some(check_rows),
        examples: &["softmax_cross_entropy_rows({x: f32[2, 3, 6]}, {y: i32[2, 3]}) * {w: f32[2, 3]}"],
        differentiable: true,
        same_on_one_device: true,
    },
];

/// The mean over label rows, or (`rows`) each row's value.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossEntropy {
    pub rows: bool,
}

fn check_mean(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    check(cx, c, false)
}

fn check_rows(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    check(cx, c, true)
}

fn check(cx: &mut dyn Rules, c: &Call, rows: bool) -> Option<Typed> {
    if !arity(cx, c, 2, 2) {
        return None;
    }
    let l = cx.tensor(c.pos[0], "the logits")?;
    let y = cx.tensor(c.pos[1], "the labels")?;
    if !cx.need_reduced(&l, c.name, c.pos[0]) {
        return None;
    }
    if l.rank() == 0
        || y.rank() + 1 != l.rank()
        || y.dims.iter().zip(&l.dims).any(|(a, b)| a.size != b.size)
    {
        cx.report(Problem::Mismatch {
            span: c.pos[1].span,
            expected: format!("labels shaped like the logits without their last dim ({l})"),
            found: y.to_string(),
            decl: None,
            detail: "labels do not match the logits".into(),
        });
        return None;
    }
    if y.dtype.is_float() {
        cx.report(Problem::DType {
            span: c.pos[1].span,
            expected: "i32".into(),
            found: y.dtype.name().into(),
            other: None,
        });
        return None;
    }
    // The labels must be laid out like the logits' rows.
    let target: Vec<Option<Vec<String>>> = l.dims[..l.rank() - 1]
        .iter()
        .map(|d| Some(d.axes.clone()))
        .collect();
    cx.reshard(&y, &target, &y.pending, c.pos[1].span);
    let out = if rows {
        // The logits' row dims and layout, in their type.
        let mut t = l.clone();
        t.dims.pop();
        t
    } else {
        TType::scalar(l.dtype)
    };
    Typed::new(out, CrossEntropy { rows })
}

/// The logits' rows and classes: (row axes, class axes, global rows).
fn layout(k: &Kernel, lt: &TType) -> R<(Vec<String>, Vec<String>, f64)> {
    let r = lt.rank() - 1;
    let rows = k.global_count(lt, &(0..r).collect::<Vec<_>>())?;
    let raxes = lt.dims[..r].iter().flat_map(|d| d.axes.clone()).collect();
    Ok((raxes, lt.dims[r].axes.clone(), rows))
}

/// This device's rows' first pass ([`fast::Rows`]) and their global
/// log-sum-exp and row sums.
fn parts(k: &Kernel, logits: &Tensor, lt: &TType, labels: &Tensor, yt: &TType) -> R<Parts> {
    let (_, vaxes, _) = layout(k, lt)?;
    // Labels in the logits' row layout.
    let mut rows_t = lt.clone();
    rows_t.dims.pop();
    rows_t.dtype = yt.dtype;
    let labels = k.reshard(labels, yt, &rows_t)?;
    let vloc = logits.dims()[logits.rank() - 1];
    let (vi, _) = k.topo().shard_index(k.rank, &vaxes);
    let off = (vi * vloc) as i64;
    let m = super::reduce_fast::max_last_keepdim(logits).map_err(ce)?;
    let m = k.comm.pmax(k.rank, &m, &vaxes).map_err(ce)?;
    let rows = fast::Rows::new(logits, &m, Kernel::ints(&labels)?, off).map_err(ce)?;
    let se = k.comm.psum(k.rank, &rows.se, &vaxes).map_err(ce)?;
    let lse = se.log().and_then(|l| l.add(&m)).map_err(ce)?;
    Ok(Parts { rows, se, lse })
}

/// What [`parts`] computes.
struct Parts {
    rows: fast::Rows,
    /// The global row sums.
    se: Tensor,
    lse: Tensor,
}

impl Primitive for CrossEntropy {
    fn name(&self) -> &'static str {
        match self.rows {
            false => "softmax_cross_entropy",
            true => "softmax_cross_entropy_rows",
        }
    }

    fn accumulates(&self) -> bool {
        true
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], _out: &TType) -> R<Forward> {
        let (logits, lt) = (x[0], ts[0]);
        let (raxes, vaxes, rows) = layout(k, lt)?;
        let p = parts(k, logits, lt, x[1], ts[1])?;
        let tgt = k.comm.psum(k.rank, &p.rows.tgt, &vaxes).map_err(ce)?;
        if self.rows {
            // Each row's value, in the rows' local shape.
            let shape = &logits.dims()[..logits.rank() - 1];
            return Forward::of(p.lse.sub(&tgt).and_then(|t| t.reshape(shape)).map_err(ce)?);
        }
        let local = p.lse.sub(&tgt).and_then(|t| t.sum_all()).map_err(ce)?;
        let total = k.comm.psum(k.rank, &local, &raxes).map_err(ce)?;
        Forward::of((total / rows).map_err(ce)?)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let (logits, lt) = (g.x[0], g.ts[0]);
        let (raxes, vaxes, rows) = layout(k, lt)?;
        let p = parts(k, logits, lt, g.x[1], g.ts[1])?;
        if self.rows {
            // The rows' cotangents are addends over the class axes they are
            // replicated on (the logits are split there): each class window
            // scales its softmax − one-hot by the row's whole cotangent.
            let ct = k.comm.psum(k.rank, g.g, &vaxes).map_err(ce)?;
            let d = p
                .rows
                .grad(&p.se, 1.0, None)
                .and_then(|d| {
                    d.broadcast_mul(
                        &ct.unsqueeze(ct.rank())
                            .and_then(|c| c.to_dtype(d.dtype()))?,
                    )
                })
                .map_err(ce)?;
            return Ok(vec![Some(d), None]);
        }
        // The scalar's cotangent is held as addends over every axis; the logits'
        // is split over their rows and classes, and addends elsewhere: sum the
        // scalar's over the axes the logits are split over.
        let mut split = raxes;
        split.extend(vaxes);
        let ct = k.comm.psum(k.rank, g.g, &split).map_err(ce)?;
        // As `t / rows` and a product with the scalar cotangent.
        let d = p.rows.grad(&p.se, 1.0 / rows, Some(&ct)).map_err(ce)?;
        Ok(vec![Some(d), None])
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], _out: &TType) -> Option<Cost> {
        let lt = ts[0];
        let mut rows = lt.clone();
        rows.dims.pop();
        let mut comms = Vec::new();
        for ax in &lt.dims[lt.rank() - 1].axes {
            // max, sum of exponentials and target logit per row.
            comms.extend(c.ring("all-reduce", ax, &rows, 6.0));
        }
        Some(Cost { flops: 0.0, comms })
    }
}
