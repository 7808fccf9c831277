//! Fused attention on a GPU: the kernels of `flash.cu`, compiled by NVRTC on
//! first use (per head dim) and launched on the tensors' own stream.
//!
//! Why: composed from candle's kernels, attention makes the [B, H, T, S]
//! scores and passes over them six times forward and recomputes them for the
//! derivative; on an H200 that was 35 ms of each GPT-2-small layer's step
//! (60% of the step, `shardc run --profile`). These kernels stream tiles
//! through shared memory with an online softmax (FlashAttention-2's
//! algorithm, register-blocked on the CUDA cores), so the scores never exist
//! in memory; dk and dv come from one pass over the queries. They compute the same
//! function as [`super::attention`]'s composed path in f32, to rounding. The
//! forward saves nothing (as the composed path): the derivative recomputes
//! the rows' log-sum-exps (one dot per query-key pair, not the output's two)
//! and takes the output from the forward, so the plan's memory model is the
//! same on both paths.
//!
//! Taken for f32 tensors on a CUDA device with a head dim of at most 128 and
//! no keys' padding mask; everything else (and every CPU run) takes the
//! composed path, as does `SHARDC_KERNELS=candle` (shardc's own kernels off,
//! see [`crate::kernels::own`]), which is how the GPU check compares them.

use super::attention::Mask;
use super::R;
use candle_core::Tensor;

/// The fused forward, when it applies: `None` sends the caller to the
/// composed path.
pub(super) fn forward(q: &Tensor, k: &Tensor, v: &Tensor, mask: Mask) -> R<Option<Tensor>> {
    #[cfg(feature = "cuda")]
    {
        if let Some(cx) = gpu::Cx::of(q, k, v)?.filter(|_| crate::kernels::own()) {
            return cx
                .forward(mask, true)
                .map(|(o, _)| o)
                .map_err(crate::prim::kernel::ce);
        }
    }
    let _ = (q, k, v, mask);
    Ok(None)
}

/// The fused derivative (dq, dk, dv) of [`forward`] at cotangent `g`.
/// `y` is the forward's output: its rows' dots with the cotangent's are
/// the softmax derivative's (FlashAttention's), so only the log-sum-exps are
/// recomputed.
pub(super) fn vjp(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    y: &Tensor,
    g: &Tensor,
    mask: Mask,
) -> R<Option<(Tensor, Tensor, Tensor)>> {
    #[cfg(feature = "cuda")]
    {
        if let Some(cx) = gpu::Cx::of(q, k, v)?.filter(|_| crate::kernels::own()) {
            return cx
                .vjp(y, g, mask)
                .map(Some)
                .map_err(crate::prim::kernel::ce);
        }
    }
    let _ = (q, k, v, y, g, mask);
    Ok(None)
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::{Mask, R};
    use crate::prim::gpu::{module, slice, wrap, Module};
    use crate::prim::kernel::ce;
    use candle_core::cuda_backend::cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
    use candle_core::cuda_backend::{CudaDevice, WrapErr};
    use candle_core::{DType, Result, Tensor};

    /// Threads per block (`THREADS` in the source).
    const THREADS: u32 = 128;
    /// The largest head dim the kernels hold in registers.
    const MAX_HEAD: usize = 128;

    /// Three contiguous f32 operands on one GPU, and their sizes.
    pub(super) struct Cx {
        q: Tensor,
        k: Tensor,
        v: Tensor,
        dev: CudaDevice,
        b: usize,
        t: usize,
        s: usize,
        h: usize,
        e: usize,
    }

    impl Cx {
        pub(super) fn of(q: &Tensor, k: &Tensor, v: &Tensor) -> R<Option<Cx>> {
            let Some(dev) = crate::prim::gpu::cuda(q) else {
                return Ok(None);
            };
            let f32s = [q, k, v].iter().all(|t| t.dtype() == DType::F32);
            let (qd, kd) = (q.dims(), k.dims());
            if !f32s || qd.len() != 4 || kd.len() != 4 || v.dims() != kd {
                return Ok(None);
            }
            let (b, t, h, e) = (qd[0], qd[1], qd[2], qd[3]);
            if kd[0] != b || kd[2] != h || kd[3] != e || e == 0 || e > MAX_HEAD {
                return Ok(None);
            }
            let c = |x: &Tensor| x.contiguous().map_err(ce);
            Ok(Some(Cx {
                q: c(q)?,
                k: c(k)?,
                v: c(v)?,
                dev,
                b,
                t,
                s: kd[1],
                h,
                e,
            }))
        }

        /// This head dim's kernels.
        fn module(&self) -> Result<Module> {
            module(
                "flash",
                include_str!("flash.cu"),
                &format!("#define HD {}", self.e),
            )
        }

        /// Rows of a streamed tile, and of the derivative kernels' own
        /// (`TS` in the source).
        fn tile(&self) -> usize {
            if self.e > 64 {
                16
            } else {
                32
            }
        }

        /// A launch over `rows` rows, `per` rows to a block.
        fn grid(&self, rows: usize, per: usize) -> LaunchConfig {
            LaunchConfig {
                grid_dim: (rows.div_ceil(per) as u32, (self.b * self.h) as u32, 1),
                block_dim: (THREADS, 1, 1),
                shared_mem_bytes: 0,
            }
        }

        fn sizes(&self) -> [i32; 4] {
            [self.b, self.t, self.s, self.h].map(|x| x as i32)
        }

        fn wrap(&self, x: CudaSlice<f32>, rows: usize) -> Tensor {
            wrap(x, &self.dev, (self.b, rows, self.h, self.e))
        }

        /// The output (when `want_out`) and each query row's log-sum-exp.
        pub(super) fn forward(
            &self,
            mask: Mask,
            want_out: bool,
        ) -> Result<(Option<Tensor>, CudaSlice<f32>)> {
            let n = if want_out {
                self.b * self.t * self.h * self.e
            } else {
                1
            };
            // SAFETY (both): the kernel writes every element.
            let o = unsafe { self.dev.alloc::<f32>(n)? };
            let lse = unsafe { self.dev.alloc::<f32>(self.b * self.h * self.t)? };
            let m = self.module()?;
            let f = self
                .dev
                .get_or_load_custom_func("attn_fwd", &m.name, &m.ptx)?;
            let (sq, sk, sv) = (slice(&self.q), slice(&self.k), slice(&self.v));
            let (vq, vk, vv) = (sq.view::<f32>()?, sk.view::<f32>()?, sv.view::<f32>()?);
            let [b, t, s, h] = self.sizes();
            let scale = 1.0 / (self.e as f32).sqrt();
            let (causal, window) = flags(mask);
            let want = i32::from(want_out);
            let mut l = f.builder();
            l.arg(&vq).arg(&vk).arg(&vv).arg(&o).arg(&lse);
            l.arg(&b).arg(&t).arg(&s).arg(&h).arg(&scale);
            l.arg(&causal).arg(&window).arg(&want);
            // SAFETY: the kernel reads q, k, v and writes o and lse within
            // the sizes passed, all on this stream.
            unsafe { l.launch(self.grid(self.t, 2 * self.tile())) }.w()?;
            Ok((want_out.then(|| self.wrap(o, self.t)), lse))
        }

        pub(super) fn vjp(
            &self,
            y: &Tensor,
            g: &Tensor,
            mask: Mask,
        ) -> Result<(Tensor, Tensor, Tensor)> {
            let g = g.to_dtype(DType::F32)?.contiguous()?;
            // The output as the forward gave it when its layout is the
            // queries' (else recomputed with the log-sum-exps).
            let (o, lse) = if y.dims() == self.q.dims() {
                let (_, lse) = self.forward(mask, false)?;
                (y.to_dtype(DType::F32)?.contiguous()?, lse)
            } else {
                let (o, lse) = self.forward(mask, true)?;
                let o = o.ok_or_else(|| candle_core::Error::Msg("no attention output".into()))?;
                (o, lse)
            };
            let [b, t, s, h] = self.sizes();
            let scale = 1.0 / (self.e as f32).sqrt();
            let (causal, window) = flags(mask);
            let nq = self.b * self.t * self.h * self.e;
            let nk = self.b * self.s * self.h * self.e;
            // SAFETY (all four): the kernels write every element.
            let dq = unsafe { self.dev.alloc::<f32>(nq)? };
            let dots = unsafe { self.dev.alloc::<f32>(self.b * self.h * self.t)? };
            let dk = unsafe { self.dev.alloc::<f32>(nk)? };
            let dv = unsafe { self.dev.alloc::<f32>(nk)? };
            {
                let (sq, sk, sv) = (slice(&self.q), slice(&self.k), slice(&self.v));
                let (so, sg) = (slice(&o), slice(&g));
                let (vq, vk, vv) = (sq.view::<f32>()?, sk.view::<f32>()?, sv.view::<f32>()?);
                let (vo, vg) = (so.view::<f32>()?, sg.view::<f32>()?);
                let m = self.module()?;
                let f = self
                    .dev
                    .get_or_load_custom_func("attn_dq", &m.name, &m.ptx)?;
                let mut l = f.builder();
                l.arg(&vq).arg(&vk).arg(&vv).arg(&vo);
                l.arg(&vg).arg(&lse).arg(&dq).arg(&dots);
                l.arg(&b).arg(&t).arg(&s).arg(&h).arg(&scale);
                l.arg(&causal).arg(&window);
                // SAFETY: reads q, k, v, o, g, lse; writes dq and dots.
                unsafe { l.launch(self.grid(self.t, self.tile())) }.w()?;
                let f = self
                    .dev
                    .get_or_load_custom_func("attn_dkv", &m.name, &m.ptx)?;
                let mut l = f.builder();
                l.arg(&vq).arg(&vk).arg(&vv).arg(&vg);
                l.arg(&lse).arg(&dots).arg(&dk).arg(&dv);
                l.arg(&b).arg(&t).arg(&s).arg(&h).arg(&scale);
                l.arg(&causal).arg(&window);
                // SAFETY: reads q, k, v, g, lse, dots; writes dk and dv.
                unsafe { l.launch(self.grid(self.s, self.tile())) }.w()?;
            }
            Ok((
                self.wrap(dq, self.t),
                self.wrap(dk, self.s),
                self.wrap(dv, self.s),
            ))
        }
    }

    fn flags(mask: Mask) -> (i32, i32) {
        (
            i32::from(mask.causal),
            mask.window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
        )
    }
}
