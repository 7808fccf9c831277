//! `causal_attention(q, k, v)` on `[batch, seq, heads, head_dim]`: softmax of
//! q·kᵀ/√E under a causal mask, times v. Batch, heads and head_dim keep their
//! layout (heads split over the model axis is Megatron attention); the sequence
//! and the head dim must be whole on each device, so a split one is gathered
//! (reported).

use super::cost::{Cost, CostCx};
use super::einsum::einsum;
use super::kernel::{ce, Kernel};
use super::rules::{arity, axes_product, axes_text, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::diag::Problem;
use crate::types::TType;
use candle_core::{Tensor, D};

pub const DEFS: &[Def] = &[Def {
    name: "causal_attention",
    kind: Kind::Function,
    signature: "causal_attention(q, k, v)",
    rule: "`q`, `k`, `v` of one type `[B, T, H, E]`, reduced; `B` and `H` keep their layout (heads split over the model axis = Megatron attention, E0204); `T` and `E` are gathered if split",
    check: Some(check),
    examples: &["causal_attention({q: f32[2, 3, 2, 4]}, {k: f32[2, 3, 2, 4]}, {v: f32[2, 3, 2, 4]})"],
    differentiable: true,
    same_on_one_device: true,
}];

#[derive(Clone, Debug, PartialEq)]
pub struct Attention;

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 3, 3) {
        return None;
    }
    let q = cx.tensor(c.pos[0], "`causal_attention`")?;
    let k = cx.tensor(c.pos[1], "`causal_attention`")?;
    let v = cx.tensor(c.pos[2], "`causal_attention`")?;
    for (t, x) in [(&q, c.pos[0]), (&k, c.pos[1]), (&v, c.pos[2])] {
        if t.rank() != 4 {
            cx.report(Problem::Rank {
                span: x.span,
                expected: 4,
                found: t.rank(),
                ty: format!("{t} (want [batch, seq, heads, head_dim])"),
                decl: None,
            });
            return None;
        }
        if !cx.need_reduced(t, "causal_attention", x) {
            return None;
        }
    }
    for (t, x) in [(&k, c.pos[1]), (&v, c.pos[2])] {
        if t.dims != q.dims || t.dtype != q.dtype {
            cx.report(Problem::Mismatch {
                span: x.span,
                expected: q.to_string(),
                found: t.to_string(),
                decl: None,
                detail: "q, k and v must have the same type".into(),
            });
            return None;
        }
    }
    let h = &q.dims[2];
    let n = axes_product(cx, &h.axes);
    if let Some(heads) = h.size.as_const() {
        if n > 1 && heads % n != 0 {
            cx.report(Problem::HeadsIndivisible {
                span: c.pos[0].span,
                heads,
                axes: axes_text(&h.axes),
                n,
            });
            return None;
        }
    }
    // Attention mixes the sequence and contracts the head dim: both must be
    // whole on each device.
    let mut target = vec![None; 4];
    target[1] = Some(vec![]);
    target[3] = Some(vec![]);
    let out = cx.reshard(&q, &target, &q.pending, c.span());
    Typed::new(out, Attention)
}

/// Causal softmax attention on [B, T, H, E]; the output and the weights [B, H, T, T].
fn attention(q: &Tensor, k: &Tensor, v: &Tensor) -> R<(Tensor, Tensor)> {
    let e = q.dims()[3] as f64;
    let t = q.dims()[1];
    let s = einsum(&["bthe", "bshe"], "bhts", &[q, k])?;
    let s = (s / e.sqrt()).map_err(ce)?;
    let mask: Vec<f64> = (0..t * t)
        .map(|i| if i % t > i / t { -1e10 } else { 0.0 })
        .collect();
    let mask = Tensor::from_vec(mask, (t, t), q.device())
        .and_then(|m| m.to_dtype(q.dtype()))
        .map_err(ce)?;
    let s = s.broadcast_add(&mask).map_err(ce)?;
    let mx = s.max_keepdim(D::Minus1).map_err(ce)?;
    let ex = s.broadcast_sub(&mx).and_then(|x| x.exp()).map_err(ce)?;
    let p = ex
        .broadcast_div(&ex.sum_keepdim(D::Minus1).map_err(ce)?)
        .map_err(ce)?;
    let out = einsum(&["bhts", "bshe"], "bthe", &[&p, v])?;
    Ok((out, p))
}

fn attention_vjp(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    p: &Tensor,
    g: &Tensor,
) -> R<(Tensor, Tensor, Tensor)> {
    let e = q.dims()[3] as f64;
    let dv = einsum(&["bhts", "bthe"], "bshe", &[p, g])?;
    let dp = einsum(&["bthe", "bshe"], "bhts", &[g, v])?;
    let dot = dp
        .mul(p)
        .and_then(|x| x.sum_keepdim(D::Minus1))
        .map_err(ce)?;
    let ds = dp.broadcast_sub(&dot).and_then(|x| x.mul(p)).map_err(ce)?;
    let ds = (ds / e.sqrt()).map_err(ce)?;
    let dq = einsum(&["bhts", "bshe"], "bthe", &[&ds, k])?;
    let dk = einsum(&["bhts", "bthe"], "bshe", &[&ds, q])?;
    Ok((dq, dk, dv))
}

impl Attention {
    /// q, k and v with the sequence whole.
    fn operands(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Vec<Tensor>> {
        (0..3).map(|i| k.reshard(x[i], ts[i], out)).collect()
    }
}

impl Primitive for Attention {
    fn name(&self) -> &'static str {
        "causal_attention"
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        let v = self.operands(k, x, ts, out)?;
        Forward::of(attention(&v[0], &v[1], &v[2])?.0)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let v = self.operands(k, g.x, g.ts, g.out)?;
        let (_, p) = attention(&v[0], &v[1], &v[2])?;
        let (dq, dk, dv) = attention_vjp(&v[0], &v[1], &v[2], &p, g.g)?;
        let mut out = Vec::new();
        for (i, d) in [dq, dk, dv].into_iter().enumerate() {
            out.push(Some(if g.ts[i].dims != g.out.dims {
                k.reshard_t(&d, g.ts[i], g.out)?
            } else {
                d
            }));
        }
        Ok(out)
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        // Scores and weighted values: 2 × 2·B·H·T·T·E over the local heads.
        let local = c.local_numel(out).unwrap_or(0.0);
        let t = out.dims.get(1).and_then(|d| c.size(&d.size)).unwrap_or(0) as f64;
        let mut comms = Vec::new();
        for x in ts {
            comms.extend(super::reshard::comms(c, x, out));
        }
        Some(Cost {
            flops: 4.0 * local * t,
            comms,
        })
    }
}
