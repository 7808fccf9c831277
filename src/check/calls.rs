//! Calls in function bodies: of a sublayer (its `forward`, or another of its
//! functions), of a built-in, of a function of the same layer, and the numbers
//! a call of a unary function folds to when its argument is known at check
//! time (`1.0 / sqrt(E)`). Split from [`super::body`], which checks the rest
//! of an expression.

use super::body::{Repeat, VId};
use super::{find_fn, Checker, Inst, Scope, Val};
use crate::ast::{self, Arg, Expr, ExprKind, Member};
use crate::diag::{did_you_mean, Problem};
use crate::source::Span;
use std::sync::Arc;

impl<'p> Checker<'p> {
    /// `e` as a number known when the file is checked, without recording
    /// anything: literals, `inf`, sizes and constants, and `-`, `+ - * /`
    /// and the foldable unary functions of them (`1.0 / sqrt(E)`). `None`
    /// for anything that reads a tensor, a weight or a sublayer.
    pub(super) fn const_number(&self, inst: &Arc<Inst>, e: &Expr, scope: &Scope) -> Option<f64> {
        let num = |x: &Expr| self.const_number(inst, x, scope);
        match &e.kind {
            ExprKind::Float(v) => Some(*v),
            ExprKind::Int(v) => Some(*v as f64),
            ExprKind::Neg(x) => num(x).map(|v| -v),
            ExprKind::Bin(a, op, b) => {
                let (x, y) = (num(a)?, num(b)?);
                Some(match op {
                    ast::BinOp::Add => x + y,
                    ast::BinOp::Sub => x - y,
                    ast::BinOp::Mul => x * y,
                    ast::BinOp::Div => x / y,
                    ast::BinOp::MatMul => return None,
                })
            }
            ExprKind::Name(n) => {
                if scope.vars.contains_key(n)
                    || inst.weights.contains_key(n)
                    || inst.subs.contains_key(n)
                {
                    return None;
                }
                if let Some(v) = inst.env.get(n) {
                    return v.size.as_const().map(|c| c as f64);
                }
                if let Some((v, _)) = self.prog.consts.get(n) {
                    return Some(*v as f64);
                }
                if let Some(v) = scope.tyvars.get(n) {
                    return v
                        .substitute(&self.bound)
                        .and_then(|p| p.as_const())
                        .map(|c| c as f64);
                }
                (n == "inf").then_some(f64::INFINITY)
            }
            ExprKind::Call(callee, args) => {
                let ExprKind::Name(f) = &callee.kind else {
                    return None;
                };
                // A name of the file comes before the built-in.
                if scope.vars.contains_key(f)
                    || inst.subs.contains_key(f)
                    || find_fn(&inst.decl, f).is_some()
                {
                    return None;
                }
                let [Arg::Pos(x)] = args.as_slice() else {
                    return None;
                };
                crate::prim::unary::Unary::named(f)?.fold(num(x)?)
            }
            _ => None,
        }
    }

    pub(super) fn call(
        &mut self,
        inst: &Arc<Inst>,
        callee: &Expr,
        args: &[Arg],
        e: &Expr,
        scope: &mut Scope,
    ) -> Val {
        // `sqrt(E)` of a size or number is a number.
        if let ExprKind::Name(f) = &callee.kind {
            if crate::prim::unary::Unary::named(f).is_some() {
                if let Some(v) = self.const_number(inst, e, scope) {
                    return Val::Num(v);
                }
            }
        }
        if let ExprKind::Name(n) = &callee.kind {
            if inst.poisoned.contains(n) && !scope.vars.contains_key(n) {
                return Val::Poison;
            }
        }
        if let ExprKind::Member(base, f) = &callee.kind {
            if let ExprKind::Name(sub) = &base.kind {
                return self.call_sub_fn(inst, sub, f, args, e, scope);
            }
        }
        let ExprKind::Name(name) = &callee.kind else {
            self.report(Problem::NotCallable {
                span: callee.span,
                name: "this expression".into(),
                found: "not a function or layer".into(),
            });
            return Val::Poison;
        };
        let sub = if scope.vars.contains_key(name) {
            None
        } else {
            inst.subs.get(name).cloned()
        };
        if let Some(sub) = sub {
            let mut vals = Vec::new();
            for a in args {
                match a {
                    Arg::Pos(x) => {
                        let v = self.expr(inst, x, scope);
                        vals.push((v, x.span, self.last));
                    }
                    other => {
                        self.report(Problem::WrongKind {
                            span: other.span(),
                            expected: "a positional tensor argument".into(),
                            found: "a named argument".into(),
                        });
                        return Val::Poison;
                    }
                }
            }
            return self.call_layer(name, &sub, vals, e, scope);
        }
        if !scope.vars.contains_key(name) {
            if let Some(f) = find_fn(&inst.decl, name) {
                let mut vals = Vec::new();
                for a in args {
                    if let Arg::Pos(x) = a {
                        let v = self.expr(inst, x, scope);
                        vals.push((v, x.span, self.last));
                    }
                }
                self.sites.push((e.span, inst.label.clone()));
                let r = self.call_fn(inst, f, vals, e.span, None);
                self.sites.pop();
                return r;
            }
        }
        if let Some(def) = crate::prim::find(name) {
            return self.builtin(inst, def, args, e, scope);
        }
        if let Some(v) = scope.vars.get(name) {
            let found = format!("a tensor `{}`", v.ty);
            self.report(Problem::NotCallable {
                span: callee.span,
                name: name.clone(),
                found,
            });
            return Val::Poison;
        }
        if inst.weights.contains_key(name) {
            self.report(Problem::NotCallable {
                span: callee.span,
                name: name.clone(),
                found: "a weight".into(),
            });
            return Val::Poison;
        }
        if self.prog.layers.contains_key(name) {
            self.report(Problem::NotCallable {
                span: callee.span,
                name: name.clone(),
                found: "a layer declaration; instantiate it as a member (`mlp = MLP(D)`) and call the member".into(),
            });
            return Val::Poison;
        }
        let mut cands: Vec<&str> = crate::prim::names();
        cands.extend(inst.subs.keys().map(|s| s.as_str()));
        let sug = did_you_mean(name, cands);
        self.report(Problem::UnknownName {
            span: callee.span,
            name: name.clone(),
            what: "function",
            suggestion: sug,
        });
        Val::Poison
    }

    /// `sub.f(x)`: a function of a sublayer, on its own parameters (as its
    /// `forward` would be).
    fn call_sub_fn(
        &mut self,
        inst: &Arc<Inst>,
        sub: &str,
        f: &ast::Ident,
        args: &[Arg],
        e: &Expr,
        scope: &mut Scope,
    ) -> Val {
        if inst.poisoned.contains(sub) {
            return Val::Poison;
        }
        let li = match inst.subs.get(sub) {
            Some(Val::Layer(li)) => li.clone(),
            Some(_) => {
                self.report(Problem::NotCallable {
                    span: e.span,
                    name: format!("{sub}.{}", f.name),
                    found: "a function of a repeated stack; call the stack itself (its `forward`)"
                        .into(),
                });
                return Val::Poison;
            }
            None => {
                self.report(Problem::NotCallable {
                    span: e.span,
                    name: format!("{sub}.{}", f.name),
                    found: format!("a member of `{sub}`, which is not a sublayer"),
                });
                return Val::Poison;
            }
        };
        let Some(func) = find_fn(&li.decl, &f.name) else {
            let fns: Vec<&str> = li
                .decl
                .members
                .iter()
                .filter_map(|m| match m {
                    Member::Fn(x) => Some(x.name.name.as_str()),
                    _ => None,
                })
                .collect();
            self.report(Problem::UnknownName {
                span: f.span,
                name: f.name.clone(),
                what: "function of the sublayer",
                suggestion: did_you_mean(&f.name, fns),
            });
            return Val::Poison;
        };
        let mut vals = Vec::new();
        for a in args {
            if let Arg::Pos(x) = a {
                let v = self.expr(inst, x, scope);
                vals.push((v, x.span, self.last));
            }
        }
        self.sites.push((e.span, li.label.clone()));
        let r = self.call_fn(&li, func, vals, e.span, Some((sub.to_string(), None)));
        self.sites.pop();
        r
    }

    pub(super) fn call_layer(
        &mut self,
        name: &str,
        sub: &Val,
        vals: Vec<(Val, Span, Option<VId>)>,
        e: &Expr,
        scope: &Scope,
    ) -> Val {
        let (li, count) = match sub {
            Val::Layer(li) => (li.clone(), 1),
            Val::Repeat(n, li, _, _) => (li.clone(), *n),
            _ => return Val::Poison,
        };
        let Some(f) = find_fn(&li.decl, "forward") else {
            self.report(Problem::NoForward {
                span: li.decl.name.span,
                layer: li.label.clone(),
            });
            return Val::Poison;
        };
        let input = vals.first().map(|(v, _, _)| v.clone());
        self.sites.push((e.span, li.label.clone()));
        let stage_axis = match sub {
            Val::Repeat(_, _, Some(a), _) => Some(a.clone()),
            _ => None,
        };
        if let (Some(ax), true) = (&stage_axis, vals.len() > 1) {
            // Each stage receives one value from the stage before it.
            self.report(Problem::StageSideInputs {
                span: vals[1].1,
                axis: ax.clone(),
                stack: e.span,
            });
            self.sites.pop();
            return Val::Poison;
        }
        if let Some(ax) = &stage_axis {
            // A stage holds whole layers: nothing inside may be split over its axis.
            let mut bad: Vec<(Span, String)> = li
                .weights
                .values()
                .filter(|w| {
                    w.0.all_axes().contains(&ax.as_str()) || w.1.all_axes().contains(&ax.as_str())
                })
                .map(|w| (w.2, w.0.to_string()))
                .collect();
            if let Some((Val::T(t), sp, _)) = vals.first() {
                if t.all_axes().contains(&ax.as_str()) || t.pending.contains_key(ax) {
                    bad.push((*sp, t.to_string()));
                }
            }
            bad.sort();
            if let Some((span, ty)) = bad.into_iter().next() {
                self.report(Problem::StageAxisInside {
                    span,
                    axis: ax.clone(),
                    ty,
                    stack: e.span,
                });
                self.sites.pop();
                return Val::Poison;
            }
        }
        // The repetitions share one body; the lowering gives each its own
        // parameters (`blocks.0`, `blocks.1`, ...).
        let checkpoint = match sub {
            Val::Repeat(_, _, _, c) => c.clone(),
            _ => None,
        };
        let repeat = (count > 1 || checkpoint.is_some()).then(|| Repeat {
            count,
            stages: stage_axis.clone(),
            checkpoint,
        });
        let out = self.call_fn(&li, f, vals, e.span, Some((name.to_string(), repeat)));
        self.sites.pop();
        if count > 1 {
            if let (Some(Val::T(i)), Val::T(o)) = (&input, &out) {
                if i != o {
                    self.report_traced(
                        Problem::Mismatch {
                            span: e.span,
                            expected: i.to_string(),
                            found: o.to_string(),
                            decl: Some(li.decl.name.span),
                            detail: format!(
                                "a layer repeated {count} times must return its input type"
                            ),
                        },
                        e,
                        scope,
                    );
                    return Val::Poison;
                }
            }
        }
        out
    }
}
