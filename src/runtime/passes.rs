//! A step's forward and backward passes on one device: the step's batch cut
//! into microbatches, each run forward, scored by the loss and run backward
//! (through the pipeline's stages, or the whole program with its checkpointed
//! blocks recomputed), their gradients summed in the master weights' type.

use super::data::Batch;
use super::error::RunError;
use super::exec::{Exec, OpError, Tape, R};
use super::memory::Peaks;
use super::optim::GradSum;
use super::pieces::{local_piece, master_grads};
use super::pipeline::{add_into, aux_flat, Micro, Stages};
use super::train::{aux_split, Run};
use crate::prim::kernel::ce;
use crate::prim::Prim;
use crate::spmd::{Op, Program};
use candle_core::{DType, Tensor};

/// What a step's passes leave.
pub struct Passes {
    /// The microbatches' gradients summed (not yet reduced over replicas).
    pub grads: GradSum,
    /// The microbatches' losses (with added loss terms) summed.
    pub loss: f64,
    /// The metrics' sums and the `add_loss` / `observe` values, summed over
    /// the microbatches.
    pub metric_sums: Vec<f64>,
    pub aux_sum: Vec<f64>,
    /// The last microbatch's tape (none on a pipeline's first stages).
    pub tape: Option<Tape>,
    pub peaks: Peaks,
    /// A pipeline's time: each rank's busy seconds and the chunks' seconds.
    pub pipeline_time: Option<(Vec<f64>, f64)>,
}

/// One device's view of a step: its program and the step's batch.
pub struct StepCx<'e, 'r, 'a> {
    pub run: &'r Run<'a>,
    pub ex: &'e Exec<'e>,
    pub prog: &'e Program,
    pub rank: usize,
    pub step: usize,
    pub batch: &'e Batch,
    /// Which program a runtime error's node belongs to (0: the file's).
    pub generation: usize,
    pub stages: &'e Option<Stages>,
    /// The working parameters the passes use, and the master weights.
    pub work: &'e [Tensor],
    pub params: &'e [Tensor],
}

impl StepCx<'_, '_, '_> {
    /// The dtype the passes compute in.
    fn cdt(&self) -> DType {
        self.run.compute()
    }

    /// Microbatch `j`: the j-th contiguous chunk of the step's inputs, targets
    /// and lookup drop masks, and its dropout seed.
    fn microbatch(&self, j: usize) -> R<Micro> {
        let (run, k) = (self.run, self.run.io.k);
        let chunk = |v: &[f64]| -> Vec<f64> {
            let n = v.len() / k;
            v[j * n..(j + 1) * n].to_vec()
        };
        let mut xs: Vec<Tensor> = run
            .io
            .inputs
            .iter()
            .zip(&self.batch.inputs)
            .map(|(t, v)| {
                local_piece(
                    &run.topo,
                    self.rank,
                    t,
                    self.prog,
                    &chunk(v),
                    self.cdt(),
                    &self.ex.dev,
                )
            })
            .collect::<R<_>>()?;
        let labels_f: Vec<f64> = chunk(&self.batch.labels);
        let cfg = run.cfg;
        xs.push(local_piece(
            &run.topo,
            self.rank,
            &run.io.label_t,
            self.prog,
            &labels_f,
            cfg.dtype,
            &self.ex.dev,
        )?);
        if let Some((wt, _)) = &run.io.weights {
            xs.push(local_piece(
                &run.topo,
                self.rank,
                wt,
                self.prog,
                &chunk(&self.batch.weights),
                cfg.dtype,
                &self.ex.dev,
            )?);
        }
        Ok(Micro {
            inputs: xs,
            seed: Some(cfg.seed ^ ((self.step * k + j) as u64).wrapping_mul(0xA24B_AED4_963E_E407)),
            keep: run
                .sparse
                .get(self.step)
                .map(|x| x.keep.iter().map(|(n, mk)| (*n, chunk(mk))).collect())
                .unwrap_or_default(),
        })
    }

    /// Each `step_total`'s value per microbatch of this step, into
    /// `ex.totals` (see [`crate::prim::total`]): its operand computed for
    /// every microbatch from the data alone (the checker refuses one that
    /// depends on the model's output), summed, added over the devices it is
    /// split over, and divided by the microbatches, so that every microbatch
    /// divides by the same number. With one microbatch each computes its own.
    fn step_totals(&self) -> Result<(), OpError> {
        let (ex, prog, k) = (self.ex, self.prog, self.run.io.k);
        ex.totals.borrow_mut().clear();
        let nodes: Vec<usize> = (0..prog.nodes.len())
            .filter(|i| matches!(prog.nodes[*i].op, Op::Prim(Prim::StepTotal(_))))
            .collect();
        if nodes.is_empty() || k <= 1 {
            return Ok(());
        }
        // What the operands are computed from.
        let mut need = vec![false; prog.nodes.len()];
        let mut todo: Vec<usize> = nodes
            .iter()
            .flat_map(|i| prog.nodes[*i].args.iter().map(|a| *a as usize))
            .collect();
        while let Some(i) = todo.pop() {
            if !std::mem::replace(&mut need[i], true) {
                todo.extend(prog.nodes[i].args.iter().map(|a| *a as usize));
            }
        }
        let mut sums = vec![0.0; nodes.len()];
        for j in 0..k {
            let mb = self.microbatch(j).map_err(OpError::general)?;
            let mut tape = ex
                .empty_tape(self.work, &mb.inputs)
                .map_err(OpError::general)?;
            ex.forward_where(&mut tape, 0..prog.nodes.len(), None, &|i| need[i])?;
            for (s, i) in sums.iter_mut().zip(&nodes) {
                let a = prog.nodes[*i].args[0] as usize;
                let v = tape.vals[a]
                    .to_dtype(DType::F64)
                    .and_then(|t| t.sum_all())
                    .and_then(|t| t.to_scalar::<f64>())
                    .map_err(|e| OpError::general(ce(e)))?;
                *s += v;
            }
        }
        let mut totals = Vec::new();
        for (s, i) in sums.into_iter().zip(&nodes) {
            let t = &prog.nodes[prog.nodes[*i].args[0] as usize].ty;
            let axes: Vec<String> = t.dims.iter().flat_map(|d| d.axes.clone()).collect();
            let all = Tensor::new(&[s], &ex.dev)
                .and_then(|l| ex.comm.psum(self.rank, &l, &axes))
                .and_then(|t| crate::kernels::host::read::<f64>(&t))
                .map_err(|e| OpError::general(ce(e)))?;
            let all = all.first().copied().unwrap_or(0.0);
            totals.push((*i, all / k as f64));
        }
        *ex.totals.borrow_mut() = totals;
        Ok(())
    }

    /// Every microbatch of the step, through the pipeline or not.
    pub fn passes(&self) -> Result<Passes, RunError> {
        count_targets(
            self.ex,
            self.run,
            self.prog,
            self.rank,
            &self.batch.labels,
            self.run.io.k,
        )?;
        self.step_totals()
            .map_err(|e| RunError::op(e, self.generation))?;
        match self.stages {
            Some(st) => self.pipelined(st),
            None => self.plain(),
        }
    }

    /// Pipelined: `accumulate` chunks of M microbatches each.
    fn pipelined(&self, st: &Stages) -> Result<Passes, RunError> {
        let (ex, run) = (self.ex, self.run);
        let cfg = run.cfg;
        let m_count = st.microbatches;
        let mut acc: Option<(GradSum, f64)> = None;
        let (mut metric_sums, mut aux_sum) = (Vec::new(), Vec::new());
        let mut tape = None;
        let mut peaks = Peaks::default();
        let mut time: Option<(Vec<f64>, f64)> = None;
        for a in 0..run.io.k / m_count {
            let micro = |m: usize| self.microbatch(a * m_count + m);
            let n_sums = cfg.metrics.iter().map(|m| m.sums()).sum();
            let c = super::pipeline::run_chunk(ex, st, self.work, &micro, n_sums, m_count, true)?;
            peaks.max(Peaks {
                activations: c.peak_activations,
                gathered: c.peak_gathered,
                recompute: 0.0,
            });
            let (busy, wall) = time.get_or_insert_with(|| (vec![0.0; c.busy.len()], 0.0));
            add_into(busy, &c.busy);
            *wall += c.wall;
            let g = master_grads(c.grads, self.params)?;
            let loss = c.loss + aux_split(self.prog, &c.aux).0;
            add_into(&mut metric_sums, &c.sums);
            add_into(&mut aux_sum, &c.aux);
            acc = Some(accumulate(acc, g, loss)?);
            if c.tape.is_some() {
                tape = c.tape;
            }
        }
        let (grads, loss) = acc.ok_or("no microbatch")?;
        Ok(Passes {
            grads,
            loss,
            metric_sums,
            aux_sum,
            tape,
            peaks,
            pipeline_time: time,
        })
    }

    /// Each microbatch forward, scored, and backward over the whole program.
    fn plain(&self) -> Result<Passes, RunError> {
        let (ex, run, prog) = (self.ex, self.run, self.prog);
        let mut acc: Option<(GradSum, f64)> = None;
        let (mut metric_sums, mut aux_sum) = (Vec::new(), Vec::new());
        let mut tape: Option<Tape> = None;
        let mut peaks = Peaks::default();
        for j in 0..run.io.k {
            let mb = self.microbatch(j)?;
            // The previous microbatch's values are spent.
            drop(tape.take());
            *ex.sparse.keep.borrow_mut() = mb.keep;
            let mut t = ex
                .forward(self.work, &mb.inputs, mb.seed)
                .map_err(|e| RunError::op(e, self.generation))?;
            let (loss, sums) = (ex.loss(&t)?, ex.metric_sums(&t)?);
            let aux = aux_flat(prog, &t, &|_| true)?;
            let loss = loss + aux_split(prog, &aux).0;
            add_into(&mut aux_sum, &aux);
            add_into(&mut metric_sums, &sums);
            if !loss.is_finite() {
                // Every device sees the same loss, so all stop here together.
                return Err(RunError::non_finite(
                    self.step,
                    loss,
                    &t.vals[..prog.model_nodes()],
                    self.generation,
                ));
            }
            let seed = ex.seed(&t)?;
            // Local gradients accumulate; they are synchronised once per step.
            let g = if prog.checkpoints.is_empty() {
                ex.backward(&t, seed)?
            } else {
                // Checkpointed blocks keep only their results, and
                // recompute the rest for backward.
                ex.drop_checkpointed(&mut t, 0..prog.nodes.len())?;
                let (g, peak) = ex
                    .backward_checkpointed(&mut t, seed, mb.seed)
                    .map_err(|e| RunError::op(e, self.generation))?;
                peaks.recompute = peaks.recompute.max(peak);
                g
            };
            let g = master_grads(g, self.params)?;
            acc = Some(accumulate(acc, g, loss)?);
            tape = Some(t);
        }
        let (grads, loss) = acc.ok_or("no microbatch")?;
        Ok(Passes {
            grads,
            loss,
            metric_sums,
            aux_sum,
            tape,
            peaks,
            pipeline_time: None,
        })
    }
}

/// The loss's `ignore_index`, when it has one.
fn ignored_target(prog: &Program) -> Option<i64> {
    let root = prog.objective.as_ref()?.root as usize;
    match &prog.nodes.get(root)?.op {
        crate::spmd::Op::Prim(crate::prim::Prim::Objective(o)) => o.ignore,
        _ => None,
    }
}

/// With an `ignore_index`, set `ex.counted` to the targets of `labels` (a
/// step's global batch of `k` microbatches) that count, per microbatch: the
/// loss of every microbatch is then its sum over the step's count, and the
/// step's mean over its microbatches the mean over every counted target.
/// Each device counts its pieces; the sum crosses the devices the targets
/// are split over. At least one target counts (a batch of ignored targets
/// has loss 0).
pub(super) fn count_targets(
    ex: &Exec,
    run: &Run,
    prog: &Program,
    rank: usize,
    labels: &[f64],
    k: usize,
) -> R<()> {
    let Some(skip) = ignored_target(prog) else {
        ex.counted.set(None);
        return Ok(());
    };
    let (k, t) = (k.max(1), &run.io.label_t);
    let n = labels.len() / k;
    let mut here = 0usize;
    for j in 0..k {
        let piece = local_piece(
            &run.topo,
            rank,
            t,
            prog,
            &labels[j * n..(j + 1) * n],
            DType::F64,
            &ex.dev,
        )?;
        let ids = crate::kernels::host::read::<f64>(&piece).map_err(ce)?;
        here += ids.iter().filter(|v| **v != skip as f64).count();
    }
    let axes: Vec<String> = t.dims.iter().flat_map(|d| d.axes.clone()).collect();
    let local = Tensor::new(&[here as f64], &ex.dev).map_err(ce)?;
    let all = ex
        .comm
        .psum(rank, &local, &axes)
        .and_then(|t| crate::kernels::host::read::<f64>(&t))
        .map_err(ce)?;
    let all = all.first().copied().unwrap_or(0.0).max(1.0);
    ex.counted.set(Some(all / k as f64));
    Ok(())
}

/// One more microbatch's gradients and loss into the step's sums.
fn accumulate(acc: Option<(GradSum, f64)>, g: Vec<Tensor>, loss: f64) -> R<(GradSum, f64)> {
    Ok(match acc {
        None => (GradSum::new(g), loss),
        Some((mut a, l)) => {
            a.add(&g)?;
            (a, l + loss)
        }
    })
}
