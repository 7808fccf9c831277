//! Reading `train` and `table` declarations into typed values: the checks
//! every option shares. Options, choices (optimizers, schedules, data
//! sources) and their arguments are looked up in the registry
//! ([`crate::vocab`]), each argument checked by the kind of value it
//! declares, with a diagnostic for every one that is unknown, missing, or of
//! the wrong kind. `train.rs` and `table.rs` read the declarations.

use super::{OptKind, Optimizer, Schedule, Spec};
use crate::ast::{self, Expr, ExprKind, OptValue, Options};
use crate::diag::{Diagnostic, Problem};
use crate::resolve::Program;
use crate::source::{SourceMap, Span};
use crate::vocab::{Entry, Field, Lr, Opt, Value, Vocab, Word, LR_SCHEDULES};

/// The typed specification of every `train` and table of a resolved program,
/// and the problems found on the way.
pub fn build(prog: &Program, sources: &SourceMap) -> (Spec, Vec<Diagnostic>) {
    let mut b = Builder {
        prog,
        problems: Vec::new(),
    };
    let tables = prog.tables.iter().map(|t| b.table(t)).collect();
    let trains = prog
        .trains
        .iter()
        .filter_map(|t| b.train(t, sources))
        .collect();
    let diags = b.problems.into_iter().map(|p| p.diagnostic()).collect();
    (Spec { trains, tables }, diags)
}

pub(super) struct Builder<'a> {
    pub prog: &'a Program,
    problems: Vec<Problem>,
}

/// A number literal (`0.9`, `3`, `-0.5`).
pub(super) fn num(e: &Expr) -> Option<f64> {
    match &e.kind {
        ExprKind::Float(v) => Some(*v),
        ExprKind::Int(v) => Some(*v as f64),
        ExprKind::Neg(x) => num(x).map(|v| -v),
        _ => None,
    }
}

/// A call-shaped option value: `adam(lr: 0.005)` or a bare name `adam`.
fn call_parts(e: &Expr) -> Option<(&str, Span, Vec<&ast::Arg>)> {
    match &e.kind {
        ExprKind::Name(n) => Some((n, e.span, vec![])),
        ExprKind::Call(c, args) => match &c.kind {
            ExprKind::Name(n) => Some((n, c.span, args.iter().collect())),
            _ => None,
        },
        _ => None,
    }
}

/// The named expression arguments of a call-shaped value.
pub(super) fn named_args(e: &Expr) -> Vec<(&str, &Expr)> {
    e.as_call().map(|(_, a)| a).unwrap_or_default()
}

/// `true` or `false`.
pub(super) fn flag(e: &Expr) -> Option<bool> {
    match &e.kind {
        ExprKind::Name(b) if b == "true" => Some(true),
        ExprKind::Name(b) if b == "false" => Some(false),
        _ => None,
    }
}

impl Builder<'_> {
    pub(super) fn report(&mut self, p: Problem) {
        self.problems.push(p);
    }

    /// An integer literal or constant.
    pub(super) fn int_value(&self, e: &Expr) -> Option<i64> {
        match &e.kind {
            ExprKind::Int(x) => Some(*x),
            ExprKind::Neg(x) => self.int_value(x).map(|v| -v),
            ExprKind::Name(n) => self.prog.consts.get(n).map(|c| c.0),
            _ => None,
        }
    }

    pub(super) fn opt_int(&mut self, v: &OptValue, what: &str, min: i64) -> Option<i64> {
        let val = match v {
            OptValue::Expr(e) => self.int_value(e),
            _ => None,
        };
        match val {
            Some(x) if x >= min => Some(x),
            _ => {
                self.report(Problem::BadValue {
                    span: v.span(),
                    message: if min == i64::MIN {
                        format!("`{what}` must be an integer")
                    } else {
                        format!("`{what}` must be an integer of at least {min}")
                    },
                    help: None,
                });
                None
            }
        }
    }

    pub(super) fn opt_num(&mut self, v: &OptValue, what: &str, positive: bool) -> Option<f64> {
        let val = match v {
            OptValue::Expr(e) => match &e.kind {
                ExprKind::Float(x) => Some(*x),
                ExprKind::Int(x) => Some(*x as f64),
                _ => None,
            },
            _ => None,
        };
        match val {
            Some(x) if !positive || x > 0.0 => Some(x),
            _ => {
                let req = if positive {
                    "a positive number"
                } else {
                    "a number"
                };
                self.report(Problem::BadValue {
                    span: v.span(),
                    message: format!("`{what}` must be {req}"),
                    help: None,
                });
                None
            }
        }
    }

    /// The options of a declaration against its registry: each known and
    /// given once, the required ones given.
    pub(super) fn check_fields<T>(&mut self, opts: &Options, fields: &Vocab<Field<T>>, at: Span) {
        let known = fields.names();
        let required: Vec<&str> = fields
            .defs
            .iter()
            .filter(|f| f.required)
            .map(|f| f.name)
            .collect();
        self.check_known(opts, &known, &required, fields.what, at);
    }

    /// The fields of an options block (`eval: { every: 10 }`) against the
    /// option's.
    pub(super) fn check_block(&mut self, opts: &Options, field: &dyn Entry, at: Span) {
        let known: Vec<&str> = field.args().iter().map(|a| a.name).collect();
        let required: Vec<&str> = field
            .args()
            .iter()
            .filter(|a| a.required())
            .map(|a| a.name)
            .collect();
        self.check_known(opts, &known, &required, field.name(), at);
    }

    fn check_known(
        &mut self,
        opts: &Options,
        known: &[&str],
        required: &[&str],
        what: &str,
        at: Span,
    ) {
        let mut seen: Vec<&str> = Vec::new();
        // Required fields an unknown one was probably meant as (`batch_size`
        // for `batch`): its error says so, and no second one says it is missing.
        let mut meant: Vec<String> = Vec::new();
        for (k, _) in &opts.entries {
            if seen.contains(&k.name.as_str()) {
                self.report(Problem::Field {
                    span: k.span,
                    message: format!("`{}` is given twice", k.name),
                    known: vec![],
                    suggestion: None,
                });
            }
            seen.push(&k.name);
            if !known.contains(&k.name.as_str()) {
                let s = field_meant(&k.name, known);
                let msg = match &s {
                    Some(s) => format!("unknown {what} field `{}` (did you mean `{s}`?)", k.name),
                    None => format!("unknown {what} field `{}`", k.name),
                };
                meant.extend(s.clone().filter(|s| opts.get(s).is_none()));
                self.report(Problem::Field {
                    span: k.span,
                    message: msg,
                    known: known.iter().map(|s| s.to_string()).collect(),
                    suggestion: s,
                });
            }
        }
        for r in required {
            if opts.get(r).is_none() && !meant.iter().any(|m| m == r) {
                self.report(Problem::Field {
                    span: at,
                    message: format!("missing {what} field `{r}`"),
                    known: vec![],
                    suggestion: None,
                });
            }
        }
    }

    /// `name(arg: value, ...)` against a vocabulary of call-shaped words:
    /// the word when it is one of them, its arguments checked (each known,
    /// of its kind, the required ones given).
    pub(super) fn check_choice<T>(
        &mut self,
        v: &OptValue,
        vocab: &Vocab<Word<T>>,
    ) -> Option<&'static Word<T>> {
        let kind = vocab.what;
        let OptValue::Expr(e) = v else {
            self.report(Problem::WrongKind {
                span: v.span(),
                expected: format!("a {kind}"),
                found: "an options block".into(),
            });
            return None;
        };
        let Some((name, nspan, args)) = call_parts(e) else {
            let example = vocab.defs.first().map_or("", |w| w.name);
            self.report(Problem::WrongKind {
                span: e.span,
                expected: format!("a {kind} like `{example}(...)`"),
                found: "an expression".into(),
            });
            return None;
        };
        let Some(word) = vocab.find(name) else {
            self.report(Problem::UnknownChoice {
                span: nspan,
                kind,
                name: name.into(),
                known: vocab.names(),
            });
            return None;
        };
        for a in args {
            match a {
                ast::Arg::Named(k, val) => match word.arg(&k.name) {
                    Some(arg) => self.check_arg(arg.value, &k.name, val),
                    None => self.report(Problem::NamedArg {
                        span: k.span,
                        callee: name.into(),
                        name: k.name.clone(),
                        known: word.args.iter().map(|a| a.name.to_string()).collect(),
                        missing: false,
                    }),
                },
                other => self.report(Problem::WrongKind {
                    span: other.span(),
                    expected: "a named argument like `lr: 0.001`".into(),
                    found: "a positional argument".into(),
                }),
            }
        }
        self.check_required(word, e);
        Some(word)
    }

    /// A word's required arguments are present.
    fn check_required(&mut self, word: &dyn Entry, e: &Expr) {
        let given = named_args(e);
        let required: Vec<String> = word
            .args()
            .iter()
            .filter(|a| a.required())
            .map(|a| a.name.to_string())
            .collect();
        for k in &required {
            if !given.iter().any(|a| a.0 == k) {
                self.report(Problem::NamedArg {
                    span: e.span,
                    callee: word.name().into(),
                    name: k.clone(),
                    known: required.clone(),
                    missing: true,
                });
            }
        }
    }

    /// One argument's value against the kind it declares.
    pub(super) fn check_arg(&mut self, value: Value, name: &str, val: &OptValue) {
        let expr = match val {
            OptValue::Expr(e) => Some(e),
            OptValue::Options(_) => None,
        };
        match value {
            Value::Count => {
                self.opt_int(val, name, 1);
            }
            Value::Number => {
                self.opt_num(val, name, false);
            }
            Value::Integer => {
                self.opt_int(val, name, i64::MIN);
            }
            Value::Positive => {
                self.opt_num(val, name, true);
            }
            Value::Unit => {
                if let Some(x) = self.opt_num(val, name, false) {
                    if !(0.0..1.0).contains(&x) {
                        self.report(Problem::BadValue {
                            span: val.span(),
                            message: format!("`{name}` must be in [0, 1)"),
                            help: None,
                        });
                    }
                }
            }
            Value::Flag => {
                if expr.and_then(flag).is_none() {
                    self.report(Problem::BadValue {
                        span: val.span(),
                        message: format!("`{name}` must be `true` or `false`"),
                        help: None,
                    });
                }
            }
            Value::Path | Value::Name => {
                if !matches!(expr.map(|e| &e.kind), Some(ExprKind::Str(_))) {
                    self.report(Problem::BadValue {
                        span: val.span(),
                        message: format!("`{name}` must be a string"),
                        help: None,
                    });
                }
            }
            Value::Patterns => {
                if expr.and_then(pattern_list).is_none() {
                    self.report(Problem::BadValue {
                        span: val.span(),
                        message: format!("`{name}` must be a list of names, like `[norm, bias]`"),
                        help: None,
                    });
                }
            }
            Value::Scales => match val {
                OptValue::Options(o) => {
                    for (k, v) in &o.entries {
                        self.opt_num(v, &k.name, true);
                    }
                }
                OptValue::Expr(_) => self.report(Problem::BadValue {
                    span: val.span(),
                    message: format!(
                        "`{name}` must be names with a factor each, like `{{ embed: 0.1 }}`"
                    ),
                    help: None,
                }),
            },
            Value::Lr => match expr.map(|e| &e.kind) {
                Some(ExprKind::Call(..) | ExprKind::Name(_)) => {
                    self.check_choice(val, &LR_SCHEDULES);
                }
                _ => {
                    self.opt_num(val, name, true);
                }
            },
        }
    }

    /// A checked optimizer expression as a typed value (the registry's
    /// defaults for what it leaves out).
    pub(super) fn optimizer(&self, tag: Opt, e: &Expr) -> Optimizer {
        let args = named_args(e);
        let value = |k: &str| {
            let e = args.iter().find(|a| a.0 == k).map(|a| a.1)?;
            num(e).or_else(|| flag(e).map(|b| f64::from(u8::from(b))))
        };
        let lr = match args.iter().find(|a| a.0 == "lr").map(|a| a.1) {
            None => Schedule::Constant(super::default_lr(tag)),
            Some(v) => match v.as_call() {
                Some((name, a)) => match Lr::from_name(name) {
                    Some(kind) => Schedule::build(kind, &|k: &str| {
                        a.iter().find(|x| x.0 == k).and_then(|x| num(x.1))
                    }),
                    // Reported by `check_choice`; the spec is not run.
                    None => Schedule::Constant(super::default_lr(tag)),
                },
                None => Schedule::Constant(num(v).unwrap_or_else(|| super::default_lr(tag))),
            },
        };
        Optimizer {
            kind: OptKind::build(tag, &value),
            lr,
            groups: groups(e),
            lr_scale: 1.0,
        }
    }
}

/// An optimizer call's parameter groups (checked by [`Builder::check_arg`]):
/// `no_decay: [norm, bias]`, `lr_scale: { embed: 0.1 }`.
fn groups(e: &Expr) -> super::Groups {
    let mut g = super::Groups::default();
    let ExprKind::Call(_, args) = &e.kind else {
        return g;
    };
    for a in args {
        match a {
            ast::Arg::Named(k, OptValue::Expr(v)) if k.name == "no_decay" => {
                g.no_decay = pattern_list(v).unwrap_or_default();
                if let ExprKind::List(items) = &v.kind {
                    for i in items {
                        if let Some((n, span)) = i.as_name() {
                            g.written.push((n.to_string(), "no_decay", span));
                        }
                    }
                }
            }
            ast::Arg::Named(k, OptValue::Options(o)) if k.name == "lr_scale" => {
                g.lr_scale = o
                    .entries
                    .iter()
                    .filter_map(|(n, v)| match v {
                        OptValue::Expr(x) => num(x).map(|f| (n.name.clone(), f)),
                        OptValue::Options(_) => None,
                    })
                    .collect();
                g.written.extend(
                    o.entries
                        .iter()
                        .map(|(n, _)| (n.name.clone(), "lr_scale", n.span)),
                );
            }
            _ => {}
        }
    }
    g
}

/// `[norm, bias]` (names or strings) as its names.
fn pattern_list(e: &Expr) -> Option<Vec<String>> {
    let ExprKind::List(items) = &e.kind else {
        return None;
    };
    items
        .iter()
        .map(|i| match (i.as_name(), i) {
            (Some((n, _)), _) => Some(n.to_string()),
            (
                None,
                ast::ListItem::Expr(Expr {
                    kind: ExprKind::Str(n),
                    ..
                }),
            ) if !n.is_empty() => Some(n.clone()),
            _ => None,
        })
        .collect()
}

/// The field an unknown one was probably meant as: the nearest by spelling,
/// else one with the same first word (`batch_size`: `batch`, `log_steps`:
/// `log_every`), else one of its words (`num_steps`: `steps`).
fn field_meant(name: &str, known: &[&str]) -> Option<String> {
    let first = |s: &str| s.split('_').next().unwrap_or("").to_string();
    crate::diag::did_you_mean(name, known.iter().copied())
        .or_else(|| {
            // `log_steps`: `log_every`; `batch_size`: `batch`.
            known
                .iter()
                .find(|k| name.contains('_') && first(k) == first(name))
                .map(|k| k.to_string())
        })
        .or_else(|| {
            known
                .iter()
                .find(|k| name.split('_').any(|part| part == **k))
                .map(|k| k.to_string())
        })
}
