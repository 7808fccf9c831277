//! Every explanation's example (`docs/errors/CODE.md`, served by `shardc
//! explain`) produces its own code, and its fix checks without errors. A
//! section's ```toml block is a weight map, checked as `--map` is; a ```csv
//! block whose first line is `# NAME.csv` is that file (a schedule file).

mod common;

use shardc::diag::Code;
use shardc::files::Memory;
use shardc::world::{self, Options};
use std::path::Path;

/// The ```shard blocks of a section (`## Example`, `## Fix`).
fn blocks(text: &str, section: &str) -> Vec<String> {
    fenced(text, section, "shard")
}

/// The blocks of one language in a section.
fn fenced(text: &str, section: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    let Some(start) = text.find(&format!("## {section}")) else {
        return vec![];
    };
    let body = &text[start..];
    let end = body[3..].find("\n## ").map_or(body.len(), |i| i + 3);
    let body = &body[..end];
    let mut out = Vec::new();
    let mut rest = body;
    while let Some(i) = rest.find(&fence) {
        let after = &rest[i + fence.len()..];
        let Some(j) = after.find("```") else { break };
        out.push(after[..j].to_string());
        rest = &after[j..];
    }
    out
}

/// The codes of compiling a section's blocks as files in memory: a block whose
/// first line is `// NAME.shard` is that file (imports find it); the first
/// block is the one compiled.
fn codes(dir: &Path, blocks: &[String], map: Option<&String>, csv: &[String]) -> Vec<String> {
    let mut files = Memory::new();
    for b in csv {
        if let Some(name) = b.lines().next().and_then(|l| l.strip_prefix("# ")) {
            files.insert(dir.join(name.trim()), b.as_str());
        }
    }
    let mut opts = Options::default();
    if let Some(m) = map {
        let path = dir.join("map.toml");
        files.insert(&path, m.as_str());
        opts.map = Some(path);
    }
    let mut root = None;
    for (i, b) in blocks.iter().enumerate() {
        let name = b
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("// "))
            .and_then(|l| l.split_whitespace().next())
            .filter(|n| n.ends_with(".shard"))
            .map_or_else(
                || format!("example{i}.shard"),
                |n| n.trim_end_matches(';').to_string(),
            );
        let path = dir.join(&name);
        files.insert(&path, b.as_str());
        root.get_or_insert(path);
    }
    let Some(root) = root else { return vec![] };
    if let Some(line) = blocks[0]
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("// shardc shard "))
    {
        return shard_codes(&files, &root, line);
    }
    match world::compile_in(&files, &root, &opts) {
        Ok(c) => c
            .diagnostics
            .iter()
            .map(|d| d.code.as_str().to_string())
            .collect(),
        Err(e) => vec![format!("unreadable: {e}")],
    }
}

/// An example whose first line is `// shardc shard --mesh a=N --device D`
/// is laid out by the auto-sharder: the codes of its failure (none when a
/// layout is written).
fn shard_codes(files: &Memory, root: &Path, line: &str) -> Vec<String> {
    use shardc::autoshard::{self, Failure, Request};
    let (mesh, device) = common::shard_args(line);
    let device = shardc::plan::device::parse(&device).expect("a device");
    let req = Request {
        files,
        path: root,
        model: None,
        mesh,
        devices: None,
        device,
        allow_bf16: false,
        pipeline: false,
        exact: autoshard::EXACT,
        grants: vec![],
    };
    match autoshard::solve(&req) {
        Ok(_) => vec![],
        Err(Failure::NoFit { diagnostic, .. }) => vec![diagnostic.code.as_str().to_string()],
        Err(Failure::Input(c)) | Err(Failure::Unsound(c)) => c
            .diagnostics
            .iter()
            .map(|d| d.code.as_str().to_string())
            .collect(),
        Err(Failure::Usage(u)) => vec![format!("usage: {u}")],
    }
}

#[test]
fn every_explanation_example_produces_its_code() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/errors");
    let mut errs = Vec::new();
    for code in Code::ALL {
        let name = code.as_str();
        let text = code.explanation();
        let examples = blocks(text, "Example");
        // A source that is not UTF-8 cannot be written in this (UTF-8) file; its
        // example is checked against a real Latin-1 file in tests/cli.rs.
        if *code == Code::E0004 {
            continue;
        }
        if examples.is_empty() {
            errs.push(format!("{name}: no ```shard example under `## Example`"));
            continue;
        }
        let got = codes(
            &dir,
            &examples,
            fenced(text, "Example", "toml").first(),
            &fenced(text, "Example", "csv"),
        );
        if !got.iter().any(|c| c == name) {
            errs.push(format!("{name}: its example produces {got:?}, not {name}"));
        }
        let fix = blocks(text, "Fix");
        if !fix.is_empty() {
            let got = codes(
                &dir,
                &fix,
                fenced(text, "Fix", "toml").first(),
                &fenced(text, "Fix", "csv"),
            );
            if got.iter().any(|c| c == name || c.starts_with('E')) {
                errs.push(format!("{name}: its fix produces {got:?}"));
            }
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}
