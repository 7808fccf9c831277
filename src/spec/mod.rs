//! Stage 3: the typed training specification. Every `train` declaration and
//! every embedding table becomes, once, a typed value with each setting read,
//! checked (with diagnostics) and its constants evaluated: the batch, steps,
//! accumulation, loss, optimizer and learning-rate schedule, clipping, eval,
//! checkpoints, the data source, logging, FDO, and each table's size,
//! initializer, combiner, optimizer, limits and placement. The checker, the
//! data stage, the plan, the runtime and the command line all read these
//! values; none of them reads `train` or `table` options from the syntax tree.

mod build;
mod optimizer;

pub use build::{build, DATA, TABLE_FIELDS, TRAIN_FIELDS};
pub use optimizer::{OptKind, Optimizer, Schedule};

use crate::embed::{Combiner, Overflow};
use crate::init::Init;
use crate::source::Span;
use std::path::PathBuf;

/// The float precision a `train` computes in (`precision: bf16`): mixed
/// precision keeps f32 master weights, gradients and optimizer state, and
/// computes the forward and backward passes (parameters' working copies,
/// activations, their collectives) in the 16-bit type, with softmax, norms,
/// reductions and losses accumulated in f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    #[default]
    F32,
    BF16,
    F16,
}

impl Precision {
    const ALL: &'static [(&'static str, Precision)] = &[
        ("f32", Precision::F32),
        ("bf16", Precision::BF16),
        ("f16", Precision::F16),
    ];
    pub const NAMES: &'static [&'static str] = &["f32", "bf16", "f16"];
    pub fn from_name(name: &str) -> Option<Precision> {
        Precision::ALL
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, p)| *p)
    }
    pub fn name(self) -> &'static str {
        Precision::ALL
            .iter()
            .find(|(_, p)| *p == self)
            .map_or("f32", |(n, _)| n)
    }
    /// The 16-bit compute type of mixed precision (`None`: all f32).
    pub fn compute(self) -> Option<crate::ast::DType> {
        match self {
            Precision::F32 => None,
            Precision::BF16 => Some(crate::ast::DType::BF16),
            Precision::F16 => Some(crate::ast::DType::F16),
        }
    }
}

/// What the model's output is trained against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Loss {
    /// Class ids against logits (the last dimension, possibly split over devices).
    #[default]
    SoftmaxCrossEntropy,
    /// Targets shaped like the output: the mean over every element of (out − y)².
    Mse,
    /// 0/1 targets shaped like the output, the output a logit: the mean over
    /// every element of softplus(z) − y·z (numerically stable).
    SigmoidBinaryCrossEntropy,
    /// A `fn` of the model (named by [`Train::loss_fn`]) of the output and the
    /// targets, returning a float scalar: the targets are its second
    /// parameter's type (class ids when integer, values when float).
    Function,
}

impl Loss {
    const ALL: &'static [(&'static str, Loss)] = &[
        ("softmax_cross_entropy", Loss::SoftmaxCrossEntropy),
        ("mse", Loss::Mse),
        (
            "sigmoid_binary_cross_entropy",
            Loss::SigmoidBinaryCrossEntropy,
        ),
    ];
    pub const NAMES: &'static [&'static str] = &[
        "softmax_cross_entropy",
        "mse",
        "sigmoid_binary_cross_entropy",
    ];
    pub fn from_name(name: &str) -> Option<Loss> {
        Loss::ALL.iter().find(|(n, _)| *n == name).map(|(_, l)| *l)
    }
    /// The built-in loss's name (`fn` for a loss function of the model: see
    /// [`Train::loss_name`]).
    pub fn name(self) -> &'static str {
        Loss::ALL
            .iter()
            .find(|(_, l)| *l == self)
            .map_or("fn", |(n, _)| n)
    }
}

/// A figure computed from each step's outputs and targets, logged beside the
/// loss (progress line and `metrics.jsonl`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// The share of predictions that are right: the target class has the
    /// largest logit (softmax cross-entropy), or the logit's sign is the 0/1
    /// target's (sigmoid binary cross-entropy).
    Accuracy,
    /// Area under the ROC curve of a binary output (sigmoid binary
    /// cross-entropy), from the step's scores binned into [`AUC_BINS`] bins
    /// of the predicted probability.
    Auc,
}

/// Bins of the predicted probability that AUC is computed from.
pub const AUC_BINS: usize = 1000;

impl Metric {
    pub const NAMES: &'static [&'static str] = &["accuracy", "auc"];
    pub fn from_name(name: &str) -> Option<Metric> {
        match name {
            "accuracy" => Some(Metric::Accuracy),
            "auc" => Some(Metric::Auc),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Metric::Accuracy => "accuracy",
            Metric::Auc => "auc",
        }
    }
    /// Whether the metric is defined for `loss`.
    pub fn fits(self, loss: Loss) -> bool {
        match self {
            Metric::Accuracy => matches!(
                loss,
                Loss::SoftmaxCrossEntropy | Loss::SigmoidBinaryCrossEntropy
            ),
            Metric::Auc => loss == Loss::SigmoidBinaryCrossEntropy,
        }
    }
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
    /// The source's name, as written.
    pub fn name(&self) -> &'static str {
        match self {
            Data::ShakespeareWords { .. } => "shakespeare_words",
            Data::ShakespeareChars { .. } => "shakespeare_chars",
            Data::Text { .. } => "text",
            Data::Arrays { .. } => "arrays",
            Data::Synthetic { .. } => "synthetic",
            Data::Clicks { .. } => "clicks",
        }
    }
    /// Token ids as labels (not usable with `loss: mse`).
    pub fn is_tokens(&self) -> bool {
        matches!(
            self,
            Data::ShakespeareWords { .. } | Data::ShakespeareChars { .. } | Data::Text { .. }
        )
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
    pub loss: Loss,
    pub loss_span: Option<Span>,
    /// `loss: NAME` naming a `fn` of the model ([`Loss::Function`]).
    pub loss_fn: Option<String>,
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
