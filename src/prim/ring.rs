//! Ring attention: `causal_attention` or `attention` with the sequence
//! split over a mesh axis (context parallelism). Each device keeps its block
//! of queries; the key/value blocks travel around the axis by `ppermute`, one
//! hop per step, and an online softmax (running max and sum, rescaled as
//! blocks arrive) accumulates the output, so no device ever holds the whole
//! sequence or a score matrix larger than one block by one block. Blocks the
//! mask hides entirely (after a device's own under causality, or beyond a
//! sliding window) are skipped; the hops still happen, so every device runs
//! the same collectives. Backward goes around the ring again with the
//! log-sum-exp forward saved, the keys' and values' cotangents travelling
//! with their blocks, and one last hop brings each block's cotangent home:
//! the gradients are those of attention on the whole sequence, computed
//! blockwise.

use super::attention::Mask;
use super::einsum::einsum;
use super::kernel::{ce, Kernel};
use super::R;
use candle_core::{Tensor, D};

/// Scores of local queries `q` (block `qb`) against key block `kb` `k`
/// ([B, H, Tq, Tk]), masked where `mask` hides a pair.
fn scores(q: &Tensor, k: &Tensor, mask: Mask, qb: usize, kb: usize) -> R<Tensor> {
    let e = q.dims()[3] as f64;
    let s = einsum(&["bthe", "bshe"], "bhts", &[q, k])?;
    let s = (s / e.sqrt()).map_err(ce)?;
    let (tq, tk) = (q.dims()[1], k.dims()[1]);
    match mask.block((qb * tq, tq), (kb * tk, tk), &s)? {
        Some(m) => s.broadcast_add(&m).map_err(ce),
        None => Ok(s),
    }
}

/// Whether the mask hides every pair of query block `qb` and key block `kb`
/// (of `t` positions each).
fn hidden(mask: Mask, qb: usize, kb: usize, t: usize) -> bool {
    mask.empty(qb * t, t, kb * t, t)
}

/// Pass a block one device further along `axis` (device i gets i−1's).
fn hop(k: &Kernel, t: &Tensor, axis: &str) -> R<Tensor> {
    k.comm.ppermute(k.rank, t, axis, 1).map_err(ce)
}

/// Forward on this device's blocks of q, k, v ([B, T/n, H, E], the sequence
/// split over `axis`): the output block and the log-sum-exp of each query's
/// scores ([B, H, T/n, 1]), which backward needs.
pub fn forward(
    k: &Kernel,
    axis: &str,
    q: &Tensor,
    kk: &Tensor,
    v: &Tensor,
    mask: Mask,
) -> R<(Tensor, Tensor)> {
    let n = k.size(axis);
    let i = k.topo().coord(k.rank, axis);
    let (e, t) = (q.dims()[3], q.dims()[1]);
    // Keys and values travel together.
    let mut kv = Tensor::cat(&[kk, v], 3).map_err(ce)?;
    // The device's own block first: every query sees at least itself, so the
    // running max is finite from the start.
    let s = scores(q, kk, mask, i, i)?;
    let mut m = super::reduce_fast::max_last_keepdim(&s).map_err(ce)?;
    let p = s.broadcast_sub(&m).and_then(|x| x.exp()).map_err(ce)?;
    let mut l = p.sum_keepdim(D::Minus1).map_err(ce)?;
    let mut o = einsum(&["bhts", "bshe"], "bhte", &[&p, v])?;
    for r in 1..n {
        kv = hop(k, &kv, axis)?;
        // Block i − r (mod n): skipped when the mask hides all of it.
        let j = (i + n - r) % n;
        if hidden(mask, i, j, t) {
            continue;
        }
        let (kb, vb) = (
            kv.narrow(3, 0, e).map_err(ce)?,
            kv.narrow(3, e, e).map_err(ce)?,
        );
        let s = scores(q, &kb, mask, i, j)?;
        let m_new = m
            .maximum(&super::reduce_fast::max_last_keepdim(&s).map_err(ce)?)
            .map_err(ce)?;
        let alpha = (&m - &m_new).and_then(|x| x.exp()).map_err(ce)?;
        let p = s.broadcast_sub(&m_new).and_then(|x| x.exp()).map_err(ce)?;
        l = l
            .mul(&alpha)
            .and_then(|x| x + p.sum_keepdim(D::Minus1)?)
            .map_err(ce)?;
        let pv = einsum(&["bhts", "bshe"], "bhte", &[&p, &vb])?;
        o = o.broadcast_mul(&alpha).and_then(|x| x + pv).map_err(ce)?;
        m = m_new;
    }
    let out = o
        .broadcast_div(&l)
        .and_then(|x| x.transpose(1, 2))
        .and_then(|x| x.contiguous())
        .map_err(ce)?;
    let lse = l.log().and_then(|x| x + m).map_err(ce)?;
    Ok((out, lse))
}

/// Cotangents of this device's q, k and v blocks from the output block's
/// cotangent `g`, the output `out` and the saved log-sum-exp `lse`.
pub fn vjp(
    k: &Kernel,
    axis: &str,
    (q, kk, v): (&Tensor, &Tensor, &Tensor),
    out: &Tensor,
    lse: &Tensor,
    g: &Tensor,
    mask: Mask,
) -> R<(Tensor, Tensor, Tensor)> {
    let n = k.size(axis);
    let i = k.topo().coord(k.rank, axis);
    let (e, t) = (q.dims()[3], q.dims()[1]);
    let scale = 1.0 / (e as f64).sqrt();
    // Δ = rowsum(dO ∘ O), per query: [B, H, Tq, 1].
    let delta = g
        .mul(out)
        .and_then(|x| x.sum_keepdim(3))
        .and_then(|x| x.transpose(1, 2))
        .map_err(ce)?;
    let mut dq = q.zeros_like().map_err(ce)?;
    // A block travels with its keys, values and their cotangents so far.
    let zeros = kk.zeros_like().map_err(ce)?;
    let mut blk = Tensor::cat(&[kk, v, &zeros, &zeros], 3).map_err(ce)?;
    for r in 0..n {
        if r > 0 {
            blk = hop(k, &blk, axis)?;
        }
        let j = (i + n - r) % n;
        if hidden(mask, i, j, t) {
            continue;
        }
        let part = |j: usize| blk.narrow(3, j * e, e).map_err(ce);
        let (kb, vb, dkb, dvb) = (part(0)?, part(1)?, part(2)?, part(3)?);
        let s = scores(q, &kb, mask, i, j)?;
        let p = s.broadcast_sub(lse).and_then(|x| x.exp()).map_err(ce)?;
        let dv = einsum(&["bhts", "bthe"], "bshe", &[&p, g])?;
        let dp = einsum(&["bthe", "bshe"], "bhts", &[g, &vb])?;
        let ds = dp
            .broadcast_sub(&delta)
            .and_then(|x| x.mul(&p))
            .and_then(|x| x * scale)
            .map_err(ce)?;
        dq = (dq + einsum(&["bhts", "bshe"], "bthe", &[&ds, &kb])?).map_err(ce)?;
        let dk = einsum(&["bhts", "bthe"], "bshe", &[&ds, q])?;
        let (dkb, dvb) = ((dkb + dk).map_err(ce)?, (dvb + dv).map_err(ce)?);
        blk = Tensor::cat(&[&kb, &vb, &dkb, &dvb], 3).map_err(ce)?;
    }
    // After n − 1 hops this device holds block i + 1's cotangents, complete:
    // one more hop takes each home.
    let grads = blk.narrow(3, 2 * e, 2 * e).map_err(ce)?;
    let grads = hop(k, &grads, axis)?;
    let dk = grads.narrow(3, 0, e).map_err(ce)?;
    let dv = grads.narrow(3, e, e).map_err(ce)?;
    Ok((dq, dk, dv))
}
