//! `data: tokens(...)` over parquet, Arrow (`datasets.save_to_disk`) and text
//! with a Hugging Face `tokenizer.json`, from fixtures written by pyarrow,
//! `datasets` and `tokenizers` (`scripts/table_fixtures.py`). Each is
//! converted once into a `uint32` stream under the run directory's `tokens/`:
//! the stream equals what the Python libraries give (bit for bit, by sha256),
//! the windows shardc cuts from it equal nanoGPT's slicing (through the
//! losses), an unchanged source is reused and a changed one converted again,
//! and bad tables and tokenizers are errors naming the file and the place,
//! with nothing half-written.

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;

use common::{shardc, stderr};

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
        .display()
        .to_string()
}

/// A small language model over `vocab` ids trained on `data`, in `dir`.
fn model(dir: &Path, vocab: usize, data: &str) -> PathBuf {
    let p = dir.join("lm.shard");
    std::fs::write(
        &p,
        format!(
            "import nn
mesh m(dp: 2)
model LM {{
  e = Embed({vocab}, 16)
  head = Dense(16 -> {vocab})
  fn forward(ids: i32[B@dp, 16]) -> f32[B@dp, 16, {vocab}] {{ head(e(ids)) }}
}}
train LM on m {{
  data: {data}
  batch: 8, steps: 3, seed: 0, optimizer: adam(lr: 0.01)
}}
"
        ),
    )
    .expect("write");
    p
}

fn run(model: &Path, out: &Path, args: &[&str]) -> (Output, Vec<f64>) {
    common::trained(model, out, args)
}

fn check(model: &Path) -> Output {
    shardc().arg("check").arg(model).output().expect("spawn")
}

/// The converted streams in a run's `tokens/`.
fn streams(out: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(out.join("tokens"))
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| p.extension().is_some_and(|e| e == "bin"));
    v.sort();
    v
}

fn sha256(path: &Path) -> String {
    use sha2::Digest;
    let d = sha2::Sha256::digest(std::fs::read(path).expect("read"));
    d.iter().map(|b| format!("{b:02x}")).collect()
}

fn expected() -> serde_json::Value {
    let text = std::fs::read_to_string(fixture("tables/shakespeare_tok.json")).expect("json");
    serde_json::from_str(&text).expect("json")
}

/// The same 20,000 ids as tests/fixtures/tokens/stream.bin, as pyarrow and
/// `datasets` write them: rows of a list column, a flat uint16 column, and a
/// `save_to_disk` directory of two Arrow shards.
#[test]
fn tables_give_the_stream_and_nanogpt_windows() {
    let reference: Vec<u8> = std::fs::read(fixture("tokens/stream.bin"))
        .expect("stream")
        .chunks_exact(2)
        .flat_map(|c| u32::from(u16::from_le_bytes([c[0], c[1]])).to_le_bytes())
        .collect();
    let dir = common::temp("tables", "windows");
    let (b, want) = {
        let m = model(
            &dir,
            256,
            &format!(
                "tokens(path: \"{}\", seq: 16)",
                fixture("tokens/stream.bin")
            ),
        );
        run(
            &m,
            &dir.join("ref"),
            &["--data", &fixture("tokens/windows.npz")],
        )
    };
    assert!(b.status.success(), "{}", stderr(&b));
    for (i, (source, opts)) in [
        ("tables/ids.parquet", ""),
        ("tables/flat.parquet", ", column: \"tokens\""),
        ("tables/ds", ""),
    ]
    .into_iter()
    .enumerate()
    {
        let d = dir.join(format!("s{i}"));
        std::fs::create_dir_all(&d).expect("mkdir");
        let m = model(
            &d,
            256,
            &format!("tokens(path: \"{}\", seq: 16{opts})", fixture(source)),
        );
        let c = check(&m);
        assert!(c.status.success(), "{source}: {}", stderr(&c));
        let out = d.join("run");
        let (a, got) = run(&m, &out, &[]);
        assert!(a.status.success(), "{source}: {}", stderr(&a));
        assert_eq!(got, want, "{source}: the windows differ from nanoGPT's");
        let s = streams(&out);
        assert_eq!(s.len(), 1, "{source}: {s:?}");
        assert!(
            std::fs::read(&s[0]).expect("stream") == reference,
            "{source}: ids differ"
        );
        assert!(stderr(&a).contains("20000 ids, written"), "{}", stderr(&a));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Text through a byte-level BPE `tokenizer.json`: the stream is what
/// `tokenizers` gives for the whole text (though shardc tokenizes it in
/// pieces), the windows are nanoGPT's, a second run reuses the stream and a
/// changed text is tokenized again.
#[test]
fn text_through_a_tokenizer_equals_the_python_library() {
    let want = expected();
    let dir = common::temp("tables", "tok");
    let text = dir.join("input.txt");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("data/tinyshakespeare.txt"),
        &text,
    )
    .expect("copy");
    let data = format!(
        "tokens(path: \"input.txt\", tokenizer: \"{}\", seq: 16)",
        fixture("tables/tiny-tokenizer.json")
    );
    let m = model(&dir, 320, &data);
    let out = dir.join("run");
    let (a, got) = run(&m, &out, &[]);
    assert!(a.status.success(), "{}", stderr(&a));
    let s = streams(&out);
    assert_eq!(s.len(), 1);
    assert_eq!(sha256(&s[0]), want["sha256"].as_str().expect("sha"));
    assert_eq!(
        std::fs::metadata(&s[0]).expect("meta").len(),
        4 * want["ids"].as_u64().expect("ids")
    );
    let (b, reference) = run(
        &m,
        &dir.join("ref"),
        &["--data", &fixture("tables/windows_tok.npz")],
    );
    assert!(b.status.success(), "{}", stderr(&b));
    assert_eq!(got, reference, "the windows differ from nanoGPT's");

    // Unchanged: reused. Changed: tokenized again, beside the old stream.
    let (c, again) = run(&m, &out, &[]);
    assert!(stderr(&c).contains("ids, reused"), "{}", stderr(&c));
    assert_eq!(again, got);
    std::fs::write(
        &text,
        "To be, or not to be, that is the question.\n".repeat(500),
    )
    .expect("write");
    let (d, _) = run(&m, &out, &[]);
    assert!(d.status.success(), "{}", stderr(&d));
    assert!(stderr(&d).contains("ids, written"), "{}", stderr(&d));
    assert_eq!(streams(&out).len(), 2);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A string column of a `datasets` directory, each row tokenized and the
/// rows joined in order, as `tokenizers` does it row by row.
#[test]
fn a_text_column_is_tokenized_row_by_row() {
    let dir = common::temp("tables", "notes");
    let data = format!(
        "tokens(path: \"{}\", column: \"note\", tokenizer: \"{}\", seq: 16, eval: 0.0)",
        fixture("tables/ds"),
        fixture("tables/tiny-tokenizer.json")
    );
    let m = model(&dir, 320, &data);
    let out = dir.join("run");
    let (a, _) = run(&m, &out, &["--steps", "1"]);
    assert!(a.status.success(), "{}", stderr(&a));
    let s = streams(&out);
    assert_eq!(
        sha256(&s[0]),
        expected()["notes_sha256"].as_str().expect("sha")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each bad input is an error naming the file (and the place), from `check`
/// where the schema, metadata or tokenizer tells, else from the conversion
/// on `run`, which leaves nothing in `tokens/`.
#[test]
fn bad_tables_and_tokenizers_are_clear_errors() {
    let dir = common::temp("tables", "bad");
    let garbage = dir.join("broken.json");
    std::fs::write(&garbage, "{\"model\": {\"type\": \"BPE\", \"vocab\": 7").expect("write");
    let text = dir.join("in.txt");
    std::fs::write(&text, "plenty of words here\n".repeat(100)).expect("write");
    let tok = fixture("tables/tiny-tokenizer.json");
    let cases: Vec<(String, usize, &str, Vec<&str>)> = vec![
        (
            format!("tokens(path: \"{}\")", fixture("tables/floats.parquet")),
            256,
            "E0304",
            vec!["floats.parquet", "column `input_ids` is list<float64>"],
        ),
        (
            format!(
                "tokens(path: \"{}\", column: \"ids\")",
                fixture("tables/ids.parquet")
            ),
            256,
            "E0304",
            vec!["has no column `ids`", "`note`, `input_ids`, `score`"],
        ),
        (
            format!(
                "tokens(path: \"{}\", column: \"note\")",
                fixture("tables/ids.parquet")
            ),
            256,
            "E0304",
            vec!["column `note` holds text", "tokenizer"],
        ),
        (
            format!(
                "tokens(path: \"{}\", tokenizer: \"{tok}\")",
                fixture("tables/ids.parquet")
            ),
            320,
            "E0304",
            vec!["already holds token ids"],
        ),
        (
            "tokens(path: \"in.txt\")".to_string(),
            256,
            "E0304",
            vec!["in.txt", "is text, not token ids"],
        ),
        (
            format!(
                "tokens(path: \"in.txt\", tokenizer: \"{}\")",
                garbage.display()
            ),
            320,
            "E0304",
            vec!["broken.json", "not a usable tokenizer"],
        ),
        (
            format!("tokens(path: \"in.txt\", tokenizer: \"{tok}\")"),
            256,
            "E0306",
            vec!["gives ids up to 319", "vocabulary of 256"],
        ),
        (
            format!(
                "tokens(path: \"{}\")",
                fixture("tables/late_bad_id.parquet")
            ),
            256,
            "E0306",
            vec!["late_bad_id.parquet", "holds id 300"],
        ),
    ];
    for (i, (data, vocab, code, says)) in cases.iter().enumerate() {
        let d = dir.join(format!("c{i}"));
        std::fs::create_dir_all(&d).expect("mkdir");
        std::fs::copy(&text, d.join("in.txt")).expect("copy");
        let m = model(&d, *vocab, data);
        let c = check(&m);
        let err = stderr(&c).replace(['│', '\n'], " ");
        let err = err.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(!c.status.success(), "{data}: {err}");
        assert!(err.contains(code), "{data}: {err}");
        for s in says {
            assert!(err.contains(s), "{data}: wanted {s:?} in {err}");
        }
    }
    // Without statistics only the conversion sees the id: it stops the run
    // before step 1 with the row and position, and writes no stream.
    let d = dir.join("late");
    std::fs::create_dir_all(&d).expect("mkdir");
    let m = model(
        &d,
        256,
        &format!(
            "tokens(path: \"{}\")",
            fixture("tables/late_bad_id_nostats.parquet")
        ),
    );
    assert!(check(&m).status.success());
    let out = d.join("run");
    let (r, _) = run(&m, &out, &[]);
    let err = stderr(&r);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert!(
        err.contains("late_bad_id_nostats.parquet")
            && err.contains("id 300 at row 399, position 0")
            && err.contains("outside the vocabulary of 256"),
        "{err}"
    );
    let said = format!("{}{err}", String::from_utf8_lossy(&r.stdout));
    assert!(!said.contains("1/3"), "no step ran: {said}");
    let left: Vec<_> = std::fs::read_dir(out.join("tokens"))
        .expect("tokens dir")
        .collect();
    assert!(left.is_empty(), "nothing half-written: {left:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Parquet and Arrow files are untrusted input: 300 corruptions of each
/// (bytes overwritten, the file cut short) are errors or clean reads of
/// `check`'s inspection and of the conversion, never a panic that escapes.
#[test]
fn corrupted_tables_are_errors_not_crashes() {
    use shardc::data::convert::{Origin, Recipe};
    let dir = common::temp("tables", "fuzz");
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for (name, arrow) in [
        ("tables/ids.parquet", false),
        ("tables/ds/data-00000-of-00002.arrow", true),
    ] {
        let good = std::fs::read(fixture(name)).expect("fixture");
        for i in 0..300 {
            let mut b = good.clone();
            if i % 3 == 0 {
                b.truncate((next() as usize) % b.len());
            } else {
                for _ in 0..1 + next() % 8 {
                    let at = (next() as usize) % b.len();
                    b[at] = next() as u8;
                }
            }
            let p = dir.join(if arrow { "f.arrow" } else { "f.parquet" });
            std::fs::write(&p, &b).expect("write");
            let origin = if arrow {
                Origin::Arrow(vec![p.clone()])
            } else {
                Origin::Parquet(vec![p.clone()])
            };
            let r = Recipe {
                origin,
                column: None,
                tokenizer: None,
            };
            let _ = r.inspect();
            let out = dir.join(format!("run{i}"));
            let _ = r.convert(&out, 256, &mut |_, _| {});
            let _ = std::fs::remove_dir_all(&out);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
