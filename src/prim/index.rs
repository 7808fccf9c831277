//! Indexing and slicing: `x[k]` takes element k of dimension 0 (removing the
//! dimension), `x[:, a:b]` the range a..b of dimension 1; any number of leading
//! dimensions may be selected, the rest are kept whole. A selected dimension
//! must not be split over the mesh (E0215: gather it first); the others keep
//! their layout. The derivative pads the cotangent with zeros.

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{axes_text, Rules};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::{Expr, Slice};
use crate::diag::Problem;
use crate::types::{Dim, Poly, TType};
use candle_core::Tensor;

pub const DEFS: &[Def] = &[Def {
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
}];

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

    fn forward(&self, _k: &Kernel, x: &[&Tensor], _ts: &[&TType], _out: &TType) -> R<Forward> {
        let mut t = x[0].clone();
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

    fn vjp(&self, _k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        let full = g.x[0].dims();
        let mut ct = g.g.clone();
        for (d, s) in self.sel.iter().enumerate() {
            ct = match s {
                Sel::At(k) => ct
                    .unsqueeze(d)
                    .and_then(|t| t.pad_with_zeros(d, *k, full[d] - 1 - k)),
                Sel::Range(a, b) => ct.pad_with_zeros(d, *a, full[d] - b),
                Sel::All => continue,
            }
            .map_err(ce)?;
        }
        Ok(vec![Some(ct)])
    }

    fn cost(&self, _c: &CostCx, _ts: &[&TType], _out: &TType) -> Option<Cost> {
        Cost::free()
    }
}
