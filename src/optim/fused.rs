//! Fused, in-place optimizer steps. The composed version (each kind's `composed`)
//! allocates a dozen temporaries per tensor and writes new parameters and slots;
//! at GPT-J's size that is several gigabytes of fresh pages per step, which is
//! most of the step's time on a CPU. These kernels update the parameter and its
//! slots where they are, one elementwise pass each, and do the arithmetic in f64.
//! Elementwise, so a sharded tensor gets the same bits as the whole one.

use candle_core::{CpuStorage, InplaceOp2, InplaceOp3, Layout, Result};

/// One pass of a fused step; the names say what is written, from what.
#[derive(Clone, Copy, Debug)]
pub enum Pass {
    /// slot ← a·slot + b·g (a first moment, or momentum).
    Linear { a: f64, b: f64 },
    /// slot ← a·slot + b·g² (a second moment, or Adagrad's accumulator).
    Square { a: f64, b: f64 },
    /// p ← p − lr·((m/c1)/(√(v/c2) + eps) + wd·p), from m and v.
    Adam {
        lr: f64,
        c1: f64,
        c2: f64,
        eps: f64,
        wd: f64,
    },
    /// p ← p − lr·m (momentum), or p − lr·(s·g + mu·m) (Nesterov), from m and g.
    Momentum {
        lr: f64,
        s: f64,
        mu: f64,
        nesterov: bool,
    },
    /// p ← p − lr·s·g.
    Plain { lr: f64, s: f64 },
    /// p ← p − lr·s·g/(√acc + eps), from g and acc.
    Adagrad { lr: f64, s: f64, eps: f64 },
}

/// The float element types a step runs on: read as f64, written back.
pub(super) trait Elem: Copy {
    fn get(self) -> f64;
    fn put(x: f64) -> Self;
}

impl Elem for f32 {
    #[inline(always)]
    fn get(self) -> f64 {
        f64::from(self)
    }
    #[inline(always)]
    fn put(x: f64) -> f32 {
        x as f32
    }
}

impl Elem for f64 {
    #[inline(always)]
    fn get(self) -> f64 {
        self
    }
    #[inline(always)]
    fn put(x: f64) -> f64 {
        x
    }
}

pub(super) fn err(what: &str) -> candle_core::Error {
    candle_core::Error::Msg(format!("fused step: {what}"))
}

/// The contiguous elements of an operand of `n` elements.
pub(super) fn range(l: &Layout, n: usize) -> Result<(usize, usize)> {
    l.contiguous_offsets()
        .filter(|(a, b)| b - a == n)
        .ok_or_else(|| err("contiguous operands expected"))
}

/// `dst[i] ← f(dst[i], a[i])`, one loop per pair of element types (no
/// dispatch per element, so it vectorises); the same f64 arithmetic.
fn each1(
    dst: &mut CpuStorage,
    l: &Layout,
    a: &CpuStorage,
    la: &Layout,
    f: impl Fn(f64, f64) -> f64,
) -> Result<()> {
    fn run<D: Elem, A: Elem>(d: &mut [D], a: &[A], f: &impl Fn(f64, f64) -> f64) {
        for (x, y) in d.iter_mut().zip(a) {
            *x = D::put(f(x.get(), y.get()));
        }
    }
    let (s, e) = range(l, l.shape().elem_count())?;
    let (sa, ea) = range(la, e - s)?;
    match (dst, a) {
        (CpuStorage::F32(d), CpuStorage::F32(a)) => run(&mut d[s..e], &a[sa..ea], &f),
        (CpuStorage::F32(d), CpuStorage::F64(a)) => run(&mut d[s..e], &a[sa..ea], &f),
        (CpuStorage::F64(d), CpuStorage::F32(a)) => run(&mut d[s..e], &a[sa..ea], &f),
        (CpuStorage::F64(d), CpuStorage::F64(a)) => run(&mut d[s..e], &a[sa..ea], &f),
        _ => return Err(err("f32 or f64 expected")),
    }
    Ok(())
}

/// `dst[i] ← f(dst[i], a[i], b[i])`, as [`each1`].
fn each2(
    dst: &mut CpuStorage,
    l: &Layout,
    (a, la): (&CpuStorage, &Layout),
    (b, lb): (&CpuStorage, &Layout),
    f: impl Fn(f64, f64, f64) -> f64,
) -> Result<()> {
    fn run<D: Elem, A: Elem, B: Elem>(
        d: &mut [D],
        a: &[A],
        b: &[B],
        f: &impl Fn(f64, f64, f64) -> f64,
    ) {
        for ((x, y), z) in d.iter_mut().zip(a).zip(b) {
            *x = D::put(f(x.get(), y.get(), z.get()));
        }
    }
    let (s, e) = range(l, l.shape().elem_count())?;
    let (sa, ea) = range(la, e - s)?;
    let (sb, eb) = range(lb, e - s)?;
    // The parameter's type and its two operands': all alike in practice
    // (a run computes in one dtype); mixed pairs are converted first.
    match (dst, a, b) {
        (CpuStorage::F32(d), CpuStorage::F32(a), CpuStorage::F32(b)) => {
            run(&mut d[s..e], &a[sa..ea], &b[sb..eb], &f)
        }
        (CpuStorage::F64(d), CpuStorage::F64(a), CpuStorage::F64(b)) => {
            run(&mut d[s..e], &a[sa..ea], &b[sb..eb], &f)
        }
        (d, a, b) => {
            let wide = |x: &CpuStorage, lo: usize, hi: usize| -> Result<Vec<f64>> {
                match x {
                    CpuStorage::F32(v) => Ok(v[lo..hi].iter().map(|x| f64::from(*x)).collect()),
                    CpuStorage::F64(v) => Ok(v[lo..hi].to_vec()),
                    _ => Err(err("f32 or f64 expected")),
                }
            };
            let (a, b) = (wide(a, sa, ea)?, wide(b, sb, eb)?);
            match d {
                CpuStorage::F32(d) => run(&mut d[s..e], &a, &b, &f),
                CpuStorage::F64(d) => run(&mut d[s..e], &a, &b, &f),
                _ => return Err(err("f32 or f64 expected")),
            }
        }
    }
    Ok(())
}

impl InplaceOp2 for Pass {
    fn name(&self) -> &'static str {
        "fused-optimizer-step"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<()> {
        match *self {
            Pass::Linear { a, b } => each1(s1, l1, s2, l2, |x, g| a * x + b * g),
            Pass::Square { a, b } => each1(s1, l1, s2, l2, |x, g| a * x + b * g * g),
            Pass::Plain { lr, s } => each1(s1, l1, s2, l2, |x, g| x - lr * s * g),
            _ => Err(err("wrong operand count")),
        }
    }
}

impl InplaceOp3 for Pass {
    fn name(&self) -> &'static str {
        "fused-optimizer-step"
    }

    fn cpu_fwd(
        &self,
        s1: &mut CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<()> {
        let (x2, x3) = ((s2, l2), (s3, l3));
        match *self {
            Pass::Adam {
                lr,
                c1,
                c2,
                eps,
                wd,
            } => {
                // (m/c1)/(√(v/c2) + eps) = m·(√c2/c1)/(√v + eps·√c2): the bias
                // corrections folded into two constants, one f64 division per
                // element instead of three (this pass was a seventh of the
                // 1-device classifier's step). The same arithmetic on every
                // shard.
                let r2 = c2.sqrt();
                let (k, e) = (r2 / c1, eps * r2);
                each2(s1, l1, x2, x3, |p, m, v| {
                    let d = m * k / (v.sqrt() + e) + wd * p;
                    p - lr * d
                })
            }
            Pass::Momentum {
                lr,
                s,
                mu,
                nesterov,
            } => each2(s1, l1, x2, x3, |p, m, g| {
                let d = if nesterov { s * g + mu * m } else { m };
                p - lr * d
            }),
            Pass::Adagrad { lr, s, eps } => each2(s1, l1, x2, x3, |p, g, acc| {
                let g = s * g;
                p - lr * g / (acc.sqrt() + eps)
            }),
            _ => Err(err("wrong operand count")),
        }
    }
}
