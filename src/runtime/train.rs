//! The training driver: what every device of this process shares (the
//! program, its [`Step`], the data, the caches of initial pieces and batches),
//! one [`Worker`] per device of the mesh this process runs, and the step
//! reports device 0 sends back. The work of a step is the step program's:
//! see [`super::worker`] and [`super::passes`].

pub use super::config::Config;
use super::data::{Batch, Source};
pub use super::error::RunError;
use super::exec::{Exec, Fault, R};
pub use super::memory::Memory;
use super::mesh::{Cluster, InProcess};
pub(crate) use super::pieces::local_piece;
use super::pieces::{param_runs, PieceCache, SlotCache, StepBatches};
use super::pipeline::Stages;
use super::worker::Worker;
use crate::mesh::{Collectives, Topology};
use crate::spmd::{Op, Program};
use crate::step::{Step, Training};
use crate::types::TType;
use candle_core::Tensor;
use std::collections::HashMap;
use std::sync::mpsc;

fn ce(e: candle_core::Error) -> crate::fault::Fault {
    e.into()
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

pub struct RunOutput {
    pub memory: Option<Memory>,
    /// The parameters and optimizer state of every device of this process
    /// after the first step, a tensor replicas share counted once.
    pub state_here: Option<f64>,
    pub losses: Vec<f64>,
    /// Gradients at the first step, gathered to global arrays, when asked for.
    pub first_grads: Option<Named>,
    /// The parameters after the last step (global arrays, by name), when
    /// [`Config::keep_final`] asks for them.
    pub last: Option<Named>,
    /// A pipeline's measured bubble: each rank's idle share of the steps
    /// after the first (1 − its passes' seconds / the steps' seconds).
    pub pipeline_idle: Option<Vec<f64>>,
}

/// The shapes of a step's data, from the program and the configuration.
pub(crate) struct Io {
    /// The model's inputs' types and the targets'.
    pub inputs: Vec<TType>,
    pub label_t: TType,
    /// The loss function's weights, when it takes them: their type and
    /// elements per microbatch.
    pub weights: Option<(TType, usize)>,
    /// Elements of each input per microbatch, and per step.
    pub micro_sizes: Vec<usize>,
    pub input_sizes: Vec<usize>,
    pub int_inputs: Vec<bool>,
    /// Classes of the output (its last dimension).
    pub vocab: usize,
    /// Targets per microbatch, and whether the labels are per position.
    pub rows: usize,
    pub per_position: bool,
    /// Microbatches per step (accumulated chunks × a pipeline's microbatches).
    pub k: usize,
}

impl Io {
    fn of(prog: &Program, cfg: &Config, topo: &Topology, step: &Step) -> R<Io> {
        let out_id = prog.output.ok_or("the model has no output")? as usize;
        let out_t = prog.nodes[out_id].ty.clone();
        if !out_t.pending.is_empty() {
            return Err("the model's output still owes a reduction".into());
        }
        let inputs: Vec<TType> = prog
            .nodes
            .iter()
            .filter(|n| matches!(n.op, Op::Input(_)))
            .map(|n| n.ty.clone())
            .collect();
        let micro_sizes: Vec<usize> = inputs
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
        // Class ids shaped like the output without its class dimension,
        // targets shaped like the output, or the loss function's targets.
        let label_t = prog
            .targets(cfg.loss)
            .ok_or("the program has no output or loss function to train")?
            .ty;
        let rows = prog.elements(&label_t);
        // A pipelined program is lowered per microbatch: a step is
        // `accumulate` chunks of M microbatches.
        let k = step.passes();
        let weights = prog.weights().map(|(_, t)| {
            let n = prog.elements(&t);
            (t, n)
        });
        Ok(Io {
            weights,
            int_inputs: inputs.iter().map(|t| !t.dtype.is_float()).collect(),
            input_sizes: micro_sizes.iter().map(|n| n * k).collect(),
            micro_sizes,
            per_position: label_t.rank() > 1,
            inputs,
            label_t,
            vocab,
            rows,
            k,
        })
    }
}

/// What every device of this process shares while training.
pub(crate) struct Run<'a> {
    pub prog: &'a Program,
    pub cfg: &'a Config,
    pub src: &'a Source,
    /// The step program the devices execute.
    pub step: Step,
    pub topo: Topology,
    pub comm: &'a dyn Collectives,
    /// The devices this process runs.
    pub local_ranks: Vec<usize>,
    pub reloads: Option<&'a super::reload::Reloads>,
    pub want_grads: bool,
    pub stop: Option<&'a Stop>,
    pub io: Io,
    pub stages: Option<Stages>,
    pub batches: StepBatches,
    /// Embedding tables' placement.
    pub placements: HashMap<usize, super::sparse::Placement>,
    /// Computed initial values (buffers), whole, once for every device.
    pub computed: HashMap<String, Vec<f64>>,
    /// SparseCore input statistics, limits and FDO, ahead of the devices.
    pub sparse: super::sparse::Planned,
    /// The step the run ends before (a table's limit may stop it early).
    pub end: usize,
    /// The run series its checkpoints belong to.
    pub run_id: String,
    pub pieces: PieceCache,
    pub slots: SlotCache,
    /// Parameters and optimizer state after the first step, each tensor once.
    pub held: std::sync::Mutex<HashMap<candle_core::TensorId, f64>>,
    /// The examples of a step's batch and of a held-out batch this process's
    /// devices take (`None`: every one): a token stream reads only those.
    pub want: Option<Vec<bool>>,
    pub want_eval: Option<Vec<bool>>,
}

impl Run<'_> {
    /// The type the passes compute in: the step program's (mixed
    /// precision), else the parameters'.
    pub fn compute(&self) -> candle_core::DType {
        self.step.compute.unwrap_or(self.cfg.dtype)
    }

    /// A step's global batch: a function of the seed and the step, formed
    /// when the devices get there.
    pub fn batch_at(&self, s: usize) -> Result<Batch, String> {
        batch_of(self.src, self.cfg, &self.io, s, self.want.as_deref())
    }

    /// The step program of this run's parameters under configuration `cfg`
    /// (the run's own, or a live reload's).
    pub fn step_of(&self, cfg: &Config) -> Step {
        step_of(self.prog, cfg)
    }
}

/// The step of `prog` trained as `cfg` configures it.
pub fn step_of(prog: &Program, cfg: &Config) -> Step {
    Step::of(
        prog,
        &Training {
            loss: cfg.loss,
            metrics: &cfg.metrics,
            accumulate: cfg.accumulate,
            clip: cfg.clip,
            compute: (cfg.compute_dtype() != cfg.dtype).then(|| cfg.compute_dtype()),
            optimizer: &|p| cfg.optimizer_of(p),
        },
    )
}

fn batch_of(
    src: &Source,
    cfg: &Config,
    io: &Io,
    s: usize,
    want: Option<&[bool]>,
) -> Result<Batch, String> {
    let mut b = src.batch(
        cfg.seed,
        s,
        cfg.batch,
        &io.input_sizes,
        &io.int_inputs,
        io.vocab,
        io.rows * io.k,
        io.per_position,
        false,
        want,
    )?;
    if let Some((_, n)) = &io.weights {
        b.weights = src.weights(cfg.seed, s, n * io.k, false);
    }
    Ok(b)
}

/// The examples of a batch of `batch` rows, cut into `micro` microbatches,
/// that the devices `ranks` take: each microbatch's rows of their shard of the
/// batch dimension, of every input and of the labels. `None` (every example)
/// for one process, which reads them all anyway.
fn wanted(
    topo: &Topology,
    ranks: &[usize],
    io: &Io,
    batch: usize,
    micro: usize,
    processes: usize,
) -> Option<Vec<bool>> {
    if processes <= 1 {
        return None;
    }
    let m = batch / micro.max(1);
    let mut want = vec![false; batch];
    for t in io
        .inputs
        .iter()
        .chain([&io.label_t])
        .chain(io.weights.as_ref().map(|w| &w.0))
    {
        let axes = &t.dims.first()?.axes;
        for &r in ranks {
            let (idx, count) = topo.shard_index(r, axes);
            let len = m / count.max(1);
            for j in 0..micro.max(1) {
                let lo = (j * m + idx * len).min(batch);
                let hi = (lo + len).min(batch);
                want[lo..hi].iter_mut().for_each(|w| *w = true);
            }
        }
    }
    Some(want)
}

/// Train `prog` for `cfg.steps` steps on a virtual mesh; `on_step` sees each step.
pub fn run(
    prog: &Program,
    cfg: &Config,
    src: &Source,
    want_grads: bool,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<RunOutput, RunError> {
    let extras = Extras {
        want_grads,
        ..Extras::default()
    };
    run_on(&InProcess, prog, cfg, src, extras, on_step)
}

/// What a run does besides training: gather the first step's gradients,
/// take live reloads, and end early when asked.
#[derive(Clone, Copy, Default)]
pub struct Extras<'a> {
    pub want_grads: bool,
    /// Edits published here replace the program (and the optimizers'
    /// hyperparameters) from the step the devices agree on.
    pub reloads: Option<&'a super::reload::Reloads>,
    /// A request to end the run at a step boundary (in this process's devices).
    pub stop: Option<&'a Stop>,
}

/// A request to end a run at a step boundary (Ctrl-C in a notebook, a
/// callback that says enough). The first device to start a step after the
/// request fixes the step every device stops before, so all stop at the
/// same step, and no device waits for another in a collective. Within one
/// process only: over MPI the processes would have to agree.
#[derive(Default)]
pub struct Stop {
    asked: std::sync::atomic::AtomicBool,
    /// The highest step a device has started, and the step all stop before.
    state: std::sync::Mutex<(Option<usize>, Option<usize>)>,
}

impl Stop {
    /// End the run before the next step no device has started.
    pub fn ask(&self) {
        self.asked.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    /// Whether the run stopped early (the request came before its last step).
    pub fn stopped_at(&self) -> Option<usize> {
        self.state.lock().ok().and_then(|s| s.1)
    }
    /// Whether a device runs `step`: every device gets the same answer.
    pub(crate) fn runs(&self, step: usize) -> bool {
        let Ok(mut s) = self.state.lock() else {
            return false;
        };
        if s.1.is_none() && self.asked.load(std::sync::atomic::Ordering::SeqCst) {
            // No device has started the step after the highest started one.
            s.1 = Some(s.0.map_or(step, |hi| hi + 1));
        }
        let go = s.1.is_none_or(|end| step < end);
        if go {
            s.0 = Some(s.0.map_or(step, |hi| hi.max(step)));
        }
        go
    }
}

/// Train on the devices `cluster` gives this process. Step reports, the memory
/// figures and gathered gradients come from device 0: only the process that runs
/// it sees them. [`Extras`] says what else the run does.
pub fn run_on(
    cluster: &dyn Cluster,
    prog: &Program,
    cfg: &Config,
    src: &Source,
    extras: Extras<'_>,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<RunOutput, RunError> {
    let topo = Topology::of(&prog.mesh);
    let comm = cluster.connect(&topo)?;
    let local_ranks = cluster.local_ranks(&topo);
    let step = step_of(prog, cfg);
    let io = Io::of(prog, cfg, &topo, &step)?;
    let stages = Stages::of(prog)?;
    let computed = super::buffers::computed(prog)?;
    let sparse = plan_sparse(cluster, cfg, src, &io)?;
    let processes = cluster.process().1;
    let want = wanted(&topo, &local_ranks, &io, cfg.batch, io.k, processes);
    let want_eval = wanted(
        &topo,
        &local_ranks,
        &io,
        cfg.batch / io.k.max(1),
        1,
        processes,
    );
    let run = Run {
        prog,
        cfg,
        src,
        end: sparse.end(cfg.steps),
        sparse,
        step,
        batches: StepBatches {
            takers: local_ranks.len(),
            same: src.same_every_step(),
            slots: Default::default(),
            ahead: Default::default(),
        },
        placements: super::sparse::placements(prog, &cfg.sparse),
        computed,
        // The run series its checkpoints belong to: the resumed one, or a fresh one.
        run_id: if cfg.run.is_empty() {
            super::checkpoint::new_run_id()
        } else {
            cfg.run.clone()
        },
        io,
        stages,
        topo,
        comm: comm.as_ref(),
        local_ranks,
        reloads: extras.reloads,
        want_grads: extras.want_grads,
        stop: extras.stop,
        pieces: Default::default(),
        slots: Default::default(),
        held: Default::default(),
        want,
        want_eval,
    };
    let out = devices(&run, on_step)?;
    match &run.sparse.stop {
        Some(e) => Err(e.clone()),
        None => Ok(out),
    }
}

/// SparseCore input statistics, limits and FDO for every step, ahead of the
/// devices (a step over a table's limit under `overflow: error` ends the run
/// there: the steps before it train and checkpoint as configured).
fn plan_sparse(
    cluster: &dyn Cluster,
    cfg: &Config,
    src: &Source,
    io: &Io,
) -> Result<super::sparse::Planned, RunError> {
    let host = super::sparse::Host {
        process: cluster.process().0,
        processes: cluster.process().1,
        barrier: &|| cluster.host_barrier(),
    };
    let last: std::cell::RefCell<Option<(usize, Batch)>> = Default::default();
    super::sparse::plan_steps(&cfg.sparse, cfg.steps, cfg.start_step, &host, &|st, k| {
        let mut l = last.borrow_mut();
        if l.as_ref().map(|x| x.0) != Some(st) {
            // A batch that cannot be read stops the step that reads it.
            *l = Some((
                st,
                batch_of(src, cfg, io, st, None).unwrap_or(Batch {
                    inputs: vec![],
                    labels: vec![],
                    weights: vec![],
                }),
            ));
        }
        l.as_ref()
            .and_then(|(_, b)| b.inputs.get(k))
            .cloned()
            .unwrap_or_default()
    })
}

/// One thread per device of this process, each training its [`Worker`];
/// device 0's step reports go to `on_step` as they come.
fn devices(run: &Run, on_step: &mut dyn FnMut(&StepReport)) -> Result<RunOutput, RunError> {
    let (tx, rx) = mpsc::channel::<StepReport>();
    std::thread::scope(|scope| {
        // The next batches are read while the devices step.
        run.batches
            .prefetch(scope, run.cfg.start_step..run.end, |s| run.batch_at(s));
        let mut handles = Vec::new();
        for &rank in &run.local_ranks {
            let tx = tx.clone();
            handles.push(scope.spawn(move || {
                // A device that fails breaks the mesh's barrier, so no other
                // device waits forever in a collective.
                let r = Worker::new(run, rank, tx).and_then(Worker::train);
                if r.is_err() {
                    run.comm.abort();
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
        // Every device has returned.
        run.batches.stop();
        let (mut first, mut memory, mut last) = (None, None, None);
        let mut idle = None;
        let mut errors: Vec<RunError> = Vec::new();
        for (&rank, h) in run.local_ranks.iter().zip(handles) {
            match h.join() {
                Ok(Ok(g)) => {
                    if rank == 0 {
                        first = g.first_grads;
                        memory = g.memory;
                        last = g.last;
                        idle = g.pipeline_time.map(|(busy, wall)| {
                            busy.iter()
                                .map(|b| 1.0 - b / wall.max(f64::MIN_POSITIVE))
                                .collect()
                        });
                    }
                }
                Ok(Err(e)) => {
                    // Report the device that failed, not the ones it stopped.
                    // (A device another stopped has a collective fault.)
                    if !matches!(e.fault, crate::fault::Fault::Collective(_)) || errors.is_empty() {
                        errors.insert(0, e);
                    }
                }
                Err(_) => return Err(format!("device {rank} panicked").into()),
            }
        }
        if let Some(e) = errors.into_iter().next() {
            return Err(e);
        }
        Ok(RunOutput {
            memory,
            state_here: run
                .held
                .lock()
                .ok()
                .filter(|h| !h.is_empty())
                .map(|h| h.values().sum()),
            losses,
            first_grads: first,
            last,
            pipeline_idle: idle,
        })
    })
}

/// Sum each gradient over the axes the step reduces it over (its
/// parameter's replicas among the devices holding it); a frozen parameter's
/// is zero, without communication.
pub(crate) fn sync_grads(ex: &Exec, step: &Step, grads: Vec<Tensor>) -> R<Vec<Tensor>> {
    let mut out = Vec::new();
    for (i, g) in grads.into_iter().enumerate() {
        if !ex.holds(i) {
            out.push(g);
            continue;
        }
        let Some(p) = step.params.get(i) else {
            return Err(Fault::Shape(format!(
                "parameter {i} has no part in the step"
            )));
        };
        if p.frozen() {
            out.push(g.zeros_like().map_err(ce)?);
            continue;
        }
        out.push(ex.comm.psum(ex.rank, &g, &p.reduce).map_err(ce)?);
    }
    Ok(out)
}

/// Global L2 norm of all gradients (each element counted once).
pub(crate) fn global_norm(ex: &Exec, step: &Step, grads: &[Tensor]) -> R<f64> {
    // Each parameter's sum of squares stays on the device; they come to the
    // host in one read (one synchronisation of a GPU, not one per
    // parameter) and are added there in parameter order, as before.
    let mut held = Vec::new();
    let mut copies = Vec::new();
    for (i, g) in grads.iter().enumerate() {
        // Frozen parameters take no step: their gradients are not clipped.
        let Some(p) = step.params.get(i).filter(|p| !p.frozen()) else {
            continue;
        };
        if !ex.holds(i) {
            continue;
        }
        held.push(g);
        copies.push(p.copies as f64);
    }
    // On a GPU, shardc's kernel: two launches per gradient.
    #[cfg(feature = "cuda")]
    let fused = crate::prim::gpu::sums_of_squares(&held)
        .transpose()
        .map_err(ce)?;
    #[cfg(not(feature = "cuda"))]
    let fused: Option<Tensor> = None;
    let mut terms = Vec::new();
    for g in held.iter().filter(|_| fused.is_none()) {
        let s = g
            .sqr()
            .and_then(|x| x.sum_all())
            .and_then(|x| x.to_dtype(candle_core::DType::F64))
            .map_err(ce)?;
        terms.push(s);
    }
    let local = if held.is_empty() {
        0.0
    } else {
        let sums = match fused {
            Some(t) => Ok(t),
            None => Tensor::stack(&terms, 0),
        }
        .and_then(|t| crate::kernels::host::read::<f64>(&t))
        .map_err(ce)?;
        sums.iter()
            .zip(&copies)
            .fold(0.0, |acc, (s, c)| acc + s / c)
    };
    let t = Tensor::new(local, &ex.dev).map_err(ce)?;
    let all: Vec<String> = ex.comm.topo().axes.iter().map(|a| a.0.clone()).collect();
    let s = ex
        .comm
        .psum(ex.rank, &t, &all)
        .and_then(|x| crate::kernels::host::scalar(&x))
        .map_err(ce)?;
    Ok(s.sqrt())
}

/// Assemble each gradient into its global array on device 0 (for tests).
pub(crate) fn gather_global(ex: &Exec, grads: &[Tensor]) -> R<Option<Named>> {
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
    gather_as::<f64>(ex, pi, t)
}

/// [`gather_one`] in `T` (f32 for an f32 checkpoint: no f64 copy). The same
/// bits as `gather_one`'s values cast to `T`: candle's `to_dtype` rounds as
/// `as` does, and bf16/f16/f32 pieces widen to f32 exactly.
pub(crate) fn gather_as<T: candle_core::WithDType>(
    ex: &Exec,
    pi: usize,
    t: &Tensor,
) -> R<Option<Vec<T>>> {
    let p = &ex.prog.params[pi];
    let stored = &p.stored;
    let Some(pieces) = ex.comm.gather_to_first(ex.rank, t).map_err(ce)? else {
        return Ok(None);
    };
    let n: usize = stored.known_shape().iter().product();
    let mut full = vec![T::from_f64(0.0); n];
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
        let (starts, len) = param_runs(topo, r, p, ex.sparse.placements.get(&pi), ex.prog)?;
        let vals: Vec<T> = piece
            .flatten_all()
            .and_then(|t| t.to_dtype(T::DTYPE))
            .and_then(|t| t.to_vec1::<T>())
            .map_err(ce)?;
        // The piece is its runs of the global array, one after another.
        for (run, s) in vals.chunks(len.max(1)).zip(starts) {
            let at = s as usize;
            if let Some(dst) = full.get_mut(at..at + run.len()) {
                dst.copy_from_slice(run);
            }
        }
    }
    Ok(Some(full))
}

/// Each metric's value from the step's sums (laid out as
/// [`crate::prim::metrics`] computes them).
pub(crate) fn metric_values(
    metrics: &[crate::spec::Metric],
    sums: &[f64],
) -> Vec<(crate::spec::Metric, f64)> {
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
pub type Observed = Vec<(String, Vec<f64>)>;

/// The added loss (Σ weight × term over the `add_loss` nodes) and every
/// `add_loss` term and `observe` value by name (one name's values added up),
/// from their values as [`super::pipeline::aux_flat`] lays them out.
pub(crate) fn aux_split(prog: &Program, flat: &[f64]) -> (f64, Observed) {
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
