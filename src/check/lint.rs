//! Checks over whole bodies after they are checked: the `step_total`s the
//! runtime can sum before a step (E0230: of data only, in `forward` or the
//! loss function itself), and the `let`s nothing reads (W0006).

use super::body::{Bodies, BodyId, Op, VId};
use super::{Checker, Scope};
use crate::ast::{self, Arg, DimExpr, DimSpec, Expr, ExprKind};
use crate::diag::Problem;
use crate::prim::Prim;
use crate::source::Span;
use rustc_hash::FxHashSet as HashSet;

impl Bodies {
    /// The callees of body `id`, transitively, `id` not included.
    fn callees(&self, id: BodyId) -> Vec<BodyId> {
        let mut seen: HashSet<BodyId> = HashSet::default();
        let mut todo: Vec<BodyId> = self.callees_of(id);
        let mut out = Vec::new();
        while let Some(b) = todo.pop() {
            if seen.insert(b) {
                out.push(b);
                todo.extend(self.callees_of(b));
            }
        }
        out
    }

    /// The bodies body `id` calls directly.
    pub fn callees_of(&self, id: BodyId) -> Vec<BodyId> {
        self.get(id).map_or_else(Vec::new, |b| {
            b.values
                .iter()
                .filter_map(|v| match &v.op {
                    Op::Call(c) => Some(c.body),
                    _ => None,
                })
                .collect()
        })
    }

    /// The `step_total`s of body `id` that the runtime cannot sum before a
    /// step (E0230): one whose operand depends on a weight, a table or
    /// argument `output` (a loss function's model output), and any in a
    /// body `id` calls. Inputs and the other arguments are data.
    pub fn step_totals(
        &self,
        id: BodyId,
        output: Option<usize>,
    ) -> Vec<(Span, crate::diag::TotalProblem)> {
        use crate::diag::TotalProblem;
        let Some(b) = self.get(id) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        // Per value: what model state it depends on, if any.
        let mut from: Vec<Option<String>> = Vec::with_capacity(b.values.len());
        for v in &b.values {
            let of = |args: &[VId]| {
                args.iter()
                    .find_map(|a| from.get(*a as usize).cloned().flatten())
            };
            let dep = match &v.op {
                Op::Arg(i) if Some(*i) == output => Some("the model's output".to_string()),
                Op::Arg(_) | Op::Input(_) => None,
                Op::Weight { name, .. } => Some(format!("the weight `{name}`")),
                Op::Table { name, .. } => Some(format!("the table `{name}`")),
                Op::Prim { prim, args } => {
                    let dep = of(args);
                    if let (Prim::StepTotal(_), Some(what)) = (prim, &dep) {
                        out.push((v.span, TotalProblem::NotData(what.clone())));
                    }
                    dep
                }
                Op::Call(c) => {
                    of(&c.args).or_else(|| self.reads_state(c.body).map(|(what, _)| what))
                }
            };
            from.push(dep);
        }
        for c in self.callees(id) {
            if let Some(span) = self.total_in_body(c) {
                out.push((span, TotalProblem::Nested));
            }
        }
        out
    }

    fn total_in_body(&self, id: BodyId) -> Option<Span> {
        self.get(id)?
            .values
            .iter()
            .find(|v| {
                matches!(
                    v.op,
                    Op::Prim {
                        prim: Prim::StepTotal(_),
                        ..
                    }
                )
            })
            .map(|v| v.span)
    }
}

impl Checker<'_> {
    /// W0006: each `let` name of block `b` that no later `let` reads (before
    /// one rebinds it) nor the block's result (names starting with `_`
    /// excepted, and those whose value had an error; none after an error in
    /// the block). Reported once per name, however often the block is checked.
    pub(super) fn unused_lets(&mut self, b: &ast::Block, scope: &Scope) {
        let reads: Vec<HashSet<String>> = b.lets.iter().map(|l| mentions(&l.value)).collect();
        let result = b.result.as_deref().map(mentions).unwrap_or_default();
        for (i, l) in b.lets.iter().enumerate() {
            for n in std::iter::once(&l.name).chain(&l.rest) {
                if n.name.starts_with('_') || scope.poisoned.contains(&n.name) {
                    continue;
                }
                let mut used = None;
                for (j, later) in b.lets.iter().enumerate().skip(i + 1) {
                    if reads[j].contains(&n.name) {
                        used = Some(true);
                        break;
                    }
                    if std::iter::once(&later.name)
                        .chain(&later.rest)
                        .any(|m| m.name == n.name)
                    {
                        used = Some(false);
                        break;
                    }
                }
                let used = used.unwrap_or_else(|| result.contains(&n.name));
                if !used && self.unused_said.insert(n.span) {
                    self.report(Problem::UnusedLet {
                        span: n.span,
                        name: n.name.clone(),
                        // From `let` to the end of its value.
                        stmt: l.rest.is_empty().then_some(Span {
                            end: l.value.span.end.max(l.span.start),
                            ..l.span
                        }),
                    });
                }
            }
        }
    }
}

/// Every name expression `e` mentions anywhere (operands, named arguments,
/// indices, sizes, nested blocks): what a `let` before it may be read by.
fn mentions(e: &Expr) -> HashSet<String> {
    fn dim(d: &DimExpr, out: &mut HashSet<String>) {
        match d {
            DimExpr::Int(..) => {}
            DimExpr::Name(i) => {
                out.insert(i.name.clone());
            }
            DimExpr::Bin(a, _, b, _) => {
                dim(a, out);
                dim(b, out);
            }
        }
    }
    fn go(e: &Expr, out: &mut HashSet<String>) {
        match &e.kind {
            ExprKind::Float(_) | ExprKind::Int(_) | ExprKind::Str(_) => {}
            ExprKind::Name(n) => {
                out.insert(n.clone());
            }
            ExprKind::Neg(x) | ExprKind::Member(x, _) => go(x, out),
            ExprKind::Bin(a, _, b) => {
                go(a, out);
                go(b, out);
            }
            ExprKind::Call(f, args) => {
                go(f, out);
                for a in args {
                    match a {
                        Arg::Pos(x) => go(x, out),
                        Arg::Named(_, v) => opt(v, out),
                        Arg::Arrow(a, b, _) => {
                            dim(&a.size, out);
                            dim(&b.size, out);
                        }
                    }
                }
            }
            ExprKind::Index(x, slices) => {
                go(x, out);
                for s in slices {
                    match s {
                        ast::Slice::Range(a, b, _) => {
                            for d in [a, b].into_iter().flatten() {
                                dim(d, out);
                            }
                        }
                        ast::Slice::At(d) => dim(d, out),
                    }
                }
            }
            ExprKind::List(items) => {
                for i in items {
                    match i {
                        ast::ListItem::Expr(x) => go(x, out),
                        ast::ListItem::Dim(DimSpec::Dim { size, .. }) => dim(size, out),
                        ast::ListItem::Dim(DimSpec::Ellipsis(_)) => {}
                    }
                }
            }
            ExprKind::Local(_, b) => {
                for l in &b.lets {
                    go(&l.value, out);
                }
                if let Some(r) = &b.result {
                    go(r, out);
                }
            }
        }
    }
    fn opt(v: &ast::OptValue, out: &mut HashSet<String>) {
        match v {
            ast::OptValue::Expr(x) => go(x, out),
            ast::OptValue::Options(o) => {
                for (_, v) in &o.entries {
                    opt(v, out);
                }
            }
        }
    }
    let mut out = HashSet::default();
    go(e, &mut out);
    out
}
