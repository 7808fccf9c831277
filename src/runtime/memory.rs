//! What device 0 holds during the first step, measured from its tensors for
//! `run --mem`, in the categories of the plan's per-device memory: the plan
//! predicts each from the program's types, and this reads the same
//! quantities off the tensors the step made.

use super::exec::{bytes, Held, Tape};
use crate::spmd::{Kept, Program};
use candle_core::Tensor;

/// Live bytes on device 0, measured from its tensors during the first step.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Memory {
    pub params: f64,
    pub grads: f64,
    /// The microbatches' running gradient sum (`accumulate` > 1).
    pub grad_sum: f64,
    pub optimizer_state: f64,
    /// Forward values kept for backward (inputs and parameters excluded).
    pub activations: f64,
    /// Parameters gathered for use (FSDP) that the tape keeps for backward,
    /// and those a checkpointed block gathers again.
    pub gathered_params: f64,
    /// Full-size gradients of gathered parameters alive at once in backward,
    /// before their reduce-scatter.
    pub gathered_grads: f64,
    /// Mixed precision: the f32 master weights (`params` are then the 16-bit
    /// working copies the passes use).
    pub master_params: f64,
    /// Backward's cotangents alive at once, at their most (parameters' are
    /// the gradients; gathered parameters' are `gathered_grads`).
    pub cotangents: f64,
    /// On a GPU: what the CUDA driver reported in use when the rest was
    /// measured (the step's peak: the tape and the gradients alive), the
    /// allocator's pool and the context included.
    pub device_in_use: Option<f64>,
}

impl Memory {
    /// What of `total` is parameters and optimizer state, which replicas in
    /// one process may share: the master weights under mixed precision (the
    /// 16-bit working copies are each device's own), else the parameters.
    pub fn state(&self) -> f64 {
        let stored = if self.master_params > 0.0 {
            self.master_params
        } else {
            self.params
        };
        stored + self.optimizer_state
    }
    pub fn total(&self) -> f64 {
        self.params
            + self.grads
            + self.grad_sum
            + self.optimizer_state
            + self.activations
            + self.gathered_params
            + self.gathered_grads
            + self.master_params
            + self.cotangents
    }
}

/// The most bytes a step's passes held beyond the last tape: what a
/// pipeline's microbatches in flight held at once, and what one recomputed
/// checkpointed block held.
#[derive(Clone, Copy, Debug, Default)]
pub struct Peaks {
    /// A pipeline's activations: the most its microbatches' tapes held at once.
    pub activations: f64,
    /// And the most bytes of gathered parameters those tapes held.
    pub gathered: f64,
    /// The most bytes a checkpointed block held while recomputed.
    pub recompute: f64,
}

impl Peaks {
    pub fn max(&mut self, other: Peaks) {
        self.activations = self.activations.max(other.activations);
        self.gathered = self.gathered.max(other.gathered);
        self.recompute = self.recompute.max(other.recompute);
    }
}

/// What the first step held: the tensors in hand after its passes, the last
/// tape, what backward held (`held`) and the passes' peaks.
pub struct Measured<'a> {
    pub prog: &'a Program,
    /// The working parameters, the master weights (the same tensors without
    /// mixed precision) and the reduced gradients.
    pub work: &'a [Tensor],
    pub master: Option<&'a [Tensor]>,
    pub grads: &'a [Tensor],
    pub grad_sum: f64,
    pub optimizer_state: f64,
    pub tape: &'a Tape,
    pub held: Held,
    pub peaks: Peaks,
    pub pipelined: bool,
}

impl Measured<'_> {
    pub fn memory(&self) -> Memory {
        let prog = self.prog;
        let mut m = Memory {
            params: self.work.iter().map(bytes).sum(),
            master_params: self.master.map_or(0.0, |p| p.iter().map(bytes).sum()),
            grads: self.grads.iter().map(bytes).sum(),
            grad_sum: self.grad_sum,
            optimizer_state: self.optimizer_state,
            ..Memory::default()
        };
        for (i, v) in self.tape.vals.iter().enumerate().take(prog.nodes.len()) {
            match prog.kept(i) {
                Kept::Activation => m.activations += bytes(v),
                Kept::Gathered => m.gathered_params += bytes(v),
                Kept::Not => {}
            }
        }
        m.gathered_grads = self.held.unreduced;
        m.cotangents = self.held.cotangents;
        if self.pipelined {
            m.activations = self.peaks.activations;
            m.gathered_params = self.peaks.gathered;
        }
        // One checkpointed block's parameters, gathered again.
        m.gathered_params += self.held.regathered;
        if !self.pipelined {
            // What the checkpoints keep, and one block recomputed.
            m.activations += self.peaks.recompute;
        }
        m
    }
}
