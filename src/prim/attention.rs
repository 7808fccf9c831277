//! Softmax attention on `[batch, seq, heads, head_dim]`: softmax of
//! q·kᵀ/√E under a mask, times v.
//!
//! - `causal_attention(q, k, v)`: a causal mask (a query sees itself and the
//!   keys before it);
//! - `attention(q, k, v, causal:, window:)`: the family. Bidirectional by
//!   default (an encoder, a ViT); `causal: true`; `window: W` a sliding window
//!   (a query sees the keys less than W positions away: before it only when
//!   causal, Mistral's); keys and values of another length than the queries
//!   (cross-attention, `[B, S, KV, E]`); and fewer key/value heads than query
//!   heads (grouped-query attention: KV divides H, each key/value head serves
//!   H / KV query heads, as Llama's and Mistral's do); `keys: m` (`[B, S]`)
//!   hides the keys whose entry is 0 (padding).
//!
//! Batch and heads keep their layout (heads split over the model axis is
//! Megatron attention; the key/value heads must be split like the query
//! heads); the head dim must be whole on each device, so a split one is
//! gathered (reported). A sequence split over one mesh axis (queries and keys
//! of one length and layout) stays split: the op runs as ring attention over
//! that axis (context parallelism, [`super::ring`]), skipping the blocks the
//! mask hides entirely (a window's far blocks); a sequence split over several
//! axes, or a cross-attention's, is gathered.

use super::cost::{Cost, CostCx};
use super::einsum::einsum;
use super::kernel::{ce, Kernel};
use super::rules::{arity, axes_product, axes_text, known_named, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::ExprKind;
use crate::diag::Problem;
use crate::types::TType;
use candle_core::{DType, Tensor, D};

pub const DEFS: &[Def] = &[
    Def {
        name: "causal_attention",
        kind: Kind::Function,
        signature: "causal_attention(q, k, v)",
        rule: "`q`, `k`, `v` of one type `[B, T, H, E]`, reduced; `B` and `H` keep their layout (heads split over the model axis = Megatron attention, E0204); `T` split over one axis stays split and runs as ring attention over it (context parallelism: K/V blocks passed by `ppermute`, online softmax; reported), over several axes it is gathered; `E` is gathered if split",
        check: Some(check_causal),
        examples: &[
            "causal_attention({q: f32[2, 3, 2, 4]}, {k: f32[2, 3, 2, 4]}, {v: f32[2, 3, 2, 4]})",
            "causal_attention({q: f32[1, 8, 2, 3]}, {k: f32[1, 8, 2, 3]}, {v: f32[1, 8, 2, 3]})",
        ],
        differentiable: true,
        same_on_one_device: true,
    },
    Def {
        name: "attention",
        kind: Kind::Function,
        signature: "attention(q, k, v, causal: false, window: W, keys: m)",
        rule: "`q: [B, T, H, E]`, `k` and `v` of one type `[B, S, KV, E]`, reduced; bidirectional unless `causal: true`; `window: W` (an integer ≥ 1) lets a query see only keys less than `W` positions away; `keys: m` (`[B, S]`, any dtype, reduced) hides the keys whose entry is 0 from every query (padding; no gradient; the sequence is then gathered, not ringed); causal and windowed attention need `S = T` (E0212); `KV` divides `H` (grouped-query attention, each key/value head serving `H / KV` query heads) and is split like `H` (E0204); `B` and `H` keep their layout; with `S = T` of one layout, a sequence split over one axis runs as ring attention over it (blocks the mask hides are skipped; reported), otherwise it is gathered; `E` is gathered if split",
        check: Some(check_general),
        examples: &[
            "attention({q: f32[2, 3, 2, 4]}, {k: f32[2, 3, 2, 4]}, {v: f32[2, 3, 2, 4]})",
            "attention({q: f32[1, 6, 2, 3]}, {k: f32[1, 6, 2, 3]}, {v: f32[1, 6, 2, 3]}, causal: true, window: 2)",
            "attention({q: f32[1, 5, 2, 3]}, {k: f32[1, 5, 2, 3]}, {v: f32[1, 5, 2, 3]}, window: 2)",
            "attention({q: f32[2, 3, 2, 4]}, {k: f32[2, 5, 2, 4]}, {v: f32[2, 5, 2, 4]})",
            "attention({q: f32[1, 4, 4, 3]}, {k: f32[1, 4, 2, 3]}, {v: f32[1, 4, 2, 3]}, causal: true)",
            "attention({q: f32[2, 3, 2, 4]}, {k: f32[2, 5, 2, 4]}, {v: f32[2, 5, 2, 4]}, keys: {m: f32[2, 5]})",
        ],
        differentiable: true,
        same_on_one_device: true,
    },
];

/// Which keys each query sees: not the later ones when `causal`, and only
/// those less than `window` positions away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mask {
    pub causal: bool,
    pub window: Option<usize>,
}

impl Mask {
    pub const CAUSAL: Mask = Mask {
        causal: true,
        window: None,
    };

    /// Whether query `i` sees key `j` (the definition [`Mask::block`]'s
    /// tensors are tested against).
    #[cfg(test)]
    fn allows(self, i: usize, j: usize) -> bool {
        !(self.causal && j > i) && self.window.is_none_or(|w| i.abs_diff(j) < w)
    }

    /// Whether queries `q0..q0+tq` see none of keys `k0..k0+tk`.
    pub(super) fn empty(self, q0: usize, tq: usize, k0: usize, tk: usize) -> bool {
        if tq == 0 || tk == 0 {
            return true;
        }
        let (q1, k1) = (q0 + tq - 1, k0 + tk - 1);
        let gap = if k0 > q1 {
            k0 - q1
        } else {
            q0.saturating_sub(k1)
        };
        (self.causal && k0 > q1) || self.window.is_some_and(|w| gap >= w)
    }

    /// The additive mask of queries `q0..q0+tq` against keys `k0..k0+tk`
    /// ([tq, tk] in `like`'s dtype: -1e10 where hidden, 0 elsewhere); `None`
    /// when every pair is seen.
    pub(super) fn block(
        self,
        (q0, tq): (usize, usize),
        (k0, tk): (usize, usize),
        like: &Tensor,
    ) -> R<Option<Tensor>> {
        if self.sees_all((q0, tq), (k0, tk)) {
            return Ok(None);
        }
        // Built where the scores are (a GPU builds it in a few kernels
        // instead of copying [tq, tk] values from the host each call).
        let dev = like.device();
        let pos = |a: usize, n: usize| Tensor::arange(a as f32, (a + n) as f32, dev);
        let m = (|| {
            let qi = pos(q0, tq)?.reshape((tq, 1))?;
            let kj = pos(k0, tk)?.reshape((1, tk))?;
            let mut seen = Tensor::ones((tq, tk), DType::U8, dev)?;
            if self.causal {
                seen = seen.mul(&kj.broadcast_le(&qi)?)?;
            }
            if let Some(w) = self.window {
                let gap = qi.broadcast_sub(&kj)?.abs()?;
                seen = seen.mul(&gap.lt(w as f64)?)?;
            }
            let zero = Tensor::zeros((tq, tk), like.dtype(), dev)?;
            let hidden = Tensor::full(-1e10f64, (tq, tk), dev)?.to_dtype(like.dtype())?;
            seen.where_cond(&zero, &hidden)
        })()
        .map_err(ce)?;
        Ok(Some(m))
    }

    /// Whether every query of `q0..q0+tq` sees every key of `k0..k0+tk`.
    fn sees_all(self, (q0, tq): (usize, usize), (k0, tk): (usize, usize)) -> bool {
        if tq == 0 || tk == 0 {
            return true;
        }
        let (q1, k1) = (q0 + tq - 1, k0 + tk - 1);
        (!self.causal || k1 <= q0)
            && self
                .window
                .is_none_or(|w| q1.abs_diff(k0).max(q0.abs_diff(k1)) < w)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Attention {
    /// The mesh axis the sequence is split over: ring attention around it.
    pub ring: Option<String>,
    pub mask: Mask,
    /// Called as `attention` (not `causal_attention`): its name in the plan.
    pub general: bool,
    /// A fourth operand `keys: m` `[B, S]`: the keys whose entry is 0 are
    /// hidden from every query (a padded batch's padding).
    pub keys: bool,
}

fn check_causal(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    // `window:` and `keys:` are `attention`'s: here they would be ignored.
    if !arity(cx, c, 3, 3) || !known_named(cx, c, &[]) {
        return None;
    }
    check(cx, c, Mask::CAUSAL, false)
}

/// `attention`'s `causal:` and `window:`.
fn mask_of(cx: &mut dyn Rules, c: &Call) -> Option<Mask> {
    let causal = match c.named_expr("causal").map(|e| (&e.kind, e.span)) {
        None => false,
        Some((ExprKind::Name(b), _)) if b == "true" => true,
        Some((ExprKind::Name(b), _)) if b == "false" => false,
        Some((_, span)) => {
            cx.report(Problem::WrongKind {
                span,
                expected: "`true` or `false`".into(),
                found: "something else".into(),
            });
            return None;
        }
    };
    let window = match c.named_expr("window") {
        None => None,
        Some(e) => {
            let w = match super::rules::expr_to_dim(e) {
                Some((de, None)) => cx.size(&de, false)?.0.as_const(),
                _ => super::rules::int_of(e),
            };
            match w {
                Some(w) if w >= 1 => Some(w as usize),
                _ => {
                    cx.report(Problem::BadDim {
                        span: e.span,
                        expr: "window".into(),
                        reason: "`window` is a constant number of positions, at least 1".into(),
                    });
                    return None;
                }
            }
        }
    };
    Some(Mask { causal, window })
}

fn check_general(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 3, 3) || !known_named(cx, c, &["causal", "window", "keys"]) {
        return None;
    }
    let mask = mask_of(cx, c)?;
    check(cx, c, mask, true)
}

/// `keys: m`, the keys' padding mask: `[B, S]` of the keys' batch and
/// length, reduced (any dtype: 0 hides a key). Its operand follows q, k, v.
fn keys_of(cx: &mut dyn Rules, c: &Call, k: &TType) -> Option<Option<TType>> {
    let Some(e) = c.named_expr("keys") else {
        return Some(None);
    };
    let m = cx.tensor(e, "`attention`'s `keys`")?;
    let fits = m.rank() == 2 && m.dims[0] == k.dims[0] && m.dims[1].size == k.dims[1].size;
    if !fits {
        cx.report(Problem::Mismatch {
            span: e.span,
            expected: format!("[{}, {}]", k.dims[0], k.dims[1].size),
            found: m.to_string(),
            decl: None,
            detail: "the keys' mask is [batch, key length], laid out like the keys' batch".into(),
        });
        return None;
    }
    cx.need_reduced(&m, "attention", e).then_some(Some(m))
}

/// `q`, `k` and `v` as tensors of rank 4, reduced, `k` and `v` of one type.
fn operand_types(cx: &mut dyn Rules, c: &Call) -> Option<[TType; 3]> {
    let what = format!("`{}`", c.name);
    let mut ts = Vec::new();
    for x in &c.pos[..3] {
        let t = cx.tensor(x, &what)?;
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
        if !cx.need_reduced(&t, c.name, x) {
            return None;
        }
        ts.push(t);
    }
    let [q, k, v]: [TType; 3] = ts.try_into().ok()?;
    if v.dims != k.dims || v.dtype != k.dtype {
        cx.report(Problem::Mismatch {
            span: c.pos[2].span,
            expected: k.to_string(),
            found: v.to_string(),
            decl: None,
            detail: "k and v must have the same type".into(),
        });
        return None;
    }
    Some([q, k, v])
}

/// What `k` (of type `k`) must agree on with `q`: for `causal_attention`
/// the whole type; for `attention` the dtype, batch and head dim, a key/value
/// head count dividing the query heads and split like them, and the length
/// when a mask relates positions.
fn agree(cx: &mut dyn Rules, c: &Call, q: &TType, k: &TType, mask: Mask, general: bool) -> bool {
    let mismatch = |cx: &mut dyn Rules, detail: &str| {
        cx.report(Problem::Mismatch {
            span: c.pos[1].span,
            expected: q.to_string(),
            found: k.to_string(),
            decl: None,
            detail: detail.into(),
        });
        false
    };
    if !general {
        return k.dims == q.dims && k.dtype == q.dtype
            || mismatch(cx, "q, k and v must have the same type");
    }
    let same = |a: usize| q.dims[a].size == k.dims[a].size && q.dims[a].axes == k.dims[a].axes;
    if k.dtype != q.dtype || !same(0) || q.dims[3].size != k.dims[3].size {
        return mismatch(cx, "q and k must have the same dtype, batch and head dim");
    }
    if (mask.causal || mask.window.is_some()) && q.dims[1].size != k.dims[1].size {
        return mismatch(
            cx,
            "a causal or windowed mask relates query and key positions: keys as long as the queries",
        );
    }
    let (h, kv) = (q.dims[2].size.as_const(), k.dims[2].size.as_const());
    if let (Some(h), Some(kv)) = (h, kv) {
        if kv < 1 || h % kv != 0 {
            return mismatch(
                cx,
                &format!("{kv} key/value heads do not divide {h} query heads"),
            );
        }
    }
    if q.dims[2].axes != k.dims[2].axes {
        return mismatch(cx, "the key/value heads must be split like the query heads");
    }
    true
}

fn check(cx: &mut dyn Rules, c: &Call, mask: Mask, general: bool) -> Option<Typed> {
    let [q, k, _] = operand_types(cx, c)?;
    if !agree(cx, c, &q, &k, mask, general) {
        return None;
    }
    let keys = keys_of(cx, c, &k)?;
    for (t, x) in [(&q, c.pos[0]), (&k, c.pos[1])] {
        let h = &t.dims[2];
        let n = axes_product(cx, &h.axes);
        if let Some(heads) = h.size.as_const() {
            if n > 1 && heads % n != 0 {
                cx.report(Problem::HeadsIndivisible {
                    span: x.span,
                    heads,
                    axes: axes_text(&h.axes),
                    n,
                });
                return None;
            }
        }
    }
    // Attention contracts the head dim: it must be whole on each device. A
    // sequence split over one axis runs as a ring around it (queries and keys
    // of one length and layout); otherwise it is gathered.
    let seq = &q.dims[1].axes;
    let ring = match seq.as_slice() {
        [a] if cx.axis_size(a) > 1 && k.dims[1] == q.dims[1] && keys.is_none() => Some(a.clone()),
        _ => None,
    };
    let mut target = vec![None; 4];
    if ring.is_none() && axes_product(cx, seq) > 1 {
        target[1] = Some(vec![]);
    }
    target[3] = Some(vec![]);
    if k.dims[1] != q.dims[1] {
        // A cross-attention's keys and values: their sequence and head dim
        // whole on each device.
        let mut kt = vec![None; 4];
        kt[1] = Some(vec![]);
        kt[3] = Some(vec![]);
        cx.reshard(&k, &kt, &k.pending, c.pos[1].span);
    }
    let out = cx.reshard(&q, &target, &q.pending, c.span());
    if let Some(a) = &ring {
        // Each K/V block visits every device: n − 1 hops of two blocks.
        let n = cx.axis_size(a) as f64;
        let skipped = q.dims[1]
            .size
            .as_const()
            .map(|t| skipped_blocks(n as usize, t as usize, mask));
        let what = match skipped {
            Some(s) if s > 0 => format!(
                "ring attention over `{a}` (K/V blocks passed by ppermute; the mask skips {s} of {} blocks)",
                (n * n) as usize
            ),
            _ => format!("ring attention over `{a}` (K/V blocks passed by ppermute)"),
        };
        cx.implicit(
            c.span(),
            what,
            out.to_string(),
            "the sequence kept split".into(),
            &out,
            2.0 * (n - 1.0),
        );
    }
    Typed::new(
        out,
        Attention {
            ring,
            mask,
            general,
            keys: keys.is_some(),
        },
    )
}

/// Of the `n` × `n` query block × key block pairs of a ring around a
/// sequence of `t`, how many the mask hides entirely (skipped).
fn skipped_blocks(n: usize, t: usize, mask: Mask) -> usize {
    let b = t / n.max(1);
    (0..n)
        .flat_map(|i| (0..n).map(move |j| (i, j)))
        .filter(|(i, j)| mask.empty(i * b, b, j * b, b))
        .count()
}

/// Each key/value head repeated for the `g` query heads it serves:
/// [B, S, KV, E] → [B, S, KV·g, E] (query head h reads key/value head h / g).
fn expand(x: &Tensor, g: usize) -> R<Tensor> {
    if g == 1 {
        return Ok(x.clone());
    }
    let (b, s, kv, e) = x.dims4().map_err(ce)?;
    x.unsqueeze(3)
        .and_then(|x| x.broadcast_as((b, s, kv, g, e)))
        .and_then(|x| x.reshape((b, s, kv * g, e)))
        .map_err(ce)
}

/// The cotangent of [`expand`]'s input: the query heads' summed per key/value head.
fn fold(d: &Tensor, g: usize) -> R<Tensor> {
    if g == 1 {
        return Ok(d.clone());
    }
    let (b, s, h, e) = d.dims4().map_err(ce)?;
    d.reshape((b, s, h / g, g, e))
        .and_then(|x| x.sum(3))
        .map_err(ce)
}

/// The additive mask of a keys' padding mask `m` [B, S] for scores
/// [B, H, T, S] like `like`: -1e10 where `m` is 0, else 0, as [B, 1, 1, S].
fn key_bias(m: &Tensor, like: &Tensor) -> R<Tensor> {
    let (b, s) = m.dims2().map_err(ce)?;
    let hidden: Vec<f64> = crate::kernels::host::read::<f64>(m)
        .map_err(ce)?
        .iter()
        .map(|x| if *x == 0.0 { -1e10 } else { 0.0 })
        .collect();
    Tensor::from_vec(hidden, (b, 1, 1, s), like.device())
        .and_then(|t| t.to_dtype(like.dtype()))
        .map_err(ce)
}

/// Softmax attention on q [B, T, H, E] and k, v [B, S, H, E] under `mask`
/// and the keys' padding mask `keys` [B, S]; the output and the weights
/// [B, H, T, S].
fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Mask,
    keys: Option<&Tensor>,
) -> R<(Tensor, Tensor)> {
    let e = q.dims()[3] as f64;
    let (t, s_len) = (q.dims()[1], k.dims()[1]);
    let s = einsum(&["bthe", "bshe"], "bhts", &[q, k])?;
    let s = (s / e.sqrt()).map_err(ce)?;
    let s = match mask.block((0, t), (0, s_len), &s)? {
        Some(m) => s.broadcast_add(&m).map_err(ce)?,
        None => s,
    };
    let s = match keys {
        Some(m) => s.broadcast_add(&key_bias(m, &s)?).map_err(ce)?,
        None => s,
    };
    let mx = super::reduce_fast::max_last_keepdim(&s).map_err(ce)?;
    let ex = s.broadcast_sub(&mx).and_then(|x| x.exp()).map_err(ce)?;
    let p = ex
        .broadcast_div(&ex.sum_keepdim(D::Minus1).map_err(ce)?)
        .map_err(ce)?;
    let out = einsum(&["bhts", "bshe"], "bthe", &[&p, v])?;
    Ok((out, p))
}

/// The composed path's derivative: the weights recomputed, then
/// [`attention_vjp`].
fn composed_vjp(v: &[Tensor], mask: Mask, g: &Tensor) -> R<(Tensor, Tensor, Tensor)> {
    let (_, p) = attention(&v[0], &v[1], &v[2], mask, v.get(3))?;
    attention_vjp(&v[0], &v[1], &v[2], &p, g)
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
    /// The type operand `i` (of type `t`; the queries' `q`) is computed in:
    /// the output's for `q`; for `k` and `v` the queries' batch and head
    /// layout, their sequence laid out like the queries' when it is the same
    /// (a ring keeps it split) and whole otherwise, the head dim whole.
    fn wanted(i: usize, t: &TType, q: &TType, out: &TType) -> TType {
        if i == 3 {
            // The keys' mask: the queries' batch layout, the keys whole.
            let mut w = t.clone();
            w.dims[0].axes = out.dims[0].axes.clone();
            w.dims[1].axes.clear();
            w.pending.clear();
            return w;
        }
        if i == 0 || t.dims == q.dims {
            return out.clone();
        }
        let mut w = t.clone();
        w.dims[0].axes = out.dims[0].axes.clone();
        w.dims[1].axes = if t.dims[1] == q.dims[1] {
            out.dims[1].axes.clone()
        } else {
            Vec::new()
        };
        w.dims[3].axes.clear();
        w.pending.clear();
        w
    }

    /// q, k and v in the layouts the kernels take, with the key/value heads
    /// repeated for the query heads they serve; and that repeat.
    fn operands(
        &self,
        k: &Kernel,
        x: &[&Tensor],
        ts: &[&TType],
        out: &TType,
    ) -> R<(Vec<Tensor>, usize)> {
        let n = if self.keys { 4 } else { 3 };
        let mut v: Vec<Tensor> = (0..n)
            .map(|i| k.reshard(x[i], ts[i], &Self::wanted(i, ts[i], ts[0], out)))
            .collect::<R<_>>()?;
        let g = v[0].dims()[2] / v[1].dims()[2].max(1);
        v[1] = expand(&v[1], g)?;
        v[2] = expand(&v[2], g)?;
        Ok((v, g))
    }
}

impl Primitive for Attention {
    fn name(&self) -> &'static str {
        if self.general {
            "attention"
        } else {
            "causal_attention"
        }
    }

    fn attrs(&self) -> Vec<String> {
        let mut a: Vec<String> = self.ring.iter().map(|a| format!("ring: {a}")).collect();
        if self.general && self.mask.causal {
            a.push("causal".into());
        }
        if let Some(w) = self.mask.window {
            a.push(format!("window: {w}"));
        }
        if self.keys {
            a.push("keys masked".into());
        }
        a
    }

    fn accumulates(&self) -> bool {
        true
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        let (v, _) = self.operands(k, x, ts, out)?;
        if let Some(a) = &self.ring {
            let (y, lse) = super::ring::forward(k, a, &v[0], &v[1], &v[2], self.mask)?;
            return Ok(Forward {
                y,
                saved: vec![lse],
            });
        }
        if v.len() == 3 {
            if let Some(y) = super::flash::forward(&v[0], &v[1], &v[2], self.mask)? {
                return Forward::of(y);
            }
        }
        Forward::of(attention(&v[0], &v[1], &v[2], self.mask, v.get(3))?.0)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let (v, groups) = self.operands(k, g.x, g.ts, g.out)?;
        let (dq, dk, dv) = match &self.ring {
            Some(a) => {
                let lse = g
                    .saved
                    .first()
                    .ok_or("ring attention's forward saved nothing")?;
                let ops = (&v[0], &v[1], &v[2]);
                super::ring::vjp(k, a, ops, g.y, lse, g.g, self.mask)?
            }
            None => {
                let fused = match v.len() {
                    3 => super::flash::vjp(&v[0], &v[1], &v[2], g.y, g.g, self.mask)?,
                    _ => None,
                };
                match fused {
                    Some(d) => d,
                    None => composed_vjp(&v, self.mask, g.g)?,
                }
            }
        };
        let (dk, dv) = (fold(&dk, groups)?, fold(&dv, groups)?);
        let mut out = Vec::new();
        for (i, d) in [dq, dk, dv].into_iter().enumerate() {
            let w = Self::wanted(i, g.ts[i], g.ts[0], g.out);
            out.push(Some(if g.ts[i].dims != w.dims {
                k.reshard_t(&d, g.ts[i], &w)?
            } else {
                d
            }));
        }
        if self.keys {
            // The mask has no gradient.
            out.push(None);
        }
        Ok(out)
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        // Scores and weighted values: 2 × 2·B·H·T·S·E over the local heads
        // (the whole score matrix, masked; a ring skips the blocks its mask
        // hides entirely).
        let local = c.local_numel(out).unwrap_or(0.0);
        let size = |t: &TType| t.dims.get(1).and_then(|d| c.size(&d.size)).unwrap_or(0) as usize;
        let s = ts.get(1).map_or(size(out), |k| size(k));
        let mut comms = Vec::new();
        for (i, x) in ts.iter().enumerate() {
            let q = ts.first().copied().unwrap_or(out);
            comms.extend(super::reshard::comms(c, x, &Self::wanted(i, x, q, out)));
        }
        let mut done = 1.0;
        // Ring attention: n − 1 hops of the K and V blocks (backward moves
        // their cotangents too, about twice as much; counted like forward).
        if let Some(a) = &self.ring {
            let n = c.axis_size(a).max(1) as usize;
            let skipped = skipped_blocks(n, size(out), self.mask);
            done = 1.0 - skipped as f64 / (n * n) as f64;
            if let Some(bytes) = c.bytes(out, 2.0 * (n as f64 - 1.0)) {
                comms.push(super::cost::CommCost {
                    kind: "ppermute (ring attention)".into(),
                    axes: vec![a.clone()],
                    bytes,
                    explicit: false,
                });
            }
        }
        Some(Cost {
            flops: 4.0 * local * s as f64 * done,
            comms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mask built from positions equals the pairwise definition, for
    /// every block of a ring's split and each kind of mask.
    #[test]
    fn block_masks_match_the_pairs() {
        let like = Tensor::zeros(1, DType::F32, &candle_core::Device::Cpu).unwrap();
        let masks = [
            Mask::CAUSAL,
            Mask {
                causal: false,
                window: Some(3),
            },
            Mask {
                causal: true,
                window: Some(2),
            },
            Mask {
                causal: false,
                window: None,
            },
        ];
        for mask in masks {
            for (q0, k0) in [(0, 0), (0, 4), (4, 0), (4, 4), (8, 0)] {
                let (tq, tk) = (4, 4);
                let got = mask.block((q0, tq), (k0, tk), &like).unwrap();
                let want: Vec<f32> = (0..tq * tk)
                    .map(|x| {
                        if mask.allows(q0 + x / tk, k0 + x % tk) {
                            0.0
                        } else {
                            -1e10
                        }
                    })
                    .collect();
                match got {
                    None => assert!(want.iter().all(|v| *v == 0.0), "{mask:?} {q0} {k0}"),
                    Some(m) => {
                        let m: Vec<f32> = m.flatten_all().unwrap().to_vec1().unwrap();
                        assert_eq!(m, want, "{mask:?} q0 {q0} k0 {k0}");
                        assert!(
                            want.iter().any(|v| *v != 0.0),
                            "{mask:?} {q0} {k0}: a mask of nothing"
                        );
                    }
                }
            }
        }
    }
}
