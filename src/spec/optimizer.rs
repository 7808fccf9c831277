//! Optimizers and learning-rate schedules as typed values: which optimizer,
//! its hyperparameters, and the state it keeps per parameter. The steps
//! themselves live in `runtime::optim`, one implementation per kind.

/// A learning-rate schedule.
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
    pub const NAMES: &'static [(&'static str, &'static [&'static str])] = &[
        ("constant", &["value"]),
        ("warmup_cosine", &["init", "peak", "warmup", "decay", "end"]),
    ];

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

/// Which optimizer, with its hyperparameters (optax's and TensorFlow's defaults
/// where the source leaves them out).
#[derive(Clone, Debug, PartialEq)]
pub enum OptKind {
    Sgd {
        momentum: f64,
        nesterov: bool,
    },
    Adam {
        b1: f64,
        b2: f64,
        eps: f64,
    },
    AdamW {
        b1: f64,
        b2: f64,
        eps: f64,
        weight_decay: f64,
    },
    Adagrad {
        initial_accumulator: f64,
        eps: f64,
    },
    /// FTRL-proximal (TensorFlow's ApplyFtrl), for embedding tables.
    Ftrl {
        lr_power: f64,
        l1: f64,
        l2: f64,
        initial_accumulator: f64,
    },
}

/// An optimizer and its learning-rate schedule.
#[derive(Clone, Debug, PartialEq)]
pub struct Optimizer {
    pub kind: OptKind,
    pub lr: Schedule,
}

impl Default for Optimizer {
    fn default() -> Optimizer {
        Optimizer {
            kind: OptKind::Adam {
                b1: 0.9,
                b2: 0.999,
                eps: 1e-8,
            },
            lr: Schedule::Constant(1e-3),
        }
    }
}

impl Optimizer {
    /// Names and the arguments each takes.
    pub const NAMES: &'static [(&'static str, &'static [&'static str])] = &[
        ("sgd", &["lr", "momentum", "nesterov"]),
        ("adam", &["lr", "b1", "b2", "eps"]),
        ("adamw", &["lr", "b1", "b2", "eps", "weight_decay"]),
        ("adagrad", &["lr", "initial_accumulator", "eps"]),
        (
            "ftrl",
            &["lr", "lr_power", "l1", "l2", "initial_accumulator"],
        ),
    ];

    /// The optimizer's name, as written.
    pub fn name(&self) -> &'static str {
        match self.kind {
            OptKind::Sgd { .. } => "sgd",
            OptKind::Adam { .. } => "adam",
            OptKind::AdamW { .. } => "adamw",
            OptKind::Adagrad { .. } => "adagrad",
            OptKind::Ftrl { .. } => "ftrl",
        }
    }

    /// The name with what changes its state (`sgd with momentum`), for messages.
    pub fn describe(&self) -> String {
        match self.kind {
            OptKind::Sgd { momentum, .. } if momentum > 0.0 => "sgd with momentum".into(),
            _ => self.name().into(),
        }
    }

    /// The state it keeps per parameter, in the parameter's layout: (a first
    /// slot `m`, a second slot `v`). Adam/AdamW and FTRL two, momentum SGD and
    /// Adagrad one.
    pub fn slots(&self) -> (bool, bool) {
        match self.kind {
            OptKind::Adam { .. } | OptKind::AdamW { .. } | OptKind::Ftrl { .. } => (true, true),
            OptKind::Adagrad { .. } => (false, true),
            OptKind::Sgd { momentum, .. } if momentum > 0.0 => (true, false),
            OptKind::Sgd { .. } => (false, false),
        }
    }

    /// How many slots, for the plan.
    pub fn slot_count(&self) -> usize {
        let (m, v) = self.slots();
        usize::from(m) + usize::from(v)
    }

    /// Named hyperparameters and their values (for change reports).
    pub fn hyperparameters(&self) -> Vec<(&'static str, String)> {
        let f = |v: f64| v.to_string();
        match self.kind {
            OptKind::Sgd { momentum, nesterov } => vec![
                ("momentum", f(momentum)),
                ("nesterov", nesterov.to_string()),
            ],
            OptKind::Adam { b1, b2, eps } => vec![("b1", f(b1)), ("b2", f(b2)), ("eps", f(eps))],
            OptKind::AdamW {
                b1,
                b2,
                eps,
                weight_decay,
            } => vec![
                ("b1", f(b1)),
                ("b2", f(b2)),
                ("eps", f(eps)),
                ("weight_decay", f(weight_decay)),
            ],
            OptKind::Adagrad {
                initial_accumulator,
                eps,
            } => vec![
                ("initial_accumulator", f(initial_accumulator)),
                ("eps", f(eps)),
            ],
            OptKind::Ftrl {
                lr_power,
                l1,
                l2,
                initial_accumulator,
            } => vec![
                ("lr_power", f(lr_power)),
                ("l1", f(l1)),
                ("l2", f(l2)),
                ("initial_accumulator", f(initial_accumulator)),
            ],
        }
    }

    /// What differs from `old`, as `name old → new` (the learning rate first).
    pub fn changes_from(&self, old: &Optimizer) -> Vec<String> {
        let mut out = Vec::new();
        if old.lr != self.lr {
            out.push(format!("lr {} → {}", old.lr, self.lr));
        }
        let before = old.hyperparameters();
        for (name, new) in self.hyperparameters() {
            if let Some((_, was)) = before.iter().find(|(n, _)| *n == name) {
                if *was != new {
                    out.push(format!("{name} {was} → {new}"));
                }
            }
        }
        out
    }
}
