//! The stage order of `src/lib.rs` holds: no module uses a module of a later
//! stage, every module has a stage, and a module header that names its stage
//! (`//! Stage 7 (lower): ...`) names that one.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// `module → stage` from the numbered list in the crate docs.
fn stages(lib: &str) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for line in lib.lines() {
        let Some(rest) = line.strip_prefix("//! ") else {
            continue;
        };
        let Some((n, rest)) = rest.split_once(". ") else {
            continue;
        };
        let Ok(n) = n.trim().parse::<usize>() else {
            continue;
        };
        for part in rest.split("[`").skip(1) {
            if let Some((name, _)) = part.split_once("`]") {
                m.insert(name.split("::").next().unwrap_or(name).to_string(), n);
            }
        }
    }
    m
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("src") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The crate modules a file's code names (`crate::x`, `use crate::{x, y}`);
/// comments may point anywhere.
fn uses(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut out = Vec::new();
    let mut rest = code.as_str();
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + 7..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

#[test]
fn no_module_uses_a_later_stage() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(root.join("lib.rs")).expect("lib.rs");
    let stage = stages(&lib);
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut errs = Vec::new();
    for f in files {
        let rel = f.strip_prefix(&root).expect("under src");
        let first = rel.components().next().expect("a component");
        let module = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let Some(&mine) = stage.get(&module) else {
            errs.push(format!(
                "src/{}: module `{module}` has no stage in src/lib.rs",
                rel.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(&f).expect("readable");
        // A header that names its stage names the one src/lib.rs gives.
        let said = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("//! Stage "))
            .and_then(|l| l.split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(n) = said.filter(|n| *n != mine) {
            errs.push(format!(
                "src/{}: its header says stage {n}; src/lib.rs puts `{module}` in stage {mine}",
                rel.display()
            ));
        }
        for u in uses(&text) {
            match stage.get(&u) {
                Some(&theirs) if theirs > mine => errs.push(format!(
                    "src/{} (stage {mine}, `{module}`) uses `{u}` (stage {theirs})",
                    rel.display()
                )),
                Some(_) => {}
                None => errs.push(format!(
                    "src/{}: uses `crate::{u}`, which has no stage",
                    rel.display()
                )),
            }
        }
    }
    assert!(errs.is_empty(), "{}", errs.join("\n"));
}

/// No source file over 1,200 lines: each file has one job.
#[test]
fn no_source_file_is_over_1200_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let n = std::fs::read_to_string(f).ok()?.lines().count();
            (n > 1200).then(|| format!("{}: {n} lines", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
}
