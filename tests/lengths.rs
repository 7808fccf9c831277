//! The training driver stays small: no function in `src/runtime/` or
//! `src/cli/` is longer than 150 lines (the step's work belongs to the step
//! program and its modules, not to one hand-driven loop). Lengths are counted
//! from a function's `fn` line to its closing brace, on the code with
//! comments and string literals blanked, as `shared/hooks/long_fns.py` does.

use std::path::{Path, PathBuf};

const LIMIT: usize = 150;

/// `text` with comments and string/char literals replaced by spaces (line
/// breaks kept), so that braces inside them do not count.
fn code_only(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[u8]| {
        for c in s {
            out.push(if *c == b'\n' { '\n' } else { ' ' });
        }
    };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|c| *c == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            let end = rest
                .windows(2)
                .position(|w| w == b"*/")
                .map_or(rest.len(), |e| e + 2);
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"r#\"") || rest.starts_with(b"r\"") {
            let hashes = rest[1..].iter().take_while(|c| **c == b'#').count();
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            let body = 2 + hashes;
            let end = rest[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(rest.len(), |e| body + e + close.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'\'' && rest.len() > 2 && (rest[2] == b'\'' || rest[1] == b'\\') {
            // A char literal ('{', '\n'); a lifetime ('a) is left alone.
            let end = if rest[1] == b'\\' {
                rest.iter()
                    .skip(2)
                    .position(|c| *c == b'\'')
                    .map_or(2, |e| e + 3)
            } else {
                3
            };
            blank(&mut out, &rest[..end.min(rest.len())]);
            i += end.min(rest.len());
        } else {
            let ch = text[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Every function in `text` with its name, first line and length in lines.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        let Some(at) = l.find("fn ") else { continue };
        let before = l[..at].chars().last();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = l[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        let (mut depth, mut started) = (0i64, false);
        'scan: for (j, line) in lines.iter().enumerate().skip(i) {
            for c in line.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        started = true;
                    }
                    '}' => depth -= 1,
                    ';' if !started && depth == 0 => break 'scan,
                    _ => {}
                }
            }
            if started && depth == 0 {
                out.push((name.clone(), i + 1, j - i + 1));
                break;
            }
        }
    }
    out
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("a source directory") {
        let p = e.expect("an entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_driver_function_is_longer_than_150_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src/runtime", "src/cli"] {
        sources(&root.join(dir), &mut files);
    }
    files.sort();
    let mut all = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("a readable source");
        let rel = f.strip_prefix(root).unwrap_or(f).display().to_string();
        for (name, line, len) in functions(&text) {
            all.push((len, format!("{rel}:{line} {name}")));
        }
    }
    all.sort_by(|a, b| b.cmp(a));
    let longest: Vec<String> = all
        .iter()
        .take(5)
        .map(|(n, f)| format!("{f} ({n} lines)"))
        .collect();
    eprintln!("the five longest: {}", longest.join(", "));
    let over: Vec<String> = all
        .iter()
        .filter(|(n, _)| *n > LIMIT)
        .map(|(n, f)| format!("{f}: {n} lines"))
        .collect();
    assert!(
        over.is_empty(),
        "functions over {LIMIT} lines (give each job its own function):\n{}",
        over.join("\n")
    );
}

#[test]
fn the_counter_sees_braces_in_code_only() {
    let text = "fn a() {\n    let s = \"}\";\n    // }\n    let c = '{';\n}\nfn b<'x>(v: &'x str) -> usize { v.len() }\n";
    let f = functions(text);
    assert_eq!(f, vec![("a".to_string(), 1, 5), ("b".to_string(), 6, 1)]);
}
