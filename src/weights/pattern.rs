//! Tensor-name patterns of a weight map: literal text with `{capture}`s, each
//! capture one or more characters other than `.` (a layer index, a module
//! name). `model.layers.{i}.mlp.up_proj.weight` matches
//! `model.layers.11.mlp.up_proj.weight` with `i = 11`; the same captures
//! substituted into the rule's other side name the tensor there.

use std::collections::BTreeMap;

/// One piece of a pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Capture(String),
}

/// A parsed pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pattern {
    pieces: Vec<Piece>,
}

/// Captured values by capture name.
pub type Captures = BTreeMap<String, String>;

/// Why a pattern does not parse: the message and the byte range in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatternError {
    pub message: String,
    pub at: std::ops::Range<usize>,
}

fn bad(message: impl Into<String>, at: std::ops::Range<usize>) -> PatternError {
    PatternError {
        message: message.into(),
        at,
    }
}

impl Pattern {
    pub fn parse(text: &str) -> Result<Pattern, PatternError> {
        if text.is_empty() {
            return Err(bad("an empty name", 0..0));
        }
        let mut pieces = Vec::new();
        let mut rest = text;
        let mut at = 0;
        while !rest.is_empty() {
            if let Some(open) = rest.strip_prefix('{') {
                let Some(close) = open.find('}') else {
                    return Err(bad("`{` without its `}`", at..text.len()));
                };
                let name = &open[..close];
                let ok = name
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                    && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !ok {
                    return Err(bad(
                        format!(
                            "`{{{name}}}` is not a capture: a capture is a name such as `{{i}}`"
                        ),
                        at..at + close + 2,
                    ));
                }
                if matches!(pieces.last(), Some(Piece::Capture(_))) {
                    return Err(bad(
                        "two captures side by side cannot be told apart: put text between them",
                        at..at + close + 2,
                    ));
                }
                pieces.push(Piece::Capture(name.to_string()));
                at += close + 2;
                rest = &open[close + 1..];
            } else {
                let end = rest.find(['{', '}']).unwrap_or(rest.len());
                if end == 0 {
                    return Err(bad("`}` without its `{`", at..at + 1));
                }
                pieces.push(Piece::Text(rest[..end].to_string()));
                at += end;
                rest = &rest[end..];
            }
        }
        Ok(Pattern { pieces })
    }

    /// The capture names, in order of appearance.
    pub fn captures(&self) -> Vec<&str> {
        self.pieces
            .iter()
            .filter_map(|p| match p {
                Piece::Capture(c) => Some(c.as_str()),
                Piece::Text(_) => None,
            })
            .collect()
    }

    /// The captures when `name` matches the whole pattern.
    pub fn matches(&self, name: &str) -> Option<Captures> {
        let mut caps = Captures::new();
        self.match_from(0, name, &mut caps).then_some(caps)
    }

    fn match_from(&self, i: usize, rest: &str, caps: &mut Captures) -> bool {
        match self.pieces.get(i) {
            None => rest.is_empty(),
            Some(Piece::Text(t)) => rest
                .strip_prefix(t.as_str())
                .is_some_and(|r| self.match_from(i + 1, r, caps)),
            Some(Piece::Capture(c)) => {
                let most = rest.find('.').unwrap_or(rest.len());
                // A capture seen before must take the same value.
                if let Some(v) = caps.get(c).cloned() {
                    return rest
                        .strip_prefix(v.as_str())
                        .is_some_and(|r| self.match_from(i + 1, r, caps));
                }
                for len in 1..=most {
                    if !rest.is_char_boundary(len) {
                        continue;
                    }
                    caps.insert(c.clone(), rest[..len].to_string());
                    if self.match_from(i + 1, &rest[len..], caps) {
                        return true;
                    }
                }
                caps.remove(c);
                false
            }
        }
    }

    /// The name with every capture replaced by its value (`None` when one is
    /// not in `caps`).
    pub fn substitute(&self, caps: &Captures) -> Option<String> {
        let mut out = String::new();
        for p in &self.pieces {
            match p {
                Piece::Text(t) => out.push_str(t),
                Piece::Capture(c) => out.push_str(caps.get(c)?),
            }
        }
        Some(out)
    }

    /// A name written as this pattern would write it: each `.`-separated
    /// part of `name` that stands where this pattern has a lone capture
    /// becomes that capture (`blocks.0.w_up` → `blocks.{i}.w_up`).
    pub fn generalise(&self, name: &str) -> String {
        let text: String = self
            .pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.clone(),
                Piece::Capture(c) => format!("{{{c}}}"),
            })
            .collect();
        let mine: Vec<&str> = text.split('.').collect();
        let theirs: Vec<&str> = name.split('.').collect();
        if mine.len() != theirs.len() {
            return name.to_string();
        }
        let parts: Vec<&str> = mine
            .iter()
            .zip(&theirs)
            .map(|(m, t)| {
                let lone = m.starts_with('{') && m.ends_with('}') && m.matches('{').count() == 1;
                if lone {
                    *m
                } else {
                    *t
                }
            })
            .collect();
        parts.join(".")
    }

    /// The pattern with each capture shown as `0`: a likely name, for "did
    /// you mean" against real names.
    pub fn example(&self) -> String {
        self.pieces
            .iter()
            .map(|p| match p {
                Piece::Text(t) => t.as_str(),
                Piece::Capture(_) => "0",
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_and_substitutes() {
        let p = Pattern::parse("model.layers.{i}.self_attn.q_proj.weight").unwrap();
        let caps = p
            .matches("model.layers.11.self_attn.q_proj.weight")
            .unwrap();
        assert_eq!(caps["i"], "11");
        assert!(p
            .matches("model.layers.1.2.self_attn.q_proj.weight")
            .is_none());
        assert!(p.matches("model.layers..self_attn.q_proj.weight").is_none());
        let q = Pattern::parse("blocks.{i}.wq").unwrap();
        assert_eq!(q.substitute(&caps).unwrap(), "blocks.11.wq");
        assert_eq!(q.example(), "blocks.0.wq");
    }

    #[test]
    fn a_capture_used_twice_takes_one_value() {
        let p = Pattern::parse("a.{i}.b.{i}").unwrap();
        assert!(p.matches("a.3.b.3").is_some());
        assert!(p.matches("a.3.b.4").is_none());
    }

    #[test]
    fn bad_patterns_say_where() {
        assert_eq!(Pattern::parse("a.{i").unwrap_err().at, 2..4);
        assert_eq!(Pattern::parse("a.{1x}.b").unwrap_err().at, 2..6);
        assert!(Pattern::parse("a.{i}{j}").is_err());
        assert_eq!(Pattern::parse("a}").unwrap_err().at, 1..2);
        assert!(Pattern::parse("").is_err());
    }
}
