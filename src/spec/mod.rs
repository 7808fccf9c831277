//! The typed training specification. Every `train` declaration and
//! every embedding table becomes, once, a typed value with each setting read,
//! checked (with diagnostics) and its constants evaluated: the batch, steps,
//! accumulation, loss, optimizer and learning-rate schedule, clipping, eval,
//! checkpoints, the data source, logging, FDO, and each table's size,
//! initializer, combiner, optimizer, limits and placement. The checker, the
//! data stage, the plan, the runtime and the command line all read these
//! values; none of them reads `train` or `table` options from the syntax tree.
//! The words these values are named by (options, optimizers, schedules, data
//! sources, losses, metrics, precisions) are the registry's, [`crate::vocab`].

mod build;
mod optimizer;
mod table;
mod train;

pub use crate::vocab::{Loss, Metric, Precision};
pub use build::build;
pub use optimizer::{default_lr, Groups, OptKind, Optimizer, Schedule};

use crate::embed::{Combiner, Overflow};
use crate::init::Init;
use crate::source::Span;
use crate::vocab::DataSource;
use std::path::PathBuf;

impl Precision {
    /// The 16-bit compute type of mixed precision (`None`: all f32).
    pub fn compute(self) -> Option<crate::ast::DType> {
        match self {
            Precision::F32 => None,
            Precision::BF16 => Some(crate::ast::DType::BF16),
            Precision::F16 => Some(crate::ast::DType::F16),
        }
    }
}

/// Bins of the predicted probability that AUC is computed from.
pub const AUC_BINS: usize = 1000;

impl Metric {
    /// How many sums one step contributes (summed over devices and
    /// microbatches before [`Metric::value`]).
    pub fn sums(self) -> usize {
        match self {
            Metric::Accuracy => 2,
            Metric::Auc => 2 * AUC_BINS,
        }
    }
    /// The metric from its sums: accuracy = right / all; AUC from the positive
    /// and negative counts per probability bin (pairs within a bin count half).
    pub fn value(self, sums: &[f64]) -> f64 {
        match self {
            Metric::Accuracy => {
                sums.first().copied().unwrap_or(0.0) / sums.get(1).copied().unwrap_or(0.0).max(1.0)
            }
            Metric::Auc => {
                let (pos, neg) = sums.split_at(sums.len() / 2);
                let (mut below, mut area) = (0.0, 0.0);
                for (p, n) in pos.iter().zip(neg) {
                    area += p * (below + 0.5 * n);
                    below += n;
                }
                let total: f64 = pos.iter().sum::<f64>() * below;
                if total > 0.0 {
                    area / total
                } else {
                    f64::NAN
                }
            }
        }
    }
}

/// Where a run's examples come from.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// The built-in tiny Shakespeare as word ids (`vocab` defaults to the
    /// model's classes).
    ShakespeareWords {
        vocab: Option<usize>,
        vocab_span: Option<Span>,
        seq: usize,
    },
    /// The built-in text as characters.
    ShakespeareChars { seq: usize },
    /// A text file (relative to the `.shard` file), as word ids.
    Text {
        path: PathBuf,
        /// The path as written, and where.
        written: String,
        path_span: Span,
        seq: usize,
        vocab: Option<usize>,
        vocab_span: Option<Span>,
    },
    /// A flat stream of token ids (relative to the `.shard` file).
    Tokens {
        path: PathBuf,
        written: String,
        path_span: Span,
        /// The held-out stream, when not the tail of `path`.
        eval_path: Option<(PathBuf, String, Span)>,
        seq: usize,
        uint32: bool,
        sequential: bool,
        /// The fraction at the end held out (without `eval_path`).
        eval: f64,
        /// The column of a parquet or Arrow source, as written, and where.
        column: Option<(String, Span)>,
        /// A `tokenizer.json` (the path, as written, and where).
        tokenizer: Option<(PathBuf, String, Span)>,
    },
    /// Named arrays in a file or directory (relative to the `.shard` file).
    Arrays {
        path: PathBuf,
        written: String,
        path_span: Span,
    },
    /// Synthetic clicks: random inputs as `synthetic` gives them, a new batch
    /// every step, and a 0/1 target per example from a fixed seeded rule over
    /// the inputs (a linear score of the float inputs plus a per-id score of
    /// the ids, with noise), so that a model can learn it.
    Clicks {
        vocab: Option<usize>,
        vocab_span: Option<Span>,
    },
    /// Random inputs of the model's input types (ids below `vocab`); labels
    /// below `classes` (both default to the model's output classes).
    Synthetic {
        classes: Option<usize>,
        classes_span: Option<Span>,
        vocab: Option<usize>,
        vocab_span: Option<Span>,
    },
}

impl Data {
    /// Which source it is.
    pub fn kind(&self) -> DataSource {
        match self {
            Data::ShakespeareWords { .. } => DataSource::ShakespeareWords,
            Data::ShakespeareChars { .. } => DataSource::ShakespeareChars,
            Data::Text { .. } => DataSource::Text,
            Data::Tokens { .. } => DataSource::Tokens,
            Data::Arrays { .. } => DataSource::Arrays,
            Data::Synthetic { .. } => DataSource::Synthetic,
            Data::Clicks { .. } => DataSource::Clicks,
        }
    }
    /// The source's name, as written.
    pub fn name(&self) -> &'static str {
        self.kind().name()
    }
    /// Token ids as labels (not usable with `loss: mse`).
    pub fn is_tokens(&self) -> bool {
        self.kind().is_tokens()
    }
    /// Whether `other` reads the same examples (where the arguments are
    /// written is not compared).
    pub fn same_source(&self, other: &Data) -> bool {
        match self {
            Data::ShakespeareWords { vocab, seq, .. } => matches!(other,
                Data::ShakespeareWords { vocab: v, seq: s, .. } if (vocab, seq) == (v, s)),
            Data::ShakespeareChars { seq } => {
                matches!(other, Data::ShakespeareChars { seq: s } if seq == s)
            }
            Data::Text {
                path, seq, vocab, ..
            } => matches!(other,
                Data::Text { path: p, seq: s, vocab: v, .. } if (path, seq, vocab) == (p, s, v)),
            Data::Tokens {
                path,
                eval_path,
                seq,
                uint32,
                sequential,
                eval,
                column,
                tokenizer,
                ..
            } => matches!(other,
                Data::Tokens { path: p, eval_path: e, seq: s, uint32: u, sequential: q, eval: v, column: c, tokenizer: t, .. }
                    if (path, seq, uint32, sequential) == (p, s, u, q)
                        && eval.to_bits() == v.to_bits()
                        && eval_path.as_ref().map(|x| &x.0) == e.as_ref().map(|x| &x.0)
                        && column.as_ref().map(|x| &x.0) == c.as_ref().map(|x| &x.0)
                        && tokenizer.as_ref().map(|x| &x.0) == t.as_ref().map(|x| &x.0)),
            Data::Arrays { path, .. } => matches!(other, Data::Arrays { path: p, .. } if path == p),
            Data::Clicks { vocab, .. } => {
                matches!(other, Data::Clicks { vocab: v, .. } if vocab == v)
            }
            Data::Synthetic { classes, vocab, .. } => matches!(other,
                Data::Synthetic { classes: c, vocab: v, .. } if (classes, vocab) == (c, v)),
        }
    }
}

/// `eval: { every, steps }`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eval {
    pub every: usize,
    pub steps: usize,
}

/// The most steps one run takes (per-step bookkeeping is sized by it); longer
/// trainings resume from checkpoints.
pub const MAX_STEPS: usize = 10_000_000;
/// The most examples one step holds.
pub const MAX_BATCH: i64 = 1 << 31;

/// `checkpoint: { every, keep, dir }`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub every: usize,
    pub keep: usize,
    pub dir: PathBuf,
}

/// `fdo: { every, dir, headroom }`.
#[derive(Clone, Debug, PartialEq)]
pub struct Fdo {
    pub every: usize,
    pub dir: PathBuf,
    pub headroom: f64,
}

/// One `train` declaration, typed.
#[derive(Clone, Debug, PartialEq)]
pub struct Train {
    pub model: String,
    pub model_span: Span,
    pub mesh: String,
    pub mesh_span: Span,
    /// `kind:` of the mesh (`virtual`, `cuda`, `mpi`).
    pub mesh_kind: String,
    /// SparseCores per device of the mesh.
    pub sparsecores: usize,
    pub span: Span,
    /// Global examples per step (`None`: missing or invalid, reported).
    pub batch: Option<usize>,
    pub batch_span: Option<Span>,
    pub steps: usize,
    /// Microbatches per step whose gradients are accumulated (`batch / accumulate` each).
    pub accumulate: usize,
    pub accumulate_span: Option<Span>,
    pub seed: u64,
    pub log_every: usize,
    /// `log:` where the per-step records go (default: every sink).
    pub log: Vec<crate::vocab::LogSink>,
    pub loss: Loss,
    pub loss_span: Option<Span>,
    /// `loss: NAME` naming a `fn` of the model ([`Loss::Function`]).
    pub loss_fn: Option<String>,
    /// `softmax_cross_entropy(ignore_index: N)`: targets equal to N count
    /// neither in the loss nor in its mean.
    pub loss_ignore: Option<i64>,
    /// `metrics: [accuracy, auc]`.
    pub metrics: Vec<Metric>,
    pub optimizer: Optimizer,
    pub clip: Option<f64>,
    pub eval: Option<Eval>,
    pub eval_span: Option<Span>,
    pub checkpoint: Option<Checkpoint>,
    /// Where the checkpoint's `dir` is written (the access policy's diagnostics).
    pub checkpoint_dir_span: Option<Span>,
    /// `None`: synthetic data (the default).
    pub data: Option<Data>,
    pub data_span: Option<Span>,
    pub fdo: Option<Fdo>,
    pub fdo_dir_span: Option<Span>,
    /// `precision:` (f32 unless mixed precision is asked for).
    pub precision: Precision,
}

impl Train {
    /// What `loss:` names: a built-in loss or the model's loss function.
    pub fn loss_name(&self) -> String {
        match (&self.loss_fn, self.loss) {
            (Some(f), Loss::Function) => f.clone(),
            (_, l) => l.name().to_string(),
        }
    }
    /// The batch each accumulated microbatch runs (what the model is checked for).
    pub fn micro_batch(&self) -> Option<usize> {
        self.batch.map(|b| b / self.accumulate.max(1))
    }
}

/// One embedding table, typed.
#[derive(Clone, Debug, PartialEq)]
pub struct Table {
    pub name: String,
    pub span: Span,
    pub vocab: Option<i64>,
    pub dim: Option<i64>,
    pub init: Init,
    pub combiner: Combiner,
    /// Its own optimizer (else the run's).
    pub optimizer: Option<Optimizer>,
    /// `frozen: true`: looked up, never updated (no optimizer state).
    pub frozen: bool,
    pub max_ids: Option<i64>,
    pub max_unique_ids: Option<i64>,
    /// `stack_max_ids_per_partition` / `stack_max_unique_ids_per_partition`: the
    /// limits of the stack this table joins when it is stacked with others (a
    /// table alone in its stack keeps its own limits, as in the library).
    pub stack_max_ids: Option<i64>,
    pub stack_max_unique_ids: Option<i64>,
    pub suggested_buffer: Option<i64>,
    pub overflow: Overflow,
    /// `shard: rows(axis)`.
    pub axis: Option<String>,
}

/// Everything a file declares for training.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Spec {
    pub trains: Vec<Train>,
    pub tables: Vec<Table>,
}

impl Spec {
    /// The `train` for `model` (the first when `None`).
    pub fn train(&self, model: Option<&str>) -> Option<&Train> {
        match model {
            Some(m) => self.trains.iter().find(|t| t.model == m),
            None => self.trains.first(),
        }
    }
    pub fn table(&self, name: &str) -> Option<&Table> {
        self.tables.iter().find(|t| t.name == name)
    }
}
