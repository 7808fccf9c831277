//! Every fix fixes: each diagnostic in `tests/ui` that offers an edit (the
//! `suggested fix` a human reads, the code action an editor applies) is
//! applied to its file alone, and the file is checked again: the diagnostic
//! it fixed must be gone (no diagnostic of that code starting where the edit
//! was), and the edit must not leave the file unparsable.

use shardc::world::{self, Options};
use std::path::Path;

mod common;
use common::ui_files;

fn options(path: &Path) -> Options {
    let map = path.with_extension("map.toml");
    Options {
        map: map.exists().then_some(map),
        ..Options::default()
    }
}

#[test]
fn every_fix_fixes_its_diagnostic() {
    let mut failures = Vec::new();
    let mut applied = 0;
    for path in ui_files() {
        // (A file that is not UTF-8 is E0004's test, with no fix.)
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let opts = options(&path);
        let c = world::compile_source(&path, text.clone(), &opts);
        let Some(file) = c.sources.find(&path) else {
            continue;
        };
        for d in &c.diagnostics {
            let Some(fix) = &d.fix else { continue };
            if fix.span.file != file {
                continue;
            }
            let (a, b) = (fix.span.start as usize, fix.span.end as usize);
            let mut fixed = text.clone();
            fixed.replace_range(a..b, &fix.replacement);
            applied += 1;
            let again = world::compile_source(&path, fixed, &opts);
            let syntax = again
                .diagnostics
                .iter()
                .find(|e| e.code.as_str().starts_with("E00"));
            // The edit's start is where the fixed diagnostic would recur.
            let recurs = again.diagnostics.iter().find(|e| {
                e.code == d.code
                    && e.primary.span.file == file
                    && e.primary.span.start as usize >= a.min(d.primary.span.start as usize)
                    && e.primary.span.start as usize
                        <= (d.primary.span.end as usize).max(a + fix.replacement.len())
            });
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if let Some(e) = syntax.filter(|_| !d.code.as_str().starts_with("E00")) {
                failures.push(format!(
                    "{name}: {} fix `{}` → `{}` breaks the syntax: {}",
                    d.code.as_str(),
                    &text[a..b],
                    fix.replacement,
                    e.message
                ));
            } else if let Some(e) = recurs {
                failures.push(format!(
                    "{name}: {} fix `{}` → `{}` does not fix it: {}",
                    d.code.as_str(),
                    &text[a..b],
                    fix.replacement,
                    e.message
                ));
            }
        }
    }
    assert!(applied > 0, "no UI test offers a fix");
    assert!(
        failures.is_empty(),
        "{} of {applied} fixes do not fix:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Every code whose help quotes an edit (a backticked snippet) offers a quick
/// fix in some UI test, or is in `shardc::diag::NO_FIX` with the reason it
/// cannot; a code in that list that does offer one is a stale entry.
#[test]
fn every_code_whose_help_quotes_an_edit_has_a_fix() {
    use std::collections::BTreeMap;
    // Per code: (diagnostics with a fix, helps that quote text).
    let mut seen: BTreeMap<&'static str, (usize, Vec<String>)> = BTreeMap::new();
    for path in ui_files() {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let c = world::compile_source(&path, text, &options(&path));
        for d in &c.diagnostics {
            let e = seen.entry(d.code.as_str()).or_default();
            e.0 += usize::from(d.fix.is_some());
            e.1.extend(d.help.iter().filter(|h| h.contains('`')).cloned());
        }
    }
    let mut missing = Vec::new();
    let mut stale = Vec::new();
    for (code, (fixes, quoting)) in &seen {
        let exempt = shardc::diag::Code::parse(code).and_then(|c| c.no_fix());
        match (*fixes > 0, quoting.is_empty(), exempt) {
            (false, false, None) => missing.push(format!("{code}: {}", quoting[0])),
            (true, _, Some(_)) => stale.push(*code),
            _ => {}
        }
    }
    let with_fix: Vec<&str> = seen
        .iter()
        .filter(|(_, v)| v.0 > 0)
        .map(|(c, _)| *c)
        .collect();
    println!(
        "codes with a quick fix ({}): {}",
        with_fix.len(),
        with_fix.join(" ")
    );
    assert!(
        missing.is_empty(),
        "codes whose help quotes an edit but that offer no fix (give one, or add the code to \
         NO_FIX in src/diag/codes.rs with why):\n{}",
        missing.join("\n")
    );
    assert!(
        stale.is_empty(),
        "codes in NO_FIX that do offer a fix: {stale:?}"
    );
    for (code, why) in shardc::diag::NO_FIX {
        assert!(
            !why.is_empty(),
            "{} is in NO_FIX without a reason",
            code.as_str()
        );
    }
}
