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

pub use build::build;
pub use optimizer::{OptKind, Optimizer, Schedule};

use crate::embed::{Combiner, Overflow};
use crate::init::Init;
use crate::source::Span;
use std::path::PathBuf;

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
    pub const NAMES: &'static [&'static str] = &["softmax_cross_entropy", "mse"];
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
}

impl Train {
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
