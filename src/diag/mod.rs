//! Diagnostics are data: stages produce [`Problem`]s, which become [`Diagnostic`]s
//! here; `render` is the only place that turns them into text.

mod codes;
mod problem;
pub mod render;
mod schedule;

pub use codes::{Code, NO_FIX};
pub use problem::{ComputedInitProblem, LossFnProblem, Problem, TotalProblem};
pub use schedule::{ScheduleFileProblem, ScheduleProblem};

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
    /// Other replacements as close to what was written (a typo as near two
    /// names): the compile tries each and keeps the one whose file checks
    /// with the fewest errors (`world::compile_text`).
    pub also: Vec<String>,
    /// A fix made from what is written: the compile fills in `replacement`
    /// from the source ([`Diagnostic::settle_fix`]), so every reader sees a
    /// plain edit.
    pub settle: Option<Settle>,
}

/// How a fix's replacement is made from the text at its span.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Settle {
    /// Wrap it (`psum(x @ w, mp)`): the text put before and after.
    Wrap(String, String),
    /// A written dimension (`D@mp`, `4 * D@(dp, mp)`) without this axis.
    DropAxis(String),
    /// A written type without its pending reductions: the text through `]`.
    DropPending,
}

impl Settle {
    /// The replacement for `text`; `None` when `text` is not what the
    /// settling expects (the fix is then withdrawn, not guessed).
    fn apply(&self, text: &str) -> Option<String> {
        match self {
            Settle::Wrap(before, after) => Some(format!("{before}{text}{after}")),
            Settle::DropAxis(axis) => {
                let at = text.rfind('@')?;
                let size = text[..at].trim_end();
                let group = text[at + 1..].trim();
                let group = group
                    .strip_prefix('(')
                    .and_then(|g| g.strip_suffix(')'))
                    .unwrap_or(group);
                let all: Vec<&str> = group.split(',').map(str::trim).collect();
                if !all.contains(&axis.as_str()) || size.is_empty() {
                    return None;
                }
                let rest: Vec<&str> = all.into_iter().filter(|a| *a != axis).collect();
                Some(match rest.as_slice() {
                    [] => size.to_string(),
                    [one] => format!("{size}@{one}"),
                    more => format!("{size}@({})", more.join(", ")),
                })
            }
            Settle::DropPending => {
                let end = text.rfind(']')?;
                text[end + 1..]
                    .trim_start()
                    .starts_with("partial")
                    .then(|| text[..=end].to_string())
            }
        }
    }
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
            also: Vec::new(),
            settle: None,
        });
        self
    }
    /// A fix made from the text at `span` once the source is at hand.
    pub fn settled(mut self, span: Span, how: Settle) -> Self {
        self.fix = Some(Fix {
            span,
            replacement: String::new(),
            also: Vec::new(),
            settle: Some(how),
        });
        self
    }
    /// A fix that wraps the text at `span` in `before` … `after`.
    pub fn wrap(self, span: Span, before: impl Into<String>, after: impl Into<String>) -> Self {
        self.settled(span, Settle::Wrap(before.into(), after.into()))
    }
    /// Fills in a settled fix's replacement from the source text, or
    /// withdraws the fix when the text is not what it expects.
    pub fn settle_fix(&mut self, sources: &crate::source::SourceMap) {
        let Some(fix) = self.fix.as_mut() else { return };
        let Some(how) = fix.settle.take() else { return };
        match how.apply(sources.get(fix.span.file).snippet(fix.span)) {
            Some(r) => fix.replacement = r,
            None => self.fix = None,
        }
    }
    /// A fix with several equally close replacements (see [`Fix::also`]).
    pub fn fix_among(mut self, span: Span, mut choices: Vec<String>) -> Self {
        if choices.is_empty() {
            return self;
        }
        let first = choices.remove(0);
        self.fix = Some(Fix {
            span,
            replacement: first,
            also: choices,
            settle: None,
        });
        self
    }
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Names longer than this get no "did you mean" (and are never suggested).
pub const MAX_SUGGEST_LEN: usize = 64;

/// Closest candidate by edit distance, for "did you mean" help.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<String> {
    did_you_mean_all(name, candidates).into_iter().next()
}

/// Every candidate at the smallest edit distance (within the limit), in the
/// order given: a typo may be as near two names (`mp` to `dp` and `tp`).
pub fn did_you_mean_all<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    // Names this long are not typos of anything; the distance is quadratic.
    if name.len() > MAX_SUGGEST_LEN {
        return Vec::new();
    }
    let mut best: Option<usize> = None;
    let mut all: Vec<&str> = Vec::new();
    for c in candidates {
        let limit = (name.len().max(c.len()) / 3).max(1);
        // The distance is at least the difference in length: skip without computing.
        if c.len() > MAX_SUGGEST_LEN || name.len().abs_diff(c.len()) > limit {
            continue;
        }
        let d = edit_distance(name, c);
        if d > limit || best.is_some_and(|b| d > b) {
            continue;
        }
        if best.is_none_or(|b| d < b) {
            best = Some(d);
            all.clear();
        }
        if !all.contains(&c) {
            all.push(c);
        }
    }
    all.into_iter().map(str::to_string).collect()
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

#[cfg(test)]
mod tests {
    use super::Settle;

    #[test]
    fn settled_fixes_edit_the_written_text_or_withdraw() {
        let drop = |axis: &str, text: &str| Settle::DropAxis(axis.into()).apply(text);
        assert_eq!(drop("mp", "D@mp").as_deref(), Some("D"));
        assert_eq!(drop("mp", "4 * D @ mp").as_deref(), Some("4 * D"));
        assert_eq!(drop("mp", "D@(dp, mp)").as_deref(), Some("D@dp"));
        assert_eq!(drop("tp", "D@(dp, tp, sp)").as_deref(), Some("D@(dp, sp)"));
        // Not a dimension with that axis: no fix rather than a guess.
        assert_eq!(drop("mp", "D@dp"), None);
        assert_eq!(drop("mp", "x + y"), None);
        assert_eq!(drop("mp", "@mp"), None);
        let pending = |text: &str| Settle::DropPending.apply(text);
        assert_eq!(
            pending("f32[D, D] partial(mp)").as_deref(),
            Some("f32[D, D]")
        );
        assert_eq!(pending("f32[D, D]"), None);
        let wrap = Settle::Wrap("psum(".into(), ", mp)".into());
        assert_eq!(wrap.apply("h @ w").as_deref(), Some("psum(h @ w, mp)"));
    }
}
