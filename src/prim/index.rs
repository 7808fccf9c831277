//! Indexing and slicing: `x[k]` takes element k of dimension 0 (removing the
//! dimension), `x[:, a:b]` the range a..b of dimension 1; any number of leading
//! dimensions may be selected, the rest are kept whole. A selected dimension
//! must not be split over the mesh (E0215: gather it first); the others keep
//! their layout. The derivative pads the cotangent with zeros.
//!
//! `split(x, n | [sizes], dim: -1)` cuts a dimension into consecutive parts,
//! one result each (`let (q, k, v) = split(qkv, 3, dim: 1)`): each part is a
//! range of that dimension, an [`Index`] of the same operand. A split
//! dimension is gathered first (reported like every other layout change).

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{axes_text, Rules};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::{Expr, Slice};
use crate::diag::Problem;
use crate::types::{Dim, Poly, TType};
use candle_core::Tensor;

pub const DEFS: &[Def] = &[
    Def {
    name: "split",
    kind: Kind::Function,
    signature: "split(x, parts, dim: -1)",
    rule: "`parts`: a count `n` of equal parts, or a list of their sizes (summing to the dim's size, E0227), each its own result, named with `let (a, b, ...) =`; `dim` gathered if split; other dims keep their layout, pending sums kept",
    check: Some(split),
    // A multi-result op: tests/split.rs covers it (the generated tests build
    // single-valued expressions).
    examples: &[],
    differentiable: true,
    same_on_one_device: true,
},
    Def {
    name: "index",
    kind: Kind::Operator,
    signature: "x[k], x[a:b], x[:, k], x[:, a:]",
    rule: "constant indices and ranges (E0205 out of range), one per leading dim; a selected dim must not be split (E0215); a taken index removes its dim, a range keeps it replicated; other dims keep their layout",
    check: None,
    examples: &[
        "{x: f32[4, 6]}[1]",
        "{x: f32[4, 6]}[:, 1:4]",
        "{x: f32[4, 6]}[1:3, 2]",
        "{x: f32[2, 4, 6]}[:, :, 5]",
    ],
    differentiable: true,
    same_on_one_device: true,
},
];

/// `split(x, n | [sizes], dim: -1)`: one [`Index`] per part.
fn split(cx: &mut dyn Rules, c: &super::rules::Call) -> Option<super::rules::Typed> {
    use super::rules::{arity, dim_index, known_named, Typed};
    if !arity(cx, c, 2, 2) || !known_named(cx, c, &["dim"]) {
        return None;
    }
    let (xe, pe) = (c.pos[0], c.pos[1]);
    let t = cx.tensor(xe, "`split`")?;
    if t.rank() == 0 {
        super::rules::rank_error(cx, xe, 1, &t);
        return None;
    }
    let dim = match c.named_expr("dim") {
        Some(d) => dim_index(cx, d, t.rank())?,
        None => t.rank() - 1,
    };
    let size = t.dims[dim].size.as_const();
    let fail = |cx: &mut dyn Rules, message: String| {
        cx.report(Problem::SplitSizes {
            span: pe.span,
            message,
            dim,
            size: t.dims[dim].size.to_string(),
        });
        None
    };
    let sizes: Vec<i64> = match (&pe.kind, super::rules::int_of(pe)) {
        (crate::ast::ExprKind::List(items), _) => super::rules::int_list(items),
        (_, Some(n)) => match size {
            Some(s) if n >= 2 && s % n == 0 => vec![s / n; n as usize],
            Some(s) if n >= 2 => return fail(cx, format!("{n} equal parts of {s}")),
            _ => return fail(cx, format!("{n} parts")),
        },
        _ => return fail(cx, "not a count or a list of sizes".into()),
    };
    if sizes.len() < 2 || sizes.iter().any(|k| *k < 1) {
        return fail(cx, "at least 2 parts, each of size 1 or more".into());
    }
    let total: i64 = sizes.iter().sum();
    if size != Some(total) {
        return fail(cx, format!("parts of {total} elements in all"));
    }
    // The dimension is whole on every device: a split one is gathered.
    let whole = super::rules::replicate_dim(cx, &t, dim, xe.span);
    let mut parts = Vec::new();
    let mut lo = 0usize;
    for k in &sizes {
        let hi = lo + *k as usize;
        let mut sel = vec![Sel::All; dim];
        sel.push(Sel::Range(lo, hi));
        let mut ty = whole.clone();
        ty.dims[dim] = Dim::replicated(Poly::constant(*k));
        parts.push((ty, Index { sel }.into()));
        lo = hi;
    }
    let (ty, prim) = parts.remove(0);
    Some(Typed {
        ty,
        prim,
        more: parts,
    })
}

/// What one dimension keeps.
#[derive(Clone, Debug, PartialEq)]
pub enum Sel {
    /// Index k: the dimension goes away.
    At(usize),
    /// The range lo..hi.
    Range(usize, usize),
    /// The whole dimension (in its layout).
    All,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Index {
    /// One selection per leading dimension.
    pub sel: Vec<Sel>,
}

/// An index or bound: a constant, or a size known in the enclosing layer
/// (`x[:, 0:HD / 2]` with `HD` a layer parameter).
fn constant(cx: &mut dyn Rules, x: &crate::ast::DimExpr) -> Option<i64> {
    cx.const_int(x)
        .or_else(|| cx.size(x, false).and_then(|(p, _)| p.as_const()))
}

/// The type of `base[slices]` (`e` the whole indexing expression).
pub fn rule(cx: &mut dyn Rules, t: &TType, slices: &[Slice], e: &Expr) -> Option<(TType, Index)> {
    if slices.len() > t.rank() {
        cx.report(Problem::DimIndex {
            span: e.span,
            index: slices.len() as i64 - 1,
            rank: t.rank(),
        });
        return None;
    }
    let mut dims = Vec::new();
    let mut sel = Vec::new();
    for (i, s) in slices.iter().enumerate() {
        let d = &t.dims[i];
        match s {
            Slice::At(x) => {
                let Some(k) = constant(cx, x) else {
                    cx.report(Problem::BadDim {
                        span: x.span(),
                        expr: "index".into(),
                        reason: "an index is a constant integer".into(),
                    });
                    return None;
                };
                if !d.axes.is_empty() {
                    cx.report_traced(
                        Problem::BadCollective {
                            span: x.span(),
                            message: format!(
                                "indexing dimension {i}, which is split over {}",
                                axes_text(&d.axes)
                            ),
                            help: "all_gather the dimension first, or index a replicated dimension"
                                .into(),
                        },
                        e,
                    );
                    return None;
                }
                let n = d.size.as_const();
                if k < 0 || n.is_some_and(|n| k >= n) {
                    cx.report(Problem::DimIndex {
                        span: x.span(),
                        index: k,
                        rank: n.unwrap_or(0).max(0) as usize,
                    });
                    return None;
                }
                sel.push(Sel::At(k as usize));
            }
            Slice::Range(lo, hi, span) => {
                if lo.is_none() && hi.is_none() {
                    dims.push(d.clone());
                    sel.push(Sel::All);
                    continue;
                }
                let lo_v = match lo {
                    Some(x) => constant(cx, x),
                    None => Some(0),
                };
                let hi_v = match hi {
                    Some(x) => constant(cx, x),
                    None => d.size.as_const(),
                };
                let (Some(l), Some(h)) = (lo_v, hi_v) else {
                    cx.report(Problem::BadDim {
                        span: *span,
                        expr: "slice".into(),
                        reason: "slice bounds are constant integers".into(),
                    });
                    return None;
                };
                if l < 0 || h <= l || d.size.as_const().is_some_and(|n| h > n) {
                    cx.report(Problem::BadDim {
                        span: *span,
                        expr: format!("{l}:{h}"),
                        reason: format!("not a non-empty range within 0..{}", d.size),
                    });
                    return None;
                }
                if !d.axes.is_empty() {
                    cx.report_traced(
                        Problem::BadCollective {
                            span: *span,
                            message: format!(
                                "slicing dimension {i}, which is split over {}",
                                axes_text(&d.axes)
                            ),
                            help: "all_gather the dimension first, or slice a replicated dimension"
                                .into(),
                        },
                        e,
                    );
                    return None;
                }
                dims.push(Dim::replicated(Poly::constant(h - l)));
                sel.push(Sel::Range(l as usize, h as usize));
            }
        }
    }
    dims.extend(t.dims[slices.len()..].iter().cloned());
    let mut out = t.clone();
    out.dims = dims;
    Some((out, Index { sel }))
}

impl Primitive for Index {
    fn name(&self) -> &'static str {
        "index"
    }

    fn render(&self, args: &[String]) -> String {
        let s: Vec<String> = self
            .sel
            .iter()
            .map(|s| match s {
                Sel::At(k) => k.to_string(),
                Sel::Range(a, b) => format!("{a}:{b}"),
                Sel::All => ":".into(),
            })
            .collect();
        format!("{}[{}]", args.join(""), s.join(", "))
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], ts: &[&TType], _out: &TType) -> R<Forward> {
        // A selected dimension split over the mesh (`split`'s) is gathered.
        let mut t = k.reshard(x[0], ts[0], &self.whole(ts[0]))?;
        // Last dims first, so the earlier dims' positions hold.
        for (d, s) in self.sel.iter().enumerate().rev() {
            t = match s {
                Sel::At(k) => t.narrow(d, *k, 1).and_then(|t| t.squeeze(d)),
                Sel::Range(a, b) => t.narrow(d, *a, b - a),
                Sel::All => continue,
            }
            .map_err(ce)?;
        }
        Forward::of(t)
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let whole = self.whole(g.ts[0]);
        let full: Vec<usize> = k.local_shape(&whole)?;
        let mut ct = g.g.clone();
        for (d, s) in self.sel.iter().enumerate() {
            ct = match s {
                Sel::At(i) => ct
                    .unsqueeze(d)
                    .and_then(|t| t.pad_with_zeros(d, *i, full[d] - 1 - i)),
                Sel::Range(a, b) => ct.pad_with_zeros(d, *a, full[d] - b),
                Sel::All => continue,
            }
            .map_err(ce)?;
        }
        Ok(vec![Some(k.reshard_t(&ct, g.ts[0], &whole)?)])
    }

    fn cost(&self, c: &CostCx, ts: &[&TType], _out: &TType) -> Option<Cost> {
        let comms = match ts.first() {
            Some(t) => super::reshard::comms(c, t, &self.whole(t)),
            None => Vec::new(),
        };
        Some(Cost { flops: 0.0, comms })
    }
}

impl Index {
    /// The operand's layout with every selected dimension whole (what the
    /// selection reads; the operand's own layout unless `split` gathers).
    fn whole(&self, t: &TType) -> TType {
        let mut w = t.clone();
        for (d, s) in w.dims.iter_mut().zip(&self.sel) {
            if *s != Sel::All {
                d.axes.clear();
            }
        }
        w
    }
}
