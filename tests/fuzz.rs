//! Robustness: random bytes, token soups, truncations, single-token mutations and
//! long repetitions of every model and UI test must never panic, abort or hang
//! the parser, the checker, the planner or the formatter (10 s guard per input),
//! and every error must carry a code and a span inside its file.
//!
//! `cargo test` runs a short campaign; `SHARDC_FUZZ_CASES=N` sets the inputs per
//! target (`scripts/fuzz.sh` runs long campaigns in release mode).

use proptest::prelude::*;
use shardc::world::{self, Options};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

/// Inputs per target: `SHARDC_FUZZ_CASES`, or a short run.
fn cases() -> u32 {
    std::env::var("SHARDC_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

/// The seeds: every model and every UI test (UTF-8 ones).
fn models() -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut v: Vec<(PathBuf, String)> = ["models", "tests/ui"]
        .iter()
        .flat_map(|d| std::fs::read_dir(root.join(d)).into_iter().flatten())
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "shard"))
        .filter_map(|p| {
            let t = std::fs::read_to_string(&p).ok()?;
            Some((p, t))
        })
        .collect();
    v.sort();
    v
}

/// Compile on a separate thread: a panic or a hang (no answer in 20 s) fails.
fn check_robust(path: &Path, text: String) -> Result<(), TestCaseError> {
    let (tx, rx) = mpsc::channel();
    let p = path.to_path_buf();
    let input = text.clone();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(|| {
            let mut bad = Vec::new();
            // The formatter: no panic, whitespace-only, settled in one pass.
            let once = shardc::fmt::format(&input);
            let squeeze = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
            if squeeze(&once) != squeeze(&input) {
                bad.push("fmt changed more than whitespace".to_string());
            }
            if shardc::fmt::format(&once) != once {
                bad.push("fmt is not idempotent here".to_string());
            }
            let c = world::compile_source(&p, input, &Options::default());
            for d in &c.diagnostics {
                let f = c.sources.get(d.primary.span.file);
                let (s, e) = (d.primary.span.start as usize, d.primary.span.end as usize);
                if s > e
                    || e > f.text.len()
                    || !f.text.is_char_boundary(s)
                    || !f.text.is_char_boundary(e)
                {
                    bad.push(format!(
                        "{} has span {s}..{e} outside {} bytes",
                        d.code.as_str(),
                        f.text.len()
                    ));
                }
                // Rendering must not panic either.
                let _ =
                    shardc::diag::render::human(d, &c.sources, shardc::diag::render::Style::Plain);
                let _ = shardc::diag::render::json(d, &c.sources);
            }
            // The planner, on what checked clean.
            for p in &c.plans {
                let _ = shardc::plan::render(p, &c.sources);
            }
            bad
        });
        let _ = tx.send(r);
    });
    match rx.recv_timeout(Duration::from_secs(10)) {
        Ok(Ok(bad)) if bad.is_empty() => Ok(()),
        Ok(Ok(bad)) => Err(TestCaseError::fail(format!(
            "bad spans: {bad:?}\ninput:\n{text}"
        ))),
        Ok(Err(_)) => Err(TestCaseError::fail(format!(
            "checker panicked on input:\n{text}"
        ))),
        Err(_) => Err(TestCaseError::fail(format!(
            "checker hung on input:\n{text}"
        ))),
    }
}

const TOKENS: &[&str] = &[
    "mesh",
    "layer",
    "model",
    "fn",
    "let",
    "train",
    "table",
    "feature",
    "import",
    "const",
    "pragma",
    "init",
    "local",
    "on",
    "forward",
    "x",
    "w",
    "B",
    "D",
    "T",
    "dp",
    "mp",
    "f32",
    "i32",
    "bf16",
    "[",
    "]",
    "(",
    ")",
    "{",
    "}",
    ",",
    ":",
    "=",
    "->",
    "@",
    "+",
    "-",
    "*",
    "/",
    "...",
    "_",
    "0",
    "1",
    "4",
    "768",
    "-1",
    "0.5",
    "1e-3",
    "\"btd,dh->bth\"",
    "psum",
    "all_gather",
    "einsum",
    "reshape",
    "partial",
    "nn",
    "Dense",
    "repeat",
    "\n",
    "//c\n",
    "99999999999999999999",
    "9223372036854775807",
    "0",
    "é",
    "\"",
];

fn tokens_of(text: &str) -> Vec<(usize, usize)> {
    // Whitespace-separated pieces, as byte ranges.
    let mut v = Vec::new();
    let mut start = None;
    for (i, c) in text.char_indices() {
        match (c.is_whitespace(), start) {
            (false, None) => start = Some(i),
            (true, Some(s)) => {
                v.push((s, i));
                start = None
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        v.push((s, text.len()));
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// A token repeated thousands of times somewhere in a model: the flat
    /// chains (`- - - x`, `x + x + …`, `f()()…`) that used to overflow the stack.
    #[test]
    fn long_repetitions(which in 0usize..256, at in 0usize..10_000, tok in proptest::sample::select(TOKENS), n in 100usize..20_000) {
        let ms = models();
        let (p, t) = &ms[which % ms.len()];
        let toks = tokens_of(t);
        let (s, _) = toks[at % toks.len()];
        let text = format!("{}{}{}", &t[..s], format!("{tok} ").repeat(n), &t[s..]);
        check_robust(p, text)?;
    }

    #[test]
    fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        check_robust(Path::new("fuzz.shard"), text)?;
    }

    #[test]
    fn token_soup(toks in proptest::collection::vec(proptest::sample::select(TOKENS), 0..120)) {
        check_robust(Path::new("fuzz.shard"), toks.join(" "))?;
    }

    #[test]
    fn truncated_models(which in 0usize..256, frac in 0.0f64..1.0) {
        let ms = models();
        let (p, t) = &ms[which % ms.len()];
        let mut cut = (t.len() as f64 * frac) as usize;
        while !t.is_char_boundary(cut) { cut -= 1; }
        check_robust(p, t[..cut].to_string())?;
    }

    #[test]
    fn mutated_models(which in 0usize..256, at in 0usize..10_000, tok in proptest::sample::select(TOKENS), mode in 0u8..3) {
        let ms = models();
        let (p, t) = &ms[which % ms.len()];
        let toks = tokens_of(t);
        let (s, e) = toks[at % toks.len()];
        let text = match mode {
            0 => format!("{}{}{}", &t[..s], tok, &t[e..]),      // replace a token
            1 => format!("{}{}{}", &t[..s], "", &t[e..]),       // delete a token
            _ => format!("{}{} {}", &t[..s], tok, &t[s..]),     // insert a token
        };
        check_robust(p, text)?;
    }
}
