//! `layer_norm` and `rms_norm` on a GPU: `norm.cu`'s row kernels, one pass
//! forward and one backward (the statistics recomputed, as the composed path
//! recomputes them), and the weight gradients as column sums in two stages.
//!
//! Why: composed from candle's kernels, a norm made about ten passes over its
//! input each way and summed the weight gradients one leading dim at a time;
//! on an H200 that was 67 ms of a GPT-2-small step's 413 (`--profile`).
//! Taken for f32 operands on a CUDA device with shardc's own kernels on
//! (`SHARDC_KERNELS=candle` turns them off); otherwise `None` and the caller
//! composes.

use super::gpu::{cuda, module, slice, wrap, Module};
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::{CudaDevice, WrapErr};
use candle_core::{DType, Result, Tensor};

/// Rows summed per block in the first stage of the column sums.
const PER: usize = 256;

fn kernels() -> Result<Module> {
    module("norm", include_str!("norm.cu"), "")
}

/// The device, when these kernels take `x` and the weights.
fn applies(x: &Tensor, w: &[&Tensor]) -> Option<CudaDevice> {
    let f32s = std::iter::once(x)
        .chain(w.iter().copied())
        .all(|t| t.dtype() == DType::F32);
    let d = *x.dims().last()?;
    let sized = d > 0 && w.iter().all(|t| t.dims() == [d]);
    (crate::kernels::own() && f32s && sized).then(|| cuda(x))?
}

/// One block per row.
fn per_row(n: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The norm of `x` over its last dim; `b` the bias (layer_norm) or `None`
/// (rms_norm).
pub fn forward(x: &Tensor, w: &Tensor, b: Option<&Tensor>, eps: f64) -> Option<Result<Tensor>> {
    let ws: Vec<&Tensor> = std::iter::once(w).chain(b).collect();
    let dev = applies(x, &ws)?;
    Some((|| {
        let d = w.dims()[0];
        let n = x.elem_count() / d;
        let (xc, wc) = (x.contiguous()?, w.contiguous()?);
        let bc = match b {
            Some(b) => b.contiguous()?,
            None => wc.clone(),
        };
        // SAFETY: the kernel writes every element.
        let y = unsafe { dev.alloc::<f32>(n * d)? };
        {
            let (s1, s2, s3) = (slice(&xc), slice(&wc), slice(&bc));
            let (vx, vw, vb) = (s1.view::<f32>()?, s2.view::<f32>()?, s3.view::<f32>()?);
            let k = kernels()?;
            let f = dev.get_or_load_custom_func("norm_fwd", &k.name, &k.ptx)?;
            let (di, e, layer) = (d as i32, eps as f32, i32::from(b.is_some()));
            let mut l = f.builder();
            l.arg(&vx)
                .arg(&vw)
                .arg(&vb)
                .arg(&y)
                .arg(&di)
                .arg(&e)
                .arg(&layer);
            let cfg = per_row(n);
            // SAFETY: reads x, w, b; writes y within n × d.
            unsafe { l.launch(cfg) }.w()?;
        }
        Ok(wrap(y, &dev, x.dims()))
    })())
}

/// (dx, dw, db) at cotangent `g`; db only for layer_norm.
pub fn vjp(
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    g: &Tensor,
    eps: f64,
) -> Option<Result<(Tensor, Tensor, Option<Tensor>)>> {
    let ws: Vec<&Tensor> = std::iter::once(w).chain(b).collect();
    let dev = applies(x, &ws)?;
    if g.dims() != x.dims() {
        return None;
    }
    Some((|| {
        let d = w.dims()[0];
        let n = x.elem_count() / d;
        let (xc, wc) = (x.contiguous()?, w.contiguous()?);
        let gc = g.to_dtype(DType::F32)?.contiguous()?;
        // SAFETY (both): the kernel writes every element.
        let dx = unsafe { dev.alloc::<f32>(n * d)? };
        let gx = unsafe { dev.alloc::<f32>(n * d)? };
        let k = kernels()?;
        {
            let (s1, s2, s3) = (slice(&xc), slice(&wc), slice(&gc));
            let (vx, vw, vg) = (s1.view::<f32>()?, s2.view::<f32>()?, s3.view::<f32>()?);
            let f = dev.get_or_load_custom_func("norm_bwd", &k.name, &k.ptx)?;
            let (di, e, layer) = (d as i32, eps as f32, i32::from(b.is_some()));
            let mut l = f.builder();
            l.arg(&vx).arg(&vw).arg(&vg).arg(&dx).arg(&gx);
            l.arg(&di).arg(&e).arg(&layer);
            let cfg = per_row(n);
            // SAFETY: reads x, w, g; writes dx and gx within n × d.
            unsafe { l.launch(cfg) }.w()?;
        }
        let gx = wrap(gx, &dev, (n, d));
        let dw = col_sums(&dev, &k, &gx, n, d)?;
        let db = match b {
            Some(_) => Some(col_sums(&dev, &k, &gc.reshape((n, d))?, n, d)?),
            None => None,
        };
        Ok((wrap(dx, &dev, x.dims()), dw, db))
    })())
}

/// Column sums of `src` [n, d]: blocks of [`PER`] rows, then candle's sum of
/// the partial sums.
fn col_sums(dev: &CudaDevice, k: &Module, src: &Tensor, n: usize, d: usize) -> Result<Tensor> {
    let chunks = n.div_ceil(PER).max(1);
    // SAFETY: the kernel writes every element.
    let part = unsafe { dev.alloc::<f32>(chunks * d)? };
    {
        let s = slice(src);
        let v = s.view::<f32>()?;
        let f = dev.get_or_load_custom_func("col_sums", &k.name, &k.ptx)?;
        let (ni, di, per) = (n as i32, d as i32, PER as i32);
        let mut l = f.builder();
        l.arg(&v).arg(&part).arg(&ni).arg(&di).arg(&per);
        let cfg = LaunchConfig {
            grid_dim: (d.div_ceil(128) as u32, chunks as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: reads src [n, d]; writes part [chunks, d].
        unsafe { l.launch(cfg) }.w()?;
    }
    wrap(part, dev, (chunks, d)).sum(0)
}
