//! Ops that work along one dimension (or several, for `var`): `argmax`,
//! `argmin`, `top_k`, `top_k_indices`, `cumsum` and `var`.
//!
//! Sharding: the dimension worked along must be whole on every device; a
//! split one is gathered first, and the checker reports the all-gather like
//! every other layout change. The other dimensions keep their layouts, so a
//! batch split over `dp` stays split and costs nothing. `cumsum` is linear and
//! keeps pending sums; the others need a reduced input (E0214).

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, dim_index, dim_list, int_of, known_named, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::DType;
use crate::diag::Problem;
use crate::types::{Poly, TType};
use candle_core::{DType as CDType, Tensor};

pub const DEFS: &[Def] = &[
    Def {
        name: "argmax",
        kind: Kind::Function,
        signature: "argmax(x, dim: -1)",
        rule: "index of the largest element along `dim` (the first of ties) → `i32`, `dim` removed; `dim` gathered if split; input reduced (E0214); no gradient",
        check: Some(check),
        examples: &["one_hot(argmax({x: f32[4, 6]}), 6) * {x: f32[4, 6]}", "cast(argmax({x: f32[4, 6]}, dim: 0), f32) * {y: f32[6]}"],
        differentiable: false,
        same_on_one_device: true,
    },
    Def {
        name: "argmin",
        kind: Kind::Function,
        signature: "argmin(x, dim: -1)",
        rule: "index of the smallest element; as `argmax`",
        check: Some(check),
        examples: &["one_hot(argmin({x: f32[4, 6]}), 6) * {x: f32[4, 6]}"],
        differentiable: false,
        same_on_one_device: true,
    },
    Def {
        name: "top_k",
        kind: Kind::Function,
        signature: "top_k(x, k, dim: -1)",
        rule: "the `k` largest elements along `dim`, largest first (ties: lower index first); `dim` becomes `k`, whole (gathered if split); 1 <= k <= the dim's size (E0222); input reduced (E0214); the gradient goes to the elements chosen",
        check: Some(check),
        examples: &["top_k({x: f32[4, 6]}, 2)", "top_k({x: f32[4, 6]}, 3, dim: 0)"],
        differentiable: true,
        same_on_one_device: true,
    },
    Def {
        name: "top_k_indices",
        kind: Kind::Function,
        signature: "top_k_indices(x, k, dim: -1)",
        rule: "the indices of `top_k`'s elements → `i32`; as `top_k`; no gradient",
        check: Some(check),
        examples: &["take_along_axis({x: f32[4, 6]}, top_k_indices({x: f32[4, 6]}, 2), dim: 1)"],
        differentiable: false,
        same_on_one_device: true,
    },
    Def {
        name: "cumsum",
        kind: Kind::Function,
        signature: "cumsum(x, dim: -1, reverse: false)",
        rule: "running sum along `dim` (from the end with `reverse: true`); float or integer; `dim` gathered if split; linear, so pending sums are kept",
        check: Some(check),
        examples: &["cumsum({x: f32[4, 6]})", "cumsum({x: f32[4, 6]}, dim: 0, reverse: true)", "cast(cumsum(cast(greater({x: f32[4, 6]}, 0.0), i32), dim: 0), f32) * {x: f32[4, 6]}"],
        differentiable: true,
        same_on_one_device: true,
    },
    Def {
        name: "var",
        kind: Kind::Function,
        signature: "var(x, dim)",
        rule: "variance (mean squared deviation from the mean, no correction) over the dims (an index or a list; all if omitted), removed; reduced dims gathered if split; input reduced (E0214)",
        check: Some(check),
        examples: &["var({x: f32[4, 6]}, dim: 1)", "var({x: f32[2, 4, 6]}, dim: [0, 2])"],
        differentiable: true,
        same_on_one_device: true,
    },
];

/// Which op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    ArgMax,
    ArgMin,
    TopK(usize),
    TopKIndices(usize),
    CumSum { reverse: bool },
    Var,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Along {
    pub op: Op,
    /// The dims worked along, ascending (one, but for `var`).
    pub dims: Vec<usize>,
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    let (min, max, named): (usize, usize, &[&str]) = match c.name {
        "top_k" | "top_k_indices" => (2, 2, &["dim"]),
        "cumsum" => (1, 1, &["dim", "reverse"]),
        "var" => (1, 2, &["dim"]),
        _ => (1, 1, &["dim"]),
    };
    if !arity(cx, c, min, max) || !known_named(cx, c, named) {
        return None;
    }
    let x = c.pos[0];
    let t = cx.tensor(x, &format!("`{}`", c.name))?;
    if t.rank() == 0 {
        super::rules::rank_error(cx, x, 1, &t);
        return None;
    }
    let linear = c.name == "cumsum";
    if !linear && !cx.need_reduced(&t, c.name, x) {
        return None;
    }
    if matches!(c.name, "var" | "top_k") && !super::rules::need_float(cx, &t, x) {
        return None;
    }
    let dims = if c.name == "var" {
        match c.pos.get(1).copied().or(c.named_expr("dim")) {
            None => (0..t.rank()).collect(),
            Some(d) => dim_list(cx, d, t.rank())?,
        }
    } else {
        match c.named_expr("dim") {
            None => vec![t.rank() - 1],
            Some(d) => vec![dim_index(cx, d, t.rank())?],
        }
    };
    let mut dims = dims;
    dims.sort_unstable();
    dims.dedup();
    // The dims worked along are whole (a gather, reported).
    let mut whole = t.clone();
    for &d in &dims {
        whole = super::rules::replicate_dim(cx, &whole, d, x.span);
    }
    let d0 = dims[0];
    let op = match c.name {
        "argmax" => Op::ArgMax,
        "argmin" => Op::ArgMin,
        "top_k" | "top_k_indices" => {
            let k = count(cx, c, &t, d0)?;
            if c.name == "top_k" {
                Op::TopK(k)
            } else {
                Op::TopKIndices(k)
            }
        }
        "cumsum" => Op::CumSum {
            reverse: flag(cx, c, "reverse")?,
        },
        _ => Op::Var,
    };
    let mut out = whole;
    match op {
        Op::ArgMax | Op::ArgMin | Op::Var => {
            out.dims = out
                .dims
                .into_iter()
                .enumerate()
                .filter(|(i, _)| !dims.contains(i))
                .map(|(_, d)| d)
                .collect();
            if op != Op::Var {
                out.dtype = DType::I32;
            }
        }
        Op::TopK(k) | Op::TopKIndices(k) => {
            out.dims[d0].size = Poly::constant(k as i64);
            if let Op::TopKIndices(_) = op {
                out.dtype = DType::I32;
            }
        }
        Op::CumSum { .. } => {}
    }
    Typed::new(out, Along { op, dims })
}

/// `top_k`'s `k`: a constant between 1 and the size of dim `d` (E0222).
fn count(cx: &mut dyn Rules, c: &Call, t: &TType, d: usize) -> Option<usize> {
    let e = c.pos[1];
    let k = match super::rules::expr_to_dim(e) {
        Some((de, None)) => cx.size(&de, false)?.0.as_const(),
        _ => int_of(e),
    };
    let Some(k) = k else {
        cx.report(Problem::BadDim {
            span: e.span,
            expr: "k".into(),
            reason: "`k` is a constant integer".into(),
        });
        return None;
    };
    let n = t.dims[d].size.as_const();
    if k < 1 || n.is_some_and(|n| k > n) {
        cx.report(Problem::CountRange {
            span: e.span,
            op: c.name.into(),
            count: k,
            dim: d,
            size: t.dims[d].size.to_string(),
        });
        return None;
    }
    usize::try_from(k).ok()
}

/// A named `true`/`false` argument (false when absent).
fn flag(cx: &mut dyn Rules, c: &Call, key: &str) -> Option<bool> {
    let Some(e) = c.named_expr(key) else {
        return Some(false);
    };
    match &e.kind {
        crate::ast::ExprKind::Name(n) if n == "true" => Some(true),
        crate::ast::ExprKind::Name(n) if n == "false" => Some(false),
        _ => {
            cx.report(Problem::WrongKind {
                span: e.span,
                expected: "`true` or `false`".into(),
                found: "something else".into(),
            });
            None
        }
    }
}

impl Along {
    /// The input's layout with the dims worked along whole.
    fn whole(&self, t: &TType) -> TType {
        let mut w = t.clone();
        for &d in &self.dims {
            w.dims[d].axes.clear();
        }
        w
    }
}

/// The indices of the `k` largest elements of each row along the last dim of
/// `x`, largest first, ties to the lower index (as `lax.top_k`).
fn top_k_last(x: &Tensor, k: usize) -> R<Tensor> {
    let dims = x.dims().to_vec();
    let n = *dims.last().ok_or("top_k of a scalar")?;
    let v = Kernel::f64s(x)?;
    let mut idx = Vec::with_capacity(v.len() / n.max(1) * k);
    for row in v.chunks(n.max(1)) {
        let mut order: Vec<usize> = (0..row.len()).collect();
        order.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
        idx.extend(order.into_iter().take(k).map(|i| i as i64));
    }
    let mut shape = dims;
    if let Some(last) = shape.last_mut() {
        *last = k;
    }
    Tensor::from_vec(idx, shape, x.device()).map_err(ce)
}

/// `f` applied with `dim` moved last and moved back after.
fn last_dim<F: FnOnce(&Tensor) -> R<Tensor>>(x: &Tensor, dim: usize, f: F) -> R<Tensor> {
    let r = x.rank();
    if dim + 1 == r {
        return f(x);
    }
    let moved = x
        .transpose(dim, r - 1)
        .and_then(|t| t.contiguous())
        .map_err(ce)?;
    f(&moved)?
        .transpose(dim, r - 1)
        .and_then(|t| t.contiguous())
        .map_err(ce)
}

/// Running sum along `dim` (from the end when `reverse`), in any dtype.
fn cumsum(x: &Tensor, dim: usize, reverse: bool) -> R<Tensor> {
    let dt = x.dtype();
    let f = if dt.is_float() {
        x.clone()
    } else {
        x.to_dtype(CDType::F64).map_err(ce)?
    };
    let fwd = f.cumsum(dim).map_err(ce)?;
    let y = if reverse {
        // Σ_{j≥i} x_j = total − Σ_{j≤i} x_j + x_i
        super::reduce_fast::sum_keepdim(&f, dim)
            .and_then(|s| s.broadcast_sub(&fwd))
            .and_then(|t| t.add(&f))
            .map_err(ce)?
    } else {
        fwd
    };
    if dt.is_float() {
        Ok(y)
    } else {
        y.round().and_then(|t| t.to_dtype(dt)).map_err(ce)
    }
}

impl Primitive for Along {
    fn name(&self) -> &'static str {
        match self.op {
            Op::ArgMax => "argmax",
            Op::ArgMin => "argmin",
            Op::TopK(_) => "top_k",
            Op::TopKIndices(_) => "top_k_indices",
            Op::CumSum { .. } => "cumsum",
            Op::Var => "var",
        }
    }

    fn accumulates(&self) -> bool {
        true
    }

    fn attrs(&self) -> Vec<String> {
        let mut a = Vec::new();
        if let Op::TopK(k) | Op::TopKIndices(k) = self.op {
            a.push(k.to_string());
        }
        let d: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        a.push(format!("dim: {}", d.join(", ")));
        if let Op::CumSum { reverse: true } = self.op {
            a.push("reverse: true".into());
        }
        a
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], _out: &TType) -> R<Forward> {
        let x = k.reshard(x[0], ts[0], &self.whole(ts[0]))?;
        let d = self.dims[0];
        let as_ids = |t: Tensor| t.to_dtype(CDType::I64).map_err(ce);
        Ok(match self.op {
            Op::ArgMax => Forward {
                y: as_ids(x.argmax(d).map_err(ce)?)?,
                saved: Vec::new(),
            },
            Op::ArgMin => Forward {
                y: as_ids(x.argmin(d).map_err(ce)?)?,
                saved: Vec::new(),
            },
            Op::TopK(n) | Op::TopKIndices(n) => {
                let idx = last_dim(&x, d, |x| top_k_last(x, n))?;
                if let Op::TopKIndices(_) = self.op {
                    return Forward::of(idx);
                }
                let y = x.gather(&idx, d).map_err(ce)?;
                Forward {
                    y,
                    saved: vec![idx],
                }
            }
            Op::CumSum { reverse } => Forward::of(cumsum(&x, d, reverse)?)?,
            Op::Var => {
                let n = k.global_count(ts[0], &self.dims)?;
                let dev = centred(&x, &self.dims, n)?;
                let mut s = dev.sqr().map_err(ce)?;
                for &dd in self.dims.iter().rev() {
                    s = super::reduce_fast::sum(&s, dd).map_err(ce)?;
                }
                Forward::of((s / n).map_err(ce)?)?
            }
        })
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let t = g.ts[0];
        let w = self.whole(t);
        let d = self.dims[0];
        let ct = match self.op {
            Op::ArgMax | Op::ArgMin | Op::TopKIndices(_) => return Ok(vec![None]),
            Op::TopK(_) => {
                let idx = g.saved.first().ok_or("top_k's indices were not kept")?;
                let x = k.reshard(g.x[0], t, &w)?;
                x.zeros_like()
                    .and_then(|z| z.scatter_add(idx, g.g, d))
                    .map_err(ce)?
            }
            Op::CumSum { reverse } => cumsum(g.g, d, !reverse)?,
            Op::Var => {
                let x = k.reshard(g.x[0], t, &w)?;
                let n = k.global_count(t, &self.dims)?;
                let dev = centred(&x, &self.dims, n)?;
                let mut gb = g.g.clone();
                for &dd in &self.dims {
                    gb = gb.unsqueeze(dd).map_err(ce)?;
                }
                dev.broadcast_mul(&gb)
                    .and_then(|t| t.affine(2.0 / n, 0.0))
                    .map_err(ce)?
            }
        };
        Ok(vec![Some(k.reshard_t(&ct, t, &w)?)])
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], _out: &TType) -> Option<Cost> {
        let comms = super::reshard::comms(c, ts[0], &self.whole(ts[0]));
        Some(Cost { flops: 0.0, comms })
    }
}

/// `x` minus its mean over `dims` (`n` elements).
fn centred(x: &Tensor, dims: &[usize], n: f64) -> R<Tensor> {
    let mut m = x.clone();
    for &d in dims.iter().rev() {
        m = super::reduce_fast::sum_keepdim(&m, d).map_err(ce)?;
    }
    let m = (m / n).map_err(ce)?;
    x.broadcast_sub(&m).map_err(ce)
}
