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
use super::profile;
use crate::mesh::Collectives;
use crate::prim::lookup::SparseState;
use crate::prim::{Forward, Grad, Kernel, Primitive};
use crate::spmd::backward::{self, Act, Backward};
use crate::spmd::{Kept, Op, Program};
use crate::types::TType;
use candle_core::{DType, Device, Tensor};
use std::cell::Cell;

/// The runtime's results: a value, or why it stopped ([`Fault`]).
pub type R<T> = std::result::Result<T, Fault>;

pub use crate::fault::Fault;

fn ce(e: candle_core::Error) -> Fault {
    e.into()
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
    /// The program's backward pass, made when first needed and kept while
    /// the program is the same.
    pub bwd: Schedules,
    /// Targets that count in the loss per microbatch of this step (those
    /// not equal to the loss's `ignore_index`, over the whole step, divided
    /// by its microbatches), set before the step's passes; `None` without an
    /// `ignore_index`.
    pub counted: Cell<Option<f64>>,
    /// Each `step_total` node's value per microbatch of this step (its
    /// operand summed over the step's batch, divided by its microbatches),
    /// set before the step's passes; empty: each computes its own.
    pub totals: std::cell::RefCell<Vec<(usize, f64)>>,
}

/// See [`Exec::bwd`].
pub type Schedules = std::rc::Rc<std::cell::OnceCell<Backward>>;

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
    pub masks: Vec<Vec<Tensor>>,
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
            counted: Cell::default(),
            totals: Default::default(),
            bwd: if std::ptr::eq(prog, self.prog) {
                self.bwd.clone()
            } else {
                Schedules::default()
            },
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
            counted: self.counted.get(),
            total: self
                .totals
                .borrow()
                .iter()
                .find(|(n, _)| *n == i)
                .map(|(_, v)| *v),
        }
    }

    /// Global row-major index of each local element of a value of type `t`.
    pub fn global_indices(&self, t: &TType) -> R<Vec<u64>> {
        crate::init::global_indices(self.comm.topo(), self.rank, t, &self.prog.bound)
            .map_err(Fault::Shape)
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
        let saved: Vec<Tensor> = g.saved.iter().map(widen).collect::<R<_>>()?;
        let wg = Grad {
            x: &refs,
            ts: g.ts,
            y: &y,
            out: g.out,
            saved: &saved,
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
    pub fault: Fault,
}

impl OpError {
    pub(super) fn general(fault: Fault) -> OpError {
        OpError { node: None, fault }
    }
}

impl From<OpError> for Fault {
    fn from(e: OpError) -> Fault {
        e.fault
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

    /// A tape holding only the inputs, the targets and the parameters
    /// (every other value empty): what `forward_range` starts from. `inputs`
    /// are the model's inputs, then the targets (when the program has a loss)
    /// and the weights (when its loss function takes them).
    pub fn empty_tape(&self, params: &[Tensor], inputs: &[Tensor]) -> R<Tape> {
        let n = self.prog.nodes.len();
        let empty = Tensor::zeros(0, self.dtype, &self.dev).map_err(ce)?;
        let mut vals = vec![empty; n];
        let model_inputs = self
            .prog
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::Input(_)))
            .count();
        for (i, node) in self.prog.nodes.iter().enumerate() {
            match node.op {
                Op::Input(k) => {
                    if let Some(x) = inputs.get(k) {
                        vals[i] = x.clone();
                    }
                }
                Op::Targets => {
                    if let Some(y) = inputs.get(model_inputs) {
                        vals[i] = y.clone();
                    }
                }
                Op::Weights => {
                    if let Some(w) = inputs.get(model_inputs + 1) {
                        vals[i] = w.clone();
                    }
                }
                Op::Param(p) => vals[i] = params.get(p).cloned().ok_or("missing parameter")?,
                Op::Prim(_) => {}
            }
        }
        Ok(Tape {
            vals,
            masks: vec![Vec::new(); n],
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
        self.forward_nodes(tape, range, dropout_seed, which, None)
    }

    /// [`Exec::forward_where`], profiled as forward (`share` `None`) or, for
    /// a checkpointed block recomputed inside the backward pass, as part of
    /// the backward's input half (`Some(0.0)`: the recompute precedes the
    /// block's input gradient, and a pipeline's timing puts it there).
    fn forward_nodes(
        &self,
        tape: &mut Tape,
        range: std::ops::Range<usize>,
        dropout_seed: Option<u64>,
        which: &dyn Fn(usize) -> bool,
        share: Option<f64>,
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
            let prim = p.get();
            let f = profile::time_node(&self.dev, prim.name(), i, share, || {
                self.run_forward(prim, self.kernel(i, dropout_seed), &args, &types, &node.ty)
            })
            .map_err(|fault| OpError {
                node: Some(i),
                fault,
            })?;
            tape.vals[i] = f.y;
            tape.masks[i] = f.saved;
        }
        Ok(())
    }

    /// Reverse pass from `seed` (a node and its cotangent: the loss's, see
    /// [`Exec::seed`]); returns each parameter's gradient in its stored
    /// layout, still partial over the axes it is replicated on.
    pub fn backward(&self, tape: &Tape, seed: (usize, Tensor)) -> R<Vec<Option<Tensor>>> {
        let mut grads = vec![None; self.prog.params.len()];
        self.backward_range(tape, &[seed], 0..self.prog.nodes.len(), &mut grads)?;
        Ok(grads)
    }

    /// Backward's first cotangent, at the loss (see [`crate::spmd::Seed`]),
    /// whose value `tape` holds: 1, or 1 held as addends over the devices
    /// it is replicated on (not a pipeline's stage axis: only the last stage
    /// computes it).
    pub fn seed(&self, tape: &Tape) -> R<(usize, Tensor)> {
        let o = self
            .prog
            .objective
            .as_ref()
            .ok_or("the program has no loss")?;
        let root = o.root as usize;
        let value = tape.vals.get(root).ok_or("the loss was not computed")?;
        let one = value.ones_like().map_err(ce)?;
        let g = match o.seed {
            crate::spmd::Seed::One => one,
            crate::spmd::Seed::Addends => {
                let stage = self.stage.as_ref().map(|s| s.0.as_str());
                let (_, rep) = self
                    .comm
                    .topo()
                    .replication(&self.prog.nodes[root].ty, stage);
                (one / rep as f64).map_err(ce)?
            }
        };
        Ok((root, g))
    }

    /// The loss a forward pass computed (see [`Exec::seed`]).
    pub fn loss(&self, tape: &Tape) -> R<f64> {
        let o = self
            .prog
            .objective
            .as_ref()
            .ok_or("the program has no loss")?;
        let v = tape.vals.get(o.root as usize).ok_or("no loss")?;
        crate::prim::Kernel::f64s(v)?
            .first()
            .copied()
            .ok_or_else(|| Fault::Numerical("the loss is empty".into()))
    }

    /// The metrics' sums a forward pass computed (none without metrics).
    pub fn metric_sums(&self, tape: &Tape) -> R<Vec<f64>> {
        match self.prog.objective.as_ref().and_then(|o| o.metrics) {
            Some(m) => crate::prim::Kernel::f64s(&tape.vals[m as usize]),
            None => Ok(Vec::new()),
        }
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
            tape.masks[i] = Vec::new();
        }
        Ok(())
    }

    /// Reverse pass over a tape whose checkpointed values were dropped (see
    /// [`Exec::backward_checkpointed_range`]). Returns the gradients and the
    /// most activation bytes one recomputed block held.
    pub fn backward_checkpointed(
        &self,
        tape: &mut Tape,
        seed: (usize, Tensor),
        dropout_seed: Option<u64>,
    ) -> Result<(Vec<Option<Tensor>>, f64), OpError> {
        let n = self.prog.nodes.len();
        let mut grads = vec![None; self.prog.params.len()];
        let (_, peak) =
            self.backward_checkpointed_range(tape, vec![seed], 0..n, &mut grads, dropout_seed)?;
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
                self.forward_nodes(tape, a..b, dropout_seed, &|i| dropped[i], Some(0.0))?;
                // Activations, and the parameters the block gathered again.
                let (mut acts, mut gathered) = (0.0, 0.0);
                for i in (a..b).filter(|i| dropped[*i]) {
                    match self.prog.kept(i) {
                        Kept::Gathered => gathered += bytes(&tape.vals[i]),
                        Kept::Activation => acts += bytes(&tape.vals[i]),
                        Kept::Not => {}
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
        let bwd = self.backward_of();
        self.run_backward(tape, seeds, range, grads, bwd)
    }

    /// Node `i`'s derivative from its cotangent `g`: each wanted operand's
    /// node and its cotangent addend.
    pub(super) fn vjp_at(
        &self,
        tape: &Tape,
        i: usize,
        g: &Tensor,
        wants: &[bool],
    ) -> R<Vec<(usize, Tensor)>> {
        let node = &self.prog.nodes[i];
        let Op::Prim(p) = &node.op else {
            return Ok(Vec::new());
        };
        let x: Vec<&Tensor> = node.args.iter().map(|k| &tape.vals[*k as usize]).collect();
        let ts: Vec<&TType> = node
            .args
            .iter()
            .map(|k| &self.prog.nodes[*k as usize].ty)
            .collect();
        let grad = Grad {
            x: &x,
            ts: &ts,
            y: &tape.vals[i],
            out: &node.ty,
            saved: &tape.masks[i],
            g,
            want: wants,
        };
        let prim = p.get();
        let share = if profile::on() {
            self.weight_share(i, wants)
        } else {
            0.0
        };
        let ds = profile::time_node(&self.dev, prim.name(), i, Some(share), || {
            self.run_vjp(prim, self.kernel(i, None), &grad)
        })?;
        Ok(ds
            .into_iter()
            .enumerate()
            .filter_map(|(k, d)| match (d, node.args.get(k), wants.get(k)) {
                (Some(d), Some(a), Some(true)) => Some((*a as usize, d)),
                _ => None,
            })
            .collect())
    }

    /// The share of node `i`'s wanted operands that are on the weight side
    /// ([`crate::spmd::backward::weight_side`]): how `--profile` splits the
    /// time of a derivative between the backward's two halves.
    fn weight_share(&self, i: usize, wants: &[bool]) -> f64 {
        let weights = &self.backward_of().weights;
        let args = &self.prog.nodes[i].args;
        let (mut all, mut side) = (0usize, 0usize);
        for (k, w) in wants.iter().enumerate() {
            if *w {
                all += 1;
                side += usize::from(
                    args.get(k)
                        .is_some_and(|a| weights.get(*a as usize) == Some(&true)),
                );
            }
        }
        if all == 0 {
            0.0
        } else {
            side as f64 / all as f64
        }
    }

    /// 1 for a node on the weight side, else 0 (see [`Self::weight_share`]).
    pub(super) fn side(&self, a: usize) -> f64 {
        f64::from(u8::from(self.backward_of().weights.get(a) == Some(&true)))
    }

    /// The program's backward pass (see [`Backward::of`]), made once.
    pub(super) fn backward_of(&self) -> &Backward {
        self.bwd.get_or_init(|| Backward::of(self.prog))
    }

    /// Run the actions of `bwd` at nodes in `range`; then measure the
    /// cotangents it held by the one definition the plan counts with
    /// ([`backward::alive`]), with the bytes of the tensors made here.
    fn run_backward(
        &self,
        tape: &Tape,
        seeds: &[(usize, Tensor)],
        range: std::ops::Range<usize>,
        grads: &mut [Option<Tensor>],
        bwd: &Backward,
    ) -> R<Vec<Option<Tensor>>> {
        let n = self.prog.nodes.len();
        let mut ct: Vec<Option<Tensor>> = vec![None; n];
        let mut size = vec![0.0; n];
        for (i, g) in seeds {
            size[*i] = bytes(g);
            ct[*i] = Some(g.clone());
        }
        let add = |slot: &mut Option<Tensor>, g: Tensor| -> R<()> {
            *slot = Some(match slot.take() {
                Some(s) => (s + g).map_err(ce)?,
                None => g,
            });
            Ok(())
        };
        for b in bwd.within(range.clone()) {
            let i = b.node;
            let g = match ct[i].take() {
                Some(g) => g,
                None if b.zero_if_absent => {
                    let z = tape.vals[i].zeros_like().map_err(ce)?;
                    size[i] = bytes(&z);
                    z
                }
                None => continue,
            };
            match &b.act {
                Act::Grad(p) => {
                    profile::time_node(&self.dev, "gradient add", i, Some(1.0), || {
                        add(&mut grads[*p], g)
                    })?
                }
                Act::Vjp { wants } => {
                    for (a, d) in self.vjp_at(tape, i, &g, wants)? {
                        if ct[a].is_none() {
                            size[a] = bytes(&d);
                        }
                        let side = self.side(a);
                        profile::time_node(&self.dev, "cotangent add", i, Some(side), || {
                            add(&mut ct[a], d)
                        })?;
                    }
                }
            }
        }
        let from: Vec<usize> = seeds.iter().map(|s| s.0).collect();
        let a = backward::alive(self.prog, bwd, range, &from, &|i| size[i]);
        let mut g = self.held.get();
        g.unreduced = g.unreduced.max(a.unreduced);
        g.cotangents = g.cotangents.max(a.peak);
        self.held.set(g);
        Ok(ct)
    }
}
