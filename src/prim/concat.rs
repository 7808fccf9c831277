//! `concat(a, b, ..., dim: k)`: tensors joined along dimension `k` (default 0);
//! `stack(a, b, ..., dim: k)`: tensors of one shape joined along a new
//! dimension `k`. The joined dimension must be whole on every device (a split
//! one is gathered, and reported; a new one is whole); the other dimensions
//! follow the operands' layouts as elementwise ops do (equal layouts pass, a
//! split one against a whole one stays split, two different splits are
//! ambiguous). Operands owe the same pending sums, which the result keeps
//! (joining is linear).

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{axes_text, dim_index, known_named, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::diag::Problem;
use crate::types::{Dim, TType};
use candle_core::Tensor;

pub const DEFS: &[Def] = &[
    Def {
        name: "stack",
        kind: Kind::Function,
        signature: "stack(a, b, ..., dim: 0)",
        rule: "operands of one dtype and shape (E0212), owing the same sums (E0214), joined along a new whole dim at `dim` (0 to rank); other dims combine their layouts as `+` does (E0213)",
        check: Some(check),
        examples: &[
            "stack({a: f32[4, 6]}, {b: f32[4, 6]}, dim: 1)",
            "stack({a: f32[4, 6]}, {b: f32[4, 6]}, {c: f32[4, 6]})",
        ],
        differentiable: true,
        same_on_one_device: true,
    },
    Def {
    name: "concat",
    kind: Kind::Function,
    signature: "concat(a, b, ..., dim: 0)",
    rule: "operands of one dtype and rank, equal sizes but along `dim`, owing the same sums (E0214); `dim` gathered if split; other dims combine their layouts as `+` does (E0213)",
    check: Some(check),
    examples: &[
        "concat({a: f32[4, 6]}, {b: f32[4, 2]}, dim: 1)",
        "concat({a: f32[4, 6]}, {b: f32[2, 6]}, {c: f32[2, 6]})",
    ],
    differentiable: true,
    same_on_one_device: true,
},
];

#[derive(Clone, Debug, PartialEq)]
pub struct Concat {
    pub dim: usize,
    /// `stack`: the operands join along a new dim at `dim`.
    pub new: bool,
}

fn check(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if c.pos.is_empty() {
        super::rules::arity(cx, c, 1, usize::MAX);
        return None;
    }
    if !known_named(cx, c, &["dim"]) {
        return None;
    }
    let stack = c.name == "stack";
    let mut ops = Vec::new();
    for x in &c.pos {
        ops.push((cx.tensor(x, &format!("`{}`", c.name))?, *x));
    }
    let typed: Vec<(&TType, &crate::ast::Expr)> = ops.iter().map(|(t, x)| (t, *x)).collect();
    if !super::rules::same_dtype(cx, &typed, c.expr) {
        return None;
    }
    let (first, fx) = ops[0].clone();
    // A stack is a concatenation of the operands with a new dim of size 1.
    let rank = first.rank() + usize::from(stack);
    let dim = match c.named_expr("dim") {
        Some(d) => dim_index(cx, d, rank)?,
        None if rank > 0 => 0,
        None => {
            super::rules::rank_error(cx, fx, 1, &first);
            return None;
        }
    };
    if stack {
        for (t, x) in ops.iter_mut() {
            if t.rank() + 1 != rank {
                super::rules::rank_error(cx, x, rank - 1, t);
                return None;
            }
            t.dims
                .insert(dim, Dim::replicated(crate::types::Poly::constant(1)));
        }
    }
    let (first, fx) = ops[0].clone();
    let mut dims: Vec<Dim> = first.dims.clone();
    for (t, x) in &ops[1..] {
        if t.pending != first.pending {
            let (owes, at) = if t.pending.is_empty() {
                (&first, fx)
            } else {
                (t, *x)
            };
            cx.need_reduced(owes, "`concat` with values that owe other sums", at);
            return None;
        }
        if t.rank() != first.rank() {
            super::rules::rank_error(cx, x, first.rank(), t);
            return None;
        }
        let same_sizes = t
            .dims
            .iter()
            .zip(&first.dims)
            .enumerate()
            .all(|(i, (a, b))| i == dim || a.size == b.size);
        if !same_sizes {
            // The expected shape, any size along the joined dimension.
            let sizes: Vec<String> = first
                .dims
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    if i == dim {
                        "_".into()
                    } else {
                        d.size.to_string()
                    }
                })
                .collect();
            let detail = if stack {
                "stacked values differ in shape".to_string()
            } else {
                format!("concatenated values differ in size off dimension {dim}")
            };
            cx.report(Problem::Mismatch {
                span: x.span,
                expected: format!("{}[{}]", first.dtype.name(), sizes.join(", ")),
                found: t.to_string(),
                decl: None,
                detail,
            });
            return None;
        }
        for (i, (d, o)) in dims.iter_mut().zip(&t.dims).enumerate() {
            if i == dim {
                d.size = d.size.add(&o.size)?;
            } else if d.axes.is_empty() {
                d.axes = o.axes.clone();
            } else if !o.axes.is_empty() && o.axes != d.axes {
                cx.report_traced(
                    Problem::Ambiguous {
                        span: c.span(),
                        lhs: (fx.span, format!("split over {}", axes_text(&d.axes))),
                        rhs: (x.span, format!("split over {}", axes_text(&o.axes))),
                        detail: format!("dimension {i} is split differently in two operands"),
                    },
                    c.expr,
                );
                return None;
            }
        }
    }
    // The joined dimension is whole; gathering a split one is reported.
    for (t, x) in &ops {
        if !t.dims[dim].axes.is_empty() {
            super::rules::replicate_dim(cx, t, dim, x.span);
        }
    }
    dims[dim].axes.clear();
    if let Some(ax) = super::rules::twice(&dims) {
        // Operands split over one axis on two different dims.
        let on = |t: &TType| t.dims.iter().any(|d| d.axes.contains(&ax));
        let (x, a) = ops.iter().find(|(t, _)| on(t)).unwrap_or(&ops[0]);
        let (y, b) = ops.iter().rev().find(|(t, _)| on(t)).unwrap_or(&ops[0]);
        super::rules::axis_twice(cx, &ax, (x, a), (y, b), c.expr);
        return None;
    }
    let out = TType {
        dtype: first.dtype,
        dims,
        pending: first.pending.clone(),
    };
    Typed::new(out, Concat { dim, new: stack })
}

impl Concat {
    /// Operand `t` in the result's layout (its own size along the joined dim;
    /// without the new dim, for a stack).
    fn target(&self, t: &TType, out: &TType) -> TType {
        let mut w = t.clone();
        let outer = out
            .dims
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.new || *i != self.dim)
            .map(|(_, o)| o);
        for (d, o) in w.dims.iter_mut().zip(outer) {
            d.axes = o.axes.clone();
        }
        w
    }
}

impl Primitive for Concat {
    fn name(&self) -> &'static str {
        if self.new {
            "stack"
        } else {
            "concat"
        }
    }

    fn attrs(&self) -> Vec<String> {
        vec![format!("dim: {}", self.dim)]
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], out: &TType) -> R<Forward> {
        let parts: Vec<Tensor> = x
            .iter()
            .zip(ts)
            .map(|(x, t)| k.reshard(x, t, &self.target(t, out)))
            .collect::<R<_>>()?;
        if self.new {
            return Forward::of(Tensor::stack(&parts, self.dim).map_err(ce)?);
        }
        Forward::of(Tensor::cat(&parts, self.dim).map_err(ce)?)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let mut at = 0;
        let mut out = Vec::new();
        for t in g.ts {
            let w = self.target(t, g.out);
            let len = if self.new {
                1
            } else {
                k.local_shape(&w)?[self.dim]
            };
            let mut piece = g.g.narrow(self.dim, at, len).map_err(ce)?;
            if self.new {
                piece = piece.squeeze(self.dim).map_err(ce)?;
            }
            at += len;
            out.push(Some(k.reshard_t(&piece, t, &w)?));
        }
        Ok(out)
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], out: &TType) -> Option<Cost> {
        let comms = ts
            .iter()
            .flat_map(|t| super::reshard::comms(c, t, &self.target(t, out)))
            .collect();
        Some(Cost { flops: 0.0, comms })
    }
}
