//! `shardc run` as a process: `--data`, bad input that must leave nothing behind,
//! and a process killed (SIGKILL) in the middle of writing a checkpoint.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CLS: &str = "import nn\nmesh m(data: 2)\nmodel C {\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { a(x) }\n}\n";

fn shardc() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shardc"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    // These tests write their models and checkpoints to the temporary directory
    // and name the repository's data files absolutely: grant both (the access
    // policy itself is tested in tests/access.rs).
    c.arg("--allow-path")
        .arg(std::env::temp_dir())
        .arg("--allow-path")
        .arg(env!("CARGO_MANIFEST_DIR"));
    c
}

mod common;

fn temp(name: &str) -> PathBuf {
    common::temp("cli", name)
}

use common::losses;

/// `--data` replaces the file's source: the run trains on the array file, and the
/// same arrays through `data: arrays(...)` give the same losses.
#[test]
fn data_flag_trains_on_the_array_file() {
    let dir = temp("data");
    let model = dir.join("cls.shard");
    std::fs::write(&model, format!("{CLS}train C on m {{ data: synthetic(classes: 3), batch: 4, steps: 6, optimizer: sgd(lr: 0.3) }}\n")).expect("write");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ui/data/cls_steps.safetensors");
    let out = shardc()
        .args(["run", "--quiet", "--data"])
        .arg(&data)
        .arg("--dump-losses")
        .arg(dir.join("a.json"))
        .arg("--out")
        .arg(dir.join("run"))
        .arg(&model)
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inline = dir.join("inline.shard");
    std::fs::write(&inline, format!("{CLS}train C on m {{ data: arrays(path: \"{}\"), batch: 4, steps: 6, optimizer: sgd(lr: 0.3) }}\n", data.display())).expect("write");
    let out = shardc()
        .args(["run", "--quiet", "--dump-losses"])
        .arg(dir.join("b.json"))
        .arg("--out")
        .arg(dir.join("run"))
        .arg(&inline)
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (a, b) = (losses(&dir.join("a.json")), losses(&dir.join("b.json")));
    assert_eq!(a.len(), 6);
    assert_eq!(a, b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A missing or mis-shaped `--data` file is a diagnostic, exit status 1, and no run
/// directory or loss file is written.
#[test]
fn bad_data_is_a_diagnostic_and_writes_nothing() {
    let dir = temp("bad");
    let model = dir.join("cls.shard");
    std::fs::write(&model, format!("{CLS}train C on m {{ data: synthetic(classes: 3), batch: 4, steps: 6, optimizer: sgd(lr: 0.3) }}\n")).expect("write");
    for (file, code, says) in [
        ("tests/ui/data/nope.npz", "E0304", "no such file"),
        ("tests/ui/data/corrupt.npz", "E0304", "not a readable .npz"),
        ("tests/ui/data/cls_wide.npz", "E0305", "[4, 7]"),
        (
            "tests/ui/data/cls_label_range.npz",
            "E0306",
            "holds the id 3",
        ),
    ] {
        let out = shardc()
            .args(["run", "--data", file, "--dump-losses"])
            .arg(dir.join("l.json"))
            .arg("--out")
            .arg(dir.join("run"))
            .arg(&model)
            .stderr(Stdio::piped())
            .output()
            .expect("spawn");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{file}: {err}");
        assert!(err.contains(code) && err.contains(says), "{file}: {err}");
        assert!(!dir.join("l.json").exists() && !dir.join("run").exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGKILL while a checkpoint is half-written: the last complete checkpoint still
/// resumes, and the resumed losses equal an uninterrupted run's bit for bit (40
/// steps straight against 20, a kill, and 20 more after `--resume`).
#[test]
fn killed_during_a_save_resumes_from_the_last_good_checkpoint() {
    let dir = temp("kill");
    let write = |name: &str, ckpt: &Path| {
        let f = dir.join(name);
        std::fs::write(&f, format!("{CLS}train C on m {{ data: synthetic(classes: 3), batch: 8, steps: 40, seed: 5, optimizer: adam(lr: 0.01), checkpoint: {{ every: 10, keep: 2, dir: \"{}\" }} }}\n", ckpt.display())).expect("write");
        f
    };
    let straight = write("a.shard", &dir.join("ckpt-a"));
    let out = shardc()
        .args(["run", "--quiet", "--dump-losses"])
        .arg(dir.join("a.json"))
        .arg("--out")
        .arg(dir.join("run"))
        .arg(&straight)
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = losses(&dir.join("a.json"));

    let ckpt = dir.join("ckpt-b");
    let killed = write("b.shard", &ckpt);
    // Every save pauses after writing its tensors and before its manifest; kill the
    // process during the third one (step 30), after 20 steps are safely saved.
    let mut child = shardc()
        .args(["run", "--quiet", "--out"])
        .arg(dir.join("run"))
        .arg(&killed)
        .env("SHARDC_FAULT_SAVE_PAUSE_MS", "1500")
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(120);
    let half = loop {
        let tmp = std::fs::read_dir(&ckpt).ok().and_then(|rd| {
            rd.filter_map(|e| e.ok()).map(|e| e.path()).find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(".tmp-step-00000030"))
                    && p.join("tensors.safetensors").exists()
            })
        });
        if let Some(t) = tmp {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "the run never reached its third save"
        );
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the run ended early"
        );
        std::thread::sleep(Duration::from_millis(5));
    };
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    assert!(
        half.exists(),
        "killed mid-save: the half-written directory is left"
    );
    assert!(!half.join("manifest.json").exists());
    assert!(!ckpt.join("step-00000030").exists());
    assert!(ckpt.join("step-00000020/manifest.json").exists());

    let out = shardc()
        .args(["run", "--quiet", "--resume", "--dump-losses"])
        .arg(dir.join("b.json"))
        .arg("--out")
        .arg(dir.join("run"))
        .arg(&killed)
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rest = losses(&dir.join("b.json"));
    // 40 straight = 20 + kill + resume 20, bit for bit.
    assert_eq!(rest, all[20..].to_vec(), "resumed from step 20");
    assert!(
        !half.exists(),
        "the next save clears what the killed process left"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run whose plan does not fit in this machine's memory is refused before
/// anything is allocated, with the plan shown (here GPT-3 175B on 1024 devices).
#[test]
fn a_run_that_cannot_fit_is_refused_with_its_plan() {
    let out = shardc()
        .args(["run", "examples/gpt3_175b.shard"])
        .output()
        .expect("shardc runs");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("1024 devices") && stderr.contains("nothing was allocated"),
        "{stderr}"
    );
    assert!(
        stdout.contains("params") && stdout.contains("rank 7"),
        "{stdout}"
    );
    // 16 microbatches: the timeline's two-digit labels keep their own cells.
    assert!(
        stdout.contains("F15 ") && !stdout.contains("F10B"),
        "{stdout}"
    );
    // `--f64` holds every float in f64 whatever the precision: twice the
    // plan of an f32 run (62.1 GiB per device), not of this bf16 one.
    let out = shardc()
        .args(["run", "examples/gpt3_175b.shard", "--f64"])
        .output()
        .expect("shardc runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("1024 devices × 124.2 GiB each"), "{stderr}");
}

/// W0002 says a declared float type is not what the run holds: an `f64`
/// weight in an f32 run. Under `--f64` the run holds it (and every float) in
/// f64, so the warning does not apply there.
#[test]
fn run_f64_holds_an_f64_weight_without_warning() {
    let dir = temp("f64");
    let model = dir.join("w.shard");
    std::fs::write(
        &model,
        "mesh m(data: 2)\nmodel W {\n  w: f64[6, 3] init normal(0.1)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { cast(cast(x, f64) @ w, f32) }\n}\ntrain W on m { data: synthetic(classes: 3), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }\n",
    )
    .expect("write");
    let run = |f64: bool| {
        let mut c = shardc();
        c.args(["run", "--quiet", "--out"])
            .arg(dir.join(format!("out{f64}")))
            .arg(&model);
        if f64 {
            c.arg("--f64");
        }
        let out = c.output().expect("shardc runs");
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(out.status.success(), "{stderr}");
        stderr
    };
    let plain = run(false);
    assert!(
        plain.contains("W0002") && plain.contains("holds it in f32"),
        "{plain}"
    );
    let f64 = run(true);
    assert!(!f64.contains("W0002"), "{f64}");
}

/// `run --watch`: a broken edit saved during the run is reported and the run goes
/// on; a good one (a new learning rate) applies from a later step, said once.
#[test]
fn run_watch_applies_a_saved_edit_in_flight() {
    use std::io::{BufRead, BufReader};
    use std::sync::mpsc;
    let dir = temp("live");
    let model = dir.join("m.shard");
    let text = |lr: &str| {
        format!("{CLS}train C on m {{ data: synthetic(classes: 3), batch: 4, steps: 1000000, log_every: 100, optimizer: sgd(lr: {lr}) }}\n")
    };
    std::fs::write(&model, text("0.1")).expect("write");
    let mut child = shardc()
        .args(["run", "--watch", "--out"])
        .arg(dir.join("run"))
        .arg(&model)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn");
    let (tx, rx) = mpsc::channel::<String>();
    let err = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    // Lines until one satisfies `want` (a generous deadline: this is no timing test).
    let mut wait_for = |want: &dyn Fn(&str) -> bool| -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        while let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            seen.push(l.clone());
            if want(&l) {
                return l;
            }
        }
        panic!("not seen; the output was:\n{}", seen.join("\n"));
    };
    wait_for(&|l| l.starts_with("step   100/"));
    std::fs::write(&model, text("0.1 +")).expect("write");
    wait_for(&|l| l.contains("edit not applied: the training goes on"));
    std::fs::write(&model, text("0.001")).expect("write");
    wait_for(&|l| l.contains("edit accepted as reload 1: lr 1e-1 → 1e-3"));
    let applied = wait_for(&|l| l.contains(": reload 1: lr 1e-1 → 1e-3"));
    let at: usize = applied
        .trim_start_matches("step")
        .trim()
        .split(':')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .expect("the step it applied at");
    // The next plain log line trains at the new rate.
    let line = wait_for(&|l| l.contains("/1000000  loss"));
    assert!(line.contains("lr 1.000e-3"), "{line}");
    assert!(at > 100, "{applied}");
    child.kill().expect("kill");
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

/// `log_every` and `batch` may name constants: the run prints steps 1, 2, 4 of
/// 4 with `log_every: LOG` (LOG = 2), and trains on the whole batch.
#[test]
fn constant_batch_and_log_every() {
    let dir = temp("consts");
    let model = dir.join("c.shard");
    std::fs::write(&model, format!("{CLS}const BATCH = 8\nconst LOG = 2\ntrain C on m {{ data: synthetic(classes: 3), batch: BATCH, steps: 4, log_every: LOG, optimizer: sgd(lr: 0.3) }}\n")).expect("write");
    let out = shardc()
        .arg("run")
        .arg(&model)
        .arg("--out")
        .arg(dir.join("run"))
        .output()
        .expect("spawn");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("batch 8"), "{err}");
    let steps: Vec<&str> = err
        .lines()
        .filter_map(|l| l.strip_prefix("step "))
        .filter_map(|l| l.split('/').next())
        .map(str::trim)
        .collect();
    assert_eq!(steps, ["1", "2", "4"], "{err}");
}

/// `check --format short`: one `file:line:col: severity[CODE]: message` line per
/// diagnostic on stdout (what Vim's `errorformat`, Emacs and CI read), the same
/// diagnostics as `--format json`, in the same order and places.
#[test]
fn check_format_short_is_one_line_per_diagnostic() {
    // A note, an error, and two errors.
    let files = [
        "tests/ui/note_return_type_gather.shard",
        "tests/ui/unknown_axis_in_psum.shard",
        "examples/broken_mlp.shard",
    ];
    let run = |format: &str| {
        let out = shardc()
            .args(["check", "--format", format])
            .args(files)
            .output()
            .expect("spawn");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, short, err) = run("short");
    assert_eq!(code, Some(1), "{short}{err}");
    let (_, json, _) = run("json");
    let json: serde_json::Value = serde_json::from_str(&json).expect("json");
    let diags: Vec<&serde_json::Value> = json
        .as_array()
        .expect("one object per file")
        .iter()
        .flat_map(|f| f["diagnostics"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(diags.len(), 4, "{json}");
    let lines: Vec<&str> = short.lines().collect();
    assert_eq!(lines.len(), diags.len(), "{short}");
    for (line, d) in lines.iter().zip(diags) {
        let p = &d["primary"];
        let want = format!(
            "{}:{}:{}: {}[{}]: {}",
            p["file"].as_str().unwrap_or(""),
            p["line"],
            p["column"],
            d["severity"].as_str().unwrap_or(""),
            d["code"].as_str().unwrap_or(""),
            d["message"].as_str().unwrap_or("").replace('\n', " "),
        );
        assert!(line.starts_with(&want), "{line}\nwant {want}");
        assert!(files.iter().any(|f| line.starts_with(f)), "{line}");
        assert!(line.ends_with(')') || !line.contains(" ("), "{line}");
    }
    assert!(lines.iter().any(|l| l.contains(": error[E")), "{short}");
    assert!(lines.iter().any(|l| l.contains(": note[N")), "{short}");
    // The summary stays off stdout.
    assert!(err.contains("error"), "{err}");
    // A clean file prints nothing on stdout.
    let clean = temp("short").join("clean.shard");
    std::fs::write(&clean, "mesh m(d: 2)\n").expect("write");
    let out = shardc()
        .args(["check", "--format", "short"])
        .arg(&clean)
        .output()
        .expect("spawn");
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// `shardc lsp` takes what editors' clients add to its command line
/// (vscode-languageclient: `--stdio`, `--clientProcessId=PID`) and the
/// documented extra arguments, and serves: it answers `initialize`.
#[test]
fn lsp_accepts_the_arguments_clients_pass() {
    use std::io::{Read, Write};
    let frame = |v: serde_json::Value| {
        let body = v.to_string();
        format!("Content-Length: {}\r\n\r\n{body}", body.len())
    };
    for args in [
        &["lsp", "--stdio"][..],
        &["lsp", "--stdio", "--clientProcessId=4242"],
        &["lsp", "--strict", "--stdio", "--clientProcessId", "4242"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_shardc"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut input = String::new();
        input.push_str(&frame(serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}, "processId": null, "rootUri": null}})));
        input.push_str(&frame(
            serde_json::json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}),
        ));
        input.push_str(&frame(
            serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "shutdown"}),
        ));
        input.push_str(&frame(
            serde_json::json!({"jsonrpc": "2.0", "method": "exit"}),
        ));
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input.as_bytes())
            .expect("write");
        let start = Instant::now();
        let status = loop {
            if let Some(s) = child.try_wait().expect("wait") {
                break s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{args:?}: no exit"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut out = String::new();
        let mut err = String::new();
        let _ = child
            .stdout
            .take()
            .expect("stdout")
            .read_to_string(&mut out);
        let _ = child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut err);
        assert!(status.success(), "{args:?}: {status}\n{err}");
        assert!(
            out.contains("\"capabilities\"") && out.contains("\"hoverProvider\""),
            "{args:?}: {out}\n{err}"
        );
    }
}

/// `model` is a keyword, so it cannot name a mesh axis as JAX's
/// `('data', 'model')` does: the syntax error says so and offers names. (Not
/// a UI test: the tree-sitter grammar, a highlighter, does not reserve
/// keywords there, and tests/grammars.rs holds every UI file to pest's
/// verdict.)
#[test]
fn a_keyword_where_a_name_belongs_says_so() {
    let dir = temp("keyword");
    let f = dir.join("kw.shard");
    std::fs::write(
        &f,
        "import nn\nmesh m(data: 2, model: 2)\nmodel C {\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { a(x) }\n}\n",
    )
    .expect("write");
    let out = shardc().arg("check").arg(&f).output().expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "expected a name, found `model`, a keyword: name it otherwise (`mp` or `model_`)"
        ),
        "{err}"
    );
}

/// `plan --model`: one model's plan of a file with several `train`
/// declarations; a misspelt model is an error with a did-you-mean.
#[test]
fn plan_of_one_model() {
    let both = shardc()
        .args(["plan", "models/fsdp_mlp.shard"])
        .output()
        .expect("runs");
    let both = String::from_utf8_lossy(&both.stdout).to_string();
    assert!(both.contains("plan: DPClassifier") && both.contains("plan: FSDPClassifier"));
    let one = shardc()
        .args(["plan", "models/fsdp_mlp.shard", "--model", "FSDPClassifier"])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&one.stdout);
    assert!(one.status.success(), "{text}");
    assert!(
        text.contains("plan: FSDPClassifier") && !text.contains("plan: DPClassifier"),
        "{text}"
    );
    let bad = shardc()
        .args(["plan", "models/fsdp_mlp.shard", "--model", "FSDPClasifier"])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{err}");
    assert!(err.contains("did you mean `FSDPClassifier`?"), "{err}");
}

/// `plan --device`: a verdict per stage and a step estimate; exit 1 when a
/// stage does not fit (for scripts), a clear error for an unknown device.
#[test]
fn plan_against_a_device() {
    let out = shardc()
        .args(["plan", "models/gptj.shard", "--device", "a100-40g"])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("device: a100-40g"), "{text}");
    assert!(text.contains("  fits: peak 2.0 GiB"), "{text}");
    assert!(text.contains("MFU ≈"), "{text}");
    let out = shardc()
        .args(["plan", "examples/gpt3_175b.shard", "--device", "h100-80g"])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("  fits: peak 57.8 GiB on stage 0"), "{text}");
    let out = shardc()
        .args(["plan", "examples/gpt3_175b.shard", "--device", "a100-40g"])
        .output()
        .expect("runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("does not fit: peak 57.8 GiB on stage 0"),
        "{text}"
    );
    let out = shardc()
        .args(["plan", "models/gptj.shard", "--device", "h200"])
        .output()
        .expect("runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("unknown device `h200`: use one of h100-80g"),
        "{err}"
    );
}

/// `--mem` sets each measured figure beside the plan's: backward's
/// cotangents to the byte, and, on Linux, the process's peak resident set
/// beside the plan's `with shardc` row (the devices and shardc's own code).
#[test]
fn mem_measures_cotangents_and_the_resident_process() {
    let dir = temp("mem");
    let out = shardc()
        .args(["run", "--mem", "--steps", "1", "--out"])
        .arg(dir.join("run"))
        .arg("tests/models/gptj_small.shard")
        .output()
        .expect("spawn");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let row = |name: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.trim_start().starts_with(name))
            .map(|l| l.split_whitespace().map(String::from).collect())
            .unwrap_or_default()
    };
    let ct = row("cotangents");
    assert_eq!(ct.len(), 5, "{text}");
    assert_eq!(ct[1..3], ct[3..5], "{text}");
    if cfg!(target_os = "linux") {
        let r = row("resident");
        assert_eq!(r.len(), 5, "{text}");
        assert!(r[2].ends_with("iB") && r[4].ends_with("iB"), "{text}");
        let plan = shardc()
            .args(["plan", "tests/models/gptj_small.shard"])
            .output()
            .expect("spawn");
        let plan = String::from_utf8_lossy(&plan.stdout);
        assert!(plan.contains("  with shardc "), "{plan}");
    }
}

/// `--device`: a name that is no device is a usage error; `cuda` on a
/// binary built without the feature says what is missing and how to build
/// it, in one line, before anything compiles or runs.
#[test]
fn device_cuda_without_the_feature_exits_2_with_one_line() {
    let refused = |device: &str| {
        let out = shardc()
            .args([
                "run",
                "models/fsdp_mlp.shard",
                "--steps",
                "1",
                "--device",
                device,
            ])
            .output()
            .expect("spawn");
        assert_eq!(out.status.code(), Some(2), "{device}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = refused("tpu");
    assert!(
        err.contains("`tpu` is not a device: `cpu`, `cuda` or `cuda:N`"),
        "{err}"
    );
    if cfg!(feature = "cuda") {
        return;
    }
    let err = refused("cuda:1");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("built without CUDA") && err.contains("scripts/build-cuda.sh"),
        "{err}"
    );
}

/// `--init` from a bf16 file (as most pretrained checkpoints are): widened to
/// the run's floats, the same losses as the f32 file rounded to bf16. A file that
/// misses parameters names every one of them; tensors the model does not have
/// are named in a warning, with the nearest parameter.
#[test]
fn init_reads_bf16_and_names_every_missing_and_extra_tensor() {
    use safetensors::tensor::{Dtype, TensorView};
    let dir = temp("init");
    let model = dir.join("c.shard");
    std::fs::write(&model, format!("{CLS}train C on m {{ data: synthetic(classes: 3), batch: 4, steps: 3, optimizer: sgd(lr: 0.3) }}\n")).expect("write");
    let run = |extra: &[&std::ffi::OsStr], losses: &str| {
        shardc()
            .args(["run", "--quiet", "--dump-losses"])
            .arg(dir.join(losses))
            .args(extra)
            .arg("--out")
            .arg(dir.join(losses).with_extension("run"))
            .arg(&model)
            .output()
            .expect("spawn")
    };
    let f32_file = dir.join("init.safetensors");
    let out = run(&["--dump-init".as_ref(), f32_file.as_os_str()], "a.json");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The same tensors rounded to bf16 (round to nearest even), plus one the
    // model does not have.
    let bytes = std::fs::read(&f32_file).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let bf16 = |v: &TensorView| -> Vec<u8> {
        v.data()
            .chunks_exact(4)
            .flat_map(|c| {
                let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]).to_bits();
                let r = ((x + 0x7fff + ((x >> 16) & 1)) >> 16) as u16;
                r.to_le_bytes()
            })
            .collect()
    };
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.shape().to_vec(), bf16(&v)))
        .collect();
    tensors.push(("a.bb".into(), vec![3], vec![0; 6]));
    let write = |path: &Path, tensors: &[(String, Vec<usize>, Vec<u8>)]| {
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, s, b)| {
                (
                    n.clone(),
                    TensorView::new(Dtype::BF16, s.clone(), b).expect("view"),
                )
            })
            .collect();
        safetensors::tensor::serialize_to_file(views, None, path).expect("write");
    };
    let half = dir.join("bf16.safetensors");
    write(&half, &tensors);
    let out = run(&["--init".as_ref(), half.as_os_str()], "b.json");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("1 tensor(s) the model has no parameter for")
            && err.contains("`a.bb` (did you mean `a.b`?)"),
        "{err}"
    );
    let (a, b) = (losses(&dir.join("a.json")), losses(&dir.join("b.json")));
    for (x, y) in a.iter().zip(&b) {
        assert!(((x - y) / x).abs() < 2e-2, "{x} vs {y}");
    }
    assert_ne!(a, b, "bf16 rounding changes the start");
    // Every parameter the file lacks, in one error.
    tensors.retain(|(n, _, _)| n == "a.bb");
    write(&half, &tensors);
    let out = run(&["--init".as_ref(), half.as_os_str()], "c.json");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no tensor for 2 parameter(s)")
            && err.contains("`a.w` [6, 3]")
            && err.contains("`a.b` [3] (the file has `a.bb`)"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Notes are short: each quotes the op's line with its label and names the
/// place its layer was instantiated on one line, never the lines between. A
/// file with 9 inserted gathers prints under 80 lines; GPT-3's 5 notes, each
/// inside a block instantiated 17 lines below it, quote neither the lines
/// between nor the model's other declarations.
#[test]
fn notes_quote_the_op_and_name_the_instantiation() {
    let dir = temp("notes");
    let lets: Vec<String> = (0..9)
        .map(|i| format!("    let a{i}: f32[B@dp, 8@_] = x * {i}.0"))
        .collect();
    let sum: Vec<String> = (0..9).map(|i| format!("a{i}")).collect();
    let file = dir.join("nine.shard");
    std::fs::write(
        &file,
        format!(
            "import nn\nmesh m(dp: 2, tp: 2)\nmodel M {{\n  out = Dense(8 -> 3)\n  fn forward(x: f32[B@dp, 8@tp]) -> f32[B@dp, 3] {{\n{}\n    out({})\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 3), batch: 8, steps: 2, optimizer: adam(lr: 0.01) }}\n",
            lets.join("\n"),
            sum.join(" + ")
        ),
    )
    .expect("write");
    let o = shardc().arg("check").arg(&file).output().expect("check");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("clean (9 notes)"), "{err}");
    assert!(
        err.lines().count() < 80,
        "{} lines:\n{err}",
        err.lines().count()
    );
    let o = shardc()
        .args(["check", "examples/gpt3_175b.shard"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("check");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("clean (5 notes)"), "{err}");
    assert_eq!(
        err.matches("instantiated here: examples/gpt3_175b.shard:40:37")
            .count(),
        4,
        "{err}"
    );
    assert!(!err.contains("model GPT3 {"), "{err}");
    assert!(err.lines().count() < 40, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `shardc lower` counts a step's collectives as `shardc plan` does (one
/// count of one quantity): a dim split over two axes gathered whole is two
/// all-gathers per pass in both, and one note.
#[test]
fn lower_counts_collectives_as_plan_does() {
    for file in ["tests/ui/note_gather_two_axes.shard", "models/gptj.shard"] {
        let o = shardc().args(["lower", file]).output().expect("lower");
        let out = String::from_utf8_lossy(&o.stdout);
        let line = out
            .lines()
            .find(|l| l.starts_with("verified: "))
            .unwrap_or_else(|| panic!("{out}"));
        let said: u64 = line
            .split(", ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        let o = shardc()
            .args(["plan", "--json", file])
            .output()
            .expect("plan");
        let plans: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json");
        let counted: u64 = plans[0]["comms"]
            .as_array()
            .expect("comms")
            .iter()
            .map(|c| c["count"].as_u64().expect("count"))
            .sum();
        assert_eq!(said, counted, "{file}: {line}");
    }
}

/// `--profile` prints where a step's time goes: each op of the program
/// forward and backward, the step's own parts, and the slowest nodes at
/// their source lines; without it, nothing of the kind.
#[test]
fn profile_names_the_ops_and_their_lines() {
    let dir = temp("profile");
    let run = |profile: bool| {
        let mut c = shardc();
        c.args(["run", "tests/models/gptj_small.shard", "--steps", "3"])
            .args(["--mesh", "dp=1,mp=1", "--quiet", "--out"])
            .arg(dir.join("run"));
        if profile {
            c.arg("--profile");
        }
        let out = c.output().expect("spawn");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(true);
    assert!(err.contains("ms per step over 2 step(s)"), "{err}");
    for row in [
        "forward   causal_attention",
        "backward  causal_attention",
        "forward   layer_norm",
        "forward   loss",
        "step      optimizer",
        "step      gradient norm",
    ] {
        assert!(err.contains(row), "no `{row}` in\n{err}");
    }
    let nodes = err.split("slowest nodes").nth(1).unwrap_or_default();
    assert!(nodes.contains("gptj_small.shard:"), "{err}");
    // Its node times time nothing in a plan without a pipeline: said so.
    let plan = shardc()
        .args([
            "plan",
            "tests/models/gptj_small.shard",
            "--mesh",
            "dp=1,mp=1",
        ])
        .arg("--profile")
        .arg(dir.join("run").join("profile.json"))
        .output()
        .expect("spawn");
    assert!(plan.status.success(), "{plan:?}");
    let said = String::from_utf8_lossy(&plan.stderr);
    assert!(said.contains("no plan here has a pipeline"), "{said}");
    assert!(!run(false).contains("profile:"));
}

/// `--profile` also writes each node's times to `profile.json` in the run
/// directory (and a pipelined run prints each rank's measured idle share),
/// and `shardc plan --profile` times the pipeline's passes with
/// them; a profile of another program (here another mesh) or a file that is
/// not a profile is refused.
#[test]
fn plan_times_a_pipeline_with_a_profile() {
    let dir = temp("profile-plan");
    let file = "tests/models/t3d_small.shard";
    let out = shardc()
        .args(["run", file, "--steps", "3", "--quiet", "--profile", "--out"])
        .arg(dir.join("run"))
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{out:?}");
    let profile = dir.join("run").join("profile.json");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("profile.json"), "{err}");
    assert!(err.contains("pipeline: each rank idle"), "{err}");
    let plan = |extra: &[&str], profile: &std::path::Path| {
        shardc()
            .args(["plan", file])
            .args(extra)
            .arg("--profile")
            .arg(profile)
            .output()
            .expect("spawn")
    };
    let ok = plan(&[], &profile);
    let text = String::from_utf8_lossy(&ok.stdout);
    assert!(ok.status.success(), "{ok:?}");
    assert!(text.contains("measured for its nodes"), "{text}");
    let other = plan(&["--mesh", "dp=1,pp=2,tp=2"], &profile);
    assert_eq!(other.status.code(), Some(2), "{other:?}");
    assert!(String::from_utf8_lossy(&other.stderr).contains("times another program"));
    let junk = dir.join("junk.json");
    std::fs::write(&junk, "{\"losses\": [1.0]}").expect("write");
    let bad = plan(&[], &junk);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("is not a profile"));
}

/// A checkpointed block's recompute runs inside the backward pass, and the
/// profile says so: the forward runs each op as often as without
/// checkpointing (its recompute is not counted as forward, where a
/// pipeline's timing would put it in the wrong pass), and the backward runs
/// them more often (the recompute). Call counts, not times.
#[test]
fn a_recompute_is_profiled_in_the_backward_pass() {
    let dir = temp("profile-recompute");
    let plain = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/models/t3d_small.shard"),
    )
    .expect("t3d_small");
    let checkpointed = plain.replace("microbatches: 4)", "microbatches: 4, checkpoint: full)");
    assert_ne!(plain, checkpointed);
    // Calls per step of each (phase, op) row of the profile table.
    let calls = |name: &str, text: &str| -> std::collections::BTreeMap<(String, String), f64> {
        let file = dir.join(name);
        std::fs::write(&file, text).expect("write");
        let out = shardc()
            .arg("run")
            .arg(&file)
            .args(["--steps", "3", "--quiet", "--profile", "--out"])
            .arg(dir.join(format!("run-{name}")))
            .output()
            .expect("spawn");
        assert!(out.status.success(), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        err.lines()
            .skip_while(|l| !l.contains("calls/step"))
            .skip(1)
            .take_while(|l| !l.contains("slowest nodes"))
            .filter_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let n = w.len();
                (n >= 5).then(|| {
                    let op = w[1..n - 3].join(" ");
                    ((w[0].to_string(), op), w[n - 3].parse().unwrap_or(f64::NAN))
                })
            })
            .collect()
    };
    let (a, b) = (
        calls("plain.shard", &plain),
        calls("ck.shard", &checkpointed),
    );
    let phase =
        |m: &std::collections::BTreeMap<(String, String), f64>, p: &str| -> Vec<(String, f64)> {
            m.iter()
                .filter(|(k, _)| k.0 == p)
                .map(|(k, v)| (k.1.clone(), *v))
                .collect()
        };
    assert!(phase(&a, "forward").len() > 3, "{a:?}");
    assert_eq!(
        phase(&a, "forward"),
        phase(&b, "forward"),
        "forward calls per step"
    );
    let back = |m: &std::collections::BTreeMap<(String, String), f64>| -> f64 {
        phase(m, "backward").iter().map(|x| x.1).sum()
    };
    assert!(back(&b) > back(&a), "backward calls: {a:?} vs {b:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
