//! What a type rule may ask of the checker ([`Rules`]), and the helpers rules
//! share: arity and named-argument checks, dimension indices, mesh-axis
//! arguments.
//!
//! The checker implements [`Rules`]; rules never see its internals, so this
//! module (and every primitive) comes before the checker in the stage order.

use super::Prim;
use crate::ast::{self, DimExpr, Expr, ExprKind, ReduceOp};
use crate::diag::Problem;
use crate::source::Span;
use crate::types::{Dim, Poly, TType};
use std::collections::BTreeMap;

/// A call as written: its name, its span, and its positional and named arguments.
pub struct Call<'a> {
    pub name: &'a str,
    /// The whole call expression.
    pub expr: &'a Expr,
    pub pos: Vec<&'a Expr>,
    pub named: Vec<(&'a ast::Ident, &'a ast::OptValue)>,
}

impl<'a> Call<'a> {
    pub fn new(name: &'a str, expr: &'a Expr, args: &'a [ast::Arg]) -> Call<'a> {
        let mut pos = Vec::new();
        let mut named = Vec::new();
        for a in args {
            match a {
                ast::Arg::Pos(e) => pos.push(e),
                ast::Arg::Named(k, v) => named.push((k, v)),
                ast::Arg::Arrow(..) => {}
            }
        }
        Call {
            name,
            expr,
            pos,
            named,
        }
    }
    pub fn span(&self) -> Span {
        self.expr.span
    }
    /// The named argument `key`, when it is an expression.
    pub fn named_expr(&self, key: &str) -> Option<&'a Expr> {
        self.named
            .iter()
            .find(|(k, _)| k.name == key)
            .and_then(|(_, v)| match v {
                ast::OptValue::Expr(e) => Some(e),
                _ => None,
            })
    }
}

/// A rule's result: the value's type and the typed op that computes it. An
/// op with several results (`split`) gives each further one in `more`, each
/// computed by its own op from the same operands; `let (a, b, ...) = ...`
/// names them.
pub struct Typed {
    pub ty: TType,
    pub prim: Prim,
    pub more: Vec<(TType, Prim)>,
}

impl Typed {
    pub fn new(ty: TType, prim: impl Into<Prim>) -> Option<Typed> {
        Some(Typed {
            ty,
            more: Vec::new(),
            prim: prim.into(),
        })
    }
}

/// A feature a `lookup` names, as the checker resolved it.
pub struct Feature {
    /// The ids the feature takes per batch (`[samples, valency]`).
    pub ty: TType,
    pub dtype_span: Span,
    pub span: Span,
    pub table: crate::spec::Table,
}

/// The checker's services to a type rule.
pub trait Rules {
    /// Check a tensor argument and make it the op's next operand.
    fn tensor(&mut self, e: &Expr, what: &str) -> Option<TType>;
    /// Whether `name` is an axis of the mesh (reporting E0200 when not).
    fn check_axis(&mut self, name: &str, span: Span) -> bool;
    fn axis_size(&self, axis: &str) -> i64;
    /// Values of the symbolic sizes bound so far (the batch).
    fn bound(&self) -> &BTreeMap<String, Poly>;
    /// A size written in the source (`N`, `4 * D`, a layer parameter, a symbol
    /// when `symbols`), with the sharding a sharded layer parameter carries.
    fn size(&mut self, e: &DimExpr, symbols: bool) -> Option<(Poly, Option<Vec<String>>)>;
    /// Symbolic sizes bound in the function being checked.
    fn tyvars(&self) -> BTreeMap<String, Poly>;
    /// A constant integer (literal or `const`).
    fn const_int(&self, e: &DimExpr) -> Option<i64>;
    /// The number `e` folds to at check time (literals, `inf`, sizes and
    /// constants, arithmetic and the foldable functions of them: `C * 1.0`,
    /// `1.0 / sqrt(D)`), or `None` for anything that reads a tensor.
    fn number(&self, e: &Expr) -> Option<f64>;
    fn report(&mut self, p: Problem);
    /// Report with the shape-flow trace of `e`.
    fn report_traced(&mut self, p: Problem, e: &Expr);
    /// Whether `t` owes no reduction; reports E0214 for `op` otherwise.
    fn need_reduced(&mut self, t: &TType, op: &str, e: &Expr) -> bool;
    /// Move `t` to `target` (per dim, `None` keeps the value's axes) with the
    /// pending reductions `pending`, reporting each collective this inserts.
    fn reshard(
        &mut self,
        t: &TType,
        target: &[Option<Vec<String>>],
        pending: &BTreeMap<String, ReduceOp>,
        span: Span,
    ) -> TType;
    /// Report a collective the compiler inserts (a note, or an error where
    /// collectives must be explicit).
    fn implicit(
        &mut self,
        span: Span,
        what: String,
        from: String,
        to: String,
        t: &TType,
        factor: f64,
    );
    /// Whether a dimension's size is positive and divisible by its axes (reports).
    fn check_dim(&mut self, d: &Dim, span: Span, what: &str) -> bool;
    /// The layout the annotation of the enclosing `let` asks for, when `span` is
    /// its value's span and the ranks agree.
    fn hint(&self, span: Span, rank: usize) -> Option<Vec<Option<Vec<String>>>>;
    /// The feature `name` and its table (reports E0100 when unknown).
    fn feature(&mut self, name: &str, span: Span) -> Option<Feature>;
    /// Make the table's parameter the op's first operand.
    fn table_operand(&mut self, table: &crate::spec::Table);
}

/// `n` positional arguments between `min` and `max`, else E0104.
pub fn arity(cx: &mut dyn Rules, c: &Call, min: usize, max: usize) -> bool {
    let n = c.pos.len();
    if n < min || n > max {
        let expected = if min == max {
            format!(
                "{min} positional argument{}",
                if min == 1 { "" } else { "s" }
            )
        } else {
            format!("{min} to {max} positional arguments")
        };
        cx.report(Problem::Arity {
            span: c.span(),
            callee: c.name.into(),
            expected,
            found: n,
            decl: None,
        });
        return false;
    }
    true
}

/// Only the named arguments in `known`, else E0105.
pub fn known_named(cx: &mut dyn Rules, c: &Call, known: &[&str]) -> bool {
    for (k, _) in &c.named {
        if !known.contains(&k.name.as_str()) {
            cx.report(Problem::NamedArg {
                span: k.span,
                callee: c.name.into(),
                name: k.name.clone(),
                known: known.iter().map(|s| s.to_string()).collect(),
                missing: false,
            });
            return false;
        }
    }
    true
}

/// An integer literal, possibly negative.
pub fn int_of(e: &Expr) -> Option<i64> {
    match &e.kind {
        ExprKind::Int(v) => Some(*v),
        ExprKind::Neg(x) => int_of(x).and_then(|v| v.checked_neg()),
        _ => None,
    }
}

/// A dimension index into a value of rank `rank` (negative from the end).
pub fn dim_index(cx: &mut dyn Rules, e: &Expr, rank: usize) -> Option<usize> {
    let Some(k) = int_of(e) else {
        cx.report(Problem::WrongKind {
            span: e.span,
            expected: "a dimension index".into(),
            found: "an expression".into(),
        });
        return None;
    };
    let r = rank as i64;
    if k < -r || k >= r {
        cx.report(Problem::DimIndex {
            span: e.span,
            index: k,
            rank,
        });
        return None;
    }
    Some(if k < 0 { (k + r) as usize } else { k as usize })
}

/// A mesh axis written as an argument.
pub fn axis_arg(cx: &mut dyn Rules, e: &Expr) -> Option<String> {
    match &e.kind {
        ExprKind::Name(n) => cx.check_axis(n, e.span).then(|| n.clone()),
        _ => {
            cx.report(Problem::WrongKind {
                span: e.span,
                expected: "a mesh axis name".into(),
                found: "an expression".into(),
            });
            None
        }
    }
}

/// A tensor argument, or `None` (reported) for anything else.
pub fn tensor(cx: &mut dyn Rules, e: &Expr, what: &str) -> Option<TType> {
    cx.tensor(e, what)
}

/// `` `dp` `` or `` `(dp, mp)` ``, for messages.
pub fn axes_text(axes: &[String]) -> String {
    match axes.len() {
        1 => format!("`{}`", axes[0]),
        _ => format!("`({})`", axes.join(", ")),
    }
}

/// The product of the axes' sizes.
pub fn axes_product(cx: &dyn Rules, axes: &[String]) -> i64 {
    axes.iter()
        .fold(1i64, |acc, a| acc.saturating_mul(cx.axis_size(a)))
}

/// An axis that splits two dims.
pub fn twice(dims: &[Dim]) -> Option<String> {
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

/// An axis that splits a dim of `dims` and is also pending.
pub fn split_and_pending(dims: &[Dim], pending: &BTreeMap<String, ReduceOp>) -> Option<String> {
    twice(dims).or_else(|| {
        dims.iter()
            .flat_map(|d| d.axes.iter())
            .find(|a| pending.contains_key(*a))
            .cloned()
    })
}

/// Ask for one dimension of `t` to be whole on every device (a gather the
/// checker reports); other dims keep their layout.
pub fn replicate_dim(cx: &mut dyn Rules, t: &TType, dim: usize, span: Span) -> TType {
    if t.dims[dim].axes.is_empty() {
        return t.clone();
    }
    let mut target = vec![None; t.rank()];
    target[dim] = Some(vec![]);
    cx.reshard(t, &target, &t.pending, span)
}

/// E0211: `e` has the type `t` where a value of rank `expected` belongs.
pub fn rank_error(cx: &mut dyn Rules, e: &Expr, expected: usize, t: &TType) {
    cx.report(Problem::Rank {
        span: e.span,
        expected,
        found: t.rank(),
        ty: t.to_string(),
        decl: None,
    });
}

/// E0213: the result of `a op b` would split two of its dimensions over `ax`.
pub fn axis_twice(
    cx: &mut dyn Rules,
    ax: &str,
    (x, a): (&TType, &Expr),
    (y, b): (&TType, &Expr),
    e: &Expr,
) {
    cx.report_traced(
        Problem::Ambiguous {
            span: e.span,
            lhs: (a.span, x.to_string()),
            rhs: (b.span, y.to_string()),
            detail: format!("axis `{ax}` would split two dimensions of the result"),
        },
        e,
    );
}

/// Operands of one dtype, else E0210 at the first that differs from the first.
pub fn same_dtype(cx: &mut dyn Rules, ops: &[(&TType, &Expr)], e: &Expr) -> bool {
    let Some(((first, fx), rest)) = ops.split_first() else {
        return true;
    };
    let Some((t, x)) = rest.iter().find(|(t, _)| t.dtype != first.dtype) else {
        return true;
    };
    cx.report_traced(
        Problem::DType {
            span: x.span,
            expected: first.dtype.name().into(),
            found: t.dtype.name().into(),
            other: Some(fx.span),
        },
        e,
    );
    false
}

/// A float operand, else E0210.
pub fn need_float(cx: &mut dyn Rules, t: &TType, e: &Expr) -> bool {
    if t.dtype.is_float() {
        return true;
    }
    cx.report(Problem::DType {
        span: e.span,
        expected: "a float dtype".into(),
        found: t.dtype.name().into(),
        other: None,
    });
    false
}

/// A literal list of integer dimensions (`[0, 2, 1]`), items -1 for anything else.
pub fn int_list(items: &[ast::ListItem]) -> Vec<i64> {
    items
        .iter()
        .map(|it| match it {
            ast::ListItem::Dim(ast::DimSpec::Dim {
                size: DimExpr::Int(k, _),
                axes: None,
                ..
            }) => *k,
            ast::ListItem::Expr(x) => int_of(x).unwrap_or(-1),
            _ => -1,
        })
        .collect()
}

/// Reduce-op name of a pending reduction's collective.
pub fn reduce_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "psum",
        ReduceOp::Max => "pmax",
        ReduceOp::Min => "pmin",
    }
}

/// A replicated dim of a constant size.
pub fn whole(n: i64) -> Dim {
    Dim::replicated(Poly::constant(n))
}

/// A number literal (integer or float, possibly negative).
pub fn number(e: &Expr) -> Option<f64> {
    match &e.kind {
        ExprKind::Float(v) => Some(*v),
        ExprKind::Int(v) => Some(*v as f64),
        ExprKind::Neg(x) => number(x).map(|v| -v),
        _ => None,
    }
}

/// Dimension indices written as one index or a list (`dim: [0, 2]`).
pub fn dim_list(cx: &mut dyn Rules, d: &Expr, rank: usize) -> Option<Vec<usize>> {
    match &d.kind {
        ExprKind::List(items) => {
            let mut v = Vec::new();
            for it in items {
                let ie = match it {
                    ast::ListItem::Expr(x) => x.clone(),
                    ast::ListItem::Dim(ast::DimSpec::Dim {
                        size: DimExpr::Int(k, s),
                        axes: None,
                        ..
                    }) => Expr {
                        kind: ExprKind::Int(*k),
                        span: *s,
                    },
                    other => Expr {
                        kind: ExprKind::Str(String::new()),
                        span: match other {
                            ast::ListItem::Dim(d) => d.span(),
                            ast::ListItem::Expr(x) => x.span,
                        },
                    },
                };
                v.push(dim_index(cx, &ie, rank)?);
            }
            Some(v)
        }
        _ => Some(vec![dim_index(cx, d, rank)?]),
    }
}

/// Read an expression as a size and sharding (`768`, `4*D`, `VOCAB@mp`, which
/// parses as a matmul by an axis name): layer arguments and sizes passed to a primitive.
pub fn expr_to_dim(e: &Expr) -> Option<(DimExpr, Option<Vec<ast::Ident>>)> {
    fn go(e: &Expr, axes: &mut Option<Vec<ast::Ident>>) -> Option<DimExpr> {
        match &e.kind {
            ExprKind::Int(v) => Some(DimExpr::Int(*v, e.span)),
            ExprKind::Name(n) => Some(DimExpr::Name(ast::Ident {
                name: n.clone(),
                span: e.span,
            })),
            ExprKind::Bin(a, ast::BinOp::MatMul, b) => {
                let ExprKind::Name(ax) = &b.kind else {
                    return None;
                };
                if axes.is_some() {
                    return None;
                }
                *axes = Some(vec![ast::Ident {
                    name: ax.clone(),
                    span: b.span,
                }]);
                go(a, axes)
            }
            ExprKind::Bin(a, op, b) => {
                let op = match op {
                    ast::BinOp::Add => ast::DimOp::Add,
                    ast::BinOp::Sub => ast::DimOp::Sub,
                    ast::BinOp::Mul => ast::DimOp::Mul,
                    ast::BinOp::Div => ast::DimOp::Div,
                    ast::BinOp::MatMul => return None,
                };
                let x = go(a, axes)?;
                let y = go(b, axes)?;
                Some(DimExpr::Bin(Box::new(x), op, Box::new(y), e.span))
            }
            _ => None,
        }
    }
    let mut axes = None;
    let d = go(e, &mut axes)?;
    Some((d, axes))
}

/// A size argument with an optional sharding (`N`, `T@sp`).
pub fn sized(cx: &mut dyn Rules, e: &ast::Expr, what: &str) -> Option<Dim> {
    let Some((de, axes)) = expr_to_dim(e) else {
        cx.report(Problem::WrongKind {
            span: e.span,
            expected: "a size".into(),
            found: "an expression".into(),
        });
        return None;
    };
    let (size, layer_axes) = cx.size(&de, false)?;
    let d = Dim {
        size,
        axes: written_axes(cx, layer_axes, axes.as_deref())?,
    };
    cx.check_dim(&d, e.span, what).then_some(d)
}

/// A size's axes: those written after its `@` (each checked against the mesh;
/// `@_` for none), else those the layer's size parameter carries.
pub fn written_axes(
    cx: &mut dyn Rules,
    layer_axes: Option<Vec<String>>,
    written: Option<&[ast::Ident]>,
) -> Option<Vec<String>> {
    let Some(list) = written else {
        return Some(layer_axes.unwrap_or_default());
    };
    // `N@_`: explicitly whole, whatever axes the layer's size carries.
    if let [a] = list {
        if a.name == "_" {
            return Some(Vec::new());
        }
    }
    let mut ax = Vec::new();
    for a in list {
        if !cx.check_axis(&a.name, a.span) {
            return None;
        }
        ax.push(a.name.clone());
    }
    Some(ax)
}
