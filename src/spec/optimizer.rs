//! Optimizers and learning-rate schedules as typed values: which optimizer,
//! its hyperparameters, and the state it keeps per parameter. Their names,
//! arguments and defaults are the registry's ([`crate::vocab::OPTIMIZERS`],
//! [`crate::vocab::LR_SCHEDULES`]); the steps themselves live in
//! `runtime::optim`, one implementation per kind.

use crate::vocab::{Entry, Lr, Opt};

/// An argument of the word `def` as `get` gives it, or the registry's
/// default (NaN for one the registry does not list, which
/// `tests/registry.rs` catches; 0 for a required one left out, which the
/// spec reported).
fn arg_or_default(def: &dyn Entry, get: &dyn Fn(&str) -> Option<f64>, name: &str) -> f64 {
    get(name).unwrap_or_else(|| match def.arg(name) {
        Some(a) => a.omitted.number().unwrap_or(0.0),
        None => f64::NAN,
    })
}

/// How a warmed-up schedule decays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decay {
    Linear,
    Cosine,
    /// No decay: the peak holds.
    Constant,
}

/// A learning-rate schedule.
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    Constant(f64),
    /// Linear warm-up from `init` to `peak` over steps `0..warmup`, `peak`
    /// held until step `stable`, then a `shape` decay reaching `end` at step
    /// `end_step` (and `end` after it). `warmup_cosine` is optax's
    /// `warmup_cosine_decay_schedule` (`stable = warmup`, `end_step = decay`).
    Warmup {
        init: f64,
        peak: f64,
        warmup: usize,
        stable: usize,
        end_step: usize,
        end: f64,
        shape: Decay,
    },
    /// Linear warm-up from 0 to `peak` over `warmup` steps, then
    /// `peak · sqrt(warmup / step)` (the Transformer's and fairseq's).
    InverseSqrt {
        peak: f64,
        warmup: usize,
    },
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schedule::Constant(v) => write!(f, "{v:e}"),
            Schedule::Warmup {
                init,
                peak,
                warmup,
                stable,
                end_step,
                end,
                shape,
            } => {
                write!(f, "warmup({init:e} → {peak:e} in {warmup}")?;
                if stable > warmup {
                    write!(f, ", held to {stable}")?;
                }
                match shape {
                    Decay::Constant => write!(f, ")"),
                    Decay::Linear => write!(f, ", linear → {end:e} by {end_step})"),
                    Decay::Cosine => write!(f, ", cosine → {end:e} by {end_step})"),
                }
            }
            Schedule::InverseSqrt { peak, warmup } => {
                write!(f, "inverse_sqrt({peak:e} after {warmup})")
            }
        }
    }
}

impl Schedule {
    /// The schedule `kind` from its arguments (`get`: a named argument's
    /// value; the registry's defaults for those left out).
    pub fn build(kind: Lr, get: &dyn Fn(&str) -> Option<f64>) -> Schedule {
        let n = |k: &str| arg_or_default(kind.def(), get, k);
        let steps = |k: &str| {
            let v = n(k);
            if v.is_nan() {
                0
            } else {
                v.max(0.0) as usize
            }
        };
        let warmup = steps("warmup");
        let (init, peak, end) = (n("init"), n("peak"), n("end"));
        let warm = |stable: usize, end_step: usize, shape: Decay| Schedule::Warmup {
            init,
            peak,
            warmup,
            stable,
            end_step,
            end,
            shape,
        };
        match kind {
            Lr::Constant => Schedule::Constant(n("value")),
            Lr::WarmupCosine => warm(warmup, steps("decay"), Decay::Cosine),
            Lr::WarmupLinear => warm(warmup, steps("decay"), Decay::Linear),
            Lr::WarmupConstant => warm(usize::MAX, usize::MAX, Decay::Constant),
            Lr::InverseSqrt => Schedule::InverseSqrt { peak, warmup },
            Lr::Wsd => {
                let stable = warmup.saturating_add(steps("stable"));
                warm(stable, stable.saturating_add(steps("decay")), Decay::Linear)
            }
        }
    }

    /// Which schedule it is (a `wsd` without its stable phase is a
    /// `warmup_linear`: the two are the same schedule).
    pub fn kind(&self) -> Lr {
        match self {
            Schedule::Constant(_) => Lr::Constant,
            Schedule::InverseSqrt { .. } => Lr::InverseSqrt,
            Schedule::Warmup {
                shape,
                warmup,
                stable,
                ..
            } => match shape {
                Decay::Cosine => Lr::WarmupCosine,
                Decay::Constant => Lr::WarmupConstant,
                Decay::Linear if stable > warmup => Lr::Wsd,
                Decay::Linear => Lr::WarmupLinear,
            },
        }
    }

    pub fn at(&self, step: usize) -> f64 {
        match *self {
            Schedule::Constant(v) => v,
            Schedule::Warmup {
                init,
                peak,
                warmup,
                stable,
                end_step,
                end,
                shape,
            } => {
                if step < warmup {
                    return init + (peak - init) * step as f64 / warmup.max(1) as f64;
                }
                let from = stable.max(warmup);
                if step < from || shape == Decay::Constant {
                    return peak;
                }
                let span = end_step.saturating_sub(from).max(1) as f64;
                let t = ((step - from) as f64 / span).min(1.0);
                match shape {
                    Decay::Linear => peak + (end - peak) * t,
                    Decay::Cosine | Decay::Constant => {
                        end + (peak - end) * 0.5 * (1.0 + (std::f64::consts::PI * t).cos())
                    }
                }
            }
            Schedule::InverseSqrt { peak, warmup } => {
                if step < warmup {
                    peak * step as f64 / warmup as f64
                } else {
                    peak * (warmup.max(1) as f64 / step.max(1) as f64).sqrt()
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
    /// Lion (`optax.lion`).
    Lion {
        b1: f64,
        b2: f64,
        weight_decay: f64,
    },
    /// Muon for 2-D weights; the others take AdamW with the `adam_*`
    /// hyperparameters ([`OptKind::muon_fallback`]).
    Muon {
        momentum: f64,
        nesterov: bool,
        ns_steps: usize,
        weight_decay: f64,
        adam_b1: f64,
        adam_b2: f64,
        adam_eps: f64,
    },
    /// A frozen parameter's: never steps, keeps no state. Not written in a
    /// source; given to parameters that `freeze(...)` or `frozen: true` mark.
    Frozen,
}

/// An optimizer and its learning-rate schedule, with its parameter groups
/// as written and, once resolved for one parameter ([`Optimizer::for_param`]),
/// that parameter's factor on the learning rate.
#[derive(Clone, Debug, PartialEq)]
pub struct Optimizer {
    pub kind: OptKind,
    pub lr: Schedule,
    pub groups: Groups,
    /// This parameter's factor on the learning rate (1: the schedule's).
    pub lr_scale: f64,
}

/// Parameter groups, as a source writes them in the optimizer: names a
/// parameter's dotted path may contain (`no_decay: [norm, bias]`, `lr_scale:
/// { embed: 0.1 }`).
#[derive(Clone, Debug, Default)]
pub struct Groups {
    /// Parameters that take no weight decay.
    pub no_decay: Vec<String>,
    /// Parameters whose learning rate is scaled (the first match counts).
    pub lr_scale: Vec<(String, f64)>,
    /// Where each name is written, with the option it belongs to (for the
    /// check that it matches a parameter; not part of what the groups are).
    pub written: Vec<(String, &'static str, crate::source::Span)>,
}

/// Groups are the same when they group the same way, wherever written.
impl PartialEq for Groups {
    fn eq(&self, other: &Groups) -> bool {
        self.no_decay == other.no_decay && self.lr_scale == other.lr_scale
    }
}

impl OptKind {
    /// The optimizer `tag` with the hyperparameters `get` gives (a flag as 1
    /// or 0), the registry's defaults for those left out.
    pub fn build(tag: Opt, get: &dyn Fn(&str) -> Option<f64>) -> OptKind {
        let v = |k: &str| arg_or_default(tag.def(), get, k);
        match tag {
            Opt::Sgd => OptKind::Sgd {
                momentum: v("momentum"),
                nesterov: v("nesterov") == 1.0,
            },
            Opt::Adam => OptKind::Adam {
                b1: v("b1"),
                b2: v("b2"),
                eps: v("eps"),
            },
            Opt::AdamW => OptKind::AdamW {
                b1: v("b1"),
                b2: v("b2"),
                eps: v("eps"),
                weight_decay: v("weight_decay"),
            },
            Opt::Adagrad => OptKind::Adagrad {
                initial_accumulator: v("initial_accumulator"),
                eps: v("eps"),
            },
            Opt::Ftrl => OptKind::Ftrl {
                lr_power: v("lr_power"),
                l1: v("l1"),
                l2: v("l2"),
                initial_accumulator: v("initial_accumulator"),
            },
            Opt::Lion => OptKind::Lion {
                b1: v("b1"),
                b2: v("b2"),
                weight_decay: v("weight_decay"),
            },
            Opt::Muon => OptKind::Muon {
                momentum: v("momentum"),
                nesterov: v("nesterov") == 1.0,
                ns_steps: v("ns_steps").max(0.0) as usize,
                weight_decay: v("weight_decay"),
                adam_b1: v("adam_b1"),
                adam_b2: v("adam_b2"),
                adam_eps: v("adam_eps"),
            },
        }
    }

    /// The AdamW that steps the weights Muon leaves out (1-D weights,
    /// embeddings, tables); `None` for other optimizers.
    pub fn muon_fallback(&self) -> Option<OptKind> {
        match *self {
            OptKind::Muon {
                weight_decay,
                adam_b1,
                adam_b2,
                adam_eps,
                ..
            } => Some(OptKind::AdamW {
                b1: adam_b1,
                b2: adam_b2,
                eps: adam_eps,
                weight_decay,
            }),
            _ => None,
        }
    }

    /// The same optimizer without weight decay (a `no_decay` parameter's).
    pub fn without_decay(&self) -> OptKind {
        let mut k = self.clone();
        match &mut k {
            OptKind::AdamW { weight_decay, .. }
            | OptKind::Lion { weight_decay, .. }
            | OptKind::Muon { weight_decay, .. } => *weight_decay = 0.0,
            OptKind::Sgd { .. }
            | OptKind::Adam { .. }
            | OptKind::Adagrad { .. }
            | OptKind::Ftrl { .. }
            | OptKind::Frozen => {}
        }
        k
    }

    /// The registry's word for it (`None`: [`OptKind::Frozen`], which a
    /// source never names).
    pub fn tag(&self) -> Option<Opt> {
        match self {
            OptKind::Sgd { .. } => Some(Opt::Sgd),
            OptKind::Adam { .. } => Some(Opt::Adam),
            OptKind::AdamW { .. } => Some(Opt::AdamW),
            OptKind::Adagrad { .. } => Some(Opt::Adagrad),
            OptKind::Ftrl { .. } => Some(Opt::Ftrl),
            OptKind::Lion { .. } => Some(Opt::Lion),
            OptKind::Muon { .. } => Some(Opt::Muon),
            OptKind::Frozen => None,
        }
    }
}

/// The learning rate an optimizer without `lr` trains with (the registry's).
pub fn default_lr(tag: Opt) -> f64 {
    arg_or_default(tag.def(), &|_| None, "lr")
}

impl Default for Optimizer {
    /// Adam with its defaults.
    fn default() -> Optimizer {
        Optimizer {
            kind: OptKind::build(Opt::Adam, &|_| None),
            lr: Schedule::Constant(default_lr(Opt::Adam)),
            groups: Groups::default(),
            lr_scale: 1.0,
        }
    }
}

impl Optimizer {
    /// The optimizer's name, as written (`frozen` for a frozen parameter's).
    pub fn name(&self) -> &'static str {
        self.kind.tag().map_or("frozen", Opt::name)
    }

    /// The name with what changes its state (`sgd with momentum`), for messages.
    pub fn describe(&self) -> String {
        match self.kind {
            OptKind::Sgd { momentum, .. } if momentum > 0.0 => "sgd with momentum".into(),
            _ => self.name().into(),
        }
    }

    /// The learning rate at `step` (0-based), with this parameter's factor.
    pub fn lr_at(&self, step: usize) -> f64 {
        self.lr.at(step) * self.lr_scale
    }

    /// This optimizer as it steps the parameter `name`: without weight
    /// decay when a `no_decay` name is part of its path, its learning rate
    /// scaled by the first `lr_scale` name that is.
    pub fn for_param(&self, name: &str) -> Optimizer {
        let mut o = self.clone();
        if self
            .groups
            .no_decay
            .iter()
            .any(|n| name.contains(n.as_str()))
        {
            o.kind = o.kind.without_decay();
        }
        if let Some((_, f)) = self
            .groups
            .lr_scale
            .iter()
            .find(|(n, _)| name.contains(n.as_str()))
        {
            o.lr_scale = *f;
        }
        o
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
            OptKind::Lion {
                b1,
                b2,
                weight_decay,
            } => vec![
                ("b1", f(b1)),
                ("b2", f(b2)),
                ("weight_decay", f(weight_decay)),
            ],
            OptKind::Muon {
                momentum,
                nesterov,
                ns_steps,
                weight_decay,
                adam_b1,
                adam_b2,
                adam_eps,
            } => vec![
                ("momentum", f(momentum)),
                ("nesterov", nesterov.to_string()),
                ("ns_steps", ns_steps.to_string()),
                ("weight_decay", f(weight_decay)),
                ("adam_b1", f(adam_b1)),
                ("adam_b2", f(adam_b2)),
                ("adam_eps", f(adam_eps)),
            ],
            OptKind::Frozen => vec![],
        }
    }

    /// A frozen parameter's optimizer: no step, no state.
    pub fn frozen() -> Optimizer {
        Optimizer {
            kind: OptKind::Frozen,
            lr: Schedule::Constant(0.0),
            groups: Groups::default(),
            lr_scale: 1.0,
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
