//! The optimizers and learning-rate schedules a `train` or `table` may name,
//! with their hyperparameters and defaults (optax's and TensorFlow's where a
//! source leaves them out). `crate::spec` turns a tag and its arguments into
//! the typed optimizer or schedule; `crate::runtime::optim` steps it.
//!
//! Adding an optimizer: one entry below (name, tag, doc, arguments with
//! defaults), then the arms the compiler asks for: its typed value in
//! `spec::OptKind` and `spec/build.rs`, and its step in `runtime::optim`.

use super::{vocabulary, Arg, Omitted, Value, Word};

/// The learning rate every optimizer takes first.
const LR: Arg = Arg::new(
    "lr",
    Value::Lr,
    Omitted::Is(1e-3),
    "the learning rate: a number, or a schedule below",
);
const B1: Arg = Arg::new(
    "b1",
    Value::Unit,
    Omitted::Is(0.9),
    "decay of the first-moment (mean) estimate",
);
const B2: Arg = Arg::new(
    "b2",
    Value::Unit,
    Omitted::Is(0.999),
    "decay of the second-moment (uncentred variance) estimate",
);
const EPS: Arg = Arg::new(
    "eps",
    Value::Positive,
    Omitted::Is(1e-8),
    "added to the denominator",
);
const WEIGHT_DECAY: Arg = Arg::new(
    "weight_decay",
    Value::Number,
    Omitted::Is(1e-4),
    "decoupled weight decay, scaled by the learning rate",
);
/// Parameter groups: what some parameters do differently.
const NO_DECAY: Arg = Arg::new(
    "no_decay",
    Value::Patterns,
    Omitted::From("`[]`"),
    "parameters whose dotted path contains one of these names (`[norm, bias]`) take no weight decay",
);
const LR_SCALE: Arg = Arg::new(
    "lr_scale",
    Value::Scales,
    Omitted::From("`{}`"),
    "parameters whose dotted path contains a name train at the learning rate times its factor (`{ embed: 0.1 }`; the first match counts)",
);
const ACCUMULATOR: Arg = Arg::new(
    "initial_accumulator",
    Value::Number,
    Omitted::Is(0.1),
    "the squared-gradient accumulator's starting value",
);

vocabulary! {
    /// An optimizer a source names; `crate::spec::OptKind` is the typed
    /// optimizer with its hyperparameters.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Opt: Word in OPTIMIZERS ("optimizer") {
        Sgd {
            name: "sgd",
            doc: "stochastic gradient descent, with heavy-ball or Nesterov momentum (`optax.sgd`)",
            args: &[
                LR,
                Arg::new("momentum", Value::Number, Omitted::Is(0.0), "momentum (0: none, and no state)"),
                Arg::new("nesterov", Value::Flag, Omitted::Flag(false), "Nesterov momentum"),
                LR_SCALE,
            ],
        }
        Adam {
            name: "adam",
            doc: "Adam (`optax.adam`)",
            args: &[LR, B1, B2, EPS, LR_SCALE],
        }
        AdamW {
            name: "adamw",
            doc: "Adam with decoupled weight decay (`optax.adamw`)",
            args: &[
                LR,
                B1,
                B2,
                EPS,
                WEIGHT_DECAY,
                NO_DECAY,
                LR_SCALE,
            ],
        }
        Adagrad {
            name: "adagrad",
            doc: "Adagrad (`optax.adagrad`)",
            args: &[LR, ACCUMULATOR, EPS, LR_SCALE],
        }
        Ftrl {
            name: "ftrl",
            doc: "FTRL-proximal (TensorFlow's `ApplyFtrl`), for embedding tables only",
            args: &[
                LR,
                Arg::new("lr_power", Value::Number, Omitted::Is(-0.5), "the power of the accumulator the learning rate is divided by"),
                Arg::new("l1", Value::Number, Omitted::Is(0.0), "L1 regularization strength"),
                Arg::new("l2", Value::Number, Omitted::Is(0.0), "L2 regularization strength"),
                ACCUMULATOR,
            ],
        }
        Lion {
            name: "lion",
            doc: "Lion (`optax.lion`; Chen et al. 2023): the sign of an interpolation of momentum and gradient, with decoupled weight decay; one slot",
            args: &[
                LR,
                Arg::new("b1", Value::Unit, Omitted::Is(0.9), "how much of the momentum the update's sign is taken from"),
                Arg::new("b2", Value::Unit, Omitted::Is(0.99), "decay of the momentum"),
                Arg::new("weight_decay", Value::Number, Omitted::Is(1e-3), "decoupled weight decay, scaled by the learning rate"),
                NO_DECAY,
                LR_SCALE,
            ],
        }
        Muon {
            name: "muon",
            doc: "Muon (Jordan et al. 2024): momentum whose update of a 2-D weight is orthogonalised by Newton–Schulz iterations and scaled to AdamW's size (Moonlight's 0.2·√max(A, B)); 1-D weights, embeddings and tables step with AdamW (`adam_*`); a weight split over the mesh is gathered for it; one slot",
            args: &[
                LR,
                Arg::new("momentum", Value::Unit, Omitted::Is(0.95), "momentum"),
                Arg::new("nesterov", Value::Flag, Omitted::Flag(true), "Nesterov momentum"),
                Arg::new("ns_steps", Value::Count, Omitted::Is(5.0), "Newton–Schulz iterations"),
                Arg::new("weight_decay", Value::Number, Omitted::Is(0.0), "decoupled weight decay, scaled by the learning rate"),
                Arg::new("adam_b1", Value::Unit, Omitted::Is(0.9), "AdamW's b1, for the weights Muon leaves to it"),
                Arg::new("adam_b2", Value::Unit, Omitted::Is(0.95), "AdamW's b2, for the weights Muon leaves to it"),
                Arg::new("adam_eps", Value::Positive, Omitted::Is(1e-8), "AdamW's eps, for the weights Muon leaves to it"),
                NO_DECAY,
                LR_SCALE,
            ],
        }
    }
}

impl Opt {
    /// Whether only an embedding table may use it (a `train`'s optimizer
    /// may not: E0302).
    pub fn tables_only(self) -> bool {
        match self {
            Opt::Ftrl => true,
            Opt::Sgd | Opt::Adam | Opt::AdamW | Opt::Adagrad | Opt::Lion | Opt::Muon => false,
        }
    }
}

const INIT: Arg = Arg::new(
    "init",
    Value::Number,
    Omitted::Is(0.0),
    "the rate at step 0",
);
const PEAK: Arg = Arg::new(
    "peak",
    Value::Positive,
    Omitted::Required,
    "the rate after warm-up",
);
const WARMUP: Arg = Arg::new(
    "warmup",
    Value::Count,
    Omitted::Required,
    "steps of linear warm-up",
);
const DECAY: Arg = Arg::new(
    "decay",
    Value::Count,
    Omitted::Required,
    "the step the decay ends at (`wsd`: its length)",
);
const END: Arg = Arg::new(
    "end",
    Value::Number,
    Omitted::Is(0.0),
    "the rate at the end of the decay and after it",
);

vocabulary! {
    /// A learning-rate schedule a source names; `crate::spec::Schedule` is
    /// the typed schedule.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Lr: Word in LR_SCHEDULES ("learning-rate schedule") {
        Constant {
            name: "constant",
            doc: "`value`",
            args: &[Arg::new("value", Value::Number, Omitted::Required, "the rate")],
        }
        WarmupCosine {
            name: "warmup_cosine",
            doc: "linear from `init` to `peak` over `warmup` steps, then cosine decay to `end` at step `decay` (as `optax.warmup_cosine_decay_schedule`)",
            args: &[INIT, PEAK, WARMUP, DECAY, END],
        }
        WarmupLinear {
            name: "warmup_linear",
            doc: "the same with a linear decay",
            args: &[INIT, PEAK, WARMUP, DECAY, END],
        }
        WarmupConstant {
            name: "warmup_constant",
            doc: "linear warm-up, then `peak`",
            args: &[INIT, PEAK, WARMUP],
        }
        InverseSqrt {
            name: "inverse_sqrt",
            doc: "linear from 0 to `peak` over `warmup` steps, then `peak · sqrt(warmup / s)`",
            args: &[PEAK, WARMUP],
        }
        Wsd {
            name: "wsd",
            doc: "warmup-stable-decay: `warmup` steps up to `peak`, `stable` steps at `peak`, then `decay` steps linearly down to `end`",
            args: &[
                INIT,
                PEAK,
                WARMUP,
                Arg::new("stable", Value::Count, Omitted::Required, "steps held at `peak` after warm-up"),
                DECAY,
                END,
            ],
        }
    }
}
