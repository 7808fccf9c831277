//! The optimizers' state on one device: every parameter's slots in its
//! layout, ready for checkpoints, stepped by the parameter's own optimizer
//! ([`crate::optim`]: an embedding table may have its own). A step is the
//! optimizer's fused in-place kernel where it has one and the tensors are
//! plain CPU ones, else its composed candle ops.

mod sum;

pub use sum::GradSum;

use super::exec::bytes;
use crate::optim::{plain, plain_on_gpu, rule, Local, Whole};
use crate::spec::{OptKind, Optimizer};
use candle_core::Tensor;

pub type R<T> = std::result::Result<T, crate::fault::Fault>;

pub(crate) fn ce(e: candle_core::Error) -> crate::fault::Fault {
    e.into()
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

/// Whether the rule's fused step takes these tensors where they are: plain
/// CPU tensors, or (for a rule with a GPU kernel) contiguous f32 on a GPU.
fn fused_here(
    r: &dyn crate::optim::Rule,
    p: &Tensor,
    m: Option<&Tensor>,
    v: Option<&Tensor>,
) -> bool {
    let cpu = plain(p) && m.is_none_or(plain) && v.is_none_or(plain);
    let gpu = r.fused_on_gpu()
        && plain_on_gpu(p)
        && m.is_none_or(plain_on_gpu)
        && v.is_none_or(plain_on_gpu);
    r.has_fused(m, v) && (cpu || gpu)
}

impl OptState {
    /// Only the slots each optimizer uses: Adam/AdamW two, momentum SGD and Adagrad one.
    pub fn new(params: &[Tensor], opts: Vec<Optimizer>) -> R<OptState> {
        let mut m = Vec::new();
        let mut v = Vec::new();
        for (p, o) in params.iter().zip(&opts) {
            let slots = rule(o).slots();
            let a = if slots.m {
                Some(p.zeros_like().map_err(ce)?)
            } else {
                None
            };
            let b = match slots.v {
                None => None,
                Some(0.0) => Some(p.zeros_like().map_err(ce)?),
                Some(acc) => Some(p.ones_like().and_then(|t| t.affine(acc, 0.0)).map_err(ce)?),
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
        self.opts[i].kind != OptKind::Frozen && fused_here(&*rule(&self.opts[i]), p, m, v)
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
    /// and slots. `whole(i)` gives parameter `i`'s whole matrix where its
    /// optimizer needs it and the parameter is split (Muon).
    #[allow(clippy::too_many_arguments)]
    pub fn update<'w>(
        &mut self,
        step: usize,
        params: &mut [Tensor],
        grads: &[Tensor],
        scale: f64,
        masks: &[Option<Tensor>],
        skip: &[bool],
        whole: &dyn Fn(usize) -> Option<Box<dyn Whole + 'w>>,
    ) -> R<()> {
        for i in 0..params.len() {
            // Another replica steps the storage this one shares; another
            // pipeline stage's parameter is not held here.
            if skip.get(i) == Some(&true) || params[i].elem_count() == 0 {
                continue;
            }
            if self.opts[i].kind == OptKind::Frozen {
                continue;
            }
            let r = rule(&self.opts[i]);
            let unmasked = masks.get(i).is_none_or(Option::is_none);
            let (m, v) = (self.m[i].as_ref(), self.v[i].as_ref());
            let fused_ok = fused_here(&*r, &params[i], m, v);
            if (r.zero_is_still() || unmasked) && fused_ok {
                self.fused(i, step, &mut params[i], &grads[i], scale)?;
                continue;
            }
            let before = (params[i].clone(), self.m[i].clone(), self.v[i].clone());
            let w = if r.whole_matrix() { whole(i) } else { None };
            let (np, nm, nv) =
                self.composed(i, step, &params[i], &grads[i], scale, w.as_deref())?;
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

    /// Parameter `i`'s fused step, in place.
    fn fused(&mut self, i: usize, step: usize, p: &mut Tensor, g: &Tensor, scale: f64) -> R<()> {
        let o = &self.opts[i];
        // The parameter is written in place: make sure this state owns it.
        if self.owned.get(i).copied().flatten() != Some(p.id()) {
            *p = p.copy().map_err(ce)?;
            if let Some(o) = self.owned.get_mut(i) {
                *o = Some(p.id());
            }
        }
        let g = if g.is_contiguous() {
            g.clone()
        } else {
            g.contiguous().map_err(ce)?
        };
        rule(o).fused(
            o.lr_at(step - 1),
            step as i32,
            p,
            &g,
            scale,
            self.m[i].as_ref(),
            self.v[i].as_ref(),
        )
    }

    /// Parameter `i`'s composed step: the new parameter and slots. Large
    /// tensors are stepped in row blocks, so the optimizer's temporaries
    /// stay small (the results are the same bits); an update of the whole
    /// matrix is one block.
    #[allow(clippy::type_complexity)]
    fn composed(
        &self,
        i: usize,
        step: usize,
        p: &Tensor,
        g: &Tensor,
        scale: f64,
        whole: Option<&dyn Whole>,
    ) -> R<(Tensor, Option<Tensor>, Option<Tensor>)> {
        let o = &self.opts[i];
        let r = rule(o);
        let (lr, t) = (o.lr_at(step - 1), step as i32);
        let step_one = |p: &Tensor, g: &Tensor, m: Option<&Tensor>, v: Option<&Tensor>| {
            let g = (g * scale).map_err(ce)?;
            let (d, m, v) = r.composed(lr, t, p, &g, m, v, whole.unwrap_or(&Local))?;
            let p_new = (p - d.affine(lr, 0.0).map_err(ce)?).map_err(ce)?;
            Ok::<_, crate::fault::Fault>((p_new, m, v))
        };
        let rows = p.dims().first().copied().unwrap_or(1);
        let blocks = if r.whole_matrix() {
            1
        } else {
            (p.elem_count() >> 21).clamp(1, rows.max(1))
        };
        if blocks <= 1 {
            return step_one(p, g, self.m[i].as_ref(), self.v[i].as_ref());
        }
        let per = rows.div_ceil(blocks);
        let (mut ps, mut ms, mut vs) = (Vec::new(), Vec::new(), Vec::new());
        for start in (0..rows).step_by(per) {
            let len = per.min(rows - start);
            let cut = |x: &Tensor| x.narrow(0, start, len).map_err(ce);
            let mc = self.m[i].as_ref().map(cut).transpose()?;
            let vc = self.v[i].as_ref().map(cut).transpose()?;
            let (a, b, c) = step_one(&cut(p)?, &cut(g)?, mc.as_ref(), vc.as_ref())?;
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
        Ok((cat(ps)?.ok_or("no rows")?, cat(ms)?, cat(vs)?))
    }
}

#[cfg(test)]
mod tests;
