//! UI tests: every `tests/ui/*.shard` file carries its expected diagnostics inline,
//! as `//~ CODE` comments at the end of the line where the diagnostic's primary span
//! starts (several codes may follow one `//~`). `//~? CODE` expects a diagnostic
//! outside the file (in an import or the stdlib). A file with no `//~` must be clean.
//!
//! A file with a `NAME.map.toml` beside it is checked with that weight map
//! (`--map`); the map's own diagnostics are outside the file (`//~?`).
//!
//! The rendered output is compared with `NAME.stderr` beside the file; run with
//! `SHARDC_BLESS=1` to (re)write those golden files.

use shardc::diag::render::{self, Style};
use shardc::diag::Code;
use shardc::world::{self, Options};
use std::collections::BTreeMap;
use std::path::Path;

mod common;
use common::ui_files;

/// (line, code) → count; line 0 = outside the file.
fn expected(text: &str) -> BTreeMap<(usize, String), usize> {
    let mut m = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let Some(pos) = line.find("//~") else {
            continue;
        };
        let rest = &line[pos + 3..];
        let (lineno, rest) = match rest.strip_prefix('?') {
            Some(r) => (0, r),
            None => (i + 1, rest),
        };
        for code in rest.split_whitespace() {
            *m.entry((lineno, code.to_string())).or_insert(0) += 1;
        }
    }
    m
}

/// The auto-sharder's E0700 for the file at `rel` with `--mesh` and `--device`.
fn shard_diagnostic(rel: &Path, args: &str) -> Option<shardc::diag::Diagnostic> {
    use shardc::autoshard::{self, Failure, Request};
    let (mesh, device) = common::shard_args(args);
    let req = Request {
        files: &shardc::files::Disk,
        path: rel,
        model: None,
        mesh,
        devices: None,
        device: shardc::plan::device::parse(&device).ok()?,
        allow_bf16: false,
        pipeline: false,
        exact: autoshard::EXACT,
        grants: vec![],
    };
    match autoshard::solve(&req) {
        Err(Failure::NoFit { diagnostic, .. }) => Some(*diagnostic),
        _ => None,
    }
}

fn run_one(path: &Path) -> Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    // Run from the repository root so file names in the output are stable.
    let rel = path
        .strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap_or(path);
    let map = rel.with_extension("map.toml");
    let opts = Options {
        map: Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(&map)
            .is_file()
            .then_some(map),
        ..Options::default()
    };
    // A file that is not UTF-8 (E0004) is compiled from its bytes, as the CLI does.
    let mut c = match String::from_utf8(bytes.clone()) {
        Ok(text) => world::compile_source(rel, text, &opts),
        Err(_) => world::compile(rel, &opts).map_err(|e| e.to_string())?,
    };
    // `// shardc shard --mesh a=N --device D` on the first line: the file is
    // also laid out by the auto-sharder, and its E0700 is expected too.
    let first = String::from_utf8_lossy(&bytes)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    if let Some(args) = first.strip_prefix("// shardc shard ") {
        if let Some(d) = shard_diagnostic(rel, args) {
            c.diagnostics.push(d);
        }
    }
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let root = c.program.root;
    let mut actual = BTreeMap::new();
    let mut rendered = String::new();
    for d in &c.diagnostics {
        let line = if d.primary.span.file == root {
            c.sources
                .get(root)
                .line_col(d.primary.span.start as usize)
                .0
        } else {
            0
        };
        *actual
            .entry((line, d.code.as_str().to_string()))
            .or_insert(0) += 1;
        rendered.push_str(&render::human(d, &c.sources, Style::Plain));
    }
    let want = expected(&text);
    let mut problems = Vec::new();
    for (k, n) in &want {
        let got = actual.get(k).copied().unwrap_or(0);
        if got < *n {
            problems.push(format!("  missing: {} at line {}", k.1, k.0));
        }
    }
    for (k, n) in &actual {
        let w = want.get(k).copied().unwrap_or(0);
        if *n > w {
            problems.push(format!("  unexpected: {} at line {}", k.1, k.0));
        }
    }
    let golden = path.with_extension("stderr");
    if std::env::var_os("SHARDC_BLESS").is_some() {
        if rendered.is_empty() {
            let _ = std::fs::remove_file(&golden);
        } else {
            std::fs::write(&golden, &rendered).map_err(|e| e.to_string())?;
        }
    } else {
        let old = std::fs::read_to_string(&golden).unwrap_or_default();
        if old != rendered {
            problems.push(format!(
                "  rendered output differs from {} (SHARDC_BLESS=1 to update):\n{rendered}",
                golden.display()
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("{}:\n{}", rel.display(), problems.join("\n")))
    }
}

#[test]
fn ui() {
    let files = ui_files();
    let failures: Vec<String> = files.iter().filter_map(|f| run_one(f).err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} UI tests failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
}

#[test]
fn every_code_has_an_explanation_and_a_ui_test() {
    let mut covered = std::collections::BTreeSet::new();
    for f in ui_files() {
        let text = String::from_utf8_lossy(&std::fs::read(&f).unwrap_or_default()).into_owned();
        for ((_, code), _) in expected(&text) {
            covered.insert(code);
        }
    }
    let mut missing = Vec::new();
    for c in Code::ALL {
        let ex = c.explanation();
        if !ex.starts_with(&format!("# {}", c.as_str())) || ex.lines().count() < 5 {
            missing.push(format!(
                "{}: explanation docs/errors/{}.md is missing or a stub",
                c.as_str(),
                c.as_str()
            ));
        }
        if !covered.contains(c.as_str()) {
            missing.push(format!("{}: no UI test expects it", c.as_str()));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn seed_models_check_clean() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let mut n = 0;
    for e in std::fs::read_dir(dir).expect("models/ exists") {
        let p = e.expect("dir entry").path();
        if p.extension().is_some_and(|x| x == "shard") {
            let c = world::compile(&p, &Options::default()).expect("readable");
            let errs: Vec<String> = c
                .diagnostics
                .iter()
                .filter(|d| d.is_error())
                .map(|d| render::human(d, &c.sources, Style::Plain))
                .collect();
            assert!(
                errs.is_empty(),
                "{} has errors:\n{}",
                p.display(),
                errs.join("\n")
            );
            n += 1;
        }
    }
    assert!(n >= 4, "expected the four seed models");
}
