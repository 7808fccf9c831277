//! Weight maps: how a checkpoint written by another library names and lays
//! out a model's parameters. A map is a TOML file beside the model (the
//! shipped ones are in `models/maps/`); each `[[tensor]]` rule renames a
//! family of tensors (`model.layers.{i}.self_attn.q_proj.weight` →
//! `blocks.{i}.wq`) and says how the file stores it (`layout = "(h e) d -> d
//! h e"`). `shardc check --map` checks a map against the model (every
//! parameter covered exactly once, every layout fitting its parameter);
//! `run --init --map` reads a checkpoint through it, `export --map` writes one
//! and `run --dump-grads --map` names gradients by it. Without a map, the
//! identity map (the model's own names and layouts) is used.
//!
//! This stage comes after lowering: it reads the SPMD program's parameters
//! (their names, global shapes and whether they are computed buffers).

mod layout;
mod pattern;
pub mod store;

pub use layout::{Layout, LayoutError};
pub use pattern::Pattern;
pub use store::{Store, StoreError, Stored};

use crate::diag::{Code, Diagnostic, Label};
use crate::source::{FileId, Span};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use toml::Spanned;

/// The keys of a map file, with what each means (for the docs and for
/// did-you-mean on a misspelt key).
pub const MAP_KEYS: &[(&str, &str)] = &[
    ("about", "free text: where the checkpoint comes from"),
    (
        "root",
        "the model path the rules' `to` names are under (`lm` for `lm.blocks.0.wq`); default: the model itself",
    ),
    ("tensor", "the rules, one `[[tensor]]` table each, with the keys below"),
];

/// The keys of one `[[tensor]]` rule.
pub const RULE_KEYS: &[(&str, &str)] = &[
    (
        "from",
        "the checkpoint's tensor name, with `{capture}`s for the parts that vary (`model.layers.{i}.mlp.up_proj.weight`); a capture is one or more characters other than `.`",
    ),
    ("to", "the model's parameter name under `root`, with the same captures (`blocks.{i}.w_up`)"),
    (
        "layout",
        "how the file stores the parameter, einops-style `FILE -> PARAMETER`: the right side names the parameter's dimensions in order, the left side may group (`(h e)`) and reorder them; `\"(h e) d -> d h e\"` is an `nn.Linear` weight of an `f32[D, H, E]` parameter. Default: as the model stores it",
    ),
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMap {
    #[serde(default)]
    #[allow(dead_code)]
    about: Option<String>,
    #[serde(default)]
    root: Option<Spanned<String>>,
    #[serde(default)]
    tensor: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    from: Spanned<String>,
    to: Spanned<String>,
    #[serde(default)]
    layout: Option<Spanned<String>>,
}

/// One rule of a map.
#[derive(Clone, Debug)]
pub struct Rule {
    pub from: Pattern,
    pub to: Pattern,
    pub layout: Option<Layout>,
    pub from_span: Span,
    pub to_span: Span,
    pub layout_span: Option<Span>,
}

/// A parsed map file.
#[derive(Clone, Debug)]
pub struct WeightMap {
    pub path: PathBuf,
    pub file: FileId,
    /// `lm.` for `root = "lm"`; empty for the model itself.
    pub prefix: String,
    pub rules: Vec<Rule>,
}

/// What is wrong with a map, as data; [`MapProblem::diagnostic`] says it.
#[derive(Clone, Debug)]
pub enum MapProblem {
    /// TOML that does not parse, or an unknown or missing key.
    Syntax { span: Span, message: String },
    /// A name pattern or a layout that does not parse.
    Value {
        span: Span,
        what: &'static str,
        message: String,
    },
    /// `from` and `to` capture different names.
    Captures {
        span: Span,
        from: Vec<String>,
        to: Vec<String>,
    },
    /// A parameter no rule names.
    NotCovered {
        span: Span,
        params: Vec<String>,
        map: String,
    },
    /// A parameter two rules name.
    Twice {
        span: Span,
        first: Span,
        param: String,
    },
    /// A layout that does not fit the parameter it names.
    Misfit {
        span: Span,
        param: String,
        message: String,
    },
    /// A rule naming no parameter: the closest name, or else the names of
    /// the layer it points into.
    Unused {
        span: Span,
        near: Option<String>,
        siblings: Vec<String>,
    },
}

impl MapProblem {
    pub fn diagnostic(self) -> Diagnostic {
        match self {
            MapProblem::Syntax { span, message } => {
                Diagnostic::new(Code::E0600, format!("invalid weight map: {message}"), Label::new(span, "here"))
                    .help(format!(
                        "a map has `root`, `about` and `[[tensor]]` rules of {}",
                        RULE_KEYS.iter().map(|(k, _)| format!("`{k}`")).collect::<Vec<_>>().join(", ")
                    ))
            }
            MapProblem::Value { span, what, message } => Diagnostic::new(
                Code::E0600,
                format!("invalid {what} in the weight map"),
                Label::new(span, message),
            ),
            MapProblem::Captures { span, from, to } => Diagnostic::new(
                Code::E0600,
                "`from` and `to` capture different names",
                Label::new(span, format!("`from` captures {{{}}}, `to` {{{}}}", from.join(", "), to.join(", "))),
            )
            .help("every `{capture}` of one side must appear on the other, so each tensor names one parameter"),
            MapProblem::NotCovered { span, params, map } => {
                let shown: Vec<String> = params.iter().take(8).map(|p| format!("`{p}`")).collect();
                let more = params.len().saturating_sub(8);
                Diagnostic::new(
                    Code::E0601,
                    format!(
                        "no rule of `{map}` names {}{}",
                        shown.join(", "),
                        if more > 0 { format!(" and {more} more") } else { String::new() }
                    ),
                    Label::new(span, "this parameter would start from its initializer"),
                )
                .help("add a `[[tensor]]` rule whose `to` names it")
            }
            MapProblem::Twice { span, first, param } => Diagnostic::new(
                Code::E0602,
                format!("two rules name the parameter `{param}`"),
                Label::new(span, "this rule names it"),
            )
            .secondary(first, "and so does this one"),
            MapProblem::Misfit { span, param, message } => Diagnostic::new(
                Code::E0603,
                format!("the layout does not fit `{param}`"),
                Label::new(span, message),
            ),
            MapProblem::Unused {
                span,
                near,
                siblings,
            } => {
                let d = Diagnostic::new(
                    Code::W0004,
                    "this rule names no parameter of the model",
                    Label::new(span, "no parameter has this name"),
                );
                match (near, siblings.as_slice()) {
                    (Some(n), _) => d.help(format!("did you mean `{n}`?")),
                    (None, []) => d,
                    (None, s) => d.help(format!(
                        "its layer has {}",
                        s.iter().take(8).map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
                    )),
                }
            }
        }
    }
}

fn span_of(file: FileId, r: std::ops::Range<usize>) -> Span {
    Span::new(file, r.start, r.end)
}

/// Inside a string value's span (which includes its quote), the range of a
/// part of its text.
fn inner(file: FileId, value: std::ops::Range<usize>, part: std::ops::Range<usize>) -> Span {
    let start = (value.start + 1 + part.start).min(value.end);
    let end = (value.start + 1 + part.end).max(start + 1).min(value.end);
    Span::new(file, start, end)
}

/// Parse a map file's text.
pub fn parse(file: FileId, path: &Path, text: &str) -> Result<WeightMap, Vec<MapProblem>> {
    let raw: RawMap = toml::from_str(text).map_err(|e| {
        vec![MapProblem::Syntax {
            span: span_of(file, e.span().unwrap_or(0..0)),
            message: e.message().trim().to_string(),
        }]
    })?;
    let mut problems = Vec::new();
    let mut rules = Vec::new();
    for r in raw.tensor {
        let pat =
            |s: &Spanned<String>, problems: &mut Vec<MapProblem>| match Pattern::parse(s.get_ref())
            {
                Ok(p) => Some(p),
                Err(e) => {
                    problems.push(MapProblem::Value {
                        span: inner(file, s.span(), e.at),
                        what: "tensor name",
                        message: e.message,
                    });
                    None
                }
            };
        let (from, to) = (pat(&r.from, &mut problems), pat(&r.to, &mut problems));
        let layout = match &r.layout {
            None => None,
            Some(l) => match Layout::parse(l.get_ref()) {
                Ok(l) => Some(l),
                Err(e) => {
                    problems.push(MapProblem::Value {
                        span: span_of(file, l.span()),
                        what: "layout",
                        message: e.0,
                    });
                    continue;
                }
            },
        };
        let (Some(from), Some(to)) = (from, to) else {
            continue;
        };
        let set = |p: &Pattern| {
            let mut c: Vec<String> = p.captures().into_iter().map(str::to_string).collect();
            c.sort();
            c.dedup();
            c
        };
        if set(&from) != set(&to) {
            problems.push(MapProblem::Captures {
                span: span_of(file, r.from.span().start..r.to.span().end),
                from: set(&from),
                to: set(&to),
            });
            continue;
        }
        rules.push(Rule {
            from,
            to,
            layout,
            from_span: span_of(file, r.from.span()),
            to_span: span_of(file, r.to.span()),
            layout_span: r.layout.as_ref().map(|l| span_of(file, l.span())),
        });
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    let prefix = raw
        .root
        .map(|r| r.into_inner())
        .filter(|r| !r.is_empty())
        .map_or(String::new(), |r| format!("{}.", r.trim_end_matches('.')));
    Ok(WeightMap {
        path: path.to_path_buf(),
        file,
        prefix,
        rules,
    })
}

/// One parameter's tensor in a checkpoint.
#[derive(Clone, Debug)]
pub struct Binding {
    /// Index into the program's parameters.
    pub param: usize,
    /// The checkpoint's name for it.
    pub source: String,
    /// How the checkpoint lays it out (`None`: as the model does).
    pub layout: Option<Layout>,
    /// The shape the checkpoint stores.
    pub file_shape: Vec<usize>,
    /// A computed buffer (RoPE tables): recomputed when the file lacks it.
    pub optional: bool,
}

impl Binding {
    /// The checkpoint's values as the parameter's.
    pub fn to_param(&self, data: Vec<f64>, shape: &[usize]) -> Result<Vec<f64>, LayoutError> {
        match &self.layout {
            None => Ok(data),
            Some(l) => l.to_param(&data, shape),
        }
    }

    /// The parameter's values as the checkpoint stores them.
    pub fn to_file(&self, data: Vec<f64>, shape: &[usize]) -> Result<Vec<f64>, LayoutError> {
        match &self.layout {
            None => Ok(data),
            Some(l) => l.to_file(&data, shape),
        }
    }
}

/// A map bound to a program: each parameter's tensor (computed buffers no
/// rule names are left out: they are recomputed).
#[derive(Clone, Debug, Default)]
pub struct Bound {
    pub bindings: Vec<Binding>,
}

fn computed(p: &crate::spmd::Param) -> bool {
    matches!(p.init, crate::init::Init::Computed(_))
}

/// Every parameter under its own name and layout.
pub fn identity(prog: &crate::spmd::Program) -> Bound {
    Bound {
        bindings: prog
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| Binding {
                param: i,
                source: p.name.clone(),
                layout: None,
                file_shape: p.stored.known_shape(),
                optional: computed(p),
            })
            .collect(),
    }
}

/// Bind a map to a program: every parameter (but computed buffers) named by
/// exactly one rule, each layout fitting its parameter, every rule naming
/// something.
pub fn bind(map: &WeightMap, prog: &crate::spmd::Program) -> (Bound, Vec<MapProblem>) {
    let mut problems = Vec::new();
    let mut bound = Bound::default();
    let mut used = vec![false; map.rules.len()];
    let mut uncovered: Vec<(Span, Vec<String>)> = Vec::new();
    for (i, p) in prog.params.iter().enumerate() {
        let local = p.name.strip_prefix(map.prefix.as_str());
        let hits: Vec<(usize, pattern::Captures)> = local
            .map(|l| {
                map.rules
                    .iter()
                    .enumerate()
                    .filter_map(|(r, rule)| rule.to.matches(l).map(|c| (r, c)))
                    .collect()
            })
            .unwrap_or_default();
        let Some((r, caps)) = hits.first() else {
            if !computed(p) {
                match uncovered.iter_mut().find(|(s, _)| *s == p.span) {
                    Some((_, names)) => names.push(p.name.clone()),
                    None => uncovered.push((p.span, vec![p.name.clone()])),
                }
            }
            continue;
        };
        for (r, _) in &hits {
            used[*r] = true;
        }
        let rule = &map.rules[*r];
        if let Some((second, _)) = hits.get(1) {
            problems.push(MapProblem::Twice {
                span: map.rules[*second].to_span,
                first: rule.to_span,
                param: p.name.clone(),
            });
            continue;
        }
        let shape = p.stored.known_shape();
        let file_shape = match &rule.layout {
            None => shape.clone(),
            Some(l) => match l.file_shape(&shape) {
                Ok(s) => s,
                Err(e) => {
                    problems.push(MapProblem::Misfit {
                        span: rule.layout_span.unwrap_or(rule.to_span),
                        param: p.name.clone(),
                        message: e.0,
                    });
                    continue;
                }
            },
        };
        let Some(source) = rule.from.substitute(caps) else {
            continue;
        };
        bound.bindings.push(Binding {
            param: i,
            source,
            layout: rule.layout.clone(),
            file_shape,
            optional: computed(p),
        });
    }
    let file_name = map.path.file_name().map_or_else(
        || map.path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    for (span, params) in uncovered {
        problems.push(MapProblem::NotCovered {
            span,
            params,
            map: file_name.clone(),
        });
    }
    let locals: Vec<String> = prog
        .params
        .iter()
        .filter_map(|p| p.name.strip_prefix(map.prefix.as_str()).map(str::to_string))
        .collect();
    for (r, rule) in map.rules.iter().enumerate() {
        if !used[r] {
            // Within the layer the rule points into first (`a.bias` is more
            // likely `a.b` than `ln.bias`), then anywhere.
            let example = rule.to.example();
            let parent = example.rsplit_once('.').map(|(p, _)| format!("{p}."));
            let siblings: Vec<&str> = locals
                .iter()
                .map(String::as_str)
                .filter(|l| {
                    parent.as_ref().is_some_and(|p| {
                        l.strip_prefix(p.as_str()).is_some_and(|r| !r.contains('.'))
                    })
                })
                .collect();
            let near = if siblings.is_empty() {
                crate::diag::did_you_mean(&example, locals.iter().map(String::as_str))
            } else {
                crate::diag::did_you_mean(&example, siblings.iter().copied())
            };
            problems.push(MapProblem::Unused {
                span: rule.to_span,
                near: near.map(|n| rule.to.generalise(&n)),
                siblings: siblings.iter().map(|s| rule.to.generalise(s)).collect(),
            });
        }
    }
    (bound, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The keys serde accepts are the registry's (its "expected one of" list).
    #[test]
    fn the_parsed_keys_are_the_registrys() {
        let expect = |keys: &[(&str, &str)]| {
            keys.iter()
                .map(|(k, _)| format!("`{k}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let problem = |text: &str| match parse(FileId(0), Path::new("m.toml"), text) {
            Err(p) => match &p[0] {
                MapProblem::Syntax { message, .. } => message.clone(),
                other => format!("{other:?}"),
            },
            Ok(_) => String::new(),
        };
        let m = problem("nope = 1\n");
        assert!(m.ends_with(&expect(MAP_KEYS)), "{m}");
        let r = problem("[[tensor]]\nfrom = \"a\"\nto = \"b\"\nnope = 1\n");
        assert!(r.ends_with(&expect(RULE_KEYS)), "{r}");
    }
}
