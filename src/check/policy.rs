//! Checkpoint policies as the checker reads them: a `repeat`'s
//! `checkpoint: [h, y]` and a layer's `checkpoint(...)` directive, each name
//! a `let` of the layer's `forward` (E0228).

use super::{find_fn, Checker, Inst};
use crate::ast::{self, Arg, Expr, ExprKind, LayerDecl};
use crate::diag::Problem;
use crate::source::Span;

impl Checker<'_> {
    /// `checkpoint: [h, y]`: the `let`s of the repeated layer's `forward`
    /// whose values are kept; another name is E0228.
    pub(super) fn checkpoint_names(&mut self, li: &Inst, items: &[ast::ListItem]) -> Vec<String> {
        let names = items
            .iter()
            .map(|it| {
                it.as_name()
                    .map(|(n, s)| (n.to_string(), s))
                    .ok_or(it.span())
            })
            .collect();
        self.kept_lets(&li.decl, &li.label, names)
    }

    /// The names a checkpoint policy keeps, each a `let` of `decl`'s
    /// `forward` (E0228 otherwise); `Err(span)`: not a name.
    fn kept_lets(
        &mut self,
        decl: &LayerDecl,
        layer: &str,
        names: Vec<Result<(String, Span), Span>>,
    ) -> Vec<String> {
        let mut lets = Vec::new();
        if let Some(f) = find_fn(decl, "forward") {
            for l in &f.body.lets {
                lets.extend(
                    std::iter::once(&l.name)
                        .chain(&l.rest)
                        .map(|n| n.name.clone()),
                );
            }
        }
        let mut out = Vec::new();
        for n in names {
            let (name, span) = match n {
                Ok(x) => x,
                Err(span) => {
                    self.report(Problem::WrongKind {
                        span,
                        expected: "the name of a `let` to keep".into(),
                        found: "something else".into(),
                    });
                    continue;
                }
            };
            if lets.contains(&name) {
                out.push(name);
            } else {
                self.report(Problem::CheckpointName {
                    span,
                    suggestion: crate::diag::did_you_mean(&name, lets.iter().map(String::as_str)),
                    name,
                    layer: layer.to_string(),
                });
            }
        }
        out
    }

    /// `checkpoint(full)`, `checkpoint(none)` or `checkpoint(h, y)` in a
    /// layer: every call of its `forward` (and every repetition of it, unless
    /// the `repeat` names its own policy) is checkpointed.
    pub(super) fn checkpoint_directive(
        &mut self,
        decl: &LayerDecl,
        args: &[Arg],
        span: Span,
    ) -> Option<Vec<String>> {
        let name = |a: &Arg| match a {
            Arg::Pos(Expr {
                kind: ExprKind::Name(n),
                span,
            }) => Ok((n.clone(), *span)),
            other => Err(other.span()),
        };
        match args {
            [] => {
                self.report(Problem::BadDirective {
                    span,
                    message: "`checkpoint` needs a policy".into(),
                    help: Some(
                        "write `checkpoint(full)`, or `checkpoint(h, y)` to keep those values of `forward`".into(),
                    ),
                });
                None
            }
            [a] if matches!(name(a), Ok((ref n, _)) if n == "full") => Some(Vec::new()),
            [a] if matches!(name(a), Ok((ref n, _)) if n == "none") => None,
            _ => {
                let names = args.iter().map(name).collect();
                Some(self.kept_lets(decl, &decl.name.name, names))
            }
        }
    }
}
