//! Diagnostics are data: stages produce [`Problem`]s, which become [`Diagnostic`]s
//! here; `render` is the only place that turns them into text.

mod codes;
mod problem;
pub mod render;

pub use codes::Code;
pub use problem::{ComputedInitProblem, LossFnProblem, Problem};

use crate::source::Span;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
    /// Information the user asked for or should know (an inserted collective).
    Note,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub span: Span,
    pub text: String,
}

impl Label {
    pub fn new(span: Span, text: impl Into<String>) -> Label {
        Label {
            span,
            text: text.into(),
        }
    }
}

/// A suggested edit: replace `span` with `replacement`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fix {
    pub span: Span,
    pub replacement: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub code: Code,
    pub severity: Severity,
    pub message: String,
    pub primary: Label,
    pub secondary: Vec<Label>,
    pub notes: Vec<String>,
    pub help: Option<String>,
    pub fix: Option<Fix>,
    /// How the offending value got its type: one label per binding on the way,
    /// drawn as a multi-line shape-flow trace.
    pub trace: Vec<Label>,
}

impl Diagnostic {
    pub fn new(code: Code, message: impl Into<String>, primary: Label) -> Diagnostic {
        Diagnostic {
            severity: code.severity(),
            code,
            message: message.into(),
            primary,
            secondary: vec![],
            notes: vec![],
            help: None,
            fix: None,
            trace: vec![],
        }
    }
    pub fn secondary(mut self, span: Span, text: impl Into<String>) -> Self {
        self.secondary.push(Label::new(span, text));
        self
    }
    pub fn note(mut self, text: impl Into<String>) -> Self {
        self.notes.push(text.into());
        self
    }
    pub fn help(mut self, text: impl Into<String>) -> Self {
        self.help = Some(text.into());
        self
    }
    pub fn fix(mut self, span: Span, replacement: impl Into<String>) -> Self {
        self.fix = Some(Fix {
            span,
            replacement: replacement.into(),
        });
        self
    }
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Closest candidate by edit distance, for "did you mean" help.
/// Names longer than this get no "did you mean" (and are never suggested).
pub const MAX_SUGGEST_LEN: usize = 64;

pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    // Names this long are not typos of anything; the distance is quadratic.
    if name.len() > MAX_SUGGEST_LEN {
        return None;
    }
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        let limit = (name.len().max(c.len()) / 3).max(1);
        // The distance is at least the difference in length: skip without computing.
        if c.len() > MAX_SUGGEST_LEN || name.len().abs_diff(c.len()) > limit {
            continue;
        }
        let d = edit_distance(name, c);
        if d <= limit && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c.to_string())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut cur = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
        }
        prev = cur;
    }
    prev[b.len()]
}
