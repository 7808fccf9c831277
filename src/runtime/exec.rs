//! Executing the SPMD program on one device: forward with local tensors, and exact
//! reverse mode on the same program. Each node's kernel and derivative belong to
//! its primitive ([`crate::prim`]); this module runs them in order, keeps what
//! backward needs (the tape), and accumulates cotangents.
//!
//! Cotangents follow the dual of each value's layout: a value split over an
//! axis has a split cotangent; a value replicated over an axis has a cotangent
//! held as addends (one per device, summing to the gradient); a partial value
//! has a replicated cotangent. Parameter gradients are then summed over the
//! axes their parameter is replicated on.
//!
//! Reverse mode visits only the nodes a parameter's gradient passes through
//! ([`Program::on_gradient_path`]): nothing is computed for the data, e.g. the
//! first layer's input cotangent.

use super::precision::is_half;
use crate::mesh::Collectives;
use crate::prim::lookup::SparseState;
use crate::prim::{Forward, Grad, Kernel, Prim, Primitive};
use crate::spmd::{Op, Program};
use crate::types::TType;
use candle_core::{DType, Device, Tensor};
use std::cell::Cell;

pub type R<T> = std::result::Result<T, String>;

fn ce<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

pub struct Exec<'a> {
    pub prog: &'a Program,
    pub comm: &'a dyn Collectives,
    pub rank: usize,
    pub dtype: DType,
    pub dev: Device,
    /// Embedding tables' placement, and this step's dropped ids and touched rows.
    pub sparse: SparseState,
    /// A pipeline's stage axis and, per parameter, the stage holding it.
    pub stage: Option<(String, Vec<Option<usize>>)>,
    /// What backward held beyond the tape and the gradients, measured for `--mem`.
    pub held: Cell<Held>,
}

/// The bytes that only backward holds, at their most: what `--mem` sets
/// beside the plan's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Held {
    /// Cotangents alive at once (those of parameters are the gradients, and
    /// those of gathered parameters `unreduced`): the plan's `cotangents`.
    pub cotangents: f64,
    /// Full-size gradients of gathered parameters alive at once, before their
    /// reduce-scatter.
    pub unreduced: f64,
    /// Parameters a checkpointed block gathered again while recomputed.
    pub regathered: f64,
}

/// A tensor's bytes (what `--mem` counts).
pub(crate) fn bytes(t: &Tensor) -> f64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as f64
}

/// Whether device `rank` holds parameter `p`, given a pipeline's stage axis
/// and each parameter's stage (see [`Exec::holds`]).
pub fn holds_at(
    stage: &Option<(String, Vec<Option<usize>>)>,
    topo: &crate::mesh::Topology,
    rank: usize,
    p: usize,
) -> bool {
    match stage {
        Some((axis, of)) => of
            .get(p)
            .copied()
            .flatten()
            .is_none_or(|s| topo.coord(rank, axis) == s),
        None => true,
    }
}

/// What forward keeps for backward: every node's local value.
pub struct Tape {
    pub vals: Vec<Tensor>,
    /// What a node's forward saved for its derivative (dropout masks), by node.
    pub masks: Vec<Option<Tensor>>,
}

impl<'a> Exec<'a> {
    /// The same device running `prog` (a reloaded program); the per-step state
    /// (kept ids, touched rows) starts empty.
    pub fn with_program<'b>(&self, prog: &'b Program) -> Exec<'b>
    where
        'a: 'b,
    {
        Exec {
            prog,
            comm: self.comm,
            rank: self.rank,
            dtype: self.dtype,
            dev: self.dev.clone(),
            sparse: self.sparse.fresh(),
            stage: self.stage.clone(),
            held: Cell::default(),
        }
    }

    /// Whether this device holds parameter `p` (a pipeline stage holds only its
    /// own layers').
    pub fn holds(&self, p: usize) -> bool {
        holds_at(&self.stage, self.comm.topo(), self.rank, p)
    }

    /// The axes parameter `p` is replicated over among the devices holding it,
    /// and how many copies that makes.
    pub fn replicas(&self, p: usize) -> (Vec<String>, usize) {
        let staged = match &self.stage {
            Some((axis, of)) if of.get(p).copied().flatten().is_some() => Some(axis.as_str()),
            _ => None,
        };
        self.comm
            .topo()
            .replication(&self.prog.params[p].stored, staged)
    }

    /// What node `i`'s kernel sees of this device.
    fn kernel(&self, i: usize, dropout_seed: Option<u64>) -> Kernel<'_> {
        let table =
            self.prog.nodes[i]
                .args
                .first()
                .and_then(|a| match self.prog.nodes[*a as usize].op {
                    Op::Param(p) => Some(p),
                    _ => None,
                });
        Kernel {
            comm: self.comm,
            rank: self.rank,
            dtype: self.dtype,
            dev: &self.dev,
            bound: &self.prog.bound,
            node: i,
            dropout_seed,
            sparse: &self.sparse,
            table,
            stage_axis: self.stage.as_ref().map(|s| s.0.as_str()),
        }
    }

    /// Global row-major index of each local element of a value of type `t`.
    pub fn global_indices(&self, t: &TType) -> R<Vec<u64>> {
        crate::init::global_indices(self.comm.topo(), self.rank, t, &self.prog.bound)
    }
}

/// `t` in f32 when it is a 16-bit float ([`super::precision`]).
fn widen(t: &Tensor) -> R<Tensor> {
    super::precision::widen(t).map_err(ce)
}

impl Exec<'_> {
    /// An op's forward; under mixed precision an accumulating op runs in f32
    /// on widened operands and returns its result in the 16-bit type.
    fn run_forward(
        &self,
        p: &dyn Primitive,
        mut k: Kernel,
        x: &[&Tensor],
        ts: &[&TType],
        out: &TType,
    ) -> R<Forward> {
        if !(is_half(k.dtype) && p.accumulates()) {
            return p.forward(&k, x, ts, out);
        }
        let narrow = k.dtype;
        k.dtype = DType::F32;
        let wide: Vec<Tensor> = x.iter().map(|t| widen(t)).collect::<R<_>>()?;
        let refs: Vec<&Tensor> = wide.iter().collect();
        let f = p.forward(&k, &refs, ts, out)?;
        let y = if f.y.dtype() == DType::F32 {
            f.y.to_dtype(narrow).map_err(ce)?
        } else {
            f.y
        };
        Ok(Forward { y, saved: f.saved })
    }

    /// An op's derivative, widened like its forward (see [`Exec::run_forward`]);
    /// each cotangent returns in its operand's dtype.
    fn run_vjp(&self, p: &dyn Primitive, mut k: Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        if !(is_half(k.dtype) && p.accumulates()) {
            return p.vjp(&k, g);
        }
        k.dtype = DType::F32;
        let wide: Vec<Tensor> = g.x.iter().map(|t| widen(t)).collect::<R<_>>()?;
        let refs: Vec<&Tensor> = wide.iter().collect();
        let (y, ct) = (widen(g.y)?, widen(g.g)?);
        let saved = g.saved.map(widen).transpose()?;
        let wg = Grad {
            x: &refs,
            ts: g.ts,
            y: &y,
            out: g.out,
            saved: saved.as_ref(),
            g: &ct,
            want: g.want,
        };
        let ds = p.vjp(&k, &wg)?;
        ds.into_iter()
            .zip(g.x)
            .map(|(d, x)| match d {
                Some(d) if d.dtype() != x.dtype() && is_half(x.dtype()) => {
                    d.to_dtype(x.dtype()).map(Some).map_err(ce)
                }
                d => Ok(d),
            })
            .collect()
    }
}

/// A forward kernel that failed (an index out of range, a shape the data
/// broke): why, and the node whose op it ran, so the error can point at the
/// op's line in the source.
#[derive(Debug)]
pub struct OpError {
    pub node: Option<usize>,
    pub message: String,
}

impl OpError {
    fn general(message: String) -> OpError {
        OpError {
            node: None,
            message,
        }
    }
}

impl From<OpError> for String {
    fn from(e: OpError) -> String {
        e.message
    }
}

impl Exec<'_> {
    pub fn forward(
        &self,
        params: &[Tensor],
        inputs: &[Tensor],
        dropout_seed: Option<u64>,
    ) -> Result<Tape, OpError> {
        let mut tape = self.empty_tape(params, inputs).map_err(OpError::general)?;
        self.forward_range(&mut tape, 0..self.prog.nodes.len(), dropout_seed)?;
        Ok(tape)
    }

    /// A tape holding only the inputs and parameters (every other value empty):
    /// what `forward_range` starts from.
    pub fn empty_tape(&self, params: &[Tensor], inputs: &[Tensor]) -> R<Tape> {
        let n = self.prog.nodes.len();
        let empty = Tensor::zeros(0, self.dtype, &self.dev).map_err(ce)?;
        let mut vals = vec![empty; n];
        for (i, node) in self.prog.nodes.iter().enumerate() {
            match node.op {
                Op::Input(k) => {
                    if let Some(x) = inputs.get(k) {
                        vals[i] = x.clone();
                    }
                }
                Op::Param(p) => vals[i] = params.get(p).cloned().ok_or("missing parameter")?,
                Op::Prim(_) => {}
            }
        }
        Ok(Tape {
            vals,
            masks: vec![None; n],
        })
    }

    /// Compute the nodes in `range` (a pipeline stage, say), reading earlier values
    /// from the tape.
    pub fn forward_range(
        &self,
        tape: &mut Tape,
        range: std::ops::Range<usize>,
        dropout_seed: Option<u64>,
    ) -> Result<(), OpError> {
        self.forward_where(tape, range, dropout_seed, &|_| true)
    }

    /// [`Exec::forward_range`] over the nodes `which` selects.
    pub fn forward_where(
        &self,
        tape: &mut Tape,
        range: std::ops::Range<usize>,
        dropout_seed: Option<u64>,
        which: &dyn Fn(usize) -> bool,
    ) -> Result<(), OpError> {
        for i in range.filter(|i| which(*i)) {
            let node = &self.prog.nodes[i];
            let Op::Prim(p) = &node.op else { continue };
            let args: Vec<&Tensor> = node.args.iter().map(|k| &tape.vals[*k as usize]).collect();
            let types: Vec<&TType> = node
                .args
                .iter()
                .map(|k| &self.prog.nodes[*k as usize].ty)
                .collect();
            let f = self
                .run_forward(
                    p.get(),
                    self.kernel(i, dropout_seed),
                    &args,
                    &types,
                    &node.ty,
                )
                .map_err(|message| OpError {
                    node: Some(i),
                    message,
                })?;
            tape.vals[i] = f.y;
            tape.masks[i] = f.saved;
        }
        Ok(())
    }

    /// Reverse pass. `ct_out` is the output's cotangent; returns each parameter's
    /// gradient in its stored layout, still partial over the axes it is replicated on.
    pub fn backward(&self, tape: &Tape, ct_out: Tensor) -> R<Vec<Option<Tensor>>> {
        let out = self.prog.output.ok_or("no output")? as usize;
        let mut grads = vec![None; self.prog.params.len()];
        self.backward_range(tape, &[(out, ct_out)], 0..self.prog.nodes.len(), &mut grads)?;
        Ok(grads)
    }

    /// Drop the values `range` computed that checkpointing recomputes for
    /// backward (see [`Program::checkpointed`]).
    pub fn drop_checkpointed(&self, tape: &mut Tape, range: std::ops::Range<usize>) -> R<()> {
        self.drop_where(tape, range, &self.prog.checkpointed())
    }

    /// Drop the values in `range` that `dropped` marks.
    fn drop_where(
        &self,
        tape: &mut Tape,
        range: std::ops::Range<usize>,
        dropped: &[bool],
    ) -> R<()> {
        let empty = Tensor::zeros(0, self.dtype, &self.dev).map_err(ce)?;
        for i in range.filter(|i| dropped.get(*i) == Some(&true)) {
            tape.vals[i] = empty.clone();
            tape.masks[i] = None;
        }
        Ok(())
    }

    /// Reverse pass over a tape whose checkpointed values were dropped (see
    /// [`Exec::backward_checkpointed_range`]). Returns the gradients and the
    /// most activation bytes one recomputed block held.
    pub fn backward_checkpointed(
        &self,
        tape: &mut Tape,
        ct_out: Tensor,
        dropout_seed: Option<u64>,
    ) -> Result<(Vec<Option<Tensor>>, f64), OpError> {
        let n = self.prog.nodes.len();
        let out = self
            .prog
            .output
            .ok_or_else(|| OpError::general("no output".into()))? as usize;
        let mut grads = vec![None; self.prog.params.len()];
        let (_, peak) = self.backward_checkpointed_range(
            tape,
            vec![(out, ct_out)],
            0..n,
            &mut grads,
            dropout_seed,
        )?;
        Ok((grads, peak))
    }

    /// [`Exec::backward_range`] over a tape whose checkpointed values were
    /// dropped: each checkpointed block in `range` is recomputed from what it
    /// reads (with the same dropout seed: the same values, bit for bit) just
    /// before its backward, then dropped again. The nodes are visited in the
    /// same order, and every cotangent adds its terms in the same order, as
    /// one pass would: the gradients are the same bits. Returns the
    /// cotangents of the nodes before `range` and the most activation bytes
    /// one recomputed block held.
    pub fn backward_checkpointed_range(
        &self,
        tape: &mut Tape,
        seeds: Vec<(usize, Tensor)>,
        range: std::ops::Range<usize>,
        grads: &mut [Option<Tensor>],
        dropout_seed: Option<u64>,
    ) -> Result<(Vec<Option<Tensor>>, f64), OpError> {
        let n = self.prog.nodes.len();
        let mut pending: Vec<Option<Tensor>> = vec![None; n];
        for (i, g) in seeds {
            if let Some(p) = pending.get_mut(i) {
                *p = Some(g);
            }
        }
        // The node ranges in order: checkpointed blocks and what lies between.
        let mut parts: Vec<(usize, usize, bool)> = Vec::new();
        let mut at = range.start;
        let mut cks: Vec<(usize, usize)> = self
            .prog
            .checkpoints
            .iter()
            .map(|&(a, b)| (a as usize, b as usize))
            .filter(|(a, b)| *a >= range.start && *b <= range.end)
            .collect();
        cks.sort();
        for (a, b) in cks {
            if a > at {
                parts.push((at, a, false));
            }
            parts.push((a, b, true));
            at = b;
        }
        if at < range.end {
            parts.push((at, range.end, false));
        }
        let dropped = self.prog.checkpointed();
        let mut peak = 0.0f64;
        for (a, b, ck) in parts.into_iter().rev() {
            if ck {
                // Only what was dropped runs again.
                self.forward_where(tape, a..b, dropout_seed, &|i| dropped[i])?;
                // Activations, and the parameters the block gathered again.
                let (mut acts, mut gathered) = (0.0, 0.0);
                for i in (a..b).filter(|i| dropped[*i]) {
                    if self.prog.gathers_copy(i) {
                        gathered += bytes(&tape.vals[i]);
                    } else if !self.prog.gathers_param(i) {
                        acts += bytes(&tape.vals[i]);
                    }
                }
                peak = peak.max(acts);
                let mut g = self.held.get();
                g.regathered = g.regathered.max(gathered);
                self.held.set(g);
            }
            // Every cotangent so far goes in, also those of earlier nodes, so
            // that each one adds its terms in the order a single pass would.
            let seeds: Vec<(usize, Tensor)> = (0..b)
                .filter_map(|i| pending[i].take().map(|g| (i, g)))
                .collect();
            let cts = self
                .backward_range(tape, &seeds, a..b, grads)
                .map_err(OpError::general)?;
            for (i, c) in cts.into_iter().enumerate().take(a) {
                pending[i] = c;
            }
            if ck {
                self.drop_where(tape, a..b, &dropped)
                    .map_err(OpError::general)?;
            }
        }
        Ok((pending, peak))
    }

    /// Reverse mode over the nodes in `range`, from cotangents `seeds` at nodes
    /// in it; parameter gradients add into `grads`. Returns every node's cotangent,
    /// including those of values the range read from before it (a stage's input).
    pub fn backward_range(
        &self,
        tape: &Tape,
        seeds: &[(usize, Tensor)],
        range: std::ops::Range<usize>,
        grads: &mut [Option<Tensor>],
    ) -> R<Vec<Option<Tensor>>> {
        let live = self.prog.on_gradient_path(false);
        self.backward_live(tape, seeds, range, grads, &live)
    }

    /// [`Exec::backward_range`] also through the values that depend on inputs
    /// only: the cotangents of the inputs are what is wanted (a loss
    /// function's, of the model's output).
    pub fn backward_to_inputs(
        &self,
        tape: &Tape,
        seeds: &[(usize, Tensor)],
        range: std::ops::Range<usize>,
    ) -> R<Vec<Option<Tensor>>> {
        let live = self.prog.on_gradient_path(true);
        self.backward_live(tape, seeds, range, &mut [], &live)
    }

    /// Reverse mode over the nodes `live` marks (see
    /// [`Program::on_gradient_path`]); the others get no cotangent.
    fn backward_live(
        &self,
        tape: &Tape,
        seeds: &[(usize, Tensor)],
        range: std::ops::Range<usize>,
        grads: &mut [Option<Tensor>],
        live: &[bool],
    ) -> R<Vec<Option<Tensor>>> {
        let n = self.prog.nodes.len();
        let mut ct: Vec<Option<Tensor>> = vec![None; n];
        // Bytes of gathered parameters' full-size gradients alive, and the most;
        // bytes of the other cotangents but parameters' alive, and the most
        // (the plan's `cotangents`, see `plan::backward`).
        let mut unreduced = 0.0;
        let counted = |i: usize| self.prog.cotangent_counted(i);
        let mut alive = 0.0;
        for (i, g) in seeds {
            if self.prog.gathers_copy(*i) {
                unreduced += bytes(g);
            } else if counted(*i) {
                alive += bytes(g);
            }
            ct[*i] = Some(g.clone());
        }
        let mut most = unreduced;
        let mut most_alive = alive;
        let add = |slot: &mut Option<Tensor>, g: Tensor| -> R<()> {
            *slot = Some(match slot.take() {
                Some(s) => (s + g).map_err(ce)?,
                None => g,
            });
            Ok(())
        };
        for i in range.rev().filter(|i| live.get(*i) == Some(&true)) {
            let node = &self.prog.nodes[i];
            // Collectives must run on every device in the same order, even when a
            // device's cotangent happens to be absent: every op but elementwise
            // arithmetic takes zeros then.
            let taken = ct[i].take();
            let held = match &taken {
                Some(g) if self.prog.gathers_copy(i) => bytes(g),
                _ => 0.0,
            };
            let g = match taken {
                Some(g) => g,
                None if matches!(&node.op, Op::Prim(p) if !matches!(p, Prim::Arith(_))) => {
                    let z = tape.vals[i].zeros_like().map_err(ce)?;
                    if counted(i) {
                        alive += bytes(&z);
                    }
                    z
                }
                None => continue,
            };
            let spent = if counted(i) { bytes(&g) } else { 0.0 };
            match &node.op {
                Op::Input(_) => {}
                Op::Param(p) => add(&mut grads[*p], g)?,
                Op::Prim(p) => {
                    let x: Vec<&Tensor> =
                        node.args.iter().map(|k| &tape.vals[*k as usize]).collect();
                    let ts: Vec<&TType> = node
                        .args
                        .iter()
                        .map(|k| &self.prog.nodes[*k as usize].ty)
                        .collect();
                    let want: Vec<bool> = node
                        .args
                        .iter()
                        .map(|k| live.get(*k as usize) == Some(&true))
                        .collect();
                    let grad = Grad {
                        x: &x,
                        ts: &ts,
                        y: &tape.vals[i],
                        out: &node.ty,
                        saved: tape.masks[i].as_ref(),
                        g: &g,
                        want: &want,
                    };
                    let ds = self.run_vjp(p.get(), self.kernel(i, None), &grad)?;
                    for (k, d) in ds.into_iter().enumerate() {
                        if let (Some(d), Some(a), true) =
                            (d, node.args.get(k), want.get(k) == Some(&true))
                        {
                            let a = *a as usize;
                            if ct[a].is_none() && self.prog.gathers_copy(a) {
                                unreduced += bytes(&d);
                                most = f64::max(most, unreduced);
                            } else if ct[a].is_none() && counted(a) {
                                alive += bytes(&d);
                            }
                            add(&mut ct[a], d)?;
                        }
                    }
                }
            }
            most_alive = f64::max(most_alive, alive);
            // This node's cotangent is spent (reduce-scattered, if gathered).
            unreduced -= held;
            alive -= spent;
        }
        let mut g = self.held.get();
        g.unreduced = g.unreduced.max(most);
        g.cotangents = g.cotangents.max(most_alive);
        self.held.set(g);
        Ok(ct)
    }
}
