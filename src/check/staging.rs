//! `repeat(n, Layer, ...)` and what a pipelined stack asks of its schedule:
//! the named arguments (`stages`, `schedule`, `chunks`, `microbatches`,
//! `checkpoint`), and whether the repetitions cut into the pieces the
//! schedule places on each rank (E0500, E0231).

use super::{Checker, Inst, Scope, Val};
use crate::ast::{self, Arg, Expr, ExprKind};
use crate::diag::{Problem, ScheduleProblem};
use crate::prim::rules::expr_to_dim;
use crate::source::Span;
use crate::vocab::Pipe;

/// What a `repeat`'s named arguments say.
struct RepeatArgs {
    stage_axis: Option<(String, Span)>,
    schedule: Pipe,
    /// `schedule: "FILE"`: read after lowering (`crate::schedule::file`).
    file: bool,
    chunks: Option<(i64, Span)>,
    checkpoint: Option<Vec<String>>,
}

impl Checker<'_> {
    pub(super) fn repeat(
        &mut self,
        inst: &Inst,
        args: &[Arg],
        span: Span,
        path: &str,
    ) -> Option<Val> {
        let pos: Vec<&Expr> = args
            .iter()
            .filter_map(|a| if let Arg::Pos(e) = a { Some(e) } else { None })
            .collect();
        if pos.len() != 2 {
            self.report(Problem::Arity {
                span,
                callee: "repeat".into(),
                expected: "2 positional arguments (count, layer)".into(),
                found: pos.len(),
                decl: None,
            });
            return None;
        }
        let (count_expr, _) = expr_to_dim(pos[0])?;
        let count = self.eval_dim(inst, &count_expr, &mut Scope::default(), false)?;
        let Some(n) = count.size.as_const().filter(|n| *n >= 1) else {
            self.report(Problem::BadDim {
                span: pos[0].span,
                expr: count.size.to_string(),
                reason: "a repeat count is a positive integer".into(),
            });
            return None;
        };
        let inner = self.sublayer(inst, pos[1], path)?;
        let Val::Layer(li) = inner else { return None };
        let RepeatArgs {
            stage_axis,
            schedule,
            file,
            chunks,
            checkpoint,
        } = self.repeat_args(args, &li);
        let mut fits = true;
        if let Some((ref ax, sspan)) = stage_axis {
            let stages = self.axis_size(ax);
            if n % stages != 0 {
                fits = false;
                self.report(Problem::BadDirective {
                    span: sspan,
                    message: format!("{n} repeated layers cannot be split into {stages} pipeline stages over `{ax}`"),
                    help: Some(format!("use a layer count that is a multiple of {stages}, or a `{ax}` axis size that divides {n}")),
                });
            } else {
                fits = match (file, chunks) {
                    // The file's pieces are checked when it is read.
                    (true, None) => true,
                    (true, Some((c, span))) => {
                        self.report(Problem::Schedule {
                            span,
                            problem: ScheduleProblem::FileChunks { chunks: c },
                        });
                        false
                    }
                    (false, _) => {
                        self.check_chunks(n, (ax, sspan), schedule, chunks, checkpoint.is_some())
                    }
                };
            }
        }
        let stages = stage_axis.map(|(a, _)| a).filter(|_| fits);
        Some(Val::Repeat(n, li, stages, checkpoint))
    }

    fn repeat_args(&mut self, args: &[Arg], li: &Inst) -> RepeatArgs {
        let mut r = RepeatArgs {
            stage_axis: None,
            schedule: crate::vocab::Pipe::default(),
            file: false,
            chunks: None,
            // The layer's own `checkpoint(...)` directive, else the model's
            // `checkpoint(full)`, unless the repeat says otherwise.
            checkpoint: li
                .checkpoint
                .clone()
                .or_else(|| self.checkpoint_repeats.then(Vec::new)),
        };
        for a in args {
            if let Arg::Named(k, v) = a {
                match (k.name.as_str(), v) {
                    (
                        "checkpoint",
                        ast::OptValue::Expr(Expr {
                            kind: ExprKind::Name(s),
                            span,
                        }),
                    ) => match s.as_str() {
                        "full" => r.checkpoint = Some(Vec::new()),
                        "none" => r.checkpoint = None,
                        _ => self.report(Problem::UnknownChoice {
                            span: *span,
                            kind: "checkpoint policy",
                            name: s.clone(),
                            known: vec!["full", "none"],
                        }),
                    },
                    (
                        "checkpoint",
                        ast::OptValue::Expr(Expr {
                            kind: ExprKind::List(items),
                            ..
                        }),
                    ) => r.checkpoint = Some(self.checkpoint_names(li, items)),
                    (
                        "stages",
                        ast::OptValue::Expr(Expr {
                            kind: ExprKind::Name(ax),
                            span,
                        }),
                    ) => {
                        if self.check_axis(&ast::Ident {
                            name: ax.clone(),
                            span: *span,
                        }) {
                            r.stage_axis = Some((ax.clone(), *span));
                        }
                    }
                    (
                        "schedule",
                        ast::OptValue::Expr(Expr {
                            kind: ExprKind::Name(s),
                            span,
                        }),
                    ) => {
                        let known = &crate::vocab::PIPELINE_SCHEDULES;
                        if let Some(p) = crate::vocab::Pipe::from_name(s) {
                            r.schedule = p;
                        }
                        if known.find(s).is_none() {
                            self.report(Problem::UnknownChoice {
                                span: *span,
                                kind: known.what,
                                name: s.clone(),
                                known: known.names(),
                            });
                        }
                    }
                    (
                        "schedule",
                        ast::OptValue::Expr(Expr {
                            kind: ExprKind::Str(_),
                            ..
                        }),
                    ) => r.file = true,
                    (
                        "microbatches",
                        ast::OptValue::Expr(Expr {
                            kind: ExprKind::Int(m),
                            span,
                        }),
                    ) => {
                        self.at_least_one(*m, *span, "microbatches");
                    }
                    (
                        "chunks",
                        ast::OptValue::Expr(Expr {
                            kind: ExprKind::Int(c),
                            span,
                        }),
                    ) => {
                        if self.at_least_one(*c, *span, "chunks") {
                            r.chunks = Some((*c, *span));
                        }
                    }
                    _ => self.report(Problem::NamedArg {
                        span: k.span,
                        callee: "repeat".into(),
                        name: k.name.clone(),
                        known: vec![
                            "stages".into(),
                            "schedule".into(),
                            "chunks".into(),
                            "microbatches".into(),
                            "checkpoint".into(),
                        ],
                        missing: false,
                    }),
                }
            }
        }
        r
    }

    /// Whether a count `v` is at least 1 (E0302 when not).
    fn at_least_one(&mut self, v: i64, span: Span, what: &str) -> bool {
        if v < 1 {
            self.report(Problem::BadValue {
                span,
                message: format!("{what} must be at least 1"),
                help: None,
            });
        }
        v >= 1
    }

    /// Whether `n` repetitions cut into the stages × chunks pieces the
    /// schedule places (E0231 when not, or when `chunks` does not apply).
    fn check_chunks(
        &mut self,
        n: i64,
        (axis, axis_span): (&str, Span),
        schedule: Pipe,
        chunks: Option<(i64, Span)>,
        checkpointed: bool,
    ) -> bool {
        let fixed = schedule.fixed_chunks();
        if let (Some(f), Some((c, span))) = (fixed, chunks) {
            if c as usize != f {
                self.report(Problem::Schedule {
                    span,
                    problem: ScheduleProblem::Chunks {
                        schedule: schedule.label(),
                        chunks: c,
                        fixed: f,
                    },
                });
                return false;
            }
        }
        if checkpointed && schedule.splits_backward() {
            self.report(Problem::Schedule {
                span: axis_span,
                problem: ScheduleProblem::Checkpointed {
                    schedule: schedule.label().to_string(),
                },
            });
            return false;
        }
        let stages = self.axis_size(axis).max(1) as usize;
        let v = fixed.or(chunks.map(|c| c.0 as usize)).unwrap_or(2);
        if v > 1 && !(n as usize).is_multiple_of(stages * v) {
            self.report(Problem::Schedule {
                span: chunks.map_or(axis_span, |c| c.1),
                problem: ScheduleProblem::Layers {
                    layers: n as u64,
                    stages,
                    chunks: v,
                    axis: axis.to_string(),
                },
            });
            return false;
        }
        true
    }
}
