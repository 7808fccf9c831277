//! The training loop on every device: forward, the loss, backward, gradient
//! synchronisation, clipping, the optimizer step, checkpoints and eval, on the
//! devices a [`Cluster`] gives this process.

pub use super::config::Config;
use super::data::{Batch, Source};
use super::exec::{bytes, Exec, R};
use super::loss::loss_fn;
use super::mesh::{Cluster, InProcess};
use super::optim::{GradSum, OptState};
use crate::ast::DType as SDType;
use crate::init;
use crate::mesh::{Collectives, Topology};
use crate::spmd::{Op, Program};
use crate::types::TType;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::sync::{mpsc, Arc};

fn ce<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

/// Per-step results, reported by device 0.
#[derive(Clone, Debug)]
pub struct StepReport {
    pub step: usize,
    /// What SparseCore input processing and FDO did at this step.
    pub notes: Vec<String>,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    /// Mean loss on held-out batches, on the steps `eval` asks for.
    pub eval_loss: Option<f64>,
    /// The step's metrics (`metrics:` in the `train`), over its whole batch.
    pub metrics: Vec<(crate::spec::Metric, f64)>,
    /// Added loss terms and observed values by name (`add_loss`, `observe`),
    /// summed over nodes of one name, averaged over microbatches.
    pub observed: Observed,
    /// When device 0 finished the step (step times are taken from these, not
    /// from when the report reached the thread that prints it).
    pub done: std::time::Instant,
}

/// Named global arrays (parameter name → row-major values).
pub type Named = Vec<(String, Vec<f64>)>;

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

pub struct RunOutput {
    pub memory: Option<Memory>,
    /// The parameters and optimizer state of every device of this process
    /// after the first step, a tensor replicas share counted once.
    pub state_here: Option<f64>,
    pub losses: Vec<f64>,
    /// Gradients at the first step, gathered to global arrays, when asked for.
    pub first_grads: Option<Named>,
}

/// Local piece of a global array (row-major `values`) for a value of type `t`.
pub(crate) fn local_piece(
    topo: &Topology,
    rank: usize,
    t: &TType,
    prog: &Program,
    values: &[f64],
    dtype: DType,
    dev: &Device,
) -> R<Tensor> {
    // Split along the first dimension only (a batch), or not at all: the
    // piece is one contiguous run of the global array.
    if t.dims.iter().skip(1).all(|d| d.axes.is_empty()) {
        let shape: Vec<usize> = prog.local_shape(t)?.iter().map(|x| *x as usize).collect();
        let len: usize = shape.iter().product();
        let first = t
            .dims
            .first()
            .map_or((0, 1), |d| topo.shard_index(rank, &d.axes));
        let start = first.0 * len;
        if let Some(run) = values.get(start..start + len) {
            return piece_tensor(run.to_vec(), t, shape, dtype, dev);
        }
    }
    let idx = init::global_indices(topo, rank, t, &prog.bound)?;
    local_piece_at(&idx, t, prog, values, dtype, dev)
}

/// Global element indices of a parameter's local piece: a table's rows in its
/// SparseCore placement, anything else by its layout.
fn param_indices(
    topo: &Topology,
    rank: usize,
    p: &crate::spmd::Param,
    pl: Option<&super::sparse::Placement>,
    prog: &Program,
) -> R<Vec<u64>> {
    let Some(pl) = pl else {
        return init::global_indices(topo, rank, &p.stored, &prog.bound);
    };
    let shape = prog.local_shape(&p.stored)?;
    let (rows, d) = (
        shape[0] as usize,
        shape.get(1).copied().unwrap_or(1) as usize,
    );
    let owner = topo.shard_index(rank, &p.stored.dims[0].axes).0;
    let mut idx = Vec::with_capacity(rows * d);
    for r in 0..rows {
        let id = pl.id_at(owner, r);
        idx.extend((0..d as u64).map(|c| id * d as u64 + c));
    }
    Ok(idx)
}

/// The local piece at the given global indices.
fn local_piece_at(
    idx: &[u64],
    t: &TType,
    prog: &Program,
    values: &[f64],
    dtype: DType,
    dev: &Device,
) -> R<Tensor> {
    let v: Vec<f64> = idx
        .iter()
        .map(|i| values.get(*i as usize).copied().unwrap_or(0.0))
        .collect();
    let shape: Vec<usize> = prog.local_shape(t)?.iter().map(|x| *x as usize).collect();
    piece_tensor(v, t, shape, dtype, dev)
}

/// A local piece's values as a tensor of `t`'s kind: integers as i64, floats
/// in `dtype`.
fn piece_tensor(
    v: Vec<f64>,
    t: &TType,
    shape: Vec<usize>,
    dtype: DType,
    dev: &Device,
) -> R<Tensor> {
    if matches!(t.dtype, SDType::I32 | SDType::I64) {
        let iv: Vec<i64> = v.iter().map(|x| *x as i64).collect();
        return Tensor::from_vec(iv, shape, dev).map_err(ce);
    }
    Tensor::from_vec(v, shape, dev)
        .and_then(|t| t.to_dtype(dtype))
        .map_err(ce)
}

/// Why a run stopped, as data; the command line renders it (pointing at the op's
/// source line, or at the table's declaration).
#[derive(Clone, Debug, Default)]
pub struct RunError {
    pub message: String,
    /// Every device stopped at this step (1-based) together, from a check they
    /// all make on the same values (a non-finite loss, a table's limit): no
    /// device waits for another, and one report says it all.
    pub step: Option<usize>,
    /// The node of the first non-finite value, and the reload whose program it
    /// belongs to (0: the program the run started with).
    pub node: Option<(usize, usize)>,
    /// The table whose limit the step exceeded.
    pub table: Option<String>,
}

impl From<String> for RunError {
    fn from(message: String) -> RunError {
        RunError {
            message,
            ..RunError::default()
        }
    }
}

impl RunError {
    /// A kernel's failure in the program of reload `generation`, pointing at its op.
    pub fn op(e: super::exec::OpError, generation: usize) -> RunError {
        RunError {
            message: e.message,
            node: e.node.map(|i| (i, generation)),
            ..RunError::default()
        }
    }
}

impl From<&str> for RunError {
    fn from(message: &str) -> RunError {
        message.to_string().into()
    }
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A non-finite loss at `step` (0-based), which every device sees at once: the
/// first non-finite value of the tape, if any, names the op to blame.
fn non_finite(step: usize, loss: f64, vals: &[Tensor], generation: usize) -> RunError {
    let first = vals.iter().position(|v| !all_finite(v));
    RunError {
        message: match first {
            Some(_) => format!("step {}: the loss is {loss}; the first non-finite value is computed by the op below", step + 1),
            None => format!("step {}: the loss is {loss} (the logits are finite; the labels may be out of range)", step + 1),
        },
        step: Some(step + 1),
        node: first.map(|i| (i, generation)),
        table: None,
    }
}

/// Train `prog` for `cfg.steps` steps on a virtual mesh; `on_step` sees each step.
pub fn run(
    prog: &Program,
    cfg: &Config,
    src: &Source,
    want_grads: bool,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<RunOutput, RunError> {
    run_on(&InProcess, prog, cfg, src, want_grads, None, on_step)
}

/// Train on the devices `cluster` gives this process. Step reports, the memory
/// figures and gathered gradients come from device 0: only the process that runs
/// it sees them. With `reloads`, edits published there replace the program (and
/// the optimizers' hyperparameters) from the step the devices agree on.
pub fn run_on(
    cluster: &dyn Cluster,
    prog: &Program,
    cfg: &Config,
    src: &Source,
    want_grads: bool,
    reloads: Option<&super::reload::Reloads>,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<RunOutput, RunError> {
    let topo = Topology::of(&prog.mesh);
    let comm = cluster.connect(&topo)?;
    let comm: &dyn Collectives = comm.as_ref();
    let local_ranks = cluster.local_ranks(&topo);
    let out_id = prog.output.ok_or("the model has no output")? as usize;
    let out_t = prog.nodes[out_id].ty.clone();
    if !out_t.pending.is_empty() {
        return Err("the model's output still owes a reduction".into());
    }
    let inputs: Vec<TType> = prog
        .nodes
        .iter()
        .filter_map(|n| {
            if let Op::Input(_) = n.op {
                Some(n.ty.clone())
            } else {
                None
            }
        })
        .collect();
    let input_sizes: Vec<usize> = inputs
        .iter()
        .map(|t| {
            prog.local_shape(t)
                .map(|v| v.iter().product::<i64>() as usize)
                .unwrap_or(0)
                * t.dims
                    .iter()
                    .map(|d| d.axes.iter().map(|a| topo.size(a)).product::<usize>())
                    .product::<usize>()
        })
        .collect();
    let vocab = out_t
        .dims
        .last()
        .and_then(|d| d.size.as_const())
        .unwrap_or(1) as usize;
    // Class ids shaped like the output without its class dimension, targets
    // shaped like the output, or the loss function's targets.
    let label_t = prog
        .targets(cfg.loss)
        .ok_or("the program has no output or loss function to train")?
        .ty;
    let rows: usize = label_t
        .dims
        .iter()
        .map(|d| {
            d.size
                .substitute(&prog.bound)
                .and_then(|p| p.as_const())
                .unwrap_or(1) as usize
        })
        .product();
    let per_position = label_t.rank() > 1;
    let int_inputs: Vec<bool> = inputs.iter().map(|t| !t.dtype.is_float()).collect();
    // A pipelined program is lowered per microbatch: a step is `accumulate` chunks
    // of M microbatches.
    let stages = super::pipeline::Stages::of(prog)?;
    let stages = &stages;
    let k = cfg.accumulate.max(1) * stages.as_ref().map_or(1, |s| s.microbatches);
    let micro_sizes = input_sizes.clone();
    let input_sizes: Vec<usize> = input_sizes.iter().map(|n| n * k).collect();
    // A step's global batch is a function of the seed and the step, formed when
    // the devices get there (see `StepBatches`).
    let batch_at = |s: usize| -> Batch {
        src.batch(
            cfg.seed,
            s,
            cfg.batch,
            &input_sizes,
            &int_inputs,
            vocab,
            rows * k,
            per_position,
            false,
        )
    };
    let batch_at = &batch_at;
    let step_batches = StepBatches {
        make: batch_at,
        takers: local_ranks.len(),
        same: src.same_every_step(),
        slots: Default::default(),
    };
    let step_batches = &step_batches;
    let placements = super::sparse::placements(prog, &cfg.sparse);
    let placements = &placements;
    // Computed initial values (buffers), whole, once for every device.
    let computed = super::buffers::computed(prog)?;
    let computed = &computed;
    // SparseCore input statistics, limits and FDO, ahead of the devices.
    let host = super::sparse::Host {
        process: cluster.process().0,
        processes: cluster.process().1,
        barrier: &|| cluster.host_barrier(),
    };
    let last: std::cell::RefCell<Option<(usize, Batch)>> = Default::default();
    let sparse =
        super::sparse::plan_steps(&cfg.sparse, cfg.steps, cfg.start_step, &host, &|st, k| {
            let mut l = last.borrow_mut();
            if l.as_ref().map(|x| x.0) != Some(st) {
                *l = Some((st, batch_at(st)));
            }
            l.as_ref()
                .and_then(|(_, b)| b.inputs.get(k))
                .cloned()
                .unwrap_or_default()
        })?;
    drop(last);
    let sparse = &sparse;
    // A step over a table's limit under `overflow: error` ends the run there:
    // the steps before it train (and checkpoint) as configured.
    let end = sparse.end(cfg.steps);
    let (tx, rx) = mpsc::channel::<StepReport>();
    // The run series its checkpoints belong to: the resumed one, or a fresh one.
    let run_id = if cfg.run.is_empty() {
        super::checkpoint::new_run_id()
    } else {
        cfg.run.clone()
    };
    let run_id = &run_id;
    let mut result: Result<RunOutput, RunError> = Err("no device ran".into());
    // Replicas of a parameter piece hold the same values: the first device to
    // need a piece computes it and the others share it (the optimizer copies a
    // shared tensor before its first in-place step).
    let pieces: PieceCache = Default::default();
    let pieces = &pieces;
    // The optimizer slots replicas share, by the same keys.
    let slots: SlotCache = Default::default();
    let slots = &slots;
    // Parameters and optimizer state after the first step, each tensor once.
    let held: std::sync::Mutex<HashMap<candle_core::TensorId, f64>> = Default::default();
    let held = &held;
    let several_here = local_ranks.len() > 1;
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for &rank in &local_ranks {
            let tx = tx.clone();
            let (topo, label_t, inputs, out_t) = (&topo, &label_t, &inputs, &out_t);
            let (micro_sizes, int_inputs, local_ranks) = (&micro_sizes, &int_inputs, &local_ranks);
            handles.push(scope.spawn(move || {
                // A device that fails breaks the mesh's barrier, so no other device
                // waits forever in a collective.
                let body = || -> Result<(Option<Named>, Option<Memory>), RunError> {
                let dev = Device::Cpu;
                let ex = Exec {
                    prog,
                    comm,
                    rank,
                    dtype: cfg.compute_dtype(),
                    dev: dev.clone(),
                    sparse: crate::prim::lookup::SparseState {
                        placements: placements.clone(),
                        ..Default::default()
                    },
                    stage: stages.as_ref().map(|st| (st.axis.clone(), st.param_stage.clone())),
                    held: Default::default(),
                };
                // Parameters: each device computes only its own piece.
                let mut params = Vec::new();
                // Per parameter: no other device of this process holds its piece.
                let mut alone = vec![false; prog.params.len()];
                for (pi, p) in prog.params.iter().enumerate() {
                    // A pipeline stage holds only its own layers' parameters.
                    if !ex.holds(pi) {
                        params.push(Tensor::zeros(0, cfg.dtype, &dev).map_err(ce)?);
                        continue;
                    }
                    let key = piece_key(topo, rank, pi, p);
                    // The devices of this process that take this piece: the
                    // last one removes it from the cache, so that the run does
                    // not keep the initial values beside the trained ones.
                    let takers = local_ranks
                        .iter()
                        .filter(|r| super::exec::holds_at(&ex.stage, topo, **r, pi) && piece_key(topo, **r, pi, p) == key)
                        .count();
                    alone[pi] = takers == 1;
                    let cell = match (placements.get(&pi), pieces.lock()) {
                        // Tables are MOD-placed per device: not shared.
                        (None, Ok(mut m)) => {
                            let slot = m.entry(key.clone()).or_default();
                            slot.1 += 1;
                            let cell = slot.0.clone();
                            if slot.1 >= takers {
                                m.remove(&key);
                            }
                            Some(cell)
                        }
                        _ => None,
                    };
                    let make = || -> R<Tensor> {
                    let idx = param_indices(topo, rank, p, placements.get(&pi), prog)?;
                    let v = match cfg.init.get(&p.name).or_else(|| computed.get(&p.name)) {
                        Some(g) => idx
                            .iter()
                            .map(|i| g.get(*i as usize).copied().unwrap_or(0.0))
                            .collect(),
                        None => p.init.values(
                            &p.stored,
                            cfg.seed ^ init::hash_str(&p.name),
                            &idx,
                            &prog.bound,
                        ),
                    };
                    let shape: Vec<usize> = prog
                        .local_shape(&p.stored)?
                        .iter()
                        .map(|x| *x as usize)
                        .collect();
                    Tensor::from_vec(v, shape, &dev)
                        .and_then(|t| t.to_dtype(cfg.dtype))
                        .map_err(ce)
                    };
                    params.push(match cell {
                        Some(cell) => {
                            // The first device here computes; the others wait for it.
                            let got = cell.get_or_init(|| make().map_err(|e| e.to_string()));
                            got.clone()?
                        }
                        None => make()?,
                    });
                }
                let opts = prog.params.iter().map(|p| cfg.optimizer_of(p)).collect();
                let mut state = OptState::new(&params, opts)?;
                // Resuming: optimizer slots from their global arrays.
                for (i, p) in prog.params.iter().enumerate() {
                    for (slot, key) in [(&mut state.m[i], "opt_m"), (&mut state.v[i], "opt_v")] {
                        if let (Some(s), Some(g), true) = (slot.as_mut(), cfg.init_opt.get(&format!("{key}/{}", p.name)), ex.holds(i)) {
                            let idx = param_indices(topo, rank, p, placements.get(&i), prog)?;
                            *s = local_piece_at(&idx, &p.stored, prog, g, cfg.dtype, &dev)?;
                        }
                    }
                }
                // On the virtual mesh, the replicas of a parameter piece share
                // its tensor (the piece cache) and, when it steps in place, its
                // optimizer slots: the first replica steps them for all, the
                // others skip (same bits, a replica's share of the work and
                // memory), and a barrier after the step keeps every device from
                // reading a parameter mid-step.
                let mut skip = vec![false; params.len()];
                // Every device waits at that barrier, whether or not it shares
                // anything itself (a pipeline stage may hold only frozen weights).
                let shared = several_here && reloads.is_none();
                if shared {
                    for (pi, p) in prog.params.iter().enumerate() {
                        let (axes, copies) = ex.replicas(pi);
                        if !ex.holds(pi) || placements.contains_key(&pi) || p.frozen || copies < 2 || !state.in_place(pi, &params[pi]) {
                            continue;
                        }
                        let key = piece_key(topo, rank, pi, p);
                        let (m, v) = match slots.lock() {
                            Ok(mut c) => c.entry(key).or_insert_with(|| (state.m[pi].clone(), state.v[pi].clone())).clone(),
                            Err(_) => return Err("a device failed while sharing optimizer state".into()),
                        };
                        state.m[pi] = m;
                        state.v[pi] = v;
                        if topo.group(rank, &axes).into_iter().min() == Some(rank) {
                            state.claim(pi, &params[pi]);
                        } else {
                            skip[pi] = true;
                        }
                    }
                }
                // A piece no other device here holds (the piece cache let go
                // of it) steps in place without a first copy.
                for (pi, _) in alone.iter().enumerate().filter(|(_, a)| **a) {
                    if !placements.contains_key(&pi) && state.in_place(pi, &params[pi]) {
                        state.claim(pi, &params[pi]);
                    }
                }
                // Tables step only the rows a batch touched: their slots stay
                // untouched until then.
                let leave: Vec<bool> = skip.iter().enumerate().map(|(i, s)| *s || placements.contains_key(&i)).collect();
                state.fault_in(&leave);
                let mut memory = None;
                let mut first = None;
                // A pipeline's activations: the most its microbatches' tapes held at once.
                let mut peak_activations = 0.0f64;
                // And the most bytes of gathered parameters those tapes held.
                let mut peak_gathered = 0.0f64;
                // The most bytes a checkpointed block held while recomputed.
                let mut recompute_peak = 0.0f64;
                let base = prog;
                let all_axes: Vec<String> = topo.axes.iter().map(|a| a.0.clone()).collect();
                // The reload in force (none: the program the run started with).
                let mut active: Option<std::sync::Arc<super::reload::Update>> = None;
                let mut active_stages: Option<Option<super::pipeline::Stages>> = None;
                crate::heap::steps_begin();
                for step in cfg.start_step..end {
                    let b = &*step_batches.get(step)?;
                    let mut reloaded = None;
                    if let Some(rl) = reloads {
                        // Every device takes the newest generation any of them has seen.
                        let seen = Tensor::new(&[rl.visible(step) as f64], &dev).map_err(ce)?;
                        let agreed = comm.pmax(rank, &seen, &all_axes).and_then(|t| t.to_vec1::<f64>()).map_err(ce)?;
                        let agreed = agreed.first().copied().unwrap_or(0.0) as usize;
                        if agreed > active.as_ref().map_or(0, |u| u.generation) {
                            let u = rl.get(agreed).ok_or("a reload was lost")?;
                            state.opts = base.params.iter().map(|p| u.cfg.optimizer_of(p)).collect();
                            reloaded = Some(format!("reload {}: {}", u.generation, u.summary));
                            active_stages = Some(super::pipeline::Stages::of(&u.prog)?);
                            active = Some(u);
                        }
                    }
                    let (prog, cfg_now): (&Program, &Config) = match &active {
                        Some(u) => (&u.prog, &u.cfg),
                        None => (base, cfg),
                    };
                    // Which program a runtime error's node belongs to (0: the file's).
                    let generation = active.as_ref().map_or(0, |u| u.generation);
                    let out_id = prog.output.ok_or("the model has no output")? as usize;
                    let ex = ex.with_program(prog);
                    // Mixed precision: the passes use 16-bit copies of the
                    // master weights, and their gradients come back in f32.
                    let cdt = cfg.compute_dtype();
                    let work = working(&params, cdt)?;
                    let stages: &Option<super::pipeline::Stages> = active_stages.as_ref().unwrap_or(stages);
                    ex.sparse.touched.borrow_mut().clear();
                    // Microbatch j is the j-th contiguous chunk of the step's batch.
                    let mut acc: Option<(GradSum, f64)> = None;
                    let mut metric_sums: Vec<f64> = Vec::new();
                    // The `add_loss` / `observe` values, summed over microbatches.
                    let mut aux_sum: Vec<f64> = Vec::new();
                    let mut tape = None;
                    // Microbatch j: the j-th contiguous chunk of the step's inputs,
                    // labels and lookup drop masks, and its dropout seed.
                    let microbatch = |j: usize| -> R<super::pipeline::Micro> {
                        let chunk = |v: &[f64]| -> Vec<f64> {
                            let n = v.len() / k;
                            v[j * n..(j + 1) * n].to_vec()
                        };
                        let xs: Vec<Tensor> = inputs
                            .iter()
                            .zip(&b.inputs)
                            .map(|(t, v)| local_piece(topo, rank, t, prog, &chunk(v), cdt, &dev))
                            .collect::<R<_>>()?;
                        let labels_f: Vec<f64> = chunk(&b.labels);
                        Ok(super::pipeline::Micro {
                            inputs: xs,
                            labels: local_piece(topo, rank, label_t, prog, &labels_f, cfg.dtype, &dev)?,
                            seed: Some(cfg.seed ^ ((step * k + j) as u64).wrapping_mul(0xA24B_AED4_963E_E407)),
                            keep: sparse
                                .get(step)
                                .map(|x| x.keep.iter().map(|(n, mk)| (*n, chunk(mk))).collect())
                                .unwrap_or_default(),
                        })
                    };
                    if let Some(st) = stages {
                        // Pipelined: `accumulate` chunks of M microbatches each.
                        let m_count = st.microbatches;
                        for a in 0..k / m_count {
                            let micro = |m: usize| microbatch(a * m_count + m);
                            let loss_of = |logits: &Tensor, y: &Tensor| super::loss::score(cfg.loss, &cfg.metrics, &ex, logits, out_t, y, rows, Some(st.axis.as_str()));
                            let n_sums = cfg.metrics.iter().map(|m| m.sums()).sum();
                            let c = super::pipeline::run_chunk(&ex, st, &work, &micro, &loss_of, n_sums, m_count, true)?;
                            peak_activations = peak_activations.max(c.peak_activations);
                            peak_gathered = peak_gathered.max(c.peak_gathered);
                            let g = master_grads(c.grads, &params)?;
                            let loss = c.loss + aux_split(prog, &c.aux).0;
                            super::pipeline::add_into(&mut metric_sums, &c.sums);
                            super::pipeline::add_into(&mut aux_sum, &c.aux);
                            acc = Some(match acc {
                                None => (GradSum::new(g), loss),
                                Some((mut x, l)) => {
                                    x.add(&g)?;
                                    (x, l + loss)
                                }
                            });
                            if c.tape.is_some() {
                                tape = c.tape;
                            }
                        }
                    }
                    for j in (0..k).filter(|_| stages.is_none()) {
                        let mb = microbatch(j)?;
                        // The previous microbatch's values are spent.
                        drop(tape.take());
                        *ex.sparse.keep.borrow_mut() = mb.keep;
                        let y = mb.labels;
                        let mut t = ex.forward(&work, &mb.inputs, mb.seed).map_err(|e| RunError::op(e, generation))?;
                        let super::loss::Scored { loss, ct, sums } = super::loss::score(cfg.loss, &cfg.metrics, &ex, &t.vals[out_id], out_t, &y, rows, None)?;
                        let aux = super::pipeline::aux_flat(prog, &t, &|_| true)?;
                        let loss = loss + aux_split(prog, &aux).0;
                        super::pipeline::add_into(&mut aux_sum, &aux);
                        super::pipeline::add_into(&mut metric_sums, &sums);
                        if !loss.is_finite() {
                            // Every device sees the same loss, so all stop here together.
                            return Err(non_finite(step, loss, &t.vals, generation));
                        }
                        // Local gradients accumulate; they are synchronised once per step.
                        let g = if prog.checkpoints.is_empty() {
                            ex.backward(&t, ct)?
                        } else {
                            // Checkpointed blocks keep only their results, and
                            // recompute the rest for backward.
                            let mut t2 = t;
                            ex.drop_checkpointed(&mut t2, 0..prog.nodes.len())?;
                            let (g, peak) = ex.backward_checkpointed(&mut t2, ct, mb.seed).map_err(|e| RunError::op(e, generation))?;
                            recompute_peak = recompute_peak.max(peak);
                            t = t2;
                            g
                        };
                        let g = master_grads(g, &params)?;
                        acc = Some(match acc {
                            None => (GradSum::new(g), loss),
                            Some((mut a, l)) => {
                                a.add(&g)?;
                                (a, l + loss)
                            }
                        });
                        tape = Some(t);
                    }
                    let (grads, loss) = acc.ok_or("no microbatch")?;
                    let grad_sum = grads.own_bytes();
                    let grads = sync_grads(&ex, grads.into_vec())?;
                    // A pipeline's first stages keep no whole-program tape.
                    let tape = match tape {
                        Some(t) => t,
                        None if stages.is_some() => ex.empty_tape(&work, &[])?,
                        None => return Err("no microbatch".into()),
                    };
                    let (grads, loss) = if k > 1 {
                        (grads.iter().map(|g| g / k as f64).collect::<candle_core::Result<Vec<_>>>().map_err(ce)?, loss / k as f64)
                    } else {
                        (grads, loss)
                    };
                    if !loss.is_finite() {
                        // Every device sees the same loss, so all stop here together.
                        return Err(non_finite(step, loss, &tape.vals, generation));
                    }
                    if step == 0 && rank == 0 {
                        let mut m = Memory {
                            params: work.iter().map(bytes).sum(),
                            master_params: if cdt == cfg.dtype { 0.0 } else { params.iter().map(bytes).sum() },
                            grads: grads.iter().map(bytes).sum(),
                            grad_sum,
                            optimizer_state: state.bytes(),
                            ..Memory::default()
                        };
                        for (i, (n, v)) in prog.nodes.iter().zip(&tape.vals).enumerate() {
                            match &n.op {
                                Op::Input(_) | Op::Param(_) => {}
                                _ if prog.gathers_copy(i) => m.gathered_params += bytes(v),
                                _ if prog.gathers_param(i) => {}
                                _ => m.activations += bytes(v),
                            }
                        }
                        let backward = ex.held.get();
                        m.gathered_grads = backward.unreduced;
                        m.cotangents = backward.cotangents;
                        if stages.is_some() {
                            m.activations = peak_activations;
                            m.gathered_params = peak_gathered;
                        }
                        // One checkpointed block's parameters, gathered again.
                        m.gathered_params += backward.regathered;
                        if stages.is_none() {
                            // What the checkpoints keep, and one block recomputed.
                            m.activations += recompute_peak;
                        }
                        memory = Some(m);
                    }
                    if want_grads && step == 0 {
                        first = gather_global(&ex, &grads)?;
                    }
                    let norm = global_norm(&ex, &grads)?;
                    let scale = match cfg_now.clip {
                        Some(c) if norm > c => c / norm,
                        _ => 1.0,
                    };
                    let lr = cfg_now.optimizer.lr.at(step);
                    // Tables update only the rows this step looked up (on any replica).
                    let touched = std::mem::take(&mut *ex.sparse.touched.borrow_mut());
                    let mut masks: Vec<Option<Tensor>> = vec![None; params.len()];
                    for pi in placements.keys() {
                        let rows = params[*pi].dims()[0];
                        let m = touched.get(pi).cloned().unwrap_or_else(|| vec![0.0; rows]);
                        let m = Tensor::from_vec(m, (rows, 1), &dev).map_err(ce)?;
                        let (rep, _) = topo.replication(&prog.params[*pi].stored, None);
                        let m = ex.comm.pmax(rank, &m, &rep).and_then(|t| t.to_dtype(cfg.dtype)).map_err(ce)?;
                        masks[*pi] = Some(m);
                    }
                    state.update(step + 1, &mut params, &grads, scale, &masks, &skip)?;
                    if shared {
                        comm.barrier().map_err(ce)?;
                    }
                    if Some(&rank) == local_ranks.first() {
                        crate::heap::step_done();
                    }
                    if step == 0 {
                        // The state this device holds, by tensor: replicas
                        // that share a piece hold the same tensor.
                        if let Ok(mut h) = held.lock() {
                            for t in params.iter().chain(state.m.iter().chain(&state.v).flatten()) {
                                h.insert(t.id(), bytes(t));
                            }
                        }
                    }
                    if let Some(crate::spec::Checkpoint { every, keep, dir }) = &cfg.checkpoint {
                        if (step + 1) % every == 0 {
                            // Every device takes part in gathering; device 0 writes.
                            let mut arrays = Vec::new();
                            for (i, p) in prog.params.iter().enumerate() {
                                let shape: Vec<usize> = p.stored.known_shape();
                                if let Some(v) = gather_one(&ex, i, &params[i])? {
                                    arrays.push((format!("param/{}", p.name), shape.clone(), v));
                                }
                                for (slot, key) in [(&state.m[i], "opt_m"), (&state.v[i], "opt_v")] {
                                    if let Some(s) = slot {
                                        if let Some(v) = gather_one(&ex, i, s)? {
                                            arrays.push((format!("{key}/{}", p.name), shape.clone(), v));
                                        }
                                    }
                                }
                            }
                            if rank == 0 {
                                let manifest = super::checkpoint::Manifest {
                                    format: super::checkpoint::FORMAT.into(),
                                    model: prog.model.clone(),
                                    run: run_id.clone(),
                                    step: step + 1,
                                    seed: cfg.seed,
                                    rng: format!("counter-based: seed {}, counter = step; dropout streams from (seed, step, microbatch)", cfg.seed),
                                    data_position: (step + 1) * cfg.batch,
                                    mesh: prog.mesh.clone(),
                                    dtype: if cfg.dtype == DType::F64 { "f64".into() } else { "f32".into() },
                                    optimizer: cfg_now.optimizer.name().into(),
                                    tensors: arrays
                                        .iter()
                                        .map(|(n, s, _)| {
                                            let layout = prog.params.iter().find(|p| n.ends_with(&format!("/{}", p.name))).map(|p| p.stored.to_string()).unwrap_or_default();
                                            super::checkpoint::TensorInfo { name: n.clone(), shape: s.clone(), layout, sha256: String::new() }
                                        })
                                        .collect(),
                                };
                                // A failed save stops the run (the other devices are
                                // told to stop too, below): it must not go on unsaved.
                                if let Err(e) = super::checkpoint::save(dir, *keep, &manifest, &arrays, cfg.dtype == DType::F64) {
                                    return Err(format!("the checkpoint after step {} was not written: {e}", step + 1).into());
                                }
                            }
                        }
                    }
                    // Held-out loss: forward only, no dropout, the same batch size.
                    let mut eval_loss = None;
                    if let Some(crate::spec::Eval { every, steps: esteps }) = cfg.eval {
                        if (step + 1) % every == 0 {
                            // The parameters as this step's update left them.
                            let work = working(&params, cdt)?;
                            // Held-out batches are looked up whole.
                            ex.sparse.keep.borrow_mut().clear();
                            let mut total = 0.0;
                            for e in 0..esteps {
                                let b = src.batch(cfg.seed, e, cfg.batch / k, micro_sizes, int_inputs, vocab, rows, per_position, true);
                                let xs: Vec<Tensor> = inputs.iter().zip(&b.inputs).map(|(t, v)| local_piece(topo, rank, t, prog, v, cdt, &dev)).collect::<R<_>>()?;
                                let y = local_piece(topo, rank, label_t, prog, &b.labels, cfg.dtype, &dev)?;
                                total += match stages {
                                    // Through the stages, forward only.
                                    Some(st) => {
                                        let mb = std::cell::RefCell::new(Some((xs, y)));
                                        let micro = |_: usize| -> R<super::pipeline::Micro> {
                                            let (inputs, labels) = mb.borrow_mut().take().ok_or("one held-out batch")?;
                                            Ok(super::pipeline::Micro { inputs, labels, seed: None, keep: Default::default() })
                                        };
                                        let loss_of = |logits: &Tensor, y: &Tensor| super::loss::score(cfg.loss, &[], &ex, logits, out_t, y, rows, Some(st.axis.as_str()));
                                        super::pipeline::run_chunk(&ex, st, &work, &micro, &loss_of, 0, 1, false)?.loss
                                    }
                                    None => {
                                        let t = ex.forward(&work, &xs, None).map_err(|e| RunError::op(e, generation))?;
                                        loss_fn(cfg.loss, &ex, &t.vals[out_id], out_t, &y, rows, None)?.0
                                    }
                                };
                            }
                            eval_loss = Some(total / esteps.max(1) as f64);
                        }
                    }
                    if rank == 0 {
                        let mut notes = sparse.get(step).map(|x| x.notes.clone()).unwrap_or_default();
                        notes.extend(reloaded.take());
                        let metrics = metric_values(&cfg.metrics, &metric_sums);
                        // Observed values: the mean over the step's microbatches.
                        let observed: Observed = aux_split(prog, &aux_sum).1.into_iter().map(|(n, v)| (n, v.iter().map(|x| x / k as f64).collect())).collect();
                        let _ = tx.send(StepReport { step, notes, loss, lr, grad_norm: norm, eval_loss, metrics, observed, done: std::time::Instant::now() });
                    }
                }
                Ok((first, memory))
                };
                let r = body();
                if r.is_err() {
                    comm.abort();
                }
                r
            }));
        }
        drop(tx);
        let mut losses = Vec::new();
        for r in rx.iter() {
            on_step(&r);
            losses.push(r.loss);
        }
        let mut first = None;
        let mut memory = None;
        let mut errors: Vec<RunError> = Vec::new();
        for (&rank, h) in local_ranks.iter().zip(handles) {
            match h.join() {
                Ok(Ok((g, m))) => {
                    if rank == 0 {
                        first = g;
                        memory = m;
                    }
                }
                Ok(Err(e)) => {
                    // Report the device that failed, not the ones it stopped.
                    if !e.message.contains("another device stopped") || errors.is_empty() {
                        errors.insert(0, e);
                    }
                }
                Err(_) => {
                    result = Err(format!("device {rank} panicked").into());
                    return;
                }
            }
        }
        if let Some(e) = errors.into_iter().next() {
            result = Err(e);
            return;
        }
        result = match &sparse.stop {
            Some(e) => Err(e.clone()),
            None => Ok(RunOutput {
                memory,
                state_here: held
                    .lock()
                    .ok()
                    .filter(|h| !h.is_empty())
                    .map(|h| h.values().sum()),
                losses,
                first_grads: first,
            }),
        };
    });
    result
}

fn all_finite(t: &Tensor) -> bool {
    t.flatten_all()
        .and_then(|x| x.to_dtype(DType::F64))
        .and_then(|x| x.to_vec1::<f64>())
        .map(|v| v.iter().all(|x| x.is_finite()))
        .unwrap_or(true)
}

/// Sum each gradient over the axes its parameter is replicated on (a pipeline
/// stage's parameters: among the devices of that stage, which alone hold them).
/// The parameters as the passes use them: 16-bit copies of the master
/// weights under mixed precision, else the master weights themselves.
fn working(params: &[Tensor], dtype: DType) -> R<Vec<Tensor>> {
    // `to_dtype` to a tensor's own dtype is the tensor itself.
    params
        .iter()
        .map(|p| p.to_dtype(dtype).map_err(ce))
        .collect()
}

/// A pass's parameter gradients in the master weights' dtype (zeros where a
/// parameter got none).
fn master_grads(grads: Vec<Option<Tensor>>, params: &[Tensor]) -> R<Vec<Tensor>> {
    grads
        .into_iter()
        .zip(params)
        .map(|(g, p)| match g {
            Some(g) => g.to_dtype(p.dtype()).map_err(ce),
            None => p.zeros_like().map_err(ce),
        })
        .collect()
}

pub(crate) fn sync_grads(ex: &Exec, grads: Vec<Tensor>) -> R<Vec<Tensor>> {
    let mut out = Vec::new();
    for (i, g) in grads.into_iter().enumerate() {
        if !ex.holds(i) {
            out.push(g);
            continue;
        }
        // A frozen parameter takes no step: no gradient, no communication.
        if ex.prog.params.get(i).is_some_and(|p| p.frozen) {
            out.push(g.zeros_like().map_err(ce)?);
            continue;
        }
        let rep = ex.replicas(i).0;
        out.push(ex.comm.psum(ex.rank, &g, &rep).map_err(ce)?);
    }
    Ok(out)
}

/// Global L2 norm of all gradients (each element counted once).
fn global_norm(ex: &Exec, grads: &[Tensor]) -> R<f64> {
    let mut local = 0.0;
    for (i, g) in grads.iter().enumerate() {
        // Frozen parameters take no step: their gradients are not clipped.
        if !ex.holds(i) || ex.prog.params.get(i).is_some_and(|p| p.frozen) {
            continue;
        }
        let rep = ex.replicas(i).1;
        let s = g
            .sqr()
            .and_then(|x| x.sum_all())
            .and_then(|x| x.to_dtype(DType::F64))
            .and_then(|x| x.to_scalar::<f64>())
            .map_err(ce)?;
        local += s / rep as f64;
    }
    let t = Tensor::new(local, &ex.dev).map_err(ce)?;
    let all: Vec<String> = ex.comm.topo().axes.iter().map(|a| a.0.clone()).collect();
    let s = ex
        .comm
        .psum(ex.rank, &t, &all)
        .and_then(|x| x.to_scalar::<f64>())
        .map_err(ce)?;
    Ok(s.sqrt())
}

/// Assemble each gradient into its global array on device 0 (for tests).
fn gather_global(ex: &Exec, grads: &[Tensor]) -> R<Option<Named>> {
    let mut out = Vec::new();
    for (pi, (p, g)) in ex.prog.params.iter().zip(grads).enumerate() {
        if let Some(v) = gather_one(ex, pi, g)? {
            out.push((p.name.clone(), v));
        }
    }
    Ok((ex.rank == 0).then_some(out))
}

/// One value's global array, assembled on device 0 (`None` on the others) from
/// every device's piece, so no device holds more than one global copy.
pub(crate) fn gather_one(ex: &Exec, pi: usize, t: &Tensor) -> R<Option<Vec<f64>>> {
    let p = &ex.prog.params[pi];
    let stored = &p.stored;
    let Some(pieces) = ex.comm.gather_to_first(ex.rank, t).map_err(ce)? else {
        return Ok(None);
    };
    let n: usize = stored.known_shape().iter().product();
    let mut full = vec![0f64; n];
    let topo = ex.comm.topo();
    let (rep_axes, _) = ex.replicas(pi);
    let stage = ex
        .stage
        .as_ref()
        .and_then(|(axis, of)| of.get(pi).copied().flatten().map(|s| (axis, s)));
    for (r, piece) in pieces.iter().enumerate() {
        // Replicas hold the same values; each element is written from its first
        // (among the devices of the stage holding it, for a pipeline's layers).
        if !rep_axes.iter().all(|a| topo.coord(r, a) == 0)
            || stage.is_some_and(|(axis, s)| topo.coord(r, axis) != s)
        {
            continue;
        }
        let idx = param_indices(topo, r, p, ex.sparse.placements.get(&pi), ex.prog)?;
        let vals: Vec<f64> = piece
            .flatten_all()
            .and_then(|t| t.to_dtype(DType::F64))
            .and_then(|t| t.to_vec1::<f64>())
            .map_err(ce)?;
        for (i, v) in idx.iter().zip(vals) {
            full[*i as usize] = v;
        }
    }
    Ok(Some(full))
}

/// Each step's global batch, formed once by the first device that reaches the
/// step and dropped when every device of this process has taken it: the run
/// holds only the steps in flight, and devices do not repeat the work.
struct StepBatches<'a> {
    make: &'a (dyn Fn(usize) -> Batch + Sync),
    /// Devices of this process that take each batch.
    takers: usize,
    /// The source gives one batch for every step: keep it for the run.
    same: bool,
    slots: std::sync::Mutex<HashMap<usize, (Arc<Batch>, usize)>>,
}

impl StepBatches<'_> {
    fn get(&self, step: usize) -> R<Arc<Batch>> {
        let key = if self.same { 0 } else { step };
        let mut m = self.slots.lock().map_err(|_| "a device panicked")?;
        let slot = m
            .entry(key)
            .or_insert_with(|| (Arc::new((self.make)(step)), 0));
        slot.1 += 1;
        let b = slot.0.clone();
        if slot.1 == self.takers && !self.same {
            m.remove(&key);
        }
        Ok(b)
    }
}

/// Initial parameter pieces by (parameter, shard index and count per dimension),
/// computed once and shared by the replicas that hold the same piece, and how
/// many of them have taken it (the last removes it).
type PieceCache =
    std::sync::Mutex<HashMap<PieceKey, (Arc<std::sync::OnceLock<Result<Tensor, String>>>, usize)>>;

/// A parameter piece: the parameter, and its shard index and count per
/// dimension on a device (replicas of the piece have the same key).
type PieceKey = (usize, Vec<(usize, usize)>);

fn piece_key(topo: &Topology, rank: usize, pi: usize, p: &crate::spmd::Param) -> PieceKey {
    (
        pi,
        p.stored
            .dims
            .iter()
            .map(|d| topo.shard_index(rank, &d.axes))
            .collect(),
    )
}

/// Optimizer slots (first and second moment) by parameter piece, shared by
/// the replicas that step it in place.
type SlotCache = std::sync::Mutex<HashMap<PieceKey, (Option<Tensor>, Option<Tensor>)>>;

/// Each metric's value from the step's sums (laid out as [`super::loss::score`]
/// returns them).
fn metric_values(metrics: &[crate::spec::Metric], sums: &[f64]) -> Vec<(crate::spec::Metric, f64)> {
    let mut at = 0;
    let mut out = Vec::new();
    for m in metrics {
        let n = m.sums();
        if let Some(s) = sums.get(at..at + n) {
            out.push((*m, m.value(s)));
        }
        at += n;
    }
    out
}

/// Values logged by name.
type Observed = Vec<(String, Vec<f64>)>;

/// The added loss (Σ weight × term over the `add_loss` nodes) and every
/// `add_loss` term and `observe` value by name (one name's values added up),
/// from their values as [`super::pipeline::aux_flat`] lays them out.
fn aux_split(prog: &Program, flat: &[f64]) -> (f64, Observed) {
    let mut added = 0.0;
    let mut seen: Observed = Vec::new();
    let mut at = 0;
    for (node, aux) in prog.nodes.iter().filter_map(|n| n.op.aux().map(|a| (n, a))) {
        let len = super::pipeline::aux_len(prog, node).unwrap_or(0);
        let v = flat.get(at..at + len).unwrap_or_default();
        at += len;
        if let Some(w) = aux.weight() {
            added += w * v.iter().sum::<f64>();
        }
        match seen.iter_mut().find(|(n, _)| n == aux.name()) {
            Some((_, acc)) if acc.len() == v.len() => {
                acc.iter_mut().zip(v).for_each(|(a, b)| *a += b)
            }
            Some(_) => {}
            None => seen.push((aux.name().to_string(), v.to_vec())),
        }
    }
    (added, seen)
}
