//! Stage 7 (lower): lowering. A trained model's typed bodies become one SPMD program:
//! calls inlined, every repetition of a `repeat` with its own parameters
//! (`blocks.0.wq`, `blocks.1.wq`, ...), one parameter per layer path (FSDP's
//! split ones gathered for use), inputs first, and a pipelined stack recorded
//! with each repetition's node range.
//!
//! A stack repeated more times than the runtime could ever unroll (a typo like
//! `repeat(8000000, …)`) is lowered once and marked as folded: `shardc plan`
//! still counts it, nothing runs it.

use crate::check::{Bodies, Model, Op as BOp, VId};
use crate::source::Span;
use crate::spmd::{Fold, Nid, Op, Param, Pipeline, Program};
use crate::types::TType;
use rustc_hash::FxHashMap as HashMap;

/// The most repetitions of a layer that lowering unrolls.
pub const MAX_UNROLL: i64 = 4096;

/// The SPMD program of a checked model.
pub fn lower(model: &Model, bodies: &Bodies) -> Program {
    let mut l = Lowering {
        bodies,
        prog: Program {
            model: model.name.clone(),
            mesh: model.mesh.clone(),
            input_names: model.inputs.clone(),
            bound: model.bound.clone(),
            batch: model.batch,
            ..Program::default()
        },
        params: HashMap::default(),
        path: Vec::new(),
        pipeline: model.pipeline.clone(),
        in_checkpoint: false,
    };
    l.prog.output = l.inline(model.body, &[]);
    if let Some(b) = model.loss {
        let mut sub = l.sub();
        sub.prog.input_names = model.loss_inputs.clone();
        sub.prog.output = sub.inline(b, &[]);
        l.prog.loss = Some(Box::new(sub.prog));
    }
    l.prog
}

struct Lowering<'a> {
    bodies: &'a Bodies,
    prog: Program,
    /// Parameter nodes by full name (the gathered node for FSDP).
    params: HashMap<String, Nid>,
    /// The layer path of the body being inlined (`blocks.3.attn`).
    path: Vec<String>,
    /// Microbatches and schedule of the model's pipelined stack.
    pipeline: Option<(usize, crate::schedule::Source)>,
    /// Inside a checkpointed block: the calls within it are not checkpointed
    /// again.
    in_checkpoint: bool,
}

impl Lowering<'_> {
    fn add(&mut self, op: Op, args: Vec<Nid>, ty: &TType, span: Span) -> Nid {
        self.prog.add(op, args, ty.clone(), span)
    }

    /// A parameter node (once per name), gathered to its `used` layout when it
    /// is stored split (FSDP weights).
    fn param(
        &mut self,
        name: String,
        stored: &TType,
        used: &TType,
        init: crate::init::Init,
        frozen: bool,
        span: Span,
    ) -> Nid {
        if let Some(id) = self.params.get(&name) {
            return *id;
        }
        self.prog.params.push(Param {
            name: name.clone(),
            stored: stored.clone(),
            used: used.clone(),
            init,
            frozen,
            span,
        });
        let idx = self.prog.params.len() - 1;
        let mut id = self.add(Op::Param(idx), vec![], stored, span);
        if stored != used {
            let axes = stored
                .all_axes()
                .into_iter()
                .filter(|a| !used.all_axes().contains(a))
                .map(|s| s.to_string())
                .collect();
            let gather = crate::prim::collective::Collective::Relayout {
                name: "all_gather",
                axes,
            };
            id = self.add(Op::Prim(gather.into()), vec![id], used, span);
        }
        self.params.insert(name, id);
        id
    }

    /// An empty program of the same model and mesh, lowered on its own.
    fn sub(&self) -> Lowering<'_> {
        Lowering {
            bodies: self.bodies,
            prog: Program {
                model: self.prog.model.clone(),
                mesh: self.prog.mesh.clone(),
                bound: self.prog.bound.clone(),
                batch: self.prog.batch,
                ..Program::default()
            },
            params: HashMap::default(),
            path: Vec::new(),
            in_checkpoint: false,
            pipeline: None,
        }
    }

    /// A computed initial value's own program (no inputs, no parameters), kept
    /// in the program's `inits`.
    fn init_program(&mut self, body: usize) -> crate::init::Init {
        let mut sub = self.sub();
        sub.prog.output = sub.inline(body, &[]);
        self.prog.inits.push(sub.prog);
        crate::init::Init::Computed(self.prog.inits.len() - 1)
    }

    /// Inline body `id` with its arguments; returns its result's node.
    fn inline(&mut self, id: usize, args: &[Nid]) -> Option<Nid> {
        self.inline_values(id, args).0
    }

    /// [`Lowering::inline`], also giving the node of each of the body's values.
    fn inline_values(&mut self, id: usize, args: &[Nid]) -> (Option<Nid>, Vec<Option<Nid>>) {
        let Some(body) = self.bodies.get(id) else {
            return (None, Vec::new());
        };
        let mut vals: Vec<Option<Nid>> = vec![None; body.values.len()];
        for (i, v) in body.values.iter().enumerate() {
            let get = |k: &VId| vals.get(*k as usize).copied().flatten();
            vals[i] = match &v.op {
                BOp::Arg(k) => args.get(*k).copied(),
                BOp::Input(k) => Some(self.add(Op::Input(*k), vec![], &v.ty, v.span)),
                BOp::Weight {
                    name,
                    stored,
                    init,
                    frozen,
                    computed,
                } => {
                    let mut full = self.path.clone();
                    full.push(name.clone());
                    let full = full.join(".");
                    let init = match computed {
                        Some(b) if !self.params.contains_key(&full) => self.init_program(*b),
                        _ => *init,
                    };
                    Some(self.param(full, stored, &v.ty, init, *frozen, v.span))
                }
                BOp::Table { name, init, frozen } => Some(self.param(
                    format!("tables.{name}"),
                    &v.ty,
                    &v.ty,
                    *init,
                    *frozen,
                    v.span,
                )),
                BOp::Prim { prim, args } => {
                    let a: Option<Vec<Nid>> = args.iter().map(get).collect();
                    a.map(|a| self.add(Op::Prim(prim.clone()), a, &v.ty, v.span))
                }
                BOp::Call(c) => {
                    let a: Option<Vec<Nid>> = c.args.iter().map(get).collect();
                    let Some(a) = a else {
                        return (None, vals);
                    };
                    match (&c.repeat, &c.member) {
                        (Some(r), Some(m)) => self.repeat(c.body, m, r, &a),
                        (None, Some(m)) => {
                            self.path.push(m.clone());
                            let out = self.inline_checkpointed(c.body, &a);
                            self.path.pop();
                            out
                        }
                        (_, None) => self.inline(c.body, &a),
                    }
                }
            };
        }
        let result = body
            .result
            .and_then(|r| vals.get(r as usize).copied().flatten());
        (result, vals)
    }

    /// A call of a layer's `forward`; a layer with a `checkpoint(...)`
    /// directive makes the call a checkpointed block (unless it is inside
    /// one already).
    fn inline_checkpointed(&mut self, body: usize, args: &[Nid]) -> Option<Nid> {
        let policy = self.bodies.get(body).and_then(|b| b.checkpoint.clone());
        let Some(keep) = policy.filter(|_| !self.in_checkpoint) else {
            return self.inline(body, args);
        };
        let start = self.prog.nodes.len() as Nid;
        self.in_checkpoint = true;
        let (out, vals) = self.inline_values(body, args);
        self.in_checkpoint = false;
        self.keep_named(body, &keep, &vals);
        self.prog
            .checkpoints
            .push((start, self.prog.nodes.len() as Nid));
        out
    }

    /// The nodes of the `let`s `keep` names in one lowered call of `body`:
    /// checkpointing keeps them.
    fn keep_named(&mut self, body: usize, keep: &[String], vals: &[Option<Nid>]) {
        if let Some(b) = self.bodies.get(body) {
            for (name, v) in &b.names {
                if keep.contains(name) {
                    if let Some(Some(n)) = vals.get(*v as usize) {
                        self.prog.checkpoint_keep.push(*n);
                    }
                }
            }
        }
    }

    /// `repeat(count, ...)`: each repetition on the previous one's result (and
    /// the same side inputs, the call's other arguments), with its own
    /// parameters; a pipelined stack records each one's node range.
    fn repeat(
        &mut self,
        body: usize,
        member: &str,
        r: &crate::check::Repeat,
        args: &[Nid],
    ) -> Option<Nid> {
        let input = *args.first()?;
        let mut cur = input;
        let mut ranges = Vec::new();
        let unrolled = r.count.min(MAX_UNROLL);
        // Inside a checkpointed block, the repetitions are part of it.
        let checkpoint = r.checkpoint.as_ref().filter(|_| !self.in_checkpoint);
        let outer = self.in_checkpoint;
        self.in_checkpoint |= checkpoint.is_some();
        for i in 0..unrolled {
            let start = self.prog.nodes.len() as Nid;
            self.path.push(format!("{member}.{i}"));
            let mut a = vec![cur];
            a.extend_from_slice(&args[1..]);
            let (out, vals) = self.inline_values(body, &a);
            self.path.pop();
            // `checkpoint: [h, y]`: those values of each repetition stay.
            if let Some(keep) = checkpoint {
                self.keep_named(body, keep, &vals);
            }
            ranges.push((start, self.prog.nodes.len() as Nid));
            let Some(out) = out else {
                self.in_checkpoint = outer;
                return None;
            };
            cur = out;
            if r.count > MAX_UNROLL {
                // Too many to unroll: one repetition stands for all of them.
                self.prog.folds.push(Fold {
                    start,
                    end: self.prog.nodes.len() as Nid,
                    count: r.count as u64,
                });
                break;
            }
        }
        self.in_checkpoint = outer;
        if self.prog.folds.is_empty() {
            self.prog.repeats.extend(ranges.iter().copied());
            if checkpoint.is_some() {
                self.prog.checkpoints.extend(ranges.iter().copied());
            }
        }
        if let (Some(axis), Some((microbatches, schedule))) = (&r.stages, &self.pipeline) {
            if self.prog.folds.is_empty() {
                let stages = self
                    .prog
                    .mesh
                    .iter()
                    .find(|m| &m.0 == axis)
                    .map_or(1, |m| m.1.max(1) as usize);
                self.prog.pipeline = Some(Pipeline {
                    axis: axis.clone(),
                    stages,
                    microbatches: *microbatches,
                    schedule: schedule.clone(),
                    blocks: ranges,
                    input,
                });
            }
        }
        Some(cur)
    }
}
