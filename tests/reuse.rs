//! The checker's kept calls ([`shardc::check::remember`], the language
//! server's): every `.shard` file of the repository compiled after an edit,
//! with the calls of the text before the edit kept, gives what a compilation
//! that kept nothing gives — diagnostics, binding types (with their spans)
//! and lowered programs (with every node's span). Two edits: a line before
//! everything (every item moves), and a blank line inside the first layer
//! (that layer's text changes; the items after it move).

mod common;

use shardc::files::Disk;
use shardc::world::{compile_text, Compilation, Options};
use std::path::Path;

fn compile(path: &Path, text: &str) -> Compilation {
    let opts = Options {
        quick: true,
        ..Options::default()
    };
    compile_text(&Disk, path, text.to_string(), &opts)
}

fn seen(c: &Compilation) -> [String; 3] {
    [
        format!("{:?}", c.diagnostics),
        format!("{:?}", c.checked.types),
        format!("{:?}", c.programs),
    ]
}

fn edits(text: &str) -> Vec<(&'static str, String)> {
    let mut out = vec![("a line before everything", format!("// moved\n{text}"))];
    if let Some(at) = text
        .find("layer ")
        .and_then(|l| text[l..].find("{\n").map(|b| l + b + 2))
    {
        out.push((
            "a blank line in the first layer",
            format!("{}\n{}", &text[..at], &text[at..]),
        ));
    }
    out
}

#[test]
fn kept_calls_give_what_a_fresh_check_gives() {
    shardc::reparse::remember();
    shardc::check::remember();
    let files = common::shard_files(&["models", "examples", "tests"]);
    assert!(files.len() > 100, "{} files", files.len());
    let mut compared = 0;
    // Files whose first edit replayed some call, of those that check clean.
    let (mut moved, mut clean) = (0, 0);
    for p in &files {
        let Ok(text) = std::fs::read_to_string(p) else {
            continue;
        };
        for (i, (what, edited)) in edits(&text).into_iter().enumerate() {
            shardc::check::forget();
            let _ = compile(p, &text);
            let before = shardc::check::replayed();
            let warm = seen(&compile(p, &edited));
            let replayed = shardc::check::replayed() - before;
            shardc::check::forget();
            let fresh = compile(p, &edited);
            if i == 0 && !fresh.checked.models.is_empty() {
                clean += 1;
                moved += usize::from(replayed > 0);
                if replayed == 0 {
                    eprintln!("not replayed: {}", p.display());
                }
            }
            let cold = seen(&fresh);
            for (w, c) in warm.iter().zip(&cold) {
                assert!(
                    w == c,
                    "{}, after {what}:\nkept:  {w}\nfresh: {c}",
                    p.display()
                );
            }
            compared += 1;
        }
    }
    let replayed = shardc::check::replayed();
    eprintln!(
        "{compared} edits compared, {replayed} calls replayed; {moved} of {clean} checked models replayed after every item moved"
    );
    assert!(compared > 150, "{compared} compared");
    // A model whose text did not change is replayed whole (its forward is
    // one kept call); one that reads a table or feature is never kept.
    assert!(moved * 10 >= clean * 9, "{moved} of {clean}");
}
