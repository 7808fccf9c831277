//! Elementwise arithmetic: `+ - * /` between tensors (NumPy broadcasting), with
//! a number on either side, and negation.
//!
//! Sharding: equal layouts pass; a split operand against a whole one stays
//! split (the whole one is sliced locally, for free); two different splits of
//! one dimension are ambiguous (E0213) unless the enclosing `let` says which
//! (the other operand is then gathered). Pending sums are linear: partial ±
//! partial (over the same axes) and partial × reduced stay partial; anything
//! else needs the reduction first (E0214).

use super::bcast_fast::Bin;
use super::cost::{CommCost, Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{axes_text, Rules};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::{BinOp, Expr, ReduceOp};
use crate::diag::Problem;
use crate::types::{Dim, Poly, TType};
use candle_core::Tensor;

pub const DEFS: &[Def] = &[
    Def {
        name: "+ - * /",
        kind: Kind::Operator,
        signature: "a + b, a - b, a * b, a / b, -a",
        rule: "NumPy broadcasting (E0209). Equal layouts pass; split against whole → split (the whole operand is sliced locally, free); split over two different axes → E0213. Pending values in `+ -`: both operands must owe the same sums (E0214); in `* /`: a partial value times (or divided by) a reduced one stays partial, two partial operands or a partial divisor is E0214",
        check: None,
        examples: &[
            "{a: f32[4, 6]} + {b: f32[4, 6]}",
            "{a: f32[4, 6]} * {b: f32[6]}",
            "{a: f32[4, 6]} - {b: f32[4, 1]}",
            "{a: f32[4, 6]} / ({b: f32[4, 6]} * {b: f32[4, 6]} + 1.0)",
            "2.0 - {a: f32[4, 6]} * 3.0 + 1.0 / ({a: f32[4, 6]} * {a: f32[4, 6]} + 1.0)",
            "-{a: f32[4, 6]} / 2.0",
        ],
        differentiable: true,
        same_on_one_device: true,
    },
];

/// An elementwise arithmetic op.
#[derive(Clone, Debug, PartialEq)]
pub enum Arith {
    /// Two tensors, broadcast.
    Binary(BinOp),
    /// A tensor and a number on its right: `x * 2.0`.
    Scalar(BinOp, f64),
    /// A number on the left: `2.0 - x`, `1.0 / x`.
    ScalarLeft(BinOp, f64),
    Neg,
}

/// The type of `t op number` (or `number op t` when `left`).
pub fn scalar_rule(
    cx: &mut dyn Rules,
    op: BinOp,
    t: &TType,
    tensor_on_right: bool,
    e: &Expr,
) -> Option<TType> {
    // Adding a constant to a partial value would add it once per device.
    if matches!(op, BinOp::Add | BinOp::Sub) && !t.pending.is_empty() {
        cx.need_reduced(t, "adding a constant", e);
        return None;
    }
    if op == BinOp::Div && tensor_on_right && !t.pending.is_empty() {
        cx.need_reduced(t, "dividing by a partial value", e);
        return None;
    }
    Some(t.clone())
}

/// The type of `x op y` for two tensors.
pub fn binary_rule(
    cx: &mut dyn Rules,
    op: BinOp,
    (x, a): (&TType, &Expr),
    (y, b): (&TType, &Expr),
    e: &Expr,
) -> Option<TType> {
    if !super::rules::same_dtype(cx, &[(x, a), (y, b)], e) {
        return None;
    }
    // Pending reductions: sums are linear, so partial ± partial (same axes) and
    // partial × reduced are fine; anything else needs the reduction first.
    let pending = match op {
        BinOp::Add | BinOp::Sub => {
            if x.pending != y.pending {
                let (bad, expr) = if x.pending.is_empty() { (y, b) } else { (x, a) };
                cx.need_reduced(
                    bad,
                    &format!(
                        "`{}` with a value that is not partial over the same axes",
                        op.symbol()
                    ),
                    expr,
                );
                return None;
            }
            if x.pending.values().any(|o| *o != ReduceOp::Sum) {
                cx.need_reduced(x, op.symbol(), a);
                return None;
            }
            x.pending.clone()
        }
        _ => {
            let both = !x.pending.is_empty() && !y.pending.is_empty();
            let nonsum = x
                .pending
                .values()
                .chain(y.pending.values())
                .any(|o| *o != ReduceOp::Sum);
            if both || nonsum || op == BinOp::Div && !y.pending.is_empty() {
                let (bad, expr) = if !y.pending.is_empty() {
                    (y, b)
                } else {
                    (x, a)
                };
                cx.need_reduced(bad, &format!("`{}`", op.symbol()), expr);
                return None;
            }
            let mut p = x.pending.clone();
            p.extend(y.pending.clone());
            p
        }
    };
    let dims = broadcast(cx, &x.dims, &y.dims, (a, x), (b, y), e)?;
    // A value cannot both be split over an axis and owe a sum over it.
    if let Some(ax) = dims
        .iter()
        .flat_map(|d| d.axes.iter())
        .find(|ax| pending.contains_key(*ax))
    {
        let (bad, expr) = if y.pending.contains_key(ax) {
            (y, b)
        } else {
            (x, a)
        };
        cx.need_reduced(
            bad,
            &format!("`{}` with a value split over `{ax}`", op.symbol()),
            expr,
        );
        return None;
    }
    Some(TType {
        dtype: x.dtype,
        dims,
        pending,
    })
}

/// NumPy broadcasting of two dim lists, with sharding: equal axes pass, a
/// sharded dim against a replicated one stays sharded (a free local slice),
/// two different shardings are ambiguous unless the enclosing `let` decides.
pub fn broadcast(
    cx: &mut dyn Rules,
    xd: &[Dim],
    yd: &[Dim],
    (a, x): (&Expr, &TType),
    (b, y): (&Expr, &TType),
    e: &Expr,
) -> Option<Vec<Dim>> {
    let r = xd.len().max(yd.len());
    let hint = cx.hint(e.span, r);
    let mut out = Vec::with_capacity(r);
    for k in 0..r {
        let dx = (k + xd.len()).checked_sub(r).map(|i| &xd[i]);
        let dy = (k + yd.len()).checked_sub(r).map(|i| &yd[i]);
        let d = match (dx, dy) {
            (Some(p), None) | (None, Some(p)) => p.clone(),
            (Some(p), Some(q)) => {
                let one = Poly::constant(1);
                let size = if p.size == q.size || q.size == one {
                    p.size.clone()
                } else if p.size == one {
                    q.size.clone()
                } else {
                    cx.report_traced(
                        Problem::Broadcast {
                            span: e.span,
                            lhs: (a.span, x.to_string()),
                            rhs: (b.span, y.to_string()),
                            detail: format!(
                                "dimension {k} is {} on the left and {} on the right",
                                p.size, q.size
                            ),
                        },
                        e,
                    );
                    return None;
                };
                let axes = if let Some(Some(want)) = hint.as_ref().map(|h| &h[k]) {
                    // The annotation decides; operands split otherwise are gathered.
                    for (d, t, ex) in [(p, x, a), (q, y, b)] {
                        for ax in d.axes.iter().filter(|ax| !want.contains(ax)) {
                            let n = cx.axis_size(ax) as f64;
                            let what = format!("all-gather over `{ax}`");
                            let to = format!("dimension {k} split over {}", axes_text(want));
                            cx.implicit(ex.span, what, t.to_string(), to, t, (n - 1.0) / n);
                        }
                    }
                    want.clone()
                } else if p.axes == q.axes || q.axes.is_empty() {
                    p.axes.clone()
                } else if p.axes.is_empty() {
                    q.axes.clone()
                } else {
                    cx.report_traced(
                        Problem::Ambiguous {
                            span: e.span,
                            lhs: (a.span, format!("split over {}", axes_text(&p.axes))),
                            rhs: (b.span, format!("split over {}", axes_text(&q.axes))),
                            detail: format!("dimension {k} is split differently on each side"),
                        },
                        e,
                    );
                    return None;
                };
                Dim { size, axes }
            }
            (None, None) => return None,
        };
        out.push(d);
    }
    if let Some(h) = &hint {
        // Axes the annotation places elsewhere leave the dims it does not annotate.
        let placed: Vec<String> = h.iter().flatten().flatten().cloned().collect();
        for k in 0..r {
            if h[k].is_some() {
                continue;
            }
            let moved: Vec<String> = out[k]
                .axes
                .iter()
                .filter(|ax| placed.contains(ax))
                .cloned()
                .collect();
            for ax in moved {
                for (dims, t, ex) in [(xd, x, a), (yd, y, b)] {
                    let Some(i) = (k + dims.len()).checked_sub(r) else {
                        continue;
                    };
                    if dims[i].axes.contains(&ax) {
                        let n = cx.axis_size(&ax) as f64;
                        cx.implicit(
                            ex.span,
                            format!("all-gather over `{ax}`"),
                            t.to_string(),
                            format!("dimension {k} whole"),
                            t,
                            (n - 1.0) / n,
                        );
                    }
                }
                out[k].axes.retain(|x| *x != ax);
            }
        }
    }
    if let Some(ax) = super::rules::twice(&out) {
        super::rules::axis_twice(cx, &ax, (x, a), (y, b), e);
        return None;
    }
    Some(out)
}

fn scalar_op(x: &Tensor, op: BinOp, c: f64, left: bool) -> R<Tensor> {
    match (op, left) {
        (BinOp::Add, _) => x.affine(1.0, c),
        (BinOp::Sub, false) => x.affine(1.0, -c),
        (BinOp::Sub, true) => x.affine(-1.0, c),
        (BinOp::Mul, _) => x.affine(c, 0.0),
        (BinOp::Div, false) => x.affine(1.0 / c, 0.0),
        (BinOp::Div, true) => x.recip().and_then(|r| r.affine(c, 0.0)),
        (BinOp::MatMul, _) => return Err("matmul by a scalar".into()),
    }
    .map_err(ce)
}

/// The gathers that bring an operand of type `t` to the layout of `out` (dims
/// aligned from the right, broadcast dims left alone), as `Kernel::align` does.
pub fn gathers(c: &CostCx, t: &TType, out: &TType) -> Vec<CommCost> {
    let off = out.rank().saturating_sub(t.rank());
    let mut v = Vec::new();
    for (i, d) in t.dims.iter().enumerate() {
        let Some(o) = out.dims.get(i + off) else {
            continue;
        };
        if d.axes == o.axes || d.size.as_const() == Some(1) && o.size.as_const() != Some(1) {
            continue;
        }
        v.extend(super::cost::gathers(c, t, &d.axes, &o.axes));
    }
    v
}

/// `a op b`, broadcast: shardc's one-pass kernel where it applies (a GPU,
/// [`super::bcast_fast`]), else candle's, with the same bits.
fn elementwise(op: Bin, a: &Tensor, b: &Tensor) -> candle_core::Result<Tensor> {
    if let Some(y) = super::bcast_fast::apply(op, a, b) {
        return y;
    }
    match op {
        Bin::Add => a.broadcast_add(b),
        Bin::Sub => a.broadcast_sub(b),
        Bin::Mul => a.broadcast_mul(b),
        Bin::Div => a.broadcast_div(b),
    }
}

impl Primitive for Arith {
    fn name(&self) -> &'static str {
        match self {
            Arith::Neg => "-",
            Arith::Binary(b) | Arith::Scalar(b, _) | Arith::ScalarLeft(b, _) => b.symbol(),
        }
    }

    fn render(&self, args: &[String]) -> String {
        match self {
            Arith::Scalar(b, c) => format!("{} {} {c}", args.join(""), b.symbol()),
            Arith::Binary(b) => args.join(&format!(" {} ", b.symbol())),
            Arith::ScalarLeft(b, c) => format!("{c} {} {}", b.symbol(), args.join("")),
            Arith::Neg => format!("-{}", args.join("")),
        }
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        Forward::of(match self {
            Arith::Scalar(op, c) => scalar_op(x[0], *op, *c, false)?,
            Arith::ScalarLeft(op, c) => scalar_op(x[0], *op, *c, true)?,
            Arith::Neg => x[0].neg().map_err(ce)?,
            Arith::Binary(op) => {
                let a = k.align(x[0], ts[0], out, None)?;
                let b = k.align(x[1], ts[1], out, None)?;
                let op = match op {
                    BinOp::Add => Bin::Add,
                    BinOp::Sub => Bin::Sub,
                    BinOp::Mul => Bin::Mul,
                    BinOp::Div => Bin::Div,
                    BinOp::MatMul => return Err("`@` is not an elementwise op".into()),
                };
                elementwise(op, &a, &b).map_err(ce)?
            }
        })
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let ct = g.g;
        Ok(match self {
            Arith::Neg => vec![Some(ct.neg().map_err(ce)?)],
            Arith::Scalar(op, c) => vec![Some(match op {
                BinOp::Mul => (ct * *c).map_err(ce)?,
                BinOp::Div => (ct / *c).map_err(ce)?,
                _ => ct.clone(),
            })],
            Arith::ScalarLeft(op, c) => {
                let x = g.x[0];
                vec![Some(match op {
                    BinOp::Sub => ct.neg().map_err(ce)?,
                    BinOp::Mul => (ct * *c).map_err(ce)?,
                    // d(c/x) = -c/x²
                    BinOp::Div => ct
                        .mul(&(x.sqr().and_then(|s| s.recip()).map_err(ce)? * (-c)).map_err(ce)?)
                        .map_err(ce)?,
                    _ => ct.clone(),
                })]
            }
            Arith::Binary(op) => {
                let x = k.align(g.x[0], g.ts[0], g.out, None)?;
                let y = k.align(g.x[1], g.ts[1], g.out, None)?;
                // A cotangent nobody wants (the other half of a split
                // backward) is not computed, nor reduced, nor resharded back.
                let back = |i: usize| -> R<Option<Tensor>> {
                    if g.want.get(i) == Some(&false) {
                        return Ok(None);
                    }
                    let d = match (op, i) {
                        (BinOp::Add, _) | (BinOp::Sub, 0) => ct.clone(),
                        (BinOp::Sub, _) => ct.neg().map_err(ce)?,
                        (BinOp::Mul, 0) => elementwise(Bin::Mul, ct, &y).map_err(ce)?,
                        (BinOp::Mul, _) => elementwise(Bin::Mul, ct, &x).map_err(ce)?,
                        (_, 0) => elementwise(Bin::Div, ct, &y).map_err(ce)?,
                        _ => ct
                            .broadcast_mul(&x)
                            .and_then(|t| t.broadcast_div(&y.sqr()?))
                            .and_then(|t| t.neg())
                            .map_err(ce)?,
                    };
                    let at = if i == 0 { &x } else { &y };
                    let d = Kernel::unbroadcast(&d, at.dims())?;
                    Ok(Some(k.align(g.x[i], g.ts[i], g.out, Some(&d))?))
                };
                vec![back(0)?, back(1)?]
            }
        })
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        let mut comms = Vec::new();
        if let Arith::Binary(_) = self {
            for t in ts {
                comms.extend(gathers(c, t, out));
            }
        }
        Some(Cost { flops: 0.0, comms })
    }
}
