//! Fused f32 kernels for the activations and their derivatives. candle's
//! versions call libm's scalar `tanhf` / `expf` per element and build each
//! derivative from half a dozen tensor ops (a temporary, and a pass over
//! memory, each); on GPT-J's MLP that was a sixth of a step. Here each forward
//! and each derivative (times the cotangent) is one loop, over a polynomial
//! `exp` and a rational `tanh` written so that the compiler vectorises them.
//!
//! Accuracy: `exp` within 2 ulp of the true value over the range where f32's
//! exp is normal, `tanh` within 1e-6 absolute (the approximations XLA's CPU
//! backend uses, tested against f64 below). Elementwise, so a sharded tensor
//! gets the same bits as the whole one. Contiguous f32 and bf16 take this
//! path: bf16 (`precision: bf16`) is widened to f32 per element and the result
//! rounded once (candle's composition rounded after each of its ops, and on a
//! GPU its six-op derivative was 2 ms of each GPT-2 layer's backward); f64
//! (`--f64`, numerics checks) and f16 keep candle's kernels.

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Result, Shape, Tensor};
use half::bf16;
use std::borrow::Cow;

/// e^x for f32, as Cephes' `expf`: x = n·ln 2 + r with |r| ≤ ln 2 / 2, a
/// degree-6 polynomial for e^r, and 2^n put into the exponent bits. NaN
/// stays NaN; overflow gives +inf; results below the normal range give 0.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two, the first part exact in few bits, so n·C1 is exact.
    const C1: f32 = 0.693_359_4;
    const C2: f32 = -2.121_944_4e-4;
    // Adding 1.5·2^23 rounds to an integer (to nearest) in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    const HI: f32 = 88.722_83;
    const LO: f32 = -87.336_55;
    let c = x.clamp(LO, HI);
    let t = c * LOG2E + MAGIC;
    let n = t - MAGIC;
    let r = c - n * C1 - n * C2;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5; // Cephes: 5.0000001201e-1, the same f32
    let e = p * r * r + r + 1.0;
    // n is in [-126, 128]: 2^n as two factors, so that n = 128 (e^88.7)
    // does not need the infinite exponent.
    let ni = t.to_bits().wrapping_sub(MAGIC.to_bits()) as i32;
    let half = ni >> 1;
    let a = f32::from_bits(((half + 127) as u32) << 23);
    let b = f32::from_bits(((ni - half + 127) as u32) << 23);
    let y = e * a * b;
    let y = if x > HI { f32::INFINITY } else { y };
    let y = if x < LO { 0.0 } else { y };
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// tanh for f32: the odd/even rational approximation of Eigen and XLA's CPU
/// backend on [-7.9053, 7.9053] (where it reaches ±1 in f32), x itself below
/// 4e-4.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    const CLAMP: f32 = 7.905_311;
    let c = x.clamp(-CLAMP, CLAMP);
    let x2 = c * c;
    let mut p = -2.760_768_5e-16f32;
    p = p * x2 + 2.000_188e-13;
    p = p * x2 - 8.604_672e-11;
    p = p * x2 + 5.122_297e-8;
    p = p * x2 + 1.485_722_4e-5;
    p = p * x2 + 6.372_619_3e-4;
    p = p * x2 + 4.893_524_6e-3;
    let p = p * c;
    let mut q = 1.198_258_4e-6f32;
    q = q * x2 + 1.185_347_1e-4;
    q = q * x2 + 2.268_434_7e-3;
    q = q * x2 + 4.893_525e-3;
    let y = p / q;
    let y = if x.abs() < 4e-4 { x } else { y };
    if x.is_nan() {
        x
    } else {
        y
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_A: f32 = 0.044_715;

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// The activations with a fused kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    /// GELU, tanh approximation (candle's `gelu`).
    Gelu,
    Silu,
    Tanh,
    Sigmoid,
    Exp,
}

impl Act {
    #[inline(always)]
    fn f(self, x: f32) -> f32 {
        match self {
            Act::Gelu => 0.5 * x * (1.0 + tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_A * x * x))),
            Act::Silu => x / (1.0 + exp(-x)),
            Act::Tanh => tanh(x),
            Act::Sigmoid => sigmoid(x),
            Act::Exp => exp(x),
        }
    }

    /// The derivative at `x`, given the forward's output `y` there.
    #[inline(always)]
    fn df(self, x: f32, y: f32) -> f32 {
        match self {
            Act::Gelu => {
                let x2 = x * x;
                let t = tanh(SQRT_2_OVER_PI * x * (1.0 + GELU_A * x2));
                let dinner = SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_A * x2);
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * dinner
            }
            Act::Silu => {
                let s = sigmoid(x);
                s * (1.0 + x * (1.0 - s))
            }
            Act::Tanh => 1.0 - y * y,
            Act::Sigmoid => y * (1.0 - y),
            Act::Exp => y,
        }
    }

    /// Whether the derivative reads the forward's output (else its input).
    fn grad_from_output(self) -> bool {
        matches!(self, Act::Tanh | Act::Sigmoid | Act::Exp)
    }
}

/// The contiguous elements of an f32 or bf16 operand as f32 (bf16 widened),
/// and whether it was bf16; `None` for another dtype or a strided view (then
/// the caller uses candle's kernels).
pub(super) fn f32s<'a>(s: &'a CpuStorage, l: &Layout) -> Option<(Cow<'a, [f32]>, bool)> {
    let (a, b) = l.contiguous_offsets()?;
    match s {
        CpuStorage::F32(v) => Some((Cow::Borrowed(v.get(a..b)?), false)),
        CpuStorage::BF16(v) => Some((v.get(a..b)?.iter().map(|x| x.to_f32()).collect(), true)),
        _ => None,
    }
}

/// `y` as the storage of the operands' dtype (bf16: rounded to nearest even).
pub(super) fn stored(y: Vec<f32>, bf: bool) -> CpuStorage {
    if bf {
        CpuStorage::BF16(y.into_iter().map(bf16::from_f32).collect())
    } else {
        CpuStorage::F32(y)
    }
}

fn fits(t: &Tensor) -> bool {
    let here = t.device().is_cpu() || (cfg!(feature = "cuda") && t.device().is_cuda());
    let dtype = matches!(t.dtype(), DType::F32 | DType::BF16);
    crate::kernels::own() && dtype && t.is_contiguous() && here
}

/// One forward: `y = f(x)`.
struct Forward(Act);

impl CustomOp1 for Forward {
    fn name(&self) -> &'static str {
        "fused-activation"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        let (x, bf) = f32s(s, l).ok_or_else(|| {
            candle_core::Error::Msg("fused activation: contiguous f32 or bf16 expected".into())
        })?;
        let x = &*x;
        // One loop per activation, so each is a straight-line body the
        // compiler vectorises (a `match` inside the loop kept it scalar).
        fn run(x: &[f32], f: impl Fn(f32) -> f32) -> Vec<f32> {
            x.iter().map(|v| f(*v)).collect()
        }
        let y = match self.0 {
            Act::Gelu => run(x, |v| Act::Gelu.f(v)),
            Act::Silu => run(x, |v| Act::Silu.f(v)),
            Act::Tanh => run(x, |v| Act::Tanh.f(v)),
            Act::Sigmoid => run(x, |v| Act::Sigmoid.f(v)),
            Act::Exp => run(x, |v| Act::Exp.f(v)),
        };
        Ok((stored(y, bf), l.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s: &candle_core::CudaStorage,
        l: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        on_gpu::launch("act_fwd", self.0, (s, l), None)
    }
}

/// One derivative: `ct · f'(x)` (from the input or from the output, as
/// [`Act::grad_from_output`] says).
struct Backward(Act);

impl CustomOp2 for Backward {
    fn name(&self) -> &'static str {
        "fused-activation-grad"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let msg = || {
            candle_core::Error::Msg(
                "fused activation grad: contiguous f32 or bf16 operands of one dtype expected"
                    .into(),
            )
        };
        let ((v, bf), (ct, bf2)) = (f32s(s1, l1).ok_or_else(msg)?, f32s(s2, l2).ok_or_else(msg)?);
        if v.len() != ct.len() || bf != bf2 {
            return Err(msg());
        }
        let (v, ct) = (&*v, &*ct);
        // As in the forward, one loop per activation.
        fn run(v: &[f32], ct: &[f32], d: impl Fn(f32) -> f32) -> Vec<f32> {
            v.iter().zip(ct).map(|(v, c)| c * d(*v)).collect()
        }
        let g = match self.0 {
            Act::Gelu => run(v, ct, |x| Act::Gelu.df(x, 0.0)),
            Act::Silu => run(v, ct, |x| Act::Silu.df(x, 0.0)),
            Act::Tanh => run(v, ct, |y| Act::Tanh.df(0.0, y)),
            Act::Sigmoid => run(v, ct, |y| Act::Sigmoid.df(0.0, y)),
            Act::Exp => run(v, ct, |y| Act::Exp.df(0.0, y)),
        };
        Ok((stored(g, bf), l1.shape().clone()))
    }

    #[cfg(feature = "cuda")]
    fn cuda_fwd(
        &self,
        s1: &candle_core::CudaStorage,
        l1: &Layout,
        s2: &candle_core::CudaStorage,
        l2: &Layout,
    ) -> Result<(candle_core::CudaStorage, Shape)> {
        on_gpu::launch("act_bwd", self.0, (s1, l1), Some((s2, l2)))
    }
}

impl Act {
    /// The activation's number in `act.cu`.
    #[cfg(feature = "cuda")]
    fn code(self) -> i32 {
        match self {
            Act::Gelu => 0,
            Act::Silu => 1,
            Act::Tanh => 2,
            Act::Sigmoid => 3,
            Act::Exp => 4,
        }
    }
}

/// The activations on a GPU (`act.cu`): the same functions as the CPU's
/// kernels, with CUDA's `expf` and `tanhf` (equal to rounding), for f32 and
/// bf16 (`act_fwd_bf16`, `act_bwd_bf16`).
#[cfg(feature = "cuda")]
mod on_gpu {
    use super::Act;
    use candle_core::backend::BackendStorage;
    use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
    use candle_core::cuda_backend::{CudaDType, WrapErr};
    use candle_core::{CudaStorage, DType, Layout, Result, Shape};
    use half::bf16;

    /// `name` over the contiguous f32 or bf16 operand `a` (and the
    /// cotangent `b`, of the same dtype, for the derivative), into a new
    /// buffer shaped like `a`.
    pub(super) fn launch(
        name: &str,
        act: Act,
        first: (&CudaStorage, &Layout),
        second: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, Shape)> {
        match first.0.dtype() {
            DType::F32 => typed::<f32>(name, act, first, second),
            DType::BF16 => typed::<bf16>(&format!("{name}_bf16"), act, first, second),
            _ => Err(msg()),
        }
    }

    fn msg() -> candle_core::Error {
        candle_core::Error::Msg(
            "fused activation: contiguous f32 or bf16 operands of one dtype expected".into(),
        )
    }

    fn typed<T: CudaDType + DeviceRepr>(
        name: &str,
        act: Act,
        (s1, l1): (&CudaStorage, &Layout),
        second: Option<(&CudaStorage, &Layout)>,
    ) -> Result<(CudaStorage, Shape)> {
        let (a, b) = l1.contiguous_offsets().ok_or_else(msg)?;
        let n = b - a;
        let dev = s1.device().clone();
        let k = super::super::gpu::module("act", include_str!("act.cu"), "")?;
        let f = dev.get_or_load_custom_func(name, &k.name, &k.ptx)?;
        // SAFETY: the kernel writes every element.
        let out = unsafe { dev.alloc::<T>(n)? };
        let x = s1.as_cuda_slice::<T>()?.slice(a..b);
        let (nn, code) = (n as i64, act.code());
        let cfg = super::super::gpu::elementwise(n);
        let ct;
        let mut l = f.builder();
        l.arg(&x);
        if let Some((s2, l2)) = second {
            let (c, d) = l2.contiguous_offsets().ok_or_else(msg)?;
            if d - c != n || s2.dtype() != s1.dtype() {
                return Err(msg());
            }
            ct = s2.as_cuda_slice::<T>()?.slice(c..d);
            l.arg(&ct);
        }
        l.arg(&out).arg(&nn).arg(&code);
        // SAFETY: reads n elements of each operand, writes n of out.
        unsafe { l.launch(cfg) }.w()?;
        Ok((CudaStorage::wrap_cuda_slice(out, dev), l1.shape().clone()))
    }
}

/// `f(x)` by the fused kernel, or `None` when `x` is not contiguous f32 or
/// bf16 (then candle's kernels).
pub fn forward(act: Act, x: &Tensor) -> Option<Result<Tensor>> {
    fits(x).then(|| x.apply_op1_no_bwd(&Forward(act)))
}

/// `ct · f'(x)` by the fused kernel (`y` the forward's output), or `None` when
/// an operand is not contiguous f32 or bf16, or they differ in shape or dtype.
pub fn backward(act: Act, x: &Tensor, y: &Tensor, ct: &Tensor) -> Option<Result<Tensor>> {
    let v = if act.grad_from_output() { y } else { x };
    let same = v.shape() == ct.shape() && v.dtype() == ct.dtype();
    (fits(v) && fits(ct) && same).then(|| v.apply_op2_no_bwd(ct, &Backward(act)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> impl Iterator<Item = f32> {
        (-200_000..=200_000).map(|i| i as f32 * 5e-4)
    }

    #[test]
    fn exp_is_within_two_ulp() {
        // Where e^x is a normal f32 (below, 0 stands for the subnormals).
        for x in grid()
            .filter(|x| *x > -87.3)
            .chain([-87.0, -80.5, 50.0, 88.0, 88.7])
        {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            let ulp = (want as f32).abs() * f32::EPSILON;
            assert!(
                (got - want).abs() <= 2.0 * ulp as f64,
                "exp({x}) = {got}, want {want}"
            );
        }
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(-90.0), 0.0);
        assert_eq!(exp(0.0), 1.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn tanh_is_close() {
        for x in grid().chain([-20.0, 8.0, 1e-5, -3e-4]) {
            let want = (x as f64).tanh();
            let got = tanh(x) as f64;
            assert!((got - want).abs() <= 1e-6, "tanh({x}) = {got}, want {want}");
        }
        assert!(tanh(f32::NAN).is_nan());
        assert_eq!(tanh(f32::INFINITY), 1.0);
    }

    #[test]
    fn derivatives_match_differences() {
        for act in [Act::Gelu, Act::Silu, Act::Tanh, Act::Sigmoid, Act::Exp] {
            for i in -40..=40 {
                let x = i as f32 * 0.1;
                let h = 1e-3f64;
                let f = |v: f64| act.f(v as f32) as f64;
                let fd = (f(x as f64 + h) - f(x as f64 - h)) / (2.0 * h);
                let d = act.df(x, act.f(x)) as f64;
                assert!(
                    (d - fd).abs() <= 2e-3 * (1.0 + fd.abs()),
                    "{act:?}'({x}) = {d}, differences {fd}"
                );
            }
        }
    }

    #[test]
    fn kernels_match_the_scalar_functions() -> Result<()> {
        let dev = candle_core::Device::Cpu;
        let xs: Vec<f32> = (0..1000).map(|i| (i as f32 - 500.0) * 0.013).collect();
        let x = Tensor::from_vec(xs.clone(), (10, 100), &dev)?;
        let ct = Tensor::ones((10, 100), DType::F32, &dev)?.affine(0.5, 0.0)?;
        for act in [Act::Gelu, Act::Silu, Act::Tanh, Act::Sigmoid, Act::Exp] {
            let y =
                forward(act, &x).ok_or_else(|| candle_core::Error::Msg("no kernel".into()))??;
            let g = backward(act, &x, &y, &ct)
                .ok_or_else(|| candle_core::Error::Msg("no kernel".into()))??;
            let (y, g) = (
                y.flatten_all()?.to_vec1::<f32>()?,
                g.flatten_all()?.to_vec1::<f32>()?,
            );
            for (i, x) in xs.iter().enumerate() {
                assert_eq!(y[i].to_bits(), act.f(*x).to_bits());
                assert_eq!(g[i].to_bits(), (0.5 * act.df(*x, act.f(*x))).to_bits());
            }
        }
        // bf16: widened, the f32 function, rounded once.
        let xb = x.to_dtype(DType::BF16)?;
        let ctb = ct.to_dtype(DType::BF16)?;
        for act in [Act::Gelu, Act::Silu, Act::Tanh, Act::Sigmoid, Act::Exp] {
            let y =
                forward(act, &xb).ok_or_else(|| candle_core::Error::Msg("no kernel".into()))??;
            let g = backward(act, &xb, &y, &ctb)
                .ok_or_else(|| candle_core::Error::Msg("no kernel".into()))??;
            assert_eq!((y.dtype(), g.dtype()), (DType::BF16, DType::BF16));
            let (xs, y, g) = (
                xb.flatten_all()?.to_vec1::<bf16>()?,
                y.flatten_all()?.to_vec1::<bf16>()?,
                g.flatten_all()?.to_vec1::<bf16>()?,
            );
            for (i, x) in xs.iter().enumerate() {
                let (x, yf) = (x.to_f32(), y[i].to_f32());
                assert_eq!(y[i], bf16::from_f32(act.f(x)));
                let at = if act.grad_from_output() { yf } else { x };
                assert_eq!(g[i], bf16::from_f32(0.5 * act.df(at, at)));
            }
        }
        // Operands of two dtypes, a strided view or another dtype take
        // candle's kernels.
        assert!(backward(Act::Gelu, &x, &x, &ctb).is_none());
        assert!(forward(Act::Gelu, &x.t()?).is_none());
        assert!(forward(Act::Gelu, &x.to_dtype(DType::F64)?).is_none());
        Ok(())
    }
}
