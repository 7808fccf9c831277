//! Values a layer adds to training beside its output: `add_loss(y, term,
//! weight, name)` adds `weight × term` to the training loss (a mixture of
//! experts' load-balancing loss, a router z-loss) and `observe(y, value, name)`
//! logs a value each step (tokens per expert, dropped tokens). Both return `y`
//! unchanged, so the term stays on the path from the inputs to the output, and
//! the runtime finds them as nodes of the program: no side channel, and a
//! stack of blocks adds one term per block.
//!
//! The derivative passes `y`'s cotangent through and seeds the term with
//! `weight` (split over the devices that hold the same replicated scalar, as
//! the losses' cotangents are); an observed value gets no gradient.

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, known_named, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::ExprKind;
use crate::diag::Problem;
use crate::types::TType;
use candle_core::Tensor;

pub const DEFS: &[Def] = &[
    Def {
        name: "add_loss",
        kind: Kind::Function,
        signature: "add_loss(y, term, weight: 0.01, name: balance)",
        rule: "`y` unchanged; `weight × term` is added to the training loss (`term` a reduced float scalar, E0224; `weight` a number ≥ 0), its value logged each step under `name` (terms of one name add up, e.g. one per block); the gradient of `term` is `weight`",
        check: Some(add_loss),
        examples: &["add_loss({x: f32[4, 6]}, mean({z: f32[4, 6]}), weight: 0.5, name: aux)"],
        // Its gradient is of the training loss, not of its output alone, so the
        // generic check (finite differences of the output) does not apply; the
        // training-loss test in tests/losses.rs checks it.
        differentiable: false,
        same_on_one_device: true,
    },
    Def {
        name: "observe",
        kind: Kind::Function,
        signature: "observe(y, value, name: dropped)",
        rule: "`y` unchanged; `value` (a reduced tensor of at most 1,024 elements, E0224) is logged each step under `name` (values of one name add up); no gradient flows into it",
        check: Some(observe),
        examples: &["observe({x: f32[4, 6]}, sum({z: f32[4, 6]}, dim: 0), name: seen)"],
        differentiable: true,
        same_on_one_device: true,
    },
];

/// The most elements an observed value may have (one line of `metrics.jsonl`).
pub const MAX_OBSERVED: i64 = 1024;

#[derive(Clone, Debug, PartialEq)]
pub enum Aux {
    /// `weight × term` joins the loss.
    Loss { weight: f64, name: String },
    /// The value is logged.
    Observe { name: String },
}

impl Aux {
    /// The name the value is logged under.
    pub fn name(&self) -> &str {
        match self {
            Aux::Loss { name, .. } | Aux::Observe { name } => name,
        }
    }
    /// The loss weight (none for an observed value).
    pub fn weight(&self) -> Option<f64> {
        match self {
            Aux::Loss { weight, .. } => Some(*weight),
            Aux::Observe { .. } => None,
        }
    }
}

/// `name:` as a bare name or a string.
fn name_arg(cx: &mut dyn Rules, c: &Call) -> Option<String> {
    let Some(e) = c.named_expr("name") else {
        cx.report(Problem::NamedArg {
            span: c.span(),
            callee: c.name.into(),
            name: "name".into(),
            known: vec!["name".into()],
            missing: true,
        });
        return None;
    };
    match &e.kind {
        ExprKind::Name(n) | ExprKind::Str(n) if !n.is_empty() => Some(n.clone()),
        _ => {
            cx.report(Problem::WrongKind {
                span: e.span,
                expected: "a name to log the value under".into(),
                found: "something else".into(),
            });
            None
        }
    }
}

/// `y` and the value beside it: any tensor, and a reduced float tensor of at
/// most `max` elements (E0224).
fn operands(
    cx: &mut dyn Rules,
    c: &Call,
    callee: &'static str,
    max: i64,
    what: &str,
) -> Option<(TType, TType)> {
    let y = cx.tensor(c.pos[0], &format!("the value `{}` passes on", c.name))?;
    let v = cx.tensor(c.pos[1], &format!("the {what} of `{}`", c.name))?;
    let elements = v
        .dims
        .iter()
        .map(|d| d.size.as_const())
        .try_fold(1i64, |n, s| s.map(|s| n.saturating_mul(s)));
    let split = v.dims.iter().any(|d| !d.axes.is_empty());
    let problem = if !v.dtype.is_float() {
        Some(format!("is `{v}`, not a float"))
    } else if !v.pending.is_empty() {
        Some(format!("is `{v}`, which still owes a sum over devices"))
    } else if split {
        Some(format!("is `{v}`, split over devices"))
    } else if elements.is_none_or(|n| n > max) {
        Some(match max {
            1 => format!("is `{v}`, not a scalar"),
            _ => format!("is `{v}`, more than {max} elements"),
        })
    } else {
        None
    };
    if let Some(problem) = problem {
        cx.report(Problem::AuxValue {
            span: c.pos[1].span,
            callee,
            what: what.into(),
            problem,
            max,
        });
        return None;
    }
    Some((y, v))
}

fn add_loss(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) || !known_named(cx, c, &["weight", "name"]) {
        return None;
    }
    let weight = match c.named_expr("weight") {
        None => 1.0,
        Some(e) => match cx.number(e) {
            Some(w) if w >= 0.0 && w.is_finite() => w,
            _ => {
                cx.report(Problem::BadValue {
                    span: e.span,
                    message: "the weight of an added loss is a number ≥ 0".into(),
                    help: Some("write `weight: 0.01`".into()),
                });
                return None;
            }
        },
    };
    let name = name_arg(cx, c)?;
    let (y, _) = operands(cx, c, "add_loss", 1, "term")?;
    Typed::new(y, Aux::Loss { weight, name })
}

fn observe(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) || !known_named(cx, c, &["name"]) {
        return None;
    }
    let name = name_arg(cx, c)?;
    let (y, _) = operands(cx, c, "observe", MAX_OBSERVED, "value")?;
    Typed::new(y, Aux::Observe { name })
}

impl Primitive for Aux {
    fn name(&self) -> &'static str {
        match self {
            Aux::Loss { .. } => "add_loss",
            Aux::Observe { .. } => "observe",
        }
    }

    fn attrs(&self) -> Vec<String> {
        match self {
            Aux::Loss { weight, name } => {
                vec![format!("weight: {weight}"), format!("name: {name}")]
            }
            Aux::Observe { name } => vec![format!("name: {name}")],
        }
    }

    fn forward(&self, _k: &Kernel, x: &[&Tensor], _ts: &[&TType], _out: &TType) -> R<Forward> {
        Forward::of(x[0].clone())
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        Ok(match self {
            Aux::Loss { weight, .. } => {
                // The term is the same scalar on every device holding it (in a
                // pipeline, its stage's): its cotangent is held as equal
                // addends over them.
                let (_, rep) = k.topo().replication(g.ts[1], k.stage_axis);
                let seed = g.x[1]
                    .ones_like()
                    .and_then(|t| t * (*weight / rep.max(1) as f64))
                    .map_err(ce)?;
                vec![Some(g.g.clone()), Some(seed)]
            }
            Aux::Observe { .. } => vec![Some(g.g.clone()), None],
        })
    }

    fn cost(&self, _c: &CostCx, _ts: &[&TType], _out: &TType) -> Option<Cost> {
        Cost::free()
    }
}
