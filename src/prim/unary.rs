//! Elementwise functions of one float tensor: the layout is kept, and the input
//! must owe no reduction (a non-linear function of a partial sum is not the
//! sum of the function's values).

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, known_named, need_float, Call, Rules, Typed};
use super::unary_fast as fast;
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::types::TType;
use candle_core::Tensor;
use std::f64::consts::{FRAC_1_SQRT_2, FRAC_2_SQRT_PI};

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
    "sin" "sin({x: f32[4, 6]} * 3.0)",
    "cos" "cos({x: f32[4, 6]} * 3.0)",
    "softplus" "softplus({x: f32[4, 6]} * 4.0)",
    "log_sigmoid" "log_sigmoid({x: f32[4, 6]} * 4.0)",
    "erf" "erf({x: f32[4, 6]})",
    "gelu_exact" "gelu_exact({x: f32[4, 6]} * 2.0)",
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
    Sin,
    Cos,
    /// `log(1 + exp(x))`, computed without overflow.
    Softplus,
    /// `log(sigmoid(x)) = -softplus(-x)`.
    LogSigmoid,
    Erf,
    /// GELU with the exact normal CDF: `x * (1 + erf(x / sqrt 2)) / 2`.
    GeluExact,
}

impl Unary {
    const ALL: [Unary; 17] = [
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
        Unary::Sin,
        Unary::Cos,
        Unary::Softplus,
        Unary::LogSigmoid,
        Unary::Erf,
        Unary::GeluExact,
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

/// `max(x, 0) + log(1 + exp(-|x|))`: no overflow for large `|x|`.
fn softplus(x: &Tensor) -> candle_core::Result<Tensor> {
    let tail = x.abs()?.neg()?.exp()?.affine(1.0, 1.0)?.log()?;
    x.relu()?.add(&tail)
}

/// d/dx erf(x) = 2/√π · exp(−x²).
fn erf_grad(x: &Tensor) -> candle_core::Result<Tensor> {
    x.sqr()?.neg()?.exp()?.affine(FRAC_2_SQRT_PI, 0.0)
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

impl Unary {
    /// The function of this name, if it is one.
    pub fn named(name: &str) -> Option<Unary> {
        Unary::ALL.into_iter().find(|u| u.name() == name)
    }

    /// Its value at a number known when the file is checked (`sqrt(E)`,
    /// `1.0 / sqrt(D)`): folded there, in f64. `None` for the functions
    /// whose exact value is not a plain f64 expression (the GELUs, SiLU,
    /// erf): those take tensors only.
    pub fn fold(&self, x: f64) -> Option<f64> {
        Some(match self {
            Unary::Relu => x.max(0.0),
            Unary::Tanh => x.tanh(),
            Unary::Exp => x.exp(),
            Unary::Log => x.ln(),
            Unary::Sqrt => x.sqrt(),
            Unary::Rsqrt => 1.0 / x.sqrt(),
            Unary::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Unary::Square => x * x,
            Unary::Abs => x.abs(),
            Unary::Sin => x.sin(),
            Unary::Cos => x.cos(),
            Unary::Softplus => x.max(0.0) + (-x.abs()).exp().ln_1p(),
            Unary::LogSigmoid => -((-x).max(0.0) + (-x.abs()).exp().ln_1p()),
            Unary::Gelu | Unary::Silu | Unary::Erf | Unary::GeluExact => return None,
        })
    }

    /// The activation with a fused f32 kernel ([`fast`]), if any.
    fn fused(&self) -> Option<fast::Act> {
        match self {
            Unary::Gelu => Some(fast::Act::Gelu),
            Unary::Silu => Some(fast::Act::Silu),
            Unary::Tanh => Some(fast::Act::Tanh),
            Unary::Sigmoid => Some(fast::Act::Sigmoid),
            Unary::Exp => Some(fast::Act::Exp),
            _ => None,
        }
    }
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
            Unary::Sin => "sin",
            Unary::Cos => "cos",
            Unary::Softplus => "softplus",
            Unary::LogSigmoid => "log_sigmoid",
            Unary::Erf => "erf",
            Unary::GeluExact => "gelu_exact",
        }
    }

    fn forward(&self, _k: &Kernel, x: &[&Tensor], _ts: &[&TType], _out: &TType) -> R<Forward> {
        let x = x[0];
        if let Some(y) = self.fused().and_then(|a| fast::forward(a, x)) {
            return Forward::of(y.map_err(ce)?);
        }
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
            Unary::Sin => x.sin(),
            Unary::Cos => x.cos(),
            Unary::Softplus => softplus(x),
            Unary::LogSigmoid => x.neg().and_then(|n| softplus(&n)).and_then(|s| s.neg()),
            Unary::Erf => x.erf(),
            Unary::GeluExact => x.gelu_erf(),
        };
        Forward::of(y.map_err(ce)?)
    }

    fn vjp(&self, _k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let (x, y, ct) = (g.x[0], g.y, g.g);
        if let Some(d) = self.fused().and_then(|a| fast::backward(a, x, y, ct)) {
            return Ok(vec![Some(d.map_err(ce)?)]);
        }
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
            Unary::Sin => x.cos().and_then(|d| ct.mul(&d)),
            Unary::Cos => x.sin().and_then(|d| d.neg()).and_then(|d| ct.mul(&d)),
            Unary::Softplus => sigmoid(x).and_then(|d| ct.mul(&d)),
            // d/dx log σ(x) = 1 − σ(x) = σ(−x)
            Unary::LogSigmoid => x.neg().and_then(|n| sigmoid(&n)).and_then(|d| ct.mul(&d)),
            Unary::Erf => erf_grad(x).and_then(|d| ct.mul(&d)),
            // Φ(x) + x φ(x), Φ the normal CDF and φ its density.
            Unary::GeluExact => {
                let cdf = (x * FRAC_1_SQRT_2)
                    .and_then(|t| t.erf())
                    .and_then(|t| t.affine(0.5, 0.5));
                let pdf = x
                    .sqr()
                    .and_then(|t| t.affine(-0.5, 0.0))
                    .and_then(|t| t.exp())
                    .and_then(|t| t.affine(FRAC_2_SQRT_PI * FRAC_1_SQRT_2 * 0.5, 0.0));
                cdf.and_then(|c| x.mul(&pdf?)?.add(&c))
                    .and_then(|d| ct.mul(&d))
            }
        };
        Ok(vec![Some(d.map_err(ce)?)])
    }

    fn cost(&self, _c: &CostCx, _ts: &[&TType], _out: &TType) -> Option<Cost> {
        Cost::free()
    }
}
