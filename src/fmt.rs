//! `shardc fmt`: a whitespace-only formatter. It re-indents by nesting (two
//! spaces a level; a continuation line inside `(` or `[` may stay deeper, as
//! aligned), puts a space after `,` and `:` (not between a slice's bounds) and
//! around `=` `->` and braces, and none inside `()` `[]` or before `,`, trims
//! trailing space and runs of blank lines, and leaves every token, every line
//! break and every comment where it was; other gaps stay as written, so aligned
//! columns survive. Since only whitespace inside a line changes, and the grammar
//! reads whitespace inside a line the same way everywhere (a call's `(` only has
//! to be on its callee's line), the program means what it meant; `tests/fmt.rs`
//! checks that on every `.shard` file here, and `tests/fuzz.rs` on random input.
//!
//! Line endings stay as the first line ends: a CRLF file stays CRLF, every
//! other becomes `\n`; a source with a carriage return that does not end a line
//! is left as it is. Spacing around `+ - * / @` is kept as written, since
//! `4*D@mp` in a type and `x @ w` in a body are both idiomatic. A line that
//! continues an expression (it starts with one of `+ - * / @`, or the line
//! before ends with one or with `=`) sits at least a level deeper than the
//! statement it continues, deeper still if written so. Brackets opened on a
//! line that first closes an earlier line's bracket (`y: f32[D]) -> f32[D] {`
//! after a wrapped signature) nest from the line that opened it.

/// One token of a line.
#[derive(Debug, Clone, PartialEq)]
struct Tok<'a> {
    text: &'a str,
    /// Whitespace before it on its line, as written.
    gap: usize,
    /// A comment's column (in characters) in the source line, to keep trailing
    /// comments aligned; 0 for other tokens.
    col: usize,
    kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Word,
    Open,
    Close,
    Punct,
    /// `// ...` to the end of the line, or a `/* ... */` that ends on this line.
    Comment,
}

/// The lines of a source, each either code (tokens) or verbatim text.
enum Line<'a> {
    Code(Vec<Tok<'a>>),
    /// A line in or starting a block comment that spans lines, kept as written;
    /// the tokens are the code on it outside the comment, which still opens and
    /// closes brackets.
    Verbatim(&'a str, Vec<Tok<'a>>),
}

fn split(src: &str) -> Vec<Line<'_>> {
    let mut lines = Vec::new();
    let mut in_block = false;
    for line in src.lines() {
        if in_block {
            // A block comment that began on an earlier line: copy until it closes.
            let mut toks = Vec::new();
            if let Some(end) = line.find("*/") {
                let (rest, open) = lex_line(&line[end + 2..]);
                toks = rest;
                in_block = open;
            }
            lines.push(Line::Verbatim(line.trim_end(), toks));
            continue;
        }
        let (toks, open) = lex_line(line);
        in_block = open;
        if open {
            lines.push(Line::Verbatim(line.trim_end(), toks));
        } else {
            lines.push(Line::Code(toks));
        }
    }
    lines
}

/// Tokens of one line; true if a `/*` on it does not close on it.
fn lex_line(line: &str) -> (Vec<Tok<'_>>, bool) {
    let b = line.as_bytes();
    let mut toks = Vec::new();
    let mut i = 0;
    let mut gap = 0;
    while i < b.len() {
        let c = b[i];
        if c == b' ' || c == b'\t' {
            gap += 1;
            i += 1;
            continue;
        }
        let start = i;
        let kind = if line[i..].starts_with("//") {
            // Up to the end of the line, less its trailing space.
            i = start + line[start..].trim_end().len();
            Kind::Comment
        } else if line[i..].starts_with("/*") {
            match line[i + 2..].find("*/") {
                Some(e) => {
                    i += 2 + e + 2;
                    Kind::Comment
                }
                None => return (toks, true),
            }
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += 1;
            }
            i = (i + 1).min(b.len());
            Kind::Word
        } else if c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80 {
            // Words and numbers (`1e-5`, `0.02`, `1_000`): a sign right after a
            // number's exponent belongs to the number.
            let number = c.is_ascii_digit();
            i += 1;
            while i < b.len() {
                let d = b[i];
                let next_digit = b.get(i + 1).is_some_and(u8::is_ascii_digit);
                let exp_sign = number
                    && (d == b'+' || d == b'-')
                    && matches!(b[i - 1], b'e' | b'E')
                    && next_digit;
                let dot = number && d == b'.' && next_digit;
                if d.is_ascii_alphanumeric() || d == b'_' || d >= 0x80 || exp_sign || dot {
                    i += 1;
                } else {
                    break;
                }
            }
            Kind::Word
        } else if line[i..].starts_with("->") {
            i += 2;
            Kind::Punct
        } else if line[i..].starts_with("...") {
            i += 3;
            Kind::Punct
        } else {
            i += 1;
            match c {
                b'(' | b'[' | b'{' => Kind::Open,
                b')' | b']' | b'}' => Kind::Close,
                _ => Kind::Punct,
            }
        };
        while !line.is_char_boundary(i) {
            i += 1;
        }
        toks.push(Tok {
            text: &line[start..i],
            gap,
            // Only a comment's column is used; counting is per line, so keep it there.
            col: if kind == Kind::Comment {
                line[..start].chars().count()
            } else {
                0
            },
            kind,
        });
        gap = 0;
    }
    (toks, false)
}

/// Spaces between `a` and `b` in the output. Where the style has no rule, the
/// gap stays as written, so hand-aligned columns (`up   = Dense(...)`,
/// `b    : f32[D]`) survive.
fn spaces_between(a: &Tok, b: &Tok, innermost: Option<u8>) -> usize {
    match (a.text, b.text) {
        ("{", "}") => 0,
        // `key: value`, `x: f32[..]`; but a slice's bounds (`x[0:4]`) as written.
        (":", _) if innermost != Some(b'[') => b.gap.max(1),
        (_, "," | ";") => 0,
        ("(" | "[", _) => 0,
        (_, ")" | "]") => 0,
        ("," | "=" | "->" | "{", _) | (_, "=" | "->" | "{" | "}") => b.gap.max(1),
        _ => b.gap,
    }
}

/// The binary operators; a line that starts or ends with one continues an
/// expression.
const BINARY: [&str; 5] = ["+", "-", "*", "/", "@"];

/// The formatted source (ends with one newline unless it is empty).
pub fn format(src: &str) -> String {
    const INDENT: usize = 2;
    // A carriage return that does not end a line (old Mac line endings, or one
    // inside a string) breaks lines for the grammar but not for `str::lines`:
    // such a source is returned as it is rather than risk joining its lines.
    let b = src.as_bytes();
    if b.iter()
        .enumerate()
        .any(|(i, c)| *c == b'\r' && b.get(i + 1) != Some(&b'\n'))
    {
        return src.to_string();
    }
    let newline = match src.find('\n') {
        Some(i) if i > 0 && b[i - 1] == b'\r' => "\r\n",
        _ => "\n",
    };
    let mut out = String::new();
    // The last token of the previous code line, for continuations.
    let mut last: Option<(&str, Kind)> = None;
    // Each unclosed opener remembers the indent level of the line that opened it
    // and which bracket it was; the lines inside it sit one level deeper.
    let mut stack: Vec<(usize, u8)> = Vec::new();
    let mut blank_run = 0usize;
    let mut started = false;
    for line in split(src) {
        let toks = match &line {
            Line::Code(t) if t.is_empty() => {
                blank_run += 1;
                continue;
            }
            Line::Code(t) | Line::Verbatim(_, t) => t,
        };
        if started && blank_run > 0 {
            out.push_str(newline);
        }
        blank_run = 0;
        started = true;
        let mut this = stack.last().map_or(0, |l| l.0 + 1);
        match &line {
            Line::Verbatim(text, _) => out.push_str(text),
            Line::Code(_) => {
                let closers = toks.iter().take_while(|t| t.kind == Kind::Close).count();
                if closers > 0 {
                    // A line that starts by closing goes back to its opener's level.
                    this = stack
                        .get(stack.len().saturating_sub(closers))
                        .map_or(0, |l| l.0);
                }
                let line_start = out.len();
                let continuation = closers == 0 && stack.last().is_some_and(|l| l.1 != b'{');
                // An expression broken over lines, outside `(` and `[`.
                let operator = |t: &str, k: Kind| k == Kind::Punct && BINARY.contains(&t);
                let continues = closers == 0
                    && !continuation
                    && (toks.first().is_some_and(|t| operator(t.text, t.kind))
                        || last.is_some_and(|(t, k)| {
                            operator(t, k) || (k == Kind::Punct && t == "=")
                        }));
                let indent = match toks.first() {
                    // Inside `(` or `[` a deeper, aligned continuation stays put.
                    Some(t) if continuation && t.gap > this * INDENT => t.gap,
                    Some(t) if continues => t.gap.max((this + 1) * INDENT),
                    _ => this * INDENT,
                };
                out.extend(std::iter::repeat_n(' ', indent));
                let mut prev: Option<&Tok> = None;
                // The brackets open at each token, for the `:` rule.
                let mut open: Vec<u8> = stack.iter().map(|l| l.1).collect();
                for t in toks {
                    if let Some(p) = prev {
                        let n = if t.kind == Kind::Comment {
                            // A trailing comment keeps its column, moved with the
                            // line's indentation, when the code before it still
                            // fits: comments aligned over several lines stay so.
                            let width = out[line_start..].chars().count();
                            let old_indent = toks.first().map_or(0, |f| f.gap);
                            (t.col + indent).saturating_sub(old_indent + width).max(1)
                        } else {
                            spaces_between(p, t, open.last().copied())
                        };
                        out.extend(std::iter::repeat_n(' ', n));
                    }
                    out.push_str(t.text);
                    match t.kind {
                        Kind::Open => open.push(t.text.bytes().next().unwrap_or(b'(')),
                        Kind::Close => {
                            open.pop();
                        }
                        _ => {}
                    }
                    prev = Some(t);
                }
            }
        }
        // Brackets opened after closing one an earlier line opened (a wrapped
        // signature's `) -> f32[D] {`) nest from that earlier line.
        let depth = stack.len();
        let mut base = this;
        for t in toks {
            match t.kind {
                Kind::Open => stack.push((base, t.text.bytes().next().unwrap_or(b'('))),
                Kind::Close => {
                    if let Some(l) = stack.pop() {
                        if stack.len() < depth {
                            base = base.min(l.0);
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(t) = toks.iter().rev().find(|t| t.kind != Kind::Comment) {
            last = Some((t.text, t.kind));
        }
        out.push_str(newline);
    }
    out
}
