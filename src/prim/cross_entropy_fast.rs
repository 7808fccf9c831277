//! The row passes of softmax cross-entropy, shared by the
//! `softmax_cross_entropy` primitive and the training loss ([`Rows`]): fused
//! kernels for contiguous f32 logits, composed tensor ops for other types.
//! The composed version made ten passes over the [rows, classes] logits and
//! built the labels' one-hot as an f64 array of the same size (4 MiB per step
//! for seed 000's batch); these make two: one for exp(x − max) with its row
//! sums and each row's target logit, one for the gradient. `exp` is
//! [`super::unary_fast::exp`]. Both passes run over parts of the rows on the
//! worker pool ([`crate::pool::rows_into`]). Rows are independent, so a split of the rows
//! gives the same bits; a split of the classes reduces the row sums across
//! devices between the two passes, as before.

use super::unary_fast::exp;
use candle_core::{CpuStorage, Device, Result, Storage, Tensor, D};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU32, Ordering};

/// `f` of the contiguous f32 values of `t` (read in place), or `None`.
fn with_f32<T>(t: &Tensor, f: impl FnOnce(&[f32]) -> T) -> Option<T> {
    if !crate::kernels::own() {
        return None;
    }
    let (s, l) = t.storage_and_layout();
    let (a, b) = l.contiguous_offsets()?;
    match &*s {
        Storage::Cpu(CpuStorage::F32(v)) => v.get(a..b).map(f),
        _ => None,
    }
}

/// Lanes of a row sum: element `i` adds into lane `i mod LANES` (in order),
/// the lanes then fold in halves, and the tail past the last whole chunk adds
/// last. A fixed order, so the bits depend on the row alone (not on the
/// machine, nor on how the rows are split over devices); wide enough that
/// the adds run as independent vector chains rather than one serial one.
const LANES: usize = 32;

/// Writes `exp(x − m)` of the row `x` to `out` (as long as `x`); returns
/// their sum in the order [`LANES`] gives.
fn exp_row(x: &[f32], m: f32, out: &mut [MaybeUninit<f32>]) -> f32 {
    let mut acc = [0f32; LANES];
    let whole = x.len() - x.len() % LANES;
    let (body, tail_out) = out.split_at_mut(whole.min(out.len()));
    let chunks = x.chunks_exact(LANES);
    let tail = chunks.remainder();
    for (c, o) in chunks.zip(body.chunks_exact_mut(LANES)) {
        let mut e = [0f32; LANES];
        for j in 0..LANES {
            e[j] = exp(c[j] - m);
            acc[j] += e[j];
        }
        for j in 0..LANES {
            o[j].write(e[j]);
        }
    }
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            acc[j] += acc[j + w];
        }
    }
    let mut s = acc[0];
    for (i, o) in tail.iter().zip(tail_out) {
        let e = exp(*i - m);
        o.write(e);
        s += e;
    }
    s
}

/// The first pass over logits `[.., V]` whose row maxima are `m` `[.., 1]`:
/// `e = exp(x − m)`, its row sums `[.., 1]`, and each row's logit at its label
/// (its class minus `off`, this device's first class; 0 when the label is in
/// another device's window). `None` when the logits are not f32 on the CPU.
pub fn first_pass(
    logits: &Tensor,
    m: &Tensor,
    labels: &[i64],
    off: i64,
) -> Option<Result<(Tensor, Tensor, Tensor)>> {
    #[cfg(feature = "cuda")]
    if let Some(r) = on_gpu::first_pass(logits, m, labels, off) {
        return Some(r);
    }
    let v = *logits.dims().last()?;
    let (e, se, tgt) = with_f32(logits, |x| {
        with_f32(m, |mx| {
            if v == 0 || x.len() != labels.len() * v || mx.len() != labels.len() {
                return None;
            }
            let rows = labels.len();
            // Each row's sum and target, beside its exp(x − m).
            let sums: Vec<[AtomicU32; 2]> = (0..rows).map(|_| Default::default()).collect();
            let e = crate::pool::rows_into(rows, v, v, &|first, n, out| {
                for (i, o) in out.chunks_exact_mut(v).take(n).enumerate() {
                    let r = first + i;
                    let xr = &x[r * v..(r + 1) * v];
                    let s = exp_row(xr, mx[r], o);
                    let c = labels[r] - off;
                    let t = if c >= 0 && (c as usize) < v {
                        xr[c as usize]
                    } else {
                        0.0
                    };
                    sums[r][0].store(s.to_bits(), Ordering::Relaxed);
                    sums[r][1].store(t.to_bits(), Ordering::Relaxed);
                }
            })?;
            // (The pool's job has ended: every store is seen.)
            let (se, tgt) = sums
                .iter()
                .map(|[s, t]| {
                    let bits = |a: &AtomicU32| f32::from_bits(a.load(Ordering::Relaxed));
                    (bits(s), bits(t))
                })
                .unzip();
            Some((e, se, tgt))
        })
    })???;
    let rows = m.dims().to_vec();
    let dev = logits.device();
    let made = (|| {
        Ok((
            Tensor::from_vec(e, logits.dims(), dev)?,
            Tensor::from_vec(se, rows.as_slice(), dev)?,
            Tensor::from_vec(tgt, rows.as_slice(), dev)?,
        ))
    })();
    Some(made)
}

/// The gradient pass: `((e / se − onehot) · scale) · mul` per element, `se` the
/// (global) row sums of the first pass, onehot that of the labels in this
/// device's window. `None` when an operand is not f32 on the CPU.
pub fn grad(
    e: &Tensor,
    se: &Tensor,
    labels: &[i64],
    off: i64,
    scale: f32,
    mul: f32,
) -> Option<Result<Tensor>> {
    #[cfg(feature = "cuda")]
    if let Some(r) = on_gpu::grad(e, se, labels, off, scale, mul) {
        return Some(r);
    }
    let v = *e.dims().last()?;
    let d = with_f32(e, |ev| {
        with_f32(se, |sv| {
            if v == 0 || ev.len() != labels.len() * v || sv.len() != labels.len() {
                return None;
            }
            crate::pool::rows_into(labels.len(), v, v, &|first, n, out| {
                for (i, o) in out.chunks_exact_mut(v).take(n).enumerate() {
                    let r = first + i;
                    let er = &ev[r * v..(r + 1) * v];
                    let s = sv[r];
                    for (o, x) in o.iter_mut().zip(er) {
                        o.write(((*x / s) * scale) * mul);
                    }
                    let c = labels[r] - off;
                    if c >= 0 && (c as usize) < v {
                        let c = c as usize;
                        o[c].write(((er[c] / s - 1.0) * scale) * mul);
                    }
                }
            })
        })
    })???;
    Some(Tensor::from_vec(d, e.dims(), &Device::Cpu))
}

/// This device's first pass over its logits `[.., V]` (row maxima `m`, the
/// global ones), what the loss and its gradient are built from.
pub struct Rows {
    /// exp(x − m).
    pub e: Tensor,
    /// Row sums of `e` over this device's classes `[.., 1]`.
    pub se: Tensor,
    /// Each row's logit at its label, 0 outside this device's classes `[.., 1]`.
    pub tgt: Tensor,
    /// The labels' one-hot in this device's class window (the composed path).
    onehot: Option<Tensor>,
    labels: Vec<i64>,
    off: i64,
}

impl Rows {
    /// The first pass; `off` is this device's first class. Fused for f32
    /// ([`first_pass`]), else composed with the labels' one-hot.
    pub fn new(logits: &Tensor, m: &Tensor, labels: Vec<i64>, off: i64) -> Result<Rows> {
        if let Some(r) = first_pass(logits, m, &labels, off) {
            let (e, se, tgt) = r?;
            return Ok(Rows {
                e,
                se,
                tgt,
                onehot: None,
                labels,
                off,
            });
        }
        let e = logits.broadcast_sub(m)?.exp()?;
        let se = e.sum_keepdim(D::Minus1)?;
        let oh = onehot(logits, &labels, off)?;
        let tgt = logits.mul(&oh)?.sum_keepdim(D::Minus1)?;
        Ok(Rows {
            e,
            se,
            tgt,
            onehot: Some(oh),
            labels,
            off,
        })
    }

    /// The rows of a first pass made before (`e`, from [`Rows::new`] on the
    /// same logits and labels), for the derivative: the same kernels as the
    /// pass took (the fused ones for f32), without its sums.
    pub fn resume(e: Tensor, logits: &Tensor, labels: Vec<i64>, off: i64) -> Result<Rows> {
        let v = logits.dims().last().copied().unwrap_or(0);
        let fused = v > 0
            && logits.elem_count() == labels.len() * v
            && (with_f32(logits, |_| ()).is_some() || on_gpu_applies(logits));
        let onehot = if fused {
            None
        } else {
            Some(onehot(logits, &labels, off)?)
        };
        let none = Tensor::zeros(0, e.dtype(), e.device())?;
        Ok(Rows {
            e,
            se: none.clone(),
            tgt: none,
            onehot,
            labels,
            off,
        })
    }

    /// The logits' gradient `((e / se − onehot) · scale) · mul`, `se` the
    /// global row sums, `mul` a scalar tensor (or 1). The composed path
    /// scales as `t / (1 / scale)` does on a tensor (times the reciprocal).
    pub fn grad(&self, se: &Tensor, scale: f64, mul: Option<&Tensor>) -> Result<Tensor> {
        match &self.onehot {
            None => {
                let m = match mul {
                    Some(t) => {
                        let v = crate::kernels::host::read::<f32>(t)?;
                        *v.first()
                            .ok_or_else(|| candle_core::Error::Msg("an empty cotangent".into()))?
                    }
                    None => 1.0,
                };
                grad(&self.e, se, &self.labels, self.off, scale as f32, m).ok_or_else(|| {
                    candle_core::Error::Msg("the gradient kernel lost its operands".into())
                })?
            }
            Some(oh) => {
                let d = self.e.broadcast_div(se)?.sub(oh)?.affine(scale, 0.0)?;
                match mul {
                    Some(t) => d.broadcast_mul(&t.to_dtype(d.dtype())?),
                    None => Ok(d),
                }
            }
        }
    }
}

/// The labels' one-hot in the class window starting at `off`, in the
/// logits' dtype, made where the logits are: only the labels travel (a
/// GPU's logits never go through the host).
fn onehot(logits: &Tensor, labels: &[i64], off: i64) -> Result<Tensor> {
    let v = logits.dims().last().copied().unwrap_or(0);
    let dev = logits.device();
    // A label outside this device's window matches no class here.
    let local: Vec<i64> = labels.iter().map(|l| l - off).collect();
    let ids = Tensor::from_vec(local, (labels.len(), 1), dev)?;
    let classes = Tensor::arange(0i64, v as i64, dev)?.reshape((1, v))?;
    ids.broadcast_eq(&classes)?
        .to_dtype(logits.dtype())?
        .reshape(logits.dims())
}

/// Whether the GPU's fused passes take these logits.
fn on_gpu_applies(logits: &Tensor) -> bool {
    #[cfg(feature = "cuda")]
    {
        on_gpu::applies(logits)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = logits;
        false
    }
}

/// The two passes on a GPU (`rows.cu`), for contiguous f32 logits: the same
/// arithmetic as the CPU's, one block per row for the sums (so their order
/// differs from the CPU's lanes: equal to rounding, not to the bit).
#[cfg(feature = "cuda")]
mod on_gpu {
    use super::super::gpu::{cuda, module, slice, wrap, Module};
    use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{DType, Result, Tensor};

    pub(super) fn applies(logits: &Tensor) -> bool {
        crate::kernels::own() && logits.dtype() == DType::F32 && cuda(logits).is_some()
    }

    fn kernels() -> Result<Module> {
        module("rows", include_str!("rows.cu"), "")
    }

    pub(super) fn first_pass(
        logits: &Tensor,
        m: &Tensor,
        labels: &[i64],
        off: i64,
    ) -> Option<Result<(Tensor, Tensor, Tensor)>> {
        let v = *logits.dims().last()?;
        let rows = labels.len();
        if !applies(logits) || m.dtype() != DType::F32 || v == 0 || logits.elem_count() != rows * v
        {
            return None;
        }
        let dev = cuda(logits)?;
        Some((|| {
            let x = logits.contiguous()?;
            let mx = m.contiguous()?;
            let lab = Tensor::from_slice(labels, rows, logits.device())?;
            // SAFETY (all three): the kernel writes every element.
            let e = unsafe { dev.alloc::<f32>(rows * v)? };
            let se = unsafe { dev.alloc::<f32>(rows)? };
            let tgt = unsafe { dev.alloc::<f32>(rows)? };
            {
                let (sx, sm, sl) = (slice(&x), slice(&mx), slice(&lab));
                let (vx, vm, vl) = (sx.view::<f32>()?, sm.view::<f32>()?, sl.view::<i64>()?);
                let k = kernels()?;
                let f = dev.get_or_load_custom_func("ce_first", &k.name, &k.ptx)?;
                let (vi, o) = (v as i32, off);
                let mut l = f.builder();
                l.arg(&vx).arg(&vm).arg(&vl).arg(&e).arg(&se).arg(&tgt);
                l.arg(&vi).arg(&o);
                let cfg = LaunchConfig {
                    grid_dim: (rows as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: reads x, m, labels; writes e, se, tgt within rows × v.
                unsafe { l.launch(cfg) }.w()?;
            }
            let shape = m.dims().to_vec();
            Ok((
                wrap(e, &dev, logits.dims()),
                wrap(se, &dev, shape.as_slice()),
                wrap(tgt, &dev, shape.as_slice()),
            ))
        })())
    }

    pub(super) fn grad(
        e: &Tensor,
        se: &Tensor,
        labels: &[i64],
        off: i64,
        scale: f32,
        mul: f32,
    ) -> Option<Result<Tensor>> {
        let v = *e.dims().last()?;
        let rows = labels.len();
        if !applies(e) || se.dtype() != DType::F32 || v == 0 || e.elem_count() != rows * v {
            return None;
        }
        let dev = cuda(e)?;
        Some((|| {
            let (ec, sc) = (e.contiguous()?, se.contiguous()?);
            let lab = Tensor::from_slice(labels, rows, e.device())?;
            let n = rows * v;
            // SAFETY: the kernel writes every element.
            let d = unsafe { dev.alloc::<f32>(n)? };
            {
                let (s1, s2, s3) = (slice(&ec), slice(&sc), slice(&lab));
                let (ve, vs, vl) = (s1.view::<f32>()?, s2.view::<f32>()?, s3.view::<i64>()?);
                let k = kernels()?;
                let f = dev.get_or_load_custom_func("ce_grad", &k.name, &k.ptx)?;
                let (nn, vi, o) = (n as i64, v as i32, off);
                let mut l = f.builder();
                l.arg(&ve).arg(&vs).arg(&vl).arg(&d);
                l.arg(&nn).arg(&vi).arg(&o).arg(&scale).arg(&mul);
                let cfg = super::super::gpu::elementwise(n);
                // SAFETY: reads e, se, labels; writes d within n.
                unsafe { l.launch(cfg) }.w()?;
            }
            Ok(wrap(d, &dev, e.dims()))
        })())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_sums_add_in_lanes_then_the_tail() {
        // Two whole chunks of LANES and a tail of 11.
        let x: Vec<f32> = (0..2 * LANES + 11)
            .map(|i| ((i * 13) % 17) as f32 * 0.25 - 2.0)
            .collect();
        let mut out = vec![MaybeUninit::new(7.0f32); x.len()];
        let s = exp_row(&x, 1.5, &mut out);
        let e: Vec<f32> = x.iter().map(|v| exp(v - 1.5)).collect();
        // SAFETY: every element was initialised (to 7, then written).
        let out: Vec<f32> = out.iter().map(|o| unsafe { o.assume_init() }).collect();
        assert_eq!(out, e);
        let mut lanes = [0f32; LANES];
        for (i, v) in e[..2 * LANES].iter().enumerate() {
            lanes[i % LANES] += v;
        }
        let mut w = LANES;
        while w > 1 {
            w /= 2;
            for j in 0..w {
                lanes[j] += lanes[j + w];
            }
        }
        let want = e[2 * LANES..].iter().fold(lanes[0], |a, v| a + v);
        assert_eq!(s.to_bits(), want.to_bits());
        let exact: f64 = e.iter().map(|v| f64::from(*v)).sum();
        assert!(
            (f64::from(s) - exact).abs() < 1e-6 * exact,
            "{s} vs {exact}"
        );
    }

    /// Shared over the worker pool in parts of rows, the passes have the
    /// bits of each row computed alone.
    #[test]
    fn pooled_passes_have_each_rows_bits() -> Result<()> {
        crate::pool::set_threads(2);
        let (rows, v) = (300, 1000);
        let xs: Vec<f32> = (0..rows * v)
            .map(|i| ((i * 7919) % 1013) as f32 * 0.01 - 5.0)
            .collect();
        let logits = Tensor::from_vec(xs.clone(), (rows, v), &Device::Cpu)?;
        let m = logits.max_keepdim(1)?;
        let mv = m.flatten_all()?.to_vec1::<f32>()?;
        let labels: Vec<i64> = (0..rows as i64).map(|r| (r * 37) % 1200).collect();
        let lost = || candle_core::Error::Msg("no kernel".into());
        let (e, se, tgt) = first_pass(&logits, &m, &labels, 0).ok_or_else(lost)??;
        let d = grad(&e, &se, &labels, 0, 0.25, 0.5).ok_or_else(lost)??;
        let (e, se) = (
            e.flatten_all()?.to_vec1::<f32>()?,
            se.flatten_all()?.to_vec1::<f32>()?,
        );
        let (tgt, d) = (
            tgt.flatten_all()?.to_vec1::<f32>()?,
            d.flatten_all()?.to_vec1::<f32>()?,
        );
        for r in 0..rows {
            let xr = &xs[r * v..(r + 1) * v];
            let mut out = vec![MaybeUninit::new(0f32); v];
            let s = exp_row(xr, mv[r], &mut out);
            assert_eq!(se[r].to_bits(), s.to_bits(), "row {r}");
            let c = labels[r] as usize;
            assert_eq!(tgt[r], if c < v { xr[c] } else { 0.0 });
            for k in 0..v {
                // SAFETY: initialised to 0, then written.
                let want = unsafe { out[k].assume_init() };
                assert_eq!(e[r * v + k].to_bits(), want.to_bits());
                let g = if k == c {
                    ((want / s - 1.0) * 0.25) * 0.5
                } else {
                    ((want / s) * 0.25) * 0.5
                };
                assert_eq!(d[r * v + k].to_bits(), g.to_bits(), "row {r} class {k}");
            }
        }
        Ok(())
    }

    #[test]
    fn passes_match_the_composed_formula() -> Result<()> {
        let dev = Device::Cpu;
        let xs: Vec<f32> = (0..24).map(|i| ((i * 7) % 11) as f32 * 0.3 - 1.0).collect();
        let logits = Tensor::from_vec(xs.clone(), (4, 6), &dev)?;
        let m = logits.max_keepdim(1)?;
        // Labels of a device holding classes 6..12 of a split vocabulary:
        // rows 1 and 3 have their label here.
        let labels = [0i64, 8, 13, 6];
        let (e, se, tgt) = first_pass(&logits, &m, &labels, 6)
            .ok_or(candle_core::Error::Msg("no kernel".into()))??;
        let want_e = logits.broadcast_sub(&m)?.exp()?;
        let diff = (e.clone() - &want_e)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
        assert!(diff < 1e-6, "exp differs by {diff}");
        let se_v = se.flatten_all()?.to_vec1::<f32>()?;
        let want_se = want_e.sum(1)?.to_vec1::<f32>()?;
        for (a, b) in se_v.iter().zip(&want_se) {
            assert!((a - b).abs() < 1e-5);
        }
        let t = tgt.flatten_all()?.to_vec1::<f32>()?;
        assert_eq!(t, vec![0.0, xs[6 + 2], 0.0, xs[18]]);
        let d = grad(&e, &se, &labels, 6, 0.25, 0.5)
            .ok_or(candle_core::Error::Msg("no kernel".into()))??;
        let d = d.to_vec2::<f32>()?;
        let ev = e.to_vec2::<f32>()?;
        for r in 0..4 {
            for c in 0..6 {
                let oh = if labels[r] - 6 == c as i64 { 1.0 } else { 0.0 };
                let want = ((ev[r][c] / se_v[r] - oh) * 0.25) * 0.5;
                assert_eq!(d[r][c].to_bits(), want.to_bits());
            }
        }
        // f64 logits keep the composed kernels.
        assert!(first_pass(&logits.to_dtype(candle_core::DType::F64)?, &m, &labels, 6).is_none());
        Ok(())
    }
}
