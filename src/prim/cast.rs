//! Values passed through: `cast(x, dtype)` (layout and pending kept; floats
//! compute in the run's dtype, integers truncate toward zero) and
//! `stop_gradient(x)` (the value, with no gradient flowing back).

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, known_named, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::{DType, ExprKind};
use crate::diag::Problem;
use crate::types::TType;
use candle_core::Tensor;

pub const DEFS: &[Def] = &[
    Def {
        name: "cast",
        kind: Kind::Function,
        signature: "cast(x, bf16)",
        rule: "dtype changed, layout and pending kept; floats compute in the run's dtype (f32, the 16-bit type under `precision: bf16 | f16`, or f64 with `--f64`), integers truncate toward zero and carry no gradient",
        check: Some(cast),
        examples: &["cast({x: f32[4, 6]}, f32)", "cast({x: f32[4, 6]}, bf16) * 2.0"],
        differentiable: true,
        same_on_one_device: true,
    },
    Def {
        name: "stop_gradient",
        kind: Kind::Function,
        signature: "stop_gradient(x)",
        rule: "the value, layout and pending kept; no gradient flows back through it",
        check: Some(stop_gradient),
        examples: &["stop_gradient({x: f32[4, 6]}) * {y: f32[4, 6]}"],
        differentiable: false,
        same_on_one_device: true,
    },
];

#[derive(Clone, Debug, PartialEq)]
pub enum Cast {
    To(DType),
    StopGradient,
}

fn cast(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) || !known_named(cx, c, &[]) {
        return None;
    }
    let t = cx.tensor(c.pos[0], "`cast`")?;
    let dt = match &c.pos[1].kind {
        ExprKind::Name(n) => DType::parse(n),
        _ => None,
    };
    let Some(dt) = dt else {
        cx.report(Problem::WrongKind {
            span: c.pos[1].span,
            expected: "a dtype (f32, bf16, f16, f64, i32, i64, bool)".into(),
            found: "something else".into(),
        });
        return None;
    };
    Typed::new(TType { dtype: dt, ..t }, Cast::To(dt))
}

fn stop_gradient(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 1, 1) || !known_named(cx, c, &[]) {
        return None;
    }
    let t = cx.tensor(c.pos[0], "`stop_gradient`")?;
    Typed::new(t, Cast::StopGradient)
}

impl Primitive for Cast {
    fn name(&self) -> &'static str {
        match self {
            Cast::To(_) => "cast",
            Cast::StopGradient => "stop_gradient",
        }
    }

    fn attrs(&self) -> Vec<String> {
        match self {
            Cast::To(d) => vec![d.name().into()],
            Cast::StopGradient => vec![],
        }
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], _out: &TType) -> R<Forward> {
        let x = x[0];
        Forward::of(match self {
            Cast::StopGradient => x.clone(),
            Cast::To(d) if d.is_float() && ts[0].dtype.is_float() => x.clone(),
            Cast::To(d) if d.is_float() => x.to_dtype(k.dtype).map_err(ce)?,
            Cast::To(DType::Bool) => x
                .ne(0.0)
                .and_then(|m| m.to_dtype(candle_core::DType::I64))
                .map_err(ce)?,
            Cast::To(_) => x.to_dtype(candle_core::DType::I64).map_err(ce)?,
        })
    }

    fn vjp(&self, _k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        Ok(match self {
            Cast::To(d) if d.is_float() && g.ts[0].dtype.is_float() => vec![Some(g.g.clone())],
            _ => vec![None],
        })
    }

    fn cost(&self, _c: &CostCx, _ts: &[&TType], _out: &TType) -> Option<Cost> {
        Cost::free()
    }
}
