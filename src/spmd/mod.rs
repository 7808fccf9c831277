//! Stage 5 (ir): the SPMD program — one straight-line program for every device, with
//! global types (so local shapes follow from the mesh), layers inlined, each
//! parameter named by its dotted layer path, every collective explicit (written in
//! the source or inserted by the checker), and a span for each op.
//!
//! `verify` checks the invariants after lowering: operands defined before use, mesh
//! axes known, every sharded size divisible so that local shape × shard count equals
//! the global shape, and the collective sequence (identical on every device, since
//! the program has no device-dependent control flow).

pub mod backward;

use crate::prim::Prim;
use crate::source::{SourceMap, Span};
use crate::types::{Poly, TType};
use std::collections::BTreeMap;
use std::fmt::Write as _;

pub type Nid = u32;

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// The i-th model input.
    Input(usize),
    /// A parameter, by index into `Program::params` (its stored layout).
    Param(usize),
    /// The step's targets (the batch's labels or target values), fed like
    /// an input; what the loss compares the output with ([`LossNodes`]).
    Targets,
    /// The step's weights, when the loss function takes them (its third
    /// parameter, read from the data like the targets).
    Weights,
    /// Everything else: a typed primitive ([`crate::prim`]), the collectives
    /// written in the source and the reshards the checker inserted included.
    Prim(Prim),
}

impl Op {
    /// An `add_loss` or `observe`: what the runtime adds to the loss or logs.
    pub fn aux(&self) -> Option<&crate::prim::aux::Aux> {
        match self {
            Op::Prim(Prim::Aux(a)) => Some(a),
            _ => None,
        }
    }
    /// The table a `lookup` reads.
    pub fn lookup_table(&self) -> Option<&str> {
        match self {
            Op::Prim(Prim::Lookup(l)) => Some(&l.table),
            _ => None,
        }
    }
    /// An op that reads integer ids as rows of its first operand (`embed`, `lookup`).
    pub fn reads_ids(&self) -> bool {
        matches!(self, Op::Prim(Prim::Embed(_) | Prim::Lookup(_)))
    }
    /// A step's result rather than a value of the model: the loss and the
    /// metrics' sums. Neither is kept for backward nor has a cotangent that
    /// counts as backward's memory.
    pub fn is_result(&self) -> bool {
        matches!(self, Op::Prim(Prim::Objective(_) | Prim::Metrics(_)))
    }
    /// A layout change the checker inserted.
    pub fn is_reshard(&self) -> bool {
        matches!(self, Op::Prim(Prim::Reshard(_)))
    }
    /// A collective: written in the source, inserted as a reshard, or FSDP's
    /// gather of a parameter.
    pub fn is_collective(&self) -> bool {
        matches!(self, Op::Prim(Prim::Collective(_) | Prim::Reshard(_)))
    }
}

#[derive(Clone, Debug)]
pub struct Node {
    pub op: Op,
    pub args: Vec<Nid>,
    pub ty: TType,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Param {
    /// `blocks.3.attn.wqkv`
    pub name: String,
    /// Storage layout (FSDP weights are stored split over the data axis).
    pub stored: TType,
    /// Layout used by the forward pass.
    pub used: TType,
    /// Its initializer.
    pub init: crate::init::Init,
    /// Frozen (`freeze(...)` in its layer, `frozen: true` on a table): no
    /// gradient step and no optimizer state.
    pub frozen: bool,
    pub span: Span,
}

#[derive(Clone, Debug, Default)]
pub struct Program {
    pub model: String,
    pub mesh: Vec<(String, i64)>,
    pub params: Vec<Param>,
    /// The model's inputs (the forward's parameter names), in order.
    pub input_names: Vec<String>,
    pub nodes: Vec<Node>,
    pub output: Option<Nid>,
    /// Values of the symbolic sizes (the batch).
    pub bound: BTreeMap<String, Poly>,
    /// The (micro)batch the program is lowered for, when known.
    pub batch: Option<i64>,
    /// A `repeat(..., stages: axis)` stack run as a pipeline.
    pub pipeline: Option<Pipeline>,
    /// Repetitions too many to unroll: each range stands for `count` of them.
    /// Such a program is planned, never run.
    pub folds: Vec<Fold>,
    /// Computed initial values (`w: f32[T, E] init cos(...)`): one small
    /// program per such parameter, without inputs or parameters, whose output
    /// is the parameter's whole (replicated) value; [`crate::init::Init::Computed`]
    /// indexes it.
    pub inits: Vec<Program>,
    /// `loss: NAME` naming a `fn` of the model: its own program, with the
    /// model's output as input 0 and the targets as input 1, whose output is
    /// the loss (a reduced float scalar). It has no parameters.
    pub loss: Option<Box<Program>>,
    /// Checkpointed ranges `[start, end)` (`repeat(..., checkpoint: full)`,
    /// one per repetition): their values are dropped after the forward pass
    /// and recomputed just before their backward (see [`Program::checkpointed`]).
    pub checkpoints: Vec<(Nid, Nid)>,
    /// Values inside checkpointed ranges that stay nonetheless (`checkpoint:
    /// [h, y]` names them).
    pub checkpoint_keep: Vec<Nid>,
    /// Every repetition of every `repeat` stack, checkpointed or not: what
    /// the plan may propose to checkpoint.
    pub repeats: Vec<(Nid, Nid)>,
    /// The step's loss, appended after the model by lowering
    /// ([`crate::step::attach`]); `None` for a program of the model alone.
    pub objective: Option<LossNodes>,
}

/// Where a program's loss is: the nodes lowering appended after the model's
/// (the targets, a built-in loss or the model's loss function inlined, the
/// metrics).
#[derive(Clone, Debug, PartialEq)]
pub struct LossNodes {
    /// Nodes before this are the model's.
    pub start: Nid,
    /// The [`Op::Targets`] node.
    pub targets: Nid,
    /// The [`Op::Weights`] node and the loss function's name for them (the
    /// array an array source reads), when it takes weights.
    pub weights: Option<(Nid, String)>,
    /// The loss, a reduced scalar: backward's root.
    pub root: Nid,
    /// The metrics' sums, when the `train` logs any.
    pub metrics: Option<Nid>,
    /// How backward starts from the root.
    pub seed: Seed,
}

/// What a value the tape keeps counts as ([`Program::kept`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// An activation: computed by forward, kept for backward.
    Activation,
    /// A parameter gathered whole for use (FSDP).
    Gathered,
    /// Not the step's memory of values.
    Not,
}

/// The cotangent backward starts from at the loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seed {
    /// Exactly 1 on every device: a built-in loss, whose derivative spreads
    /// it over the output's replicas itself.
    One,
    /// 1 held as addends over the devices the value is replicated on (a
    /// loss function's result, like any replicated value).
    Addends,
}

/// What a program's output is trained against: the targets' type (global,
/// as the data are fed) and whether they are class ids.
#[derive(Clone, Debug, PartialEq)]
pub struct Targets {
    pub ty: TType,
    pub classes: bool,
}

/// Nodes `[start, end)` are one repetition that stands for `count`.
#[derive(Clone, Debug, PartialEq)]
pub struct Fold {
    pub start: Nid,
    pub end: Nid,
    pub count: u64,
}

/// Where the pipelined stack sits in the program: each repetition's nodes are a
/// contiguous range that reads only the value entering it.
#[derive(Clone, Debug, PartialEq)]
pub struct Pipeline {
    pub axis: String,
    pub stages: usize,
    pub microbatches: usize,
    /// The order of the microbatches' passes (`schedule:` of the `repeat`,
    /// with its `chunks:`, or a schedule file).
    pub schedule: crate::schedule::Source,
    /// Node ranges `[start, end)` of the repetitions, in order.
    pub blocks: Vec<(Nid, Nid)>,
    /// The value entering the stack.
    pub input: Nid,
}

impl Pipeline {
    /// Pieces the stack is cut into: ranks × chunks, or a file's stages.
    pub fn virtual_stages(&self) -> usize {
        self.schedule.pieces(self.stages)
    }

    /// The rank each piece lives on.
    pub fn placement(&self) -> Vec<usize> {
        self.schedule.placement(self.stages)
    }
}

impl Program {
    /// The program in the one float type a run holds its values in: every
    /// float value and parameter in `dtype` (f32, or the 16-bit type under
    /// mixed precision), whatever type the model declares. Declared types are
    /// checked (E0210, W0002); the runtime computes every float in the run's
    /// type. For the plan's bytes; borrowed when nothing changes.
    pub fn in_run_dtype(&self, dtype: crate::ast::DType) -> std::borrow::Cow<'_, Program> {
        let other = |t: &TType| t.dtype.is_float() && t.dtype != dtype;
        let differs = self.nodes.iter().any(|n| other(&n.ty))
            || self
                .params
                .iter()
                .any(|q| other(&q.stored) || other(&q.used));
        if !differs {
            return std::borrow::Cow::Borrowed(self);
        }
        let set = |t: &mut TType| {
            if t.dtype.is_float() {
                t.dtype = dtype;
            }
        };
        let mut p = self.clone();
        for n in &mut p.nodes {
            set(&mut n.ty);
        }
        for q in &mut p.params {
            set(&mut q.stored);
            set(&mut q.used);
        }
        std::borrow::Cow::Owned(p)
    }

    pub fn add(&mut self, op: Op, args: Vec<Nid>, ty: TType, span: Span) -> Nid {
        self.nodes.push(Node { op, args, ty, span });
        (self.nodes.len() - 1) as Nid
    }

    /// The targets `loss` trains the output against: class ids shaped like
    /// the output without its class dimension (softmax cross-entropy), the
    /// loss function's second input, or values shaped like the output.
    pub fn targets(&self, loss: crate::spec::Loss) -> Option<Targets> {
        use crate::spec::Loss;
        let out = &self.nodes.get(self.output? as usize)?.ty;
        Some(match loss {
            Loss::SoftmaxCrossEntropy => Targets {
                ty: TType {
                    dtype: crate::ast::DType::I64,
                    dims: out.dims[..out.rank().saturating_sub(1)].to_vec(),
                    pending: Default::default(),
                },
                classes: true,
            },
            Loss::Mse | Loss::SigmoidBinaryCrossEntropy => Targets {
                ty: out.clone(),
                classes: false,
            },
            Loss::Function => {
                let ty = match (&self.objective, self.loss.as_deref()) {
                    (Some(o), _) => self.nodes.get(o.targets as usize)?.ty.clone(),
                    (None, Some(l)) => l
                        .nodes
                        .iter()
                        .find(|n| n.op == Op::Input(1))
                        .map(|n| n.ty.clone())?,
                    (None, None) => return None,
                };
                Targets {
                    classes: !ty.dtype.is_float(),
                    ty,
                }
            }
        })
    }

    /// The step's weights, when the loss function takes them (its third
    /// parameter, read from the data beside the targets): their name and type.
    pub fn weights(&self) -> Option<(String, TType)> {
        if let Some((w, name)) = self.objective.as_ref().and_then(|o| o.weights.as_ref()) {
            return self
                .nodes
                .get(*w as usize)
                .map(|n| (name.clone(), n.ty.clone()));
        }
        let l = self.loss.as_deref()?;
        let ty = l.nodes.iter().find(|n| n.op == Op::Input(2))?.ty.clone();
        let name = l.input_names.get(2).cloned().unwrap_or_else(|| "w".into());
        Some((name, ty))
    }

    /// Per node: whether a cotangent can flow through it — it depends on a
    /// parameter (with `inputs`, on an input too). Reverse mode skips the
    /// rest: nothing it would compute reaches a gradient. The mask is the
    /// program's, the same on every device, so every device skips the same
    /// collectives.
    pub fn on_gradient_path(&self, inputs: bool) -> Vec<bool> {
        let mut out = vec![false; self.nodes.len()];
        for (i, node) in self.nodes.iter().enumerate() {
            out[i] = match node.op {
                Op::Param(_) => true,
                Op::Input(_) => inputs,
                Op::Targets | Op::Weights => false,
                // Operands come before their node (forward runs in order).
                Op::Prim(_) => node
                    .args
                    .iter()
                    .any(|a| out.get(*a as usize) == Some(&true)),
            };
        }
        out
    }

    /// Whether node `i` gathers a parameter for use (FSDP, or a table stored
    /// split and used whole): its value is a weight, not an activation.
    pub fn gathers_param(&self, i: usize) -> bool {
        self.nodes.get(i).is_some_and(|n| {
            matches!(n.op, Op::Prim(Prim::Collective(_)))
                && n.args
                    .first()
                    .and_then(|a| self.nodes.get(*a as usize))
                    .is_some_and(|a| matches!(a.op, Op::Param(_)))
        })
    }

    /// [`Program::gathers_param`] from more than one device: the whole weight
    /// is a copy held beside the stored piece, and its cotangent the
    /// full-size gradient the gather's transpose reduce-scatters. Over axes of
    /// size 1 the gathered value is the parameter itself.
    pub fn gathers_copy(&self, i: usize) -> bool {
        let numel = |t: &TType| self.local_shape(t).map(|s| s.iter().product::<i64>()).ok();
        self.gathers_param(i)
            && self.nodes.get(i).is_some_and(|n| {
                let stored = n.args.first().and_then(|a| self.nodes.get(*a as usize));
                match (numel(&n.ty), stored.and_then(|a| numel(&a.ty))) {
                    (Some(used), Some(stored)) => used > stored,
                    _ => false,
                }
            })
    }

    /// What node `i`'s value is while the tape keeps it for backward: the
    /// one definition the plan counts (from types) and `run --mem` measures
    /// (from tensors). Inputs, targets and parameters are the run's own, a
    /// loss or metrics result is no value of the model, a parameter gathered
    /// over axes of size 1 is the parameter itself.
    pub fn kept(&self, i: usize) -> Kept {
        let Some(n) = self.nodes.get(i) else {
            return Kept::Not;
        };
        match &n.op {
            Op::Input(_) | Op::Param(_) | Op::Targets | Op::Weights => Kept::Not,
            _ if n.op.is_result() => Kept::Not,
            _ if self.gathers_copy(i) => Kept::Gathered,
            _ if self.gathers_param(i) => Kept::Not,
            // A reshard's result is counted as communication (the plan's
            // reshard rows), not as an activation.
            Op::Prim(crate::prim::Prim::Reshard(_)) => Kept::Not,
            Op::Prim(_) => Kept::Activation,
        }
    }

    /// Whether node `i`'s cotangent counts as backward's own memory (the
    /// plan's `cotangents`, which `--mem` measures): a parameter's is its
    /// gradient, and a gathered parameter's is counted as `gathered grads`.
    pub fn cotangent_counted(&self, i: usize) -> bool {
        !matches!(self.nodes.get(i).map(|n| &n.op), Some(Op::Param(_)))
            && !self.nodes.get(i).is_some_and(|n| n.op.is_result())
            && !self.gathers_copy(i)
    }

    /// The node backward starts from: the loss, or (a program of the model
    /// alone) the output.
    pub fn root(&self) -> Option<Nid> {
        self.objective.as_ref().map(|o| o.root).or(self.output)
    }

    /// The nodes of the model (before the loss lowering appended).
    pub fn model_nodes(&self) -> usize {
        self.objective
            .as_ref()
            .map_or(self.nodes.len(), |o| o.start as usize)
    }

    /// The node range of each virtual pipeline stage: its share of the
    /// stack's repetitions, in order (none without a pipeline, or when the
    /// repetitions do not split evenly into the stages).
    pub fn stage_ranges(&self) -> Vec<std::ops::Range<usize>> {
        let Some(p) = &self.pipeline else {
            return Vec::new();
        };
        let s = p.virtual_stages();
        let per = p.blocks.len() / s;
        if per == 0 || p.blocks.len() % s != 0 {
            return Vec::new();
        }
        (0..s)
            .map(|k| p.blocks[k * per].0 as usize..p.blocks[(k + 1) * per - 1].1 as usize)
            .collect()
    }

    /// The values outside `range` (inputs, targets, weights and parameters
    /// aside) that its nodes read, in first-read order: a pipeline piece's
    /// one entering value.
    pub fn read_from_outside(&self, range: &std::ops::Range<usize>) -> Vec<usize> {
        let mut outside: Vec<usize> = Vec::new();
        for i in range.clone() {
            for a in self.nodes.get(i).map_or(&[][..], |n| n.args.as_slice()) {
                let a = *a as usize;
                if !range.contains(&a)
                    && !matches!(
                        self.nodes.get(a).map(|n| &n.op),
                        Some(Op::Input(_) | Op::Param(_) | Op::Targets | Op::Weights) | None
                    )
                    && !outside.contains(&a)
                {
                    outside.push(a);
                }
            }
        }
        outside
    }

    /// Per parameter: whether an op reads it as rows by id (an embedding, a
    /// table's lookup).
    pub fn rows_params(&self) -> Vec<bool> {
        let mut out = vec![false; self.params.len()];
        // The table itself, or its gathered copy (a table stored split).
        let param_of = |mut i: usize| loop {
            match self.nodes.get(i).map(|n| (&n.op, n.args.first())) {
                Some((Op::Param(k), _)) => return Some(*k),
                Some((Op::Prim(Prim::Collective(_) | Prim::Reshard(_)), Some(a))) => {
                    i = *a as usize
                }
                _ => return None,
            }
        };
        for n in self.nodes.iter().filter(|n| n.op.reads_ids()) {
            let k = n.args.first().and_then(|a| param_of(*a as usize));
            if let Some(o) = k.and_then(|k| out.get_mut(k)) {
                *o = true;
            }
        }
        out
    }

    /// Per parameter: the pipeline rank (coordinate on the stage axis)
    /// holding it (`None`: outside the pipelined stack, held by every device).
    pub fn param_stages(&self) -> Vec<Option<usize>> {
        let ranges = self.stage_ranges();
        let placement = self
            .pipeline
            .as_ref()
            .map(Pipeline::placement)
            .unwrap_or_default();
        let mut out = vec![None; self.params.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            if let Op::Param(k) = n.op {
                if let Some(o) = out.get_mut(k) {
                    *o = ranges
                        .iter()
                        .position(|r| r.contains(&i))
                        .and_then(|v| placement.get(v).copied());
                }
            }
        }
        out
    }

    /// Per node: whether its value is dropped after the forward pass and
    /// recomputed for the backward one — computed inside a checkpointed range,
    /// and neither the output nor read after its range (a repetition's result
    /// stays; inputs and parameters are never recomputed).
    pub fn checkpointed(&self) -> Vec<bool> {
        let n = self.nodes.len();
        let mut out = vec![false; n];
        for &(a, b) in &self.checkpoints {
            let (a, b) = (a as usize, (b as usize).min(n));
            for (i, node) in self.nodes.iter().enumerate().take(b).skip(a) {
                out[i] = matches!(node.op, Op::Prim(_))
                    && self.output != Some(i as Nid)
                    && !self.checkpoint_keep.contains(&(i as Nid));
            }
            for later in &self.nodes[b..] {
                for &x in &later.args {
                    if (a..b).contains(&(x as usize)) {
                        out[x as usize] = false;
                    }
                }
            }
        }
        out
    }

    fn axis_size(&self, a: &str) -> Option<i64> {
        self.mesh.iter().find(|m| m.0 == a).map(|m| m.1)
    }

    /// Elements of a value of type `t` (global), its sizes bound (an
    /// unknown size counts 1).
    pub fn elements(&self, t: &TType) -> usize {
        t.dims
            .iter()
            .map(|d| {
                d.size
                    .substitute(&self.bound)
                    .and_then(|p| p.as_const())
                    .unwrap_or(1)
                    .max(0) as usize
            })
            .fold(1usize, usize::saturating_mul)
    }

    /// Per-device shape, or why it does not exist.
    pub fn local_shape(&self, t: &TType) -> Result<Vec<i64>, String> {
        let mut out = Vec::new();
        for (i, d) in t.dims.iter().enumerate() {
            let size = d
                .size
                .substitute(&self.bound)
                .and_then(|p| p.as_const())
                .ok_or_else(|| format!("dimension {i} has symbolic size {}", d.size))?;
            let mut n = 1i64;
            for a in &d.axes {
                n = n.saturating_mul(
                    self.axis_size(a)
                        .ok_or_else(|| format!("unknown mesh axis `{a}`"))?,
                );
            }
            if size % n != 0 {
                return Err(format!(
                    "dimension {i} of size {size} does not split into {n} pieces"
                ));
            }
            out.push(size / n);
        }
        Ok(out)
    }

    /// Check the invariants; returns the problems found (empty when valid).
    pub fn verify(&self) -> Vec<String> {
        let mut errs = Vec::new();
        for (i, p) in self.params.iter().enumerate() {
            for t in [&p.stored, &p.used] {
                if let Err(e) = self.check_type(t) {
                    errs.push(format!("param {i} `{}`: {e}", p.name));
                }
            }
        }
        for (i, n) in self.nodes.iter().enumerate() {
            for a in &n.args {
                if *a as usize >= i {
                    errs.push(format!("%{i} uses %{a}, which is not defined before it"));
                }
            }
            if let Op::Param(p) = n.op {
                if p >= self.params.len() {
                    errs.push(format!("%{i} names parameter {p}, which does not exist"));
                }
            }
            if let Err(e) = self.check_type(&n.ty) {
                errs.push(format!("%{i}: {e}"));
            }
        }
        if let Some(o) = self.output {
            if o as usize >= self.nodes.len() {
                errs.push("the output is not a node".into());
            }
        }
        if let Some(l) = &self.loss {
            if !l.params.is_empty() {
                errs.push("the loss function reads parameters".into());
            }
            errs.extend(l.verify().into_iter().map(|e| format!("loss: {e}")));
        }
        errs
    }

    fn check_type(&self, t: &TType) -> Result<(), String> {
        let local = self.local_shape(t)?;
        // local × shard count = global, and no axis splits two dimensions.
        let mut seen = Vec::new();
        for (d, l) in t.dims.iter().zip(&local) {
            let n: i64 = d
                .axes
                .iter()
                .map(|a| self.axis_size(a).unwrap_or(1))
                .product();
            let g = d
                .size
                .substitute(&self.bound)
                .and_then(|p| p.as_const())
                .unwrap_or(-1);
            if l * n != g {
                return Err(format!("local {l} × {n} shards ≠ global {g}"));
            }
            for a in &d.axes {
                if seen.contains(&a) {
                    return Err(format!("axis `{a}` splits two dimensions"));
                }
                seen.push(a);
            }
        }
        for a in t.pending.keys() {
            if self.axis_size(a).is_none() {
                return Err(format!("pending reduction over unknown axis `{a}`"));
            }
        }
        Ok(())
    }

    /// The collectives every device issues, in program order.
    pub fn collectives(&self) -> Vec<(Nid, String)> {
        self.nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| match &n.op {
                Op::Prim(Prim::Reshard(_)) => {
                    let from = &self.nodes[n.args[0] as usize].ty;
                    Some((i as Nid, format!("reshard {from} → {}", n.ty)))
                }
                Op::Prim(p @ Prim::Collective(_)) => {
                    let attrs = p.get().attrs();
                    (!attrs.is_empty()).then(|| {
                        (
                            i as Nid,
                            format!("{}({})", p.get().name(), attrs.join(", ")),
                        )
                    })
                }
                _ => None,
            })
            .collect()
    }

    pub fn render(&self, sources: &SourceMap) -> String {
        let mut s = String::new();
        let mesh: Vec<String> = self.mesh.iter().map(|(a, n)| format!("{a}={n}")).collect();
        let _ = writeln!(
            s,
            "spmd program {} on ({}): {} params, {} ops",
            self.model,
            mesh.join(", "),
            self.params.len(),
            self.nodes.len()
        );
        let local = |t: &TType| match self.local_shape(t) {
            Ok(v) => format!(
                "{}[{}]",
                t.dtype.name(),
                v.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Err(e) => format!("<{e}>"),
        };
        for (i, p) in self.params.iter().enumerate() {
            let _ = writeln!(
                s,
                "  param {i:<3} {:<28} {:<32} local {:<24} init {}{}",
                p.name,
                p.stored.to_string(),
                local(&p.stored),
                p.init,
                if p.frozen { " frozen" } else { "" }
            );
        }
        for (i, n) in self.nodes.iter().enumerate() {
            let args: Vec<String> = n.args.iter().map(|a| format!("%{a}")).collect();
            let op = match &n.op {
                Op::Input(k) => format!("input {k}"),
                Op::Targets => "targets".to_string(),
                Op::Weights => "weights".to_string(),
                Op::Param(p) => format!("param {}", self.params.get(*p).map_or("?", |p| &p.name)),
                Op::Prim(p) => p.get().render(&args),
            };
            let at = if n.span == Span::default() {
                String::new()
            } else {
                sources.describe(n.span)
            };
            let _ = writeln!(
                s,
                "  %{i:<4} = {:<40} : {:<36} local {:<24} {at}",
                op,
                n.ty.to_string(),
                local(&n.ty)
            );
        }
        if let Some(o) = self.output {
            let _ = writeln!(s, "  return %{o}");
        }
        s
    }
}
