//! `embed(w, ids)`: row `id` of `w: f32[V, D]` for each id. With `V` split over
//! an axis (vocabulary-parallel, seed 001) each device embeds the ids in its
//! window and zeros elsewhere: the result owes a sum over that axis.

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, split_and_pending, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::ReduceOp;
use crate::diag::Problem;
use crate::types::TType;
use candle_core::Tensor;

pub const DEFS: &[Def] = &[Def {
    name: "embed",
    kind: Kind::Function,
    signature: "embed(w, ids)",
    rule: "`w: f32[V, D]`, integer ids → `f32[ids..., D]`; `V` split over `ax` (vocab-parallel) gives `partial(ax)`",
    check: Some(check),
    examples: &["embed({w: f32[6, 4]}, {ids: i32[4, 2]})"],
    differentiable: true,
    same_on_one_device: true,
}];

#[derive(Clone, Debug, PartialEq)]
pub struct Embed;

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) {
        return None;
    }
    let w = cx.tensor(c.pos[0], "the embedding table of `embed`")?;
    let ids = cx.tensor(c.pos[1], "the ids of `embed`")?;
    if w.rank() != 2 {
        cx.report(Problem::Rank {
            span: c.pos[0].span,
            expected: 2,
            found: w.rank(),
            ty: w.to_string(),
            decl: None,
        });
        return None;
    }
    if ids.dtype.is_float() {
        cx.report(Problem::DType {
            span: c.pos[1].span,
            expected: "i32".into(),
            found: ids.dtype.name().into(),
            other: None,
        });
        return None;
    }
    // Vocab-parallel (seed 001): each shard embeds the ids in its window, zero
    // elsewhere; the result owes a sum over the vocab axes.
    // Linear in the table: a partial table gives a partial result.
    if !w.pending.is_empty() && !ids.pending.is_empty() {
        cx.need_reduced(&ids, "embed", c.pos[1]);
        return None;
    }
    let mut out = TType {
        dtype: w.dtype,
        dims: ids.dims.clone(),
        pending: w.pending.clone(),
    };
    out.dims.push(w.dims[1].clone());
    for a in &w.dims[0].axes {
        if w.pending.contains_key(a) {
            cx.need_reduced(&w, "embed", c.pos[0]);
            return None;
        }
        out.pending.insert(a.clone(), ReduceOp::Sum);
    }
    if let Some(ax) = split_and_pending(&out.dims, &out.pending) {
        cx.report_traced(
            Problem::Ambiguous {
                span: c.span(),
                lhs: (c.pos[0].span, w.to_string()),
                rhs: (c.pos[1].span, ids.to_string()),
                detail: format!("axis `{ax}` would be used twice in the result"),
            },
            c.expr,
        );
        return None;
    }
    Typed::new(out, Embed)
}

/// The rows of `w` for `ids` (zeros outside this device's window), with the
/// local row index and the in-window mask of each id.
fn rows(k: &Kernel, w: &Tensor, wt: &TType, ids: &Tensor) -> R<(Tensor, Tensor, Tensor)> {
    let (idx, _) = k.topo().shard_index(k.rank, &wt.dims[0].axes);
    let vloc = w.dims()[0];
    let off = (idx * vloc) as i64;
    let flat = Kernel::ints(ids)?;
    let mut local = Vec::with_capacity(flat.len());
    let mut mask = Vec::with_capacity(flat.len());
    for id in flat {
        let l = id - off;
        let inside = l >= 0 && (l as usize) < vloc;
        local.push(if inside { l as u32 } else { 0 });
        mask.push(if inside { 1.0f64 } else { 0.0 });
    }
    let n = local.len();
    let li = Tensor::from_vec(local, n, k.dev).map_err(ce)?;
    let m = Tensor::from_vec(mask, (n, 1), k.dev)
        .and_then(|t| t.to_dtype(w.dtype()))
        .map_err(ce)?;
    let out = w
        .index_select(&li, 0)
        .and_then(|r| r.broadcast_mul(&m))
        .map_err(ce)?;
    let mut shape = ids.dims().to_vec();
    shape.push(w.dims()[1]);
    Ok((out.reshape(shape).map_err(ce)?, li, m))
}

impl Primitive for Embed {
    fn name(&self) -> &'static str {
        "embed"
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], _out: &TType) -> R<Forward> {
        Forward::of(rows(k, x[0], ts[0], x[1])?.0)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let w = g.x[0];
        let (_, li, m) = rows(k, w, g.ts[0], g.x[1])?;
        let d = w.dims()[1];
        let r =
            g.g.reshape(((), d))
                .and_then(|r| r.broadcast_mul(&m))
                .map_err(ce)?;
        let dw = w
            .zeros_like()
            .and_then(|z| z.index_add(&li, &r, 0))
            .map_err(ce)?;
        Ok(vec![Some(dw), None])
    }

    fn cost(&self, _c: &CostCx, _ts: &[&TType], _out: &TType) -> Option<Cost> {
        Cost::free()
    }
}
