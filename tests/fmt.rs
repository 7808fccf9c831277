//! `shardc fmt`: the formatter changes whitespace only, keeps what a program
//! means, settles in one pass, and refuses files that do not parse.

mod common;

use shardc::world::{self, Options};
use std::path::{Path, PathBuf};
use std::process::Command;

fn shard_files() -> Vec<PathBuf> {
    common::shard_files(&["models", "stdlib", "examples", "tests", "benches"])
}

/// What a compilation says, without positions (formatting moves columns and
/// removes blank lines): codes and messages, in order.
fn meaning(path: &Path, text: &str) -> Vec<String> {
    let c = world::compile_source(path, text.to_string(), &Options::default());
    c.diagnostics
        .iter()
        .map(|d| format!("{} {}", d.code.as_str(), d.message))
        .collect()
}

#[test]
fn formatting_every_shard_file_keeps_its_meaning_and_is_idempotent() {
    let files = shard_files();
    assert!(files.len() > 100, "found only {} .shard files", files.len());
    for f in files {
        // (A file that is not UTF-8 is a UI test of E0004.)
        let Ok(src) = std::fs::read_to_string(&f) else {
            continue;
        };
        let out = shardc::fmt::format(&src);
        assert_eq!(
            shardc::fmt::format(&out),
            out,
            "{}: a second pass changed the output",
            f.display()
        );
        // Whitespace only: the same characters in the same order.
        let squeeze = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
        assert_eq!(squeeze(&out), squeeze(&src), "{}", f.display());
        let before = meaning(&f, &src);
        if before.iter().any(|d| d.starts_with("E0001")) {
            continue;
        }
        assert_eq!(
            meaning(&f, &out),
            before,
            "{}: formatting changed what it says",
            f.display()
        );
        // The checked-in models, stdlib and examples are formatted.
        let rel = f.strip_prefix(env!("CARGO_MANIFEST_DIR")).unwrap_or(&f);
        if !rel.starts_with("tests/ui") {
            assert_eq!(
                out,
                src,
                "{} is not formatted (run `shardc fmt`)",
                rel.display()
            );
        }
    }
}

#[test]
fn messy_input_comes_out_in_house_style() {
    let lines = |l: &[&str]| l.iter().map(|x| format!("{x}\n")).collect::<String>();
    let messy = lines(&[
        "mesh   m(dp:2)   ",
        "",
        "",
        "",
        "model M{",
        "w:f32[4,8] init normal(0.02)",
        "      b    : f32[8] init zeros   // aligned by hand: kept",
        "fn forward(x: f32[B@dp,4] )->f32[B@dp,8]{",
        "let h=x @ w",
        "    h + b",
        "}",
        "}",
        "train M on m { data: synthetic(classes: 8), batch: 4, steps: 1,",
        "               optimizer: sgd(lr: 0.1) }",
        "",
    ]);
    let want = lines(&[
        "mesh   m(dp: 2)",
        "",
        "model M {",
        "  w: f32[4, 8] init normal(0.02)",
        "  b    : f32[8] init zeros   // aligned by hand: kept",
        "  fn forward(x: f32[B@dp, 4]) -> f32[B@dp, 8] {",
        "    let h = x @ w",
        "    h + b",
        "  }",
        "}",
        "train M on m { data: synthetic(classes: 8), batch: 4, steps: 1,",
        "  optimizer: sgd(lr: 0.1) }",
    ]);
    let got = shardc::fmt::format(&messy);
    assert_eq!(got, want, "\n--- got ---\n{got}\n--- want ---\n{want}");
    let p = Path::new("messy.shard");
    assert_eq!(meaning(p, &messy), meaning(p, &got));
    assert!(
        meaning(p, &got).iter().all(|d| !d.starts_with('E')),
        "{:?}",
        meaning(p, &got)
    );
}

#[test]
fn block_comments_and_strings_are_left_alone() {
    let src = "/* a comment\n   that   spans\n      lines */\nmesh m(d: 2)\n// a  line   comment ,x\nconst S = \"a  ,b\" /* c  ,d */\n";
    let got = shardc::fmt::format(src);
    assert_eq!(got, src);
}

fn shardc(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("shardc runs");
    if let Some(s) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(s.as_bytes())
            .expect("write stdin");
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().expect("shardc exits");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cli_check_rewrite_stdin_and_syntax_errors() {
    let dir = std::env::temp_dir().join(format!("shardc-fmt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let messy = "mesh m(d: 2)\nmodel M {\nw: f32[4,4] init zeros\nfn forward(x: f32[B@d, 4]) -> f32[B@d, 4] { x @ w }\n}\n";
    let file = dir.join("m.shard");
    std::fs::write(&file, messy).expect("write");
    let f = file.to_str().expect("utf-8 path");

    let (code, out, _) = shardc(&["fmt", "--check", f], None);
    assert_eq!(code, 1, "--check on an unformatted file");
    assert!(out.contains("is not formatted"), "{out}");
    assert_eq!(
        std::fs::read_to_string(&file).expect("read"),
        messy,
        "--check wrote"
    );

    let (code, out, _) = shardc(&["fmt", f], None);
    assert_eq!(code, 0);
    assert!(out.contains("formatted"), "{out}");
    let formatted = std::fs::read_to_string(&file).expect("read");
    assert_eq!(formatted, shardc::fmt::format(messy));
    assert_eq!(shardc(&["fmt", "--check", f], None).0, 0, "formatted now");

    let (code, out, _) = shardc(&["fmt", "-"], Some(messy));
    assert_eq!(
        (code, out.as_str()),
        (0, formatted.as_str()),
        "stdin to stdout"
    );

    let broken = "model M {\n  fn forward(x: f32[4]) -> f32[4] {\n    x +\n";
    let bad = dir.join("bad.shard");
    std::fs::write(&bad, broken).expect("write");
    let (code, _, err) = shardc(&["fmt", bad.to_str().expect("utf-8")], None);
    assert_eq!(code, 2, "a file that does not parse: {err}");
    assert!(
        err.contains("E0001") && err.contains("does not parse"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(&bad).expect("read"),
        broken,
        "left alone"
    );
    // An import's syntax error is the import's: the importing file is formatted.
    std::fs::write(dir.join("lib.shard"), broken).expect("write");
    let main = dir.join("main.shard");
    std::fs::write(&main, "import \"lib.shard\"\nmesh m(d:2)\n").expect("write");
    let (code, _, err) = shardc(&["fmt", main.to_str().expect("utf-8")], None);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        std::fs::read_to_string(&main).expect("read"),
        "import \"lib.shard\"\nmesh m(d: 2)\n"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn trailing_space_after_a_line_comment_is_removed() {
    let src = "mesh m(d: 2)   // a mesh   \n// alone  \t\nconst S = 4\n";
    let got = shardc::fmt::format(src);
    assert_eq!(got, "mesh m(d: 2)   // a mesh\n// alone\nconst S = 4\n");
    assert_eq!(shardc::fmt::format(&got), got);
}

#[test]
fn crlf_line_endings_stay_crlf() {
    let src = "mesh m(d:2)\r\n\r\n\r\nmodel M {\r\nw: f32[4] init zeros // c  \r\n}\r\n";
    let got = shardc::fmt::format(src);
    assert_eq!(
        got,
        "mesh m(d: 2)\r\n\r\nmodel M {\r\n  w: f32[4] init zeros // c\r\n}\r\n"
    );
    assert_eq!(shardc::fmt::format(&got), got, "idempotent");
    // An LF file stays LF.
    let lf = shardc::fmt::format(&src.replace("\r\n", "\n"));
    assert_eq!(lf, got.replace("\r\n", "\n"));
    let p = Path::new("crlf.shard");
    assert_eq!(meaning(p, src), meaning(p, &got));
}

#[test]
fn a_wrapped_signature_keeps_its_body_and_brace_in_place() {
    let lines = |l: &[&str]| l.iter().map(|x| format!("{x}\n")).collect::<String>();
    let want = lines(&[
        "mesh m(d: 2)",
        "model M {",
        "  w: f32[4, 4] init zeros",
        "  fn forward(x: f32[B@d, 4],",
        "             y: f32[B@d, 4]) -> f32[B@d, 4] {",
        "    let h = x @ w",
        "      + y",
        "      - x",
        "    let g =",
        "      h * h",
        "    g +",
        "        h",
        "  }",
        "}",
        "train M on m { data: synthetic(classes: 4), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }",
    ]);
    assert_eq!(shardc::fmt::format(&want), want, "already formatted");
    // Flattened or over-indented, it comes back to the same.
    let messy = want
        .lines()
        .map(|l| format!("{}\n", l.trim_start()))
        .collect::<String>();
    let got = shardc::fmt::format(&messy);
    let flat = want
        .replace("             y:", "y:")
        .replace("        h\n", "      h\n");
    let flat = lines(&flat.lines().collect::<Vec<_>>());
    assert_eq!(
        got,
        flat.replace("\ny: f32", "\n    y: f32"),
        "\n--- got ---\n{got}"
    );
    let p = Path::new("wrapped.shard");
    assert_eq!(meaning(p, &messy), meaning(p, &got));
    assert!(
        meaning(p, &got).iter().all(|d| !d.starts_with('E')),
        "{:?}",
        meaning(p, &got)
    );
}
