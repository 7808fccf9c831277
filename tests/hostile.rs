//! Regression tests for hostile inputs (the adversarial campaign of issue 15):
//! flat chains thousands long, lines past column 65,535, huge identifiers,
//! non-UTF-8 sources, deep constant and layer chains. Every command that
//! compiles a file must answer with diagnostics — never a crash, an abort or a
//! hang (each run has a generous guard; this is not a timing test).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_shardc")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-hostile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// Run `shardc ARGS`; its exit status, or a failure naming what went wrong.
fn run(args: &[&str], dir: &Path) -> Result<i32, String> {
    // Output to a file, not a pipe: a full pipe would stall the child.
    let log = dir.join("stderr.log");
    let err_file = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let mut child = Command::new(bin())
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::from(err_file))
        .spawn()
        .map_err(|e| e.to_string())?;
    let start = Instant::now();
    loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(status) => {
                let err =
                    String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default()).into_owned();
                if err.contains("panicked") || err.contains("overflowed its stack") {
                    return Err(format!("{args:?}: {}", &err[..err.len().min(400)]));
                }
                return status
                    .code()
                    .ok_or_else(|| format!("{args:?} was killed by a signal ({status})"));
            }
            None if start.elapsed() > Duration::from_secs(120) => {
                let _ = child.kill();
                return Err(format!("{args:?} hung"));
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn model(body: &str) -> String {
    format!(
        "import nn\nmesh m(data: 2)\nmodel C {{\n  a = Dense(6 -> 8)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 8] {{ {body} }}\n}}\ntrain C on m {{ data: synthetic(classes: 8), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }}\n"
    )
}

fn hostile_files() -> Vec<(&'static str, Vec<u8>)> {
    let mut v: Vec<(&'static str, Vec<u8>)> = vec![
        ("neg", model(&format!("a({}x)", "-".repeat(10_000)))),
        ("plus", model(&format!("a(x{})", " + x".repeat(10_000)))),
        (
            "calls",
            model(&format!("a(x){}", "()".repeat(10_000))),
        ),
        (
            "dim",
            format!("const D = {}\n", vec!["1"; 30_000].join("+")),
        ),
        (
            "mesh",
            format!("mesh m(data: {})\n", vec!["1"; 100_000].join("+")),
        ),
        (
            "consts",
            (0..10_000)
                .map(|i| format!("const c{i} = c{} + 1\n", i + 1))
                .collect::<String>()
                + "const c10000 = 1\n",
        ),
        (
            "layers",
            (0..2_000)
                .map(|i| {
                    format!(
                        "layer L{i} {{\n  l = L{}()\n  fn forward(x: f32[B, 4]) -> f32[B, 4] {{ l(x) }}\n}}\n",
                        i + 1
                    )
                })
                .collect::<String>()
                + "layer L2000 {\n  fn forward(x: f32[B, 4]) -> f32[B, 4] { x }\n}\n"
                + "mesh m(d: 1)\nmodel M {\n  l = L0()\n  fn forward(x: f32[B, 4]) -> f32[B, 4] { l(x) }\n}\n"
                + "train M on m { data: synthetic(classes: 4), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }\n",
        ),
        ("column", format!("{}bogus\n", " ".repeat(70_000))),
        (
            "long_name",
            model(&format!("let {n} = x; a({n})", n = "v".repeat(70_000))),
        ),
        (
            "did_you_mean",
            format!(
                "const {}c = 1\nconst x = {}\n",
                "b".repeat(160_000),
                "b".repeat(160_001)
            ),
        ),
        (
            "comment_brackets",
            format!("// {}\nconst A = 1\n/* {} */\n", "(".repeat(300), "x".repeat(4_000_000)),
        ),
    ]
    .into_iter()
    .map(|(n, t)| (n, t.into_bytes()))
    .collect();
    v.push(("latin1", b"// caf\xe9\nconst A = 1\n".to_vec()));
    v
}

#[test]
fn hostile_sources_get_diagnostics_not_crashes() {
    let dir = scratch("sources");
    let mut bad = Vec::new();
    for (name, bytes) in hostile_files() {
        let file = format!("{name}.shard");
        std::fs::write(dir.join(&file), &bytes).expect("write");
        for cmd in [
            vec!["check", file.as_str()],
            vec!["check", "--types", file.as_str()],
            vec!["check", "--format", "json", file.as_str()],
            vec!["plan", file.as_str()],
            vec!["show", file.as_str()],
            vec!["lower", file.as_str()],
            vec!["fmt", "--check", file.as_str()],
        ] {
            match run(&cmd, &dir) {
                Ok(0..=2) => {}
                Ok(code) => bad.push(format!("{name}: {cmd:?} exited {code}")),
                Err(e) => bad.push(format!("{name}: {e}")),
            }
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// The comment's brackets and length do not count against the limits; the
/// chained constants evaluate (iteratively); a non-UTF-8 file gets E0004 with a
/// byte offset, in JSON too.
#[test]
fn hostile_sources_get_the_right_answers() {
    let dir = scratch("answers");
    let files = hostile_files();
    let get = |n: &str| {
        files
            .iter()
            .find(|f| f.0 == n)
            .map(|f| f.1.clone())
            .unwrap_or_default()
    };
    let check = |name: &str, extra: &[&str]| {
        let file = format!("{name}.shard");
        std::fs::write(dir.join(&file), get(name)).expect("write");
        let out = Command::new(bin())
            .arg("check")
            .args(extra)
            .arg(&file)
            .current_dir(&dir)
            .output()
            .expect("run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let json = |out: &str| -> serde_json::Value {
        let end = out.rfind('}').map_or(0, |i| i + 1);
        serde_json::from_str(&out[..end]).unwrap_or_default()
    };
    let (code, _) = check("comment_brackets", &[]);
    assert_eq!(
        code,
        Some(0),
        "brackets and length inside comments are not code"
    );
    let (code, _) = check("consts", &[]);
    assert_eq!(code, Some(0), "10,000 chained constants evaluate");
    for name in ["neg", "plus", "calls", "dim", "mesh"] {
        let (code, out) = check(name, &[]);
        assert_eq!(code, Some(1), "{name}");
        assert!(
            out.contains("E0003"),
            "{name}: {}",
            &out[..out.len().min(300)]
        );
    }
    let (_, out) = check("layers", &[]);
    assert!(out.contains("E0003"), "2,000 nested layers");
    let (code, out) = check("latin1", &["--format", "json"]);
    assert_eq!(code, Some(1));
    assert_eq!(json(&out)["diagnostics"][0]["code"], "E0004", "{out}");
    assert!(out.contains("byte 6"), "{out}");
}

/// Sizes past every machine are planned as the huge numbers they are and
/// refused before anything is allocated; limits are diagnostics, not panics.
#[test]
fn size_arithmetic_saturates_or_refuses() {
    let dir = scratch("sizes");
    let w = |name: &str, text: String| {
        std::fs::write(dir.join(name), text).expect("write");
        name.to_string()
    };
    let train = |mesh: &str, body: &str, opts: &str| {
        format!("import nn\nmesh m({mesh})\nmodel C {{\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] {{ {body} }}\n}}\ntrain C on m {{ data: synthetic(classes: 3), optimizer: sgd(lr: 0.1), {opts} }}\n")
    };
    let out = |args: &[&str]| {
        let o = Command::new(bin())
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("run");
        let t =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        assert!(!t.contains("panicked"), "{args:?}: {t}");
        (o.status.code(), t)
    };
    // 2^32 × 2^32 weights: 64 EiB planned, not 0 B; the run refuses.
    let big = w(
        "big.shard",
        "import nn\nmesh m(data: 2)\nmodel C {\n  a = Dense(4294967296 -> 4294967296)\n  fn forward(x: f32[B@data, 4294967296]) -> f32[B@data, 4294967296] { a(x) }\n}\ntrain C on m { data: synthetic(classes: 3), batch: 8, steps: 1, optimizer: sgd(lr: 0.1) }\n".into(),
    );
    let (code, t) = out(&["plan", &big]);
    assert_eq!(code, Some(0), "{t}");
    assert!(t.contains("EiB"), "{t}");
    let (code, t) = out(&["run", &big, "--out", "r"]);
    assert_eq!(code, Some(1), "{t}");
    assert!(t.contains("nothing was allocated"), "{t}");
    // Option limits, each a coded diagnostic.
    for (name, text, code) in [
        (
            "batch",
            train("data: 2", "a(x)", "batch: 4611686018427387904, steps: 1"),
            "E0302",
        ),
        (
            "steps",
            train("data: 2", "a(x)", "batch: 8, steps: 100000000"),
            "E0302",
        ),
        (
            "lr",
            train("data: 2", "a(x)", "batch: 8, steps: 1").replace("lr: 0.1", "lr: 1e400"),
            "E0002",
        ),
        (
            "dropout",
            train("data: 2", "a(dropout(x, -1))", "batch: 8, steps: 1"),
            "E0302",
        ),
        (
            "devices",
            train(
                "data: 100000, mp: 100000, pp: 100000",
                "a(x)",
                "batch: 100000, steps: 1",
            ),
            "E0202",
        ),
    ] {
        let f = w(&format!("{name}.shard"), text);
        let (c, t) = out(&["check", &f]);
        assert_eq!(c, Some(1), "{name}: {t}");
        assert!(t.contains(code), "{name}: {t}");
    }
    // Command-line limits.
    let ok = w("ok.shard", train("data: 2", "a(x)", "batch: 8, steps: 1"));
    let (c, t) = out(&["run", &ok, "--steps", "18446744073709551615", "--out", "r"]);
    assert_eq!(c, Some(2), "{t}");
    assert!(t.contains("steps from 1 to"), "{t}");
    let wide = w(
        "wide.shard",
        train("data: 40000", "a(x)", "batch: 40000, steps: 1"),
    );
    let (c, t) = out(&["run", &wide, "--out", "r"]);
    assert_eq!(c, Some(2), "{t}");
    assert!(t.contains("virtual mesh runs at most"), "{t}");
}

/// Files that never end or never answer: a FIFO named like a model or a text
/// corpus, `/dev/zero`, `/dev/stdin`. Each is refused before it is read.
#[cfg(unix)]
#[test]
fn fifos_and_devices_are_refused_without_reading() {
    let dir = scratch("fifo");
    for name in ["fifo.shard", "fifo.txt"] {
        let ok = Command::new("mkfifo")
            .arg(dir.join(name))
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: no mkfifo here");
            return;
        }
    }
    let model = "import nn\nmesh m(data: 2)\nmodel C {\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { a(x) }\n}\n";
    let cases = [
        ("import \"fifo.shard\"\n".to_string(), vec![], "E0102"),
        ("import \"/dev/zero.shard\"\n".to_string(), vec!["--allow-path", "/dev"], "E0102"),
        (
            format!("{model}train C on m {{ data: text(path: \"fifo.txt\"), batch: 8, steps: 1, optimizer: sgd(lr: 0.1) }}\n"),
            vec![],
            "E0304",
        ),
        (
            format!("{model}train C on m {{ data: text(path: \"/dev/zero\"), batch: 8, steps: 1, optimizer: sgd(lr: 0.1) }}\n"),
            vec!["--allow-path", "/dev"],
            "E0304",
        ),
        (
            format!("{model}train C on m {{ data: text(path: \"/dev/stdin\"), batch: 8, steps: 1, optimizer: sgd(lr: 0.1) }}\n"),
            vec!["--allow-path", "/dev"],
            "E0304",
        ),
    ];
    for (src, grant, code) in cases {
        std::fs::write(dir.join("m.shard"), &src).expect("write");
        let mut args: Vec<&str> = grant.clone();
        args.extend(["check", "m.shard"]);
        assert_eq!(run(&args, &dir), Ok(1), "{src}");
        let o = Command::new(bin())
            .args(&args)
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .output()
            .expect("run");
        let t =
            String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout);
        assert!(t.contains(code), "{src}: {t}");
    }
}
