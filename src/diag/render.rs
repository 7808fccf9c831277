//! The one place diagnostics become text: miette for the report, ariadne for the
//! multi-line shape-flow trace, serde for `--format json`.

use super::{Diagnostic, Severity};
use crate::source::{SourceMap, Span};
use miette::{GraphicalReportHandler, GraphicalTheme, LabeledSpan, NamedSource, SourceSpan};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Style {
    /// Colour (for a terminal).
    Color,
    /// No colour, fixed width: stable output for pipes and golden files.
    Plain,
}

struct MietteView {
    message: String,
    code: String,
    severity: miette::Severity,
    help: Option<String>,
    source: NamedSource<String>,
    labels: Vec<LabeledSpan>,
    related: Vec<MietteView>,
}

impl fmt::Debug for MietteView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}
impl fmt::Display for MietteView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.message)
    }
}
impl std::error::Error for MietteView {}

impl miette::Diagnostic for MietteView {
    fn code<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        (!self.code.is_empty()).then(|| Box::new(&self.code) as Box<dyn fmt::Display>)
    }
    fn severity(&self) -> Option<miette::Severity> {
        Some(self.severity)
    }
    fn help<'a>(&'a self) -> Option<Box<dyn fmt::Display + 'a>> {
        self.help
            .as_ref()
            .map(|h| Box::new(h) as Box<dyn fmt::Display>)
    }
    fn source_code(&self) -> Option<&dyn miette::SourceCode> {
        Some(&self.source)
    }
    fn labels(&self) -> Option<Box<dyn Iterator<Item = LabeledSpan> + '_>> {
        Some(Box::new(self.labels.iter().cloned()))
    }
    fn related<'a>(&'a self) -> Option<Box<dyn Iterator<Item = &'a dyn miette::Diagnostic> + 'a>> {
        if self.related.is_empty() {
            return None;
        }
        Some(Box::new(
            self.related.iter().map(|r| r as &dyn miette::Diagnostic),
        ))
    }
}

fn sspan(s: Span) -> SourceSpan {
    SourceSpan::new((s.start as usize).into(), (s.end - s.start) as usize)
}

fn view(d: &Diagnostic, sources: &SourceMap) -> MietteView {
    let file = sources.get(d.primary.span.file);
    let mut labels = vec![LabeledSpan::new_primary_with_span(
        Some(d.primary.text.clone()),
        sspan(d.primary.span),
    )];
    let mut related = Vec::new();
    for l in &d.secondary {
        if l.span.file == d.primary.span.file {
            labels.push(LabeledSpan::new_with_span(
                Some(l.text.clone()),
                sspan(l.span),
            ));
        } else {
            let f = sources.get(l.span.file);
            related.push(MietteView {
                message: l.text.clone(),
                code: String::new(),
                severity: miette::Severity::Advice,
                help: None,
                source: NamedSource::new(f.name.clone(), f.text.clone()),
                labels: vec![LabeledSpan::new_primary_with_span(None, sspan(l.span))],
                related: vec![],
            });
        }
    }
    let mut help = d.help.clone().map(|h| vec![h]).unwrap_or_default();
    if let Some(fix) = &d.fix {
        let old = sources.get(fix.span.file).snippet(fix.span);
        help.push(if fix.replacement.is_empty() {
            format!("suggested fix: remove `{old}`")
        } else {
            format!("suggested fix: replace `{old}` with `{}`", fix.replacement)
        });
    }
    MietteView {
        message: d.message.clone(),
        code: d.code.as_str().to_string(),
        severity: match d.severity {
            Severity::Error => miette::Severity::Error,
            Severity::Warning => miette::Severity::Warning,
            Severity::Note => miette::Severity::Advice,
        },
        help: (!help.is_empty()).then(|| help.join("\n")),
        source: NamedSource::new(file.name.clone(), file.text.clone()),
        labels,
        related,
    }
}

/// Lines longer than this are not quoted: the report names the place instead
/// (a snippet would be unreadable, and the renderers' column arithmetic is
/// bounded).
pub const MAX_QUOTED_LINE: usize = 1_000;

/// Whether every place the diagnostic points at can be shown as a snippet: in a
/// `.shard` file (the contents of any other file the model named are never
/// echoed), on a line of reasonable length.
fn quotable(d: &Diagnostic, sources: &SourceMap) -> bool {
    let spans = std::iter::once(&d.primary)
        .chain(&d.secondary)
        .chain(&d.trace)
        .map(|l| l.span);
    spans.into_iter().all(|s| {
        let f = sources.get(s.file);
        let text = &f.text;
        let (start, end) = (s.start as usize, s.end as usize);
        let line_start = text
            .get(..start.min(text.len()))
            .map_or(0, |t| t.rfind('\n').map_or(0, |i| i + 1));
        let line_end = text
            .get(end.min(text.len())..)
            .map_or(text.len(), |t| t.find('\n').map_or(text.len(), |i| end + i));
        (f.name.ends_with(".shard") || f.name.ends_with(".toml"))
            && line_end.saturating_sub(line_start) <= MAX_QUOTED_LINE
    })
}

/// The report without snippets: message, place, labels and help as text.
fn compact(d: &Diagnostic, sources: &SourceMap) -> String {
    let mut out = format!(
        "{}[{}]: {}\n  --> {}: {}\n",
        d.severity_word(),
        d.code.as_str(),
        d.message,
        sources.describe(d.primary.span),
        d.primary.text
    );
    for l in &d.secondary {
        out.push_str(&format!("  --> {}: {}\n", sources.describe(l.span), l.text));
    }
    if let Some(h) = &d.help {
        out.push_str(&format!("  help: {h}\n"));
    }
    out.push('\n');
    out
}

/// One line per diagnostic, `file:line:col: severity[CODE]: message (label)`,
/// as rustc's `--error-format short` and GCC write them: what Vim's `:make`
/// (`errorformat`), Emacs's compilation mode and CI problem matchers read.
/// Columns count characters from 1; a line break in the text becomes a space.
pub fn short(d: &Diagnostic, sources: &SourceMap) -> String {
    let one_line = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut out = format!(
        "{}: {}[{}]: {}",
        sources.describe(d.primary.span),
        d.severity_word(),
        d.code.as_str(),
        one_line(&d.message)
    );
    let label = one_line(&d.primary.text);
    if !label.is_empty() && label != one_line(&d.message) {
        out.push_str(&format!(" ({label})"));
    }
    out.push('\n');
    out
}

/// A note (an inserted collective, a layout the checker chose) for people,
/// in a few lines: the message, the op's line with its label, and each other
/// place (where the layer was instantiated) named on one line. A clean
/// file's notes are context, not a wall of source.
fn note(d: &Diagnostic, sources: &SourceMap, style: Style) -> String {
    let (bold, cyan, reset) = match style {
        Style::Color => ("\x1b[1m", "\x1b[36m", "\x1b[0m"),
        Style::Plain => ("", "", ""),
    };
    let file = sources.get(d.primary.span.file);
    let (line, col) = file.line_col(d.primary.span.start as usize);
    let text = file.text.lines().nth(line - 1).unwrap_or_default();
    // The span's part of this line, in characters.
    let width = file
        .text
        .get(d.primary.span.start as usize..d.primary.span.end as usize)
        .map_or(1, |s| s.lines().next().unwrap_or_default().chars().count())
        .max(1);
    let num = line.to_string();
    let pad = " ".repeat(num.len());
    let lead: String = text
        .chars()
        .take(col - 1)
        .map(|c| if c == '\t' { '\t' } else { ' ' })
        .collect();
    let mut out = format!(
        "{bold}{}{reset} {cyan}☞{reset} {}\n",
        d.code.as_str(),
        d.message.replace('\n', &format!("\n{pad}   "))
    );
    out.push_str(&format!(
        " {pad} ╭─[{}]\n",
        sources.describe(d.primary.span)
    ));
    out.push_str(&format!(" {num} │ {text}\n"));
    let mark = "─".repeat(width);
    out.push_str(&format!(
        " {pad} · {lead}{cyan}{mark}{reset} {}\n",
        d.primary.text
    ));
    let places: Vec<String> = d
        .secondary
        .iter()
        .map(|l| format!("{}: {}", l.text, sources.describe(l.span)))
        .chain(d.notes.iter().map(|n| format!("note: {n}")))
        .collect();
    for (i, p) in places.iter().enumerate() {
        let corner = if i + 1 == places.len() {
            "╰─"
        } else {
            "├─"
        };
        out.push_str(&format!(" {pad} {corner} {p}\n"));
    }
    if places.is_empty() {
        out.push_str(&format!(" {pad} ╰─\n"));
    }
    if let Some(h) = &d.help {
        out.push_str(&format!("  help: {h}\n"));
    }
    out.push('\n');
    out
}

/// Render one diagnostic for people.
pub fn human(d: &Diagnostic, sources: &SourceMap, style: Style) -> String {
    if d.severity == Severity::Note && d.trace.is_empty() && d.fix.is_none() && quotable(d, sources)
    {
        return note(d, sources, style);
    }
    if !quotable(d, sources) {
        let mut out = compact(d, sources);
        for n in &d.notes {
            out.push_str(&format!("  note: {n}\n"));
        }
        return out;
    }
    let theme = match style {
        Style::Color => GraphicalTheme::unicode(),
        Style::Plain => GraphicalTheme::unicode_nocolor(),
    };
    let handler = GraphicalReportHandler::new_themed(theme)
        .with_width(100)
        .with_links(false);
    let mut out = String::new();
    if handler.render_report(&mut out, &view(d, sources)).is_err() {
        out = format!(
            "{}[{}]: {}\n",
            d.severity_word(),
            d.code.as_str(),
            d.message
        );
    }
    if !d.notes.is_empty() {
        while out.ends_with("\n\n") {
            out.pop();
        }
        for n in &d.notes {
            out.push_str(&format!("  note: {n}\n"));
        }
        out.push('\n');
    }
    if !d.trace.is_empty() {
        out.push_str(&trace(d, sources, style));
    }
    out
}

/// The shape-flow trace: each binding that led to the offending value, with its
/// type, in source order (ariadne draws labels across lines well).
pub fn trace(d: &Diagnostic, sources: &SourceMap, style: Style) -> String {
    use ariadne::{Config, IndexType, Label, Report, ReportKind};
    let file = d.primary.span.file;
    let name = sources.get(file).name.clone();
    let text = sources.get(file).text.clone();
    let labels: Vec<_> = d.trace.iter().filter(|l| l.span.file == file).collect();
    if labels.is_empty() {
        return String::new();
    }
    let first = labels[0].span;
    let mut rep = Report::build(
        ReportKind::Custom("shape flow", ariadne::Color::Cyan),
        (name.clone(), first.range()),
    )
    .with_config(
        Config::default()
            .with_color(style == Style::Color)
            .with_index_type(IndexType::Byte),
    )
    .with_message(format!(
        "how the operands of {} got their types",
        d.code.as_str()
    ));
    for (i, l) in labels.iter().enumerate() {
        rep = rep.with_label(
            Label::new((name.clone(), l.span.range()))
                .with_message(&l.text)
                .with_order(i as i32),
        );
    }
    rep = rep.with_label(
        Label::new((name.clone(), d.primary.span.range()))
            .with_message(format!("{} here", d.code.as_str()))
            .with_order(labels.len() as i32),
    );
    let mut buf = Vec::new();
    if rep
        .finish()
        .write(ariadne::sources(vec![(name, text)]), &mut buf)
        .is_err()
    {
        return String::new();
    }
    let s = String::from_utf8_lossy(&buf).into_owned();
    // ariadne colours a custom report kind even with colour off.
    if style == Style::Plain {
        strip_ansi(&s)
    } else {
        s
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for n in chars.by_ref() {
                if n.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

impl Diagnostic {
    fn severity_word(&self) -> &'static str {
        match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        }
    }
}

#[derive(serde::Serialize)]
struct JsonSpan {
    file: String,
    line: usize,
    column: usize,
    end_line: usize,
    end_column: usize,
    byte_start: u32,
    byte_end: u32,
    label: String,
}

#[derive(serde::Serialize)]
struct JsonDiag {
    code: &'static str,
    severity: Severity,
    message: String,
    primary: JsonSpan,
    secondary: Vec<JsonSpan>,
    notes: Vec<String>,
    help: Option<String>,
    fix: Option<JsonFix>,
    trace: Vec<JsonSpan>,
}

#[derive(serde::Serialize)]
struct JsonFix {
    span: JsonSpan,
    replacement: String,
}

fn jspan(s: Span, label: &str, sources: &SourceMap) -> JsonSpan {
    let f = sources.get(s.file);
    let (line, column) = f.line_col(s.start as usize);
    let (end_line, end_column) = f.line_col(s.end as usize);
    JsonSpan {
        file: f.name.clone(),
        line,
        column,
        end_line,
        end_column,
        byte_start: s.start,
        byte_end: s.end,
        label: label.to_string(),
    }
}

/// Machine-readable form, one JSON object per diagnostic.
pub fn json(d: &Diagnostic, sources: &SourceMap) -> serde_json::Value {
    let j = JsonDiag {
        code: d.code.as_str(),
        severity: d.severity,
        message: d.message.clone(),
        primary: jspan(d.primary.span, &d.primary.text, sources),
        secondary: d
            .secondary
            .iter()
            .map(|l| jspan(l.span, &l.text, sources))
            .collect(),
        notes: d.notes.clone(),
        help: d.help.clone(),
        fix: d.fix.as_ref().map(|f| JsonFix {
            span: jspan(f.span, "", sources),
            replacement: f.replacement.clone(),
        }),
        trace: d
            .trace
            .iter()
            .map(|l| jspan(l.span, &l.text, sources))
            .collect(),
    };
    serde_json::to_value(j).unwrap_or(serde_json::Value::Null)
}
