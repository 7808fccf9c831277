//! Values made or widened without arithmetic: `arange(N)` (the integers
//! 0..N, for positions), `broadcast_to(x, [dims])` (NumPy broadcasting to a
//! shape) and `repeat(x, n, dim)` (each element repeated `n` times along a
//! dim, as `jnp.repeat` does: grouped-query attention's K/V heads).
//!
//! Sharding: `arange`'s dim and the dims `broadcast_to` adds may carry a
//! sharding in the size (`arange(T@sp)`, `[B@dp, H, T]`): each device makes
//! its own window, with no communication. `repeat` keeps a split dim split
//! (each device's block repeats into its block of the result). Both
//! `broadcast_to` and `repeat` are linear: pending sums are kept.

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{
    arity, dim_index, expr_to_dim, int_of, known_named, written_axes, Call, Rules, Typed,
};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::{self, DType, ExprKind, ListItem};
use crate::diag::Problem;
use crate::source::Span;
use crate::types::{Dim, Poly, TType};
use candle_core::{DType as CDType, Tensor};

pub const DEFS: &[Def] = &[
    Def {
        name: "arange",
        kind: Kind::Function,
        signature: "arange(N)",
        rule: "`i32[N]` holding 0, 1, ..., N-1; `N` may carry a sharding (`arange(T@sp)`: each device makes its window), divisible by its axes (E0203); no gradient",
        check: Some(arange),
        examples: &[
            "cast(arange(6), f32) * {x: f32[4, 6]}",
            "cast(arange(4), f32) * {x: f32[6, 4]}",
        ],
        differentiable: false,
        same_on_one_device: true,
    },
    Def {
        name: "broadcast_to",
        kind: Kind::Function,
        signature: "broadcast_to(x, [dims])",
        rule: "NumPy broadcasting to the shape (dims aligned from the right; each of `x`'s is equal or 1, E0209); kept dims keep their layout, added or widened dims take the sharding written on them (a free local window); pending sums kept",
        check: Some(broadcast_to),
        examples: &[
            "broadcast_to({x: f32[6]}, [4, 6])",
            "broadcast_to({x: f32[4, 1]}, [2, 4, 6])",
        ],
        differentiable: true,
        same_on_one_device: true,
    },
    Def {
        name: "repeat",
        kind: Kind::Function,
        signature: "repeat(x, n, dim: 0)",
        rule: "each element repeated `n` times along `dim` (`[a, b]` → `[a, a, b, b]`); a split `dim` stays split (local); pending sums kept",
        check: Some(repeat),
        examples: &[
            "repeat({x: f32[4, 6]}, 2)",
            "repeat({x: f32[2, 4, 6]}, 3, dim: 1)",
        ],
        differentiable: true,
        same_on_one_device: true,
    },
];

#[derive(Clone, Debug, PartialEq)]
pub enum Create {
    Arange,
    BroadcastTo,
    Repeat { n: usize, dim: usize },
}

fn arange(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 1, 1) || !known_named(cx, c, &[]) {
        return None;
    }
    let d = super::rules::sized(cx, c.pos[0], "the dimension of `arange`")?;
    let out = TType {
        dtype: DType::I32,
        dims: vec![d],
        pending: Default::default(),
    };
    Typed::new(out, Create::Arange)
}

/// The target dims of `broadcast_to`, with their span and written axes.
fn target(cx: &mut dyn Rules, e: &ast::Expr) -> Option<Vec<(Dim, bool, Span)>> {
    let ExprKind::List(items) = &e.kind else {
        cx.report(Problem::WrongKind {
            span: e.span,
            expected: "a list of dimensions like `[B, T, D]`".into(),
            found: "an expression".into(),
        });
        return None;
    };
    let mut out = Vec::new();
    for it in items {
        let ListItem::Dim(ast::DimSpec::Dim { size, axes, span }) = it else {
            let span = match it {
                ListItem::Dim(d) => d.span(),
                ListItem::Expr(x) => x.span,
            };
            cx.report(Problem::WrongKind {
                span,
                expected: "a dimension size".into(),
                found: "an expression".into(),
            });
            return None;
        };
        let (v, layer_axes) = cx.size(size, true)?;
        let v = v.substitute(&cx.tyvars()).unwrap_or(v);
        let written = axes.is_some() || layer_axes.is_some();
        let ax = written_axes(cx, layer_axes, axes.as_deref())?;
        let d = Dim { size: v, axes: ax };
        if !cx.check_dim(&d, *span, "a dimension of `broadcast_to`") {
            return None;
        }
        out.push((d, written, *span));
    }
    Some(out)
}

fn broadcast_to(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) || !known_named(cx, c, &[]) {
        return None;
    }
    let t = cx.tensor(c.pos[0], "`broadcast_to`")?;
    let want = target(cx, c.pos[1])?;
    let off = want.len().checked_sub(t.rank());
    let one = Poly::constant(1);
    let fits = off.is_some_and(|off| {
        t.dims
            .iter()
            .zip(&want[off..])
            .all(|(d, (w, _, _))| d.size == w.size || d.size == one)
    });
    let Some(off) = off.filter(|_| fits) else {
        let to: Vec<String> = want.iter().map(|(d, _, _)| d.size.to_string()).collect();
        cx.report_traced(
            Problem::Broadcast {
                span: c.span(),
                lhs: (c.pos[0].span, t.to_string()),
                rhs: (c.pos[1].span, format!("[{}]", to.join(", "))),
                detail: "each dimension of the value must equal the target's or be 1".into(),
            },
            c.pos[0],
        );
        return None;
    };
    // Kept dims keep their layout unless the target writes another (a reshard).
    let mut moves = vec![None; t.rank()];
    for (i, d) in t.dims.iter().enumerate() {
        let (w, written, _) = &want[i + off];
        if d.size == w.size && *written && w.axes != d.axes {
            moves[i] = Some(w.axes.clone());
        }
    }
    let t = if moves.iter().any(Option::is_some) {
        cx.reshard(&t, &moves, &t.pending, c.pos[0].span)
    } else {
        t
    };
    let mut dims = Vec::new();
    for (j, (w, _, _)) in want.iter().enumerate() {
        let kept = j
            .checked_sub(off)
            .map(|i| &t.dims[i])
            .filter(|d| d.size == w.size);
        dims.push(match kept {
            Some(d) => d.clone(),
            None => w.clone(),
        });
    }
    let out = TType {
        dtype: t.dtype,
        dims: dims.clone(),
        pending: t.pending.clone(),
    };
    if let Some(ax) = super::rules::twice(&dims) {
        let at = want
            .iter()
            .find(|(d, _, _)| d.axes.contains(&ax))
            .map(|w| w.2);
        cx.report(Problem::AxisTwice {
            span: at.unwrap_or(c.pos[1].span),
            axis: ax,
            first: c.pos[0].span,
            ty: out.to_string(),
        });
        return None;
    }
    if let Some(ax) = super::rules::split_and_pending(&dims, &t.pending) {
        let what = format!("`broadcast_to` splitting a dim over `{ax}`, which it owes a sum over");
        cx.need_reduced(&t, &what, c.pos[0]);
        return None;
    }
    Typed::new(out, Create::BroadcastTo)
}

fn repeat(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) || !known_named(cx, c, &["dim"]) {
        return None;
    }
    let t = cx.tensor(c.pos[0], "`repeat`")?;
    if t.rank() == 0 {
        super::rules::rank_error(cx, c.pos[0], 1, &t);
        return None;
    }
    let n = match expr_to_dim(c.pos[1]) {
        Some((de, None)) => cx.size(&de, false)?.0.as_const(),
        _ => int_of(c.pos[1]),
    };
    let Some(n) = n.filter(|n| *n >= 1) else {
        cx.report(Problem::BadDim {
            span: c.pos[1].span,
            expr: "n".into(),
            reason: "the repeat count is a positive constant integer".into(),
        });
        return None;
    };
    let dim = match c.named_expr("dim") {
        Some(d) => dim_index(cx, d, t.rank())?,
        None => 0,
    };
    let mut out = t.clone();
    out.dims[dim].size = out.dims[dim].size.mul(&Poly::constant(n))?;
    Typed::new(out, Create::Repeat { n: n as usize, dim })
}

impl Primitive for Create {
    fn name(&self) -> &'static str {
        match self {
            Create::Arange => "arange",
            Create::BroadcastTo => "broadcast_to",
            Create::Repeat { .. } => "repeat",
        }
    }

    fn attrs(&self) -> Vec<String> {
        match self {
            Create::Repeat { n, dim } => vec![n.to_string(), format!("dim: {dim}")],
            _ => vec![],
        }
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        Forward::of(match self {
            Create::Arange => {
                let d = out.dims.first().ok_or("arange of a scalar")?;
                let n = *k.local_shape(out)?.first().ok_or("arange of a scalar")?;
                let (idx, _) = k.topo().shard_index(k.rank, &d.axes);
                let off = (idx * n) as i64;
                Tensor::arange(off, off + n as i64, k.dev)
                    .and_then(|t| t.to_dtype(CDType::I64))
                    .map_err(ce)?
            }
            Create::BroadcastTo => {
                let shape = k.local_shape(out)?;
                k.align(x[0], ts[0], out, None)?
                    .broadcast_as(shape.as_slice())
                    .and_then(|t| t.contiguous())
                    .map_err(ce)?
            }
            Create::Repeat { n, dim } => {
                let x = x[0];
                let mut shape = x.dims().to_vec();
                let mut wide = shape.clone();
                wide.insert(dim + 1, *n);
                shape[*dim] *= n;
                x.unsqueeze(dim + 1)
                    .and_then(|t| t.broadcast_as(wide.as_slice()))
                    .and_then(|t| t.contiguous())
                    .and_then(|t| t.reshape(shape.as_slice()))
                    .map_err(ce)?
            }
        })
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        Ok(match self {
            Create::Arange => vec![],
            Create::BroadcastTo => {
                let aligned = k.align(g.x[0], g.ts[0], g.out, None)?;
                let d = Kernel::unbroadcast(g.g, aligned.dims())?;
                vec![Some(k.align(g.x[0], g.ts[0], g.out, Some(&d))?)]
            }
            Create::Repeat { n, dim } => {
                let mut wide = g.x[0].dims().to_vec();
                wide.insert(dim + 1, *n);
                let d =
                    g.g.contiguous()
                        .and_then(|t| t.reshape(wide.as_slice()))
                        .and_then(|t| super::reduce_fast::sum(&t, dim + 1))
                        .map_err(ce)?;
                vec![Some(d)]
            }
        })
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        let comms = match self {
            Create::BroadcastTo => super::arith::gathers(c, ts[0], out),
            _ => vec![],
        };
        Some(Cost { flops: 0.0, comms })
    }
}
