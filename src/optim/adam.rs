//! Adam and AdamW, as optax: bias-corrected moments, eps outside the square
//! root, and (AdamW) decoupled weight decay. The fused step is one pass over
//! the parameter, both moments and the gradient ([`OnePass`]); the three
//! passes it replaces remain for tensors of mixed element types.

use super::fused::{err, range, Elem, Pass};
use super::{ce, Rule, Slots, Whole, R};
use candle_core::{CpuStorage, InplaceOp1, InplaceOp2, Layout, Tensor};
use std::cell::RefCell;
use std::sync::Mutex;

pub struct Adam {
    pub b1: f64,
    pub b2: f64,
    pub eps: f64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: Option<f64>,
}

impl Adam {
    /// Step `t`'s constants, with the gradient scaled by `s` (clipping).
    pub fn one_pass(&self, lr: f64, t: i32, s: f64) -> OnePass {
        OnePass {
            m: (self.b1, (1.0 - self.b1) * s),
            v: (self.b2, (1.0 - self.b2) * s * s),
            step: Pass::Adam {
                lr,
                c1: 1.0 - self.b1.powi(t),
                c2: 1.0 - self.b2.powi(t),
                eps: self.eps,
                wd: self.weight_decay.unwrap_or(0.0),
            },
        }
    }
}

impl Rule for Adam {
    fn slots(&self) -> Slots {
        Slots {
            m: true,
            v: Some(0.0),
        }
    }

    fn steps_in_place(&self) -> bool {
        true
    }

    fn flops(&self, shape: &[usize]) -> f64 {
        // Both moments, their corrections, the square root, the division,
        // the decay and the step.
        12.0 * shape.iter().map(|d| *d as f64).product::<f64>()
    }

    fn has_fused(&self, m: Option<&Tensor>, v: Option<&Tensor>) -> bool {
        m.is_some() && v.is_some()
    }

    fn fused_on_gpu(&self) -> bool {
        cfg!(feature = "cuda")
    }

    fn fused(
        &self,
        lr: f64,
        t: i32,
        p: &Tensor,
        g: &Tensor,
        s: f64,
        m: Option<&Tensor>,
        v: Option<&Tensor>,
    ) -> R<()> {
        let (Some(m), Some(v)) = (m, v) else {
            return Err("adam without its moments".into());
        };
        let one = self.one_pass(lr, t, s);
        #[cfg(feature = "cuda")]
        if p.device().is_cuda() {
            return on_gpu::step(&one, p, g, m, v).map_err(ce);
        }
        let dt = p.dtype();
        if [g, m, v].iter().all(|x| x.dtype() == dt) && apart(&[p, g, m, v]) {
            one.run(p, g, m, v).map_err(ce)
        } else {
            one.three_passes(p, g, m, v).map_err(ce)
        }
    }

    fn composed(
        &self,
        _lr: f64,
        t: i32,
        p: &Tensor,
        g: &Tensor,
        m: Option<&Tensor>,
        v: Option<&Tensor>,
        _whole: &dyn Whole,
    ) -> R<(Tensor, Option<Tensor>, Option<Tensor>)> {
        let (Some(m), Some(v)) = (m, v) else {
            return Ok((g.clone(), m.cloned(), v.cloned()));
        };
        let (b1, b2) = (self.b1, self.b2);
        let m =
            (m.affine(b1, 0.0).map_err(ce)? + g.affine(1.0 - b1, 0.0).map_err(ce)?).map_err(ce)?;
        let v = (v.affine(b2, 0.0).map_err(ce)?
            + g.sqr().and_then(|s| s.affine(1.0 - b2, 0.0)).map_err(ce)?)
        .map_err(ce)?;
        let mh = m.affine(1.0 / (1.0 - b1.powi(t)), 0.0).map_err(ce)?;
        let vh = v.affine(1.0 / (1.0 - b2.powi(t)), 0.0).map_err(ce)?;
        let mut d = mh
            .div(
                &vh.sqrt()
                    .and_then(|s| s.affine(1.0, self.eps))
                    .map_err(ce)?,
            )
            .map_err(ce)?;
        if let Some(wd) = self.weight_decay {
            d = (d + p.affine(wd, 0.0).map_err(ce)?).map_err(ce)?;
        }
        Ok((d, Some(m), Some(v)))
    }
}

/// Whether no two of these tensors share storage. The one pass holds all
/// four tensors' locks at once, which candle checks only pairwise; tensors
/// that share storage take the three passes, whose ops candle checks.
fn apart(ts: &[&Tensor]) -> bool {
    let at = |t: &Tensor| {
        let (s, _) = t.storage_and_layout();
        &*s as *const candle_core::Storage as usize
    };
    let mut seen: Vec<usize> = ts.iter().map(|t| at(t)).collect();
    seen.sort_unstable();
    seen.windows(2).all(|w| w[0] != w[1])
}

/// Elements per part of the one-pass step shared over the worker pool.
const PART: usize = 1 << 14;

/// One Adam step on one tensor: m ← a·m + b·g, v ← a'·v + b'·g², then p from
/// m and v ([`Pass::Adam`]'s arithmetic).
#[derive(Clone, Copy, Debug)]
pub struct OnePass {
    pub m: (f64, f64),
    pub v: (f64, f64),
    pub step: Pass,
}

/// One fused Adam step's constants: m ← a·m + b·g, v ← c·v + d·g², then
/// p ← p − lr·(m·k/(√v + e) + wd·p), the bias corrections folded into k and e.
#[derive(Clone, Copy)]
pub struct Folded {
    pub a: f64,
    pub b: f64,
    pub c: f64,
    pub d: f64,
    pub k: f64,
    pub e: f64,
    pub wd: f64,
    pub lr: f64,
}

impl OnePass {
    /// The constants of the one-pass step (`None` when this is not Adam's).
    pub fn folded(&self) -> Option<Folded> {
        let Pass::Adam {
            lr,
            c1,
            c2,
            eps,
            wd,
        } = self.step
        else {
            return None;
        };
        let ((a, b), (c, d)) = (self.m, self.v);
        // As Pass::Adam: the bias corrections folded into two constants.
        let r2 = c2.sqrt();
        let (k, e) = (r2 / c1, eps * r2);
        Some(Folded {
            a,
            b,
            c,
            d,
            k,
            e,
            wd,
            lr,
        })
    }

    /// The step as three in-place passes (m, v, then p): any element types.
    pub fn three_passes(
        &self,
        p: &Tensor,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
    ) -> candle_core::Result<()> {
        let ((a, b), (c, d)) = (self.m, self.v);
        m.inplace_op2(g, &Pass::Linear { a, b })?;
        v.inplace_op2(g, &Pass::Square { a: c, b: d })?;
        p.inplace_op3(m, v, &self.step)
    }

    /// The step in one pass, for `p`, `g`, `m`, `v` of one element type, with
    /// the bits of [`Self::three_passes`]: the moments are rounded to their
    /// type and stored before `p` reads them back, as the third pass would.
    /// Reading each element once instead of m, v and g twice: the three passes
    /// were a seventh of the 1-device classifier's device thread.
    ///
    /// candle lends one tensor's storage mutably per in-place op; the three
    /// written here are borrowed by nesting the ops (m's runs v's, v's runs
    /// p's), each lending its storage inward. No locks are taken twice: g is
    /// read once, by the outermost op.
    pub fn run(&self, p: &Tensor, g: &Tensor, m: &Tensor, v: &Tensor) -> candle_core::Result<()> {
        m.inplace_op2(g, &OnM { k: self, p, v })
    }
}

struct OnM<'a> {
    k: &'a OnePass,
    p: &'a Tensor,
    v: &'a Tensor,
}

/// A storage lent by an outer in-place op, with its layout.
type Lent<'a> = (RefCell<&'a mut CpuStorage>, &'a Layout);

struct OnV<'a> {
    k: &'a OnePass,
    p: &'a Tensor,
    m: Lent<'a>,
    g: (&'a CpuStorage, &'a Layout),
}

struct OnP<'a> {
    k: &'a OnePass,
    m: Lent<'a>,
    v: Lent<'a>,
    g: (&'a CpuStorage, &'a Layout),
}

impl InplaceOp2 for OnM<'_> {
    fn name(&self) -> &'static str {
        "adam-step"
    }

    fn cpu_fwd(
        &self,
        m: &mut CpuStorage,
        lm: &Layout,
        g: &CpuStorage,
        lg: &Layout,
    ) -> candle_core::Result<()> {
        self.v.inplace_op1(&OnV {
            k: self.k,
            p: self.p,
            m: (RefCell::new(m), lm),
            g: (g, lg),
        })
    }
}

impl InplaceOp1 for OnV<'_> {
    fn name(&self) -> &'static str {
        "adam-step"
    }

    fn cpu_fwd(&self, v: &mut CpuStorage, lv: &Layout) -> candle_core::Result<()> {
        let mut m = self.m.0.borrow_mut();
        self.p.inplace_op1(&OnP {
            k: self.k,
            m: (RefCell::new(&mut **m), self.m.1),
            v: (RefCell::new(v), lv),
            g: self.g,
        })
    }
}

impl InplaceOp1 for OnP<'_> {
    fn name(&self) -> &'static str {
        "adam-step"
    }

    fn cpu_fwd(&self, p: &mut CpuStorage, lp: &Layout) -> candle_core::Result<()> {
        let Folded {
            a,
            b,
            c,
            d,
            k,
            e,
            wd,
            lr,
        } = self
            .k
            .folded()
            .ok_or_else(|| err("an Adam step expected"))?;
        let n = lp.shape().elem_count();
        let (ps, pe) = range(lp, n)?;
        let (mut m, mut v) = (self.m.0.borrow_mut(), self.v.0.borrow_mut());
        let (ms, me) = range(self.m.1, n)?;
        let (vs, ve) = range(self.v.1, n)?;
        let (gs, ge) = range(self.g.1, n)?;
        fn run<T: Elem + Send + Sync>(
            p: &mut [T],
            m: &mut [T],
            v: &mut [T],
            g: &[T],
            f: impl Fn(f64, &mut T, &mut T, f64) -> f64 + Sync,
        ) {
            let each = |p: &mut [T], m: &mut [T], v: &mut [T], g: &[T]| {
                for (((p, m), v), g) in p.iter_mut().zip(m).zip(v).zip(g) {
                    *p = T::put(f(p.get(), m, v, g.get()));
                }
            };
            // Elementwise: shared over the worker pool in parts, the same
            // bits as one pass.
            let n = p.len().min(m.len()).min(v.len()).min(g.len());
            let parts = crate::pool::ranges(n, 1, PART).len();
            if parts <= 1 {
                return each(p, m, v, g);
            }
            let c = n.div_ceil(parts);
            let parts: Vec<_> = p[..n]
                .chunks_mut(c)
                .zip(m[..n].chunks_mut(c))
                .zip(v[..n].chunks_mut(c))
                .zip(g[..n].chunks(c))
                .map(|(((p, m), v), g)| Mutex::new((p, m, v, g)))
                .collect();
            crate::pool::run(parts.len(), &|k| {
                if let Some(Ok(mut part)) = parts.get(k).map(Mutex::lock) {
                    let (p, m, v, g) = &mut *part;
                    each(p, m, v, g);
                }
            });
        }
        // Each line is one pass's: Linear, Square, then Adam on the stored moments.
        macro_rules! step {
            ($t:ty) => {
                |p: f64, m: &mut $t, v: &mut $t, g: f64| {
                    *m = <$t>::put(a * m.get() + b * g);
                    *v = <$t>::put(c * v.get() + d * g * g);
                    let dp = m.get() * k / (v.get().sqrt() + e) + wd * p;
                    p - lr * dp
                }
            };
        }
        match (p, &mut **m, &mut **v, self.g.0) {
            (CpuStorage::F32(p), CpuStorage::F32(m), CpuStorage::F32(v), CpuStorage::F32(g)) => {
                run(
                    &mut p[ps..pe],
                    &mut m[ms..me],
                    &mut v[vs..ve],
                    &g[gs..ge],
                    step!(f32),
                )
            }
            (CpuStorage::F64(p), CpuStorage::F64(m), CpuStorage::F64(v), CpuStorage::F64(g)) => {
                run(
                    &mut p[ps..pe],
                    &mut m[ms..me],
                    &mut v[vs..ve],
                    &g[gs..ge],
                    step!(f64),
                )
            }
            _ => return Err(err("one element type (f32 or f64) expected")),
        }
        Ok(())
    }
}

/// The step on a GPU (`adam.cu`): one pass over contiguous f32 tensors, in
/// place, with the CPU pass's arithmetic.
#[cfg(feature = "cuda")]
mod on_gpu {
    use super::{Folded, OnePass};
    use crate::prim::gpu::{cuda, module, slice};
    use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
    use candle_core::cuda_backend::WrapErr;
    use candle_core::{Result, Tensor};

    pub(super) fn step(
        one: &OnePass,
        p: &Tensor,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
    ) -> Result<()> {
        let Folded {
            a,
            b,
            c,
            d,
            k,
            e,
            wd,
            lr,
        } = one
            .folded()
            .ok_or_else(|| candle_core::Error::Msg("an Adam step expected".into()))?;
        let n = p.elem_count();
        if [g, m, v].iter().any(|t| t.elem_count() != n) {
            return Err(candle_core::Error::Msg(
                "Adam's tensors differ in size".into(),
            ));
        }
        let dev = cuda(p).ok_or_else(|| candle_core::Error::Msg("not on a GPU".into()))?;
        let g = g.contiguous()?;
        let k_ = module("adam", include_str!("adam.cu"), "")?;
        let f = dev.get_or_load_custom_func("adam_step", &k_.name, &k_.ptx)?;
        let (sp, sm, sv, sg) = (slice(p), slice(m), slice(v), slice(&g));
        let (vp, vm, vv, vg) = (
            sp.view::<f32>()?,
            sm.view::<f32>()?,
            sv.view::<f32>()?,
            sg.view::<f32>()?,
        );
        let nn = n as i64;
        let mut l = f.builder();
        l.arg(&vp).arg(&vm).arg(&vv).arg(&vg).arg(&nn);
        l.arg(&a)
            .arg(&b)
            .arg(&c)
            .arg(&d)
            .arg(&k)
            .arg(&e)
            .arg(&wd)
            .arg(&lr);
        let cfg = crate::prim::gpu::elementwise(n);
        // SAFETY: writes p, m and v in place, n elements each: the optimizer
        // state owns them (`OptState::fused` copies a parameter it does not
        // own first, as for the CPU's in-place step); reads n of g.
        unsafe { l.launch(cfg) }.w()?;
        Ok(())
    }
}
