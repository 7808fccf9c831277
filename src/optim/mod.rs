//! Stage 5 (ir): the optimizers, one module each. A module holds everything
//! about its optimizer that the rest of shardc asks: the slots it keeps per
//! parameter (in the parameter's layout), whether its step runs in place,
//! its FLOPs per step for `shardc plan`, whether it needs the whole matrix
//! (Muon: the step program gathers a split weight's update first), and the
//! step itself — composed of candle ops, which run on any device, and where
//! it has one a fused in-place CPU kernel that must agree with it. The names
//! and hyperparameters a source writes are the registry's
//! ([`crate::vocab::optim`]); the typed value is [`crate::spec::OptKind`].
//! The runtime keeps the slots and calls [`Rule`]s (`runtime::optim`); the
//! step program ([`crate::step`]) and the plan read the rest from here.

mod adagrad;
mod adam;
mod ftrl;
pub mod fused;
mod lion;
pub mod muon;
mod sgd;

use crate::spec::{OptKind, Optimizer};
use candle_core::{DType, Tensor};

pub type R<T> = std::result::Result<T, crate::fault::Fault>;

pub(crate) fn ce(e: candle_core::Error) -> crate::fault::Fault {
    e.into()
}

/// The state an optimizer keeps per parameter, each slot in the
/// parameter's layout: a first slot `m` (a momentum, a first moment, FTRL's
/// linear term) and a second `v` (a second moment, an accumulator) with the
/// value it starts at.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Slots {
    pub m: bool,
    pub v: Option<f64>,
}

impl Slots {
    pub fn count(self) -> usize {
        usize::from(self.m) + usize::from(self.v.is_some())
    }
    /// The slots' names, for `shardc lower`.
    pub fn names(self) -> Vec<&'static str> {
        [(self.m, "m"), (self.v.is_some(), "v")]
            .into_iter()
            .filter(|x| x.0)
            .map(|x| x.1)
            .collect()
    }
}

/// The whole matrix an update needs, from this device's piece, and the
/// piece back: gathered over the mesh axes a parameter is split on (see
/// [`Rule::whole_matrix`]).
pub trait Whole {
    fn gather(&self, t: &Tensor) -> R<Tensor>;
    fn piece(&self, t: &Tensor) -> R<Tensor>;
}

/// A parameter held whole on this device: its piece is the matrix.
pub struct Local;

impl Whole for Local {
    fn gather(&self, t: &Tensor) -> R<Tensor> {
        Ok(t.clone())
    }
    fn piece(&self, t: &Tensor) -> R<Tensor> {
        Ok(t.clone())
    }
}

/// One optimizer's step on one parameter piece.
pub trait Rule {
    /// The slots it keeps.
    fn slots(&self) -> Slots;
    /// Whether its step writes the parameter and its slots in place (a fused
    /// kernel): replicas of a piece in one process may then share them, one
    /// stepping for all (the plan counts them once per process).
    fn steps_in_place(&self) -> bool {
        false
    }
    /// Whether a zero gradient leaves the parameter and its slots exactly as
    /// they are (then a table's rows outside this step's mask can take the fused
    /// step: their gradient is zero).
    fn zero_is_still(&self) -> bool {
        false
    }
    /// Whether the update needs the whole matrix of a parameter split over
    /// the mesh (gathered, then each device keeps its piece).
    fn whole_matrix(&self) -> bool {
        false
    }
    /// Whether the fused step can run with these slots.
    fn has_fused(&self, m: Option<&Tensor>, v: Option<&Tensor>) -> bool {
        let _ = (m, v);
        false
    }
    /// Whether [`Rule::fused`] also runs on a GPU (contiguous f32 tensors
    /// on a CUDA device; a build with `--features cuda`).
    fn fused_on_gpu(&self) -> bool {
        false
    }
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
    ) -> R<()> {
        let _ = (lr, t, p, g, scale, m, v);
        Err("this optimizer has no fused step".into())
    }
    /// The step from the scaled gradient `g`: the update direction `d` (the new
    /// parameter is `p − lr·d`) and the new slots. `whole` gives the whole
    /// matrix where [`Rule::whole_matrix`] asks for it.
    #[allow(clippy::too_many_arguments)]
    fn composed(
        &self,
        lr: f64,
        t: i32,
        p: &Tensor,
        g: &Tensor,
        m: Option<&Tensor>,
        v: Option<&Tensor>,
        whole: &dyn Whole,
    ) -> R<(Tensor, Option<Tensor>, Option<Tensor>)>;
    /// FLOPs of one step of a parameter of this shape (its piece, or the
    /// whole matrix where the update needs it).
    fn flops(&self, shape: &[usize]) -> f64;
}

/// The implementation of an optimizer.
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
        OptKind::Lion {
            b1,
            b2,
            weight_decay,
        } => Box::new(lion::Lion {
            b1,
            b2,
            weight_decay,
        }),
        OptKind::Muon {
            momentum,
            nesterov,
            ns_steps,
            weight_decay,
            ..
        } => Box::new(muon::Muon {
            momentum,
            nesterov,
            ns_steps,
            weight_decay,
        }),
        OptKind::Frozen => Box::new(Frozen),
    }
}

/// A frozen parameter's optimizer: no state, never stepped (the runtime
/// skips frozen parameters).
struct Frozen;

impl Rule for Frozen {
    fn slots(&self) -> Slots {
        Slots::default()
    }
    fn composed(
        &self,
        _lr: f64,
        _t: i32,
        _p: &Tensor,
        _g: &Tensor,
        _m: Option<&Tensor>,
        _v: Option<&Tensor>,
        _whole: &dyn Whole,
    ) -> R<(Tensor, Option<Tensor>, Option<Tensor>)> {
        Err("a frozen parameter takes no step".into())
    }
    fn flops(&self, _shape: &[usize]) -> f64 {
        0.0
    }
}

/// Plain contiguous f32/f64 CPU tensors, which the fused kernels step (when
/// shardc's own kernels are on: [`crate::kernels`]).
pub fn plain(t: &Tensor) -> bool {
    crate::kernels::own()
        && t.device().is_cpu()
        && t.is_contiguous()
        && matches!(t.dtype(), DType::F32 | DType::F64)
}

/// Whether a GPU's fused step takes `t`: contiguous f32 on a CUDA device,
/// shardc's own kernels on, in a build with `--features cuda`.
pub fn plain_on_gpu(t: &Tensor) -> bool {
    cfg!(feature = "cuda")
        && crate::kernels::own()
        && t.device().is_cuda()
        && t.is_contiguous()
        && t.dtype() == DType::F32
}

#[cfg(test)]
mod tests;
