//! `embed(w, ids)`: row `id` of `w: f32[V, D]` for each id. With `V` split over
//! an axis (vocabulary-parallel, seed 001) each device embeds the ids in its
//! window and zeros elsewhere: the result owes a sum over that axis.
//! `padding: P` is PyTorch's `padding_idx`: row `P` is looked up like any
//! other but gets no gradient, so training never changes it (the rows of pad
//! tokens of a Hugging Face checkpoint stay as loaded).

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
    signature: "embed(w, ids, padding: P)",
    rule: "`w: f32[V, D]`, integer ids → `f32[ids..., D]`; `V` split over `ax` (vocab-parallel) gives `partial(ax)`; `padding: P` (optional, 0 <= P < V, E0222): row `P` gets no gradient (PyTorch's `padding_idx`)",
    check: Some(check),
    examples: &["embed({w: f32[6, 4]}, {ids: i32[4, 2]})"],
    differentiable: true,
    same_on_one_device: true,
}];

#[derive(Clone, Debug, PartialEq)]
pub struct Embed {
    /// The row that gets no gradient (global index).
    pub padding: Option<i64>,
}

/// `padding:`'s row: a constant in `0..V` (E0222), or a layer's size.
fn padding(cx: &mut dyn Rules, c: &Call, w: &TType) -> Option<Option<i64>> {
    let Some(e) = c.named_expr("padding") else {
        return Some(None);
    };
    let p = match super::rules::expr_to_dim(e) {
        Some((de, None)) => cx.size(&de, false)?.0.as_const(),
        _ => match &e.kind {
            crate::ast::ExprKind::Int(v) => Some(*v),
            _ => None,
        },
    };
    let Some(p) = p else {
        cx.report(Problem::BadDim {
            span: e.span,
            expr: "padding".into(),
            reason: "`padding` is a constant row index".into(),
        });
        return None;
    };
    let v = w.dims[0].size.as_const();
    if p < 0 || v.is_some_and(|v| p >= v) {
        cx.report(Problem::CountRange {
            span: e.span,
            op: "embed's padding".into(),
            count: p,
            dim: 0,
            size: w.dims[0].size.to_string(),
        });
        return None;
    }
    Some(Some(p))
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) || !super::rules::known_named(cx, c, &["padding"]) {
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
    let padding = padding(cx, c, &w)?;
    Typed::new(out, Embed { padding })
}

/// The rows of `w` for `ids` (zeros outside this device's window), with the
/// local row index and the in-window mask of each id; `skip` (a global row)
/// is masked out of the mask (not of the rows).
fn rows(
    k: &Kernel,
    w: &Tensor,
    wt: &TType,
    ids: &Tensor,
    skip: Option<i64>,
) -> R<(Tensor, Tensor, Tensor)> {
    let (idx, _) = k.topo().shard_index(k.rank, &wt.dims[0].axes);
    let vloc = w.dims()[0];
    let off = (idx * vloc) as i64;
    let flat = Kernel::ints(ids)?;
    let mut local = Vec::with_capacity(flat.len());
    let mut mask = Vec::with_capacity(flat.len());
    let mut grad = Vec::with_capacity(flat.len());
    for id in flat {
        let l = id - off;
        let inside = l >= 0 && (l as usize) < vloc;
        local.push(if inside { l as u32 } else { 0 });
        mask.push(if inside { 1.0f64 } else { 0.0 });
        grad.push(if inside && Some(id) != skip {
            1.0f64
        } else {
            0.0
        });
    }
    let n = local.len();
    let li = Tensor::from_vec(local, n, k.dev).map_err(ce)?;
    let column = |v: Vec<f64>| {
        Tensor::from_vec(v, (n, 1), k.dev)
            .and_then(|t| t.to_dtype(w.dtype()))
            .map_err(ce)
    };
    let m = column(mask)?;
    let out = w
        .index_select(&li, 0)
        .and_then(|r| r.broadcast_mul(&m))
        .map_err(ce)?;
    let m = if skip.is_some() { column(grad)? } else { m };
    let mut shape = ids.dims().to_vec();
    shape.push(w.dims()[1]);
    Ok((out.reshape(shape).map_err(ce)?, li, m))
}

impl Primitive for Embed {
    fn name(&self) -> &'static str {
        "embed"
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], _out: &TType) -> R<Forward> {
        Forward::of(rows(k, x[0], ts[0], x[1], None)?.0)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let w = g.x[0];
        let (_, li, m) = rows(k, w, g.ts[0], g.x[1], self.padding)?;
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
