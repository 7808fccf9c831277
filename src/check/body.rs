//! Typed function bodies, and the checking of functions and expressions that
//! records them.
//!
//! Each function of a layer instance is checked once per argument types; its
//! [`Body`] lists its values in order: arguments, model inputs, the instance's
//! weights where they are used, typed ops ([`crate::prim::Prim`], the reshards
//! the checker inserts included) and calls of sublayers and functions. The
//! lowering ([`crate::lower`]) inlines them into the SPMD program.

use super::layers::dim_names;
use super::{plural, Binding, Checker, Inst, Scope, Val};
use crate::ast::{self, Arg, DimExpr, DimSpec, Expr, ExprKind, Member, TypeExpr};
use crate::diag::{did_you_mean, Label, Problem};
use crate::init::Init;
use crate::prim::arith::Arith;
use crate::prim::matmul::MatMul;
use crate::prim::Prim;
use crate::source::Span;
use crate::types::TType;
use rustc_hash::FxHashSet as HashSet;
use std::sync::Arc;

/// A value of a body, by index.
pub type VId = u32;
/// A body, by index into [`Bodies`].
pub type BodyId = usize;

/// How a body computes one value.
#[derive(Clone, Debug)]
pub enum Op {
    /// The function's i-th argument.
    Arg(usize),
    /// The model's i-th input (in a model's body).
    Input(usize),
    /// A weight of the instance, by name, stored in `stored` and used in the
    /// value's type (FSDP gathers it).
    Weight {
        name: String,
        stored: TType,
        init: Init,
        /// `freeze(...)`d: no gradient step, no optimizer state.
        frozen: bool,
        /// An `init` computed by this body (no inputs; its whole value).
        computed: Option<BodyId>,
    },
    /// An embedding table's parameter (`tables.NAME`).
    Table {
        name: String,
        init: Init,
        frozen: bool,
    },
    Prim {
        prim: Prim,
        args: Vec<VId>,
    },
    Call(Call),
}

/// A call of another body.
#[derive(Clone, Debug)]
pub struct Call {
    /// The sublayer called (its parameters live under this name), or `None`
    /// for a function of the same layer.
    pub member: Option<String>,
    pub body: BodyId,
    pub args: Vec<VId>,
    /// `repeat(count, ...)`: the body runs `count` times, each on the previous
    /// result, split into pipeline stages over `stages`.
    pub repeat: Option<Repeat>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Repeat {
    pub count: i64,
    pub stages: Option<String>,
    /// `checkpoint: full` (`Some([])`): each repetition keeps only its result
    /// for backward, and recomputes the rest there; `checkpoint: [h, y]`
    /// also keeps the values of those `let`s of the layer's `forward`.
    pub checkpoint: Option<Vec<String>>,
}

/// A value: how it is computed, its type, and where in the source.
#[derive(Clone, Debug)]
pub struct Value {
    pub op: Op,
    pub ty: TType,
    pub span: Span,
}

/// One function of one layer instance, checked for one set of argument types.
#[derive(Clone, Debug, Default)]
pub struct Body {
    pub values: Vec<Value>,
    pub result: Option<VId>,
    /// The `let` names of this body and their values (what a checkpoint
    /// policy may name).
    pub names: Vec<(String, VId)>,
    /// The `forward` of a layer with a `checkpoint(...)` directive: each call
    /// keeps only its result (and these `let`s) for backward.
    pub checkpoint: Option<Vec<String>>,
}

/// Every body checked.
#[derive(Clone, Debug, Default)]
pub struct Bodies(pub Vec<Body>);

impl Bodies {
    pub fn get(&self, id: BodyId) -> Option<&Body> {
        self.0.get(id)
    }

    /// The first weight, table, added loss or observed value that body `id`
    /// reads, itself or through the bodies it calls: what it is, and where.
    pub fn reads_state(&self, id: BodyId) -> Option<(String, Span)> {
        let mut todo = vec![id];
        let mut seen = HashSet::default();
        while let Some(b) = todo.pop() {
            if !seen.insert(b) {
                continue;
            }
            let values = self.get(b).map_or(&[][..], |b| &b.values);
            // Where a weight or table is used (its value's span is its declaration).
            let used_at = |k: usize, at: Span| {
                values
                    .iter()
                    .find(|u| match &u.op {
                        Op::Prim { args, .. } => args.contains(&(k as VId)),
                        Op::Call(c) => c.args.contains(&(k as VId)),
                        _ => false,
                    })
                    .map_or(at, |u| u.span)
            };
            for (k, v) in values.iter().enumerate() {
                match &v.op {
                    Op::Weight { name, .. } => {
                        return Some((format!("the weight `{name}`"), used_at(k, v.span)))
                    }
                    Op::Table { name, .. } => {
                        return Some((format!("the table `{name}`"), used_at(k, v.span)))
                    }
                    Op::Prim {
                        prim: Prim::Aux(a), ..
                    } => {
                        let what = match a.weight() {
                            Some(_) => "add_loss",
                            None => "observe",
                        };
                        return Some((format!("`{what}` (`{}`)", a.name()), v.span));
                    }
                    Op::Call(c) => todo.push(c.body),
                    _ => {}
                }
            }
        }
        None
    }
}

impl<'p> Checker<'p> {
    pub(super) fn open_body(&mut self) {
        self.open.push(Body::default());
    }

    pub(super) fn close_body(&mut self, result: Option<VId>) -> BodyId {
        let mut b = self.open.pop().unwrap_or_default();
        b.result = result;
        self.out.bodies.0.push(b);
        self.out.bodies.0.len() - 1
    }

    /// Add a value to the body being checked and make it the current value.
    pub(super) fn record(&mut self, op: Op, ty: &TType, span: Span) -> Option<VId> {
        let ty = self.apply_bound(ty.clone());
        let Some(b) = self.open.last_mut() else {
            self.last = None;
            return None;
        };
        b.values.push(Value { op, ty, span });
        let id = (b.values.len() - 1) as VId;
        self.last = Some(id);
        Some(id)
    }

    /// An op on operands of this body; a missing operand (an error elsewhere)
    /// drops it.
    pub(super) fn record_prim(
        &mut self,
        prim: Prim,
        args: Vec<Option<VId>>,
        ty: &TType,
        span: Span,
    ) -> Option<VId> {
        let Some(args) = args.into_iter().collect::<Option<Vec<VId>>>() else {
            self.last = None;
            return None;
        };
        self.record(Op::Prim { prim, args }, ty, span)
    }

    /// Check a call of `f` of `inst` and record it in the caller's body: as a
    /// call of the sublayer `member` (with its repetitions), or of a function of
    /// the same layer (`None`). Each function is checked once per instance,
    /// argument types and bound sizes; later calls reuse its body.
    pub(super) fn call_fn(
        &mut self,
        inst: &Arc<Inst>,
        f: &ast::FnDecl,
        args: Vec<(Val, Span, Option<VId>)>,
        site: Span,
        member: Option<(String, Option<Repeat>)>,
    ) -> Val {
        if args.len() != f.params.len() {
            self.report(Problem::Arity {
                span: site,
                callee: format!("{}.{}", inst.decl.name.name, f.name.name),
                expected: plural(f.params.len(), "argument"),
                found: args.len(),
                decl: Some(f.name.span),
            });
            return Val::Poison;
        }
        let fkey = format!("fn {}.{}", inst.label, f.name.name);
        if self.stack.contains(&fkey) {
            self.report(Problem::RecursiveLayer {
                span: site,
                chain: vec![f.name.name.clone(), f.name.name.clone()],
            });
            return Val::Poison;
        }
        // The function by its place among the layer's members (not its span:
        // the key is the same wherever the text moved).
        let which = inst
            .decl
            .members
            .iter()
            .position(|m| matches!(m, ast::Member::Fn(g) if std::ptr::eq(g, f)))
            .map_or_else(|| format!("{:?}", f.span), |i| i.to_string());
        let key = format!(
            "{}|{}|{which}|{:?}|{:?}",
            inst.key,
            f.name.name,
            args.iter()
                .map(|(v, _, _)| match v {
                    Val::T(t) => t.to_string(),
                    other => other.describe(),
                })
                .collect::<Vec<_>>(),
            self.bound
        );
        // Checked in this compilation, else kept from an earlier one
        // (`reuse`), else checked now.
        let kept = match self.memo.get(&key) {
            Some(_) => None,
            None => self.reuse.as_mut().and_then(|r| r.key(&key, inst)),
        };
        let (body, result) = match self.memo.get(&key) {
            Some(done) => done.clone(),
            None => match kept.as_ref().and_then(|k| {
                let spans: Vec<Span> = args.iter().map(|a| a.1).collect();
                self.replay(k, &spans)
            }) {
                Some(done) => done,
                None => {
                    let mark = self.mark();
                    self.open_body();
                    let arg_vals: Vec<(Val, Span, Option<VId>)> = args
                        .iter()
                        .enumerate()
                        .map(|(i, (v, s, _))| {
                            let vid = match v {
                                Val::T(t) => self.record(Op::Arg(i), t, *s),
                                _ => None,
                            };
                            (v.clone(), *s, vid)
                        })
                        .collect();
                    let result = self.fn_body(inst, f, arg_vals, fkey);
                    let out = matches!(result, Val::T(_)).then_some(self.last).flatten();
                    let body = self.close_body(out);
                    if f.name.name == "forward" {
                        if let Some(b) = self.out.bodies.0.get_mut(body) {
                            b.checkpoint = inst.checkpoint.clone();
                        }
                    }
                    if self.reuse.is_some() {
                        self.memo_of.insert(body, key.clone());
                    }
                    self.memo.insert(key, (body, result.clone()));
                    if let Some(k) = kept {
                        self.keep(k, mark, &result);
                    }
                    (body, result)
                }
            },
        };
        // The call, in the caller's body.
        let ids: Option<Vec<VId>> = args.iter().map(|a| a.2).collect();
        match (&result, ids) {
            (Val::T(t), Some(ids)) => {
                let (member, repeat) = member.map_or((None, None), |(m, r)| (Some(m), r));
                self.record(
                    Op::Call(Call {
                        member,
                        body,
                        args: ids,
                        repeat,
                    }),
                    t,
                    site,
                );
            }
            _ => self.last = None,
        }
        result
    }

    /// The body of `f` on arguments that are this body's `Arg` values.
    pub(super) fn fn_body(
        &mut self,
        inst: &Arc<Inst>,
        f: &ast::FnDecl,
        args: Vec<(Val, Span, Option<VId>)>,
        fkey: String,
    ) -> Val {
        let mut scope = Scope {
            scope_name: format!("{}.{}", inst.label, f.name.name),
            ..Scope::default()
        };
        for ((pname, te), (arg, aspan, vid)) in f.params.iter().zip(args) {
            self.last = vid;
            let Val::T(at) = arg else {
                if !matches!(arg, Val::Poison) {
                    self.report(Problem::WrongKind {
                        span: aspan,
                        expected: format!("a tensor for `{}`", pname.name),
                        found: arg.describe(),
                    });
                }
                return Val::Poison;
            };
            let Some(bound) = self.unify(te, &at, inst, &mut scope, aspan) else {
                return Val::Poison;
            };
            self.record_type(
                pname.span,
                &scope.scope_name,
                &pname.name,
                "param",
                &bound,
                None,
            );
            scope.vars.insert(
                pname.name.clone(),
                Binding {
                    ty: bound,
                    vid: self.last,
                    span: pname.span,
                    deps: vec![],
                },
            );
        }
        self.stack.push(fkey);
        let result = self.block(inst, &f.body, &mut scope);
        self.stack.pop();
        let result_span = f.body.result.as_ref().map_or(f.body.span, |e| e.span);
        let Some(rt) = &f.ret else {
            return result;
        };
        let Val::T(t) = result else {
            if !matches!(result, Val::Poison) {
                self.report(Problem::WrongKind {
                    span: result_span,
                    expected: "a tensor result".into(),
                    found: result.describe(),
                });
            }
            return Val::Poison;
        };
        // Symbols only in the return type cannot be inferred: likely a typo.
        for d in &rt.dims {
            if let DimSpec::Dim { size, .. } = d {
                for id in dim_names(size) {
                    let known = inst.env.contains_key(&id.name)
                        || self.prog.consts.contains_key(&id.name)
                        || scope.tyvars.contains_key(&id.name);
                    if !known {
                        let mut c: Vec<&str> =
                            self.prog.consts.keys().map(|s| s.as_str()).collect();
                        c.extend(scope.tyvars.keys().map(|s| s.as_str()));
                        c.extend(inst.env.keys().map(|s| s.as_str()));
                        let sug = did_you_mean(&id.name, c);
                        self.report(Problem::UnknownName {
                            span: id.span,
                            name: id.name.clone(),
                            what: "size",
                            suggestion: sug,
                        });
                        return Val::Poison;
                    }
                }
            }
        }
        match self.conform(
            &t,
            rt,
            inst,
            &mut scope,
            result_span,
            "the declared return type",
        ) {
            Some(t) => Val::T(t),
            None => Val::Poison,
        }
    }

    /// Bind a signature type against an argument: dtype, rank, sizes (binding
    /// symbolic sizes), and layout (inserting a reshard where one is asked for).
    pub(super) fn unify(
        &mut self,
        te: &TypeExpr,
        at: &TType,
        inst: &Inst,
        scope: &mut Scope,
        aspan: Span,
    ) -> Option<TType> {
        let n_explicit = te
            .dims
            .iter()
            .filter(|d| !matches!(d, DimSpec::Ellipsis(_)))
            .count();
        let has_ellipsis = te.dims.iter().any(|d| matches!(d, DimSpec::Ellipsis(_)));
        if at.rank() < n_explicit || !has_ellipsis && at.rank() != n_explicit {
            self.report(Problem::Rank {
                span: aspan,
                expected: n_explicit,
                found: at.rank(),
                ty: at.to_string(),
                decl: Some(te.span),
            });
            return None;
        }
        if te.dtype != at.dtype {
            self.report(Problem::DType {
                span: aspan,
                expected: te.dtype.name().into(),
                found: at.dtype.name().into(),
                other: Some(te.dtype_span),
            });
            return None;
        }
        let mut k = 0usize;
        for d in &te.dims {
            match d {
                DimSpec::Ellipsis(_) => {
                    let n = at.rank() - n_explicit;
                    scope.ellipsis = Some(at.dims[k..k + n].to_vec());
                    k += n;
                }
                DimSpec::Dim { size, .. } => {
                    if let DimExpr::Name(id) = size {
                        let free = !inst.env.contains_key(&id.name)
                            && !self.prog.consts.contains_key(&id.name)
                            && !scope.tyvars.contains_key(&id.name);
                        if free {
                            scope
                                .tyvars
                                .insert(id.name.clone(), at.dims[k].size.clone());
                        }
                    }
                    k += 1;
                }
            }
        }
        self.conform(at, te, inst, scope, aspan, "the parameter type")
    }

    /// Check `t` against a written type: sizes must match exactly; dims with an
    /// explicit layout are resharded to it (a reported collective).
    pub(super) fn conform(
        &mut self,
        t: &TType,
        te: &TypeExpr,
        inst: &Inst,
        scope: &mut Scope,
        span: Span,
        what: &str,
    ) -> Option<TType> {
        let want = self.eval_type(te, inst, scope, true, Some(t))?;
        let want = self.apply_bound(want);
        let got = self.apply_bound(t.clone());
        if want.rank() != got.rank() {
            self.report(Problem::Rank {
                span,
                expected: want.rank(),
                found: got.rank(),
                ty: got.to_string(),
                decl: Some(te.span),
            });
            return None;
        }
        if want.dtype != got.dtype {
            self.report(Problem::DType {
                span,
                expected: want.dtype.name().into(),
                found: got.dtype.name().into(),
                other: Some(te.dtype_span),
            });
            return None;
        }
        for (i, (w, g)) in want.dims.iter().zip(&got.dims).enumerate() {
            if w.size != g.size {
                self.report(Problem::Mismatch {
                    span,
                    expected: want.to_string(),
                    found: got.to_string(),
                    decl: Some(te.span),
                    detail: format!("dimension {i} is {} but {what} says {}", g.size, w.size),
                });
                return None;
            }
        }
        let explicit = self.explicit_layout(te, inst, got.rank());
        // Only what the annotation asks for is checked here; inherited layouts were
        // checked where they arose.
        let mut asked = want.clone();
        for (d, e) in asked.dims.iter_mut().zip(&explicit) {
            if !e {
                d.axes.clear();
            }
        }
        self.validate_type(&asked, te, "");
        let target: Vec<Option<Vec<String>>> = want
            .dims
            .iter()
            .zip(&explicit)
            .map(|(d, e)| e.then(|| d.axes.clone()))
            .collect();
        let at = (span, super::rules::Written::Value);
        let out = self.reshard(&got, &target, &want.pending, at, scope);
        Some(out)
    }

    pub(super) fn block(&mut self, inst: &Arc<Inst>, b: &ast::Block, scope: &mut Scope) -> Val {
        let errors = |c: &Self| c.diags.iter().filter(|d| d.is_error()).count();
        let errors_before = errors(self);
        for l in &b.lets {
            self.hint = l.ty.as_ref().and_then(|te| {
                let mut h = Vec::new();
                for d in &te.dims {
                    match d {
                        DimSpec::Ellipsis(_) => return None,
                        DimSpec::Dim { axes, .. } => h.push(
                            axes.as_ref()
                                .map(|a| a.iter().map(|i| i.name.clone()).collect()),
                        ),
                    }
                }
                Some((l.value.span, h))
            });
            let v = self.expr(inst, &l.value, scope);
            self.hint = None;
            let deps = expr_names(&l.value);
            if !l.rest.is_empty() {
                self.let_names(l, v, deps, scope);
                continue;
            }
            let Val::T(mut t) = v else {
                if !matches!(v, Val::Poison) {
                    self.report(Problem::WrongKind {
                        span: l.value.span,
                        expected: format!("a tensor for `{}`", l.name.name),
                        found: v.describe(),
                    });
                }
                scope.vars.remove(&l.name.name);
                scope.poisoned.insert(l.name.name.clone());
                continue;
            };
            if let Some(te) = &l.ty {
                match self.conform(&t, te, inst, scope, l.value.span, "the annotation") {
                    Some(c) => t = c,
                    None => {
                        scope.vars.remove(&l.name.name);
                        scope.poisoned.insert(l.name.name.clone());
                        continue;
                    }
                }
            }
            let vid = self.last;
            self.bind(&l.name, t, vid, deps, scope);
        }
        let out = match &b.result {
            Some(e) => self.expr(inst, e, scope),
            None => {
                self.report(Problem::WrongKind {
                    span: b.span,
                    expected: "a result expression at the end of the block".into(),
                    found: "only `let` bindings".into(),
                });
                Val::Poison
            }
        };
        // After an error in the block (a misspelt name leaves the one meant
        // unread), an unused `let` is its echo, not news.
        if errors(self) == errors_before {
            self.unused_lets(b, scope);
        }
        out
    }

    /// `let (a, b, ...) = ...`: one name per result of a multi-result op.
    fn let_names(&mut self, l: &ast::Let, v: Val, deps: Vec<String>, scope: &mut Scope) {
        let names: Vec<&ast::Ident> = std::iter::once(&l.name).chain(&l.rest).collect();
        let parts = match v {
            Val::Tuple(_, parts) if parts.len() == names.len() && l.ty.is_none() => Some(parts),
            Val::Poison => None,
            _ if l.ty.is_some() => {
                let te = l.ty.as_ref().map_or(l.span, |t| t.span);
                self.report(Problem::WrongKind {
                    span: te,
                    expected: "one name per result, without a type (each result has its own)"
                        .into(),
                    found: "a type annotation".into(),
                });
                None
            }
            other => {
                let list: Vec<&str> = names.iter().map(|n| n.name.as_str()).collect();
                self.report(Problem::WrongKind {
                    span: l.value.span,
                    expected: format!("{} results for `({})`", names.len(), list.join(", ")),
                    found: other.describe(),
                });
                None
            }
        };
        let Some(parts) = parts else {
            for n in names {
                scope.vars.remove(&n.name);
                scope.poisoned.insert(n.name.clone());
            }
            return;
        };
        for (n, (t, vid)) in names.into_iter().zip(parts) {
            self.bind(n, t, vid, deps.clone(), scope);
        }
    }

    /// Bind `n` to a value of type `t` (recorded for `--types` and hovers).
    fn bind(
        &mut self,
        n: &ast::Ident,
        t: TType,
        vid: Option<VId>,
        deps: Vec<String>,
        scope: &mut Scope,
    ) {
        if let (Some(v), Some(b)) = (vid, self.open.last_mut()) {
            b.names.push((n.name.clone(), v));
        }
        self.record_type(n.span, &scope.scope_name, &n.name, "let", &t, None);
        scope.vars.insert(
            n.name.clone(),
            Binding {
                ty: t,
                vid,
                span: n.span,
                deps,
            },
        );
    }

    /// The shape-flow trace for a diagnostic about `e`: the bindings its names came from.
    pub(super) fn trace(&self, e: &Expr, scope: &Scope) -> Vec<Label> {
        let mut out: Vec<Label> = Vec::new();
        let mut todo = expr_names(e);
        let mut seen = HashSet::default();
        while let Some(n) = todo.pop() {
            if !seen.insert(n.clone()) || out.len() >= 8 {
                continue;
            }
            if let Some(b) = scope.vars.get(&n) {
                out.push(Label::new(b.span, format!("{n}: {}", b.ty)));
                todo.extend(b.deps.iter().cloned());
            }
        }
        out.sort_by_key(|l| l.span);
        out
    }

    pub(super) fn report_traced(&mut self, p: Problem, e: &Expr, scope: &Scope) {
        let mut d = p.diagnostic();
        d.trace = self.trace(e, scope);
        self.add_context(&mut d);
        self.diags.push(d);
    }

    pub(super) fn expr(&mut self, inst: &Arc<Inst>, e: &Expr, scope: &mut Scope) -> Val {
        self.last = None;
        let v = self.expr_inner(inst, e, scope);
        if !matches!(v, Val::T(_)) {
            self.last = None;
        }
        v
    }

    /// A finite number meeting a float tensor must be a value of its type: a
    /// number past the largest one would turn into ±inf at run time.
    fn fits_float(&mut self, n: Option<f64>, dtype: &ast::DType, span: Span) {
        let max = match dtype {
            ast::DType::F32 => f64::from(f32::MAX),
            ast::DType::BF16 => 3.389_531_389_251_535_5e38,
            ast::DType::F16 => 65504.0,
            ast::DType::F64 | ast::DType::I32 | ast::DType::I64 | ast::DType::Bool => return,
        };
        if let Some(v) = n.filter(|v| v.is_finite() && v.abs() > max) {
            self.report(Problem::FloatOutOfRange {
                span,
                value: v,
                dtype: dtype.name(),
                max,
            });
        }
    }

    pub(super) fn expr_inner(&mut self, inst: &Arc<Inst>, e: &Expr, scope: &mut Scope) -> Val {
        match &e.kind {
            ExprKind::Float(v) => Val::Num(*v),
            ExprKind::Int(v) => Val::Int(*v),
            ExprKind::Str(s) => Val::Str(s.clone()),
            ExprKind::Name(n) => self.name(inst, n, e.span, scope),
            ExprKind::Neg(x) => match self.expr(inst, x, scope) {
                Val::Num(v) => Val::Num(-v),
                Val::Int(v) => Val::Int(v.wrapping_neg()),
                Val::T(t) => {
                    let ix = self.last;
                    self.record_prim(Arith::Neg.into(), vec![ix], &t, e.span);
                    Val::T(t)
                }
                Val::Poison => Val::Poison,
                v => {
                    self.report(Problem::WrongKind {
                        span: x.span,
                        expected: "a tensor or number".into(),
                        found: v.describe(),
                    });
                    Val::Poison
                }
            },
            ExprKind::Bin(a, op, b) => {
                let va = self.expr(inst, a, scope);
                let ia = self.last;
                let vb = self.expr(inst, b, scope);
                let ib = self.last;
                let num = |v: &Val| match v {
                    Val::Num(x) => Some(*x),
                    Val::Int(x) => Some(*x as f64),
                    _ => None,
                };
                let (na, nb) = (num(&va), num(&vb));
                let r = self.binary(inst, *op, (va, a), (vb, b), e, scope);
                if let Val::T(t) = &r {
                    for (n, x) in [(na, a), (nb, b)] {
                        self.fits_float(n, &t.dtype, x.span);
                    }
                    let (p, args): (Prim, _) = match (na, nb) {
                        (None, Some(c)) => (Arith::Scalar(*op, c).into(), vec![ia]),
                        (Some(c), None) => (Arith::ScalarLeft(*op, c).into(), vec![ib]),
                        _ if *op == ast::BinOp::MatMul => (MatMul.into(), vec![ia, ib]),
                        _ => (Arith::Binary(*op).into(), vec![ia, ib]),
                    };
                    self.record_prim(p, args, t, e.span);
                }
                r
            }
            ExprKind::Call(callee, args) => self.call(inst, callee, args, e, scope),
            ExprKind::Member(..) => self.member(inst, e),
            ExprKind::Index(base, slices) => {
                let v = self.expr(inst, base, scope);
                let ib = self.last;
                let Some(t) = self.tensor_of(v, e, "indexing") else {
                    return Val::Poison;
                };
                let r = {
                    let mut cx = self.rules(inst, scope);
                    crate::prim::index::rule(&mut cx, &t, slices, e)
                };
                match r {
                    Some((t, ix)) => {
                        self.record_prim(ix.into(), vec![ib], &t, e.span);
                        Val::T(t)
                    }
                    None => Val::Poison,
                }
            }
            ExprKind::List(_) => {
                self.report(Problem::WrongKind {
                    span: e.span,
                    expected: "a tensor".into(),
                    found: "a list (lists are arguments of reshape and transpose)".into(),
                });
                Val::Poison
            }
            ExprKind::Local(axes, block) => {
                for a in axes {
                    self.check_axis(a);
                }
                let saved = scope.local.replace(e.span);
                let v = self.block(inst, block, scope);
                scope.local = saved;
                v
            }
        }
    }

    /// Record weight `n` of `inst` as a parameter called `path` (relative to
    /// the layer being checked: `w`, or `embed.w` through a sublayer), at
    /// `span` (its declaration's by default).
    fn record_weight(&mut self, inst: &Arc<Inst>, n: &str, path: String, span: Option<Span>) {
        let Some((stored, used, wspan)) = inst.weights.get(n) else {
            return;
        };
        self.used_weights.insert(*wspan);
        if self.reuse.is_some() {
            self.weight_log.push(*wspan);
        }
        let init = inst
            .decl
            .members
            .iter()
            .find_map(|m| match m {
                Member::Weight {
                    name: w,
                    init: Some(i),
                    ..
                } if w.name == n => crate::init::Init::parse(i).ok(),
                _ => None,
            })
            .unwrap_or(crate::init::Init::Zeros);
        self.record(
            Op::Weight {
                name: path,
                stored: stored.clone(),
                init,
                frozen: inst.frozen.contains(n),
                computed: inst.computed.get(n).copied(),
            },
            used,
            span.unwrap_or(*wspan),
        );
    }

    /// `embed.w` (or `enc.block.w`): a weight of a sublayer, the very parameter
    /// the sublayer uses (weight tying by path).
    fn member(&mut self, inst: &Arc<Inst>, e: &Expr) -> Val {
        let mut segs: Vec<&crate::ast::Ident> = Vec::new();
        let mut cur = e;
        let (root, root_span) = loop {
            match &cur.kind {
                ExprKind::Member(b, f) => {
                    segs.push(f);
                    cur = b;
                }
                ExprKind::Name(n) => break (n, cur.span),
                _ => {
                    self.report(Problem::WrongKind {
                        span: cur.span,
                        expected: "a sublayer, as in `embed.w`".into(),
                        found: "an expression".into(),
                    });
                    return Val::Poison;
                }
            }
        };
        segs.reverse();
        if inst.poisoned.contains(root) {
            return Val::Poison;
        }
        let mut here = match inst.subs.get(root) {
            Some(Val::Layer(i)) => i.clone(),
            Some(Val::Poison) => return Val::Poison,
            Some(other) => {
                self.report(Problem::WrongKind {
                    span: root_span,
                    expected: "a sublayer, whose weights `.` names".into(),
                    found: match other {
                        Val::Repeat(..) => {
                            "a repeated stack (each repetition has its own weights)".into()
                        }
                        v => v.describe(),
                    },
                });
                return Val::Poison;
            }
            None => {
                let found = if inst.weights.contains_key(root) {
                    Some("a weight")
                } else {
                    None
                };
                match found {
                    Some(f) => self.report(Problem::WrongKind {
                        span: root_span,
                        expected: "a sublayer, whose weights `.` names".into(),
                        found: f.into(),
                    }),
                    None => {
                        let suggestion = did_you_mean(root, inst.subs.keys().map(|s| s.as_str()));
                        self.report(Problem::UnknownName {
                            span: root_span,
                            name: root.clone(),
                            what: "sublayer",
                            suggestion,
                        });
                    }
                }
                return Val::Poison;
            }
        };
        let mut path = vec![root.clone()];
        for (k, seg) in segs.iter().enumerate() {
            let last = k + 1 == segs.len();
            if last {
                if let Some((_, used, _)) = here.weights.get(&seg.name) {
                    let used = used.clone();
                    path.push(seg.name.clone());
                    self.record_weight(&here, &seg.name, path.join("."), Some(e.span));
                    return Val::T(used);
                }
            } else if let Some(Val::Layer(i)) = here.subs.get(&seg.name) {
                path.push(seg.name.clone());
                here = i.clone();
                continue;
            }
            if here.poisoned.contains(&seg.name) {
                return Val::Poison;
            }
            let cands: Vec<&str> = if last {
                here.weights.keys().map(|s| s.as_str()).collect()
            } else {
                here.subs.keys().map(|s| s.as_str()).collect()
            };
            let suggestion = did_you_mean(&seg.name, cands);
            self.report(Problem::UnknownName {
                // The whole path: the suggestion (and its fix) is the whole path.
                span: root_span.to(seg.span),
                name: format!("{}.{}", path.join("."), seg.name),
                what: if last { "weight" } else { "sublayer" },
                suggestion: suggestion.map(|s| format!("{}.{s}", path.join("."))),
            });
            return Val::Poison;
        }
        Val::Poison
    }

    pub(super) fn name(&mut self, inst: &Arc<Inst>, n: &str, span: Span, scope: &Scope) -> Val {
        if let Some(b) = scope.vars.get(n) {
            self.last = b.vid;
            return Val::T(b.ty.clone());
        }
        if scope.poisoned.contains(n) || inst.poisoned.contains(n) {
            return Val::Poison;
        }
        if let Some((_, used, _)) = inst.weights.get(n) {
            let used = used.clone();
            self.record_weight(inst, n, n.to_string(), None);
            return Val::T(used);
        }
        if let Some(s) = inst.subs.get(n) {
            return s.clone();
        }
        if let Some(v) = inst.env.get(n) {
            if let Some(c) = v.size.as_const() {
                return Val::Int(c);
            }
        }
        if let Some((v, _)) = self.prog.consts.get(n) {
            return Val::Int(*v);
        }
        if let Some(v) = scope.tyvars.get(n) {
            if let Some(c) = v.substitute(&self.bound).and_then(|p| p.as_const()) {
                return Val::Int(c);
            }
        }
        let mut cands: Vec<&str> = scope.vars.keys().map(|s| s.as_str()).collect();
        cands.extend(inst.weights.keys().map(|s| s.as_str()));
        cands.extend(inst.subs.keys().map(|s| s.as_str()));
        cands.extend(self.prog.consts.keys().map(|s| s.as_str()));
        // Infinity, for masks and limits (`-inf`); a name of the file comes first.
        if n == "inf" {
            return Val::Num(f64::INFINITY);
        }
        let sug = did_you_mean(n, cands);
        self.report(Problem::UnknownName {
            span,
            name: n.to_string(),
            what: "name",
            suggestion: sug,
        });
        Val::Poison
    }
}

fn expr_names(e: &Expr) -> Vec<String> {
    let mut out = Vec::new();
    pub(super) fn go(e: &Expr, out: &mut Vec<String>) {
        match &e.kind {
            ExprKind::Name(n) => out.push(n.clone()),
            ExprKind::Neg(x) => go(x, out),
            ExprKind::Bin(a, _, b) => {
                go(a, out);
                go(b, out)
            }
            ExprKind::Call(_, args) => {
                for a in args {
                    if let Arg::Pos(x) = a {
                        go(x, out)
                    }
                }
            }
            ExprKind::Index(b, _) => go(b, out),
            _ => {}
        }
    }
    go(e, &mut out);
    out
}
