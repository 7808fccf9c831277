//! The training step on every device: forward, sharded softmax cross-entropy,
//! backward, gradient synchronisation, clipping and our own optimizers (their
//! state lives in the parameter's layout, ready for checkpoints).

use super::data::{Batch, Source};
use super::exec::{Exec, R};
use super::init;
use super::mesh::{Cluster, Collectives, InProcess, Topology};
use crate::ast::{DType as SDType, Expr, ExprKind, OptValue, Options, TrainDecl};
use crate::spmd::{Op, Program};
use crate::types::TType;
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::sync::{mpsc, Arc};

fn ce<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    Constant(f64),
    /// optax.warmup_cosine_decay_schedule
    WarmupCosine {
        init: f64,
        peak: f64,
        warmup: usize,
        decay: usize,
        end: f64,
    },
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schedule::Constant(v) => write!(f, "{v:e}"),
            Schedule::WarmupCosine {
                init,
                peak,
                warmup,
                decay,
                end,
            } => write!(
                f,
                "warmup_cosine({init:e} → {peak:e} in {warmup}, → {end:e} by {decay})"
            ),
        }
    }
}

impl Schedule {
    pub fn at(&self, step: usize) -> f64 {
        match *self {
            Schedule::Constant(v) => v,
            Schedule::WarmupCosine {
                init,
                peak,
                warmup,
                decay,
                end,
            } => {
                if step < warmup {
                    init + (peak - init) * step as f64 / warmup.max(1) as f64
                } else {
                    let span = decay.saturating_sub(warmup).max(1) as f64;
                    let t = ((step - warmup) as f64 / span).min(1.0);
                    end + (peak - end) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
                }
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct Optimizer {
    pub kind: String,
    pub lr: Schedule,
    pub b1: f64,
    pub b2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    pub momentum: f64,
    pub nesterov: bool,
    /// Adagrad's and FTRL's starting accumulator.
    pub initial_accumulator: f64,
    /// FTRL.
    pub lr_power: f64,
    pub l1: f64,
    pub l2: f64,
}

/// What the model's output is trained against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Loss {
    /// Class ids against logits (the last dimension, possibly split over devices).
    #[default]
    SoftmaxCrossEntropy,
    /// Targets shaped like the output: the mean over every element of (out − y)².
    Mse,
}

impl Loss {
    /// The (checked) `loss:` of a `train` declaration.
    pub fn of(t: &TrainDecl) -> Loss {
        match t.options.expr("loss").map(|e| &e.kind) {
            Some(ExprKind::Name(l)) if l == "mse" => Loss::Mse,
            _ => Loss::SoftmaxCrossEntropy,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub steps: usize,
    pub loss: Loss,
    pub seed: u64,
    pub batch: usize,
    pub optimizer: Optimizer,
    pub clip: Option<f64>,
    /// Microbatches per step; gradients are averaged over them (`batch` is the total).
    pub accumulate: usize,
    pub dtype: DType,
    /// Initial values for some parameters (global arrays), instead of their initializers.
    pub init: std::collections::HashMap<String, Vec<f64>>,
    /// Optimizers of particular parameters (embedding tables have their own).
    pub per_param: std::collections::HashMap<String, Optimizer>,
    /// `eval: { every, steps }`.
    pub eval: Option<(usize, usize)>,
    /// `checkpoint: { every, keep, dir }`.
    pub checkpoint: Option<(usize, usize, std::path::PathBuf)>,
    /// Steps already done (a resumed run starts after them).
    pub start_step: usize,
    /// Optimizer slots to start from (`opt_m/NAME`, `opt_v/NAME`, global arrays).
    pub init_opt: std::collections::HashMap<String, Vec<f64>>,
    /// Embedding tables' SparseCore input processing and FDO.
    pub sparse: super::sparse::SparseConfig,
}

fn num(e: &Expr) -> Option<f64> {
    match &e.kind {
        ExprKind::Float(v) => Some(*v),
        ExprKind::Int(v) => Some(*v as f64),
        ExprKind::Neg(x) => num(x).map(|v| -v),
        _ => None,
    }
}

/// A count option (`every: 10`), at least 1.
fn opt_count(o: &Options, k: &str) -> Option<usize> {
    o.expr(k).and_then(|e| {
        if let ExprKind::Int(v) = e.kind {
            Some(v.max(1) as usize)
        } else {
            None
        }
    })
}

fn default_optimizer() -> Optimizer {
    Optimizer {
        kind: "adam".into(),
        lr: Schedule::Constant(1e-3),
        b1: 0.9,
        b2: 0.999,
        eps: 1e-8,
        weight_decay: 1e-4,
        momentum: 0.0,
        nesterov: false,
        // optax.adagrad's and TensorFlow FTRL's defaults.
        initial_accumulator: 0.1,
        lr_power: -0.5,
        l1: 0.0,
        l2: 0.0,
    }
}

/// `adam(lr: 0.005)`, `adamw(lr: warmup_cosine(...), weight_decay: 0.1)`, ...
pub fn optimizer_of(e: &Expr) -> Optimizer {
    let mut opt = default_optimizer();
    if let Some((name, args)) = e.as_call() {
        opt.kind = name.to_string();
        for (k, v) in args {
            match k {
                "lr" => {
                    opt.lr = match v.as_call() {
                        Some(("warmup_cosine", a)) => {
                            let g = |n: &str| {
                                a.iter()
                                    .find(|x| x.0 == n)
                                    .and_then(|x| num(x.1))
                                    .unwrap_or(0.0)
                            };
                            Schedule::WarmupCosine {
                                init: g("init"),
                                peak: g("peak"),
                                warmup: g("warmup") as usize,
                                decay: g("decay") as usize,
                                end: g("end"),
                            }
                        }
                        Some(("constant", a)) => {
                            Schedule::Constant(a.first().and_then(|x| num(x.1)).unwrap_or(1e-3))
                        }
                        _ => Schedule::Constant(num(v).unwrap_or(1e-3)),
                    }
                }
                "b1" => opt.b1 = num(v).unwrap_or(opt.b1),
                "b2" => opt.b2 = num(v).unwrap_or(opt.b2),
                "eps" => opt.eps = num(v).unwrap_or(opt.eps),
                "weight_decay" => opt.weight_decay = num(v).unwrap_or(opt.weight_decay),
                "momentum" => opt.momentum = num(v).unwrap_or(0.0),
                "nesterov" => opt.nesterov = matches!(&v.kind, ExprKind::Name(n) if n == "true"),
                "initial_accumulator" => {
                    opt.initial_accumulator = num(v).unwrap_or(opt.initial_accumulator)
                }
                "lr_power" => opt.lr_power = num(v).unwrap_or(opt.lr_power),
                "l1" => opt.l1 = num(v).unwrap_or(0.0),
                "l2" => opt.l2 = num(v).unwrap_or(0.0),
                _ => {}
            }
        }
    }
    opt
}

impl Optimizer {
    /// The state it keeps per parameter, in the parameter's layout: (a first
    /// slot `m`, a second slot `v`). Adam/AdamW two, momentum SGD and Adagrad one.
    pub fn slots(&self) -> (bool, bool) {
        match self.kind.as_str() {
            "adam" | "adamw" => (true, true),
            "adagrad" => (false, true),
            // FTRL: the linear term and the squared-gradient accumulator.
            "ftrl" => (true, true),
            "sgd" if self.momentum > 0.0 => (true, false),
            _ => (false, false),
        }
    }
}

impl Config {
    /// The optimizer of the parameter `name`: its own (an embedding table's) or
    /// the run's.
    pub fn optimizer_for(&self, name: &str) -> &Optimizer {
        self.per_param.get(name).unwrap_or(&self.optimizer)
    }
}

/// Read the (already checked) `train` options.
pub fn config(
    t: &TrainDecl,
    consts: &std::collections::HashMap<String, (i64, crate::source::Span)>,
) -> Config {
    let int = |k: &str| -> Option<i64> {
        t.options.expr(k).and_then(|e| match &e.kind {
            ExprKind::Int(v) => Some(*v),
            ExprKind::Name(n) => consts.get(n).map(|c| c.0),
            _ => None,
        })
    };
    let opt = t
        .options
        .expr("optimizer")
        .map_or_else(default_optimizer, optimizer_of);
    Config {
        steps: int("steps").unwrap_or(10).max(0) as usize,
        loss: Loss::of(t),
        seed: int("seed").unwrap_or(0) as u64,
        batch: int("batch").unwrap_or(1).max(1) as usize,
        optimizer: opt,
        accumulate: int("accumulate").unwrap_or(1).max(1) as usize,
        clip: t.options.expr("clip_grad_norm").and_then(num),
        dtype: DType::F32,
        init: Default::default(),
        per_param: Default::default(),
        checkpoint: match t.options.get("checkpoint") {
            Some(OptValue::Options(o)) => {
                let g = |k: &str| opt_count(o, k);
                let dir = o.expr("dir").and_then(|e| {
                    if let ExprKind::Str(s) = &e.kind {
                        Some(std::path::PathBuf::from(s))
                    } else {
                        None
                    }
                });
                match (g("every"), dir) {
                    (Some(every), Some(dir)) => Some((every, g("keep").unwrap_or(1), dir)),
                    _ => None,
                }
            }
            _ => None,
        },
        start_step: 0,
        init_opt: Default::default(),
        sparse: Default::default(),
        eval: match t.options.get("eval") {
            Some(OptValue::Options(o)) => {
                let g = |k: &str| opt_count(o, k);
                g("every").map(|every| (every, g("steps").unwrap_or(1)))
            }
            _ => None,
        },
    }
}

/// The data source named in `train` (or what the data stage loaded for it from a
/// file, or `--data`), or synthetic data.
pub fn source(
    t: &TrainDecl,
    consts: &std::collections::HashMap<String, (i64, crate::source::Span)>,
    classes: usize,
    regression: bool,
    loaded: Option<&crate::data::Loaded>,
) -> Source {
    match loaded {
        Some(crate::data::Loaded::Arrays(a)) => return Source::Arrays(a.clone()),
        Some(crate::data::Loaded::Text { ids, seq }) => {
            return Source::Tokens {
                ids: ids.clone(),
                seq: *seq,
            }
        }
        None => {}
    }
    let int = |e: &Expr| match &e.kind {
        ExprKind::Int(v) => Some(*v as usize),
        ExprKind::Name(n) => consts.get(n).map(|c| c.0 as usize),
        _ => None,
    };
    match t.options.expr("data").and_then(Expr::as_call) {
        Some(("shakespeare_words", a)) => {
            let g = |n: &str| a.iter().find(|x| x.0 == n).and_then(|x| int(x.1));
            Source::Tokens {
                ids: super::data::shakespeare_words(g("vocab").unwrap_or(classes)),
                seq: g("seq").unwrap_or(16),
            }
        }
        Some(("shakespeare_chars", a)) => Source::Tokens {
            ids: super::data::shakespeare_chars(),
            seq: a
                .iter()
                .find(|x| x.0 == "seq")
                .and_then(|x| int(x.1))
                .unwrap_or(64),
        },
        _ => Source::Synthetic {
            classes,
            regression,
        },
    }
}

/// Everything a run needs from a clean compilation: the lowered program of the
/// chosen `train` (the first, or the one for `model`), its settings and its data.
pub fn prepare<'c>(
    c: &'c crate::world::Compilation,
    model: Option<&str>,
) -> Result<(&'c Program, &'c TrainDecl, Config, Source), String> {
    let (prog, t, cfg) = settings(c, model)?;
    let classes = prog
        .output
        .and_then(|o| {
            prog.nodes[o as usize]
                .ty
                .dims
                .last()
                .and_then(|d| d.size.as_const())
        })
        .unwrap_or(1) as usize;
    let loaded = c.data.iter().find(|d| d.model == t.model.name);
    if loaded.is_none() {
        // A file source that did not load has a diagnostic; never fall back silently.
        if let Some((name @ ("arrays" | "text"), _)) =
            t.options.expr("data").and_then(Expr::as_call)
        {
            return Err(format!("the `{name}` data could not be loaded"));
        }
    }
    let regression = cfg.loss == Loss::Mse;
    let src = source(
        t,
        &c.program.consts,
        classes,
        regression,
        loaded.map(|d| &d.data),
    );
    if regression && matches!(src, Source::Tokens { .. }) {
        // The data stage reports this (E0305); never train on ids as targets.
        return Err(
            "`loss: mse` needs float targets shaped like the output; a text source gives token ids"
                .into(),
        );
    }
    Ok((prog, t, cfg, src))
}

/// The lowered program of the chosen `train` and its settings, without its data
/// (what `shardc show` and a live reload need).
pub fn settings<'c>(
    c: &'c crate::world::Compilation,
    model: Option<&str>,
) -> Result<(&'c Program, &'c TrainDecl, Config), String> {
    let t = match model {
        Some(m) => c.program.trains.iter().find(|t| t.model.name == m),
        None => c.program.trains.first(),
    }
    .ok_or_else(|| {
        format!(
            "no `train` declaration{}",
            model.map_or(String::new(), |m| format!(" for `{m}`"))
        )
    })?;
    let prog = c
        .checked
        .programs
        .iter()
        .find(|p| p.model == t.model.name)
        .ok_or_else(|| format!("`{}` could not be lowered", t.model.name))?;
    let mut cfg = config(t, &c.program.consts);
    for table in &c.program.tables {
        if let Some(OptValue::Expr(e)) = table.options.get("optimizer") {
            cfg.per_param
                .insert(format!("tables.{}", table.name.name), optimizer_of(e));
        }
    }
    cfg.sparse = sparse_config(c, prog, t);
    Ok((prog, t, cfg))
}

/// The tables a program looks up, with their SparseCore placement, limits and
/// overflow policy, the lookups whose ids are model inputs, and `fdo`.
fn sparse_config(
    c: &crate::world::Compilation,
    prog: &Program,
    t: &TrainDecl,
) -> super::sparse::SparseConfig {
    use super::sparse::{Fdo, LookupRun, SparseConfig, TableRun};
    use crate::embed::{Layout, Limits, Overflow, Partitioner, TableInfo};
    let consts = &c.program.consts;
    let int = |o: &Options, k: &str| {
        o.expr(k).and_then(|e| match &e.kind {
            ExprKind::Int(v) => Some(*v),
            ExprKind::Name(n) => consts.get(n).map(|v| v.0),
            _ => None,
        })
    };
    let mesh = c.program.mesh(&t.mesh.name);
    let sparsecores = mesh.map_or(1, |m| m.sparsecores.max(1)) as usize;
    let name_of = |e: Option<&Expr>| match e.map(|e| &e.kind) {
        Some(ExprKind::Name(n)) => n.clone(),
        _ => String::new(),
    };
    let infos: Vec<TableInfo> = c
        .program
        .tables
        .iter()
        .map(|tb| TableInfo {
            name: tb.name.name.clone(),
            vocab: int(&tb.options, "vocab").unwrap_or(1).max(1) as usize,
            dim: int(&tb.options, "dim").unwrap_or(1).max(1) as usize,
            optimizer: tb
                .options
                .expr("optimizer")
                .and_then(Expr::as_call)
                .map_or(String::new(), |x| x.0.to_string()),
            combiner: name_of(tb.options.expr("combiner")),
            activation_bytes: 0.0,
        })
        .collect();
    let mut tables = Vec::new();
    for tb in &c.program.tables {
        let axis = match tb.options.expr("shard").map(|e| &e.kind) {
            Some(ExprKind::Call(_, args)) => match args.first() {
                Some(crate::ast::Arg::Pos(Expr {
                    kind: ExprKind::Name(a),
                    ..
                })) => Some(a.clone()),
                _ => None,
            },
            _ => None,
        };
        let devices = axis
            .as_deref()
            .and_then(|a| mesh.map(|m| m.size(a)))
            .unwrap_or(1)
            .max(1) as usize;
        let n = devices * sparsecores;
        let stacks = crate::embed::stack(&infos, n, sparsecores, None);
        let stack = stacks
            .iter()
            .find(|s| s.tables.iter().any(|x| x.name == tb.name.name))
            .map_or(tb.name.name.clone(), |s| s.name.clone());
        let shift = stacks
            .iter()
            .flat_map(|s| &s.tables)
            .find(|x| x.name == tb.name.name)
            .map_or(0, |x| x.shard_rotation);
        // SparseCore's own defaults when a table leaves its limits out.
        let max_ids = int(&tb.options, "max_ids_per_partition").unwrap_or(256);
        tables.push(TableRun {
            name: tb.name.name.clone(),
            stack,
            layout: Layout {
                devices,
                sparsecores,
            },
            part: Partitioner { n, shift },
            limits: Limits {
                max_ids,
                max_unique_ids: int(&tb.options, "max_unique_ids_per_partition").unwrap_or(max_ids),
            },
            policy: Overflow::parse(&name_of(tb.options.expr("overflow")))
                .unwrap_or(Overflow::Error),
        });
    }
    let mut lookups = Vec::new();
    for (i, node) in prog.nodes.iter().enumerate() {
        let Op::Builtin(b, attrs) = &node.op else {
            continue;
        };
        if b != "lookup" {
            continue;
        }
        let Some(feature) = attrs.iter().find_map(|a| {
            c.program
                .features
                .iter()
                .find(|f| a.0.is_empty() && f.name.name == a.1)
        }) else {
            continue;
        };
        let Some(table) = tables.iter().position(|x| x.name == feature.table.name) else {
            continue;
        };
        // The ids, through layout changes, must be a model input.
        let mut id = node.args.get(1).copied();
        while let Some(k) = id {
            match &prog.nodes[k as usize].op {
                Op::Reshard => id = prog.nodes[k as usize].args.first().copied(),
                _ => break,
            }
        }
        let Some(Op::Input(input)) = id.map(|k| &prog.nodes[k as usize].op) else {
            continue;
        };
        let size = |ty: &TType| -> usize {
            ty.dims
                .iter()
                .map(|d| {
                    d.size
                        .substitute(&prog.bound)
                        .and_then(|p| p.as_const())
                        .unwrap_or(1)
                        .max(1) as usize
                })
                .product()
        };
        let samples = node
            .ty
            .dims
            .first()
            .and_then(|d| d.size.substitute(&prog.bound))
            .and_then(|p| p.as_const())
            .unwrap_or(1)
            .max(1) as usize;
        let ids_t = &prog.nodes[id.unwrap_or(0) as usize].ty;
        lookups.push(LookupRun {
            node: i,
            input: *input,
            valency: (size(ids_t) / samples).max(1),
            table,
        });
    }
    let fdo = match t.options.get("fdo") {
        Some(OptValue::Options(o)) => Some(Fdo {
            every: opt_count(o, "every").unwrap_or(1),
            dir: o
                .expr("dir")
                .and_then(|e| match &e.kind {
                    ExprKind::Str(s) => Some(std::path::PathBuf::from(s)),
                    _ => None,
                })
                .unwrap_or_else(|| "fdo".into()),
            headroom: o.expr("headroom").and_then(num).unwrap_or(1.0),
        }),
        _ => None,
    };
    SparseConfig {
        tables,
        lookups,
        fdo,
        sparsecores,
    }
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
}

/// Named global arrays (parameter name → row-major values).
pub type Named = Vec<(String, Vec<f64>)>;

/// Live bytes on device 0, measured from its tensors during the first step.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Memory {
    pub params: f64,
    pub grads: f64,
    pub optimizer_state: f64,
    /// Forward values kept for backward (inputs and parameters excluded).
    pub activations: f64,
    /// FSDP parameters gathered for use.
    pub gathered_params: f64,
}

impl Memory {
    pub fn total(&self) -> f64 {
        self.params + self.grads + self.optimizer_state + self.activations + self.gathered_params
    }
}

fn bytes(t: &Tensor) -> f64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as f64
}

pub struct RunOutput {
    pub memory: Option<Memory>,
    pub losses: Vec<f64>,
    /// Gradients at the first step, gathered to global arrays, when asked for.
    pub first_grads: Option<Named>,
}

/// Local piece of a global array (row-major `values`) for a value of type `t`.
fn local_piece(
    topo: &Topology,
    rank: usize,
    t: &TType,
    prog: &Program,
    values: &[f64],
    dtype: DType,
    dev: &Device,
) -> R<Tensor> {
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
    let dt = if matches!(t.dtype, SDType::I32 | SDType::I64) {
        DType::I64
    } else {
        dtype
    };
    if dt == DType::I64 {
        let iv: Vec<i64> = v.iter().map(|x| *x as i64).collect();
        return Tensor::from_vec(iv, shape, dev).map_err(ce);
    }
    Tensor::from_vec(v, shape, dev)
        .and_then(|t| t.to_dtype(dt))
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
    // Class ids shaped like the output without its class dimension, or, for a
    // regression, targets shaped like the output.
    let label_t = match cfg.loss {
        Loss::SoftmaxCrossEntropy => TType {
            dtype: SDType::I64,
            dims: out_t.dims[..out_t.rank() - 1].to_vec(),
            pending: Default::default(),
        },
        Loss::Mse => out_t.clone(),
    };
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
    let (tx, rx) = mpsc::channel::<StepReport>();
    let mut result: Result<RunOutput, RunError> = Err("no device ran".into());
    // Replicas of a parameter piece hold the same values: the first device to
    // need a piece computes it and the others share it (the optimizer copies a
    // shared tensor before its first in-place step).
    let pieces: PieceCache = Default::default();
    let pieces = &pieces;
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for &rank in &local_ranks {
            let tx = tx.clone();
            let (topo, label_t, inputs, out_t) = (&topo, &label_t, &inputs, &out_t);
            let (micro_sizes, int_inputs) = (&micro_sizes, &int_inputs);
            handles.push(scope.spawn(move || {
                // A device that fails breaks the mesh's barrier, so no other device
                // waits forever in a collective.
                let body = || -> Result<(Option<Named>, Option<Memory>), RunError> {
                let dev = Device::Cpu;
                let ex = Exec {
                    prog,
                    comm,
                    rank,
                    dtype: cfg.dtype,
                    dev: dev.clone(),
                    keep: Default::default(),
                    placements: placements.clone(),
                    touched: Default::default(),
                    stage: stages.as_ref().map(|st| (st.axis.clone(), st.param_stage.clone())),
                };
                // Parameters: each device computes only its own piece.
                let mut params = Vec::new();
                for (pi, p) in prog.params.iter().enumerate() {
                    // A pipeline stage holds only its own layers' parameters.
                    if !ex.holds(pi) {
                        params.push(Tensor::zeros(0, cfg.dtype, &dev).map_err(ce)?);
                        continue;
                    }
                    let key = (pi, p.stored.dims.iter().map(|d| topo.shard_index(rank, &d.axes)).collect::<Vec<_>>());
                    let cell = match (placements.get(&pi), pieces.lock()) {
                        // Tables are MOD-placed per device: not shared.
                        (None, Ok(mut m)) => Some(m.entry(key).or_default().clone()),
                        _ => None,
                    };
                    let make = || -> R<Tensor> {
                    let idx = param_indices(topo, rank, p, placements.get(&pi), prog)?;
                    let v = match cfg.init.get(&p.name) {
                        Some(g) => idx
                            .iter()
                            .map(|i| g.get(*i as usize).copied().unwrap_or(0.0))
                            .collect(),
                        None => init::init_values(
                            &p.init,
                            &p.stored,
                            cfg.seed ^ init::hash_str(&p.name),
                            &idx,
                            &prog.bound,
                        )?,
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
                let opts = prog.params.iter().map(|p| cfg.optimizer_for(&p.name).clone()).collect();
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
                let mut memory = None;
                let mut first = None;
                // A pipeline's activations: the most its microbatches' tapes held at once.
                let mut peak_activations = 0.0f64;
                let base = prog;
                let all_axes: Vec<String> = topo.axes.iter().map(|a| a.0.clone()).collect();
                // The reload in force (none: the program the run started with).
                let mut active: Option<std::sync::Arc<super::reload::Update>> = None;
                let mut active_stages: Option<Option<super::pipeline::Stages>> = None;
                for step in cfg.start_step..cfg.steps {
                    let b = &*step_batches.get(step)?;
                    let mut reloaded = None;
                    if let Some(rl) = reloads {
                        // Every device takes the newest generation any of them has seen.
                        let seen = Tensor::new(&[rl.visible(step) as f64], &dev).map_err(ce)?;
                        let agreed = comm.pmax(rank, &seen, &all_axes).and_then(|t| t.to_vec1::<f64>()).map_err(ce)?;
                        let agreed = agreed.first().copied().unwrap_or(0.0) as usize;
                        if agreed > active.as_ref().map_or(0, |u| u.generation) {
                            let u = rl.get(agreed).ok_or("a reload was lost")?;
                            state.opts = base.params.iter().map(|p| u.cfg.optimizer_for(&p.name).clone()).collect();
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
                    let stages: &Option<super::pipeline::Stages> = active_stages.as_ref().unwrap_or(stages);
                    ex.touched.borrow_mut().clear();
                    // Microbatch j is the j-th contiguous chunk of the step's batch.
                    let mut acc: Option<(Vec<Tensor>, f64)> = None;
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
                            .map(|(t, v)| local_piece(topo, rank, t, prog, &chunk(v), cfg.dtype, &dev))
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
                            let loss_of = |logits: &Tensor, y: &Tensor| loss_fn(cfg.loss, &ex, logits, out_t, y, rows, Some(st.axis.as_str()));
                            let c = super::pipeline::run_chunk(&ex, st, &params, &micro, &loss_of, m_count, true)?;
                            peak_activations = peak_activations.max(c.peak_activations);
                            let g: Vec<Tensor> = c.grads.into_iter().zip(&params).map(|(g, p)| g.map_or_else(|| p.zeros_like().map_err(ce), Ok)).collect::<R<_>>()?;
                            acc = Some(match acc {
                                None => (g, c.loss),
                                Some((x, l)) => (x.iter().zip(&g).map(|(x, y)| x + y).collect::<candle_core::Result<_>>().map_err(ce)?, l + c.loss),
                            });
                            if c.tape.is_some() {
                                tape = c.tape;
                            }
                        }
                    }
                    for j in (0..k).filter(|_| stages.is_none()) {
                        let mb = microbatch(j)?;
                        *ex.keep.borrow_mut() = mb.keep;
                        let y = mb.labels;
                        let t = ex.forward(&params, &mb.inputs, mb.seed)?;
                        let (loss, ct) = loss_fn(cfg.loss, &ex, &t.vals[out_id], out_t, &y, rows, None)?;
                        if !loss.is_finite() {
                            // Every device sees the same loss, so all stop here together.
                            return Err(non_finite(step, loss, &t.vals, generation));
                        }
                        // Local gradients accumulate; they are synchronised once per step.
                        let g: Vec<Tensor> = ex.backward(&t, ct)?.into_iter().zip(&params).map(|(g, p)| g.map_or_else(|| p.zeros_like().map_err(ce), Ok)).collect::<R<_>>()?;
                        acc = Some(match acc {
                            None => (g, loss),
                            Some((a, l)) => (a.iter().zip(&g).map(|(x, y)| x + y).collect::<candle_core::Result<_>>().map_err(ce)?, l + loss),
                        });
                        tape = Some(t);
                    }
                    let (grads, loss) = acc.ok_or("no microbatch")?;
                    let grads = sync_grads(&ex, grads)?;
                    // A pipeline's first stages keep no whole-program tape.
                    let tape = match tape {
                        Some(t) => t,
                        None if stages.is_some() => ex.empty_tape(&params, &[])?,
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
                            params: params.iter().map(bytes).sum(),
                            grads: grads.iter().map(bytes).sum(),
                            optimizer_state: state.bytes(),
                            ..Memory::default()
                        };
                        for (n, v) in prog.nodes.iter().zip(&tape.vals) {
                            match &n.op {
                                Op::Input(_) | Op::Param(_) => {}
                                Op::Collective(k, _, _) if k == "all_gather" && n.args.first().is_some_and(|a| matches!(prog.nodes[*a as usize].op, Op::Param(_))) => m.gathered_params = m.gathered_params.max(bytes(v)),
                                _ => m.activations += bytes(v),
                            }
                        }
                        if stages.is_some() {
                            m.activations = peak_activations;
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
                    let touched = std::mem::take(&mut *ex.touched.borrow_mut());
                    let mut masks: Vec<Option<Tensor>> = vec![None; params.len()];
                    for pi in placements.keys() {
                        let rows = params[*pi].dims()[0];
                        let m = touched.get(pi).cloned().unwrap_or_else(|| vec![0.0; rows]);
                        let m = Tensor::from_vec(m, (rows, 1), &dev).map_err(ce)?;
                        let (rep, _) = topo.replication(&prog.params[*pi].stored, None);
                        let m = ex.comm.pmax(rank, &m, &rep).and_then(|t| t.to_dtype(cfg.dtype)).map_err(ce)?;
                        masks[*pi] = Some(m);
                    }
                    state.update(step + 1, &mut params, &grads, scale, &masks)?;
                    if let Some((every, keep, dir)) = &cfg.checkpoint {
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
                                    step: step + 1,
                                    seed: cfg.seed,
                                    rng: format!("counter-based: seed {}, counter = step; dropout streams from (seed, step, microbatch)", cfg.seed),
                                    data_position: (step + 1) * cfg.batch,
                                    mesh: prog.mesh.clone(),
                                    dtype: if cfg.dtype == DType::F64 { "f64".into() } else { "f32".into() },
                                    optimizer: cfg_now.optimizer.kind.clone(),
                                    tensors: arrays
                                        .iter()
                                        .map(|(n, s, _)| {
                                            let layout = prog.params.iter().find(|p| n.ends_with(&format!("/{}", p.name))).map(|p| p.stored.to_string()).unwrap_or_default();
                                            super::checkpoint::TensorInfo { name: n.clone(), shape: s.clone(), layout }
                                        })
                                        .collect(),
                                };
                                // A failed save must not stop the other devices mid-collective.
                                if let Err(e) = super::checkpoint::save(dir, *keep, &manifest, &arrays, cfg.dtype == DType::F64) {
                                    eprintln!("warning: the checkpoint after step {} was not written: {e}", step + 1);
                                }
                            }
                        }
                    }
                    // Held-out loss: forward only, no dropout, the same batch size.
                    let mut eval_loss = None;
                    if let Some((every, esteps)) = cfg.eval {
                        if (step + 1) % every == 0 {
                            // Held-out batches are looked up whole.
                            ex.keep.borrow_mut().clear();
                            let mut total = 0.0;
                            for e in 0..esteps {
                                let b = src.batch(cfg.seed, e, cfg.batch / k, micro_sizes, int_inputs, vocab, rows, per_position, true);
                                let xs: Vec<Tensor> = inputs.iter().zip(&b.inputs).map(|(t, v)| local_piece(topo, rank, t, prog, v, cfg.dtype, &dev)).collect::<R<_>>()?;
                                let y = local_piece(topo, rank, label_t, prog, &b.labels, cfg.dtype, &dev)?;
                                total += match stages {
                                    // Through the stages, forward only.
                                    Some(st) => {
                                        let mb = std::cell::RefCell::new(Some((xs, y)));
                                        let micro = |_: usize| -> R<super::pipeline::Micro> {
                                            let (inputs, labels) = mb.borrow_mut().take().ok_or("one held-out batch")?;
                                            Ok(super::pipeline::Micro { inputs, labels, seed: None, keep: Default::default() })
                                        };
                                        let loss_of = |logits: &Tensor, y: &Tensor| loss_fn(cfg.loss, &ex, logits, out_t, y, rows, Some(st.axis.as_str()));
                                        super::pipeline::run_chunk(&ex, st, &params, &micro, &loss_of, 1, false)?.loss
                                    }
                                    None => {
                                        let t = ex.forward(&params, &xs, None)?;
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
                        let _ = tx.send(StepReport { step, notes, loss, lr, grad_norm: norm, eval_loss });
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
        result = Ok(RunOutput {
            memory,
            losses,
            first_grads: first,
        });
    });
    result
}

/// The training loss of `out` against `labels` (see [`Loss`]) and its cotangent.
fn loss_fn(
    kind: Loss,
    ex: &Exec,
    out: &Tensor,
    ot: &TType,
    labels: &Tensor,
    rows: usize,
    stage_axis: Option<&str>,
) -> R<(f64, Tensor)> {
    match kind {
        Loss::SoftmaxCrossEntropy => cross_entropy(ex, out, ot, labels, rows, stage_axis),
        Loss::Mse => mse(ex, out, ot, labels, rows, stage_axis),
    }
}

/// Mean squared error over all `n` elements of the (global) output; only the
/// sum of squares crosses devices. The cotangent, 2(out − y)/n, is held as
/// addends over the axes the output is replicated on, like cross-entropy's.
fn mse(
    ex: &Exec,
    out: &Tensor,
    ot: &TType,
    y: &Tensor,
    n: usize,
    stage_axis: Option<&str>,
) -> R<(f64, Tensor)> {
    let topo = ex.comm.topo();
    let diff = out.sub(y).map_err(ce)?;
    let local = diff
        .sqr()
        .and_then(|x| x.sum_all())
        .and_then(|x| x.to_dtype(DType::F64))
        .map_err(ce)?;
    let split: Vec<String> = ot.dims.iter().flat_map(|d| d.axes.clone()).collect();
    let total = ex.comm.psum(ex.rank, &local, &split).map_err(ce)?;
    let loss = total.to_scalar::<f64>().map_err(ce)? / n.max(1) as f64;
    let (_, rep) = topo.replication(ot, stage_axis);
    let ct = (diff * (2.0 / (n.max(1) * rep) as f64)).map_err(ce)?;
    Ok((loss, ct))
}

/// Mean softmax cross-entropy over all label rows, with logits possibly split over
/// the vocabulary (seed 001): only the max, the sum of exponentials and the target
/// logit cross devices. Returns the global loss and the logits' cotangent.
fn cross_entropy(
    ex: &Exec,
    logits: &Tensor,
    lt: &TType,
    labels: &Tensor,
    rows: usize,
    stage_axis: Option<&str>,
) -> R<(f64, Tensor)> {
    let topo = ex.comm.topo();
    let vaxes = lt.dims[lt.rank() - 1].axes.clone();
    let vloc = logits.dims()[logits.rank() - 1];
    let (vi, _) = topo.shard_index(ex.rank, &vaxes);
    let off = (vi * vloc) as i64;
    let d = candle_core::D::Minus1;
    let m = logits.max_keepdim(d).map_err(ce)?;
    let m = ex.comm.pmax(ex.rank, &m, &vaxes).map_err(ce)?;
    let e = logits.broadcast_sub(&m).and_then(|x| x.exp()).map_err(ce)?;
    let se = e.sum_keepdim(d).map_err(ce)?;
    let se = ex.comm.psum(ex.rank, &se, &vaxes).map_err(ce)?;
    let lse = se.log().and_then(|l| l.add(&m)).map_err(ce)?;
    // One-hot of the labels inside this device's vocabulary window.
    let lab: Vec<i64> = labels
        .flatten_all()
        .and_then(|t| t.to_vec1::<i64>())
        .map_err(ce)?;
    let mut oh = vec![0f64; lab.len() * vloc];
    for (r, l) in lab.iter().enumerate() {
        let k = l - off;
        if k >= 0 && (k as usize) < vloc {
            oh[r * vloc + k as usize] = 1.0;
        }
    }
    let oh = Tensor::from_vec(oh, logits.dims(), logits.device())
        .and_then(|t| t.to_dtype(logits.dtype()))
        .map_err(ce)?;
    let tgt = logits.mul(&oh).and_then(|x| x.sum_keepdim(d)).map_err(ce)?;
    let tgt = ex.comm.psum(ex.rank, &tgt, &vaxes).map_err(ce)?;
    let local = lse
        .sub(&tgt)
        .and_then(|x| x.sum_all())
        .and_then(|x| x.to_dtype(DType::F64))
        .map_err(ce)?;
    // Rows are split over the label dims' axes: sum over those devices.
    let raxes: Vec<String> = lt.dims[..lt.rank() - 1]
        .iter()
        .flat_map(|d| d.axes.clone())
        .collect();
    let total = ex.comm.psum(ex.rank, &local, &raxes).map_err(ce)?;
    let loss = total.to_scalar::<f64>().map_err(ce)? / rows as f64;
    // d loss / d logits, held as addends over the axes the logits are replicated on
    // (not a pipeline's stage axis: only the last stage computes them).
    let (_, rep) = topo.replication(lt, stage_axis);
    let p = e.broadcast_div(&se).map_err(ce)?;
    let ct = p
        .sub(&oh)
        .and_then(|x| x / (rows * rep) as f64)
        .map_err(ce)?;
    Ok((loss, ct))
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
fn sync_grads(ex: &Exec, grads: Vec<Tensor>) -> R<Vec<Tensor>> {
    let mut out = Vec::new();
    for (i, g) in grads.into_iter().enumerate() {
        if !ex.holds(i) {
            out.push(g);
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
        if !ex.holds(i) {
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
fn gather_one(ex: &Exec, pi: usize, t: &Tensor) -> R<Option<Vec<f64>>> {
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
        let idx = param_indices(topo, r, p, ex.placements.get(&pi), ex.prog)?;
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
/// computed once and shared by the replicas that hold the same piece.
type PieceCache = std::sync::Mutex<
    HashMap<(usize, Vec<(usize, usize)>), Arc<std::sync::OnceLock<Result<Tensor, String>>>>,
>;

/// Optimizer state in each parameter's layout; each parameter may have its own
/// optimizer (an embedding table's, for instance).
pub struct OptState {
    pub opts: Vec<Optimizer>,
    pub m: Vec<Option<Tensor>>,
    pub v: Vec<Option<Tensor>>,
    /// The parameter tensors this state has made its own (fused steps write them
    /// in place, so they must not share storage with anything else).
    owned: Vec<Option<candle_core::TensorId>>,
}

impl OptState {
    /// Only the slots each optimizer uses: Adam/AdamW two, momentum SGD and Adagrad one.
    fn new(params: &[Tensor], opts: Vec<Optimizer>) -> R<OptState> {
        let mut m = Vec::new();
        let mut v = Vec::new();
        for (p, o) in params.iter().zip(&opts) {
            let z = || p.zeros_like().map_err(ce);
            let acc = || {
                p.ones_like()
                    .and_then(|t| t.affine(o.initial_accumulator, 0.0))
                    .map_err(ce)
            };
            // Adagrad's and FTRL's accumulator starts at `initial_accumulator`.
            let (has_m, has_v) = o.slots();
            let a = if has_m { Some(z()?) } else { None };
            let b = match (has_v, o.kind.as_str()) {
                (false, _) => None,
                (true, "adagrad" | "ftrl") => Some(acc()?),
                (true, _) => Some(z()?),
            };
            m.push(a);
            v.push(b);
        }
        let owned = vec![None; params.len()];
        Ok(OptState { opts, m, v, owned })
    }

    pub fn bytes(&self) -> f64 {
        self.m.iter().chain(&self.v).flatten().map(bytes).sum()
    }

    fn update(
        &mut self,
        step: usize,
        params: &mut [Tensor],
        grads: &[Tensor],
        scale: f64,
        masks: &[Option<Tensor>],
    ) -> R<()> {
        let t = step as i32;
        for i in 0..params.len() {
            // Another pipeline stage's parameter: not held here.
            if params[i].elem_count() == 0 {
                continue;
            }
            let o = &self.opts[i];
            let lr = o.lr.at(step - 1);
            // Under plain SGD and Adagrad a zero gradient leaves the row and its
            // slot exactly as they are, and a table's rows outside its mask have
            // a zero gradient: the mask changes nothing there, so the fused
            // step serves masked tables too.
            let zero_is_still = o.kind == "adagrad" || (o.kind == "sgd" && o.momentum == 0.0);
            let unmasked = masks.get(i).is_none_or(Option::is_none);
            if (zero_is_still || unmasked)
                && has_kernel(o, &params[i], self.m[i].as_ref(), self.v[i].as_ref())
            {
                // The parameter is written in place: make sure this state owns it.
                if self.owned.get(i).copied().flatten() != Some(params[i].id()) {
                    params[i] = params[i].copy().map_err(ce)?;
                    if let Some(o) = self.owned.get_mut(i) {
                        *o = Some(params[i].id());
                    }
                }
                fused_step(
                    o,
                    lr,
                    t,
                    &params[i],
                    &grads[i],
                    scale,
                    self.m[i].as_ref(),
                    self.v[i].as_ref(),
                )?;
                continue;
            }
            let before = (params[i].clone(), self.m[i].clone(), self.v[i].clone());
            let p = &params[i];
            // Large tensors are stepped in row blocks, so the optimizer's
            // temporaries stay small (the results are the same bits).
            let rows = p.dims().first().copied().unwrap_or(1);
            let blocks = (p.elem_count() >> 21).clamp(1, rows.max(1));
            let (np, nm, nv) = if blocks <= 1 {
                step_one(
                    o,
                    lr,
                    t,
                    p,
                    &grads[i],
                    scale,
                    self.m[i].as_ref(),
                    self.v[i].as_ref(),
                )?
            } else {
                let per = rows.div_ceil(blocks);
                let (mut ps, mut ms, mut vs) = (Vec::new(), Vec::new(), Vec::new());
                for start in (0..rows).step_by(per) {
                    let len = per.min(rows - start);
                    let cut = |x: &Tensor| x.narrow(0, start, len).map_err(ce);
                    let mc = self.m[i].as_ref().map(cut).transpose()?;
                    let vc = self.v[i].as_ref().map(cut).transpose()?;
                    let (a, b, c) = step_one(
                        o,
                        lr,
                        t,
                        &cut(p)?,
                        &cut(&grads[i])?,
                        scale,
                        mc.as_ref(),
                        vc.as_ref(),
                    )?;
                    ps.push(a);
                    ms.extend(b);
                    vs.extend(c);
                }
                let cat = |v: Vec<Tensor>| -> R<Option<Tensor>> {
                    if v.is_empty() {
                        Ok(None)
                    } else {
                        Tensor::cat(&v, 0).map(Some).map_err(ce)
                    }
                };
                (cat(ps)?.ok_or("no rows")?, cat(ms)?, cat(vs)?)
            };
            params[i] = np;
            self.m[i] = nm;
            self.v[i] = nv;
            // Rows outside the mask keep their values and optimizer slots.
            if let Some(mask) = masks.get(i).and_then(Option::as_ref) {
                let on = mask
                    .broadcast_as(params[i].shape())
                    .and_then(|m| m.ne(0.0))
                    .map_err(ce)?;
                let blend = |new: &Tensor, old: &Tensor| -> R<Tensor> {
                    on.where_cond(new, old).map_err(ce)
                };
                params[i] = blend(&params[i], &before.0)?;
                if let (Some(new), Some(old)) = (&self.m[i], &before.1) {
                    self.m[i] = Some(blend(new, old)?);
                }
                if let (Some(new), Some(old)) = (&self.v[i], &before.2) {
                    self.v[i] = Some(blend(new, old)?);
                }
            }
        }
        Ok(())
    }
}

/// Whether `fused_step` can step this parameter: an optimizer with a kernel,
/// its slots present, and plain contiguous f32/f64 CPU tensors.
fn has_kernel(o: &Optimizer, p: &Tensor, m: Option<&Tensor>, v: Option<&Tensor>) -> bool {
    let plain = |t: &Tensor| {
        t.device().is_cpu() && t.is_contiguous() && matches!(t.dtype(), DType::F32 | DType::F64)
    };
    let slots = match o.kind.as_str() {
        "adam" | "adamw" => m.is_some() && v.is_some(),
        "sgd" => true,
        "adagrad" => v.is_some(),
        _ => false,
    };
    slots && plain(p) && m.is_none_or(plain) && v.is_none_or(plain)
}

/// One optimizer step in place, for a parameter `has_kernel` accepts.
#[allow(clippy::too_many_arguments)]
fn fused_step(
    o: &Optimizer,
    lr: f64,
    t: i32,
    p: &Tensor,
    g: &Tensor,
    scale: f64,
    m: Option<&Tensor>,
    v: Option<&Tensor>,
) -> R<()> {
    use super::fused::Pass;
    let g = if g.is_contiguous() {
        g.clone()
    } else {
        g.contiguous().map_err(ce)?
    };
    let s = scale;
    match (o.kind.as_str(), m, v) {
        ("adam" | "adamw", Some(m), Some(v)) => {
            m.inplace_op2(
                &g,
                &Pass::Linear {
                    a: o.b1,
                    b: (1.0 - o.b1) * s,
                },
            )
            .map_err(ce)?;
            v.inplace_op2(
                &g,
                &Pass::Square {
                    a: o.b2,
                    b: (1.0 - o.b2) * s * s,
                },
            )
            .map_err(ce)?;
            let wd = if o.kind == "adamw" {
                o.weight_decay
            } else {
                0.0
            };
            let (c1, c2) = (1.0 - o.b1.powi(t), 1.0 - o.b2.powi(t));
            p.inplace_op3(
                m,
                v,
                &Pass::Adam {
                    lr,
                    c1,
                    c2,
                    eps: o.eps,
                    wd,
                },
            )
            .map_err(ce)?;
        }
        ("sgd", Some(m), _) => {
            m.inplace_op2(
                &g,
                &Pass::Linear {
                    a: o.momentum,
                    b: s,
                },
            )
            .map_err(ce)?;
            p.inplace_op3(
                m,
                &g,
                &Pass::Momentum {
                    lr,
                    s,
                    mu: o.momentum,
                    nesterov: o.nesterov,
                },
            )
            .map_err(ce)?;
        }
        ("sgd", None, _) => p.inplace_op2(&g, &Pass::Plain { lr, s }).map_err(ce)?,
        ("adagrad", _, Some(v)) => {
            v.inplace_op2(&g, &Pass::Square { a: 1.0, b: s * s })
                .map_err(ce)?;
            p.inplace_op3(&g, v, &Pass::Adagrad { lr, s, eps: o.eps })
                .map_err(ce)?;
        }
        // `has_kernel` admits only the optimizers above.
        _ => return Err(format!("no fused step for `{}`", o.kind)),
    }
    Ok(())
}

/// One optimizer step on one tensor (or a block of its rows): the new value and
/// slots. Elementwise, so a tensor stepped in row blocks gets the same bits.
#[allow(clippy::too_many_arguments)]
fn step_one(
    o: &Optimizer,
    lr: f64,
    t: i32,
    p: &Tensor,
    g: &Tensor,
    scale: f64,
    m: Option<&Tensor>,
    v: Option<&Tensor>,
) -> R<(Tensor, Option<Tensor>, Option<Tensor>)> {
    let g = (g * scale).map_err(ce)?;
    let (mut m_out, mut v_out) = (m.cloned(), v.cloned());
    let d = match (o.kind.as_str(), m, v) {
        ("sgd", Some(m), _) => {
            let m = (m.affine(o.momentum, 0.0).map_err(ce)? + &g).map_err(ce)?;
            m_out = Some(m.clone());
            if o.nesterov {
                (&g + m.affine(o.momentum, 0.0).map_err(ce)?).map_err(ce)?
            } else {
                m
            }
        }
        ("ftrl", Some(lin), Some(acc)) => {
            // FTRL-proximal (TensorFlow's ApplyFtrl): the new weight is
            // computed, not stepped; `d` is what reaches it at this lr.
            let acc_new = (acc + g.sqr().map_err(ce)?).map_err(ce)?;
            let pw = |t: &Tensor| t.powf(-o.lr_power).map_err(ce);
            let sigma = ((pw(&acc_new)? - pw(acc)?).map_err(ce)? / lr).map_err(ce)?;
            let lin = ((lin + &g).map_err(ce)? - sigma.mul(p).map_err(ce)?).map_err(ce)?;
            let quad = (pw(&acc_new)? / lr)
                .and_then(|t| t.affine(1.0, 2.0 * o.l2))
                .map_err(ce)?;
            let shrunk = lin
                .sign()
                .and_then(|sg| sg.affine(o.l1, 0.0))
                .and_then(|t| t - &lin)
                .and_then(|t| t.div(&quad))
                .map_err(ce)?;
            let keep = lin.abs().and_then(|a| a.gt(o.l1)).map_err(ce)?;
            let w = keep
                .where_cond(&shrunk, &shrunk.zeros_like().map_err(ce)?)
                .map_err(ce)?;
            m_out = Some(lin);
            v_out = Some(acc_new);
            // p - lr·d = w
            ((p - w).map_err(ce)? / lr).map_err(ce)?
        }
        ("adagrad", _, Some(v)) => {
            let v = (v + g.sqr().map_err(ce)?).map_err(ce)?;
            let d = g
                .div(&v.sqrt().and_then(|s| s.affine(1.0, o.eps)).map_err(ce)?)
                .map_err(ce)?;
            v_out = Some(v);
            d
        }
        ("adam" | "adamw", Some(m), Some(v)) => {
            // As optax: bias-corrected moments, eps outside the square root.
            let m = (m.affine(o.b1, 0.0).map_err(ce)? + g.affine(1.0 - o.b1, 0.0).map_err(ce)?)
                .map_err(ce)?;
            let v = (v.affine(o.b2, 0.0).map_err(ce)?
                + g.sqr()
                    .and_then(|s| s.affine(1.0 - o.b2, 0.0))
                    .map_err(ce)?)
            .map_err(ce)?;
            let mh = m.affine(1.0 / (1.0 - o.b1.powi(t)), 0.0).map_err(ce)?;
            let vh = v.affine(1.0 / (1.0 - o.b2.powi(t)), 0.0).map_err(ce)?;
            let mut d = mh
                .div(&vh.sqrt().and_then(|s| s.affine(1.0, o.eps)).map_err(ce)?)
                .map_err(ce)?;
            if o.kind == "adamw" {
                d = (d + p.affine(o.weight_decay, 0.0).map_err(ce)?).map_err(ce)?;
            }
            m_out = Some(m);
            v_out = Some(v);
            d
        }
        _ => g,
    };
    let p_new = (p - d.affine(lr, 0.0).map_err(ce)?).map_err(ce)?;
    Ok((p_new, m_out, v_out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fused in-place steps equal the composed ones (forced by an all-ones
    /// mask, which takes the composed path, in row blocks for the large tensor)
    /// for every optimizer that has a kernel, over several steps with clipping (to
    /// rounding: the kernels fold constants in another order).
    #[test]
    fn fused_steps_equal_composed_steps() {
        let dev = Device::Cpu;
        let opt = |kind: &str, f: &dyn Fn(&mut Optimizer)| {
            let mut o = default_optimizer();
            o.kind = kind.into();
            o.lr = Schedule::WarmupCosine {
                init: 0.0,
                peak: 0.05,
                warmup: 1,
                decay: 4,
                end: 0.001,
            };
            f(&mut o);
            o
        };
        let cases = [
            opt("adam", &|_| {}),
            opt("adamw", &|o| o.weight_decay = 0.1),
            opt("sgd", &|_| {}),
            opt("sgd", &|o| o.momentum = 0.9),
            opt("sgd", &|o| {
                o.momentum = 0.9;
                o.nesterov = true
            }),
            opt("adagrad", &|_| {}),
        ];
        for dims in [vec![3usize, 5], vec![2049, 1025]] {
            for o in &cases {
                let n: usize = dims.iter().product();
                let wave = |k: f64| -> Vec<f64> {
                    (0..n).map(|i| ((i as f64 + k) * 0.37).sin()).collect()
                };
                let p0 = Tensor::from_vec(wave(0.0), dims.as_slice(), &dev).expect("p");
                let mut fused =
                    OptState::new(std::slice::from_ref(&p0), vec![o.clone()]).expect("state");
                let mut composed =
                    OptState::new(std::slice::from_ref(&p0), vec![o.clone()]).expect("state");
                let (mut pf, mut pc) = (vec![p0.clone()], vec![p0.copy().expect("copy")]);
                let ones = Tensor::ones((dims[0], 1), DType::F64, &dev).expect("mask");
                for step in 1..=4 {
                    let g = Tensor::from_vec(wave(step as f64 * 11.0), dims.as_slice(), &dev)
                        .expect("g");
                    let scale = if step == 2 { 0.5 } else { 1.0 };
                    fused
                        .update(step, &mut pf, std::slice::from_ref(&g), scale, &[None])
                        .expect("fused");
                    composed
                        .update(
                            step,
                            &mut pc,
                            std::slice::from_ref(&g),
                            scale,
                            &[Some(ones.clone())],
                        )
                        .expect("composed");
                }
                let flat = |t: &Tensor| {
                    t.flatten_all()
                        .and_then(|t| t.to_vec1::<f64>())
                        .expect("values")
                };
                let (a, b) = (flat(&pf[0]), flat(&pc[0]));
                let worst = a
                    .iter()
                    .zip(&b)
                    .map(|(x, y)| (x - y).abs() / (1e-9 + y.abs()))
                    .fold(0.0, f64::max);
                assert!(
                    worst < 1e-9,
                    "{} {dims:?}: fused and composed differ by {worst:e} (relative)",
                    o.kind
                );
                // The parameter moved, and the caller's tensor was not written.
                assert!(
                    a.iter().zip(&flat(&p0)).any(|(x, y)| x != y),
                    "{} did not step",
                    o.kind
                );
                assert_eq!(
                    flat(&p0),
                    wave(0.0),
                    "{}: the initial tensor was written in place",
                    o.kind
                );
                for (sf, sc) in fused
                    .m
                    .iter()
                    .chain(&fused.v)
                    .zip(composed.m.iter().chain(&composed.v))
                {
                    if let (Some(x), Some(y)) = (sf, sc) {
                        let (x, y) = (flat(x), flat(y));
                        let worst = x
                            .iter()
                            .zip(&y)
                            .map(|(x, y)| (x - y).abs() / (1e-9 + y.abs()))
                            .fold(0.0, f64::max);
                        assert!(worst < 1e-9, "{}: slots differ by {worst:e}", o.kind);
                    }
                }
            }
        }
    }
}
