//! Typing and sharding rules of operators and built-in functions.
//!
//! Each rule says, per dimension, whether a sharding passes through, is contracted
//! (leaving a pending sum), or needs replication (a reshard the compiler inserts and
//! reports, or refuses in strict mode and local blocks).

use super::{reduce_name, Binding, Checker, Inst, Scope, Val};
use crate::ast::{self, Arg, BinOp, DType, Expr, ExprKind, ListItem, ReduceOp, Slice};
use crate::diag::Problem;
use crate::source::Span;
use crate::types::{Dim, Poly, TType};
use std::collections::BTreeMap;
use std::rc::Rc;

pub const BUILTINS: &[&str] = &[
    "relu",
    "gelu",
    "silu",
    "tanh",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "sigmoid",
    "square",
    "abs",
    "softmax",
    "log_softmax",
    "layer_norm",
    "rms_norm",
    "sum",
    "mean",
    "max",
    "min",
    "einsum",
    "reshape",
    "transpose",
    "one_hot",
    "embed",
    "lookup",
    "causal_attention",
    "cast",
    "dropout",
    "stop_gradient",
    "softmax_cross_entropy",
    "reduce",
    "psum",
    "pmean",
    "pmax",
    "pmin",
    "all_gather",
    "psum_scatter",
    "all_to_all",
    "ppermute",
    "axis_index",
];

const UNARY: &[&str] = &[
    "relu", "gelu", "silu", "tanh", "exp", "log", "sqrt", "rsqrt", "sigmoid", "square", "abs",
];

/// Built-ins that communicate, emitted as collectives in the SPMD program.
const COLLECTIVES: &[&str] = &[
    "reduce",
    "psum",
    "pmean",
    "pmax",
    "pmin",
    "all_gather",
    "psum_scatter",
    "all_to_all",
    "ppermute",
];

pub fn is_builtin(name: &str) -> bool {
    BUILTINS.contains(&name)
}

/// Arguments of a built-in call, split into positional and named.
struct Args<'a> {
    pos: Vec<&'a Expr>,
    named: Vec<(&'a ast::Ident, &'a ast::OptValue)>,
}

impl<'a> Args<'a> {
    fn new(args: &'a [Arg]) -> Args<'a> {
        let mut pos = Vec::new();
        let mut named = Vec::new();
        for a in args {
            match a {
                Arg::Pos(e) => pos.push(e),
                Arg::Named(k, v) => named.push((k, v)),
                Arg::Arrow(..) => {}
            }
        }
        Args { pos, named }
    }
    fn named_expr(&self, key: &str) -> Option<&'a Expr> {
        self.named
            .iter()
            .find(|(k, _)| k.name == key)
            .and_then(|(_, v)| match v {
                ast::OptValue::Expr(e) => Some(e),
                _ => None,
            })
    }
}

fn int_of(e: &Expr) -> Option<i64> {
    match &e.kind {
        ExprKind::Int(v) => Some(*v),
        ExprKind::Neg(x) => int_of(x).map(|v| -v),
        _ => None,
    }
}

use crate::plan::human_bytes;
/// Bytes moved per device per step: for people, and as a number for the plan.
#[derive(Clone, Debug)]
pub(super) struct Bytes {
    text: String,
    num: Option<f64>,
}

impl<'p> Checker<'p> {
    /// Record an explicit collective over `axis` on a value of (per-device) type `t`:
    /// ring algorithms move `factor × (n-1)/n` of the local bytes.
    fn comm(&mut self, kind: &str, axis: &str, t: &TType, factor: f64, span: Span) {
        if self.plan.is_none() {
            return;
        }
        let n = self.axis_size(axis) as f64;
        if let Some(b) = self.bytes_text(t, factor * (n - 1.0) / n).num {
            self.add_comm(kind, vec![axis.to_string()], b, span, true);
        }
    }

    /// Bytes each device moves for a collective on a value whose per-device
    /// size is `local` elements: `factor` × local bytes.
    fn bytes_text(&self, t: &TType, factor: f64) -> Bytes {
        let shards: i64 = t.dims.iter().fold(1i64, |acc, d| {
            acc.saturating_mul(self.axes_product(&d.axes))
        });
        let Some(numel) = t.numel().and_then(|n| n.substitute(&self.bound)) else {
            return Bytes {
                text: "unknown bytes".into(),
                num: None,
            };
        };
        match numel.as_const() {
            Some(n) => {
                let b = n as f64 * t.dtype.bytes() as f64 / shards.max(1) as f64 * factor;
                Bytes {
                    text: human_bytes(b),
                    num: Some(b),
                }
            }
            None => {
                let per = t.dtype.bytes() as f64 * factor / shards.max(1) as f64;
                let text = if per.fract() == 0.0 && per >= 1.0 {
                    let scaled = numel
                        .mul(&crate::types::Poly::constant(per as i64))
                        .unwrap_or(numel);
                    format!("{scaled} bytes")
                } else {
                    format!("{per:.3} × ({numel}) bytes")
                };
                Bytes { text, num: None }
            }
        }
    }

    /// Move `got` to the layout `target` (per dim: `None` keeps the value's
    /// axes) with the pending reductions `want_pending`. Each collective this needs
    /// is a note, or an error in strict mode or inside a local block.
    pub(super) fn reshard(
        &mut self,
        got: &TType,
        target: &[Option<Vec<String>>],
        want_pending: &BTreeMap<String, ReduceOp>,
        span: Span,
        scope: &Scope,
    ) -> TType {
        let mut t = got.clone();
        let mut events: Vec<(String, String, Bytes)> = Vec::new();
        // 1. Pending reductions the target does not keep.
        let owed: Vec<(String, ReduceOp)> = t
            .pending
            .iter()
            .filter(|(a, _)| !want_pending.contains_key(*a))
            .map(|(a, o)| (a.clone(), *o))
            .collect();
        for (axis, op) in owed {
            let n = self.axis_size(&axis) as f64;
            let into = target
                .iter()
                .position(|d| d.as_ref().is_some_and(|ax| ax.contains(&axis)));
            let from = t.to_string();
            t.pending.remove(&axis);
            match (op, into) {
                (ReduceOp::Sum, Some(i)) if !t.dims[i].axes.contains(&axis) => {
                    let before = self.bytes_text(&t, (n - 1.0) / n);
                    t.dims[i].axes.push(axis.clone());
                    events.push((
                        format!("reduce-scatter (psum_scatter over `{axis}`)"),
                        from,
                        before,
                    ));
                }
                _ => {
                    let b = self.bytes_text(&t, 2.0 * (n - 1.0) / n);
                    events.push((
                        format!("all-reduce ({} over `{axis}`)", reduce_name(op)),
                        from,
                        b,
                    ));
                }
            }
        }
        // Pending reductions the target expects but the value does not have: nothing
        // to do (a reduced value is a valid partial value with zero addends elsewhere
        // only for sums, which we never rely on): report as a mismatch.
        for (a, op) in want_pending {
            if t.pending.get(a) != Some(op) {
                self.report(Problem::Mismatch {
                    span,
                    expected: {
                        let mut w = got.clone();
                        w.pending = want_pending.clone();
                        w.to_string()
                    },
                    found: got.to_string(),
                    decl: None,
                    detail: format!("this value owes no reduction over `{a}`"),
                });
                return got.clone();
            }
        }
        // 2. Per-dimension layout changes.
        for i in 0..t.rank() {
            let Some(Some(want)) = target.get(i) else {
                continue;
            };
            if &t.dims[i].axes == want {
                continue;
            }
            // Axes leaving this dim: moved to another dim (all-to-all) or gathered.
            let leaving: Vec<String> = t.dims[i]
                .axes
                .iter()
                .filter(|a| !want.contains(a))
                .cloned()
                .collect();
            for a in leaving {
                let n = self.axis_size(&a) as f64;
                let from = t.to_string();
                let dest = target
                    .iter()
                    .enumerate()
                    .position(|(j, d)| j != i && d.as_ref().is_some_and(|x| x.contains(&a)));
                t.dims[i].axes.retain(|x| *x != a);
                match dest {
                    Some(j) => {
                        let b = self.bytes_text(&t, (n - 1.0) / n / n);
                        t.dims[j].axes.push(a.clone());
                        events.push((format!("all-to-all over `{a}`"), from, b));
                    }
                    None => {
                        let b = self.bytes_text(&t, (n - 1.0) / n);
                        events.push((format!("all-gather over `{a}`"), from, b));
                    }
                }
            }
            // Axes arriving: a local slice, no communication.
            for a in want {
                if !t.dims[i].axes.contains(a) && !t.all_axes().contains(&a.as_str()) {
                    t.dims[i].axes.push(a.clone());
                }
            }
            t.dims[i].axes = want
                .iter()
                .filter(|a| t.dims[i].axes.contains(a))
                .cloned()
                .collect();
        }
        let to = t.to_string();
        let changed = !events.is_empty() || t != *got;
        for (what, from, bytes) in events {
            self.implicit(span, what, from, to.clone(), bytes, scope);
        }
        if changed && !self.in_builtin {
            let input = self.last;
            self.emit_node(crate::spmd::Op::Reshard, vec![input], &t, span);
        }
        t
    }

    /// Report a collective the compiler inserts: a note, or an error in strict mode
    /// and inside local blocks.
    fn implicit(
        &mut self,
        span: Span,
        what: String,
        from: String,
        to: String,
        bytes: Bytes,
        scope: &Scope,
    ) {
        if let Some(b) = bytes.num {
            // `what` reads "all-gather over `tp`" / "all-reduce (psum over `mp`)".
            let kind = what
                .split(" over")
                .next()
                .unwrap_or(&what)
                .split(" (")
                .next()
                .unwrap_or(&what)
                .to_string();
            let axes: Vec<String> = what
                .split('`')
                .skip(1)
                .step_by(2)
                .map(|s| s.to_string())
                .collect();
            self.add_comm(&kind, axes, b, span, false);
        }
        let bytes = bytes.text;
        if self.strict.is_some() || scope.local.is_some() {
            let strict = self.strict.filter(|s| *s != Span::default());
            self.report(Problem::ImplicitCollective {
                span,
                what,
                bytes,
                strict,
                local: scope.local,
            });
        } else {
            self.report(Problem::Reshard {
                span,
                what,
                from,
                to,
                bytes,
            });
        }
    }

    fn need_reduced(&mut self, t: &TType, op: &str, e: &Expr, scope: &Scope) -> bool {
        if t.pending.is_empty() {
            return true;
        }
        let op = if op.chars().all(|c| c.is_alphanumeric() || c == '_') {
            format!("`{op}`")
        } else {
            op.to_string()
        };
        let axes: Vec<String> = t.pending.keys().cloned().collect();
        self.report_traced(
            Problem::PendingUsed {
                span: e.span,
                ty: t.to_string(),
                op,
                axes: Self::axes_text(&axes),
            },
            e,
            scope,
        );
        false
    }

    fn tensor(&mut self, v: Val, e: &Expr, what: &str) -> Option<TType> {
        match v {
            Val::T(t) => Some(t),
            Val::Poison => None,
            other => {
                self.report(Problem::WrongKind {
                    span: e.span,
                    expected: format!("a tensor for {what}"),
                    found: other.describe(),
                });
                None
            }
        }
    }

    pub(super) fn binary(
        &mut self,
        op: BinOp,
        (va, a): (Val, &Expr),
        (vb, b): (Val, &Expr),
        e: &Expr,
        scope: &Scope,
    ) -> Val {
        if matches!(va, Val::Poison) || matches!(vb, Val::Poison) {
            return Val::Poison;
        }
        if op == BinOp::MatMul {
            let (Some(x), Some(y)) = (self.tensor(va, a, "`@`"), self.tensor(vb, b, "`@`")) else {
                return Val::Poison;
            };
            return self.matmul(&x, &y, a, b, e, scope);
        }
        let num = |v: &Val| match v {
            Val::Num(x) => Some(*x),
            Val::Int(x) => Some(*x as f64),
            _ => None,
        };
        match (&va, &vb) {
            (Val::T(t), other) | (other, Val::T(t)) if num(other).is_some() => {
                // Adding a constant to a partial value would add it once per device.
                if matches!(op, BinOp::Add | BinOp::Sub) && !t.pending.is_empty() {
                    let t = t.clone();
                    self.need_reduced(&t, "adding a constant", e, scope);
                    return Val::Poison;
                }
                if op == BinOp::Div && matches!(vb, Val::T(_)) && !t.pending.is_empty() {
                    let t = t.clone();
                    self.need_reduced(&t, "dividing by a partial value", e, scope);
                    return Val::Poison;
                }
                return Val::T(t.clone());
            }
            _ => {}
        }
        if let (Some(x), Some(y)) = (num(&va), num(&vb)) {
            return Val::Num(match op {
                BinOp::Add => x + y,
                BinOp::Sub => x - y,
                BinOp::Mul => x * y,
                _ => x / y,
            });
        }
        let (Some(x), Some(y)) = (
            self.tensor(va, a, "an arithmetic operator"),
            self.tensor(vb, b, "an arithmetic operator"),
        ) else {
            return Val::Poison;
        };
        if x.dtype != y.dtype {
            self.report_traced(
                Problem::DType {
                    span: b.span,
                    expected: x.dtype.name().into(),
                    found: y.dtype.name().into(),
                    other: Some(a.span),
                },
                e,
                scope,
            );
            return Val::Poison;
        }
        // Pending reductions: sums are linear, so partial ± partial (same axes) and
        // partial × reduced are fine; anything else needs the reduction first.
        let pending = match op {
            BinOp::Add | BinOp::Sub => {
                if x.pending != y.pending {
                    let (bad, expr) = if x.pending.is_empty() {
                        (&y, b)
                    } else {
                        (&x, a)
                    };
                    let bad = bad.clone();
                    self.need_reduced(
                        &bad,
                        &format!(
                            "`{}` with a value that is not partial over the same axes",
                            op.symbol()
                        ),
                        expr,
                        scope,
                    );
                    return Val::Poison;
                }
                if x.pending.values().any(|o| *o != ReduceOp::Sum) {
                    self.need_reduced(&x, op.symbol(), a, scope);
                    return Val::Poison;
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
                        (&y, b)
                    } else {
                        (&x, a)
                    };
                    let bad = bad.clone();
                    self.need_reduced(&bad, &format!("`{}`", op.symbol()), expr, scope);
                    return Val::Poison;
                }
                let mut p = x.pending.clone();
                p.extend(y.pending.clone());
                p
            }
        };
        match self.broadcast(&x.dims, &y.dims, (a, &x), (b, &y), e, scope) {
            Some(dims) => Val::T(TType {
                dtype: x.dtype,
                dims,
                pending,
            }),
            None => Val::Poison,
        }
    }

    /// Numpy broadcasting of two dim lists, with sharding: equal axes pass, a
    /// sharded dim against a replicated one stays sharded (a free local slice),
    /// two different shardings are ambiguous.
    fn broadcast(
        &mut self,
        xd: &[Dim],
        yd: &[Dim],
        (a, x): (&Expr, &TType),
        (b, y): (&Expr, &TType),
        e: &Expr,
        scope: &Scope,
    ) -> Option<Vec<Dim>> {
        let r = xd.len().max(yd.len());
        let hint = match &self.hint {
            Some((span, h)) if *span == e.span && h.len() == r => Some(h.clone()),
            _ => None,
        };
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
                        self.report_traced(
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
                            scope,
                        );
                        return None;
                    };
                    let axes = if let Some(Some(want)) = hint.as_ref().map(|h| &h[k]) {
                        // The annotation decides; operands split otherwise are gathered.
                        for (d, t, ex) in [(p, x, a), (q, y, b)] {
                            for ax in d.axes.iter().filter(|ax| !want.contains(ax)) {
                                let n = self.axis_size(ax) as f64;
                                let what = format!("all-gather over `{ax}`");
                                let bytes = self.bytes_text(t, (n - 1.0) / n);
                                let to =
                                    format!("dimension {k} split over {}", Self::axes_text(want));
                                self.implicit(ex.span, what, t.to_string(), to, bytes, scope);
                            }
                        }
                        want.clone()
                    } else if p.axes == q.axes || q.axes.is_empty() {
                        p.axes.clone()
                    } else if p.axes.is_empty() {
                        q.axes.clone()
                    } else {
                        self.report_traced(
                            Problem::Ambiguous {
                                span: e.span,
                                lhs: (a.span, format!("split over {}", Self::axes_text(&p.axes))),
                                rhs: (b.span, format!("split over {}", Self::axes_text(&q.axes))),
                                detail: format!("dimension {k} is split differently on each side"),
                            },
                            e,
                            scope,
                        );
                        return None;
                    };
                    Dim { size, axes }
                }
                (None, None) => unreachable!("k < max rank"),
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
                            let n = self.axis_size(&ax) as f64;
                            let bytes = self.bytes_text(t, (n - 1.0) / n);
                            self.implicit(
                                ex.span,
                                format!("all-gather over `{ax}`"),
                                t.to_string(),
                                format!("dimension {k} whole"),
                                bytes,
                                scope,
                            );
                        }
                    }
                    out[k].axes.retain(|x| *x != ax);
                }
            }
        }
        if let Some(ax) = twice(&out) {
            self.report_traced(
                Problem::Ambiguous {
                    span: e.span,
                    lhs: (a.span, x.to_string()),
                    rhs: (b.span, y.to_string()),
                    detail: format!("axis `{ax}` would split two dimensions of the result"),
                },
                e,
                scope,
            );
            return None;
        }
        Some(out)
    }

    fn matmul(&mut self, x: &TType, y: &TType, a: &Expr, b: &Expr, e: &Expr, scope: &Scope) -> Val {
        if x.rank() < 1 || y.rank() < 1 {
            let (bad, ex) = if x.rank() < 1 { (x, a) } else { (y, b) };
            self.report(Problem::Rank {
                span: ex.span,
                expected: 2,
                found: 0,
                ty: bad.to_string(),
                decl: None,
            });
            return Val::Poison;
        }
        if x.dtype != y.dtype {
            self.report_traced(
                Problem::DType {
                    span: b.span,
                    expected: x.dtype.name().into(),
                    found: y.dtype.name().into(),
                    other: Some(a.span),
                },
                e,
                scope,
            );
            return Val::Poison;
        }
        if !x.pending.is_empty() && !y.pending.is_empty() {
            self.need_reduced(y, "a product of two partial values", b, scope);
            return Val::Poison;
        }
        let kx = &x.dims[x.rank() - 1];
        let ky = if y.rank() == 1 {
            &y.dims[0]
        } else {
            &y.dims[y.rank() - 2]
        };
        if kx.size != ky.size {
            self.report_traced(
                Problem::Contraction {
                    span: e.span,
                    lhs: (a.span, x.to_string()),
                    rhs: (b.span, y.to_string()),
                    lhs_dim: format!("{} (last dim of the left)", kx.size),
                    rhs_dim: format!("{} (first dim of the right)", ky.size),
                },
                e,
                scope,
            );
            return Val::Poison;
        }
        let caxes = if kx.axes == ky.axes || ky.axes.is_empty() {
            kx.axes.clone()
        } else if kx.axes.is_empty() {
            ky.axes.clone()
        } else {
            self.report_traced(
                Problem::Ambiguous {
                    span: e.span,
                    lhs: (
                        a.span,
                        format!("contracted dim split over {}", Self::axes_text(&kx.axes)),
                    ),
                    rhs: (
                        b.span,
                        format!("contracted dim split over {}", Self::axes_text(&ky.axes)),
                    ),
                    detail: "the contracted dimension is split differently on each side".into(),
                },
                e,
                scope,
            );
            return Val::Poison;
        };
        let xb = &x.dims[..x.rank() - 1];
        let (yb, ylast): (&[Dim], Option<&Dim>) = if y.rank() == 1 {
            (&[], None)
        } else {
            (&y.dims[..y.rank() - 2], Some(&y.dims[y.rank() - 1]))
        };
        // Batch dims broadcast; the left's row dim stays.
        let (xbatch, xrow) = match xb.split_last() {
            Some((row, rest)) => (rest, Some(row)),
            None => (xb, None),
        };
        let Some(mut dims) = self.broadcast(xbatch, yb, (a, x), (b, y), e, scope) else {
            return Val::Poison;
        };
        dims.extend(xrow.cloned());
        dims.extend(ylast.cloned());
        let mut pending = x.pending.clone();
        pending.extend(y.pending.clone());
        for ax in caxes {
            pending.insert(ax, ReduceOp::Sum);
        }
        if let Some(ax) = twice(&dims).or_else(|| {
            dims.iter()
                .flat_map(|d| d.axes.iter())
                .find(|a| pending.contains_key(*a))
                .cloned()
        }) {
            self.report_traced(
                Problem::Ambiguous {
                    span: e.span,
                    lhs: (a.span, x.to_string()),
                    rhs: (b.span, y.to_string()),
                    detail: format!("axis `{ax}` would split two dimensions of the result"),
                },
                e,
                scope,
            );
            return Val::Poison;
        }
        // 2·M·N·K per device: output elements times the local contraction length.
        let out_t = TType {
            dtype: x.dtype,
            dims: dims.clone(),
            pending: BTreeMap::new(),
        };
        if let (Some(n), Some(k)) = (
            self.local_numel(&out_t),
            kx.size.substitute(&self.bound).and_then(|p| p.as_const()),
        ) {
            let shards = self.axes_product(if kx.axes.is_empty() {
                &ky.axes
            } else {
                &kx.axes
            }) as f64;
            self.add_flops(2.0 * n * k as f64 / shards.max(1.0));
        }
        Val::T(TType {
            dtype: x.dtype,
            dims,
            pending,
        })
    }

    pub(super) fn index(
        &mut self,
        _inst: &Rc<Inst>,
        v: Val,
        slices: &[Slice],
        e: &Expr,
        scope: &Scope,
    ) -> Val {
        let Some(mut t) = self.tensor(v, e, "indexing") else {
            return Val::Poison;
        };
        if slices.len() > t.rank() {
            self.report(Problem::DimIndex {
                span: e.span,
                index: slices.len() as i64 - 1,
                rank: t.rank(),
            });
            return Val::Poison;
        }
        let mut dims = Vec::new();
        for (i, s) in slices.iter().enumerate() {
            let d = &t.dims[i];
            let eval = |x: &ast::DimExpr, c: &Checker| -> Option<i64> {
                crate::resolve::eval_int(x, &mut |n, _| c.prog.consts.get(n).map(|v| v.0).ok_or(()))
                    .ok()
            };
            match s {
                Slice::At(x) => {
                    let Some(k) = eval(x, self) else {
                        self.report(Problem::BadDim {
                            span: x.span(),
                            expr: "index".into(),
                            reason: "an index is a constant integer".into(),
                        });
                        return Val::Poison;
                    };
                    if !d.axes.is_empty() {
                        self.report_traced(Problem::BadCollective { span: x.span(), message: format!("indexing dimension {i}, which is split over {}", Self::axes_text(&d.axes)), help: "all_gather the dimension first, or index a replicated dimension".into() }, e, scope);
                        return Val::Poison;
                    }
                    if let Some(n) = d.size.as_const() {
                        if k < 0 || k >= n {
                            self.report(Problem::DimIndex {
                                span: x.span(),
                                index: k,
                                rank: n as usize,
                            });
                            return Val::Poison;
                        }
                    }
                }
                Slice::Range(lo, hi, span) => {
                    let lo_v = match lo {
                        Some(x) => eval(x, self),
                        None => Some(0),
                    };
                    let hi_v = match hi {
                        Some(x) => eval(x, self),
                        None => d.size.as_const(),
                    };
                    if lo.is_none() && hi.is_none() {
                        dims.push(d.clone());
                        continue;
                    }
                    let (Some(l), Some(h)) = (lo_v, hi_v) else {
                        self.report(Problem::BadDim {
                            span: *span,
                            expr: "slice".into(),
                            reason: "slice bounds are constant integers".into(),
                        });
                        return Val::Poison;
                    };
                    if l < 0 || h <= l || d.size.as_const().is_some_and(|n| h > n) {
                        self.report(Problem::BadDim {
                            span: *span,
                            expr: format!("{l}:{h}"),
                            reason: format!("not a non-empty range within 0..{}", d.size),
                        });
                        return Val::Poison;
                    }
                    if !d.axes.is_empty() {
                        self.report_traced(Problem::BadCollective { span: *span, message: format!("slicing dimension {i}, which is split over {}", Self::axes_text(&d.axes)), help: "all_gather the dimension first, or slice a replicated dimension".into() }, e, scope);
                        return Val::Poison;
                    }
                    dims.push(Dim::replicated(Poly::constant(h - l)));
                }
            }
        }
        dims.extend(t.dims[slices.len()..].iter().cloned());
        t.dims = dims;
        Val::T(t)
    }

    fn axis_arg(&mut self, e: &Expr) -> Option<String> {
        match &e.kind {
            ExprKind::Name(n) => self
                .check_axis(&ast::Ident {
                    name: n.clone(),
                    span: e.span,
                })
                .then(|| n.clone()),
            _ => {
                self.report(Problem::WrongKind {
                    span: e.span,
                    expected: "a mesh axis name".into(),
                    found: "an expression".into(),
                });
                None
            }
        }
    }

    fn dim_index(&mut self, e: &Expr, rank: usize) -> Option<usize> {
        let Some(k) = int_of(e) else {
            self.report(Problem::WrongKind {
                span: e.span,
                expected: "a dimension index".into(),
                found: "an expression".into(),
            });
            return None;
        };
        let r = rank as i64;
        if k < -r || k >= r {
            self.report(Problem::DimIndex {
                span: e.span,
                index: k,
                rank,
            });
            return None;
        }
        Some(if k < 0 { (k + r) as usize } else { k as usize })
    }

    fn arity(&mut self, name: &str, args: &Args, min: usize, max: usize, e: &Expr) -> bool {
        let n = args.pos.len();
        if n < min || n > max {
            let expected = if min == max {
                format!(
                    "{min} positional argument{}",
                    if min == 1 { "" } else { "s" }
                )
            } else {
                format!("{min} to {max} positional arguments")
            };
            self.report(Problem::Arity {
                span: e.span,
                callee: name.into(),
                expected,
                found: n,
                decl: None,
            });
            return false;
        }
        true
    }

    fn known_named(&mut self, name: &str, args: &Args, known: &[&str]) -> bool {
        for (k, _) in &args.named {
            if !known.contains(&k.name.as_str()) {
                self.report(Problem::NamedArg {
                    span: k.span,
                    callee: name.into(),
                    name: k.name.clone(),
                    known: known.iter().map(|s| s.to_string()).collect(),
                    missing: false,
                });
                return false;
            }
        }
        true
    }

    fn tensor_arg(
        &mut self,
        inst: &Rc<Inst>,
        e: &Expr,
        scope: &mut Scope,
        what: &str,
    ) -> Option<TType> {
        let v = self.expr(inst, e, scope);
        self.arg_ids.push(self.last);
        self.tensor(v, e, what)
    }

    /// Ask for a layout of one dimension: `None` = replicated.
    fn replicate_dim(&mut self, t: &TType, dim: usize, span: Span, scope: &Scope) -> TType {
        if t.dims[dim].axes.is_empty() {
            return t.clone();
        }
        let mut target = vec![None; t.rank()];
        target[dim] = Some(vec![]);
        self.reshard(t, &target, &t.pending, span, scope)
    }

    /// A built-in call: checked by `builtin_rule`, emitted as one node whose
    /// operands are its tensor arguments and whose result type carries the layout
    /// (the reshards the rule reported are implied by it).
    pub(super) fn builtin(
        &mut self,
        inst: &Rc<Inst>,
        name: &str,
        name_span: Span,
        raw: &[Arg],
        e: &Expr,
        scope: &mut Scope,
    ) -> Val {
        let saved_ids = std::mem::take(&mut self.arg_ids);
        let saved_in = std::mem::replace(&mut self.in_builtin, true);
        let r = self.builtin_rule(inst, name, name_span, raw, e, scope);
        self.in_builtin = saved_in;
        let ids = std::mem::replace(&mut self.arg_ids, saved_ids);
        if let (Val::T(t), true) = (&r, self.emit.is_some()) {
            let text = |s: Span| self.sources.get(s.file).snippet(s).to_string();
            let mut axes = Vec::new();
            let mut attrs: Vec<(String, String)> = Vec::new();
            for a in raw {
                match a {
                    Arg::Pos(x) => match &x.kind {
                        ExprKind::Name(n)
                            if self.mesh.is_some_and(|m| m.axis(n).is_some())
                                && !scope.vars.contains_key(n) =>
                        {
                            axes.push(n.clone())
                        }
                        ExprKind::Name(n)
                            if scope.vars.contains_key(n) || inst.weights.contains_key(n) => {}
                        ExprKind::Str(_)
                        | ExprKind::List(_)
                        | ExprKind::Int(_)
                        | ExprKind::Float(_)
                        | ExprKind::Neg(_)
                        | ExprKind::Name(_) => attrs.push((String::new(), text(x.span))),
                        _ => {}
                    },
                    Arg::Named(k, v) => attrs.push((k.name.clone(), text(v.span()))),
                    Arg::Arrow(..) => {}
                }
            }
            if name == "lookup" {
                // The runtime needs the table and its combiner.
                let table = raw
                    .first()
                    .and_then(|a| match a {
                        Arg::Pos(Expr {
                            kind: ExprKind::Name(n),
                            ..
                        }) => Some(n.clone()),
                        _ => None,
                    })
                    .and_then(|f| self.prog.features.iter().find(|x| x.name.name == f))
                    .and_then(|f| self.spec.table(&f.table.name));
                if let Some(t) = table {
                    attrs.push(("combiner".into(), t.combiner.name().into()));
                    attrs.push(("table".into(), t.name.clone()));
                }
            }
            let collective = COLLECTIVES.contains(&name);
            let op = if collective {
                if axes.is_empty() {
                    // `reduce(x)` / `psum(x)`: every pending axis of the operand.
                    axes = ids
                        .first()
                        .copied()
                        .flatten()
                        .and_then(|i| {
                            self.emit
                                .as_ref()
                                .map(|p| p.nodes[i as usize].ty.pending.keys().cloned().collect())
                        })
                        .unwrap_or_default();
                }
                crate::spmd::Op::Collective(name.to_string(), axes, attrs)
            } else {
                if !axes.is_empty() {
                    attrs.extend(axes.into_iter().map(|a| (String::new(), a)));
                }
                crate::spmd::Op::Builtin(name.to_string(), attrs)
            };
            self.emit_node(op, ids, &t.clone(), e.span);
        }
        r
    }

    fn builtin_rule(
        &mut self,
        inst: &Rc<Inst>,
        name: &str,
        name_span: Span,
        raw: &[Arg],
        e: &Expr,
        scope: &mut Scope,
    ) -> Val {
        let args = Args::new(raw);
        let _ = name_span;
        macro_rules! t_arg {
            ($i:expr, $what:expr) => {
                match self.tensor_arg(inst, args.pos[$i], scope, $what) {
                    Some(t) => t,
                    None => return Val::Poison,
                }
            };
        }
        match name {
            n if UNARY.contains(&n) => {
                if !self.arity(name, &args, 1, 1, e) || !self.known_named(name, &args, &[]) {
                    return Val::Poison;
                }
                let t = t_arg!(0, &format!("`{name}`"));
                if !t.dtype.is_float() {
                    self.report(Problem::DType {
                        span: args.pos[0].span,
                        expected: "a float dtype".into(),
                        found: t.dtype.name().into(),
                        other: None,
                    });
                    return Val::Poison;
                }
                if !self.need_reduced(&t, name, args.pos[0], scope) {
                    return Val::Poison;
                }
                Val::T(t)
            }
            "dropout" | "stop_gradient" => {
                let max = if name == "dropout" { 2 } else { 1 };
                if !self.arity(name, &args, 1, max, e) || !self.known_named(name, &args, &["rate"])
                {
                    return Val::Poison;
                }
                Val::T(t_arg!(0, &format!("`{name}`")))
            }
            "softmax" | "log_softmax" => {
                if !self.arity(name, &args, 1, 2, e) || !self.known_named(name, &args, &["dim"]) {
                    return Val::Poison;
                }
                let t = t_arg!(0, &format!("`{name}`"));
                if !self.need_reduced(&t, name, args.pos[0], scope) {
                    return Val::Poison;
                }
                let de = args.pos.get(1).copied().or(args.named_expr("dim"));
                let dim = match de {
                    Some(d) => match self.dim_index(d, t.rank()) {
                        Some(k) => k,
                        None => return Val::Poison,
                    },
                    None if t.rank() > 0 => t.rank() - 1,
                    None => {
                        self.report(Problem::Rank {
                            span: args.pos[0].span,
                            expected: 1,
                            found: 0,
                            ty: t.to_string(),
                            decl: None,
                        });
                        return Val::Poison;
                    }
                };
                Val::T(self.replicate_dim(&t, dim, e.span, scope))
            }
            "layer_norm" | "rms_norm" => {
                let n_params = if name == "layer_norm" { 3 } else { 2 };
                if !self.arity(name, &args, n_params, n_params, e)
                    || !self.known_named(name, &args, &["eps"])
                {
                    return Val::Poison;
                }
                let t = t_arg!(0, &format!("`{name}`"));
                if !self.need_reduced(&t, name, args.pos[0], scope) {
                    return Val::Poison;
                }
                if t.rank() == 0 {
                    self.report(Problem::Rank {
                        span: args.pos[0].span,
                        expected: 1,
                        found: 0,
                        ty: t.to_string(),
                        decl: None,
                    });
                    return Val::Poison;
                }
                let last = t.dims[t.rank() - 1].size.clone();
                for i in 1..n_params {
                    let w = t_arg!(i, "a normalization scale or bias");
                    if w.rank() != 1 || w.dims[0].size != last {
                        self.report(Problem::Mismatch {
                            span: args.pos[i].span,
                            expected: format!("{}[{last}]", t.dtype.name()),
                            found: w.to_string(),
                            decl: None,
                            detail: format!("must match the normalized dimension, {last}"),
                        });
                        return Val::Poison;
                    }
                }
                Val::T(self.replicate_dim(&t, t.rank() - 1, e.span, scope))
            }
            "sum" | "mean" | "max" | "min" => {
                if !self.arity(name, &args, 1, 2, e) || !self.known_named(name, &args, &["dim"]) {
                    return Val::Poison;
                }
                let t = t_arg!(0, &format!("`{name}`"));
                let op = match name {
                    "max" => ReduceOp::Max,
                    "min" => ReduceOp::Min,
                    _ => ReduceOp::Sum,
                };
                if op != ReduceOp::Sum && !self.need_reduced(&t, name, args.pos[0], scope) {
                    return Val::Poison;
                }
                let dims: Vec<usize> = match args.pos.get(1).copied().or(args.named_expr("dim")) {
                    None => (0..t.rank()).collect(),
                    Some(Expr {
                        kind: ExprKind::List(items),
                        ..
                    }) => {
                        let mut v = Vec::new();
                        for it in items {
                            let ie = match it {
                                ListItem::Expr(x) => x.clone(),
                                ListItem::Dim(ast::DimSpec::Dim {
                                    size: ast::DimExpr::Int(k, s),
                                    axes: None,
                                    ..
                                }) => Expr {
                                    kind: ExprKind::Int(*k),
                                    span: *s,
                                },
                                other => Expr {
                                    kind: ExprKind::Str(String::new()),
                                    span: match other {
                                        ListItem::Dim(d) => d.span(),
                                        ListItem::Expr(x) => x.span,
                                    },
                                },
                            };
                            match self.dim_index(&ie, t.rank()) {
                                Some(k) => v.push(k),
                                None => return Val::Poison,
                            }
                        }
                        v
                    }
                    Some(d) => match self.dim_index(d, t.rank()) {
                        Some(k) => vec![k],
                        None => return Val::Poison,
                    },
                };
                let mut out = TType {
                    dtype: t.dtype,
                    dims: vec![],
                    pending: t.pending.clone(),
                };
                for (i, d) in t.dims.iter().enumerate() {
                    if dims.contains(&i) {
                        for a in &d.axes {
                            out.pending.insert(a.clone(), op);
                        }
                    } else {
                        out.dims.push(d.clone());
                    }
                }
                Val::T(out)
            }
            "einsum" => self.einsum(inst, &args, e, scope),
            "reshape" => self.reshape(inst, &args, e, scope),
            "transpose" => {
                if !self.arity(name, &args, 2, 2, e) {
                    return Val::Poison;
                }
                let t = t_arg!(0, "`transpose`");
                let ExprKind::List(items) = &args.pos[1].kind else {
                    self.report(Problem::WrongKind {
                        span: args.pos[1].span,
                        expected: "a permutation like `[0, 2, 1]`".into(),
                        found: "an expression".into(),
                    });
                    return Val::Poison;
                };
                let mut perm = Vec::new();
                for it in items {
                    let k = match it {
                        ListItem::Dim(ast::DimSpec::Dim {
                            size: ast::DimExpr::Int(k, _),
                            axes: None,
                            ..
                        }) => *k,
                        ListItem::Expr(x) => int_of(x).unwrap_or(-1),
                        _ => -1,
                    };
                    perm.push(k);
                }
                let mut sorted = perm.clone();
                sorted.sort();
                if perm.len() != t.rank() || sorted != (0..t.rank() as i64).collect::<Vec<_>>() {
                    self.report(Problem::DimIndex {
                        span: args.pos[1].span,
                        index: perm
                            .iter()
                            .copied()
                            .find(|k| *k < 0 || *k >= t.rank() as i64)
                            .unwrap_or(perm.len() as i64),
                        rank: t.rank(),
                    });
                    return Val::Poison;
                }
                let dims = perm.iter().map(|&k| t.dims[k as usize].clone()).collect();
                Val::T(TType {
                    dtype: t.dtype,
                    dims,
                    pending: t.pending.clone(),
                })
            }
            "cast" => {
                if !self.arity(name, &args, 2, 2, e) {
                    return Val::Poison;
                }
                let t = t_arg!(0, "`cast`");
                let dt = match &args.pos[1].kind {
                    ExprKind::Name(n) => DType::parse(n),
                    _ => None,
                };
                let Some(dt) = dt else {
                    self.report(Problem::WrongKind {
                        span: args.pos[1].span,
                        expected: "a dtype (f32, bf16, f16, f64, i32, i64, bool)".into(),
                        found: "something else".into(),
                    });
                    return Val::Poison;
                };
                Val::T(TType { dtype: dt, ..t })
            }
            "one_hot" => {
                if !self.arity(name, &args, 2, 2, e) {
                    return Val::Poison;
                }
                let t = t_arg!(0, "`one_hot`");
                if t.dtype.is_float() {
                    self.report(Problem::DType {
                        span: args.pos[0].span,
                        expected: "i32".into(),
                        found: t.dtype.name().into(),
                        other: None,
                    });
                    return Val::Poison;
                }
                let Some((de, axes)) = super::expr_to_dim(args.pos[1]) else {
                    self.report(Problem::WrongKind {
                        span: args.pos[1].span,
                        expected: "a size".into(),
                        found: "an expression".into(),
                    });
                    return Val::Poison;
                };
                let Some(n) = self.eval_dim(inst, &de, scope, false) else {
                    return Val::Poison;
                };
                let mut out = t.clone();
                out.dtype = DType::F32;
                let mut ax = n.axes.unwrap_or_default();
                if let Some(list) = axes {
                    ax = list
                        .iter()
                        .filter(|a| self.check_axis(a))
                        .map(|a| a.name.clone())
                        .collect();
                }
                let d = Dim {
                    size: n.size,
                    axes: ax,
                };
                if !self.check_dim(&d, args.pos[1].span, "the class dimension of `one_hot`") {
                    return Val::Poison;
                }
                out.dims.push(d);
                Val::T(out)
            }
            "embed" => {
                if !self.arity(name, &args, 2, 2, e) {
                    return Val::Poison;
                }
                let w = t_arg!(0, "the embedding table of `embed`");
                let ids = t_arg!(1, "the ids of `embed`");
                if w.rank() != 2 {
                    self.report(Problem::Rank {
                        span: args.pos[0].span,
                        expected: 2,
                        found: w.rank(),
                        ty: w.to_string(),
                        decl: None,
                    });
                    return Val::Poison;
                }
                if ids.dtype.is_float() {
                    self.report(Problem::DType {
                        span: args.pos[1].span,
                        expected: "i32".into(),
                        found: ids.dtype.name().into(),
                        other: None,
                    });
                    return Val::Poison;
                }
                // Vocab-parallel (seed 001): each shard embeds the ids in its window, zero
                // elsewhere; the result owes a sum over the vocab axes.
                let mut out = TType {
                    dtype: w.dtype,
                    dims: ids.dims.clone(),
                    pending: ids.pending.clone(),
                };
                out.dims.push(w.dims[1].clone());
                for a in &w.dims[0].axes {
                    out.pending.insert(a.clone(), ReduceOp::Sum);
                }
                if let Some(ax) = twice(&out.dims).or_else(|| {
                    out.dims
                        .iter()
                        .flat_map(|d| d.axes.iter())
                        .find(|a| out.pending.contains_key(*a))
                        .cloned()
                }) {
                    self.report_traced(
                        Problem::Ambiguous {
                            span: e.span,
                            lhs: (args.pos[0].span, w.to_string()),
                            rhs: (args.pos[1].span, ids.to_string()),
                            detail: format!("axis `{ax}` would be used twice in the result"),
                        },
                        e,
                        scope,
                    );
                    return Val::Poison;
                }
                Val::T(out)
            }
            "lookup" => self.lookup(inst, &args, e, scope),
            "causal_attention" => {
                if !self.arity(name, &args, 3, 3, e) {
                    return Val::Poison;
                }
                let q = t_arg!(0, "`causal_attention`");
                let k = t_arg!(1, "`causal_attention`");
                let v = t_arg!(2, "`causal_attention`");
                for (t, x) in [(&q, args.pos[0]), (&k, args.pos[1]), (&v, args.pos[2])] {
                    if t.rank() != 4 {
                        self.report(Problem::Rank {
                            span: x.span,
                            expected: 4,
                            found: t.rank(),
                            ty: format!("{t} (want [batch, seq, heads, head_dim])"),
                            decl: None,
                        });
                        return Val::Poison;
                    }
                    if !self.need_reduced(t, "causal_attention", x, scope) {
                        return Val::Poison;
                    }
                }
                for (t, x) in [(&k, args.pos[1]), (&v, args.pos[2])] {
                    if t.dims != q.dims || t.dtype != q.dtype {
                        self.report(Problem::Mismatch {
                            span: x.span,
                            expected: q.to_string(),
                            found: t.to_string(),
                            decl: None,
                            detail: "q, k and v must have the same type".into(),
                        });
                        return Val::Poison;
                    }
                }
                let h = &q.dims[2];
                let n = self.axes_product(&h.axes);
                if let Some(heads) = h.size.as_const() {
                    if n > 1 && heads % n != 0 {
                        self.report(Problem::HeadsIndivisible {
                            span: args.pos[0].span,
                            heads,
                            axes: Self::axes_text(&h.axes),
                            n,
                        });
                        return Val::Poison;
                    }
                }
                // The sequence dim is mixed by attention: it must be whole on each device.
                Val::T(self.replicate_dim(&q, 1, e.span, scope))
            }
            "softmax_cross_entropy" => {
                if !self.arity(name, &args, 2, 2, e) {
                    return Val::Poison;
                }
                let l = t_arg!(0, "the logits");
                let y = t_arg!(1, "the labels");
                if !self.need_reduced(&l, name, args.pos[0], scope) {
                    return Val::Poison;
                }
                if l.rank() == 0
                    || y.rank() + 1 != l.rank()
                    || y.dims.iter().zip(&l.dims).any(|(a, b)| a.size != b.size)
                {
                    self.report(Problem::Mismatch {
                        span: args.pos[1].span,
                        expected: format!(
                            "labels shaped like the logits without their last dim ({l})"
                        ),
                        found: y.to_string(),
                        decl: None,
                        detail: "labels do not match the logits".into(),
                    });
                    return Val::Poison;
                }
                Val::T(TType::scalar(l.dtype))
            }
            "reduce" => {
                // Explicit all-reduce of whatever is pending (identity when nothing is):
                // lets a generic layer serve both column- and row-parallel use.
                if !self.arity(name, &args, 1, 1, e) {
                    return Val::Poison;
                }
                let mut t = t_arg!(0, "`reduce`");
                let owed: Vec<String> = t.pending.keys().cloned().collect();
                t.pending.clear();
                for a in owed {
                    self.comm("all-reduce", &a, &t, 2.0, e.span);
                }
                Val::T(t)
            }
            "psum" | "pmean" | "pmax" | "pmin" => {
                if args.pos.is_empty() {
                    self.arity(name, &args, 1, 8, e);
                    return Val::Poison;
                }
                let mut t = t_arg!(0, &format!("`{name}`"));
                let want = if name == "pmax" {
                    ReduceOp::Max
                } else if name == "pmin" {
                    ReduceOp::Min
                } else {
                    ReduceOp::Sum
                };
                let axes: Vec<String> = if args.pos.len() == 1 {
                    let a: Vec<String> = t
                        .pending
                        .iter()
                        .filter(|(_, o)| **o == want)
                        .map(|(a, _)| a.clone())
                        .collect();
                    if a.is_empty() {
                        self.report_traced(Problem::BadCollective { span: e.span, message: format!("`{name}` of a value with no pending {} (`{t}`)", want.name()), help: format!("name the axis to reduce a value that differs per device (`{name}(x, axis)`), or remove the `{name}`") }, args.pos[0], scope);
                        return Val::Poison;
                    }
                    a
                } else {
                    let mut v = Vec::new();
                    for x in &args.pos[1..] {
                        match self.axis_arg(x) {
                            Some(a) => v.push(a),
                            None => return Val::Poison,
                        }
                    }
                    v
                };
                for a in &axes {
                    match t.pending.get(a) {
                        Some(o) if *o == want => {
                            t.pending.remove(a);
                            self.comm("all-reduce", a, &t, 2.0, e.span);
                        }
                        Some(o) => {
                            self.report_traced(Problem::BadCollective { span: e.span, message: format!("`{name}` over `{a}` of a value with a pending {} over `{a}`", o.name()), help: format!("use `{}`", reduce_name(*o)) }, args.pos[0], scope);
                            return Val::Poison;
                        }
                        None if t.all_axes().contains(&a.as_str()) => {
                            self.report_traced(Problem::BadCollective { span: e.span, message: format!("`{name}` over `{a}` of a value split over `{a}` (`{t}`)"), help: format!("to assemble the pieces use `all_gather(x, {a})`; to reduce them, reduce over the dimension first (`sum(x, dim)`)") }, args.pos[0], scope);
                            return Val::Poison;
                        }
                        None => {
                            // Explicit reduction of a per-device (varying) value, e.g. a
                            // loss or a statistic inside a local block: allowed.
                        }
                    }
                }
                Val::T(t)
            }
            "all_gather" => {
                if !self.arity(name, &args, 2, 2, e) || !self.known_named(name, &args, &["dim"]) {
                    return Val::Poison;
                }
                let mut t = t_arg!(0, "`all_gather`");
                let Some(a) = self.axis_arg(args.pos[1]) else {
                    return Val::Poison;
                };
                let dim = match args.named_expr("dim") {
                    Some(d) => match self.dim_index(d, t.rank()) {
                        Some(k) => Some(k),
                        None => return Val::Poison,
                    },
                    None => t.dims.iter().position(|d| d.axes.contains(&a)),
                };
                match dim {
                    Some(k) if t.dims[k].axes.last() == Some(&a) => {
                        t.dims[k].axes.pop();
                        self.comm("all-gather", &a, &t, 1.0, e.span);
                        Val::T(t)
                    }
                    _ => {
                        self.report_traced(Problem::BadCollective { span: e.span, message: format!("`all_gather` over `{a}`, but no dimension of `{t}` is split (innermost) over `{a}`"), help: "an all_gather assembles a dimension that is split over the axis; check which axis splits which dimension".into() }, args.pos[0], scope);
                        Val::Poison
                    }
                }
            }
            "psum_scatter" => {
                if !self.arity(name, &args, 2, 2, e) || !self.known_named(name, &args, &["dim"]) {
                    return Val::Poison;
                }
                let mut t = t_arg!(0, "`psum_scatter`");
                let Some(a) = self.axis_arg(args.pos[1]) else {
                    return Val::Poison;
                };
                if t.pending.get(&a) != Some(&ReduceOp::Sum) {
                    self.report_traced(Problem::BadCollective { span: e.span, message: format!("`psum_scatter` over `{a}` of a value with no pending sum over `{a}` (`{t}`)"), help: "psum_scatter reduces a partial value and splits the result; to split a whole value use a layout annotation".into() }, args.pos[0], scope);
                    return Val::Poison;
                }
                let k = match args.named_expr("dim") {
                    Some(d) => match self.dim_index(d, t.rank()) {
                        Some(k) => k,
                        None => return Val::Poison,
                    },
                    None => 0,
                };
                if t.rank() == 0 {
                    self.report(Problem::Rank {
                        span: args.pos[0].span,
                        expected: 1,
                        found: 0,
                        ty: t.to_string(),
                        decl: None,
                    });
                    return Val::Poison;
                }
                self.comm("reduce-scatter", &a, &t, 1.0, e.span);
                t.pending.remove(&a);
                t.dims[k].axes.push(a);
                let d = t.dims[k].clone();
                if !self.check_dim(&d, e.span, &format!("dimension {k}")) {
                    return Val::Poison;
                }
                Val::T(t)
            }
            "all_to_all" => {
                if !self.arity(name, &args, 2, 2, e)
                    || !self.known_named(name, &args, &["from", "to"])
                {
                    return Val::Poison;
                }
                let mut t = t_arg!(0, "`all_to_all`");
                let Some(a) = self.axis_arg(args.pos[1]) else {
                    return Val::Poison;
                };
                let (Some(fe), Some(te)) = (args.named_expr("from"), args.named_expr("to")) else {
                    self.report(Problem::NamedArg {
                        span: e.span,
                        callee: name.into(),
                        name: "from` and `to".into(),
                        known: vec![],
                        missing: true,
                    });
                    return Val::Poison;
                };
                let (Some(f), Some(to)) =
                    (self.dim_index(fe, t.rank()), self.dim_index(te, t.rank()))
                else {
                    return Val::Poison;
                };
                if t.dims[f].axes.last() != Some(&a) {
                    self.report_traced(Problem::BadCollective { span: fe.span, message: format!("`all_to_all` from dimension {f}, which is not split over `{a}` in `{t}`"), help: "`from` names the dimension currently split over the axis".into() }, args.pos[0], scope);
                    return Val::Poison;
                }
                t.dims[f].axes.pop();
                self.comm("all-to-all", &a, &t, 1.0, e.span);
                t.dims[to].axes.push(a);
                let d = t.dims[to].clone();
                if !self.check_dim(&d, te.span, &format!("dimension {to}")) {
                    return Val::Poison;
                }
                Val::T(t)
            }
            "ppermute" => {
                if !self.arity(name, &args, 2, 2, e) || !self.known_named(name, &args, &["shift"]) {
                    return Val::Poison;
                }
                let t = t_arg!(0, "`ppermute`");
                let Some(ax) = self.axis_arg(args.pos[1]) else {
                    return Val::Poison;
                };
                if let Some(b) = self.bytes_text(&t, 1.0).num {
                    if self.plan.is_some() {
                        self.add_comm("ppermute", vec![ax], b, e.span, true);
                    }
                }
                Val::T(t)
            }
            "axis_index" => {
                if !self.arity(name, &args, 1, 1, e) {
                    return Val::Poison;
                }
                let Some(ax) = self.axis_arg(args.pos[0]) else {
                    return Val::Poison;
                };
                // Each device holds a different value, so it cannot be typed as
                // replicated: it is the vector [0, 1, ..., n-1] split over the
                // axis, one element per device (local shape [1]).
                let n = self.axes_product(std::slice::from_ref(&ax));
                Val::T(TType {
                    dtype: DType::I32,
                    dims: vec![Dim {
                        size: Poly::constant(n),
                        axes: vec![ax],
                    }],
                    pending: Default::default(),
                })
            }
            _ => Val::Poison,
        }
    }

    fn einsum(&mut self, inst: &Rc<Inst>, args: &Args, e: &Expr, scope: &mut Scope) -> Val {
        if args.pos.len() < 2 {
            self.arity("einsum", args, 2, 9, e);
            return Val::Poison;
        }
        let ExprKind::Str(spec) = &args.pos[0].kind else {
            self.report(Problem::WrongKind {
                span: args.pos[0].span,
                expected: "an einsum specification string".into(),
                found: "an expression".into(),
            });
            return Val::Poison;
        };
        let sspan = args.pos[0].span;
        let spec: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
        let Some((ins, out)) = spec.split_once("->") else {
            self.report(Problem::Einsum {
                span: sspan,
                message: "missing `->` and output".into(),
            });
            return Val::Poison;
        };
        let ins: Vec<&str> = ins.split(',').collect();
        if let Some(bad) = spec
            .chars()
            .find(|c| !c.is_ascii_alphabetic() && !",->".contains(*c))
        {
            self.report(Problem::Einsum {
                span: sspan,
                message: format!("`{bad}` is not a dimension letter"),
            });
            return Val::Poison;
        }
        if ins.len() != args.pos.len() - 1 {
            self.report(Problem::Einsum {
                span: sspan,
                message: format!(
                    "{} inputs in the specification, {} operands given",
                    ins.len(),
                    args.pos.len() - 1
                ),
            });
            return Val::Poison;
        }
        let mut ops = Vec::new();
        for (i, x) in args.pos[1..].iter().enumerate() {
            let Some(t) = self.tensor_arg(inst, x, scope, "`einsum`") else {
                return Val::Poison;
            };
            if t.rank() != ins[i].len() {
                self.report(Problem::Einsum {
                    span: x.span,
                    message: format!(
                        "operand {} has rank {} but `{}` names {} dimensions",
                        i + 1,
                        t.rank(),
                        ins[i],
                        ins[i].len()
                    ),
                });
                return Val::Poison;
            }
            ops.push((t, *x));
        }
        if ops.windows(2).any(|w| w[0].0.dtype != w[1].0.dtype) {
            let (a, b) = (
                &ops[0],
                ops.iter()
                    .find(|o| o.0.dtype != ops[0].0.dtype)
                    .unwrap_or(&ops[0]),
            );
            self.report(Problem::DType {
                span: b.1.span,
                expected: a.0.dtype.name().into(),
                found: b.0.dtype.name().into(),
                other: Some(a.1.span),
            });
            return Val::Poison;
        }
        let pendings = ops.iter().filter(|o| !o.0.pending.is_empty()).count();
        if pendings > 1 {
            let o = ops
                .iter()
                .rev()
                .find(|o| !o.0.pending.is_empty())
                .map(|o| (o.0.clone(), o.1));
            if let Some((t, x)) = o {
                self.need_reduced(&t, "an einsum of two partial values", x, scope);
            }
            return Val::Poison;
        }
        // Each letter: one size and one layout across all operands.
        let mut letters: BTreeMap<char, (Dim, usize, usize)> = BTreeMap::new();
        for (oi, (t, x)) in ops.iter().enumerate() {
            for (di, c) in ins[oi].chars().enumerate() {
                let d = &t.dims[di];
                match letters.get_mut(&c) {
                    None => {
                        letters.insert(c, (d.clone(), oi, di));
                    }
                    Some((prev, poi, _)) => {
                        if prev.size != d.size {
                            let (pt, px) = &ops[*poi];
                            self.report_traced(
                                Problem::Contraction {
                                    span: e.span,
                                    lhs: (px.span, pt.to_string()),
                                    rhs: (x.span, t.to_string()),
                                    lhs_dim: format!("`{c}` = {}", prev.size),
                                    rhs_dim: format!("`{c}` = {}", d.size),
                                },
                                e,
                                scope,
                            );
                            return Val::Poison;
                        }
                        if prev.axes.is_empty() {
                            prev.axes = d.axes.clone();
                        } else if !d.axes.is_empty() && d.axes != prev.axes {
                            let (pt, px) = &ops[*poi];
                            self.report_traced(
                                Problem::Ambiguous {
                                    span: e.span,
                                    lhs: (
                                        px.span,
                                        format!(
                                            "`{c}` split over {} in `{pt}`",
                                            Self::axes_text(&prev.axes)
                                        ),
                                    ),
                                    rhs: (
                                        x.span,
                                        format!(
                                            "`{c}` split over {} in `{t}`",
                                            Self::axes_text(&d.axes)
                                        ),
                                    ),
                                    detail: format!(
                                        "dimension `{c}` is split differently in two operands"
                                    ),
                                },
                                e,
                                scope,
                            );
                            return Val::Poison;
                        }
                    }
                }
            }
        }
        let mut dims = Vec::new();
        for c in out.chars() {
            let Some((d, _, _)) = letters.get(&c) else {
                self.report(Problem::Einsum {
                    span: sspan,
                    message: format!("output letter `{c}` does not appear in any input"),
                });
                return Val::Poison;
            };
            if out.matches(c).count() > 1 {
                self.report(Problem::Einsum {
                    span: sspan,
                    message: format!("output letter `{c}` appears twice"),
                });
                return Val::Poison;
            }
            dims.push(d.clone());
        }
        let mut pending = ops
            .iter()
            .flat_map(|o| o.0.pending.clone())
            .collect::<BTreeMap<_, _>>();
        for (c, (d, _, _)) in &letters {
            if !out.contains(*c) {
                for a in &d.axes {
                    pending.insert(a.clone(), ReduceOp::Sum);
                }
            }
        }
        if let Some(ax) = twice(&dims).or_else(|| {
            dims.iter()
                .flat_map(|d| d.axes.iter())
                .find(|a| pending.contains_key(*a))
                .cloned()
        }) {
            self.report_traced(
                Problem::Ambiguous {
                    span: e.span,
                    lhs: (ops[0].1.span, ops[0].0.to_string()),
                    rhs: (ops[ops.len() - 1].1.span, ops[ops.len() - 1].0.to_string()),
                    detail: format!("axis `{ax}` would be used twice in the result"),
                },
                e,
                scope,
            );
            return Val::Poison;
        }
        // 2 × the local size of the full index space.
        let mut space = 1.0f64;
        let mut known = true;
        for (d, _, _) in letters.values() {
            match d.size.substitute(&self.bound).and_then(|p| p.as_const()) {
                Some(v) => space *= v as f64 / self.axes_product(&d.axes).max(1) as f64,
                None => known = false,
            }
        }
        if known {
            self.add_flops(2.0 * space);
        }
        Val::T(TType {
            dtype: ops[0].0.dtype,
            dims,
            pending,
        })
    }

    fn reshape(&mut self, inst: &Rc<Inst>, args: &Args, e: &Expr, scope: &mut Scope) -> Val {
        if !self.arity("reshape", args, 2, 2, e) {
            return Val::Poison;
        }
        let Some(t) = self.tensor_arg(inst, args.pos[0], scope, "`reshape`") else {
            return Val::Poison;
        };
        let ExprKind::List(items) = &args.pos[1].kind else {
            self.report(Problem::WrongKind {
                span: args.pos[1].span,
                expected: "a list of dimensions like `[B, T * D]`".into(),
                found: "an expression".into(),
            });
            return Val::Poison;
        };
        // Target dims: size (None for -1), explicit axes, span.
        let mut target: Vec<(Option<Poly>, Option<Vec<String>>, Span)> = Vec::new();
        for it in items {
            match it {
                ListItem::Dim(ast::DimSpec::Dim { size, axes, span }) => {
                    let Some(v) = self.eval_dim(inst, size, scope, true) else {
                        return Val::Poison;
                    };
                    let v_size = v.size.substitute(&scope.tyvars).unwrap_or(v.size);
                    let ax = match axes {
                        Some(list) => {
                            let mut names = Vec::new();
                            for a in list {
                                if !self.check_axis(a) {
                                    return Val::Poison;
                                }
                                names.push(a.name.clone());
                            }
                            Some(names)
                        }
                        None => v.axes,
                    };
                    target.push((Some(v_size), ax, *span));
                }
                ListItem::Expr(x) if int_of(x) == Some(-1) => target.push((None, None, x.span)),
                other => {
                    let span = match other {
                        ListItem::Dim(d) => d.span(),
                        ListItem::Expr(x) => x.span,
                    };
                    self.report(Problem::WrongKind {
                        span,
                        expected: "a dimension size (or -1)".into(),
                        found: "an expression".into(),
                    });
                    return Val::Poison;
                }
            }
        }
        let Some(total) = t.numel() else {
            return Val::Poison;
        };
        let infer = target.iter().filter(|d| d.0.is_none()).count();
        if infer > 1 {
            self.report(Problem::BadDim {
                span: args.pos[1].span,
                expr: "-1".into(),
                reason: "at most one dimension can be inferred".into(),
            });
            return Val::Poison;
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
            return Val::Poison;
        };
        if infer == 1 {
            match total.div(&known) {
                Some(q) => {
                    if let Some(d) = target.iter_mut().find(|d| d.0.is_none()) {
                        d.0 = Some(q);
                    }
                }
                None => {
                    self.report_traced(
                        Problem::ReshapeCount {
                            span: args.pos[1].span,
                            from: from_text,
                            to: "a shape with -1".into(),
                            from_n: total.to_string(),
                            to_n: format!("a multiple of {known}"),
                        },
                        args.pos[0],
                        scope,
                    );
                    return Val::Poison;
                }
            }
        } else {
            let tn = known.substitute(&self.bound).unwrap_or(known.clone());
            let fnn = total.substitute(&self.bound).unwrap_or(total.clone());
            if tn != fnn {
                let to_text = format!(
                    "[{}]",
                    target
                        .iter()
                        .map(|d| d.0.as_ref().map_or("?".into(), |p| p.to_string()))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                self.report_traced(
                    Problem::ReshapeCount {
                        span: args.pos[1].span,
                        from: from_text,
                        to: to_text,
                        from_n: total.to_string(),
                        to_n: known.to_string(),
                    },
                    args.pos[0],
                    scope,
                );
                return Val::Poison;
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
                self.report_traced(
                    Problem::ReshapeSharding { span: args.pos[1].span, message: format!("reshape merges dimension {k} (split over {}) into a larger dimension as a minor part", Self::axes_text(&t.dims[k].axes)), help: "only the leading dimension of a merged group may be split; all_gather it first or transpose it to the front".into() },
                    args.pos[0],
                    scope,
                );
                return Val::Poison;
            }
            let axes = t.dims[lead].axes.clone();
            let n = self.axes_product(&axes);
            let s = sizes[jlead]
                .substitute(&self.bound)
                .unwrap_or(sizes[jlead].clone());
            let ok = match s.as_const() {
                Some(v) => v % n == 0,
                None => true,
            };
            if !ok {
                self.report_traced(
                    Problem::ReshapeSharding { span: target[jlead].2, message: format!("reshape splits dimension {lead} (split over {}, {} devices) so that its leading part {} is not divisible by {n}", Self::axes_text(&axes), n, sizes[jlead]), help: format!("make the new leading dimension a multiple of {n}, or all_gather before the reshape") },
                    args.pos[0],
                    scope,
                );
                return Val::Poison;
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
        let explicit: Vec<Option<Vec<String>>> = target.iter().map(|d| d.1.clone()).collect();
        if explicit.iter().any(|x| x.is_some()) {
            for (k, d) in out.dims.iter().enumerate() {
                if let Some(ax) = &explicit[k] {
                    let dd = Dim {
                        size: d.size.clone(),
                        axes: ax.clone(),
                    };
                    if !self.check_dim(&dd, target[k].2, &format!("dimension {k}")) {
                        return Val::Poison;
                    }
                }
            }
            out = self.reshard(&out, &explicit, &out.pending.clone(), e.span, scope);
        }
        Val::T(out)
    }

    fn lookup(&mut self, inst: &Rc<Inst>, args: &Args, e: &Expr, scope: &mut Scope) -> Val {
        if !self.arity("lookup", args, 2, 3, e) {
            return Val::Poison;
        }
        let ExprKind::Name(fname) = &args.pos[0].kind else {
            self.report(Problem::WrongKind {
                span: args.pos[0].span,
                expected: "a feature name".into(),
                found: "an expression".into(),
            });
            return Val::Poison;
        };
        let Some(feat) = self
            .prog
            .features
            .iter()
            .find(|f| f.name.name == *fname)
            .cloned()
        else {
            let sug = crate::diag::did_you_mean(
                fname,
                self.prog.features.iter().map(|f| f.name.name.as_str()),
            );
            self.report(Problem::UnknownName {
                span: args.pos[0].span,
                name: fname.clone(),
                what: "feature",
                suggestion: sug,
            });
            return Val::Poison;
        };
        let Some(ids) = self.tensor_arg(inst, args.pos[1], scope, "the ids of `lookup`") else {
            return Val::Poison;
        };
        if ids.dtype.is_float() {
            self.report(Problem::DType {
                span: args.pos[1].span,
                expected: feat.ty.dtype.name().into(),
                found: ids.dtype.name().into(),
                other: Some(feat.ty.dtype_span),
            });
            return Val::Poison;
        }
        // Optional per-id weights, shaped and laid out like the ids.
        if let Some(we) = args.pos.get(2) {
            let Some(w) = self.tensor_arg(inst, we, scope, "the weights of `lookup`") else {
                return Val::Poison;
            };
            if !w.dtype.is_float() || w.dims != ids.dims {
                self.report(Problem::Mismatch {
                    span: we.span,
                    expected: format!("f32{}", &ids.to_string()[ids.dtype.name().len()..]),
                    found: w.to_string(),
                    decl: None,
                    detail: "per-id weights are floats shaped and split like the ids".into(),
                });
                return Val::Poison;
            }
        }
        let Some(table) = self.spec.table(&feat.table.name).cloned() else {
            return Val::Poison;
        };
        let Some(dim) = table.dim else {
            return Val::Poison;
        };
        // The feature's declared input: [samples, valency]; ids must hold exactly that many.
        let mut fscope = Scope {
            tyvars: scope.tyvars.clone(),
            ..Scope::default()
        };
        let Some(ft) = self.eval_type(&feat.ty, inst, &mut fscope, true, None) else {
            return Val::Poison;
        };
        let ft = self.apply_bound(ft);
        let want = ft.numel().and_then(|p| p.substitute(&self.bound));
        let have = ids.numel().and_then(|p| p.substitute(&self.bound));
        if let (Some(w), Some(h)) = (&want, &have) {
            if w != h {
                self.report_traced(Problem::FeatureTable { span: args.pos[1].span, message: format!("`{fname}` takes {w} ids per batch (`{}`), but these ids hold {h} (`{ids}`)", ft), label: "these ids", table: (feat.span, "feature declared here") }, args.pos[1], scope);
                return Val::Poison;
            }
        }
        let samples = ft
            .dims
            .first()
            .map(|d| d.size.clone())
            .unwrap_or(Poly::constant(1));
        let axes = ids.dims.first().map(|d| d.axes.clone()).unwrap_or_default();
        if self.emit.is_some() {
            self.emit_table(&table, dim);
            // Ids to the owners and rows back, forward and backward.
            if let (Some(n), Some(ax)) =
                (have.as_ref().and_then(|h| h.as_const()), table.axis.clone())
            {
                let devices = self.axes_product(&axes).max(1);
                let bytes = (n / devices) as f64 * (dim as f64 * 4.0 + 8.0) * 2.0;
                if self.plan.is_some() && self.axis_size(&ax) > 1 {
                    self.add_comm("embedding all-to-all", vec![ax], bytes, e.span, false);
                }
            }
        }
        Val::T(TType::new(
            DType::F32,
            vec![
                Dim {
                    size: samples,
                    axes,
                },
                Dim::replicated(Poly::constant(dim)),
            ],
        ))
    }
}

impl<'p> Checker<'p> {
    /// An embedding table in the SPMD program: a parameter `tables.NAME` with its
    /// rows split over the table's `rows(axis)` (placed MOD over the axis's devices
    /// and their SparseCores by the runtime) and used in place: the lookup fetches
    /// the rows it needs from their owners. Its node goes first among the lookup's
    /// operands.
    fn emit_table(&mut self, table: &crate::spec::Table, dim: i64) {
        let Some(vocab) = table.vocab else {
            return;
        };
        let name = format!("tables.{}", table.name);
        let rows_axes: Vec<String> = table
            .axis
            .clone()
            .into_iter()
            .filter(|a| vocab % self.axis_size(a).max(1) == 0)
            .collect();
        let used = TType::new(
            DType::F32,
            vec![
                Dim::replicated(Poly::constant(vocab)),
                Dim::replicated(Poly::constant(dim)),
            ],
        );
        let mut stored = used.clone();
        stored.dims[0].axes = rows_axes.clone();
        // The lookup reads rows from their owners (an all-to-all of ids and rows),
        // so the table is used as stored, never gathered whole.
        let used = stored.clone();
        let id = self.emit_parameter(name, &stored, &used, table.init, table.span);
        self.arg_ids.insert(0, id);
    }
}

/// An axis that splits two dims.
fn twice(dims: &[Dim]) -> Option<String> {
    let mut seen = Vec::new();
    for d in dims {
        for a in &d.axes {
            if seen.contains(&a) {
                return Some(a.clone());
            }
            seen.push(a);
        }
    }
    None
}

#[allow(dead_code)]
fn _binding_is_used(b: &Binding) -> Span {
    b.span
}
