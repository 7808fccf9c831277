//! The data sources, losses, metrics, precisions and pipeline schedules a
//! source may name. `crate::spec` reads them into its typed values (a data
//! source with its arguments is `spec::Data`); these tags are the typed values
//! of the others.

use super::{vocabulary, Arg, Omitted, Value, Word};

const CLASSES: &str = "the model's output classes";
const SEQ16: Arg = Arg::new("seq", Value::Count, Omitted::Is(16.0), "words per example");
const WORDS_VOCAB: Arg = Arg::new(
    "vocab",
    Value::Count,
    Omitted::From(CLASSES),
    "word ids below it (the `vocab − 1` most frequent words, 0 for every other)",
);
const PATH: Arg = Arg::new(
    "path",
    Value::Path,
    Omitted::Required,
    "relative to the `.shard` file",
);

vocabulary! {
    /// A data source a source names; `crate::spec::Data` is the typed source
    /// with its arguments.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum DataSource: Word in DATA_SOURCES ("data source") {
        ShakespeareWords {
            name: "shakespeare_words",
            doc: "the built-in tiny Shakespeare as word ids (lowercased, split on non-letters; the `vocab − 1` most frequent words get ids 1…, ties alphabetical; 0 is every other word): `seq` words in, the next word (per position, for a model with a sequence output) as label",
            args: &[WORDS_VOCAB, SEQ16],
        }
        ShakespeareChars {
            name: "shakespeare_chars",
            doc: "the same text as characters: id = rank of the character among the text's 65 distinct characters in code-point order",
            args: &[Arg::new("seq", Value::Count, Omitted::Is(64.0), "characters per example")],
        }
        Text {
            name: "text",
            doc: "any UTF-8 text file of up to 2 GiB (`path` a string, relative to the `.shard` file), read a megabyte at a time, as word ids formed like `shakespeare_words` (a word of over 256 letters is unknown; a NUL byte is refused)",
            args: &[PATH, SEQ16, WORDS_VOCAB],
        }
        Tokens {
            name: "tokens",
            doc: "a flat stream of token ids (`path` relative to the `.shard` file): nanoGPT's `.bin` (little-endian `uint16`, `uint32` with `uint32: true`) or a 1-D integer `.npy`, read by position, never whole; or a parquet file, an Arrow IPC file or a Hugging Face `datasets` directory (`save_to_disk`; a directory of `.parquet` files) whose `column` holds ids or lists of ids (rows joined in order); or, with `tokenizer` (a Hugging Face `tokenizer.json`), a UTF-8 text file or a string column, tokenized without special tokens. Those are converted once, on `run`, into a `uint32` stream under the run directory's `tokens/` (a bar on a terminal) and reused while the source and tokenizer are unchanged. Windows of `seq + 1` ids, the first `seq` the inputs and the same shifted by one the targets (nanoGPT's `get_batch`); each example's window drawn from the seed, the step and the example (`sequential: true`: consecutive windows), so a resumed run continues with the next ones. The last `eval` fraction is held out, or `eval_path` names the held-out stream. `check` reads the header and samples ids; `run` reads every id once before training and stops at the first outside the vocabulary, with its position",
            args: &[
                PATH,
                Arg::new("seq", Value::Count, Omitted::Is(64.0), "ids per example"),
                Arg::new("uint32", Value::Flag, Omitted::Flag(false), "a `.bin` of `uint32` ids (a `.npy` says its dtype)"),
                Arg::new("sequential", Value::Flag, Omitted::Flag(false), "consecutive windows instead of drawn ones"),
                Arg::new("eval", Value::Unit, Omitted::Is(0.1), "the fraction at the end held out for `eval`"),
                Arg::new("eval_path", Value::Path, Omitted::From("the last `eval` of `path`"), "a second stream held out for `eval`"),
                Arg::new("column", Value::Name, Omitted::From("the table's only column, else `input_ids`, else `tokens`, else `text`"), "the column of a parquet or Arrow source"),
                Arg::new("tokenizer", Value::Path, Omitted::From("none: `path` holds ids"), "a Hugging Face `tokenizer.json` that turns text into ids"),
            ],
        }
        Arrays {
            name: "arrays",
            doc: "named arrays from a `.safetensors` file, a `.npz` file, or a directory of `NAME.npy` files (relative to the `.shard` file); see below",
            args: &[PATH],
        }
        Synthetic {
            name: "synthetic",
            doc: "random inputs of the model's input type (normal floats; ids below `vocab`), labels below `classes` (normal targets for `mse`, 0/1 for `sigmoid_binary_cross_entropy`): one fixed batch",
            args: &[
                Arg::new("classes", Value::Count, Omitted::From(CLASSES), "labels below it"),
                Arg::new("vocab", Value::Count, Omitted::From(CLASSES), "input ids below it"),
            ],
        }
        Clicks {
            name: "clicks",
            doc: "synthetic clicks for recommendation models: inputs drawn as `synthetic` draws them but new every step (and held out for `eval`), and per example a click (0/1) from a fixed rule of the seed that a model can learn: a score summing, per input, a fixed linear function of its float features or a fixed value per id (each scaled by 1/√features), plus noise; clicked when positive. The click is the target of each of the example's output elements (or its class id with `softmax_cross_entropy`)",
            args: &[Arg::new("vocab", Value::Count, Omitted::From(CLASSES), "input ids below it")],
        }
    }
}

impl DataSource {
    /// Whether its labels are token ids (not usable with `loss: mse`).
    pub fn is_tokens(self) -> bool {
        match self {
            DataSource::ShakespeareWords
            | DataSource::ShakespeareChars
            | DataSource::Text
            | DataSource::Tokens => true,
            DataSource::Arrays | DataSource::Synthetic | DataSource::Clicks => false,
        }
    }
}

vocabulary! {
    /// What the model's output is trained against.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub enum Loss: Word in LOSSES ("loss") {
        /// Class ids against logits (the last dimension, possibly split over devices).
        #[default]
        SoftmaxCrossEntropy {
            name: "softmax_cross_entropy",
            doc: "integer labels; the logits may stay split over the class dim. With `ignore_index`, the targets equal to it count neither in the loss nor in its mean: the loss is the mean over the other targets of the whole step (every microbatch, device and pipeline stage), so `accumulate` and any mesh give the loss of the full batch (`softmax_cross_entropy(ignore_index: -100)` for Hugging Face's masked-LM labels, or a pad id)",
            args: &[Arg::new(
                "ignore_index",
                Value::Integer,
                Omitted::From("none: every target counts"),
                "a target id that counts neither in the loss nor in its mean (e.g. `-100`, or the pad id)",
            )],
        }
        /// Targets shaped like the output: the mean over every element of (out − y)².
        Mse {
            name: "mse",
            doc: "targets shaped like the output; the mean of (out − y)² over every element; the output may stay split",
            args: &[],
        }
        /// 0/1 targets shaped like the output, the output a logit: the mean over
        /// every element of softplus(z) − y·z (numerically stable).
        SigmoidBinaryCrossEntropy {
            name: "sigmoid_binary_cross_entropy",
            doc: "0/1 targets shaped like the output, the output a logit; the mean over every element of softplus(z) − y·z, computed stably as max(z, 0) − y·z + ln(1 + e^−\\|z\\|); the output may stay split",
            args: &[],
        }
    }
    unnamed ("fn") {
        /// A `fn` of the model (named by `spec::Train::loss_fn`) of the output
        /// and the targets, returning a float scalar: the targets are its second
        /// parameter's type (class ids when integer, values when float).
        Function
    }
}

/// A metric: its word, and the losses it is defined for.
#[derive(Debug)]
pub struct MetricDef<T: 'static> {
    pub tag: T,
    pub name: &'static str,
    pub doc: &'static str,
    /// The built-in losses it is defined for (any other is E0308).
    pub losses: &'static [Loss],
}

impl<T> super::Entry for MetricDef<T> {
    fn name(&self) -> &'static str {
        self.name
    }
    fn doc(&self) -> &'static str {
        self.doc
    }
    fn args(&self) -> &'static [Arg] {
        &[]
    }
}

vocabulary! {
    /// A figure computed from each step's outputs and targets, logged beside the
    /// loss (progress line and `metrics.jsonl`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Metric: MetricDef in METRICS ("metric") {
        /// The share of predictions that are right: the target class has the
        /// largest logit (softmax cross-entropy), or the logit's sign is the 0/1
        /// target's (sigmoid binary cross-entropy).
        Accuracy {
            name: "accuracy",
            doc: "softmax: the target has the largest logit, ties count, over the targets the loss counts (not those equal to its `ignore_index`); sigmoid: the logit's sign is the target's",
            losses: &[Loss::SoftmaxCrossEntropy, Loss::SigmoidBinaryCrossEntropy],
        }
        /// Area under the ROC curve of a binary output (sigmoid binary
        /// cross-entropy), from the step's scores binned into `spec::AUC_BINS` bins
        /// of the predicted probability.
        Auc {
            name: "auc",
            doc: "area under the ROC curve of σ(z), from the scores binned into 1000 probability bins, pairs in one bin counting half; `null` when the batch has one class only",
            losses: &[Loss::SigmoidBinaryCrossEntropy],
        }
    }
}

impl Metric {
    /// Whether the metric is defined for `loss`.
    pub fn fits(self, loss: Loss) -> bool {
        self.def().losses.contains(&loss)
    }
}

vocabulary! {
    /// Where a run writes its per-step records (`log: [jsonl, tensorboard]`,
    /// or `shardc run --log`); the default is every one.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum LogSink: Word in LOG_SINKS ("log") {
        Jsonl {
            name: "jsonl",
            doc: "`metrics.jsonl` in the run directory (the run's configuration, then one record per step, with its wall-clock `time`) and the curve `loss.svg`; a resumed run continues from it",
            args: &[],
        }
        Tensorboard {
            name: "tensorboard",
            doc: "a TensorBoard event file in the run directory: every scalar of every step (loss, lr, grad norm, metrics, observed values, step time, examples/s, eval loss), the configuration and the plan as text; W&B and MLflow import it",
            args: &[],
        }
    }
}

vocabulary! {
    /// The float precision a `train` computes in (`precision: bf16`): mixed
    /// precision keeps f32 master weights, gradients and optimizer state, and
    /// computes the forward and backward passes (parameters' working copies,
    /// activations, their collectives) in the 16-bit type, with softmax, norms,
    /// reductions and losses accumulated in f32.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub enum Precision: Word in PRECISIONS ("precision") {
        #[default]
        F32 {
            name: "f32",
            doc: "everything in f32 (the default)",
            args: &[],
        }
        BF16 {
            name: "bf16",
            doc: "mixed precision: f32 master weights, gradients and optimizer state; forward and backward in bfloat16",
            args: &[],
        }
        F16 {
            name: "f16",
            doc: "the same with IEEE half precision",
            args: &[],
        }
    }
}

vocabulary! {
    /// The order a pipelined stack (`repeat(..., stages: pp, schedule: s)`)
    /// runs its microbatches' forward and backward passes in (`crate::schedule`
    /// draws it as a timeline).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub enum Pipe: Word in PIPELINE_SCHEDULES ("pipeline schedule") {
        /// Every forward, then every backward.
        #[default]
        GPipe {
            name: "gpipe",
            doc: "all forward passes, then all backward passes (the default)",
            args: &[],
        }
        /// Warm-up forwards, then one forward and one backward alternately.
        OneFOneB {
            name: "one_f_one_b",
            doc: "a stage starts with as many forwards as stages after it, then alternates one forward and one backward, holding at most that many microbatches' activations",
            args: &[],
        }
        /// Megatron's interleaved 1F1B over `chunks` virtual stages per rank.
        Interleaved {
            name: "interleaved",
            doc: "Megatron's interleaved 1F1B: the stack cut into `chunks: v` pieces per rank (default 2), placed round-robin, bubble (stages − 1) / (v · microbatches); microbatches a multiple of the stages",
            args: &[],
        }
        /// Zero bubble H1: the backward split, weight gradients deferred.
        ZbH1 {
            name: "zb_h1",
            doc: "zero bubble (H1): each backward split into its input-gradient pass and its weight-gradient pass, the weight gradients deferred into the bubble, at 1F1B's activation memory",
            args: &[],
        }
        /// Zero bubble V: two chunks per rank in a V, the backward split.
        Zbv {
            name: "zbv",
            doc: "zero bubble V (DualPipeV's placement): two chunks per rank, stage s and stage 2·stages − 1 − s on rank s, the backward split; the smallest bubble at 1F1B's activation memory",
            args: &[],
        }
    }
}

/// Written by its name (`shardc plan --json`).
impl serde::Serialize for Pipe {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl Pipe {
    /// As `shardc plan` prints it.
    pub fn label(self) -> &'static str {
        match self {
            Pipe::GPipe => "GPipe",
            Pipe::OneFOneB => "1F1B",
            Pipe::Interleaved => "interleaved 1F1B",
            Pipe::ZbH1 => "ZB-H1",
            Pipe::Zbv => "ZBV",
        }
    }

    /// Virtual stages per rank the schedule fixes (`None`: the `repeat`'s
    /// `chunks:`, 2 when left out).
    pub fn fixed_chunks(self) -> Option<usize> {
        match self {
            Pipe::GPipe | Pipe::OneFOneB | Pipe::ZbH1 => Some(1),
            Pipe::Zbv => Some(2),
            Pipe::Interleaved => None,
        }
    }

    /// Virtual stages per rank: what the schedule fixes, else `given` (the
    /// `repeat`'s `chunks:`), 2 when left out.
    pub fn chunks(self, given: Option<usize>) -> usize {
        self.fixed_chunks().or(given).unwrap_or(2).max(1)
    }

    /// Whether each backward runs as two passes, input then weight gradient.
    pub fn splits_backward(self) -> bool {
        match self {
            Pipe::GPipe | Pipe::OneFOneB | Pipe::Interleaved => false,
            Pipe::ZbH1 | Pipe::Zbv => true,
        }
    }

    /// Whether the microbatches must be a multiple of the stages.
    pub fn needs_multiple(self) -> bool {
        match self {
            Pipe::Interleaved => true,
            Pipe::GPipe | Pipe::OneFOneB | Pipe::ZbH1 | Pipe::Zbv => false,
        }
    }
}
