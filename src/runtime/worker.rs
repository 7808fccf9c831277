//! One device's training: its parameter pieces and optimizer slots, and each
//! step as the [`Step`] program says — the passes, the gradients reduced over
//! each parameter's replicas, clipping, the update — followed by the run's
//! hooks (checkpoints, eval, the step report, live reload).

use super::config::Config;
use super::error::RunError;
use super::exec::{bytes, Exec, R};
use super::memory::{Measured, Memory};
use super::optim::OptState;
use super::passes::StepCx;
use super::pieces::{
    local_piece, local_piece_at, param_indices, param_runs, piece_from, piece_key, working,
};
use super::pipeline::Stages;
use super::profile::{self, Phase};
use super::train::{
    aux_split, gather_as, gather_global, gather_one, global_norm, metric_values, sync_grads, Named,
    Observed, Run, StepReport,
};
use crate::init;
use crate::spmd::Program;
use crate::step::Step;
use candle_core::{DType, Tensor};
use std::sync::{mpsc, Arc};

fn ce(e: candle_core::Error) -> crate::fault::Fault {
    e.into()
}

/// The live reload in force (none: the program the run started with).
#[derive(Default)]
struct Active {
    update: Option<Arc<super::reload::Update>>,
    stages: Option<Option<Stages>>,
    /// The reloaded configuration's step over the run's parameters.
    step: Option<std::rc::Rc<Step>>,
}

/// What device 0 gathers over a run (`None` on the other devices).
pub(crate) struct Gathered {
    /// The first step's gradients, when asked for.
    pub first_grads: Option<Named>,
    pub memory: Option<Memory>,
    /// The parameters after the last step, when kept.
    pub last: Option<Named>,
    /// A pipeline's time over the steps after the first: each rank's busy
    /// seconds, and the seconds of its passes.
    pub pipeline_time: Option<(Vec<f64>, f64)>,
}

/// One device of the mesh, training.
pub struct Worker<'r, 'a> {
    run: &'r Run<'a>,
    rank: usize,
    ex: Exec<'r>,
    params: Vec<Tensor>,
    state: OptState,
    /// Per parameter: another replica here steps the storage this one shares.
    skip: Vec<bool>,
    /// Replicas here share parameter pieces and slots (a barrier ends each step).
    shared: bool,
    active: Active,
    memory: Option<Memory>,
    pipeline_time: Option<(Vec<f64>, f64)>,
    first: Option<Named>,
    /// The parameters after the run's last step, when kept.
    last: Option<Named>,
    tx: mpsc::Sender<StepReport>,
}

impl<'r, 'a> Worker<'r, 'a> {
    /// Device `rank` with its initial parameter pieces and optimizer slots.
    pub fn new(
        run: &'r Run<'a>,
        rank: usize,
        tx: mpsc::Sender<StepReport>,
    ) -> Result<Self, RunError> {
        let cfg = run.cfg;
        let dev = cfg.device.clone();
        let ex = Exec {
            prog: run.prog,
            comm: run.comm,
            rank,
            dtype: run.compute(),
            dev: dev.clone(),
            sparse: crate::prim::lookup::SparseState {
                placements: run.placements.clone(),
                ..Default::default()
            },
            stage: run
                .stages
                .as_ref()
                .map(|st| (st.axis.clone(), st.param_stage.clone())),
            held: Default::default(),
            bwd: Default::default(),
            counted: Default::default(),
            totals: Default::default(),
        };
        let (params, alone) = init_params(run, &ex, rank)?;
        let opts = run
            .step
            .params
            .iter()
            .map(|p| p.optimizer.clone())
            .collect();
        let state = OptState::new(&params, opts)?;
        let mut w = Worker {
            run,
            rank,
            ex,
            skip: vec![false; params.len()],
            params,
            state,
            // Every device waits at that barrier, whether or not it shares
            // anything itself (a pipeline stage may hold only frozen weights).
            shared: run.local_ranks.len() > 1 && run.reloads.is_none(),
            active: Active::default(),
            memory: None,
            pipeline_time: None,
            first: None,
            last: None,
            tx,
        };
        w.resume_slots()?;
        w.share_slots(&alone)?;
        Ok(w)
    }

    /// Resuming: optimizer slots from their global arrays.
    fn resume_slots(&mut self) -> R<()> {
        let (run, rank) = (self.run, self.rank);
        for (i, p) in run.prog.params.iter().enumerate() {
            if !self.ex.holds(i) {
                continue;
            }
            for (slot, key) in [
                (&mut self.state.m[i], "opt_m"),
                (&mut self.state.v[i], "opt_v"),
            ] {
                let (Some(s), Some(g)) = (
                    slot.as_mut(),
                    run.cfg.init_opt.get(&format!("{key}/{}", p.name)),
                ) else {
                    continue;
                };
                let idx = param_indices(&run.topo, rank, p, run.placements.get(&i), run.prog)?;
                *s = local_piece_at(&idx, &p.stored, run.prog, g, run.cfg.dtype, &self.ex.dev)?;
            }
        }
        Ok(())
    }

    /// On the virtual mesh, the replicas of a parameter piece share its
    /// tensor (the piece cache) and, when it steps in place, its optimizer
    /// slots: the first replica steps them for all, the others skip (same
    /// bits, a replica's share of the work and memory), and a barrier after
    /// the step keeps every device from reading a parameter mid-step. A piece
    /// no other device here holds (`alone`) steps in place without a first
    /// copy. Then the slots this device steps are faulted in.
    fn share_slots(&mut self, alone: &[bool]) -> R<()> {
        let (run, rank) = (self.run, self.rank);
        let (state, params) = (&mut self.state, &self.params);
        if self.shared {
            for (pi, p) in run.prog.params.iter().enumerate() {
                let copies = run.step.params[pi].copies;
                let axes = &self.ex.replicas(pi).0;
                if !self.ex.holds(pi)
                    || run.placements.contains_key(&pi)
                    || p.frozen
                    || copies < 2
                    || !state.in_place(pi, &params[pi])
                {
                    continue;
                }
                let key = piece_key(&run.topo, rank, pi, p);
                let (m, v) = match run.slots.lock() {
                    Ok(mut c) => c
                        .entry(key)
                        .or_insert_with(|| (state.m[pi].clone(), state.v[pi].clone()))
                        .clone(),
                    Err(_) => return Err("a device failed while sharing optimizer state".into()),
                };
                state.m[pi] = m;
                state.v[pi] = v;
                if run.topo.group(rank, axes).into_iter().min() == Some(rank) {
                    state.claim(pi, &params[pi]);
                } else {
                    self.skip[pi] = true;
                }
            }
        }
        for (pi, _) in alone.iter().enumerate().filter(|(_, a)| **a) {
            if !run.placements.contains_key(&pi) && state.in_place(pi, &params[pi]) {
                state.claim(pi, &params[pi]);
            }
        }
        // Tables step only the rows a batch touched: their slots stay
        // untouched until then.
        let leave: Vec<bool> = self
            .skip
            .iter()
            .enumerate()
            .map(|(i, s)| *s || run.placements.contains_key(&i))
            .collect();
        state.fault_in(&leave);
        Ok(())
    }

    /// Every step of the run; returns what device 0 gathered.
    pub fn train(mut self) -> Result<Gathered, RunError> {
        crate::heap::steps_begin();
        for step in self.run.cfg.start_step..self.run.end {
            if self.run.stop.is_some_and(|s| !s.runs(step)) {
                // Asked to end here: the parameters as they are now are the
                // final ones (every device stops before the same step).
                if self.run.cfg.keep_final && step > self.run.cfg.start_step {
                    self.last = super::train::gather_global(&self.ex, &self.params)?;
                }
                break;
            }
            self.step(step)?;
        }
        Ok(Gathered {
            first_grads: self.first,
            memory: self.memory,
            last: self.last,
            pipeline_time: self.pipeline_time,
        })
    }

    /// Every device takes the newest reload any of them has seen.
    fn take_reload(&mut self, step: usize) -> Result<Option<String>, RunError> {
        let Some(rl) = self.run.reloads else {
            return Ok(None);
        };
        let all_axes: Vec<String> = self.run.topo.axes.iter().map(|a| a.0.clone()).collect();
        let seen = Tensor::new(&[rl.visible(step) as f64], &self.ex.dev).map_err(ce)?;
        let agreed = self
            .run
            .comm
            .pmax(self.rank, &seen, &all_axes)
            .and_then(|t| crate::kernels::host::read::<f64>(&t))
            .map_err(ce)?;
        let agreed = agreed.first().copied().unwrap_or(0.0) as usize;
        if agreed <= self.active.update.as_ref().map_or(0, |u| u.generation) {
            return Ok(None);
        }
        let u = rl.get(agreed).ok_or("a reload was lost")?;
        let step_of = self.run.step_of(&u.cfg);
        self.state.opts = step_of.params.iter().map(|p| p.optimizer.clone()).collect();
        let note = format!("reload {}: {}", u.generation, u.summary);
        self.active = Active {
            stages: Some(Stages::of(&u.prog)?),
            step: Some(std::rc::Rc::new(step_of)),
            update: Some(u),
        };
        Ok(Some(note))
    }

    /// One step of the run.
    fn step(&mut self, step: usize) -> Result<(), RunError> {
        let run = self.run;
        let cfg = run.cfg;
        profile::device_step(step);
        let dev = self.ex.dev.clone();
        let batch = profile::time(&dev, Phase::Step, "batch", None, || {
            run.batches.get(step, &|s| run.batch_at(s))
        })?;
        let reloaded = self.take_reload(step)?;
        let update = self.active.update.clone();
        let (prog, cfg_now): (&Program, &Config) = match &update {
            Some(u) => (&u.prog, &u.cfg),
            None => (run.prog, cfg),
        };
        let generation = update.as_ref().map_or(0, |u| u.generation);
        let ex = self.ex.with_program(prog);
        // Mixed precision: the passes use 16-bit copies of the master
        // weights, and their gradients come back in f32.
        let cdt = run.compute();
        let work = profile::time(&dev, Phase::Step, "cast parameters", None, || {
            working(&self.params, cdt)
        })?;
        let stages = self.active.stages.as_ref().unwrap_or(&run.stages);
        ex.sparse.touched.borrow_mut().clear();
        let passes = StepCx {
            run,
            ex: &ex,
            prog,
            rank: self.rank,
            step,
            batch: &batch,
            generation,
            stages,
            work: &work,
            params: &self.params,
        }
        .passes()?;
        let k = run.io.k;
        let reloaded_step = self.active.step.clone();
        let step_prog: &Step = reloaded_step.as_deref().unwrap_or(&run.step);
        let grad_sum = passes.grads.own_bytes();
        let grads = profile::time(&dev, Phase::Step, "gradient sync", None, || {
            sync_grads(&ex, step_prog, passes.grads.into_vec())
        })?;
        // A pipeline's first stages keep no whole-program tape.
        let tape = match passes.tape {
            Some(t) => t,
            None if stages.is_some() => ex.empty_tape(&work, &[])?,
            None => return Err("no microbatch".into()),
        };
        let (grads, loss) = if k > 1 {
            let g = grads
                .iter()
                .map(|g| g / k as f64)
                .collect::<candle_core::Result<Vec<_>>>()
                .map_err(ce)?;
            (g, passes.loss / k as f64)
        } else {
            (grads, passes.loss)
        };
        if !loss.is_finite() {
            // Every device sees the same loss, so all stop here together.
            let model = &tape.vals[..prog.model_nodes().min(tape.vals.len())];
            return Err(RunError::non_finite(step, loss, model, generation));
        }
        if let (Some((busy, wall)), true) = (&passes.pipeline_time, step > 0 && self.rank == 0) {
            let (b, w) = self
                .pipeline_time
                .get_or_insert_with(|| (vec![0.0; busy.len()], 0.0));
            b.iter_mut().zip(busy).for_each(|(a, x)| *a += x);
            *w += wall;
        }
        if step == 0 && self.rank == 0 {
            let m = Measured {
                prog,
                work: &work,
                master: (cdt != cfg.dtype).then_some(self.params.as_slice()),
                grads: &grads,
                grad_sum,
                optimizer_state: self.state.bytes(),
                tape: &tape,
                held: ex.held.get(),
                peaks: passes.peaks,
                pipelined: stages.is_some(),
            };
            let mut m = m.memory();
            m.device_in_use = crate::runtime::device::gpu_bytes_used(&ex.dev).map(|b| b as f64);
            self.memory = Some(m);
        }
        drop(tape);
        if run.want_grads && step == 0 {
            self.first = gather_global(&ex, &grads)?;
        }
        let norm = self.update(&ex, step_prog, cfg_now, step, &grads)?;
        if cfg.keep_final && step + 1 == run.end {
            self.last = gather_global(&ex, &self.params)?;
        }
        if cfg.checkpoint.is_some() {
            profile::time(&dev, Phase::Step, "checkpoint", None, || {
                self.save_checkpoint(&ex, step, cfg_now)
            })?;
        }
        let eval_loss = profile::time(&dev, Phase::Step, "eval", None, || {
            self.eval(&ex, prog, step, generation)
        })?;
        if self.rank == 0 {
            let mut notes = run
                .sparse
                .get(step)
                .map(|x| x.notes.clone())
                .unwrap_or_default();
            notes.extend(reloaded);
            let metrics = metric_values(&cfg.metrics, &passes.metric_sums);
            // Observed values: the mean over the step's microbatches.
            let observed: Observed = aux_split(prog, &passes.aux_sum)
                .1
                .into_iter()
                .map(|(n, v)| (n, v.iter().map(|x| x / k as f64).collect()))
                .collect();
            let _ = self.tx.send(StepReport {
                step,
                notes,
                loss,
                lr: cfg_now.optimizer.lr.at(step),
                grad_norm: norm,
                eval_loss,
                metrics,
                observed,
                done: std::time::Instant::now(),
            });
        }
        Ok(())
    }

    /// Clipping and the optimizer step; returns the gradients' global norm.
    fn update(
        &mut self,
        ex: &Exec,
        step_prog: &Step,
        cfg_now: &Config,
        step: usize,
        grads: &[Tensor],
    ) -> R<f64> {
        let run = self.run;
        let norm = profile::time(&ex.dev, Phase::Step, "gradient norm", None, || {
            global_norm(ex, step_prog, grads)
        })?;
        let scale = match cfg_now.clip {
            Some(c) if norm > c => c / norm,
            _ => 1.0,
        };
        // Tables update only the rows this step looked up (on any replica).
        let touched = std::mem::take(&mut *ex.sparse.touched.borrow_mut());
        let mut masks: Vec<Option<Tensor>> = vec![None; self.params.len()];
        for pi in run.placements.keys() {
            let rows = self.params[*pi].dims()[0];
            let m = touched.get(pi).cloned().unwrap_or_else(|| vec![0.0; rows]);
            let m = Tensor::from_vec(m, (rows, 1), &ex.dev).map_err(ce)?;
            let (rep, _) = run.topo.replication(&ex.prog.params[*pi].stored, None);
            let m = ex
                .comm
                .pmax(self.rank, &m, &rep)
                .and_then(|t| t.to_dtype(run.cfg.dtype))
                .map_err(ce)?;
            masks[*pi] = Some(m);
        }
        let (state, params, skip) = (&mut self.state, &mut self.params, &self.skip);
        profile::time(&ex.dev, Phase::Step, "optimizer", None, || {
            state.update(step + 1, params, grads, scale, &masks, skip, &|i| {
                let gather = &step_prog.params.get(i)?.gather;
                (!gather.is_empty())
                    .then(|| Box::new(Split { ex, gather }) as Box<dyn crate::optim::Whole + '_>)
            })
        })?;
        if self.shared {
            run.comm.barrier().map_err(ce)?;
        }
        if Some(&self.rank) == run.local_ranks.first() {
            crate::heap::step_done();
        }
        if step == 0 {
            // The state this device holds, by tensor: replicas that share a
            // piece hold the same tensor.
            if let Ok(mut h) = run.held.lock() {
                let slots = self.state.m.iter().chain(&self.state.v).flatten();
                for t in self.params.iter().chain(slots) {
                    h.insert(t.id(), bytes(t));
                }
            }
        }
        Ok(norm)
    }

    /// A checkpoint after `step` when the cadence asks for one: every
    /// device takes part in gathering; device 0 writes.
    fn save_checkpoint(&self, ex: &Exec, step: usize, cfg_now: &Config) -> Result<(), RunError> {
        let (run, prog) = (self.run, ex.prog);
        let cfg = run.cfg;
        let Some(crate::spec::Checkpoint { every, keep, dir }) = &cfg.checkpoint else {
            return Ok(());
        };
        if !(step + 1).is_multiple_of(*every) {
            return Ok(());
        }
        // What it holds, the same on every device: each parameter and its
        // optimizer slots, by the name the file gives them.
        let mut held: Vec<(String, usize, &Tensor)> = Vec::new();
        for (i, p) in prog.params.iter().enumerate() {
            held.push((format!("param/{}", p.name), i, &self.params[i]));
            for (slot, key) in [(&self.state.m[i], "opt_m"), (&self.state.v[i], "opt_v")] {
                if let Some(t) = slot {
                    held.push((format!("{key}/{}", p.name), i, t));
                }
            }
        }
        let manifest = super::checkpoint::Manifest {
            format: super::checkpoint::FORMAT.into(),
            model: prog.model.clone(),
            run: run.run_id.clone(),
            step: step + 1,
            seed: cfg.seed,
            rng: format!("counter-based: seed {}, counter = step; dropout streams from (seed, step, microbatch)", cfg.seed),
            data_position: (step + 1) * cfg.batch,
            mesh: prog.mesh.clone(),
            dtype: if cfg.dtype == DType::F64 { "f64".into() } else { "f32".into() },
            optimizer: cfg_now.optimizer.name().into(),
            tensors: held
                .iter()
                .map(|(name, i, _)| super::checkpoint::TensorInfo {
                    name: name.clone(),
                    shape: prog.params[*i].stored.known_shape(),
                    layout: prog.params[*i].stored.to_string(),
                    sha256: String::new(),
                })
                .collect(),
        };
        // Every device gathers each tensor in the order the file is written
        // in; device 0 writes each as it comes.
        if self.rank != 0 {
            for k in super::checkpoint::write::order(&manifest) {
                let (_, i, t) = held[k];
                gather_one(ex, i, t)?;
            }
            return Ok(());
        }
        let f64 = cfg.dtype == DType::F64;
        let saved = super::checkpoint::save(dir, *keep, &manifest, f64, |order, sink| {
            for &k in order {
                let (_, i, t) = held[k];
                if f64 {
                    sink.put(k, &gather_one(ex, i, t)?.unwrap_or_default());
                } else {
                    sink.put(k, &gather_as::<f32>(ex, i, t)?.unwrap_or_default());
                }
            }
            Ok::<(), RunError>(())
        })?;
        // A failed save stops the run (the other devices are told to stop
        // too): it must not go on unsaved.
        saved.map(|_| ()).map_err(|e| {
            format!(
                "the checkpoint after step {} was not written: {e}",
                step + 1
            )
            .into()
        })
    }

    /// Held-out loss after `step` when the cadence asks for it: forward
    /// only, no dropout, the same batch size, with the parameters as this
    /// step's update left them.
    fn eval(
        &self,
        ex: &Exec,
        prog: &Program,
        step: usize,
        generation: usize,
    ) -> Result<Option<f64>, RunError> {
        let (run, rank) = (self.run, self.rank);
        let (cfg, io) = (run.cfg, &run.io);
        let Some(crate::spec::Eval {
            every,
            steps: esteps,
        }) = cfg.eval
        else {
            return Ok(None);
        };
        if !(step + 1).is_multiple_of(every) {
            return Ok(None);
        }
        let cdt = run.compute();
        let work = working(&self.params, cdt)?;
        let stages = self.active.stages.as_ref().unwrap_or(&run.stages);
        // Held-out batches are looked up whole.
        ex.sparse.keep.borrow_mut().clear();
        let mut total = 0.0;
        for e in 0..esteps {
            let mut b = run.src.batch(
                cfg.seed,
                e,
                cfg.batch / io.k,
                &io.micro_sizes,
                &io.int_inputs,
                io.vocab,
                io.rows,
                io.per_position,
                true,
                run.want_eval.as_deref(),
            )?;
            let mut xs: Vec<Tensor> = io
                .inputs
                .iter()
                .zip(&b.inputs)
                .map(|(t, v)| local_piece(&run.topo, rank, t, prog, v, cdt, &ex.dev))
                .collect::<R<_>>()?;
            xs.push(local_piece(
                &run.topo,
                rank,
                &io.label_t,
                prog,
                &b.labels,
                cfg.dtype,
                &ex.dev,
            )?);
            if let Some((wt, n)) = &io.weights {
                b.weights = run.src.weights(cfg.seed, e, *n, true);
                xs.push(local_piece(
                    &run.topo, rank, wt, prog, &b.weights, cfg.dtype, &ex.dev,
                )?);
            }
            // A held-out batch's loss is the mean over its counted targets,
            // and its `step_total`s are its own sums (one microbatch).
            super::passes::count_targets(ex, run, prog, rank, &b.labels, 1)?;
            ex.totals.borrow_mut().clear();
            total += match stages {
                // Through the stages, forward only.
                Some(st) => {
                    let mb = std::cell::RefCell::new(Some(xs));
                    let micro = |_: usize| -> R<super::pipeline::Micro> {
                        let inputs = mb.borrow_mut().take().ok_or("one held-out batch")?;
                        Ok(super::pipeline::Micro {
                            inputs,
                            seed: None,
                            keep: Default::default(),
                        })
                    };
                    let n_sums = cfg.metrics.iter().map(|m| m.sums()).sum();
                    super::pipeline::run_chunk(ex, st, &work, &micro, n_sums, 1, false)?.loss
                }
                None => {
                    let t = ex
                        .forward(&work, &xs, None)
                        .map_err(|e| RunError::op(e, generation))?;
                    ex.loss(&t)?
                }
            };
        }
        Ok(Some(total / esteps.max(1) as f64))
    }
}

/// Each parameter's piece on device `rank`, computed by one device of this
/// process and shared by its replicas here (see [`super::pieces::PieceCache`]);
/// and per parameter, whether no other device here holds its piece.
fn init_params(run: &Run, ex: &Exec, rank: usize) -> R<(Vec<Tensor>, Vec<bool>)> {
    let (prog, cfg, topo) = (run.prog, run.cfg, &run.topo);
    let dev = &ex.dev;
    let mut params = Vec::new();
    let mut alone = vec![false; prog.params.len()];
    for (pi, p) in prog.params.iter().enumerate() {
        // A pipeline stage holds only its own layers' parameters.
        if !ex.holds(pi) {
            params.push(Tensor::zeros(0, cfg.dtype, dev).map_err(ce)?);
            continue;
        }
        let key = piece_key(topo, rank, pi, p);
        // The devices of this process that take this piece: the last one
        // removes it from the cache, so that the run does not keep the
        // initial values beside the trained ones.
        let takers = run
            .local_ranks
            .iter()
            .filter(|r| {
                super::exec::holds_at(&ex.stage, topo, **r, pi)
                    && piece_key(topo, **r, pi, p) == key
            })
            .count();
        alone[pi] = takers == 1;
        let cell = match (run.placements.get(&pi), run.pieces.lock()) {
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
            let (starts, len) = param_runs(topo, rank, p, run.placements.get(&pi), prog)?;
            let shape: Vec<usize> = prog
                .local_shape(&p.stored)?
                .iter()
                .map(|x| *x as usize)
                .collect();
            let runs = (starts.as_slice(), len);
            match cfg.init.get(&p.name).or_else(|| run.computed.get(&p.name)) {
                Some(g) => piece_from(runs, shape, cfg.dtype, dev, &init::Given(g)),
                None => {
                    let seed = cfg.seed ^ init::hash_str(&p.name);
                    let g = p.init.generator(&p.stored, seed, &prog.bound);
                    piece_from(runs, shape, cfg.dtype, dev, &g)
                }
            }
        };
        params.push(match cell {
            // The first device here computes; the others wait for it.
            Some(cell) => cell
                .get_or_init(|| make().map_err(|e| e.to_string()))
                .clone()?,
            None => make()?,
        });
    }
    Ok((params, alone))
}

/// A parameter split over the mesh, for an update of the whole matrix:
/// gathered over each split dimension's axes (the innermost first, so the
/// pieces land in the global order), and cut back to this device's piece.
struct Split<'e, 'p> {
    ex: &'e Exec<'p>,
    gather: &'e [(usize, Vec<String>)],
}

impl crate::optim::Whole for Split<'_, '_> {
    fn gather(&self, t: &Tensor) -> R<Tensor> {
        let ex = self.ex;
        let mut t = t.clone();
        for (dim, axes) in self.gather {
            for axis in axes.iter().rev() {
                t = ex.comm.all_gather(ex.rank, &t, axis, *dim).map_err(ce)?;
            }
        }
        Ok(t)
    }

    fn piece(&self, t: &Tensor) -> R<Tensor> {
        let ex = self.ex;
        let topo = ex.comm.topo();
        let mut t = t.clone();
        for (dim, axes) in self.gather {
            let (at, of) = topo.shard_index(ex.rank, axes);
            let len = t.dims().get(*dim).copied().unwrap_or(0) / of.max(1);
            t = t.narrow(*dim, at * len, len).map_err(ce)?;
        }
        t.contiguous().map_err(ce)
    }
}
