//! Elementwise functions of several operands, each a tensor or a number:
//! `maximum`, `minimum`, the comparisons (`greater`, `less`, `equal`, ...),
//! `where(cond, a, b)`, `clamp(x, lo, hi)` and `pow(x, p)`.
//!
//! Sharding: the tensors broadcast with one another as `+` does (equal
//! layouts pass, a split dim against a whole one stays split, two different
//! splits are E0213 unless the `let` says which). None of these is linear, so
//! every tensor operand must owe no reduction (E0214). Comparisons give
//! `bool` (held as 0/1 integers), which `where` selects with, `cast` turns into
//! numbers, and no gradient flows through.

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, known_named, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::{DType, Expr};
use crate::diag::Problem;
use crate::types::TType;
use candle_core::{DType as CDType, Tensor};

macro_rules! defs {
    ($($name:literal $sig:literal $rule:literal [$($ex:literal),*] $diff:literal,)*) => {
        pub const DEFS: &[Def] = &[$(Def {
            name: $name,
            kind: Kind::Function,
            signature: $sig,
            rule: $rule,
            check: Some(check),
            examples: &[$($ex),*],
            differentiable: $diff,
            same_on_one_device: true,
        },)*];
    };
}

defs! {
    "maximum" "maximum(a, b)" "elementwise larger of two tensors (or a tensor and a number: a literal, or sizes and constants that fold, `C * 0.5`, `1.0 / sqrt(D)`), broadcast as `+` (E0209, E0213); operands reduced (E0214); a tie sends half the gradient to each side"
        ["maximum({a: f32[4, 6]}, {b: f32[4, 6]})", "maximum({a: f32[4, 6]}, {b: f32[6]})", "maximum({a: f32[4, 6]}, 0.1)"] true,
    "minimum" "minimum(a, b)" "elementwise smaller; as `maximum`"
        ["minimum({a: f32[4, 6]}, {b: f32[4, 1]})", "minimum(0.2, {a: f32[4, 6]})"] true,
    "clamp" "clamp(x, lo, hi)" "`x` limited to [lo, hi] (numbers or tensors, broadcast as `+`); operands reduced (E0214); the gradient flows where `lo <= x <= hi`"
        ["clamp({x: f32[4, 6]}, -0.3, 0.4)"] true,
    "pow" "pow(x, p)" "`x` to the power `p` (a number, or a tensor broadcast as `+`); operands reduced (E0214); a non-integer power of a negative number is NaN"
        ["pow({x: f32[4, 6]} * {x: f32[4, 6]} + 1.0, 1.5)", "pow({x: f32[4, 6]}, 3)", "pow({x: f32[4, 6]} * {x: f32[4, 6]} + 1.0, {y: f32[6]})"] true,
    "greater" "greater(a, b)" "`a > b` elementwise → `bool`, broadcast as `+`; operands of one dtype (E0210), reduced (E0214); no gradient"
        ["cast(greater({a: f32[4, 6]}, {b: f32[6]}), f32) * {a: f32[4, 6]}"] false,
    "greater_equal" "greater_equal(a, b)" "`a >= b`; as `greater`"
        ["cast(greater_equal({a: f32[4, 6]}, 0.0), f32) * {a: f32[4, 6]}"] false,
    "less" "less(a, b)" "`a < b`; as `greater`"
        ["cast(less({ids: i32[4]}, 2), f32) * {a: f32[6, 4]}"] false,
    "less_equal" "less_equal(a, b)" "`a <= b`; as `greater`"
        ["cast(less_equal({a: f32[4, 6]}, {b: f32[4, 6]}), f32) * {a: f32[4, 6]}"] false,
    "equal" "equal(a, b)" "`a == b`; as `greater`"
        ["cast(equal({ids: i32[4]}, 1), f32) * {a: f32[6, 4]}"] false,
    "not_equal" "not_equal(a, b)" "`a != b`; as `greater`"
        ["cast(not_equal({ids: i32[4]}, 1), f32) * {a: f32[6, 4]}"] false,
    "where" "where(cond, a, b)" "`a` where `cond` holds, else `b`: `cond` a `bool` or integer tensor, `a` and `b` tensors of one dtype or numbers, all broadcast as `+`; `a` and `b` reduced (E0214); the gradient goes to the side chosen"
        ["where(greater({a: f32[4, 6]}, 0.0), {a: f32[4, 6]}, {b: f32[6]} * 2.0)", "where(less({ids: i32[4]}, 2), {a: f32[6, 4]}, 0.0)"] true,
}

/// Which function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fun {
    Maximum,
    Minimum,
    Clamp,
    Pow,
    Greater,
    GreaterEqual,
    Less,
    LessEqual,
    Equal,
    NotEqual,
    Where,
}

impl Fun {
    const ALL: [(Fun, &'static str, usize); 11] = [
        (Fun::Maximum, "maximum", 2),
        (Fun::Minimum, "minimum", 2),
        (Fun::Clamp, "clamp", 3),
        (Fun::Pow, "pow", 2),
        (Fun::Greater, "greater", 2),
        (Fun::GreaterEqual, "greater_equal", 2),
        (Fun::Less, "less", 2),
        (Fun::LessEqual, "less_equal", 2),
        (Fun::Equal, "equal", 2),
        (Fun::NotEqual, "not_equal", 2),
        (Fun::Where, "where", 3),
    ];

    fn name(self) -> &'static str {
        Fun::ALL.iter().find(|f| f.0 == self).map_or("?", |f| f.1)
    }

    fn compares(self) -> bool {
        matches!(
            self,
            Fun::Greater
                | Fun::GreaterEqual
                | Fun::Less
                | Fun::LessEqual
                | Fun::Equal
                | Fun::NotEqual
        )
    }
}

/// An argument: the next tensor operand, or a number written in the call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    Tensor,
    Number(f64),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Elementwise {
    pub f: Fun,
    pub args: Vec<Arg>,
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    let &(f, _, n) = Fun::ALL.iter().find(|x| x.1 == c.name)?;
    if !arity(cx, c, n, n) || !known_named(cx, c, &[]) {
        return None;
    }
    let mut args = Vec::new();
    let mut tensors: Vec<(TType, &Expr)> = Vec::new();
    for (i, x) in c.pos.iter().enumerate() {
        if let Some(v) = cx.number(x) {
            args.push(Arg::Number(v));
            continue;
        }
        let t = cx.tensor(x, &format!("`{}`", c.name))?;
        let is_cond = f == Fun::Where && i == 0;
        if is_cond && t.dtype.is_float() {
            cx.report(Problem::DType {
                span: x.span,
                expected: "bool (a comparison) or an integer dtype".into(),
                found: t.dtype.name().into(),
                other: None,
            });
            return None;
        }
        if !cx.need_reduced(&t, c.name, x) {
            return None;
        }
        args.push(Arg::Tensor);
        tensors.push((t, x));
    }
    let Some((first, fx)) = tensors.first().cloned() else {
        cx.report(Problem::WrongKind {
            span: c.span(),
            expected: format!("at least one tensor argument to `{}`", c.name),
            found: "numbers only".into(),
        });
        return None;
    };
    // Operands that must share a dtype (a `where`'s condition need not).
    let values: Vec<(&TType, &Expr)> = tensors
        .iter()
        .zip(
            c.pos
                .iter()
                .enumerate()
                .filter(|(_, x)| cx.number(x).is_none()),
        )
        .filter(|(_, (i, _))| !(f == Fun::Where && *i == 0))
        .map(|((t, x), _)| (t, *x))
        .collect();
    if !super::rules::same_dtype(cx, &values, c.expr) {
        return None;
    }
    if matches!(f, Fun::Pow) && !super::rules::need_float(cx, &first, fx) {
        return None;
    }
    // Broadcast every tensor with the ones before it.
    let mut acc = first.clone();
    let mut acc_expr = fx;
    for (t, x) in &tensors[1..] {
        let dims =
            super::arith::broadcast(cx, &acc.dims, &t.dims, (acc_expr, &acc), (x, t), c.expr)?;
        acc = TType {
            dtype: acc.dtype,
            dims,
            pending: acc.pending.clone(),
        };
        acc_expr = c.expr;
    }
    acc.dtype = if f.compares() {
        DType::Bool
    } else if let Some((t, _)) = values.first() {
        t.dtype
    } else {
        DType::F32
    };
    Typed::new(acc, Elementwise { f, args })
}

impl Elementwise {
    /// Every argument on this device, in the result's local shape.
    fn operands(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Vec<Tensor>> {
        let shape = k.local_shape(out)?;
        // Numbers take the dtype of the values they meet (the condition's is not one).
        let value_dtype = x
            .iter()
            .zip(self.tensor_positions())
            .find(|(_, i)| !(self.f == Fun::Where && *i == 0))
            .map_or(k.dtype, |(t, _)| t.dtype());
        let mut it = x.iter().zip(ts);
        self.args
            .iter()
            .map(|a| match a {
                Arg::Number(v) => Tensor::new(*v, k.dev)
                    .and_then(|t| t.to_dtype(value_dtype))
                    .and_then(|t| t.broadcast_as(shape.as_slice()))
                    .map_err(ce),
                Arg::Tensor => {
                    let (x, t) = it.next().ok_or("an operand is missing")?;
                    k.align(x, t, out, None)?
                        .broadcast_as(shape.as_slice())
                        .map_err(ce)
                }
            })
            .collect()
    }

    /// The argument positions the tensor operands fill.
    fn tensor_positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.args
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Arg::Tensor))
            .map(|(i, _)| i)
    }
}

/// A 0/1 mask in dtype `dt`.
fn mask(m: candle_core::Result<Tensor>, dt: CDType) -> candle_core::Result<Tensor> {
    m?.to_dtype(dt)
}

impl Primitive for Elementwise {
    fn name(&self) -> &'static str {
        self.f.name()
    }

    fn render(&self, args: &[String]) -> String {
        let mut it = args.iter();
        let a: Vec<String> = self
            .args
            .iter()
            .map(|a| match a {
                Arg::Number(v) => v.to_string(),
                Arg::Tensor => it.next().cloned().unwrap_or_default(),
            })
            .collect();
        format!("{}({})", self.name(), a.join(", "))
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        let v = self.operands(k, x, ts, out)?;
        let y = match self.f {
            Fun::Maximum => v[0].maximum(&v[1]),
            Fun::Minimum => v[0].minimum(&v[1]),
            Fun::Clamp => v[0].maximum(&v[1]).and_then(|t| t.minimum(&v[2])),
            Fun::Pow => pow(&v[0], &v[1]),
            Fun::Greater => v[0].gt(&v[1]),
            Fun::GreaterEqual => v[0].ge(&v[1]),
            Fun::Less => v[0].lt(&v[1]),
            Fun::LessEqual => v[0].le(&v[1]),
            Fun::Equal => v[0].eq(&v[1]),
            Fun::NotEqual => v[0].ne(&v[1]),
            Fun::Where => v[0].ne(0.0).and_then(|c| c.where_cond(&v[1], &v[2])),
        }
        .map_err(ce)?;
        let y = if self.f.compares() {
            y.to_dtype(CDType::I64).map_err(ce)?
        } else {
            y
        };
        Forward::of(y)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        if self.f.compares() {
            return Ok(vec![None; g.x.len()]);
        }
        let v = self.operands(k, g.x, g.ts, g.out)?;
        let ct = g.g;
        let dt = ct.dtype();
        // The cotangent of each argument, in the result's local shape.
        let per_arg: Vec<Option<Tensor>> = match self.f {
            Fun::Maximum | Fun::Minimum => {
                let (win, tie) = if self.f == Fun::Maximum {
                    (v[0].gt(&v[1]), v[0].eq(&v[1]))
                } else {
                    (v[0].lt(&v[1]), v[0].eq(&v[1]))
                };
                let w = mask(win, dt)
                    .and_then(|w| w.add(&mask(tie, dt)?.affine(0.5, 0.0)?))
                    .map_err(ce)?;
                let a = ct.mul(&w).map_err(ce)?;
                let b = ct.sub(&a).map_err(ce)?;
                vec![Some(a), Some(b)]
            }
            Fun::Clamp => {
                let inside = mask(v[0].ge(&v[1]), dt)
                    .and_then(|a| a.mul(&mask(v[0].le(&v[2]), dt)?))
                    .map_err(ce)?;
                let below = mask(v[0].lt(&v[1]), dt).map_err(ce)?;
                let above = mask(v[0].gt(&v[2]), dt).map_err(ce)?;
                vec![
                    Some(ct.mul(&inside).map_err(ce)?),
                    Some(ct.mul(&below).map_err(ce)?),
                    Some(ct.mul(&above).map_err(ce)?),
                ]
            }
            Fun::Pow => {
                // d/dx x^p = p x^(p-1); d/dp x^p = x^p log x.
                let dx = pow(&v[0], &v[1].affine(1.0, -1.0).map_err(ce)?)
                    .and_then(|t| t.mul(&v[1]))
                    .and_then(|t| t.mul(ct))
                    .map_err(ce)?;
                let dp = match self.args[1] {
                    Arg::Number(_) => None,
                    Arg::Tensor => Some(
                        v[0].log()
                            .and_then(|l| l.mul(g.y))
                            .and_then(|t| t.mul(ct))
                            .map_err(ce)?,
                    ),
                };
                vec![Some(dx), dp]
            }
            Fun::Where => {
                let c = mask(v[0].ne(0.0), dt).map_err(ce)?;
                let a = ct.mul(&c).map_err(ce)?;
                let b = ct.sub(&a).map_err(ce)?;
                vec![None, Some(a), Some(b)]
            }
            _ => return Ok(vec![None; g.x.len()]),
        };
        // Keep the tensor operands' cotangents, summed back to their layouts.
        let mut out = Vec::new();
        for ((xi, ti), pos) in g.x.iter().zip(g.ts).zip(self.tensor_positions()) {
            let d = match per_arg.get(pos).cloned().flatten() {
                Some(d) if ti.dtype.is_float() => {
                    let aligned = k.align(xi, ti, g.out, None)?;
                    let d = Kernel::unbroadcast(&d, aligned.dims())?;
                    Some(k.align(xi, ti, g.out, Some(&d))?)
                }
                _ => None,
            };
            out.push(d);
        }
        Ok(out)
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        let comms = ts
            .iter()
            .flat_map(|t| super::arith::gathers(c, t, out))
            .collect();
        Some(Cost { flops: 0.0, comms })
    }
}

/// `x^p` elementwise (`exp(p log x)`, with integer powers of negative numbers
/// exact through their sign).
fn pow(x: &Tensor, p: &Tensor) -> candle_core::Result<Tensor> {
    // |x|^p, then the sign for odd integer powers.
    let mag = x.abs()?.log()?.mul(p)?.exp()?;
    let pv = p.to_dtype(CDType::F64)?;
    let is_int = pv.eq(&pv.round()?)?;
    let odd = pv
        .affine(0.5, 0.0)?
        .ne(&pv.affine(0.5, 0.0)?.floor()?)?
        .to_dtype(x.dtype())?;
    let neg = x.lt(0.0)?.to_dtype(x.dtype())?;
    // Sign −1 where x < 0 and p odd; NaN where x < 0 and p not an integer.
    let sign = neg.mul(&odd)?.affine(-2.0, 1.0)?;
    let nan = Tensor::new(f64::NAN, x.device())?
        .to_dtype(x.dtype())?
        .broadcast_as(x.shape())?;
    let bad = neg.mul(&is_int.to_dtype(x.dtype())?.affine(-1.0, 1.0)?)?;
    let y = mag.mul(&sign)?;
    bad.ne(0.0)?.where_cond(&nan, &y)
}
