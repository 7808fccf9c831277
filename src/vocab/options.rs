//! The options of `train` and `table` declarations: their names, what each
//! means, which are required, and what live reload does with an edit of each
//! (`crate::runtime::reload` reads [`Reload`] instead of comparing fields by
//! hand). `crate::spec` reads each option through its tag; the runtime's
//! configuration says where each lives in a run (`runtime::config::change`),
//! both with exhaustive matches, so an option nobody wired does not compile.
//!
//! Adding a `train` option: one entry below, then the arms the compiler asks
//! for in `spec/build.rs` (reading it) and `runtime/config.rs` (where a run
//! keeps it, for reload).

use super::{vocabulary, Arg, Field, Omitted, Reload, Value};

const EVERY: Arg = Arg::new("every", Value::Count, Omitted::Required, "every N steps");
const DIR: Arg = Arg::new(
    "dir",
    Value::Path,
    Omitted::Required,
    "a directory inside the run directory",
);

vocabulary! {
    /// An option of a `train` declaration.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum TrainOption: Field in TRAIN_OPTIONS ("train") {
        Data {
            name: "data",
            doc: "data source, see **Data sources** below (default: `synthetic()`)",
            required: false,
            reload: Reload::Restart,
            args: &[],
        }
        Batch {
            name: "batch",
            doc: "global examples per step; split over the axes of the model input's first dim, which must divide it (E0303)",
            required: true,
            reload: Reload::Refused,
            args: &[],
        }
        Steps {
            name: "steps",
            doc: "optimizer steps",
            required: true,
            reload: Reload::Restart,
            args: &[],
        }
        Loss {
            name: "loss",
            doc: "a built-in loss (see **Losses** below, default `softmax_cross_entropy`) or a function of the model (see **Loss functions** below); applied to `forward`'s output, which must be reduced (E0214)",
            required: false,
            reload: Reload::Restart,
            args: &[],
        }
        Metrics {
            name: "metrics",
            doc: "a list of figures computed from each step's outputs and targets over the whole batch, printed on the progress line and written to `metrics.jsonl` as fields of the step's record (see **Metrics** below); a metric the loss does not define is E0308",
            required: false,
            reload: Reload::Restart,
            args: &[],
        }
        Optimizer {
            name: "optimizer",
            doc: "see **Optimizers** below",
            required: true,
            reload: Reload::Live,
            args: &[],
        }
        LogEvery {
            name: "log_every",
            doc: "log loss and tokens/s every N steps",
            required: false,
            reload: Reload::Restart,
            args: &[],
        }
        Log {
            name: "log",
            doc: "where the per-step records go: a list of `jsonl`, `tensorboard` (see **Logs** below; default: both); `shardc run --log` overrides it",
            required: false,
            reload: Reload::Restart,
            args: &[],
        }
        Seed {
            name: "seed",
            doc: "seed for initialization, data order and dropout (≥ 0); same seed, program and mesh give bit-identical losses",
            required: false,
            reload: Reload::Restart,
            args: &[],
        }
        ClipGradNorm {
            name: "clip_grad_norm",
            doc: "clip gradients to this global norm",
            required: false,
            reload: Reload::Live,
            args: &[],
        }
        Accumulate {
            name: "accumulate",
            doc: "split each batch into N microbatches and accumulate their gradients into one update",
            required: false,
            reload: Reload::Refused,
            args: &[],
        }
        Eval {
            name: "eval",
            doc: "every `every` steps, evaluate on `steps` held-out batches",
            required: false,
            reload: Reload::Restart,
            args: &[
                EVERY,
                Arg::new("steps", Value::Count, Omitted::Is(1.0), "held-out batches each time"),
            ],
        }
        Checkpoint {
            name: "checkpoint",
            doc: "every `every` steps write a checkpoint (safetensors and a manifest with a SHA-256 per tensor) to `dir` inside the run directory (`--out`; an absolute `dir` needs `--allow-path`, E0307), keeping the last `keep` of this run; `--resume` verifies it first; resumable, also onto another mesh",
            required: false,
            reload: Reload::Restart,
            args: &[
                EVERY,
                Arg::new("keep", Value::Count, Omitted::Is(1.0), "checkpoints kept"),
                DIR,
            ],
        }
        Fdo {
            name: "fdo",
            doc: "every `every` steps publish the tables' id statistics to `dir` and raise their limits from the merged maxima",
            required: false,
            reload: Reload::Refused,
            args: &[
                EVERY,
                DIR,
                Arg::new("headroom", Value::Positive, Omitted::Is(1.0), "the factor limits are raised by over the maxima"),
            ],
        }
        Precision {
            name: "precision",
            doc: "`f32` (the default), or mixed precision `bf16` / `f16`: see **Mixed precision** below",
            required: false,
            reload: Reload::Restart,
            args: &[],
        }
    }
}

vocabulary! {
    /// An option of a `table` declaration.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum TableOption: Field in TABLE_OPTIONS ("table") {
        Vocab {
            name: "vocab",
            doc: "rows",
            required: true,
            reload: Reload::Refused,
            args: &[],
        }
        Dim {
            name: "dim",
            doc: "width",
            required: true,
            reload: Reload::Refused,
            args: &[],
        }
        Init {
            name: "init",
            doc: "initializer, as for weights",
            required: false,
            reload: Reload::Restart,
            args: &[],
        }
        Combiner {
            name: "combiner",
            doc: "how the ids of one feature row are combined: `sum`, `mean` or `sqrtn` (E0400)",
            required: false,
            reload: Reload::Live,
            args: &[],
        }
        Optimizer {
            name: "optimizer",
            doc: "the table's own optimizer (else the run's): any of **Optimizers** below, `ftrl` included",
            required: false,
            reload: Reload::Live,
            args: &[],
        }
        Frozen {
            name: "frozen",
            doc: "`true`: looked up but never updated, no optimizer state (pretrained embeddings); with its own `optimizer` E0403",
            required: false,
            reload: Reload::Refused,
            args: &[],
        }
        MaxIds {
            name: "max_ids_per_partition",
            doc: "per-step limit of ids per partition (duplicates of one (sample, id) pair are merged before counting)",
            required: false,
            reload: Reload::Refused,
            args: &[],
        }
        MaxUniqueIds {
            name: "max_unique_ids_per_partition",
            doc: "per-step limit of distinct ids per partition; either limit may be the larger, the smaller binds first",
            required: false,
            reload: Reload::Refused,
            args: &[],
        }
        StackMaxIds {
            name: "stack_max_ids_per_partition",
            doc: "the limit of ids of the stack when this table is stacked with others (see Stacking below)",
            required: false,
            reload: Reload::Refused,
            args: &[],
        }
        StackMaxUniqueIds {
            name: "stack_max_unique_ids_per_partition",
            doc: "the limit of distinct ids of the stack when this table is stacked with others",
            required: false,
            reload: Reload::Refused,
            args: &[],
        }
        SuggestedBufferSize {
            name: "suggested_buffer_size",
            doc: "a per-partition buffer size to plan with",
            required: false,
            reload: Reload::Refused,
            args: &[],
        }
        Overflow {
            name: "overflow",
            doc: "beyond a limit: `error` (a diagnostic), `drop` (drop and count the ids) or `grow` (raise the limit and re-plan)",
            required: false,
            reload: Reload::Refused,
            args: &[],
        }
        Shard {
            name: "shard",
            doc: "`rows(ax)`: rows MOD-sharded over the devices of `ax` times the mesh's `sparsecores`: `partition = (id + rotation) % N`, `local row = id / N` (see below)",
            required: false,
            reload: Reload::Refused,
            args: &[],
        }
    }
}
