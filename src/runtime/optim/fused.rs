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

fn slice<'a>(s: &'a CpuStorage, l: &Layout, n: usize) -> Result<Slice<'a>> {
    let (a, b) = l
        .contiguous_offsets()
        .filter(|(a, b)| b - a == n)
        .ok_or_else(|| {
            candle_core::Error::Msg("fused step: contiguous operands expected".into())
        })?;
    match s {
        CpuStorage::F32(v) => Ok(Slice::F32(&v[a..b])),
        CpuStorage::F64(v) => Ok(Slice::F64(&v[a..b])),
        _ => Err(candle_core::Error::Msg(
            "fused step: f32 or f64 expected".into(),
        )),
    }
}

enum Slice<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
}

impl Slice<'_> {
    fn at(&self, i: usize) -> f64 {
        match self {
            Slice::F32(v) => f64::from(v[i]),
            Slice::F64(v) => v[i],
        }
    }
}

/// Apply `f(i, old) -> new` to every element of the destination.
fn each(dst: &mut CpuStorage, l: &Layout, f: impl Fn(usize, f64) -> f64) -> Result<()> {
    let (a, b) = l.contiguous_offsets().ok_or_else(|| {
        candle_core::Error::Msg("fused step: contiguous operands expected".into())
    })?;
    match dst {
        CpuStorage::F32(v) => {
            for (i, x) in v[a..b].iter_mut().enumerate() {
                *x = f(i, f64::from(*x)) as f32;
            }
        }
        CpuStorage::F64(v) => {
            for (i, x) in v[a..b].iter_mut().enumerate() {
                *x = f(i, *x);
            }
        }
        _ => {
            return Err(candle_core::Error::Msg(
                "fused step: f32 or f64 expected".into(),
            ))
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
        let g = slice(s2, l2, l1.shape().elem_count())?;
        match *self {
            Pass::Linear { a, b } => each(s1, l1, |i, x| a * x + b * g.at(i)),
            Pass::Square { a, b } => each(s1, l1, |i, x| {
                let gi = g.at(i);
                a * x + b * gi * gi
            }),
            Pass::Plain { lr, s } => each(s1, l1, |i, x| x - lr * s * g.at(i)),
            _ => Err(candle_core::Error::Msg(
                "fused step: wrong operand count".into(),
            )),
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
        let n = l1.shape().elem_count();
        let (x2, x3) = (slice(s2, l2, n)?, slice(s3, l3, n)?);
        match *self {
            Pass::Adam {
                lr,
                c1,
                c2,
                eps,
                wd,
            } => each(s1, l1, |i, p| {
                let d = (x2.at(i) / c1) / ((x3.at(i) / c2).sqrt() + eps) + wd * p;
                p - lr * d
            }),
            Pass::Momentum {
                lr,
                s,
                mu,
                nesterov,
            } => each(s1, l1, |i, p| {
                let m = x2.at(i);
                let d = if nesterov { s * x3.at(i) + mu * m } else { m };
                p - lr * d
            }),
            Pass::Adagrad { lr, s, eps } => each(s1, l1, |i, p| {
                let g = s * x2.at(i);
                p - lr * g / (x3.at(i).sqrt() + eps)
            }),
            _ => Err(candle_core::Error::Msg(
                "fused step: wrong operand count".into(),
            )),
        }
    }
}
