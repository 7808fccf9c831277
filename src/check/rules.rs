//! The checker's services to the primitives' type rules ([`Rules`]), the
//! layout changes it inserts (reported as notes, or errors where collectives
//! must be explicit), and built-in calls and operators dispatched to their
//! primitives.

use super::body::Op;
use super::{Checker, Inst, Scope, Val};
use crate::ast::{self, BinOp, DimExpr, Expr, ReduceOp};
use crate::diag::Problem;
use crate::prim::reshard::{Refusal, Reshard};
use crate::prim::rules::{Call, Feature, Rules, Typed};
use crate::prim::{arith, matmul, Def};
use crate::source::Span;
use crate::types::{Dim, Poly, TType};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The checker as a type rule sees it, inside one function of one instance.
pub(super) struct RuleCx<'c, 'p> {
    ck: &'c mut Checker<'p>,
    inst: &'c Arc<Inst>,
    scope: &'c mut Scope,
}

impl Rules for RuleCx<'_, '_> {
    fn tensor(&mut self, e: &Expr, what: &str) -> Option<TType> {
        let v = self.ck.expr(self.inst, e, self.scope);
        self.ck.arg_ids.push(self.ck.last);
        self.ck.tensor_of(v, e, what)
    }
    fn check_axis(&mut self, name: &str, span: Span) -> bool {
        self.ck.check_axis(&ast::Ident {
            name: name.to_string(),
            span,
        })
    }
    fn axis_size(&self, axis: &str) -> i64 {
        self.ck.axis_size(axis)
    }
    fn bound(&self) -> &BTreeMap<String, Poly> {
        &self.ck.bound
    }
    fn size(&mut self, e: &DimExpr, symbols: bool) -> Option<(Poly, Option<Vec<String>>)> {
        self.ck
            .eval_dim(self.inst, e, self.scope, symbols)
            .map(|v| (v.size, v.axes))
    }
    fn tyvars(&self) -> BTreeMap<String, Poly> {
        self.scope.tyvars.clone()
    }
    fn const_int(&self, e: &DimExpr) -> Option<i64> {
        let consts = &self.ck.prog.consts;
        crate::resolve::eval_int(e, &mut |n, _| consts.get(n).map(|v| v.0).ok_or(())).ok()
    }
    fn number(&self, e: &Expr) -> Option<f64> {
        self.ck.const_number(self.inst, e, self.scope)
    }
    fn report(&mut self, p: Problem) {
        self.ck.report(p)
    }
    fn report_traced(&mut self, p: Problem, e: &Expr) {
        self.ck.report_traced(p, e, self.scope)
    }
    fn need_reduced(&mut self, t: &TType, op: &str, e: &Expr) -> bool {
        self.ck.need_reduced(t, op, e, self.scope)
    }
    fn reshard(
        &mut self,
        t: &TType,
        target: &[Option<Vec<String>>],
        pending: &BTreeMap<String, ReduceOp>,
        span: Span,
    ) -> TType {
        self.ck
            .reshard(t, target, pending, (span, Written::Operand), self.scope)
    }
    fn implicit(
        &mut self,
        span: Span,
        what: String,
        from: String,
        to: String,
        t: &TType,
        factor: f64,
    ) {
        let bytes = self.ck.bytes_text(t, factor);
        let inserted = Inserted {
            what,
            from,
            to,
            bytes,
            explicit: None,
        };
        self.ck.implicit(span, inserted, self.scope)
    }
    fn check_dim(&mut self, d: &Dim, span: Span, what: &str) -> bool {
        self.ck.check_dim(d, span, what)
    }
    fn hint(&self, span: Span, rank: usize) -> Option<Vec<Option<Vec<String>>>> {
        match &self.ck.hint {
            Some((s, h)) if *s == span && h.len() == rank => Some(h.clone()),
            _ => None,
        }
    }
    fn feature(&mut self, name: &str, span: Span) -> Option<Feature> {
        let prog = self.ck.prog;
        let Some(feat) = prog.features.iter().find(|f| f.name.name == name) else {
            let known = prog.features.iter().map(|f| f.name.name.as_str()).collect();
            self.ck
                .report(crate::prim::lookup::unknown_feature(name, span, known));
            return None;
        };
        let table = self.ck.spec.table(&feat.table.name)?.clone();
        // The feature's ids, with the sizes bound in this function.
        let mut fscope = Scope {
            tyvars: self.scope.tyvars.clone(),
            ..Scope::default()
        };
        let ty = self
            .ck
            .eval_type(&feat.ty, self.inst, &mut fscope, true, None)?;
        Some(Feature {
            ty: self.ck.apply_bound(ty),
            dtype_span: feat.ty.dtype_span,
            span: feat.span,
            table,
        })
    }
    fn table_operand(&mut self, table: &crate::spec::Table) {
        let id = self.ck.table_value(table);
        self.ck.arg_ids.insert(0, id);
    }
}

impl<'p> Checker<'p> {
    pub(super) fn rules<'c>(
        &'c mut self,
        inst: &'c Arc<Inst>,
        scope: &'c mut Scope,
    ) -> RuleCx<'c, 'p> {
        RuleCx {
            ck: self,
            inst,
            scope,
        }
    }

    /// Bytes each device moves for a collective on a value of type `t`:
    /// `factor` × its local bytes.
    pub(super) fn bytes_text(&self, t: &TType, factor: f64) -> String {
        crate::prim::cost::bytes(t, factor, &self.bound, &|a| self.axis_size(a)).text
    }

    /// An embedding table's parameter, used where it is stored: its rows split
    /// over the table's `rows(axis)` (placed MOD over the axis's devices and
    /// their SparseCores by the runtime); the lookup fetches the rows it needs
    /// from their owners.
    pub(super) fn table_value(&mut self, table: &crate::spec::Table) -> Option<super::VId> {
        let (Some(vocab), Some(dim)) = (table.vocab, table.dim) else {
            return None;
        };
        let rows_axes: Vec<String> = table
            .axis
            .clone()
            .into_iter()
            .filter(|a| vocab % self.axis_size(a).max(1) == 0)
            .collect();
        let ty = TType::new(
            crate::ast::DType::F32,
            vec![
                Dim {
                    size: Poly::constant(vocab),
                    axes: rows_axes,
                },
                Dim::replicated(Poly::constant(dim)),
            ],
        );
        self.record(
            Op::Table {
                name: table.name.clone(),
                init: table.init,
                frozen: table.frozen,
            },
            &ty,
            table.span,
        )
    }

    /// Move `got` to the layout `target` (per dim: `None` keeps the value's
    /// axes) with the pending reductions `want_pending`. Each collective this needs
    /// is a note, or an error in strict mode or inside a local block.
    /// `span`: where to report; `Written::Value` when the value resharded is
    /// the expression written there (E0216's fix then wraps it).
    pub(super) fn reshard(
        &mut self,
        got: &TType,
        target: &[Option<Vec<String>>],
        want_pending: &BTreeMap<String, ReduceOp>,
        (span, written): (Span, Written),
        scope: &Scope,
    ) -> TType {
        let planned = crate::prim::reshard::plan(
            got,
            target,
            want_pending,
            &|a| self.axis_size(a),
            &self.bound,
        );
        let (t, events) = match planned {
            Ok(x) => x,
            Err(Refusal::NotOwed { expected, axis }) => {
                self.report(Problem::Mismatch {
                    span,
                    expected: expected.to_string(),
                    found: got.to_string(),
                    decl: None,
                    detail: format!("this value owes no reduction over `{axis}`"),
                });
                return got.clone();
            }
        };
        let to = t.to_string();
        let changed = !events.is_empty() || t != *got;
        // Written out, the collectives wrap the value in the order they run
        // (E0216's fix: only where collectives must be explicit).
        let refused = self.strict.is_some() || scope.local.is_some();
        let explicit = (refused && written == Written::Value).then(|| {
            events
                .iter()
                .fold((String::new(), String::new()), |(b, a), ev| {
                    (format!("{}{b}", ev.call.0), format!("{a}{}", ev.call.1))
                })
        });
        for ev in one_note_per_gather(events) {
            let inserted = Inserted {
                what: ev.what,
                from: ev.from,
                to: to.clone(),
                bytes: ev.bytes.text,
                explicit: explicit.clone(),
            };
            self.implicit(span, inserted, scope);
        }
        if changed && !self.in_builtin {
            let input = self.last;
            self.record_prim(Reshard.into(), vec![input], &t, span);
        }
        t
    }

    /// Report a collective the compiler inserts: a note, or an error in strict mode
    /// and inside local blocks.
    pub(super) fn implicit(&mut self, span: Span, c: Inserted, scope: &Scope) {
        let Inserted {
            what,
            from,
            to,
            bytes,
            explicit,
        } = c;
        if self.strict.is_some() || scope.local.is_some() {
            let strict = self.strict.filter(|s| *s != Span::default());
            self.report(Problem::ImplicitCollective {
                span,
                what,
                bytes,
                strict,
                local: scope.local,
                explicit,
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

    pub(super) fn need_reduced(&mut self, t: &TType, op: &str, e: &Expr, scope: &Scope) -> bool {
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
                reduce: Some(reducing(t)),
            },
            e,
            scope,
        );
        false
    }

    /// A tensor, or `None` (reported unless already an error) for anything else.
    pub(super) fn tensor_of(&mut self, v: Val, e: &Expr, what: &str) -> Option<TType> {
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

    /// `a op b` for values of any kind: numbers fold, tensors go to their rule.
    pub(super) fn binary(
        &mut self,
        inst: &Arc<Inst>,
        op: BinOp,
        (va, a): (Val, &Expr),
        (vb, b): (Val, &Expr),
        e: &Expr,
        scope: &mut Scope,
    ) -> Val {
        if matches!(va, Val::Poison) || matches!(vb, Val::Poison) {
            return Val::Poison;
        }
        // Several results where one value belongs: said once.
        for (v, x) in [(&va, a), (&vb, b)] {
            if matches!(v, Val::Tuple(..)) {
                self.tensor_of(v.clone(), x, "an arithmetic operator");
                return Val::Poison;
            }
        }
        if op == BinOp::MatMul {
            let (Some(x), Some(y)) = (self.tensor_of(va, a, "`@`"), self.tensor_of(vb, b, "`@`"))
            else {
                return Val::Poison;
            };
            let mut cx = self.rules(inst, scope);
            return matmul::rule(&mut cx, &x, &y, a, b, e).map_or(Val::Poison, Val::T);
        }
        let num = |v: &Val| match v {
            Val::Num(x) => Some(*x),
            Val::Int(x) => Some(*x as f64),
            _ => None,
        };
        match (&va, &vb) {
            (Val::T(t), other) | (other, Val::T(t)) if num(other).is_some() => {
                let t = t.clone();
                let on_right = matches!(vb, Val::T(_));
                let mut cx = self.rules(inst, scope);
                return arith::scalar_rule(&mut cx, op, &t, on_right, e)
                    .map_or(Val::Poison, Val::T);
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
            self.tensor_of(va, a, "an arithmetic operator"),
            self.tensor_of(vb, b, "an arithmetic operator"),
        ) else {
            return Val::Poison;
        };
        let mut cx = self.rules(inst, scope);
        arith::binary_rule(&mut cx, op, (&x, a), (&y, b), e).map_or(Val::Poison, Val::T)
    }

    /// A built-in call: checked by its primitive's rule, recorded as one op whose
    /// operands are its tensor arguments and whose result type carries the
    /// layout (the reshards the rule reported are implied by it).
    pub(super) fn builtin(
        &mut self,
        inst: &Arc<Inst>,
        def: &'static Def,
        raw: &[ast::Arg],
        e: &Expr,
        scope: &mut Scope,
    ) -> Val {
        let Some(check) = def.check else {
            return Val::Poison;
        };
        let saved_ids = std::mem::take(&mut self.arg_ids);
        let saved_in = std::mem::replace(&mut self.in_builtin, true);
        let call = Call::new(def.name, e, raw);
        let r = {
            let mut cx = self.rules(inst, scope);
            check(&mut cx, &call)
        };
        self.in_builtin = saved_in;
        let ids = std::mem::replace(&mut self.arg_ids, saved_ids);
        match r {
            Some(Typed { ty, prim, more }) => {
                self.record_prim(prim, ids.clone(), &ty, e.span);
                if more.is_empty() {
                    return Val::T(ty);
                }
                // Several results: one op each, from the same operands.
                let mut parts = vec![(ty, self.last)];
                for (t, p) in more {
                    self.record_prim(p, ids.clone(), &t, e.span);
                    parts.push((t, self.last));
                }
                Val::Tuple(def.name, parts)
            }
            None => {
                // A rule refuses only with a diagnostic (here or at an operand).
                debug_assert!(
                    self.diags.iter().any(|d| d.is_error()),
                    "`{}` refused {:?} without an error",
                    def.name,
                    e.span
                );
                Val::Poison
            }
        }
    }
}

/// What a reshard's span holds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Written {
    /// The value resharded (an annotated `let`'s value, an argument, a
    /// result): the collectives can be written around it.
    Value,
    /// An op that needs one of its operands in another layout.
    Operand,
}

/// A collective the checker inserts, as its diagnostic tells it.
pub(super) struct Inserted {
    pub what: String,
    pub from: String,
    pub to: String,
    pub bytes: String,
    /// The calls that write it explicitly around the value (E0216's fix),
    /// where they are known.
    pub explicit: Option<(String, String)>,
}

/// A reshard's collectives as its notes say them: consecutive all-gathers
/// (one dim split over several axes, gathered whole; the kernel gathers one
/// axis after the other) are one note over all their axes, from the first's
/// type, with their bytes together.
fn one_note_per_gather(
    events: Vec<crate::prim::reshard::Event>,
) -> Vec<crate::prim::reshard::Event> {
    let mut out: Vec<crate::prim::reshard::Event> = Vec::new();
    for ev in events {
        match out.last_mut() {
            Some(last) if last.kind == "all-gather" && ev.kind == "all-gather" => {
                last.axes.extend(ev.axes);
                let names: Vec<String> = last.axes.iter().map(|a| format!("`{a}`")).collect();
                last.what = format!("all-gather over {}", names.join(", "));
                last.bytes = match (last.bytes.num, ev.bytes.num) {
                    (Some(a), Some(b)) => crate::prim::cost::Bytes {
                        text: crate::units::human_bytes(a + b),
                        num: Some(a + b),
                    },
                    _ => crate::prim::cost::Bytes {
                        text: format!("{} + {}", last.bytes.text, ev.bytes.text),
                        num: None,
                    },
                };
            }
            _ => out.push(ev),
        }
    }
    out
}

/// The call that removes every reduction `t` owes, as the text around it:
/// `psum(…, a, b)` for sums, `pmax(…, a)` / `pmin(…, a)` for one pending
/// maximum or minimum, else `reduce(…)` (every kind at once).
fn reducing(t: &TType) -> (String, String) {
    let axes: Vec<&str> = t.pending.keys().map(String::as_str).collect();
    let ops: Vec<ReduceOp> = t.pending.values().copied().collect();
    let one = |name: &str| (format!("{name}("), format!(", {})", axes.join(", ")));
    match ops.as_slice() {
        [ReduceOp::Max] => one("pmax"),
        [ReduceOp::Min] => one("pmin"),
        _ if ops.iter().all(|o| *o == ReduceOp::Sum) => one("psum"),
        _ => ("reduce(".into(), ")".into()),
    }
}
