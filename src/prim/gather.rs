//! Indexed reads and writes along one dimension: `take_along_axis(x, idx,
//! dim)` reads `x` at integer indices, `scatter_add(x, idx, updates, dim)` adds
//! `updates` into `x` at them (each the other's transpose).
//!
//! Sharding: the dimension indexed into must be whole on every device, so a
//! split one is gathered (reported). `take_along_axis`'s indices may be split
//! along it (each device reads its own rows of the whole dimension); a
//! `scatter_add`'s indices and updates are whole along it (every device adds
//! every update). The other dimensions combine their layouts as `+` does.
//! Both are linear in the values indexed: pending sums pass through (a
//! `scatter_add`'s `x` and `updates` must owe the same ones).
//!
//! An index outside the dimension is not clamped or wrapped: the run stops
//! with an error naming the op's line.

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, axes_text, dim_index, known_named, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::Expr;
use crate::diag::Problem;
use crate::types::TType;
use candle_core::{DType as CDType, Tensor};

pub const DEFS: &[Def] = &[
    Def {
        name: "take_along_axis",
        kind: Kind::Function,
        signature: "take_along_axis(x, idx, dim: -1)",
        rule: "`x` read at integer `idx` along `dim` (`idx` of `x`'s rank, equal sizes off `dim`, E0212); result shaped and split like `idx` along `dim`; `x`'s `dim` gathered if split; other dims combine as `+` (E0213); pending sums kept; an index out of range stops the run",
        check: Some(check),
        examples: &[
            "take_along_axis({x: f32[4, 6]}, {ids: i32[4, 3]}, dim: 1)",
            "take_along_axis({x: f32[4, 6]}, {ids: i32[2, 6]}, dim: 0)",
        ],
        differentiable: true,
        same_on_one_device: true,
    },
    Def {
        name: "scatter_add",
        kind: Kind::Function,
        signature: "scatter_add(x, idx, updates, dim: -1)",
        rule: "`x` with `updates` added at integer `idx` along `dim` (`idx` and `updates` of one shape, `x`'s rank, equal sizes off `dim`, E0212); result like `x`, whole along `dim` (all three gathered there if split); other dims combine as `+` (E0213); `x` and `updates` owe the same sums (E0214); an index out of range stops the run",
        check: Some(check),
        examples: &[
            "scatter_add({x: f32[4, 6]}, {ids: i32[4, 3]}, {u: f32[4, 3]}, dim: 1)",
            "scatter_add({x: f32[4, 6]}, {ids: i32[2, 6]}, {u: f32[2, 6]}, dim: 0)",
        ],
        differentiable: true,
        same_on_one_device: true,
    },
];

#[derive(Clone, Debug, PartialEq)]
pub enum Gather {
    /// `take_along_axis` along the dim.
    Take(usize),
    /// `scatter_add` along the dim.
    ScatterAdd(usize),
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    let scatter = c.name == "scatter_add";
    let n = if scatter { 3 } else { 2 };
    if !arity(cx, c, n, n) || !known_named(cx, c, &["dim"]) {
        return None;
    }
    let what = format!("`{}`", c.name);
    let x = cx.tensor(c.pos[0], &what)?;
    let idx = cx.tensor(c.pos[1], &what)?;
    if idx.dtype.is_float() {
        cx.report(Problem::DType {
            span: c.pos[1].span,
            expected: "an integer dtype (indices)".into(),
            found: idx.dtype.name().into(),
            other: None,
        });
        return None;
    }
    if idx.rank() != x.rank() {
        super::rules::rank_error(cx, c.pos[1], x.rank(), &idx);
        return None;
    }
    let dim = match c.named_expr("dim") {
        Some(d) => dim_index(cx, d, x.rank())?,
        None if x.rank() > 0 => x.rank() - 1,
        None => {
            super::rules::rank_error(cx, c.pos[0], 1, &x);
            return None;
        }
    };
    let upd = if scatter {
        let u = cx.tensor(c.pos[2], &what)?;
        if !super::rules::same_dtype(cx, &[(&x, c.pos[0]), (&u, c.pos[2])], c.expr) {
            return None;
        }
        if u.dims
            .iter()
            .map(|d| &d.size)
            .ne(idx.dims.iter().map(|d| &d.size))
        {
            mismatch(
                cx,
                &idx,
                (&u, c.pos[2]),
                None,
                "updates and indices differ in shape",
            );
            return None;
        }
        if u.pending != x.pending {
            let (owes, at) = if u.pending.is_empty() {
                (&x, c.pos[0])
            } else {
                (&u, c.pos[2])
            };
            cx.need_reduced(owes, "`scatter_add` with values that owe other sums", at);
            return None;
        }
        Some(u)
    } else {
        None
    };
    for i in (0..x.rank()).filter(|&i| i != dim) {
        if x.dims[i].size != idx.dims[i].size {
            mismatch(
                cx,
                &x,
                (&idx, c.pos[1]),
                Some(dim),
                "sizes differ off the indexed dimension",
            );
            return None;
        }
    }
    // Other dims: the operands' layouts combined, as `+` combines them.
    let mut ops: Vec<(&TType, &Expr)> = vec![(&x, c.pos[0]), (&idx, c.pos[1])];
    if let Some(u) = &upd {
        ops.push((u, c.pos[2]));
    }
    let mut out_axes: Vec<Vec<String>> = vec![vec![]; x.rank()];
    for (i, axes) in out_axes.iter_mut().enumerate() {
        if i == dim {
            continue;
        }
        let mut from: Option<(&Vec<String>, &Expr)> = None;
        for (t, e) in &ops {
            let a = &t.dims[i].axes;
            if a.is_empty() {
                continue;
            }
            match from {
                None => from = Some((a, e)),
                Some((b, be)) if b != a => {
                    cx.report_traced(
                        Problem::Ambiguous {
                            span: c.span(),
                            lhs: (be.span, format!("split over {}", axes_text(b))),
                            rhs: (e.span, format!("split over {}", axes_text(a))),
                            detail: format!("dimension {i} is split differently in two operands"),
                        },
                        c.expr,
                    );
                    return None;
                }
                _ => {}
            }
        }
        *axes = from.map(|(a, _)| a.clone()).unwrap_or_default();
    }
    // Along `dim`: whole, except a `take_along_axis`'s indices.
    for (t, e) in &ops {
        let keeps = !scatter && std::ptr::eq(*t, &idx);
        if !keeps && !t.dims[dim].axes.is_empty() {
            super::rules::replicate_dim(cx, t, dim, e.span);
        }
    }
    let mut out = if scatter { x.clone() } else { idx.clone() };
    out.dtype = x.dtype;
    out.pending = x.pending.clone();
    for (i, d) in out.dims.iter_mut().enumerate() {
        if i != dim {
            d.axes = out_axes[i].clone();
        } else if scatter {
            d.axes.clear();
        }
    }
    if let Some(ax) = super::rules::split_and_pending(&out.dims, &out.pending) {
        cx.need_reduced(
            &x,
            &format!("indexing with values split over `{ax}`"),
            c.pos[0],
        );
        return None;
    }
    let op = if scatter {
        Gather::ScatterAdd(dim)
    } else {
        Gather::Take(dim)
    };
    Typed::new(out, op)
}

fn mismatch(
    cx: &mut dyn Rules,
    like: &TType,
    (t, e): (&TType, &Expr),
    free: Option<usize>,
    detail: &str,
) {
    let sizes: Vec<String> = like
        .dims
        .iter()
        .enumerate()
        .map(|(i, d)| {
            if Some(i) == free {
                "_".into()
            } else {
                d.size.to_string()
            }
        })
        .collect();
    cx.report(Problem::Mismatch {
        span: e.span,
        expected: format!("{}[{}]", t.dtype.name(), sizes.join(", ")),
        found: t.to_string(),
        decl: None,
        detail: detail.into(),
    });
}

impl Gather {
    fn dim(&self) -> usize {
        match self {
            Gather::Take(d) | Gather::ScatterAdd(d) => *d,
        }
    }

    /// Operand `t` as the kernel uses it: the result's layout off the indexed
    /// dim; along it whole, but for a `take_along_axis`'s indices (`keep`).
    fn target(&self, t: &TType, out: &TType, keep: bool) -> TType {
        let d = self.dim();
        let mut w = t.clone();
        for (i, (a, o)) in w.dims.iter_mut().zip(&out.dims).enumerate() {
            if i != d {
                a.axes = o.axes.clone();
            } else if !keep {
                a.axes.clear();
            }
        }
        w
    }
}

/// The indices as the kernel's index tensor, every one checked against `n`.
fn checked(idx: &Tensor, n: usize, op: &str, dim: usize) -> R<Tensor> {
    let v = Kernel::ints(idx)?;
    if let Some(bad) = v.iter().find(|&&i| i < 0 || i as u64 >= n as u64) {
        return Err(crate::fault::Fault::Data(format!(
            "`{op}`: index {bad} is outside dimension {dim}, which has {n} elements (valid: 0 to {})",
            n.saturating_sub(1)
        )));
    }
    idx.to_dtype(CDType::I64)
        .and_then(|t| t.contiguous())
        .map_err(ce)
}

impl Primitive for Gather {
    fn name(&self) -> &'static str {
        match self {
            Gather::Take(_) => "take_along_axis",
            Gather::ScatterAdd(_) => "scatter_add",
        }
    }

    fn attrs(&self) -> Vec<String> {
        vec![format!("dim: {}", self.dim())]
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        let d = self.dim();
        let xv = k.reshard(x[0], ts[0], &self.target(ts[0], out, false))?;
        let keep = matches!(self, Gather::Take(_));
        let iv = k.reshard(x[1], ts[1], &self.target(ts[1], out, keep))?;
        let iv = checked(&iv, xv.dims()[d], self.name(), d)?;
        Forward::of(match self {
            Gather::Take(_) => xv.contiguous().and_then(|x| x.gather(&iv, d)).map_err(ce)?,
            Gather::ScatterAdd(_) => {
                let uv = k.reshard(x[2], ts[2], &self.target(ts[2], out, false))?;
                xv.contiguous()
                    .and_then(|x| x.scatter_add(&iv, &uv.contiguous()?, d))
                    .map_err(ce)?
            }
        })
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let d = self.dim();
        let keep = matches!(self, Gather::Take(_));
        let xw = self.target(g.ts[0], g.out, false);
        let iw = self.target(g.ts[1], g.out, keep);
        let iv = k.reshard(g.x[1], g.ts[1], &iw)?;
        let iv = iv
            .to_dtype(CDType::I64)
            .and_then(|t| t.contiguous())
            .map_err(ce)?;
        let ct = g.g.contiguous().map_err(ce)?;
        match self {
            Gather::Take(_) => {
                let shape = k.local_shape(&xw)?;
                let gx = Tensor::zeros(shape.as_slice(), ct.dtype(), ct.device())
                    .and_then(|z| z.scatter_add(&iv, &ct, d))
                    .map_err(ce)?;
                Ok(vec![Some(k.reshard_t(&gx, g.ts[0], &xw)?), None])
            }
            Gather::ScatterAdd(_) => {
                let uw = self.target(g.ts[2], g.out, false);
                let gu = ct.gather(&iv, d).map_err(ce)?;
                Ok(vec![
                    Some(k.reshard_t(&ct, g.ts[0], &xw)?),
                    None,
                    Some(k.reshard_t(&gu, g.ts[2], &uw)?),
                ])
            }
        }
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        let keep = matches!(self, Gather::Take(_));
        let comms = ts
            .iter()
            .enumerate()
            .flat_map(|(i, t)| super::reshard::comms(c, t, &self.target(t, out, keep && i == 1)))
            .collect();
        Some(Cost { flops: 0.0, comms })
    }
}
