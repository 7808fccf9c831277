//! A run's configuration: the typed training specification of the chosen
//! `train`, with what the command line and a resumed checkpoint add (steps,
//! seed, dtype, initial values), the embedding tables' SparseCore settings, and
//! the data source. Built from the lowered program and the spec alone: the
//! runtime never reads the syntax tree. Where a run keeps each `train` and
//! `table` option ([`change`], [`table_change`]) is what live reload compares,
//! by each option's registry declaration (`crate::vocab`).

use super::data::{Source, Targets};
use super::sparse::{Fdo, LookupRun, SparseConfig, TableRun};
use crate::embed::{Layout, Partitioner, TableInfo};
use crate::spec::{self, Loss, Optimizer, Precision, Spec};
use crate::spmd::{Op, Program};
use crate::vocab::{TableOption, TrainOption};
use candle_core::DType;
use std::collections::HashMap;

#[derive(Clone, Debug)]
pub struct Config {
    pub steps: usize,
    pub loss: Loss,
    /// Cross-entropy's `ignore_index` (see `spec::Train::loss_ignore`).
    pub loss_ignore: Option<i64>,
    /// Metrics computed each step (their losses checked by the spec).
    pub metrics: Vec<spec::Metric>,
    pub seed: u64,
    /// Global examples per step.
    pub batch: usize,
    pub optimizer: Optimizer,
    pub clip: Option<f64>,
    /// Microbatches per step; gradients are averaged over them (`batch` is the total).
    pub accumulate: usize,
    pub dtype: DType,
    /// Mixed precision: the 16-bit type the passes compute in, with master
    /// weights, gradients and optimizer state in `dtype` (`None`: all `dtype`).
    pub compute: Option<DType>,
    /// Initial values for some parameters (global arrays), instead of their initializers.
    pub init: HashMap<String, Vec<f64>>,
    /// Gather the parameters after the last step ([`super::train::RunOutput::last`]):
    /// `shardc run` saves them in the run directory's `final/`.
    pub keep_final: bool,
    /// Optimizers of particular parameters (embedding tables have their own).
    pub per_param: HashMap<String, Optimizer>,
    pub eval: Option<spec::Eval>,
    pub checkpoint: Option<spec::Checkpoint>,
    /// Steps already done (a resumed run starts after them).
    pub start_step: usize,
    /// The run series its checkpoints belong to (a resumed run keeps its
    /// checkpoint's); empty: a fresh series is drawn when the run starts.
    pub run: String,
    /// Optimizer slots to start from (`opt_m/NAME`, `opt_v/NAME`, global arrays).
    pub init_opt: HashMap<String, Vec<f64>>,
    /// Embedding tables' SparseCore input processing and FDO.
    pub sparse: SparseConfig,
    /// The source the `train` names (`None`: synthetic data); what a run
    /// reads is its [`source`].
    pub data: Option<spec::Data>,
    /// Steps between logged lines.
    pub log_every: usize,
    /// Where the per-step records go (`log:`, or `shardc run --log`).
    pub log: Vec<crate::vocab::LogSink>,
    /// The embedding tables as declared.
    pub tables: Vec<spec::Table>,
    /// Where every device of this process computes (`--device`): the CPU, or
    /// one GPU that all of them share.
    pub device: candle_core::Device,
}

impl Config {
    /// The configuration a `train` specifies for its lowered program.
    pub fn new(t: &spec::Train, spec: &Spec, prog: &Program) -> Config {
        Config {
            steps: t.steps,
            loss: t.loss,
            loss_ignore: t.loss_ignore,
            metrics: t.metrics.clone(),
            seed: t.seed,
            batch: t.batch.unwrap_or(1).max(1),
            optimizer: t.optimizer.clone(),
            accumulate: t.accumulate.max(1),
            clip: t.clip,
            dtype: DType::F32,
            compute: match t.precision {
                Precision::F32 => None,
                Precision::BF16 => Some(DType::BF16),
                Precision::F16 => Some(DType::F16),
            },
            init: Default::default(),
            keep_final: false,
            per_param: spec
                .tables
                .iter()
                .filter_map(|tb| {
                    tb.optimizer
                        .clone()
                        .map(|o| (format!("tables.{}", tb.name), o))
                })
                .collect(),
            checkpoint: t.checkpoint.clone(),
            start_step: 0,
            run: String::new(),
            init_opt: Default::default(),
            sparse: sparse_config(spec, prog, t),
            eval: t.eval,
            data: t.data.clone(),
            log_every: t.log_every,
            log: t.log.clone(),
            device: candle_core::Device::Cpu,
            tables: spec.tables.clone(),
        }
    }

    /// Put the output directories the model file names (relative ones: a
    /// checkpoint's, FDO's) under the run directory. The access policy already
    /// refused relative paths that climb out and absolute ones not granted.
    pub fn place(&mut self, run_dir: &std::path::Path) {
        if let Some(c) = &mut self.checkpoint {
            if c.dir.is_relative() {
                c.dir = run_dir.join(&c.dir);
            }
        }
        if let Some(f) = &mut self.sparse.fdo {
            if f.dir.is_relative() {
                f.dir = run_dir.join(&f.dir);
            }
        }
    }

    /// The dtype forward and backward compute in: mixed precision's 16-bit
    /// type, unless the run checks numerics in f64.
    pub fn compute_dtype(&self) -> DType {
        match self.compute {
            Some(c) if self.dtype != DType::F64 => c,
            _ => self.dtype,
        }
    }

    /// The optimizer of the parameter `name`: its own (an embedding table's) or
    /// the run's.
    pub fn optimizer_for(&self, name: &str) -> &Optimizer {
        self.per_param.get(name).unwrap_or(&self.optimizer)
    }

    /// The optimizer that steps `p`: none for a frozen parameter.
    pub fn optimizer_of(&self, p: &crate::spmd::Param) -> Optimizer {
        if p.frozen {
            Optimizer::frozen()
        } else {
            self.optimizer_for(&p.name).clone()
        }
    }
}

/// The data source a `train` names (or what the data stage loaded for it from a
/// file, or `--data`), or synthetic data for the targets `prog`'s loss trains
/// against (classes: the output's last dimension) when it names none. A file
/// source the data stage did not load is an error (it has a diagnostic):
/// never a silent fallback.
pub fn source(
    t: &spec::Train,
    prog: &crate::spmd::Program,
    loaded: Option<&crate::data::Loaded>,
) -> Result<Source, String> {
    match loaded {
        Some(crate::data::Loaded::Arrays(a)) => return Ok(Source::Arrays(a.clone())),
        Some(crate::data::Loaded::Stream(s)) => return Ok(Source::Stream(s.clone())),
        Some(crate::data::Loaded::Pending(p)) => return Ok(Source::Pending(p.clone())),
        Some(crate::data::Loaded::Text { ids, seq }) => {
            return Ok(Source::Tokens {
                ids: ids.clone(),
                seq: *seq,
            })
        }
        None => {}
    }
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
    let targets = match t.loss {
        Loss::SoftmaxCrossEntropy => Targets::Classes,
        Loss::Mse => Targets::Normal,
        Loss::SigmoidBinaryCrossEntropy => Targets::Binary,
        Loss::Function => match prog.targets(t.loss) {
            Some(x) if x.classes => Targets::Classes,
            _ => Targets::Normal,
        },
    };
    Ok(match &t.data {
        Some(spec::Data::ShakespeareWords { vocab, seq, .. }) => Source::Tokens {
            ids: crate::data::shakespeare_words(vocab.unwrap_or(classes)),
            seq: *seq,
        },
        Some(spec::Data::ShakespeareChars { seq }) => Source::Tokens {
            ids: crate::data::shakespeare_chars(),
            seq: *seq,
        },
        Some(spec::Data::Synthetic {
            classes: c, vocab, ..
        }) => Source::Synthetic {
            classes: c.unwrap_or(classes),
            vocab: *vocab,
            targets,
        },
        Some(spec::Data::Clicks { vocab, .. }) => Source::Clicks { vocab: *vocab },
        Some(
            d @ (spec::Data::Text { .. } | spec::Data::Arrays { .. } | spec::Data::Tokens { .. }),
        ) => return Err(format!("the `{}` data could not be loaded", d.name())),
        None => Source::Synthetic {
            classes,
            vocab: None,
            targets,
        },
    })
}

/// How an option differs between two runs' settings: the old and new value
/// as the reload log shows them, and for an optimizer the hyperparameters
/// that changed (`lr 1e-2 → 1e-3`).
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub was: String,
    pub now: String,
    pub more: Vec<String>,
}

/// `Some` when `a` and `b` differ, each shown by `show`.
fn moved<T: PartialEq>(a: &T, b: &T, show: impl Fn(&T) -> String) -> Option<Change> {
    (a != b).then(|| Change {
        was: show(a),
        now: show(b),
        more: Vec::new(),
    })
}

fn optional<T: ToString>(v: &Option<T>) -> String {
    v.as_ref().map_or("none".to_string(), T::to_string)
}

/// How the `train` option `o` differs between the settings `a` and `b`
/// (`None`: it does not).
pub fn change(o: TrainOption, a: &Config, b: &Config) -> Option<Change> {
    let shown = |x: &dyn std::fmt::Display| x.to_string();
    match o {
        TrainOption::Data => {
            let same = match (&a.data, &b.data) {
                (Some(x), Some(y)) => x.same_source(y),
                (x, y) => x.is_none() && y.is_none(),
            };
            let name = |d: &Option<spec::Data>| d.as_ref().map_or("synthetic", |d| d.name());
            (!same).then(|| Change {
                was: name(&a.data).into(),
                now: name(&b.data).into(),
                more: Vec::new(),
            })
        }
        TrainOption::Batch => moved(&a.batch, &b.batch, |x| shown(x)),
        TrainOption::Steps => moved(&a.steps, &b.steps, |x| shown(x)),
        TrainOption::Loss => moved(
            &(a.loss, a.loss_ignore),
            &(b.loss, b.loss_ignore),
            |(l, i)| match i {
                Some(i) => format!("{}(ignore_index: {i})", l.name()),
                None => l.name().into(),
            },
        ),
        TrainOption::Metrics => moved(&a.metrics, &b.metrics, |m| {
            let names: Vec<&str> = m.iter().map(|m| m.name()).collect();
            format!("[{}]", names.join(", "))
        }),
        TrainOption::Optimizer => optimizer_change(&a.optimizer, &b.optimizer),
        TrainOption::LogEvery => moved(&a.log_every, &b.log_every, |x| shown(x)),
        TrainOption::Log => moved(&a.log, &b.log, |l| {
            let names: Vec<&str> = l.iter().map(|s| s.name()).collect();
            format!("[{}]", names.join(", "))
        }),
        TrainOption::Seed => moved(&a.seed, &b.seed, |x| shown(x)),
        TrainOption::ClipGradNorm => moved(&a.clip, &b.clip, optional),
        TrainOption::Accumulate => moved(&a.accumulate, &b.accumulate, |x| shown(x)),
        TrainOption::Eval => moved(&a.eval, &b.eval, |e| {
            e.map_or("none".into(), |e| {
                format!("every {} for {}", e.every, e.steps)
            })
        }),
        TrainOption::Checkpoint => moved(&a.checkpoint, &b.checkpoint, |c| {
            c.as_ref().map_or("none".into(), |c| {
                format!("every {} in {}", c.every, c.dir.display())
            })
        }),
        TrainOption::Fdo => moved(&a.sparse.fdo, &b.sparse.fdo, |f| {
            f.as_ref().map_or("none".into(), |f| {
                format!("every {} in {}", f.every, f.dir.display())
            })
        }),
        TrainOption::Precision => moved(&a.compute, &b.compute, |c| {
            c.map_or("f32".into(), |d| format!("{d:?}").to_lowercase())
        }),
    }
}

fn optimizer_change(a: &Optimizer, b: &Optimizer) -> Option<Change> {
    (a != b).then(|| Change {
        was: a.name().into(),
        now: b.name().into(),
        more: b.changes_from(a),
    })
}

/// How the `table` option `o` of a table differs between two declarations
/// of it (`None`: it does not).
pub fn table_change(o: TableOption, a: &spec::Table, b: &spec::Table) -> Option<Change> {
    let limit = |x: &Option<i64>| optional(x);
    match o {
        TableOption::Vocab => moved(&a.vocab, &b.vocab, limit),
        TableOption::Dim => moved(&a.dim, &b.dim, limit),
        TableOption::Init => moved(&a.init, &b.init, |i| format!("{i:?}")),
        TableOption::Combiner => moved(&a.combiner, &b.combiner, |c| c.name().into()),
        TableOption::Optimizer => {
            let run = Optimizer::default();
            let (x, y) = (
                a.optimizer.as_ref().unwrap_or(&run),
                b.optimizer.as_ref().unwrap_or(&run),
            );
            match (&a.optimizer, &b.optimizer) {
                (Some(_), Some(_)) => optimizer_change(x, y),
                // Its own optimizer given or taken away: the run's steps it.
                _ => moved(&a.optimizer, &b.optimizer, |o| {
                    o.as_ref().map_or("the run's".into(), |o| o.name().into())
                }),
            }
        }
        TableOption::Frozen => moved(&a.frozen, &b.frozen, |x| x.to_string()),
        TableOption::MaxIds => moved(&a.max_ids, &b.max_ids, limit),
        TableOption::MaxUniqueIds => moved(&a.max_unique_ids, &b.max_unique_ids, limit),
        TableOption::StackMaxIds => moved(&a.stack_max_ids, &b.stack_max_ids, limit),
        TableOption::StackMaxUniqueIds => {
            moved(&a.stack_max_unique_ids, &b.stack_max_unique_ids, limit)
        }
        TableOption::SuggestedBufferSize => moved(&a.suggested_buffer, &b.suggested_buffer, limit),
        TableOption::Overflow => moved(&a.overflow, &b.overflow, |x| format!("{x:?}")),
        TableOption::Shard => moved(&a.axis, &b.axis, |x| {
            x.as_ref().map_or("none".into(), |a| format!("rows({a})"))
        }),
    }
}

/// The tables a program looks up, with their SparseCore placement, limits and
/// overflow policy, the lookups whose ids are model inputs, and `fdo`.
fn sparse_config(spec: &Spec, prog: &Program, t: &spec::Train) -> SparseConfig {
    let sparsecores = t.sparsecores.max(1);
    let infos: Vec<TableInfo> = spec
        .tables
        .iter()
        .map(|tb| TableInfo {
            name: tb.name.clone(),
            vocab: tb.vocab.unwrap_or(1).max(1) as usize,
            dim: tb.dim.unwrap_or(1).max(1) as usize,
            optimizer: tb
                .optimizer
                .as_ref()
                .map_or(String::new(), |o| o.name().to_string()),
            combiner: tb.combiner.name().to_string(),
            activation_bytes: 0.0,
        })
        .collect();
    let mesh_size = |a: &str| prog.mesh.iter().find(|m| m.0 == a).map_or(1, |m| m.1);
    let mut tables = Vec::new();
    for tb in &spec.tables {
        let devices = tb.axis.as_deref().map_or(1, mesh_size).max(1) as usize;
        let n = devices * sparsecores;
        let stacks = crate::embed::stack(&infos, n, sparsecores, None);
        let stack = stacks
            .iter()
            .find(|s| s.tables.iter().any(|x| x.name == tb.name))
            .map_or(tb.name.clone(), |s| s.name.clone());
        let shift = stacks
            .iter()
            .flat_map(|s| &s.tables)
            .find(|x| x.name == tb.name)
            .map_or(0, |x| x.shard_rotation);
        tables.push(TableRun {
            name: tb.name.clone(),
            stack,
            layout: Layout {
                devices,
                sparsecores,
            },
            part: Partitioner { n, shift },
            // SparseCore's own defaults when a table leaves its limits out.
            limits: crate::embed::table_limits(tb.max_ids, tb.max_unique_ids),
            policy: tb.overflow,
            stack_limits: (tb.stack_max_ids, tb.stack_max_unique_ids),
        });
    }
    let mut lookups = Vec::new();
    for (i, node) in prog.nodes.iter().enumerate() {
        let Some(table_name) = node.op.lookup_table() else {
            continue;
        };
        let Some(table) = tables.iter().position(|x| x.name == table_name) else {
            continue;
        };
        // The ids, through layout changes, must be a model input.
        let mut id = node.args.get(1).copied();
        while let Some(k) = id {
            if prog.nodes[k as usize].op.is_reshard() {
                id = prog.nodes[k as usize].args.first().copied();
            } else {
                break;
            }
        }
        let Some(Op::Input(input)) = id.map(|k| &prog.nodes[k as usize].op) else {
            continue;
        };
        let size = |ty: &crate::types::TType| -> usize {
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
    let fdo = t.fdo.as_ref().map(|f| Fdo {
        every: f.every,
        dir: f.dir.clone(),
        headroom: f.headroom,
    });
    SparseConfig {
        tables,
        lookups,
        fdo,
        sparsecores,
    }
}
