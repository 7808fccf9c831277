//! Our own optimizers: their state lives in each parameter's layout, ready for
//! checkpoints. Each kind ([`crate::spec::OptKind`]) is one implementation of
//! [`Rule`], holding its fused in-place step (when it has one) beside the
//! composed one it must agree with; [`OptState`] keeps every parameter's slots
//! and steps them with their own optimizer (an embedding table may have its own).

mod adagrad;
mod adam;
mod ftrl;
pub mod fused;
mod sgd;
mod sum;

pub use sum::GradSum;

use crate::spec::{OptKind, Optimizer};
use candle_core::{DType, Tensor};

pub type R<T> = std::result::Result<T, String>;

pub(crate) fn ce<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// One step of one optimizer kind on one tensor.
pub trait Rule {
    /// The value the second slot starts at (an accumulator), when not zero.
    fn v_init(&self) -> Option<f64> {
        None
    }
    /// Whether a zero gradient leaves the parameter and its slots exactly as
    /// they are (then a table's rows outside this step's mask can take the fused
    /// step: their gradient is zero).
    fn zero_is_still(&self) -> bool {
        false
    }
    /// Whether the fused step can run with these slots.
    fn has_fused(&self, m: Option<&Tensor>, v: Option<&Tensor>) -> bool;
    /// The step in place: `p`, `m` and `v` are written.
    #[allow(clippy::too_many_arguments)]
    fn fused(
        &self,
        lr: f64,
        t: i32,
        p: &Tensor,
        g: &Tensor,
        scale: f64,
        m: Option<&Tensor>,
        v: Option<&Tensor>,
    ) -> R<()>;
    /// The step from the scaled gradient `g`: the update direction `d` (the new
    /// parameter is `p − lr·d`) and the new slots.
    fn composed(
        &self,
        lr: f64,
        t: i32,
        p: &Tensor,
        g: &Tensor,
        m: Option<&Tensor>,
        v: Option<&Tensor>,
    ) -> R<(Tensor, Option<Tensor>, Option<Tensor>)>;
}

/// The implementation of an optimizer kind.
pub fn rule(o: &Optimizer) -> Box<dyn Rule + Send + Sync> {
    match o.kind {
        OptKind::Sgd { momentum, nesterov } => Box::new(sgd::Sgd { momentum, nesterov }),
        OptKind::Adam { b1, b2, eps } => Box::new(adam::Adam {
            b1,
            b2,
            eps,
            weight_decay: None,
        }),
        OptKind::AdamW {
            b1,
            b2,
            eps,
            weight_decay,
        } => Box::new(adam::Adam {
            b1,
            b2,
            eps,
            weight_decay: Some(weight_decay),
        }),
        OptKind::Adagrad {
            initial_accumulator,
            eps,
        } => Box::new(adagrad::Adagrad {
            initial_accumulator,
            eps,
        }),
        OptKind::Ftrl {
            lr_power,
            l1,
            l2,
            initial_accumulator,
        } => Box::new(ftrl::Ftrl {
            lr_power,
            l1,
            l2,
            initial_accumulator,
        }),
        // Never stepped: `OptState::update` skips frozen parameters.
        OptKind::Frozen => Box::new(sgd::Sgd {
            momentum: 0.0,
            nesterov: false,
        }),
    }
}

use super::exec::bytes;

/// Plain contiguous f32/f64 CPU tensors, which the fused kernels step.
fn plain(t: &Tensor) -> bool {
    t.device().is_cpu() && t.is_contiguous() && matches!(t.dtype(), DType::F32 | DType::F64)
}

/// Optimizer state in each parameter's layout; each parameter may have its own
/// optimizer (an embedding table's, for instance).
pub struct OptState {
    pub opts: Vec<Optimizer>,
    pub m: Vec<Option<Tensor>>,
    pub v: Vec<Option<Tensor>>,
    /// The parameter tensors this state has made its own (fused steps write them
    /// in place, so they must not share storage with anything else).
    owned: Vec<Option<candle_core::TensorId>>,
}

impl OptState {
    /// Only the slots each optimizer uses: Adam/AdamW two, momentum SGD and Adagrad one.
    pub fn new(params: &[Tensor], opts: Vec<Optimizer>) -> R<OptState> {
        let mut m = Vec::new();
        let mut v = Vec::new();
        for (p, o) in params.iter().zip(&opts) {
            let (has_m, has_v) = o.slots();
            let a = if has_m {
                Some(p.zeros_like().map_err(ce)?)
            } else {
                None
            };
            let b = match (has_v, rule(o).v_init()) {
                (false, _) => None,
                (true, Some(acc)) => {
                    Some(p.ones_like().and_then(|t| t.affine(acc, 0.0)).map_err(ce)?)
                }
                (true, None) => Some(p.zeros_like().map_err(ce)?),
            };
            m.push(a);
            v.push(b);
        }
        let owned = vec![None; params.len()];
        Ok(OptState { opts, m, v, owned })
    }

    /// Whether parameter `i` steps in place (a fused step on plain tensors):
    /// then replicas may share its tensors, one of them stepping it.
    pub fn in_place(&self, i: usize, p: &Tensor) -> bool {
        let (m, v) = (self.m[i].as_ref(), self.v[i].as_ref());
        self.opts[i].kind != OptKind::Frozen
            && rule(&self.opts[i]).has_fused(m, v)
            && plain(p)
            && m.is_none_or(plain)
            && v.is_none_or(plain)
    }

    /// Step `p`'s storage in place without copying it first: this state
    /// steps it for every replica sharing it.
    pub fn claim(&mut self, i: usize, p: &Tensor) {
        if let Some(o) = self.owned.get_mut(i) {
            *o = Some(p.id());
        }
    }

    /// Faults in, writable, the slots this device steps whole (not those
    /// `leave` marks: another device steps them for it, or a table steps
    /// only the rows it looked up), before the first step reads and writes
    /// them. Fresh slots are zero pages untouched; their first step would
    /// read each page, then write it (a copy-on-write fault with a TLB flush
    /// on every core: on the full GPT-J, a quarter of step 1's 17 s).
    pub fn fault_in(&self, leave: &[bool]) {
        for (i, (m, v)) in self.m.iter().zip(&self.v).enumerate() {
            if leave.get(i) == Some(&true) {
                continue;
            }
            for t in [m, v].into_iter().flatten() {
                let (s, _) = t.storage_and_layout();
                if let candle_core::Storage::Cpu(c) = &*s {
                    let (ptr, len) = match c {
                        candle_core::CpuStorage::F32(v) => (v.as_ptr() as *const u8, v.len() * 4),
                        candle_core::CpuStorage::F64(v) => (v.as_ptr() as *const u8, v.len() * 8),
                        _ => continue,
                    };
                    crate::heap::populate_write(ptr, len);
                }
            }
        }
    }

    pub fn bytes(&self) -> f64 {
        self.m.iter().chain(&self.v).flatten().map(bytes).sum()
    }

    /// One step of every parameter this device holds, with gradients scaled by
    /// `scale` (clipping); a table's rows outside its `masks` keep their values
    /// and slots.
    pub fn update(
        &mut self,
        step: usize,
        params: &mut [Tensor],
        grads: &[Tensor],
        scale: f64,
        masks: &[Option<Tensor>],
        skip: &[bool],
    ) -> R<()> {
        let t = step as i32;
        for i in 0..params.len() {
            // Another replica steps the storage this one shares.
            if skip.get(i) == Some(&true) {
                continue;
            }
            // Another pipeline stage's parameter: not held here.
            if params[i].elem_count() == 0 {
                continue;
            }
            let o = &self.opts[i];
            if o.kind == OptKind::Frozen {
                continue;
            }
            let r = rule(o);
            let lr = o.lr.at(step - 1);
            let unmasked = masks.get(i).is_none_or(Option::is_none);
            let (m, v) = (self.m[i].as_ref(), self.v[i].as_ref());
            let fused_ok = r.has_fused(m, v)
                && plain(&params[i])
                && m.is_none_or(plain)
                && v.is_none_or(plain);
            if (r.zero_is_still() || unmasked) && fused_ok {
                // The parameter is written in place: make sure this state owns it.
                if self.owned.get(i).copied().flatten() != Some(params[i].id()) {
                    params[i] = params[i].copy().map_err(ce)?;
                    if let Some(o) = self.owned.get_mut(i) {
                        *o = Some(params[i].id());
                    }
                }
                let g = if grads[i].is_contiguous() {
                    grads[i].clone()
                } else {
                    grads[i].contiguous().map_err(ce)?
                };
                r.fused(
                    lr,
                    t,
                    &params[i],
                    &g,
                    scale,
                    self.m[i].as_ref(),
                    self.v[i].as_ref(),
                )?;
                continue;
            }
            let before = (params[i].clone(), self.m[i].clone(), self.v[i].clone());
            let p = &params[i];
            // Large tensors are stepped in row blocks, so the optimizer's
            // temporaries stay small (the results are the same bits).
            let rows = p.dims().first().copied().unwrap_or(1);
            let blocks = (p.elem_count() >> 21).clamp(1, rows.max(1));
            let step_one = |p: &Tensor, g: &Tensor, m: Option<&Tensor>, v: Option<&Tensor>| {
                let g = (g * scale).map_err(ce)?;
                let (d, m, v) = r.composed(lr, t, p, &g, m, v)?;
                let p_new = (p - d.affine(lr, 0.0).map_err(ce)?).map_err(ce)?;
                Ok::<_, String>((p_new, m, v))
            };
            let (np, nm, nv) = if blocks <= 1 {
                step_one(p, &grads[i], self.m[i].as_ref(), self.v[i].as_ref())?
            } else {
                let per = rows.div_ceil(blocks);
                let (mut ps, mut ms, mut vs) = (Vec::new(), Vec::new(), Vec::new());
                for start in (0..rows).step_by(per) {
                    let len = per.min(rows - start);
                    let cut = |x: &Tensor| x.narrow(0, start, len).map_err(ce);
                    let mc = self.m[i].as_ref().map(cut).transpose()?;
                    let vc = self.v[i].as_ref().map(cut).transpose()?;
                    let (a, b, c) = step_one(&cut(p)?, &cut(&grads[i])?, mc.as_ref(), vc.as_ref())?;
                    ps.push(a);
                    ms.extend(b);
                    vs.extend(c);
                }
                let cat = |v: Vec<Tensor>| -> R<Option<Tensor>> {
                    if v.is_empty() {
                        Ok(None)
                    } else {
                        Tensor::cat(&v, 0).map(Some).map_err(ce)
                    }
                };
                (cat(ps)?.ok_or("no rows")?, cat(ms)?, cat(vs)?)
            };
            params[i] = np;
            self.m[i] = nm;
            self.v[i] = nv;
            // Rows outside the mask keep their values and optimizer slots.
            if let Some(mask) = masks.get(i).and_then(Option::as_ref) {
                let on = mask
                    .broadcast_as(params[i].shape())
                    .and_then(|m| m.ne(0.0))
                    .map_err(ce)?;
                let blend = |new: &Tensor, old: &Tensor| -> R<Tensor> {
                    on.where_cond(new, old).map_err(ce)
                };
                params[i] = blend(&params[i], &before.0)?;
                if let (Some(new), Some(old)) = (&self.m[i], &before.1) {
                    self.m[i] = Some(blend(new, old)?);
                }
                if let (Some(new), Some(old)) = (&self.v[i], &before.2) {
                    self.v[i] = Some(blend(new, old)?);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
