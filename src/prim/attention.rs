//! `causal_attention(q, k, v)` on `[batch, seq, heads, head_dim]`: softmax of
//! q·kᵀ/√E under a causal mask, times v. Batch and heads keep their layout
//! (heads split over the model axis is Megatron attention); the head dim must
//! be whole on each device, so a split one is gathered (reported). A sequence
//! split over one mesh axis stays split: the op runs as ring attention over
//! that axis (context parallelism, [`super::ring`]); a sequence split over
//! several axes is gathered.

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
    rule: "`q`, `k`, `v` of one type `[B, T, H, E]`, reduced; `B` and `H` keep their layout (heads split over the model axis = Megatron attention, E0204); `T` split over one axis stays split and runs as ring attention over it (context parallelism: K/V blocks passed by `ppermute`, online softmax; reported), over several axes it is gathered; `E` is gathered if split",
    check: Some(check),
    examples: &[
        "causal_attention({q: f32[2, 3, 2, 4]}, {k: f32[2, 3, 2, 4]}, {v: f32[2, 3, 2, 4]})",
        "causal_attention({q: f32[1, 8, 2, 3]}, {k: f32[1, 8, 2, 3]}, {v: f32[1, 8, 2, 3]})",
    ],
    differentiable: true,
    same_on_one_device: true,
}];

#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    /// The mesh axis the sequence is split over: ring attention around it.
    pub ring: Option<String>,
}

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
    // Attention contracts the head dim: it must be whole on each device. A
    // sequence split over one axis runs as a ring around it; over several,
    // it is gathered.
    let seq = &q.dims[1].axes;
    let ring = match seq.as_slice() {
        [a] if cx.axis_size(a) > 1 => Some(a.clone()),
        _ => None,
    };
    let mut target = vec![None; 4];
    if ring.is_none() && axes_product(cx, seq) > 1 {
        target[1] = Some(vec![]);
    }
    target[3] = Some(vec![]);
    let out = cx.reshard(&q, &target, &q.pending, c.span());
    if let Some(a) = &ring {
        // Each K/V block visits every device: n − 1 hops of two blocks.
        let n = cx.axis_size(a) as f64;
        cx.implicit(
            c.span(),
            format!("ring attention over `{a}` (K/V blocks passed by ppermute)"),
            out.to_string(),
            "the sequence kept split".into(),
            &out,
            2.0 * (n - 1.0),
        );
    }
    Typed::new(out, Attention { ring })
}

/// The causal mask of `t` positions, `t` × `t` in `like`'s dtype: -1e10
/// above the diagonal (a later key), 0 elsewhere.
pub(super) fn causal_mask(t: usize, like: &Tensor) -> R<Tensor> {
    let mask: Vec<f64> = (0..t * t)
        .map(|i| if i % t > i / t { -1e10 } else { 0.0 })
        .collect();
    Tensor::from_vec(mask, (t, t), like.device())
        .and_then(|m| m.to_dtype(like.dtype()))
        .map_err(ce)
}

/// Causal softmax attention on [B, T, H, E]; the output and the weights [B, H, T, T].
fn attention(q: &Tensor, k: &Tensor, v: &Tensor) -> R<(Tensor, Tensor)> {
    let e = q.dims()[3] as f64;
    let t = q.dims()[1];
    let s = einsum(&["bthe", "bshe"], "bhts", &[q, k])?;
    let s = (s / e.sqrt()).map_err(ce)?;
    let s = s.broadcast_add(&causal_mask(t, &s)?).map_err(ce)?;
    let mx = super::reduce_fast::max_last_keepdim(&s).map_err(ce)?;
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

    fn attrs(&self) -> Vec<String> {
        self.ring.iter().map(|a| format!("ring: {a}")).collect()
    }

    fn accumulates(&self) -> bool {
        true
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        let v = self.operands(k, x, ts, out)?;
        if let Some(a) = &self.ring {
            let (y, lse) = super::ring::forward(k, a, &v[0], &v[1], &v[2])?;
            return Ok(Forward {
                y,
                saved: vec![lse],
            });
        }
        Forward::of(attention(&v[0], &v[1], &v[2])?.0)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let v = self.operands(k, g.x, g.ts, g.out)?;
        let (dq, dk, dv) = match &self.ring {
            Some(a) => {
                let lse = g
                    .saved
                    .first()
                    .ok_or("ring attention's forward saved nothing")?;
                super::ring::vjp(k, a, (&v[0], &v[1], &v[2]), g.y, lse, g.g)?
            }
            None => {
                let (_, p) = attention(&v[0], &v[1], &v[2])?;
                attention_vjp(&v[0], &v[1], &v[2], &p, g.g)?
            }
        };
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
        // Ring attention: n − 1 hops of the K and V blocks (backward moves
        // their cotangents too, about twice as much; counted like forward).
        if let Some(a) = &self.ring {
            let n = c.axis_size(a) as f64;
            if let Some(bytes) = c.bytes(out, 2.0 * (n - 1.0)) {
                comms.push(super::cost::CommCost {
                    kind: "ppermute (ring attention)".into(),
                    axes: vec![a.clone()],
                    bytes,
                    explicit: false,
                });
            }
        }
        Some(Cost {
            flops: 4.0 * local * t,
            comms,
        })
    }
}
