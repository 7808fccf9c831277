//! Reading `table` declarations into typed values: each option through its
//! registry tag ([`crate::vocab::TABLE_OPTIONS`]), with a diagnostic for every
//! one that is unknown, missing, or of the wrong kind.

use super::build::Builder;
use super::Table;
use crate::ast::{self, Expr, ExprKind, OptValue};
use crate::diag::Problem;
use crate::embed::{Combiner, Overflow};
use crate::init::Init;
use crate::vocab::{TableOption, OPTIMIZERS, TABLE_OPTIONS};

impl Builder<'_> {
    /// A checked `table` declaration as a typed value.
    pub(super) fn table(&mut self, t: &ast::TableDecl) -> Table {
        self.check_fields(&t.options, &TABLE_OPTIONS, t.name.span);
        let mut table = Table {
            name: t.name.name.clone(),
            span: t.name.span,
            vocab: None,
            dim: None,
            init: Init::Normal(1.0),
            combiner: Combiner::Sum,
            optimizer: None,
            frozen: false,
            max_ids: None,
            max_unique_ids: None,
            stack_max_ids: None,
            stack_max_unique_ids: None,
            suggested_buffer: None,
            overflow: Overflow::Error,
            axis: None,
        };
        for (k, v) in &t.options.entries {
            // An unknown option was reported with the fields.
            if let Some(o) = TableOption::from_name(&k.name) {
                self.table_option(&mut table, o, v);
            }
        }
        if table.frozen {
            let span_of =
                |o: TableOption| t.options.entries.iter().find(|(n, _)| n.name == o.name());
            if let (Some((_, opt)), Some((f, _))) = (
                span_of(TableOption::Optimizer),
                span_of(TableOption::Frozen),
            ) {
                self.report(Problem::FrozenTableOptimizer {
                    span: opt.span(),
                    table: table.name.clone(),
                    frozen: f.span,
                });
            }
        }
        // `max_unique_ids_per_partition` may exceed `max_ids_per_partition`, as
        // in the library: the smaller limit binds first.
        table
    }

    /// One option of a table, read into it.
    fn table_option(&mut self, table: &mut Table, o: TableOption, v: &OptValue) {
        let name = o.name();
        match o {
            TableOption::Vocab => table.vocab = self.opt_int(v, name, 1),
            TableOption::Dim => table.dim = self.opt_int(v, name, 1),
            TableOption::MaxIds => table.max_ids = self.opt_int(v, name, 1),
            TableOption::MaxUniqueIds => table.max_unique_ids = self.opt_int(v, name, 1),
            TableOption::StackMaxIds => table.stack_max_ids = self.opt_int(v, name, 1),
            TableOption::StackMaxUniqueIds => {
                table.stack_max_unique_ids = self.opt_int(v, name, 1)
            }
            TableOption::SuggestedBufferSize => table.suggested_buffer = self.opt_int(v, name, 1),
            TableOption::Combiner => {
                if let Some(c) = self.combiner(v) {
                    table.combiner = c;
                }
            }
            TableOption::Optimizer => {
                if let (Some(w), OptValue::Expr(e)) = (self.check_choice(v, &OPTIMIZERS), v) {
                    table.optimizer = Some(self.optimizer(w.tag, e));
                }
            }
            TableOption::Overflow => match v {
                OptValue::Expr(Expr {
                    kind: ExprKind::Name(n),
                    ..
                }) if Overflow::parse(n).is_some() => {
                    table.overflow = Overflow::parse(n).unwrap_or(Overflow::Error)
                }
                _ => self.report(Problem::TableField { span: v.span(), message: "`overflow` must be `error`, `drop` or `grow`".into(), help: Some("`error` stops with a diagnostic, `drop` drops ids beyond the limit and counts them, `grow` raises the limit and re-plans".into()) }),
            },
            TableOption::Init => match v {
                OptValue::Expr(e) => match Init::parse(e) {
                    Ok(i) => table.init = i,
                    Err(p) => self.report(*p),
                },
                OptValue::Options(o) => self.report(Problem::WrongKind {
                    span: o.span,
                    expected: "an initializer like `normal(0.02)`".into(),
                    found: "an options block".into(),
                }),
            },
            TableOption::Shard => table.axis = self.shard(v),
            TableOption::Frozen => match v {
                OptValue::Expr(Expr {
                    kind: ExprKind::Name(b),
                    ..
                }) if b == "true" || b == "false" => table.frozen = b == "true",
                _ => self.report(Problem::TableField {
                    span: v.span(),
                    message: "`frozen` must be `true` or `false`".into(),
                    help: Some(
                        "`frozen: true` keeps the table's rows fixed: looked up, never updated"
                            .into(),
                    ),
                }),
            },
        }
    }

    /// `combiner: sum`.
    fn combiner(&mut self, v: &OptValue) -> Option<Combiner> {
        let (span, name) = match v {
            OptValue::Expr(Expr {
                kind: ExprKind::Name(n),
                span,
            }) => match Combiner::parse(n) {
                Some(c) => return Some(c),
                None => (*span, n.clone()),
            },
            OptValue::Expr(Expr {
                kind: ExprKind::Str(n),
                span,
            }) => (*span, n.clone()),
            _ => (v.span(), "?".into()),
        };
        self.report(Problem::UnknownCombiner { span, name });
        None
    }

    /// `shard: rows(axis)`: the axis.
    fn shard(&mut self, v: &OptValue) -> Option<String> {
        let mut axis = None;
        let ok = match v {
            OptValue::Expr(Expr {
                kind: ExprKind::Call(c, args),
                ..
            }) => matches!(&c.kind, ExprKind::Name(n) if n == "rows") && args.len() == 1,
            _ => false,
        };
        if let OptValue::Expr(Expr {
            kind: ExprKind::Call(_, args),
            ..
        }) = v
        {
            if let Some(ast::Arg::Pos(Expr {
                kind: ExprKind::Name(ax),
                span,
            })) = args.first()
            {
                let meshes = &self.prog.meshes;
                if !meshes.iter().any(|m| m.axis(ax).is_some()) {
                    let m = meshes.first();
                    self.report(Problem::UnknownAxis {
                        span: *span,
                        axis: ax.clone(),
                        mesh: m.map(|m| (m.name.clone(), m.name_span)),
                        axes: m.map(|m| m.axis_names()).unwrap_or_default(),
                    });
                }
                axis = Some(ax.clone());
            }
        }
        if !ok {
            self.report(Problem::ShardNotRows {
                span: v.span(),
                axis: axis.clone(),
            });
            return None;
        }
        axis
    }
}
