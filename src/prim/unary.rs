//! Elementwise functions of one float tensor: the layout is kept, and the input
//! must owe no reduction (a non-linear function of a partial sum is not the
//! sum of the function's values).

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, known_named, need_float, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::types::TType;
use candle_core::Tensor;

const RULE: &str = "elementwise on a float tensor; layout kept; input must be reduced (E0214)";

macro_rules! unary_defs {
    ($($name:literal $example:literal,)*) => {
        pub const DEFS: &[Def] = &[$(Def {
            name: $name,
            kind: Kind::Function,
            signature: concat!($name, "(x)"),
            rule: RULE,
            check: Some(check),
            examples: &[$example],
            differentiable: true,
            same_on_one_device: true,
        },)*];
    };
}

unary_defs! {
    "relu" "relu({x: f32[4, 6]})",
    "gelu" "gelu({x: f32[4, 6]})",
    "silu" "silu({x: f32[4, 6]})",
    "tanh" "tanh({x: f32[4, 6]})",
    "exp" "exp({x: f32[4, 6]})",
    "log" "log({x: f32[4, 6]} * {x: f32[4, 6]} + 1.0)",
    "sqrt" "sqrt({x: f32[4, 6]} * {x: f32[4, 6]} + 1.0)",
    "rsqrt" "rsqrt({x: f32[4, 6]} * {x: f32[4, 6]} + 1.0)",
    "sigmoid" "sigmoid({x: f32[4, 6]})",
    "square" "square({x: f32[4, 6]})",
    "abs" "abs({x: f32[4, 6]} + 0.05)",
}

/// Which function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unary {
    Relu,
    Gelu,
    Silu,
    Tanh,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Sigmoid,
    Square,
    Abs,
}

impl Unary {
    const ALL: [Unary; 11] = [
        Unary::Relu,
        Unary::Gelu,
        Unary::Silu,
        Unary::Tanh,
        Unary::Exp,
        Unary::Log,
        Unary::Sqrt,
        Unary::Rsqrt,
        Unary::Sigmoid,
        Unary::Square,
        Unary::Abs,
    ];
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    let f = Unary::ALL.into_iter().find(|u| u.name() == c.name)?;
    if !arity(cx, c, 1, 1) || !known_named(cx, c, &[]) {
        return None;
    }
    let t = cx.tensor(c.pos[0], &format!("`{}`", c.name))?;
    if !need_float(cx, &t, c.pos[0]) || !cx.need_reduced(&t, c.name, c.pos[0]) {
        return None;
    }
    Typed::new(t, f)
}

fn sigmoid(x: &Tensor) -> candle_core::Result<Tensor> {
    x.neg()?.exp()?.affine(1.0, 1.0)?.recip()
}

/// d/dx of candle's tanh-approximated GELU, with the constants in full precision.
fn gelu_tanh_grad(x: &Tensor) -> candle_core::Result<Tensor> {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let x2 = x.sqr()?;
    let inner = x.mul(&x2.affine(0.044715, 1.0)?)?.affine(c, 0.0)?;
    let t = inner.tanh()?;
    let dinner = x2.affine(3.0 * 0.044715 * c, c)?;
    let left = t.affine(0.5, 0.5)?;
    let right = x
        .mul(&t.sqr()?.affine(-1.0, 1.0)?)?
        .mul(&dinner)?
        .affine(0.5, 0.0)?;
    left + right
}

impl Primitive for Unary {
    fn name(&self) -> &'static str {
        match self {
            Unary::Relu => "relu",
            Unary::Gelu => "gelu",
            Unary::Silu => "silu",
            Unary::Tanh => "tanh",
            Unary::Exp => "exp",
            Unary::Log => "log",
            Unary::Sqrt => "sqrt",
            Unary::Rsqrt => "rsqrt",
            Unary::Sigmoid => "sigmoid",
            Unary::Square => "square",
            Unary::Abs => "abs",
        }
    }

    fn forward(&self, _k: &Kernel, x: &[&Tensor], _ts: &[&TType], _out: &TType) -> R<Forward> {
        let x = x[0];
        let y = match self {
            Unary::Relu => x.relu(),
            Unary::Gelu => x.gelu(),
            Unary::Silu => x.silu(),
            Unary::Tanh => x.tanh(),
            Unary::Exp => x.exp(),
            Unary::Log => x.log(),
            Unary::Sqrt => x.sqrt(),
            Unary::Rsqrt => x.sqrt().and_then(|t| t.recip()),
            Unary::Sigmoid => sigmoid(x),
            Unary::Square => x.sqr(),
            Unary::Abs => x.abs(),
        };
        Forward::of(y.map_err(ce)?)
    }

    fn vjp(&self, _k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let (x, y, ct) = (g.x[0], g.y, g.g);
        let d = match self {
            Unary::Relu => x
                .ge(0.0)
                .and_then(|m| m.to_dtype(ct.dtype()))
                .and_then(|m| ct.mul(&m)),
            Unary::Tanh => y
                .sqr()
                .and_then(|s| s.affine(-1.0, 1.0))
                .and_then(|d| ct.mul(&d)),
            Unary::Exp => ct.mul(y),
            Unary::Log => ct.div(x),
            Unary::Sqrt => ct.div(&(y * 2.0).map_err(ce)?),
            Unary::Square => ct.mul(&(x * 2.0).map_err(ce)?),
            Unary::Abs => x
                .ge(0.0)
                .and_then(|m| m.to_dtype(ct.dtype()))
                .and_then(|m| m.affine(2.0, -1.0))
                .and_then(|s| ct.mul(&s)),
            Unary::Sigmoid => y
                .affine(-1.0, 1.0)
                .and_then(|d| d.mul(y))
                .and_then(|d| ct.mul(&d)),
            Unary::Silu => {
                let s = sigmoid(x).map_err(ce)?;
                // σ(x)(1 + x(1 − σ(x)))
                s.affine(-1.0, 1.0)
                    .and_then(|d| d.mul(x))
                    .and_then(|d| d.affine(1.0, 1.0))
                    .and_then(|d| d.mul(&s))
                    .and_then(|d| ct.mul(&d))
            }
            Unary::Gelu => gelu_tanh_grad(x).and_then(|d| ct.mul(&d)),
            Unary::Rsqrt => y
                .powf(3.0)
                .and_then(|t| t.affine(-0.5, 0.0))
                .and_then(|d| ct.mul(&d)),
        };
        Ok(vec![Some(d.map_err(ce)?)])
    }

    fn cost(&self, _c: &CostCx, _ts: &[&TType], _out: &TType) -> Option<Cost> {
        Cost::free()
    }
}
