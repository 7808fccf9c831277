//! Stage 8 (plan): the static plan. Per-device memory, FLOPs and a communication
//! manifest, computed by a pass over the SPMD program from types alone (each
//! op's cost comes from its primitive; nothing is allocated), so it works for
//! meshes far larger than this machine.

mod backward;
pub mod device;
pub mod host;
pub mod measured;
mod pipeline;
pub mod schedules;

use crate::prim::cost::CostCx;
use crate::prim::Prim;
use crate::source::{SourceMap, Span};
use crate::spec::{OptKind, Spec, Train};
use crate::spmd::{Kept, Op, Program};
use crate::types::TType;
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Clone, Debug, Serialize)]
pub struct Comm {
    pub kind: String,
    pub axes: Vec<String>,
    /// Bytes each device sends/receives per call.
    pub bytes: f64,
    /// How often per optimizer step (repeated layers, forward + backward,
    /// every microbatch).
    pub count: u64,
    #[serde(skip)]
    pub span: Span,
    pub source: String,
    /// Written in the source (`psum`) or inserted by the compiler.
    pub explicit: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Plan {
    pub model: String,
    pub mesh: String,
    pub mesh_axes: Vec<(String, i64)>,
    /// The examples one run of the program holds (a microbatch).
    pub batch: Option<i64>,
    /// The examples of one optimizer step (`train`'s `batch`).
    pub step_batch: Option<usize>,
    /// Microbatches per optimizer step: `accumulate` × a pipeline's
    /// microbatches (1 without either).
    pub microbatches: usize,
    pub optimizer: String,
    pub params: f64,
    pub grads: f64,
    /// With `accumulate` > 1: the running sum of the microbatches' gradients,
    /// held beside each microbatch's own while it runs backward.
    pub grad_sum: f64,
    pub optimizer_state: f64,
    pub activations: f64,
    /// Parameters gathered for use (FSDP: stored split, used whole), which
    /// the tape keeps for backward; a checkpointed block's are dropped and
    /// gathered again (one block at a time). In a pipeline, per microbatch in
    /// flight.
    pub gathered_params: f64,
    /// The full-size gradient of a gathered parameter, held in backward until
    /// its reduce-scatter (one at a time).
    pub gathered_grads: f64,
    /// Mixed precision: the f32 master weights (`params` are the 16-bit
    /// working copies; gradients and optimizer state are f32).
    pub master_params: f64,
    /// Backward's cotangents alive at once, at their most (parameters' are
    /// `grads`, gathered parameters' `gathered_grads`): see `backward`.
    pub cotangents: f64,
    /// Bytes of each device's parameters and optimizer state that `copies`
    /// (≥ 2) devices hold identically, as (copies, bytes per device): the
    /// replicas one process keeps once (`process_memory`).
    pub replicas: Vec<(usize, f64)>,
    /// `train`'s `precision` (`f32`, `bf16`, `f16`).
    pub precision: String,
    /// Forward FLOPs per device of one microbatch.
    pub forward_flops: f64,
    /// Of those, the ones checkpointing runs again in backward.
    pub recompute_flops: f64,
    /// FLOPs per device of the optimizer's update, once per step (Muon's
    /// orthogonalisation of each whole matrix included).
    pub optimizer_flops: f64,
    /// Activation bytes a checkpointed block holds while recomputed, counted
    /// in `activations`.
    pub recompute_activations: f64,
    pub comms: Vec<Comm>,
    /// Sizes that stayed symbolic, so the figures above omit them.
    pub unknown: Vec<String>,
    /// Embedding tables as SparseCore stacks them.
    pub stacks: Vec<StackPlan>,
    /// A pipelined stack: stages, schedule, bubble, per-stage activations.
    pub pipeline: Option<PipelinePlan>,
    /// The run computes in a 16-bit float (`precision: bf16 | f16`): the
    /// bf16 peak applies.
    pub bf16: bool,
    /// `--device`: the plan against a device's memory, FLOP/s and links.
    pub device: Option<device::Verdict>,
    /// The peak per device with every `repeat` checkpointed, when some is not.
    pub peak_if_checkpointed: Option<f64>,
    /// Changes that would lower the peak, and the peak each gives.
    pub proposals: Vec<Proposal>,
    /// Set by `shardc plan` for the process on this machine: the bytes of
    /// shardc's own code and read-only data ([`host::shardc_code`]).
    pub shardc_code: Option<f64>,
}

/// A change to the file that saves memory, and the peak per device after it.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Proposal {
    pub change: String,
    pub peak: f64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PipelinePlan {
    pub axis: String,
    pub stages: usize,
    /// Pieces of the stack per rank (virtual stages).
    pub chunks: usize,
    pub microbatches: usize,
    /// The schedule's word (`one_f_one_b`) or file, as written.
    pub schedule: String,
    /// As the plan prints it (`1F1B`).
    pub label: String,
    /// Whether backwards run split (input, then weight gradients).
    pub split: bool,
    /// Idle share of the stage axis's time, the mean of `idle`.
    pub bubble: f64,
    /// The schedule's own bubble: every piece costing the same (a forward
    /// one unit, a backward two), what its textbook formula gives.
    pub uniform_bubble: f64,
    /// Per rank: its idle share of a chunk, each pass taking time in
    /// proportion to its FLOPs (see `plan/pipeline.rs`), or as `timed_by`
    /// measured.
    pub idle: Vec<f64>,
    /// The profile (`shardc run --profile`) whose node times timed the
    /// passes; `None`: their FLOPs did.
    pub timed_by: Option<String>,
    /// Per rank: the most microbatches in flight through its pieces, and
    /// their activation bytes and gathered parameters.
    pub in_flight: Vec<usize>,
    pub activations: Vec<f64>,
    pub gathered: Vec<f64>,
    /// Per stage: the cotangents its backward holds at once, at most.
    pub cotangents: Vec<f64>,
    /// The schedule drawn as text, one row per stage.
    pub timeline: String,
}

/// One stack of embedding tables: its shards and the tables placed in them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StackPlan {
    pub name: String,
    pub dim: usize,
    pub partitions: usize,
    pub rows_per_shard: usize,
    /// Table bytes on each device (its SparseCores' shards, f32).
    pub bytes_per_device: f64,
    /// (table, vocab → padded, row offset in shard, shard rotation).
    pub tables: Vec<(String, usize, usize, usize, usize)>,
    /// The limits the stack starts with (`max_ids`, `max_unique_ids`): a table
    /// alone keeps its own; several take the stack-level limits.
    pub limits: (i64, i64),
}

impl Plan {
    pub fn total_memory(&self) -> f64 {
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
    /// Bytes one process holding `devices` devices of the mesh needs (the
    /// virtual mesh: all of them). Its devices share a replicated parameter
    /// piece, and the piece's optimizer slots when the optimizer steps in
    /// place, one device stepping them for all; with `shares` false (a run
    /// that reloads, whose replicas step their own copies) each keeps its own.
    /// Counted for the whole mesh in one process: an MPI process that holds
    /// only some devices gets `devices × total_memory()`, an upper bound.
    pub fn process_memory(&self, devices: usize, shares: bool) -> f64 {
        let n = devices as f64;
        let whole = self.mesh_axes.iter().map(|a| a.1.max(1)).product::<i64>() as f64;
        // Part of the mesh: which replicas are local is not known here.
        if !shares || n < whole {
            return n * self.total_memory();
        }
        // `copies` is at least 2 (see `replicas`).
        let saved: f64 = self
            .replicas
            .iter()
            .map(|(k, b)| b * n * (1.0 - 1.0 / *k as f64))
            .sum();
        n * self.total_memory() - saved
    }
    /// FLOPs per device of one microbatch, forward and backward: backward
    /// costs about twice the forward (two products per matmul).
    pub fn microbatch_flops(&self) -> f64 {
        3.0 * self.forward_flops + self.recompute_flops
    }
    /// Per pipeline stage (one entry without a pipeline): the most bytes a
    /// device holds — parameters, gradients, optimizer state and that
    /// stage's activations in flight.
    pub fn peaks(&self) -> Vec<f64> {
        let fixed = self.params
            + self.grads
            + self.grad_sum
            + self.optimizer_state
            + self.gathered_grads
            + self.master_params;
        match &self.pipeline {
            Some(pp) if !pp.activations.is_empty() => pp
                .activations
                .iter()
                .zip(&pp.gathered)
                .zip(&pp.cotangents)
                .map(|((a, g), c)| fixed + a + g + c)
                .collect(),
            _ => vec![self.total_memory()],
        }
    }
    /// FLOPs per device of one optimizer step (every microbatch).
    pub fn step_flops(&self) -> f64 {
        self.microbatch_flops() * self.microbatches.max(1) as f64
    }
    /// The model's FLOPs per device of one optimizer step: forward and
    /// backward, without checkpointing's recompute (what MFU counts).
    pub fn model_step_flops(&self) -> f64 {
        3.0 * self.forward_flops * self.microbatches.max(1) as f64
    }
    /// Bytes each device sends per optimizer step: every collective's bytes
    /// per call times its calls per step.
    pub fn comm_per_step(&self) -> f64 {
        self.comms.iter().map(|c| c.bytes * c.count as f64).sum()
    }
    /// The plan in one line, as an editor's code lens shows it: memory per
    /// device, FLOPs and bytes communicated per step, and the mesh (the same
    /// figures `shardc plan` prints).
    pub fn summary(&self) -> String {
        let axes: Vec<String> = self
            .mesh_axes
            .iter()
            .map(|(a, n)| format!("{a}={n}"))
            .collect();
        format!(
            "{} per device · {} per step · {} communicated per step · {} ({})",
            human_bytes(self.total_memory()),
            human_flops(self.step_flops()),
            human_bytes(self.comm_per_step()),
            self.mesh,
            axes.join(", ")
        )
    }
}

pub use crate::units::{human_bytes, human_flops};

/// The plan of a lowered program trained as `train` specifies, with the
/// peaks it would have after the changes that save memory and are not made
/// yet: checkpointing every `repeat`, bf16 mixed precision, and both.
pub fn of(prog: &Program, train: &Train, spec: &Spec, sources: &SourceMap) -> Plan {
    let mut plan = plan_of(prog, train, spec, sources);
    // Every repeat's blocks checkpointed: ranges inside them (a layer's
    // directive) become part of the blocks.
    let unchecked = prog.repeats.iter().any(|r| !prog.checkpoints.contains(r));
    let checkpointed = unchecked.then(|| {
        let mut all = prog.clone();
        let inside = |c: &(crate::spmd::Nid, crate::spmd::Nid)| {
            prog.repeats.iter().any(|r| r.0 <= c.0 && c.1 <= r.1)
        };
        all.checkpoints.retain(|c| !inside(c));
        all.checkpoints.extend(prog.repeats.iter().copied());
        all.checkpoints.sort();
        all
    });
    let bf16 = (train.precision == crate::spec::Precision::F32).then(|| {
        let mut t = train.clone();
        t.precision = crate::spec::Precision::BF16;
        t
    });
    let peak = |p: &Program, t: &Train| {
        plan_of(p, t, spec, sources)
            .peaks()
            .into_iter()
            .fold(0.0, f64::max)
    };
    if let Some(all) = &checkpointed {
        let p = peak(all, train);
        plan.peak_if_checkpointed = Some(p);
        plan.proposals.push(Proposal {
            change: "checkpointing every `repeat` (`checkpoint: full`)".into(),
            peak: p,
        });
    }
    if let Some(t) = &bf16 {
        plan.proposals.push(Proposal {
            change: "bf16 mixed precision (`precision: bf16` in `train`)".into(),
            peak: peak(prog, t),
        });
    }
    if let (Some(all), Some(t)) = (&checkpointed, &bf16) {
        plan.proposals.push(Proposal {
            change: "both".into(),
            peak: peak(all, t),
        });
    }
    plan
}

/// The plan alone, without [`of`]'s proposals: what the auto-sharder's
/// trial compiles cost (it searches checkpointing and precision itself, and
/// each proposal is one more plan of the whole program).
pub fn bare(prog: &Program, train: &Train, spec: &Spec, sources: &SourceMap) -> Plan {
    plan_of(prog, train, spec, sources)
}

fn plan_of(prog: &Program, train: &Train, spec: &Spec, sources: &SourceMap) -> Plan {
    // Every float in the run's type, whatever the model declares: f32, or
    // under mixed precision the 16-bit type for values and working weights,
    // with f32 master weights, gradients and optimizer state.
    let compute = train.precision.compute();
    let master = compute.map(|_| crate::ast::DType::F32.bytes() as f64);
    let prog = &*prog.in_run_dtype(compute.unwrap_or(crate::ast::DType::F32));
    let optimizer = match &train.optimizer.kind {
        OptKind::Sgd { momentum, .. } if *momentum > 0.0 => "sgd+momentum".to_string(),
        _ => train.optimizer.name().to_string(),
    };
    let mut plan = Plan {
        model: prog.model.clone(),
        mesh: train.mesh.clone(),
        mesh_axes: prog.mesh.clone(),
        batch: prog.batch,
        step_batch: train.batch,
        microbatches: train.accumulate.max(1)
            * prog.pipeline.as_ref().map_or(1, |p| p.microbatches.max(1)),
        precision: train.precision.name().into(),
        bf16: compute.is_some(),
        ..Default::default()
    };
    let cx = CostCx {
        mesh: &prog.mesh,
        bound: &prog.bound,
    };
    let weight = Weights::new(prog);
    let recomputed = prog.checkpointed();
    let Values {
        mut acts,
        mut gathered,
        flops,
    } = values(
        &mut plan,
        prog,
        &cx,
        &|i| weight.of(i),
        &recomputed,
        sources,
    );
    // Checkpointing keeps the blocks' results only; for backward, the runtime
    // recomputes one block at a time.
    let dropped = |a: usize, b: usize| -> f64 {
        (a..b.min(acts.len()))
            .filter(|i| recomputed[*i])
            .map(|i| acts[i])
            .sum()
    };
    let recompute = prog
        .checkpoints
        .iter()
        .map(|r| dropped(r.0 as usize, r.1 as usize))
        .fold(0.0, f64::max);
    // Parameters a checkpointed block gathers: dropped after forward, and
    // gathered again while the block is recomputed.
    let regathered = prog
        .checkpoints
        .iter()
        .map(|&(a, b)| {
            (a as usize..(b as usize).min(gathered.len()))
                .filter(|i| recomputed[*i])
                .map(|i| gathered[i])
                .sum::<f64>()
        })
        .fold(0.0, f64::max);
    for (g, r) in gathered.iter_mut().zip(&recomputed) {
        if *r {
            *g = 0.0;
        }
    }
    plan.gathered_params = gathered.iter().sum::<f64>() + regathered;
    for (a, r) in acts.iter_mut().zip(&recomputed) {
        if *r {
            *a = 0.0;
        }
    }
    plan.recompute_activations = recompute;
    // The program is one microbatch: its collectives run for every one.
    for c in &mut plan.comms {
        c.count = c.count.saturating_mul(plan.microbatches as u64);
    }
    plan.activations = acts.iter().sum::<f64>() + recompute;
    // One backward pass, from the loss (a loss function's nodes are the
    // program's too).
    let cts = backward::alive(prog, &cx).at;
    plan.cotangents = cts.iter().fold(0.0, |a, b| a.max(*b));
    let step = crate::step::Step::of_train(prog, train, spec);
    weights(&mut plan, prog, &cx, &weight, (&step, &optimizer), master);
    // A pipeline sums its microbatches' gradients into one set as it goes;
    // accumulated chunks (or plain microbatches) keep a running sum beside.
    if train.accumulate > 1 {
        plan.grad_sum = plan.grads;
    }
    if let Some(pp) = &prog.pipeline {
        pipeline::pipeline(
            &mut plan,
            prog,
            pp,
            &acts,
            (&gathered, regathered),
            (&cts, &flops),
        );
    }
    tables(&mut plan, prog, train, spec);
    plan
}

/// Per node of a program, the bytes forward keeps for backward.
struct Values {
    /// Activations.
    acts: Vec<f64>,
    /// Parameters gathered for use ([`Program::gathers_copy`]).
    gathered: Vec<f64>,
    /// Each node's forward FLOPs on a device.
    flops: Vec<f64>,
}

/// Activations, FLOPs and collectives of `prog`'s values, node `i` counting
/// `weight(i)` times; returns each node's bytes kept for backward. A
/// `recomputed` node (checkpointing) runs its forward, and its collectives,
/// once more. Also the largest gradient of a gathered parameter.
fn values(
    plan: &mut Plan,
    prog: &Program,
    cx: &CostCx,
    weight: &dyn Fn(usize) -> f64,
    recomputed: &[bool],
    sources: &SourceMap,
) -> Values {
    // Activations and FLOPs: every computed value (not an input, a parameter, a
    // layout change the checker inserted, or FSDP's gather of a parameter) is
    // kept for backward; elementwise work is one FLOP per element, and ops add
    // their own. Collectives count forward and backward.
    let mut acts = vec![0.0f64; prog.nodes.len()];
    let mut gathered = vec![0.0f64; prog.nodes.len()];
    let mut node_flops = vec![0.0f64; prog.nodes.len()];
    let on_path = prog.on_gradient_path(false);
    for (i, n) in prog.nodes.iter().enumerate() {
        let m = weight(i);
        if m == 0.0 {
            continue;
        }
        let Op::Prim(p) = &n.op else { continue };
        let gathers_param = prog.gathers_param(i);
        let ts: Vec<&TType> = n.args.iter().map(|a| &prog.nodes[*a as usize].ty).collect();
        let cost = p.get().cost(cx, &ts, &n.ty).unwrap_or_default();
        let again = recomputed.get(i) == Some(&true);
        let mut flops = cost.flops * m;
        if let Some(numel) = cx.local_numel(&n.ty) {
            // Elementwise work: one FLOP per element of a computed value.
            if !gathers_param && !matches!(p, Prim::Reshard(_)) && !n.op.is_result() {
                flops += numel * m;
            }
            if prog.kept(i) == Kept::Activation {
                acts[i] = numel * n.ty.dtype.bytes() as f64 * m;
            }
        }
        plan.forward_flops += flops;
        node_flops[i] = flops;
        if again {
            plan.recompute_flops += flops;
        }
        if gathers_param {
            if !prog.gathers_copy(i) {
                // Over axes of size 1: the parameter itself, nothing sent.
                continue;
            }
            if let Some(numel) = cx.local_numel(&n.ty) {
                let b = numel * n.ty.dtype.bytes() as f64;
                gathered[i] = b * m;
                if on_path.get(i) == Some(&true) {
                    plan.gathered_grads = plan.gathered_grads.max(b);
                }
            }
            // Gathered for every forward (and recompute); the gradient,
            // when there is one, reduce-scattered once.
            for c in cost.comms {
                let n_gathers = if again { 2.0 } else { 1.0 };
                plan.comms.push(Comm {
                    kind: "param all-gather (FSDP)".into(),
                    axes: c.axes.clone(),
                    bytes: c.bytes,
                    count: (n_gathers * m) as u64,
                    span: n.span,
                    source: sources.describe(n.span),
                    explicit: c.explicit,
                });
                if on_path.get(i) == Some(&true) {
                    plan.comms.push(Comm {
                        kind: "grad reduce-scatter (FSDP)".into(),
                        axes: c.axes,
                        bytes: c.bytes,
                        count: m as u64,
                        span: n.span,
                        source: sources.describe(n.span),
                        explicit: c.explicit,
                    });
                }
            }
            continue;
        }
        // Forward (again when recomputed) and, for most ops, backward.
        let passes = f64::from(u8::from(p.get().backward_comms())) + if again { 2.0 } else { 1.0 };
        for c in cost.comms {
            plan.comms.push(Comm {
                kind: c.kind,
                axes: c.axes,
                bytes: c.bytes,
                count: (passes * m) as u64,
                span: n.span,
                source: sources.describe(n.span),
                explicit: c.explicit,
            });
        }
    }
    Values {
        acts,
        gathered,
        flops: node_flops,
    }
}

/// How many times each node counts: a pipelined stack counts the first rank's
/// pieces, a folded stack its repetition count.
struct Weights {
    /// (range, weight) overrides, in node order.
    ranges: Vec<(usize, usize, f64)>,
}

impl Weights {
    fn new(prog: &Program) -> Weights {
        let mut ranges = Vec::new();
        if let Some(pp) = &prog.pipeline {
            let per = (pp.blocks.len() / pp.virtual_stages()).max(1);
            let placement = pp.placement();
            for (k, (a, b)) in pp.blocks.iter().enumerate() {
                if placement.get(k / per) != Some(&0) {
                    ranges.push((*a as usize, *b as usize, 0.0));
                }
            }
        }
        for f in &prog.folds {
            ranges.push((f.start as usize, f.end as usize, f.count as f64));
        }
        Weights { ranges }
    }
    fn of(&self, i: usize) -> f64 {
        self.ranges
            .iter()
            .filter(|(a, b, _)| (*a..*b).contains(&i))
            .map(|r| r.2)
            .product()
    }
}

/// Parameters, gradients, optimizer state and gradient synchronisation, from
/// the program's parameters (a pipeline stage's own, and every repetition a
/// folded stack stands for).
/// Under mixed precision, `master` is the bytes per element of the master
/// weights, their gradients and optimizer state.
fn weights(
    plan: &mut Plan,
    prog: &Program,
    cx: &CostCx,
    w: &Weights,
    (step, name): (&crate::step::Step, &str),
    master: Option<f64>,
) {
    plan.optimizer = format!(
        "{name}: {}, in the parameter's layout",
        step.slots_summary()
    );
    // Where each parameter is first used: its weight, and its pipeline stage.
    let mut first = vec![None; prog.params.len()];
    for (i, n) in prog.nodes.iter().enumerate() {
        if let Op::Param(k) = n.op {
            first[k] = first[k].or(Some(i));
        }
    }
    let mut sync: BTreeMap<(String, Vec<String>), f64> = Default::default();
    // An optimizer's all-gathers of a split weight's update (Muon), per step.
    let mut gathers: Vec<Comm> = Vec::new();
    let mut replicas: BTreeMap<usize, f64> = Default::default();
    for ((p, at), st) in prog.params.iter().zip(&first).zip(&step.params) {
        // Tables are planned with their SparseCore padding (below).
        let Some(at) = *at else { continue };
        if p.name.starts_with("tables.") {
            continue;
        }
        let m = w.of(at);
        let stored = &p.stored;
        let Some(n) = cx.local_numel(stored) else {
            continue;
        };
        let working = n * stored.dtype.bytes() as f64;
        plan.params += working * m;
        // Gradients, optimizer state and their synchronisation: the master
        // weights' type.
        let bytes = master.map_or(working, |b| n * b);
        if master.is_some() {
            plan.master_params += bytes * m;
        }
        plan.grads += bytes * m;
        // Replicated over an axis: the gradient is partial over it (data parallel,
        // and tensor-parallel replicas such as LayerNorm scales); the step
        // says over which axes it is summed.
        let (rep, copies) = (&st.reduce, st.copies);
        let rule = crate::optim::rule(&st.optimizer);
        let slots = rule.slots().count() as f64;
        // The replicas one process shares (the runtime's piece cache): the
        // stored piece (the master weights under mixed precision), which a
        // frozen parameter keeps as it is, and which an optimizer stepping
        // in place steps once for all, with its slots. Another optimizer's
        // replicas each build their own.
        let in_place = rule.steps_in_place();
        if copies > 1 && m > 0.0 && (p.frozen || in_place) {
            let slots = if p.frozen { 0.0 } else { slots };
            *replicas.entry(copies).or_default() += bytes * m * (1.0 + slots);
        }
        // Frozen: no optimizer state, no gradient synchronisation.
        if p.frozen {
            continue;
        }
        plan.optimizer_state += bytes * m * slots;
        if m == 0.0 {
            continue;
        }
        let shape: Vec<usize> = if st.gather.is_empty() {
            cx.local_shape(stored)
        } else {
            Some(stored.known_shape())
        }
        .unwrap_or_default();
        plan.optimizer_flops += rule.flops(&shape) * m;
        let axes: Vec<String> = st.gather.iter().flat_map(|g| g.1.clone()).collect();
        if !axes.is_empty() {
            let mut t = stored.clone();
            t.dtype = crate::ast::DType::F32;
            gathers.push(Comm {
                kind: format!("{} all-gather (update)", st.optimizer.name()),
                axes,
                bytes: crate::step::gathered_bytes(cx, &t) * m,
                count: 1,
                span: p.span,
                source: format!("optimizer step ({})", p.name),
                explicit: false,
            });
        }
        if !rep.is_empty() {
            let k = copies as f64;
            *sync
                .entry(("grad all-reduce".into(), rep.clone()))
                .or_default() += 2.0 * bytes * (k - 1.0) / k * m;
        }
    }
    // Merge per-op rows that are the same collective at the same place.
    let mut merged: Vec<Comm> = Vec::new();
    for c in plan.comms.drain(..) {
        match merged.iter_mut().find(|x| {
            x.kind == c.kind
                && x.axes == c.axes
                && x.source == c.source
                && x.bytes == c.bytes
                && x.explicit == c.explicit
        }) {
            Some(x) => x.count += c.count,
            None => merged.push(c),
        }
    }
    merged.retain(|c| c.count > 0);
    for ((kind, axes), bytes) in sync {
        merged.push(Comm {
            kind,
            axes,
            bytes,
            count: 1,
            span: Span::default(),
            source: "optimizer step".into(),
            explicit: true,
        });
    }
    merged.extend(gathers);
    plan.comms = merged;
    plan.replicas = replicas.into_iter().collect();
}

/// Embedding tables: rows MOD-sharded over `devices × sparsecores` partitions,
/// vocabularies padded to multiples of 8·N and dims to multiples of 8
/// (SparseCore), stacked per sharding axis.
fn tables(plan: &mut Plan, prog: &Program, train: &Train, spec: &Spec) {
    let size = |a: &str| prog.mesh.iter().find(|m| m.0 == a).map_or(1, |m| m.1);
    let sc = train.sparsecores.max(1);
    let mut by_axis: BTreeMap<String, Vec<crate::embed::TableInfo>> = Default::default();
    for t in &spec.tables {
        let (Some(vocab), Some(dim)) = (t.vocab, t.dim) else {
            continue;
        };
        let devices = t.axis.as_deref().map_or(1, size).max(1);
        let parts = devices.saturating_mul(sc as i64);
        let pad =
            |x: i64, m: i64| ((x.max(0) as u64).div_ceil(m.max(1) as u64) as i64).saturating_mul(m);
        let rows = pad(vocab, 8 * parts) / devices;
        let bytes = rows as f64 * pad(dim, 8) as f64 * 4.0;
        let slots = if t.frozen {
            0.0
        } else {
            t.optimizer
                .as_ref()
                .map_or(0, |o| crate::optim::rule(o).slots().count()) as f64
        };
        plan.params += bytes;
        plan.grads += bytes;
        plan.optimizer_state += bytes * slots;
        by_axis
            .entry(t.axis.clone().unwrap_or_default())
            .or_default()
            .push(crate::embed::TableInfo {
                name: t.name.clone(),
                vocab: vocab.max(1) as usize,
                dim: dim.max(1) as usize,
                optimizer: t
                    .optimizer
                    .as_ref()
                    .map_or(String::new(), |o| o.name().to_string()),
                combiner: t.combiner.name().to_string(),
                activation_bytes: 0.0,
            });
    }
    for (axis, infos) in by_axis {
        let devices = if axis.is_empty() {
            1
        } else {
            size(&axis).max(1) as usize
        };
        for st in crate::embed::stack(&infos, devices.saturating_mul(sc), sc, None) {
            let own: Vec<_> = st
                .tables
                .iter()
                .filter_map(|x| spec.table(&x.name))
                .map(|t| {
                    (
                        crate::embed::table_limits(t.max_ids, t.max_unique_ids),
                        (t.stack_max_ids, t.stack_max_unique_ids),
                    )
                })
                .collect();
            let l = crate::embed::stack_limits(&own);
            plan.stacks.push(StackPlan {
                limits: (l.max_ids, l.max_unique_ids),
                bytes_per_device: st.rows_per_shard() as f64 * (sc * st.dim * 4) as f64,
                name: st.name.clone(),
                dim: st.dim,
                partitions: st.partitions,
                rows_per_shard: st.rows_per_shard(),
                tables: st
                    .tables
                    .iter()
                    .map(|t| {
                        (
                            t.name.clone(),
                            t.vocab,
                            t.padded_vocab,
                            t.row_offset_in_shard,
                            t.shard_rotation,
                        )
                    })
                    .collect(),
            });
        }
    }
}

pub fn render(p: &Plan, sources: &SourceMap) -> String {
    let _ = sources;
    let devices: i64 = p.mesh_axes.iter().map(|a| a.1).product();
    let axes: Vec<String> = p
        .mesh_axes
        .iter()
        .map(|(a, n)| format!("{a}={n}"))
        .collect();
    let mut s = format!(
        "plan: {} on {} ({}; {} devices){}\n\n",
        p.model,
        p.mesh,
        axes.join(", "),
        devices,
        match (p.step_batch, p.batch) {
            (Some(b), Some(m)) if p.microbatches > 1 => format!(
                ", batch {b} per step ({} microbatches of {m})",
                p.microbatches
            ),
            (_, Some(b)) => format!(", batch {b}"),
            _ => String::new(),
        }
    );
    s.push_str("per-device memory\n");
    let rows = [
        (
            "params",
            p.params,
            if p.master_params > 0.0 {
                format!("{} working copies, stored layout", p.precision)
            } else {
                "stored layout".to_string()
            },
        ),
        (
            "master params",
            p.master_params,
            "f32 master weights (mixed precision); grads and optimizer state f32".into(),
        ),
        (
            "gathered params",
            p.gathered_params,
            "weights gathered for use (FSDP), kept for backward; checkpointed blocks gather theirs again".into(),
        ),
        (
            "gathered grads",
            p.gathered_grads,
            "a gathered weight's full gradient, held until its reduce-scatter".into(),
        ),
        ("grads", p.grads, "same layout as params".into()),
        (
            "grad sum",
            p.grad_sum,
            "the microbatches' running sum, beside each microbatch's grads".into(),
        ),
        ("optimizer state", p.optimizer_state, p.optimizer.clone()),
        (
            "activations",
            p.activations,
            if p.recompute_activations > 0.0 {
                format!(
                    "forward values kept for backward; checkpointed blocks keep their results and recompute the rest ({} at a time)",
                    human_bytes(p.recompute_activations)
                )
            } else {
                "forward values kept for backward".into()
            },
        ),
        (
            "cotangents",
            p.cotangents,
            "backward's cotangents alive at once, at most".into(),
        ),
    ];
    for (name, v, why) in rows {
        if matches!(
            name,
            "gathered params" | "gathered grads" | "master params" | "grad sum"
        ) && v == 0.0
        {
            continue;
        }
        s.push_str(&format!("  {name:<16} {:>12}   {why}\n", human_bytes(v)));
    }
    s.push_str(&format!(
        "  {:<16} {:>12}\n",
        "total",
        human_bytes(p.total_memory())
    ));
    // What the virtual mesh needs on this machine; not for a plan against a
    // real device, whose devices each hold their own.
    let here = p.process_memory(devices as usize, true);
    if p.device.is_none() && here < p.total_memory() * devices as f64 {
        s.push_str(&format!(
            "  {:<16} {:>12}   all {devices} devices in one process (the virtual mesh), replicas sharing parameters and optimizer state\n",
            "one process",
            human_bytes(here)
        ));
    }
    // The process that runs them on this machine: its own code too.
    if let (None, Some(code)) = (&p.device, p.shardc_code) {
        let held = if devices == 1 {
            "its device".to_string()
        } else {
            format!("all {devices} devices")
        };
        s.push_str(&format!(
            "  {:<16} {:>12}   the process: {held} and shardc's own code and read-only data ({} mapped from its binary and libraries, at most)\n",
            "with shardc",
            human_bytes(here + code),
            human_bytes(code)
        ));
    }
    s.push('\n');
    let mut recompute = if p.recompute_flops > 0.0 {
        format!(
            ", recomputed {}; the model's own: {} per step",
            human_flops(p.recompute_flops),
            human_flops(p.model_step_flops())
        )
    } else {
        String::new()
    };
    if p.optimizer_flops > 0.0 {
        recompute += &format!("; the optimizer {} more", human_flops(p.optimizer_flops));
    }
    if p.microbatches > 1 {
        s.push_str(&format!(
            "compute per device per step: {} ({} microbatches of {}: forward {}, backward ≈ 2× forward{})\n\n",
            human_flops(p.step_flops()),
            p.microbatches,
            human_flops(p.microbatch_flops()),
            human_flops(p.forward_flops),
            recompute
        ));
    } else {
        s.push_str(&format!(
            "compute per device per step: {} (forward {}, backward ≈ 2× forward{})\n\n",
            human_flops(p.step_flops()),
            human_flops(p.forward_flops),
            recompute
        ));
    }
    s.push_str("communication per device per step (bytes per call × calls per step)\n");
    if p.comms.is_empty() {
        s.push_str("  none\n");
    } else {
        s.push_str(&format!(
            "  {:<34} {:<10} {:>12} {:>6}  source\n",
            "collective", "axes", "bytes", "count"
        ));
        for c in &p.comms {
            let kind = if c.explicit {
                c.kind.clone()
            } else {
                format!("{} (inserted)", c.kind)
            };
            s.push_str(&format!(
                "  {:<34} {:<10} {:>12} {:>6}  {}\n",
                kind,
                c.axes.join(","),
                human_bytes(c.bytes),
                c.count,
                c.source
            ));
        }
        let total = p.comm_per_step();
        s.push_str(&format!(
            "  {:<34} {:<10} {:>12}\n",
            "total",
            "",
            human_bytes(total)
        ));
    }
    if let Some(pp) = &p.pipeline {
        let chunks = if pp.chunks > 1 {
            format!(" × {} chunks", pp.chunks)
        } else {
            String::new()
        };
        s.push_str(&format!(
            "\npipeline: {} stages{chunks} over `{}`, {} microbatches per pass (one pass per accumulated chunk), {}: bubble {:.1}% ({:.1}% with every piece alike)\n",
            pp.stages,
            pp.axis,
            pp.microbatches,
            pp.label,
            pp.bubble * 100.0,
            pp.uniform_bubble * 100.0
        ));
        s.push_str(&format!(
            "  {:<8} {:>10} {:>14} {:>6}\n",
            "rank", "in flight", "activations", "idle"
        ));
        for (k, (n, b)) in pp.in_flight.iter().zip(&pp.activations).enumerate() {
            let idle = pp.idle.get(k).map_or(0.0, |x| x * 100.0);
            s.push_str(&format!(
                "  {:<8} {:>10} {:>14} {:>5.1}%\n",
                k,
                n,
                human_bytes(*b),
                idle
            ));
        }
        let timed = match &pp.timed_by {
            Some(f) => format!("each pass taking the time `{f}` measured for its nodes"),
            None => "each pass taking time in proportion to its FLOPs".into(),
        };
        s.push_str(&format!("  (each rank holds its pieces' parameters; the layers before and after the stack are on every device; idle: {timed}, the first piece also running what comes before the stack and the last what comes after; the timeline below in units of a forward, a whole backward taking two{})\n", if pp.split { ", its input- or weight-gradient half one" } else { "" }));
        s.push_str(&pp.timeline);
    }
    for st in &p.stacks {
        s.push_str(&format!(
            "\nembedding stack `{}`: dim {} (padded), {} partitions × {} rows, {} per device\n",
            st.name,
            st.dim,
            st.partitions,
            st.rows_per_shard,
            human_bytes(st.bytes_per_device)
        ));
        s.push_str(&format!(
            "  limits: max_ids_per_partition {}, max_unique_ids_per_partition {}{}\n",
            st.limits.0,
            st.limits.1,
            if st.tables.len() > 1 {
                " (the stack's own: `stack_max_*` or 256; its tables' are not used)"
            } else {
                ""
            }
        ));
        s.push_str(&format!(
            "  {:<16} {:>16} {:>14} {:>9}\n",
            "table", "vocab → padded", "row offset", "rotation"
        ));
        for (name, v, pv, off, rot) in &st.tables {
            s.push_str(&format!(
                "  {:<16} {:>16} {:>14} {:>9}\n",
                name,
                format!("{v} → {pv}"),
                off,
                rot
            ));
        }
    }
    if !p.unknown.is_empty() {
        s.push_str(&format!(
            "\nnot counted (symbolic sizes): {}\n",
            p.unknown.join(", ")
        ));
    }
    if let Some(v) = &p.device {
        s.push('\n');
        s.push_str(&device::render(v));
    }
    s
}
