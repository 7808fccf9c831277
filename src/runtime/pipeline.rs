//! Pipeline parallelism: a `repeat(..., stages: axis)` stack split into stages over
//! the axis, microbatches moved between stages with `ppermute`, in the order a
//! schedule (GPipe or 1F1B) gives. All devices advance in lockstep ticks; in each
//! tick every device does at most one forward or one backward of one microbatch,
//! then activations move one stage on and gradients one stage back.

use super::exec::{Exec, Fault, Tape, R};
use crate::schedule::{timeline, Act};
use crate::spmd::{Kept, Op, Program};
use candle_core::Tensor;
use std::collections::HashMap;
use std::ops::Range;

fn ce(e: candle_core::Error) -> crate::fault::Fault {
    e.into()
}

/// Where each stage's work lies in the program.
#[derive(Clone, Debug)]
pub struct Stages {
    pub axis: String,
    pub stages: usize,
    pub microbatches: usize,
    pub schedule: crate::vocab::Pipe,
    /// Everything before the stack (stage 0 runs it), each stage's layers, and
    /// everything after (the last stage runs it, with the loss).
    pub pre: Range<usize>,
    pub ranges: Vec<Range<usize>>,
    pub post: Range<usize>,
    /// The value each stage reads (the stack's input for stage 0), and the value
    /// the last stage hands to `post`.
    pub inputs: Vec<usize>,
    pub output: usize,
    /// Per parameter: the stage that holds it (`None`: outside the stack, kept by
    /// every device).
    pub param_stage: Vec<Option<usize>>,
}

/// The one value outside `range` (other than inputs and parameters) its nodes read.
fn reads(prog: &Program, range: &Range<usize>) -> R<Option<usize>> {
    let mut outside: Vec<usize> = Vec::new();
    for i in range.clone() {
        for a in &prog.nodes[i].args {
            let a = *a as usize;
            if !range.contains(&a)
                && !matches!(
                    prog.nodes[a].op,
                    Op::Input(_) | Op::Param(_) | Op::Targets | Op::Weights
                )
                && !outside.contains(&a)
            {
                outside.push(a);
            }
        }
    }
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
                "{} layers cannot be split into {s} stages",
                p.blocks.len()
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
            axis: p.axis.clone(),
            stages: s,
            microbatches: p.microbatches.max(1),
            schedule: p.schedule,
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

/// Run microbatches `0..M` of one chunk through the stages; the last stage
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
    let schedule = train.then_some(st.schedule);
    // The shape every boundary value has (the repeated layer keeps its type).
    let act_shape: Vec<usize> = ex
        .prog
        .local_shape(&ex.prog.nodes[st.inputs[0]].ty)?
        .iter()
        .map(|x| *x as usize)
        .collect();
    let mut c = Ticks {
        ex,
        st,
        params,
        micro,
        train,
        me: topo.coord(ex.rank, &st.axis),
        zeros: Tensor::zeros(act_shape.as_slice(), ex.dtype, &ex.dev).map_err(ce)?,
        tapes: HashMap::new(),
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
    for row in &timeline(schedule, st.stages, microbatches) {
        let mut send_f = (c.zeros.clone(), -1i64);
        let mut send_b = (c.zeros.clone(), -1i64);
        match row[c.me] {
            Some(Act::F(m)) => {
                if let Some(v) = c.forward(m)? {
                    send_f = (v, m as i64);
                }
            }
            Some(Act::B(m)) => {
                if let Some(g) = c.backward(m)? {
                    send_b = (g, m as i64);
                }
            }
            None => {}
        }
        c.exchange(send_f, send_b)?;
    }
    c.finish(n_sums)
}

/// One device's stage running a chunk's microbatches tick by tick.
struct Ticks<'x, 'e> {
    ex: &'x Exec<'e>,
    st: &'x Stages,
    params: &'x [Tensor],
    micro: &'x dyn Fn(usize) -> R<Micro>,
    train: bool,
    /// This device's stage.
    me: usize,
    /// A boundary value's zeros (what a stage sends when it sends nothing).
    zeros: Tensor,
    tapes: HashMap<usize, Tape>,
    out_ct: HashMap<usize, Tensor>,
    recv_f: HashMap<usize, Tensor>,
    recv_b: HashMap<usize, Tensor>,
    grads: Vec<Option<Tensor>>,
    loss_sum: f64,
    sums: Vec<f64>,
    aux: Vec<f64>,
    peak: f64,
    peak_gathered: f64,
    last_tape: Option<Tape>,
}

impl Ticks<'_, '_> {
    /// Microbatch `m` forward through this stage (the first also before
    /// the stack; the last after it, with the loss and, training, the
    /// backward of what follows the stack). Returns what goes to the next
    /// stage.
    fn forward(&mut self, m: usize) -> R<Option<Tensor>> {
        let (ex, st, me) = (self.ex, self.st, self.me);
        let s_last = st.stages - 1;
        let mb = (self.micro)(m)?;
        *ex.sparse.keep.borrow_mut() = mb.keep;
        let mut tape = ex.empty_tape(self.params, &mb.inputs)?;
        if me == 0 {
            ex.forward_range(&mut tape, st.pre.clone(), mb.seed)?;
        } else {
            tape.vals[st.inputs[me]] = self
                .recv_f
                .remove(&m)
                .ok_or_else(|| format!("stage {me}: microbatch {m} never arrived"))?;
        }
        ex.forward_range(&mut tape, st.ranges[me].clone(), mb.seed)?;
        let mut send = None;
        if me == s_last {
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
            send = Some(tape.vals[st.inputs[me + 1]].clone());
        }
        // The added losses and observed values this stage computed.
        let mine = |i: usize| {
            (me == 0 && st.pre.contains(&i))
                || st.ranges[me].contains(&i)
                || (me == s_last && st.post.contains(&i))
        };
        add_into(&mut self.aux, &aux_flat(ex.prog, &tape, &mine)?);
        if self.train {
            // Checkpointed blocks keep only their results in flight.
            if !ex.prog.checkpoints.is_empty() {
                ex.drop_checkpointed(&mut tape, st.ranges[me].clone())?;
            }
            self.tapes.insert(m, tape);
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

    /// Microbatch `m` backward through this stage (the first also before
    /// the stack). Returns the gradient that goes to the previous stage.
    fn backward(&mut self, m: usize) -> R<Option<Tensor>> {
        let (ex, st, me) = (self.ex, self.st, self.me);
        let s_last = st.stages - 1;
        let mb = (self.micro)(m)?;
        *ex.sparse.keep.borrow_mut() = mb.keep;
        let mut tape = self
            .tapes
            .remove(&m)
            .ok_or_else(|| format!("stage {me}: no forward of microbatch {m}"))?;
        let (seed_node, g) = if me == s_last {
            (
                st.output,
                self.out_ct.remove(&m).ok_or("missing loss cotangent")?,
            )
        } else {
            let g = self
                .recv_b
                .remove(&m)
                .ok_or_else(|| format!("stage {me}: gradient of microbatch {m} never arrived"))?;
            (st.inputs[me + 1], g)
        };
        let cts = if ex.prog.checkpoints.is_empty() {
            ex.backward_range(
                &tape,
                &[(seed_node, g)],
                st.ranges[me].clone(),
                &mut self.grads,
            )?
        } else {
            // The stage's blocks recomputed one at a time.
            let (cts, block) = ex.backward_checkpointed_range(
                &mut tape,
                vec![(seed_node, g)],
                st.ranges[me].clone(),
                &mut self.grads,
                mb.seed,
            )?;
            let held: f64 = self.tapes.values().map(|t| tape_bytes(ex.prog, t)).sum();
            self.peak = self.peak.max(held + tape_bytes(ex.prog, &tape) + block);
            cts
        };
        let g_in = cts[st.inputs[me]]
            .clone()
            .unwrap_or_else(|| self.zeros.clone());
        let mut send = None;
        if me == 0 {
            ex.backward_range(
                &tape,
                &[(st.inputs[0], g_in)],
                st.pre.clone(),
                &mut self.grads,
            )?;
        } else {
            send = Some(g_in);
        }
        if me == s_last {
            self.last_tape = Some(tape);
        }
        Ok(send)
    }

    /// Activations one stage on, gradients one stage back (with their
    /// microbatch, -1 for nothing).
    fn exchange(&mut self, send_f: (Tensor, i64), send_b: (Tensor, i64)) -> R<()> {
        let (ex, me) = (self.ex, self.me);
        let s_last = self.st.stages - 1;
        let ax = self.st.axis.as_str();
        let id = |k: i64| Tensor::new(&[k as f64], &ex.dev).map_err(ce);
        let (fv, fi) = (
            ex.comm.ppermute(ex.rank, &send_f.0, ax, 1).map_err(ce)?,
            ex.comm
                .ppermute(ex.rank, &id(send_f.1)?, ax, 1)
                .map_err(ce)?,
        );
        let (bv, bi) = (
            ex.comm.ppermute(ex.rank, &send_b.0, ax, -1).map_err(ce)?,
            ex.comm
                .ppermute(ex.rank, &id(send_b.1)?, ax, -1)
                .map_err(ce)?,
        );
        let num = |t: &Tensor| -> R<i64> {
            Ok(crate::kernels::host::read_ids(t)
                .map_err(ce)?
                .first()
                .copied()
                .unwrap_or(-1))
        };
        let (fk, bk) = (num(&fi)?, num(&bi)?);
        if fk >= 0 && me > 0 {
            self.recv_f.insert(fk as usize, fv);
        }
        if bk >= 0 && me < s_last {
            self.recv_b.insert(bk as usize, bv);
        }
        Ok(())
    }

    /// Every device reports the losses and metrics the last stage computed,
    /// and the values each stage added or observed.
    fn finish(self, n_sums: usize) -> R<Chunk> {
        let ex = self.ex;
        let mut all = vec![self.loss_sum];
        all.extend(&self.sums);
        all.extend(&self.aux);
        let n = all.len();
        let total = Tensor::from_vec(all, n, &ex.dev).map_err(ce)?;
        let total = ex
            .comm
            .psum(ex.rank, &total, std::slice::from_ref(&self.st.axis))
            .and_then(|t| crate::kernels::host::read::<f64>(&t))
            .map_err(ce)?;
        Ok(Chunk {
            grads: self.grads,
            loss: total.first().copied().unwrap_or(f64::NAN),
            sums: total.get(1..1 + n_sums).unwrap_or_default().to_vec(),
            aux: total.get(1 + n_sums..).unwrap_or_default().to_vec(),
            peak_activations: self.peak,
            peak_gathered: self.peak_gathered,
            tape: self.last_tape,
        })
    }
}
