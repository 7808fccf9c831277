//! Pipeline parallelism: a `repeat(..., stages: axis)` stack cut into
//! pieces (virtual stages, `chunks` per rank) over the axis, microbatches
//! moved between them point to point, in the order the schedule gives
//! ([`crate::schedule`]: GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZBV). Each
//! rank runs its own list of passes — a forward, a backward, or one half of
//! a split backward ([`super::split`]) — of one microbatch through one of its
//! pieces at a time, as the schedule's verifier simulated it: a pass first
//! takes the value it reads from another rank ([`Collectives::recv`], which
//! waits for it), and what a pass makes is sent on without waiting
//! ([`Collectives::send`]), or kept when its reader lives on the same rank.
//! Messages are labelled by microbatch and piece, so a rank takes them in
//! its own order. The verifier proved every list can run to its end (no
//! deadlock), so no rank waits for a value that never comes; the ranks wait
//! only where the schedule has a bubble, and each rank's measured idle share
//! is its bubble.
//!
//! [`Collectives::recv`]: crate::mesh::Collectives::recv
//! [`Collectives::send`]: crate::mesh::Collectives::send

use super::exec::{Exec, Fault, Tape, R};
use super::split::Deferred;
use crate::schedule::{Action, Pass};
use crate::spmd::{Kept, Program};
use candle_core::Tensor;
use std::collections::HashMap;
use std::ops::Range;

fn ce(e: candle_core::Error) -> crate::fault::Fault {
    e.into()
}

/// Where each piece's work lies in the program.
#[derive(Clone, Debug)]
pub struct Stages {
    pub axis: String,
    /// Ranks on the axis.
    pub stages: usize,
    pub microbatches: usize,
    pub schedule: crate::schedule::Source,
    /// Everything before the stack (piece 0 runs it), each piece's layers, and
    /// everything after (the last piece runs it, with the loss).
    pub pre: Range<usize>,
    pub ranges: Vec<Range<usize>>,
    pub post: Range<usize>,
    /// The value each piece reads (the stack's input for piece 0), and the
    /// value the last piece hands to `post`.
    pub inputs: Vec<usize>,
    pub output: usize,
    /// The rank each piece lives on.
    pub placement: Vec<usize>,
    /// Per parameter: the rank that holds it (`None`: outside the stack, kept
    /// by every device).
    pub param_stage: Vec<Option<usize>>,
}

/// The one value outside `range` (other than inputs and parameters) its nodes read.
fn reads(prog: &Program, range: &Range<usize>) -> R<Option<usize>> {
    let outside = prog.read_from_outside(range);
    match outside.as_slice() {
        [] => Ok(None),
        [one] => Ok(Some(*one)),
        _ => Err(Fault::Shape(format!(
            "a pipeline stage reads {} values from outside it (nodes {:?}); a stage may read only the value entering it",
            outside.len(),
            outside
        ))),
    }
}

impl Stages {
    pub fn of(prog: &Program) -> R<Option<Stages>> {
        let Some(p) = &prog.pipeline else {
            return Ok(None);
        };
        let s = p.stages.max(1);
        let ranges = prog.stage_ranges();
        if ranges.is_empty() {
            return Err(Fault::Shape(format!(
                "{} layers cannot be split into {} pieces",
                p.blocks.len(),
                p.virtual_stages()
            )));
        }
        let first = p.blocks.first().map_or(0, |b| b.0 as usize);
        let last = p.blocks.last().map_or(0, |b| b.1 as usize);
        let mut inputs = Vec::new();
        for r in &ranges {
            inputs.push(reads(prog, r)?.unwrap_or(p.input as usize));
        }
        let post = last..prog.nodes.len();
        let output = reads(prog, &post)?
            .or_else(|| prog.output.map(|o| o as usize))
            .ok_or("the pipeline's output is not used")?;
        if inputs.first() != Some(&(p.input as usize)) {
            return Err("the first stage does not read the stack's input".into());
        }
        let param_stage = prog.param_stages();
        Ok(Some(Stages {
            param_stage,
            placement: p.placement(),
            axis: p.axis.clone(),
            stages: s,
            microbatches: p.microbatches.max(1),
            schedule: p.schedule.clone(),
            pre: 0..first,
            ranges,
            post,
            inputs,
            output,
        }))
    }
}

/// What a microbatch brings: inputs (the model's, then the targets), dropout
/// seed, lookup drop masks.
pub struct Micro {
    pub inputs: Vec<Tensor>,
    /// Dropout seed (`None`: evaluation, no dropout).
    pub seed: Option<u64>,
    pub keep: HashMap<usize, Vec<f64>>,
}

/// The result of running one chunk of microbatches through the pipeline.
pub struct Chunk {
    /// Summed over the microbatches (this device's stage only; zeros elsewhere).
    pub grads: Vec<Option<Tensor>>,
    /// Summed microbatch losses, on every device.
    pub loss: f64,
    /// The metrics' sums (see [`crate::prim::metrics`]) and the `add_loss` /
    /// `observe` values (see [`aux_flat`]), summed over the microbatches, on
    /// every device.
    pub sums: Vec<f64>,
    pub aux: Vec<f64>,
    /// The most bytes of activations this device held at once.
    pub peak_activations: f64,
    /// The most bytes of gathered parameters its microbatches' tapes held at
    /// once.
    pub peak_gathered: f64,
    /// A tape of the last stage's last microbatch (for the NaN report).
    pub tape: Option<Tape>,
    /// Seconds each rank of the stage axis spent running its passes, and
    /// the seconds the chunk took (this device's clock): each rank's idle
    /// share is the measured bubble.
    pub busy: Vec<f64>,
    pub wall: f64,
}

/// Activation bytes a tape holds (inputs and parameters are shared, not
/// counted; parameters gathered for use are [`gathered_bytes`]).
fn tape_bytes(prog: &Program, t: &Tape) -> f64 {
    tape_where(prog, t, &|i| prog.kept(i) == Kept::Activation)
}

/// Bytes of the parameters a tape holds gathered for use.
fn gathered_bytes(prog: &Program, t: &Tape) -> f64 {
    tape_where(prog, t, &|i| prog.kept(i) == Kept::Gathered)
}

fn tape_where(prog: &Program, t: &Tape, counted: &dyn Fn(usize) -> bool) -> f64 {
    t.vals
        .iter()
        .take(prog.nodes.len())
        .enumerate()
        .filter(|(i, _)| counted(*i))
        .map(|(_, v)| super::exec::bytes(v))
        .sum()
}

/// The values of the program's `add_loss` terms and `observe`d values, in
/// node order, flattened: each node's elements where `computed(node)`, zeros
/// elsewhere (so that devices computing different nodes, a pipeline's stages,
/// can sum them).
pub fn aux_flat(prog: &Program, t: &Tape, computed: &dyn Fn(usize) -> bool) -> R<Vec<f64>> {
    let mut out = Vec::new();
    for (i, n) in prog.nodes.iter().enumerate() {
        if n.op.aux().is_none() {
            continue;
        }
        let term = n.args.get(1).map(|a| *a as usize);
        let len = aux_len(prog, n)?;
        match term.and_then(|a| t.vals.get(a)).filter(|_| computed(i)) {
            Some(v) => {
                let v = crate::prim::Kernel::f64s(v)?;
                if v.len() != len {
                    return Err(Fault::Shape(format!(
                        "an added loss or observed value has {} elements, not {len}",
                        v.len()
                    )));
                }
                out.extend(v);
            }
            None => out.extend(std::iter::repeat_n(0.0, len)),
        }
    }
    Ok(out)
}

/// The elements of an `add_loss` term or `observe`d value (node `n`'s
/// operand 1) on each device: its place in [`aux_flat`]'s layout.
pub fn aux_len(prog: &Program, n: &crate::spmd::Node) -> R<usize> {
    match n.args.get(1).and_then(|a| prog.nodes.get(*a as usize)) {
        Some(t) => Ok(prog.local_shape(&t.ty)?.iter().product::<i64>() as usize),
        None => Ok(0),
    }
}

/// `v` added into `acc` elementwise (`acc` empty: a copy of `v`).
pub fn add_into(acc: &mut Vec<f64>, v: &[f64]) {
    if acc.is_empty() {
        acc.extend_from_slice(v);
    } else {
        acc.iter_mut().zip(v).for_each(|(a, b)| *a += b);
    }
}

/// Run microbatches `0..M` of one chunk through the pieces; the last piece
/// computes the loss and the metrics' sums (`n_sums` of them).
pub fn run_chunk(
    ex: &Exec,
    st: &Stages,
    params: &[Tensor],
    micro: &dyn Fn(usize) -> R<Micro>,
    n_sums: usize,
    microbatches: usize,
    train: bool,
) -> R<Chunk> {
    let topo = ex.comm.topo();
    let made = st
        .schedule
        .make(st.stages, microbatches, train)
        .map_err(|e| Fault::Shape(e.to_string()))?;
    // The shape every boundary value has (the repeated layer keeps its type).
    let act_shape: Vec<usize> = ex
        .prog
        .local_shape(&ex.prog.nodes[st.inputs[0]].ty)?
        .iter()
        .map(|x| *x as usize)
        .collect();
    let mut c = OnRank {
        ex,
        st,
        params,
        micro,
        train,
        me: topo.coord(ex.rank, &st.axis),
        zeros: Tensor::zeros(act_shape.as_slice(), ex.dtype, &ex.dev).map_err(ce)?,
        tapes: HashMap::new(),
        deferred: HashMap::new(),
        out_ct: HashMap::new(),
        recv_f: HashMap::new(),
        recv_b: HashMap::new(),
        grads: vec![None; params.len()],
        loss_sum: 0.0,
        sums: vec![0.0; n_sums],
        aux: aux_flat(ex.prog, &ex.empty_tape(params, &[])?, &|_| false)?,
        peak: 0.0,
        peak_gathered: 0.0,
        last_tape: None,
    };
    // The stage's ranks start together and the chunk ends when the last
    // ends, so each rank's idle share is measured against the same span.
    c.align()?;
    let start = std::time::Instant::now();
    let mut busy = 0.0;
    for &a in made.orders.get(c.me).map_or(&[][..], Vec::as_slice) {
        c.take(a)?;
        let t = std::time::Instant::now();
        let sent = c.run(a)?;
        busy += t.elapsed().as_secs_f64();
        if let Some(t) = sent {
            c.pass_on(a, t)?;
        }
    }
    c.align()?;
    let wall = start.elapsed().as_secs_f64();
    c.finish(n_sums, busy, wall)
}

/// Where the value pass `a` makes goes: the piece that reads it, and whether
/// it is an activation (else a gradient).
fn reader(a: Action, pieces: usize) -> Option<(usize, bool)> {
    match a.pass {
        Pass::F if a.stage + 1 < pieces => Some((a.stage + 1, true)),
        Pass::B | Pass::I if a.stage > 0 => Some((a.stage - 1, false)),
        Pass::F | Pass::B | Pass::I | Pass::W => None,
    }
}

/// One device's pieces running a chunk's microbatches in its rank's order.
struct OnRank<'x, 'e> {
    ex: &'x Exec<'e>,
    st: &'x Stages,
    params: &'x [Tensor],
    micro: &'x dyn Fn(usize) -> R<Micro>,
    train: bool,
    /// This device's rank on the stage axis.
    me: usize,
    /// A boundary value's zeros (what a rank sends when it sends nothing).
    zeros: Tensor,
    /// Keyed by (microbatch, piece).
    tapes: HashMap<(usize, usize), Tape>,
    deferred: HashMap<(usize, usize), Deferred>,
    out_ct: HashMap<usize, Tensor>,
    recv_f: HashMap<(usize, usize), Tensor>,
    recv_b: HashMap<(usize, usize), Tensor>,
    grads: Vec<Option<Tensor>>,
    loss_sum: f64,
    sums: Vec<f64>,
    aux: Vec<f64>,
    peak: f64,
    peak_gathered: f64,
    last_tape: Option<Tape>,
}

impl OnRank<'_, '_> {
    fn pieces(&self) -> usize {
        self.st.ranges.len()
    }

    /// Run pass `a`; what it sends on, if anything.
    fn run(&mut self, a: Action) -> R<Option<Tensor>> {
        match a.pass {
            Pass::F => self.forward(a.mb, a.stage),
            Pass::B | Pass::I => self.backward(a.mb, a.stage, a.pass == Pass::I),
            Pass::W => {
                self.weight(a.mb, a.stage)?;
                Ok(None)
            }
        }
    }

    /// Microbatch `m` forward through piece `v` (the first also before the
    /// stack; the last after it, with the loss and, training, the backward
    /// of what follows the stack). Returns what goes to the next piece.
    fn forward(&mut self, m: usize, v: usize) -> R<Option<Tensor>> {
        let (ex, st) = (self.ex, self.st);
        let last = v + 1 == self.pieces();
        let mb = (self.micro)(m)?;
        *ex.sparse.keep.borrow_mut() = mb.keep;
        let mut tape = ex.empty_tape(self.params, &mb.inputs)?;
        if v == 0 {
            ex.forward_range(&mut tape, st.pre.clone(), mb.seed)?;
        } else {
            tape.vals[st.inputs[v]] = self
                .recv_f
                .remove(&(m, v))
                .ok_or_else(|| format!("piece {v}: microbatch {m} never arrived"))?;
        }
        ex.forward_range(&mut tape, st.ranges[v].clone(), mb.seed)?;
        let mut send = None;
        if last {
            ex.forward_range(&mut tape, st.post.clone(), mb.seed)?;
            self.loss_sum += ex.loss(&tape)?;
            let s = ex.metric_sums(&tape)?;
            self.sums.iter_mut().zip(&s).for_each(|(a, b)| *a += b);
            if self.train {
                let seed = ex.seed(&tape)?;
                let cts = ex.backward_range(&tape, &[seed], st.post.clone(), &mut self.grads)?;
                let g = cts[st.output].clone().unwrap_or_else(|| self.zeros.clone());
                self.out_ct.insert(m, g);
            }
        } else {
            send = Some(tape.vals[st.inputs[v + 1]].clone());
        }
        // The added losses and observed values this piece computed.
        let mine = |i: usize| {
            (v == 0 && st.pre.contains(&i))
                || st.ranges[v].contains(&i)
                || (last && st.post.contains(&i))
        };
        add_into(&mut self.aux, &aux_flat(ex.prog, &tape, &mine)?);
        if self.train {
            // Checkpointed blocks keep only their results in flight.
            if !ex.prog.checkpoints.is_empty() {
                ex.drop_checkpointed(&mut tape, st.ranges[v].clone())?;
            }
            self.tapes.insert((m, v), tape);
            self.peak = self
                .peak
                .max(self.tapes.values().map(|t| tape_bytes(ex.prog, t)).sum());
            self.peak_gathered = self.peak_gathered.max(
                self.tapes
                    .values()
                    .map(|t| gathered_bytes(ex.prog, t))
                    .sum(),
            );
        }
        Ok(send)
    }

    /// Microbatch `m` backward through piece `v` (the first also before the
    /// stack), whole or (`input_only`) its input-gradient half. Returns the
    /// gradient that goes to the previous piece.
    fn backward(&mut self, m: usize, v: usize, input_only: bool) -> R<Option<Tensor>> {
        let (ex, st) = (self.ex, self.st);
        let last = v + 1 == self.pieces();
        let mb = (self.micro)(m)?;
        *ex.sparse.keep.borrow_mut() = mb.keep;
        let mut tape = self
            .tapes
            .remove(&(m, v))
            .ok_or_else(|| format!("piece {v}: no forward of microbatch {m}"))?;
        let (seed_node, g) = if last {
            (
                st.output,
                self.out_ct.remove(&m).ok_or("missing loss cotangent")?,
            )
        } else {
            let g = self
                .recv_b
                .remove(&(m, v))
                .ok_or_else(|| format!("piece {v}: gradient of microbatch {m} never arrived"))?;
            (st.inputs[v + 1], g)
        };
        let seeds = vec![(seed_node, g)];
        let cts = if input_only {
            let (cts, later) = ex.backward_input(&tape, &seeds, st.ranges[v].clone())?;
            self.deferred.insert((m, v), later);
            cts
        } else if ex.prog.checkpoints.is_empty() {
            ex.backward_range(&tape, &seeds, st.ranges[v].clone(), &mut self.grads)?
        } else {
            // The piece's blocks recomputed one at a time.
            let (cts, block) = ex.backward_checkpointed_range(
                &mut tape,
                seeds,
                st.ranges[v].clone(),
                &mut self.grads,
                mb.seed,
            )?;
            let held: f64 = self.tapes.values().map(|t| tape_bytes(ex.prog, t)).sum();
            self.peak = self.peak.max(held + tape_bytes(ex.prog, &tape) + block);
            cts
        };
        let g_in = cts[st.inputs[v]]
            .clone()
            .unwrap_or_else(|| self.zeros.clone());
        let mut send = None;
        if v == 0 {
            ex.backward_range(
                &tape,
                &[(st.inputs[0], g_in)],
                st.pre.clone(),
                &mut self.grads,
            )?;
        } else {
            send = Some(g_in);
        }
        if input_only {
            // The weight-gradient half reads the activations.
            self.tapes.insert((m, v), tape);
        } else if last {
            self.last_tape = Some(tape);
        }
        Ok(send)
    }

    /// The weight-gradient half of microbatch `m`'s backward through piece
    /// `v`; its activations go.
    fn weight(&mut self, m: usize, v: usize) -> R<()> {
        let (ex, st) = (self.ex, self.st);
        let tape = self
            .tapes
            .remove(&(m, v))
            .ok_or_else(|| format!("piece {v}: no forward of microbatch {m}"))?;
        let later = self
            .deferred
            .remove(&(m, v))
            .ok_or_else(|| format!("piece {v}: no input gradient of microbatch {m}"))?;
        ex.backward_weight(&tape, later, st.ranges[v].clone(), &mut self.grads)?;
        if v + 1 == self.pieces() {
            self.last_tape = Some(tape);
        }
        Ok(())
    }

    /// Before pass `a`: the value it reads from a piece on another rank
    /// (a piece on this rank left it here when it ran).
    fn take(&mut self, a: Action) -> R<()> {
        let (ex, st) = (self.ex, self.st);
        let last = a.stage + 1 == self.pieces();
        let (from, forward) = match a.pass {
            Pass::F if a.stage > 0 => (a.stage - 1, true),
            Pass::B | Pass::I if !last => (a.stage + 1, false),
            Pass::F | Pass::B | Pass::I | Pass::W => return Ok(()),
        };
        let rank = st.placement[from];
        if rank == self.me {
            return Ok(());
        }
        let key = (a.mb, a.stage);
        let tag = self.tag(key, forward);
        let got = ex
            .comm
            .recv(ex.rank, &self.zeros, &st.axis, rank, tag)
            .map_err(ce)?;
        if forward {
            self.recv_f.insert(key, got);
        } else {
            self.recv_b.insert(key, got);
        }
        Ok(())
    }

    /// After pass `a`: what it made goes to the rank of the piece that reads
    /// it — kept when that is this rank, else sent without waiting.
    fn pass_on(&mut self, a: Action, t: Tensor) -> R<()> {
        let (ex, st) = (self.ex, self.st);
        let Some((to, forward)) = reader(a, self.pieces()) else {
            return Ok(());
        };
        let key = (a.mb, to);
        let rank = st.placement[to];
        if rank != self.me {
            let tag = self.tag(key, forward);
            return ex.comm.send(ex.rank, &t, &st.axis, rank, tag).map_err(ce);
        }
        if forward {
            self.recv_f.insert(key, t);
        } else {
            self.recv_b.insert(key, t);
        }
        Ok(())
    }

    /// The label of the value for (microbatch, piece), an activation or a
    /// gradient: unique among any pair of ranks' messages in flight.
    fn tag(&self, (mb, piece): (usize, usize), forward: bool) -> u32 {
        let n = (mb * self.pieces() + piece) * 2 + usize::from(forward);
        (n % crate::mesh::MAX_TAG as usize) as u32
    }

    /// Wait until every rank of the stage axis arrives (a sum of nothing).
    fn align(&self) -> R<()> {
        let ex = self.ex;
        let none = Tensor::zeros(1, candle_core::DType::F32, &ex.dev).map_err(ce)?;
        ex.comm
            .psum(ex.rank, &none, std::slice::from_ref(&self.st.axis))
            .map_err(ce)?;
        Ok(())
    }

    /// Every device reports the losses and metrics the last piece computed,
    /// and the values each piece added or observed.
    fn finish(self, n_sums: usize, busy: f64, wall: f64) -> R<Chunk> {
        let ex = self.ex;
        let ranks = self.st.stages.max(1);
        let mut all = vec![self.loss_sum];
        all.extend(&self.sums);
        all.extend(&self.aux);
        // Each rank's busy seconds in its own slot (summed: every rank's).
        all.extend((0..ranks).map(|r| if r == self.me { busy } else { 0.0 }));
        let n = all.len();
        let total = Tensor::from_vec(all, n, &ex.dev).map_err(ce)?;
        let total = ex
            .comm
            .psum(ex.rank, &total, std::slice::from_ref(&self.st.axis))
            .and_then(|t| crate::kernels::host::read::<f64>(&t))
            .map_err(ce)?;
        let timed = total.len().saturating_sub(ranks);
        Ok(Chunk {
            grads: self.grads,
            loss: total.first().copied().unwrap_or(f64::NAN),
            sums: total.get(1..1 + n_sums).unwrap_or_default().to_vec(),
            aux: total.get(1 + n_sums..timed).unwrap_or_default().to_vec(),
            busy: total.get(timed..).unwrap_or_default().to_vec(),
            wall,
            peak_activations: self.peak,
            peak_gathered: self.peak_gathered,
            tape: self.last_tape,
        })
    }
}
