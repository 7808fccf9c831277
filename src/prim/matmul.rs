//! `a @ b`: the last dim of `a` against the second-to-last of `b` (the only one
//! when `b` is a vector), leading dims broadcast. A contracted dim split over an
//! axis leaves a pending sum over it (Megatron's row-parallel layer).

use super::cost::{CommCost, Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::matmul_split::{broadcast_mm, mm};
use super::rules::{axes_text, Rules};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::{Expr, ReduceOp};
use crate::diag::Problem;
use crate::types::{Dim, TType};
use candle_core::{Tensor, D};
use std::collections::BTreeMap;

pub const DEFS: &[Def] = &[Def {
    name: "@",
    kind: Kind::Operator,
    signature: "a @ b",
    rule: "last dim of `a` against the second-to-last of `b` (the only one when `b` is a vector); sizes must match (E0208). Leading dims broadcast. A contracted dim split over `ax` gives `partial(ax)`; split differently on the two sides → E0213",
    check: None,
    examples: &[
        "{a: f32[4, 6]} @ {b: f32[6, 2]}",
        "{a: f32[2, 4, 6]} @ {b: f32[6, 2]}",
        "{a: f32[4, 6]} @ {b: f32[6]}",
        "{a: f32[2, 4, 6]} @ {b: f32[2, 6, 3]}",
    ],
    differentiable: true,
    same_on_one_device: true,
}];

#[derive(Clone, Debug, PartialEq)]
pub struct MatMul;

/// The type of `x @ y`.
pub fn rule(
    cx: &mut dyn Rules,
    x: &TType,
    y: &TType,
    a: &Expr,
    b: &Expr,
    e: &Expr,
) -> Option<TType> {
    if x.rank() < 1 || y.rank() < 1 {
        let (bad, ex) = if x.rank() < 1 { (x, a) } else { (y, b) };
        cx.report(Problem::Rank {
            span: ex.span,
            expected: 2,
            found: 0,
            ty: bad.to_string(),
            decl: None,
        });
        return None;
    }
    if !super::rules::same_dtype(cx, &[(x, a), (y, b)], e) {
        return None;
    }
    if !x.pending.is_empty() && !y.pending.is_empty() {
        cx.need_reduced(y, "a product of two partial values", b);
        return None;
    }
    let kx = &x.dims[x.rank() - 1];
    let ky = if y.rank() == 1 {
        &y.dims[0]
    } else {
        &y.dims[y.rank() - 2]
    };
    if kx.size != ky.size {
        cx.report_traced(
            Problem::Contraction {
                span: e.span,
                lhs: (a.span, x.to_string()),
                rhs: (b.span, y.to_string()),
                lhs_dim: format!("{} (last dim of the left)", kx.size),
                rhs_dim: format!("{} (first dim of the right)", ky.size),
            },
            e,
        );
        return None;
    }
    let caxes = if kx.axes == ky.axes || ky.axes.is_empty() {
        kx.axes.clone()
    } else if kx.axes.is_empty() {
        ky.axes.clone()
    } else {
        cx.report_traced(
            Problem::Ambiguous {
                span: e.span,
                lhs: (
                    a.span,
                    format!("contracted dim split over {}", axes_text(&kx.axes)),
                ),
                rhs: (
                    b.span,
                    format!("contracted dim split over {}", axes_text(&ky.axes)),
                ),
                detail: "the contracted dimension is split differently on each side".into(),
            },
            e,
        );
        return None;
    };
    let xb = &x.dims[..x.rank() - 1];
    let (yb, ylast): (&[Dim], Option<&Dim>) = if y.rank() == 1 {
        (&[], None)
    } else {
        (&y.dims[..y.rank() - 2], Some(&y.dims[y.rank() - 1]))
    };
    // Batch dims broadcast; the left's row dim stays.
    let (xbatch, xrow) = match xb.split_last() {
        Some((row, rest)) => (rest, Some(row)),
        None => (xb, None),
    };
    let mut dims = super::arith::broadcast(cx, xbatch, yb, (a, x), (b, y), e)?;
    dims.extend(xrow.cloned());
    dims.extend(ylast.cloned());
    // A contraction over a split dim leaves partial sums; an operand that is
    // already partial over that axis would have its pieces mixed up.
    for (t, ex) in [(x, a), (y, b)] {
        if caxes.iter().any(|ax| t.pending.contains_key(ax)) {
            cx.need_reduced(t, "a product contracted over the same axis", ex);
            return None;
        }
    }
    let mut pending = x.pending.clone();
    pending.extend(y.pending.clone());
    for ax in caxes {
        pending.insert(ax, ReduceOp::Sum);
    }
    if let Some(ax) = super::rules::split_and_pending(&dims, &pending) {
        super::rules::axis_twice(cx, &ax, (x, a), (y, b), e);
        return None;
    }
    Some(TType {
        dtype: x.dtype,
        dims,
        pending,
    })
}

/// The relayouts a matmul's operands need, in order: (operand, dim, from, to).
/// The contraction takes whichever side is split (the checker made them agree);
/// batch and row dims follow the result.
fn plan(xt: &TType, yt: &TType, out: &TType) -> Vec<(usize, usize, Vec<String>, Vec<String>)> {
    let kx = &xt.dims[xt.rank() - 1].axes;
    let ky_i = if yt.rank() == 1 { 0 } else { yt.rank() - 2 };
    let ky = &yt.dims[ky_i].axes;
    let k = if kx.is_empty() {
        ky.clone()
    } else {
        kx.clone()
    };
    let mut plan = vec![(0, xt.rank() - 1, kx.clone(), k.clone())];
    for i in 0..xt.rank() - 1 {
        let o = &out.dims[i + out.rank() + usize::from(yt.rank() == 1) - xt.rank()];
        if xt.dims[i].axes != o.axes && xt.dims[i].size.as_const() != Some(1) {
            plan.push((0, i, xt.dims[i].axes.clone(), o.axes.clone()));
        }
    }
    plan.push((1, ky_i, ky.clone(), k));
    // The right's batch dims follow the result's (aligned from the right).
    for i in 0..yt.rank().saturating_sub(2) {
        let o = &out.dims[i + out.rank() - yt.rank()];
        if yt.dims[i].axes != o.axes && yt.dims[i].size.as_const() != Some(1) {
            plan.push((1, i, yt.dims[i].axes.clone(), o.axes.clone()));
        }
    }
    if yt.rank() >= 2 {
        let last = yt.rank() - 1;
        let o = &out.dims[out.rank() - 1];
        if yt.dims[last].axes != o.axes {
            plan.push((1, last, yt.dims[last].axes.clone(), o.axes.clone()));
        }
    }
    plan
}

/// Batched matmul with broadcasting of the leading dims, and `[..., K] @ [K]`.
pub fn matmul(x: &Tensor, y: &Tensor) -> R<Tensor> {
    if y.rank() == 1 {
        return broadcast_mm(x, &y.unsqueeze(1).map_err(ce)?)
            .and_then(|t| t.squeeze(D::Minus1))
            .map_err(ce);
    }
    if y.rank() == 2 && x.rank() > 2 {
        // Fold the leading dims into rows: one big GEMM.
        let mut shape = x.dims().to_vec();
        let k = shape.pop().unwrap_or(1);
        let rows: usize = shape.iter().product();
        let out = x
            .contiguous()
            .and_then(|x| x.reshape((rows, k)))
            .and_then(|x| mm(&x, y))
            .map_err(ce)?;
        shape.push(y.dims()[1]);
        return out.reshape(shape).map_err(ce);
    }
    if x.rank() == 2 && y.rank() == 2 {
        return mm(x, y).map_err(ce);
    }
    broadcast_mm(x, y).map_err(ce)
}

/// The cotangents of `x @ y` the flags `want` (x's, y's) ask for.
fn matmul_vjp(
    x: &Tensor,
    y: &Tensor,
    g: &Tensor,
    want: [bool; 2],
) -> R<(Option<Tensor>, Option<Tensor>)> {
    if y.rank() == 1 {
        let g1 = g.unsqueeze(D::Minus1).map_err(ce)?;
        let gx = g1.broadcast_mul(y).map_err(ce)?;
        let mut gy = x.broadcast_mul(&g1).map_err(ce)?;
        while gy.rank() > 1 {
            gy = super::reduce_fast::sum(&gy, 0).map_err(ce)?;
        }
        return Ok((Some(gx), Some(gy)));
    }
    let gx = if !want[0] {
        // The input's cotangent reaches no parameter (the data's): a third of
        // the layer's backward work saved.
        None
    } else if y.rank() == 2 && g.elem_count() / y.dims()[1].max(1) < y.dims()[0] {
        // g [R, N] smaller than y [K, N] (a small batch through a big weight):
        // g @ yᵀ would have gemm pack all of y into its panel layout first,
        // for only R rows of output; y @ gᵀ reads y as it lies and packs the
        // smaller g, and its transpose is a copy of the [R, K] result.
        let n = y.dims()[1];
        let gf = g
            .contiguous()
            .and_then(|t| t.reshape(((), n)))
            .map_err(ce)?;
        Some(
            mm(y, &gf.t().map_err(ce)?)
                .and_then(|t| t.t())
                .and_then(|t| t.contiguous())
                .and_then(|t| t.reshape(x.dims()))
                .map_err(ce)?,
        )
    } else {
        // gemm reads a transposed operand as it is (no copy).
        Some(matmul(g, &y.t().map_err(ce)?)?)
    };
    let gy = if !want[1] {
        None
    } else if y.rank() == 2 {
        let k = x.dims()[x.rank() - 1];
        let n = g.dims()[g.rank() - 1];
        let xf = x
            .contiguous()
            .and_then(|t| t.reshape(((), k)))
            .map_err(ce)?;
        let gf = g
            .contiguous()
            .and_then(|t| t.reshape(((), n)))
            .map_err(ce)?;
        Some(xf.t().and_then(|t| mm(&t, &gf)).map_err(ce)?)
    } else {
        // Batch dims of `y` broadcast against `x`'s: sum the gradient over the
        // ones `y` lacks.
        let gy = x
            .t()
            .and_then(|t| t.contiguous())
            .and_then(|t| broadcast_mm(&t, g))
            .map_err(ce)?;
        Some(Kernel::unbroadcast(&gy, y.dims())?)
    };
    Ok((gx, gy))
}

impl Primitive for MatMul {
    fn name(&self) -> &'static str {
        "@"
    }

    fn render(&self, args: &[String]) -> String {
        args.join(" @ ")
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        let mut ops = [x[0].clone(), x[1].clone()];
        for (i, dim, from, to) in plan(ts[0], ts[1], out) {
            ops[i] = k.relayout(&ops[i], dim, &from, &to)?;
        }
        Forward::of(matmul(&ops[0], &ops[1])?)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let steps = plan(g.ts[0], g.ts[1], g.out);
        let mut ops = [g.x[0].clone(), g.x[1].clone()];
        for (i, dim, from, to) in &steps {
            ops[*i] = k.relayout(&ops[*i], *dim, from, to)?;
        }
        let want = [0, 1].map(|i| g.want.get(i) != Some(&false));
        let (gx, gy) = matmul_vjp(&ops[0], &ops[1], g.g, want)?;
        let mut gs = [gx, gy];
        for (i, dim, from, to) in steps.into_iter().rev() {
            if let Some(d) = &gs[i] {
                gs[i] = Some(k.relayout_t(d, dim, &from, &to)?);
            }
        }
        Ok(gs.into())
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        // 2·M·N·K per device: output elements times the local contraction length.
        let (x, y) = (ts[0], ts[1]);
        let kx = &x.dims[x.rank() - 1];
        let ky = if y.rank() == 1 {
            &y.dims[0]
        } else {
            &y.dims[y.rank() - 2]
        };
        let reduced = TType {
            dtype: out.dtype,
            dims: out.dims.clone(),
            pending: BTreeMap::new(),
        };
        let mut flops = 0.0;
        if let (Some(n), Some(k)) = (c.local_numel(&reduced), c.size(&kx.size)) {
            let shards = c.axes_product(if kx.axes.is_empty() {
                &ky.axes
            } else {
                &kx.axes
            }) as f64;
            flops = 2.0 * n * k as f64 / shards.max(1.0);
        }
        let mut comms: Vec<CommCost> = Vec::new();
        for (i, _, from, to) in plan(x, y, out) {
            comms.extend(super::cost::gathers(c, ts[i], &from, &to));
        }
        Some(Cost { flops, comms })
    }
}
