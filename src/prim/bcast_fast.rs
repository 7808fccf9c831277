//! A broadcast binary op in one pass: `a op b` where one operand is whole
//! (the output's shape) and the other a row of its trailing dims (a bias, a
//! norm's scale), both contiguous.
//!
//! Why: candle broadcasts by giving the row zero strides and taking its
//! strided kernel, which works out every element's offset dim by dim. On an
//! H200 that kernel ran at about 0.2 TB/s: 12.4 ms of a bf16 GPT-2-small step
//! (Nsight Compute), where a pass over the same bytes takes a tenth of it.
//! Here each element reads `b[i % n]`. The arithmetic is candle's: one f32
//! op (bf16 operands widened, the result rounded once to nearest even, as the
//! `half` crate does on the CPU), so the bits are the same as its kernels'.
//!
//! Taken on a CUDA device, and on a CPU device with several threads of the
//! worker pool for a large op (its rows in parts over [`crate::pool`]:
//! candle's CPU kernel runs on one thread, its own pool having no workers),
//! for f32 or bf16 operands of one dtype, when shardc's own kernels are on
//! (`SHARDC_KERNELS=candle` turns them off); everything else keeps candle's
//! kernels. The tests compare the CPU body with candle's `broadcast_*` bit
//! for bit.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};

/// The binary ops the kernel computes (`op` in `act.cu`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bin {
    Add,
    Sub,
    Mul,
    Div,
}

impl Bin {
    #[inline(always)]
    fn f(self, x: f32, y: f32) -> f32 {
        match self {
            Bin::Add => x + y,
            Bin::Sub => x - y,
            Bin::Mul => x * y,
            Bin::Div => x / y,
        }
    }

    /// The op's number in `act.cu`.
    #[cfg(feature = "cuda")]
    fn code(self) -> i32 {
        match self {
            Bin::Add => 0,
            Bin::Sub => 1,
            Bin::Mul => 2,
            Bin::Div => 3,
        }
    }
}

/// `whole op row` (or `row op whole` when `flip`), the row repeated over the
/// whole operand's leading dims.
struct Broadcast {
    op: Bin,
    flip: bool,
}

fn msg() -> candle_core::Error {
    candle_core::Error::Msg("broadcast op: contiguous f32 or bf16 operands of one dtype".into())
}

impl CustomOp2 for Broadcast {
    fn name(&self) -> &'static str {
        "fused-broadcast"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        // Widened as the activations' CPU bodies do, one f32 op, stored back.
        let ((a, bf), (b, bf2)) = (
            super::unary_fast::f32s(s1, l1).ok_or_else(msg)?,
            super::unary_fast::f32s(s2, l2).ok_or_else(msg)?,
        );
        if bf != bf2 || b.is_empty() {
            return Err(msg());
        }
        let (op, flip) = (self.op, self.flip);
        let f = move |x: f32, y: f32| if flip { op.f(y, x) } else { op.f(x, y) };
        let n = b.len();
        if a.len() % n != 0 {
            return Err(msg());
        }
        // Each row of the whole operand against the row, over parts of the
        // rows on the worker pool.
        let y = crate::pool::rows_into(a.len() / n, n, n, &|first, k, out| {
            let part = &a[first * n..(first + k) * n];
            for (r, o) in part.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
                for ((o, x), y) in o.iter_mut().zip(r).zip(b.iter()) {
                    o.write(f(*x, *y));
                }
            }
        })
        .ok_or_else(msg)?;
        let out = super::unary_fast::stored(y, bf);
        Ok((out, l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        on_gpu::launch(self.op, self.flip, (s1, l1), (s2, l2))
    }
}

/// `a op b` by the fused kernel when it applies on this device: a GPU, or a
/// CPU device with several threads of the worker pool and at least
/// [`POOLED_FROM`] elements (candle's CPU kernel runs on one thread since its
/// own pool has no workers: `runtime::mesh::share_cores`); `None` sends the
/// caller to candle's `broadcast_*`.
pub fn apply(op: Bin, a: &Tensor, b: &Tensor) -> Option<Result<Tensor>> {
    let gpu = cfg!(feature = "cuda") && a.device().is_cuda();
    let pooled = a.device().is_cpu()
        && crate::pool::threads() > 1
        && a.elem_count().max(b.elem_count()) >= POOLED_FROM;
    if !((gpu || pooled) && crate::kernels::own()) {
        return None;
    }
    run(op, a, b)
}

/// Elements from which a CPU broadcast op goes over the worker pool (candle's
/// threshold for its own parallel kernels).
const POOLED_FROM: usize = 1 << 16;

/// The fused op on any device, when one operand is whole and the other a
/// contiguous row of its trailing dims (a strictly smaller one).
fn run(op: Bin, a: &Tensor, b: &Tensor) -> Option<Result<Tensor>> {
    let dtype = a.dtype();
    if b.dtype() != dtype || !matches!(dtype, DType::F32 | DType::BF16) {
        return None;
    }
    if !a.is_contiguous() || !b.is_contiguous() {
        return None;
    }
    let (whole, row, flip) = if row_of(b.dims(), a.dims()) {
        (a, b, false)
    } else if row_of(a.dims(), b.dims()) {
        (b, a, true)
    } else {
        return None;
    };
    Some(whole.apply_op2_no_bwd(row, &Broadcast { op, flip }))
}

/// Whether `row` (leading 1s aside) is the trailing dims of `whole`, and
/// smaller than it (the same shape takes candle's contiguous kernel).
fn row_of(row: &[usize], whole: &[usize]) -> bool {
    let lead = row.iter().take_while(|d| **d == 1).count();
    let row = &row[lead..];
    let n: usize = row.iter().product();
    whole.len() >= lead + row.len()
        && whole.ends_with(row)
        && n > 0
        && n < whole.iter().product::<usize>()
}

/// The kernel's launch (`bcast_f32`, `bcast_bf16` in `act.cu`).
#[cfg(feature = "cuda")]
mod on_gpu {
    use super::{msg, Bin};
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CudaStorage, DType, Layout, Result, Shape};
    use half::bf16;

    pub(super) fn launch(
        op: Bin,
        flip: bool,
        whole: (&CudaStorage, &Layout),
        row: (&CudaStorage, &Layout),
    ) -> Result<(CudaStorage, Shape)> {
        if whole.0.dtype() != row.0.dtype() {
            return Err(msg());
        }
        match whole.0.dtype() {
            DType::F32 => typed::<f32>("bcast_f32", op, flip, whole, row),
            DType::BF16 => typed::<bf16>("bcast_bf16", op, flip, whole, row),
            _ => Err(msg()),
        }
    }

    fn typed<T: CudaDType + DeviceRepr>(
        name: &str,
        op: Bin,
        flip: bool,
        (s1, l1): (&CudaStorage, &Layout),
        (s2, l2): (&CudaStorage, &Layout),
    ) -> Result<(CudaStorage, Shape)> {
        let ((a0, a1), (b0, b1)) = (
            l1.contiguous_offsets().ok_or_else(msg)?,
            l2.contiguous_offsets().ok_or_else(msg)?,
        );
        let (n, nb) = (a1 - a0, b1 - b0);
        if nb == 0 || n % nb != 0 {
            return Err(msg());
        }
        let dev = s1.device().clone();
        let k = super::super::gpu::module("act", include_str!("act.cu"), "")?;
        let f = dev.get_or_load_custom_func(name, &k.name, &k.ptx)?;
        // SAFETY: the kernel writes every element.
        let out = unsafe { dev.alloc::<T>(n)? };
        let a = s1.as_cuda_slice::<T>()?.slice(a0..a1);
        let b = s2.as_cuda_slice::<T>()?.slice(b0..b1);
        let (nn, nbb, code, fl) = (n as i64, nb as i64, op.code(), i32::from(flip));
        let mut l = f.builder();
        l.arg(&a)
            .arg(&b)
            .arg(&out)
            .arg(&nn)
            .arg(&nbb)
            .arg(&code)
            .arg(&fl);
        // SAFETY: reads n elements of a and nb of b, writes n of out.
        unsafe { l.launch(super::super::gpu::elementwise(n)) }.w()?;
        Ok((CudaStorage::wrap_cuda_slice(out, dev), l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// The fused op equals candle's broadcast op bit for bit, both ways
    /// round, in f32 and bf16; other shapes are not taken.
    #[test]
    fn equals_candles_broadcast_ops() -> Result<()> {
        let dev = Device::Cpu;
        let xs: Vec<f32> = (0..2 * 3 * 20)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.173)
            .collect();
        let a = Tensor::from_vec(xs, (2, 3, 20), &dev)?;
        let rows: Vec<f32> = (0..20).map(|i| (i as f32 - 9.5) * 0.61).collect();
        for b in [
            Tensor::from_vec(rows.clone(), 20, &dev)?,
            Tensor::from_vec(rows.repeat(3), (1, 3, 20), &dev)?,
        ] {
            for dtype in [DType::F32, DType::BF16] {
                let (a, b) = (a.to_dtype(dtype)?, b.to_dtype(dtype)?);
                for op in [Bin::Add, Bin::Sub, Bin::Mul, Bin::Div] {
                    let want = |x: &Tensor, y: &Tensor| match op {
                        Bin::Add => x.broadcast_add(y),
                        Bin::Sub => x.broadcast_sub(y),
                        Bin::Mul => x.broadcast_mul(y),
                        Bin::Div => x.broadcast_div(y),
                    };
                    for (x, y) in [(&a, &b), (&b, &a)] {
                        let got = run(op, x, y).ok_or_else(msg)??;
                        let want = want(x, y)?;
                        assert_eq!(got.dims(), want.dims());
                        let bits = |t: &Tensor| -> Result<Vec<u32>> {
                            let t = t.flatten_all()?.to_dtype(DType::F32)?;
                            Ok(t.to_vec1::<f32>()?.iter().map(|v| v.to_bits()).collect())
                        };
                        assert_eq!(bits(&got)?, bits(&want)?, "{op:?} {dtype:?}");
                    }
                }
            }
        }
        // Same shapes, a middle dim, a strided view, two dtypes: not taken.
        assert!(run(Bin::Add, &a, &a).is_none());
        let mid = Tensor::ones((3, 1), DType::F32, &dev)?;
        assert!(run(Bin::Add, &a, &mid).is_none());
        let t = a.transpose(1, 2)?;
        assert!(run(Bin::Add, &t, &Tensor::ones(3, DType::F32, &dev)?).is_none());
        let b16 = Tensor::ones(20, DType::BF16, &dev)?;
        assert!(run(Bin::Add, &a, &b16).is_none());
        // On the CPU, `apply` leaves small ops to candle.
        assert!(apply(Bin::Add, &a, &Tensor::ones(20, DType::F32, &dev)?).is_none());
        Ok(())
    }

    /// Over parts of its rows on two pool threads, a large op has the bits of
    /// candle's.
    #[test]
    fn pooled_ops_have_candles_bits() -> Result<()> {
        crate::pool::set_threads(2);
        let dev = Device::Cpu;
        let xs: Vec<f32> = (0..300 * 1000)
            .map(|i| ((i * 37 % 1009) as f32 - 500.0) * 0.0173)
            .collect();
        let a = Tensor::from_vec(xs, (300, 1000), &dev)?;
        let b = Tensor::from_vec(
            (0..1000).map(|i| i as f32 * 0.01 - 3.0).collect(),
            1000,
            &dev,
        )?;
        let bits = |t: &Tensor| -> Result<Vec<u32>> {
            Ok(t.flatten_all()?
                .to_vec1::<f32>()?
                .iter()
                .map(|v| v.to_bits())
                .collect())
        };
        let got = apply(Bin::Div, &b, &a).ok_or_else(msg)??;
        assert_eq!(bits(&got)?, bits(&b.broadcast_div(&a)?)?);
        let got = apply(Bin::Add, &a, &b).ok_or_else(msg)??;
        assert_eq!(bits(&got)?, bits(&a.broadcast_add(&b)?)?);
        Ok(())
    }
}
