//! Shape changes: `reshape(x, [dims])` (same element count; a split dim must
//! stay the leading part of a merged group, or split so that its axes divide the
//! new leading factor; annotated target dims reshard) and `transpose(x, [perm])`
//! (dims move with their layouts).

use super::cost::{Cost, CostCx};
use super::kernel::{ce, Kernel};
use super::rules::{arity, axes_product, axes_text, int_list, int_of, Call, Rules, Typed};
use super::{Def, Forward, Grad, Kind, Primitive, R};
use crate::ast::{self, ExprKind, ListItem};
use crate::diag::Problem;
use crate::source::Span;
use crate::types::{Dim, Poly, TType};
use candle_core::Tensor;

pub const DEFS: &[Def] = &[
    Def {
        name: "reshape",
        kind: Kind::Function,
        signature: "reshape(x, [dims])",
        rule: "same element count (E0206); one dim may be `-1`. A split dim must stay the leading part of a merged group, or split so that its axes divide the new leading factor (E0207). Annotated target dims reshard",
        check: Some(reshape),
        examples: &[
            "reshape({x: f32[4, 6]}, [4, 2, 3])",
            "reshape({x: f32[4, 2, 3]}, [4, 6])",
            "reshape({x: f32[4, 6]}, [-1])",
        ],
        differentiable: true,
        same_on_one_device: true,
    },
    Def {
        name: "transpose",
        kind: Kind::Function,
        signature: "transpose(x, [perm])",
        rule: "dims move with their layouts",
        check: Some(transpose),
        examples: &[
            "transpose({x: f32[4, 6]}, [1, 0])",
            "transpose({x: f32[2, 4, 6]}, [2, 0, 1])",
        ],
        differentiable: true,
        same_on_one_device: true,
    },
];

#[derive(Clone, Debug, PartialEq)]
pub enum Shape {
    /// To the node's (local) shape; with a type, to that layout first, then
    /// resharded to the node's (the layouts the target list asks for).
    Reshape(Option<TType>),
    /// Dims permuted: output dim i is input dim `perm[i]`.
    Transpose(Vec<usize>),
}

fn transpose(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    if !arity(cx, c, 2, 2) {
        return None;
    }
    let t = cx.tensor(c.pos[0], "`transpose`")?;
    let ExprKind::List(items) = &c.pos[1].kind else {
        cx.report(Problem::WrongKind {
            span: c.pos[1].span,
            expected: "a permutation like `[0, 2, 1]`".into(),
            found: "an expression".into(),
        });
        return None;
    };
    let perm = int_list(items);
    let mut sorted = perm.clone();
    sorted.sort();
    if perm.len() != t.rank() || sorted != (0..t.rank() as i64).collect::<Vec<_>>() {
        cx.report(Problem::DimIndex {
            span: c.pos[1].span,
            index: perm
                .iter()
                .copied()
                .find(|k| *k < 0 || *k >= t.rank() as i64)
                .unwrap_or(perm.len() as i64),
            rank: t.rank(),
        });
        return None;
    }
    let perm: Vec<usize> = perm.iter().map(|&k| k as usize).collect();
    let dims = perm.iter().map(|&k| t.dims[k].clone()).collect();
    let out = TType {
        dtype: t.dtype,
        dims,
        pending: t.pending.clone(),
    };
    Typed::new(out, Shape::Transpose(perm))
}

fn reshape(cx: &mut dyn Rules, c: &Call) -> Option<Typed> {
    let (args, e) = (c, c.expr);
    if !arity(cx, c, 2, 2) || !super::rules::known_named(cx, c, &[]) {
        return None;
    }
    let t = cx.tensor(args.pos[0], "`reshape`")?;
    let ExprKind::List(items) = &args.pos[1].kind else {
        cx.report(Problem::WrongKind {
            span: args.pos[1].span,
            expected: "a list of dimensions like `[B, T * D]`".into(),
            found: "an expression".into(),
        });
        return None;
    };
    // Target dims: size (None for -1), explicit axes, span.
    let mut target: Vec<(Option<Poly>, Option<Vec<String>>, Span)> = Vec::new();
    for it in items {
        match it {
            ListItem::Dim(ast::DimSpec::Dim { size, axes, span }) => {
                let (v_size, v_axes) = cx.size(size, true)?;
                let v_size = v_size.substitute(&cx.tyvars()).unwrap_or(v_size);
                let ax = match axes {
                    Some(list) => {
                        let mut names = Vec::new();
                        for a in list {
                            if !cx.check_axis(&a.name, a.span) {
                                return None;
                            }
                            names.push(a.name.clone());
                        }
                        Some(names)
                    }
                    None => v_axes,
                };
                target.push((Some(v_size), ax, *span));
            }
            ListItem::Expr(x) if int_of(x) == Some(-1) => target.push((None, None, x.span)),
            other => {
                let span = match other {
                    ListItem::Dim(d) => d.span(),
                    ListItem::Expr(x) => x.span,
                };
                cx.report(Problem::WrongKind {
                    span,
                    expected: "a dimension size (or -1)".into(),
                    found: "an expression".into(),
                });
                return None;
            }
        }
    }
    let Some(total) = t.numel() else {
        cx.report(Problem::BadDim {
            span: args.pos[0].span,
            expr: "the number of elements".into(),
            reason: "overflows".into(),
        });
        return None;
    };
    let infer = target.iter().filter(|d| d.0.is_none()).count();
    if infer > 1 {
        cx.report(Problem::BadDim {
            span: args.pos[1].span,
            expr: "-1".into(),
            reason: "at most one dimension can be inferred".into(),
        });
        return None;
    }
    let known = target
        .iter()
        .filter_map(|d| d.0.clone())
        .try_fold(Poly::constant(1), |a, b| a.mul(&b));
    let from_text = format!(
        "[{}]",
        t.shape()
            .iter()
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let Some(known) = known else {
        cx.report(Problem::BadDim {
            span: args.pos[1].span,
            expr: "the number of elements".into(),
            reason: "overflows".into(),
        });
        return None;
    };
    if infer == 1 {
        match total.div(&known) {
            Some(q) => {
                if let Some(d) = target.iter_mut().find(|d| d.0.is_none()) {
                    d.0 = Some(q);
                }
            }
            None => {
                cx.report_traced(
                    Problem::ReshapeCount {
                        span: args.pos[1].span,
                        from: from_text,
                        to: "a shape with -1".into(),
                        from_n: total.to_string(),
                        to_n: format!("a multiple of {known}"),
                    },
                    args.pos[0],
                );
                return None;
            }
        }
    } else {
        let tn = known.substitute(cx.bound()).unwrap_or(known.clone());
        let fnn = total.substitute(cx.bound()).unwrap_or(total.clone());
        if tn != fnn {
            let to_text = format!(
                "[{}]",
                target
                    .iter()
                    .map(|d| d.0.as_ref().map_or("?".into(), |p| p.to_string()))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            cx.report_traced(
                Problem::ReshapeCount {
                    span: args.pos[1].span,
                    from: from_text,
                    to: to_text,
                    from_n: total.to_string(),
                    to_n: known.to_string(),
                },
                args.pos[0],
            );
            return None;
        }
    }
    let sizes: Vec<Poly> = target
        .iter()
        .map(|d| d.0.clone().unwrap_or_default())
        .collect();
    // Group input and output dims into runs with equal products; a sharding may
    // sit only on the leading dim of a run and passes to the run's leading output dim.
    let mut out_axes: Vec<Vec<String>> = vec![vec![]; sizes.len()];
    let (mut i, mut j) = (0usize, 0usize);
    while i < t.rank() || j < sizes.len() {
        let (i0, j0) = (i, j);
        let mut pi = Poly::constant(1);
        let mut pj = Poly::constant(1);
        if i < t.rank() {
            pi = t.dims[i].size.clone();
            i += 1;
        }
        if j < sizes.len() {
            pj = sizes[j].clone();
            j += 1;
        }
        while pi != pj {
            // Grow the side whose product divides the other's.
            let grow_in = i < t.rank() && (pj.div(&pi).is_some() || j >= sizes.len());
            if grow_in {
                pi = pi.mul(&t.dims[i].size).unwrap_or_default();
                i += 1;
            } else if j < sizes.len() {
                pj = pj.mul(&sizes[j]).unwrap_or_default();
                j += 1;
            } else {
                break;
            }
        }
        if i == i0 && j == j0 {
            break;
        }
        // Within the run [i0, i) → [j0, j).
        let sharded: Vec<usize> = (i0..i).filter(|&k| !t.dims[k].axes.is_empty()).collect();
        if sharded.is_empty() {
            continue;
        }
        if j == j0 {
            // Trailing input dims of size 1 with no output dim left: a split
            // one would vanish (and a size-1 dim split over devices is no data).
            let k = sharded[0];
            cx.report_traced(
                Problem::ReshapeSharding { span: args.pos[1].span, message: format!("reshape drops dimension {k} (size 1, split over {})", axes_text(&t.dims[k].axes)), help: "a dimension split over devices cannot be dropped; all_gather it first, or keep it in the target shape".into() },
                args.pos[0],
            );
            return None;
        }
        let one_to_one = i - i0 == 1 && j - j0 == 1;
        if one_to_one {
            out_axes[j0] = t.dims[i0].axes.clone();
            continue;
        }
        let lead = (i0..i)
            .find(|&k| t.dims[k].size != Poly::constant(1))
            .unwrap_or(i0);
        let jlead = (j0..j)
            .find(|&k| sizes[k] != Poly::constant(1))
            .unwrap_or(j0);
        if sharded != [lead] {
            let k = sharded[sharded.len() - 1];
            cx.report_traced(
                Problem::ReshapeSharding { span: args.pos[1].span, message: format!("reshape merges dimension {k} (split over {}) into a larger dimension as a minor part", axes_text(&t.dims[k].axes)), help: "only the leading dimension of a merged group may be split; all_gather it first or transpose it to the front".into() },
                args.pos[0],
            );
            return None;
        }
        let axes = t.dims[lead].axes.clone();
        let n = axes_product(cx, &axes);
        let s = sizes[jlead]
            .substitute(cx.bound())
            .unwrap_or(sizes[jlead].clone());
        let ok = match s.as_const() {
            Some(v) => v % n == 0,
            None => true,
        };
        if !ok {
            cx.report_traced(
                Problem::ReshapeSharding { span: target[jlead].2, message: format!("reshape splits dimension {lead} (split over {}, {} devices) so that its leading part {} is not divisible by {n}", axes_text(&axes), n, sizes[jlead]), help: format!("make the new leading dimension a multiple of {n}, or all_gather before the reshape") },
                args.pos[0],
            );
            return None;
        }
        out_axes[jlead] = axes;
    }
    let mut out = TType {
        dtype: t.dtype,
        dims: sizes
            .iter()
            .cloned()
            .zip(out_axes)
            .map(|(size, axes)| Dim { size, axes })
            .collect(),
        pending: t.pending.clone(),
    };
    // Explicit layouts in the target list: reshard to them.
    let natural = out.clone();
    let explicit: Vec<Option<Vec<String>>> = target.iter().map(|d| d.1.clone()).collect();
    if explicit.iter().any(|x| x.is_some()) {
        for (k, d) in out.dims.iter().enumerate() {
            if let Some(ax) = &explicit[k] {
                let dd = Dim {
                    size: d.size.clone(),
                    axes: ax.clone(),
                };
                if !cx.check_dim(&dd, target[k].2, &format!("dimension {k}")) {
                    return None;
                }
            }
        }
        out = cx.reshard(&out, &explicit, &out.pending.clone(), e.span);
    }
    let via = (out != natural).then_some(natural);
    Typed::new(out, Shape::Reshape(via))
}

impl Primitive for Shape {
    fn name(&self) -> &'static str {
        match self {
            Shape::Reshape(_) => "reshape",
            Shape::Transpose(_) => "transpose",
        }
    }

    fn attrs(&self) -> Vec<String> {
        match self {
            Shape::Reshape(_) => vec![],
            Shape::Transpose(p) => {
                let p: Vec<String> = p.iter().map(|x| x.to_string()).collect();
                vec![format!("[{}]", p.join(", "))]
            }
        }
    }

    fn forward(&self, k: &Kernel, x: &[&Tensor], _ts: &[&TType], out: &TType) -> R<Forward> {
        Forward::of(match self {
            Shape::Reshape(None) => x[0].reshape(k.local_shape(out)?).map_err(ce)?,
            Shape::Reshape(Some(via)) => {
                let y = x[0].reshape(k.local_shape(via)?).map_err(ce)?;
                k.reshard(&y, via, out)?
            }
            Shape::Transpose(p) => x[0]
                .permute(p.clone())
                .and_then(|t| t.contiguous())
                .map_err(ce)?,
        })
    }

    fn vjp(&self, k: &Kernel, g: &Grad) -> R<Vec<Option<Tensor>>> {
        Ok(vec![Some(match self {
            Shape::Reshape(None) => g.g.reshape(g.x[0].dims()).map_err(ce)?,
            Shape::Reshape(Some(via)) => k
                .reshard_t(g.g, via, g.out)?
                .reshape(g.x[0].dims())
                .map_err(ce)?,
            Shape::Transpose(p) => {
                let mut inv = vec![0; p.len()];
                for (i, &k) in p.iter().enumerate() {
                    inv[k] = i;
                }
                g.g.permute(inv).and_then(|t| t.contiguous()).map_err(ce)?
            }
        })])
    }

    fn cost(&self, c: &CostCx, _ts: &[&TType], out: &TType) -> Option<Cost> {
        Some(Cost {
            flops: 0.0,
            comms: match self {
                Shape::Reshape(Some(via)) => super::reshard::comms(c, via, out),
                _ => vec![],
            },
        })
    }
}
