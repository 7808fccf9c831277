//! The TensorBoard log as TensorBoard reads it: `scripts/tensorboard_read.py`
//! runs the `tensorboard` package's EventAccumulator (from PyPI, in the venv
//! `.ci/run` makes; `SHARDC_TB_PYTHON` names its python) over a run
//! directory, and every scalar of every step equals `metrics.jsonl` (as f32,
//! which is what the format holds), with the run's configuration as text. A
//! resumed run's log holds each step once.

use std::path::{Path, PathBuf};

mod common;

use common::{shardc, stderr};

/// The python with `tensorboard`, or why the test cannot run.
fn python() -> Option<PathBuf> {
    match std::env::var_os("SHARDC_TB_PYTHON") {
        Some(p) => Some(PathBuf::from(p)),
        None if std::env::var_os("SHARDC_REQUIRE_TB").is_some() => {
            panic!("SHARDC_REQUIRE_TB is set, but SHARDC_TB_PYTHON names no python")
        }
        None => {
            eprintln!(
                "skipped: set SHARDC_TB_PYTHON to a python with `tensorboard` (.ci/run does)"
            );
            None
        }
    }
}

fn read(py: &Path, dir: &Path) -> serde_json::Value {
    let o = std::process::Command::new(py)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/tensorboard_read.py"))
        .arg(dir)
        .output()
        .expect("python");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).expect("json")
}

fn metrics(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("record"))
        // The first line is the run's configuration.
        .filter(|r| r.get("config").is_none())
        .collect()
}

const MODEL: &str = "import nn
mesh m(data: 2)
model C {
  a = Dense(6 -> 8)
  b = Dense(8 -> 3)
  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { b(relu(a(x))) }
}
train C on m {
  data: synthetic(classes: 3), batch: 8, steps: 6, seed: 1
  optimizer: adam(lr: 0.01), metrics: [accuracy]
  eval: { every: 3, steps: 1 }
  checkpoint: { every: 2, dir: \"ck\" }
}
";

/// Each scalar TensorBoard finds, against the record's field.
fn compare(tb: &serde_json::Value, records: &[serde_json::Value]) {
    let pairs = [
        ("train/loss", "loss"),
        ("train/lr", "lr"),
        ("train/grad_norm", "grad_norm"),
        ("perf/step_ms", "step_ms"),
        ("perf/examples_per_s", "examples_per_s"),
        ("train/accuracy", "accuracy"),
    ];
    for (tag, field) in pairs {
        let got = tb["scalars"][tag]
            .as_array()
            .unwrap_or_else(|| panic!("no {tag}: {tb}"));
        assert_eq!(got.len(), records.len(), "{tag}: one per step");
        for (e, r) in got.iter().zip(records) {
            assert_eq!(e[0], r["step"], "{tag}");
            let want = r[field].as_f64().expect(field) as f32;
            assert_eq!(
                e[1].as_f64().expect("value") as f32,
                want,
                "{tag} at {}",
                r["step"]
            );
            assert_eq!(e[2].as_f64(), r["time"].as_f64(), "{tag}: wall time");
        }
    }
    let evals: Vec<_> = records
        .iter()
        .filter(|r| r.get("eval_loss").is_some())
        .collect();
    let got = tb["scalars"]["eval/loss"].as_array().expect("eval/loss");
    assert_eq!(got.len(), evals.len());
    for (e, r) in got.iter().zip(evals) {
        assert_eq!(e[0], r["step"]);
        assert_eq!(
            e[1].as_f64().expect("v") as f32,
            r["eval_loss"].as_f64().expect("e") as f32
        );
    }
}

#[test]
fn tensorboard_reads_every_scalar_of_every_step() {
    let Some(py) = python() else { return };
    let dir = common::temp("tensorboard", "all");
    let m = dir.join("c.shard");
    std::fs::write(&m, MODEL).expect("write");
    let out = dir.join("run");
    let o = shardc()
        .args(["run", "--quiet", "--out"])
        .arg(&out)
        .arg(&m)
        .output()
        .expect("run");
    assert!(o.status.success(), "{}", stderr(&o));
    let tb = read(&py, &out);
    let records = metrics(&out);
    assert_eq!(records.len(), 6);
    compare(&tb, &records);
    let config = tb["text"]["config"].as_str().expect("config");
    assert!(
        config.contains("training C on m") && config.contains("\"seed\": 1"),
        "{config}"
    );
    // The configuration is metrics.jsonl's first line too, the same JSON.
    let first: serde_json::Value = std::fs::read_to_string(out.join("metrics.jsonl"))
        .ok()
        .and_then(|m| serde_json::from_str(m.lines().next()?).ok())
        .expect("a first line");
    let json_part = &config[config.find('{').expect("json")..];
    let shown: serde_json::Value = serde_json::from_str(
        &json_part
            .lines()
            .map(|l| l.trim_start())
            .collect::<Vec<_>>()
            .join("\n"),
    )
    .expect("the config's JSON");
    assert_eq!(first["config"], shown);
    assert_eq!(first["config"]["model"], "C");
    assert_eq!(first["config"]["axes"]["data"], 2);
    assert!(first["config"]["plan"]["bytes_per_device"].as_f64() > Some(0.0));
    let plan = tb["text"]["plan"].as_str().expect("the plan as text");
    assert!(plan.contains("per device"), "{plan}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `log:` in the file and `--log` choose the sinks: only TensorBoard, only
/// metrics.jsonl, or neither.
#[test]
fn log_chooses_where_the_records_go() {
    let dir = common::temp("tensorboard", "sinks");
    let m = dir.join("c.shard");
    std::fs::write(
        &m,
        MODEL.replace(
            "metrics: [accuracy]",
            "metrics: [accuracy], log: [tensorboard]",
        ),
    )
    .expect("write");
    let files = |run: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(run)
            .expect("run dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != "ck" && n != "final" && !n.starts_with('.'))
            .map(|n| {
                if n.starts_with("events.out.tfevents.") {
                    "events".into()
                } else {
                    n
                }
            })
            .collect();
        v.sort();
        v
    };
    for (flag, want) in [
        (None, vec!["events"]),
        (Some("jsonl"), vec!["loss.svg", "metrics.jsonl"]),
        (
            Some("jsonl,tensorboard"),
            vec!["events", "loss.svg", "metrics.jsonl"],
        ),
        (Some("none"), vec![]),
    ] {
        let out = dir.join(format!("run-{}", flag.unwrap_or("file")));
        let mut cmd = shardc();
        cmd.args(["run", "--quiet", "--out"]).arg(&out).arg(&m);
        if let Some(f) = flag {
            cmd.args(["--log", f]);
        }
        let o = cmd.output().expect("run");
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(files(&out), want, "--log {flag:?}");
    }
    let o = shardc()
        .args(["run", "--quiet", "--log", "tensorbord"])
        .arg(&m)
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("did you mean `tensorboard`?"),
        "{}",
        stderr(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_resumed_run_logs_each_step_once() {
    let Some(py) = python() else { return };
    let dir = common::temp("tensorboard", "resume");
    let m = dir.join("c.shard");
    std::fs::write(&m, MODEL).expect("write");
    let out = dir.join("run");
    let first = shardc()
        .args(["run", "--quiet", "--steps", "5", "--out"])
        .arg(&out)
        .arg(&m)
        .output()
        .expect("run");
    assert!(first.status.success(), "{}", stderr(&first));
    // Steps 1-5 ran; the checkpoint is at 4: the resumed run redoes step 5.
    let again = shardc()
        .args(["run", "--quiet", "--resume", "--out"])
        .arg(&out)
        .arg(&m)
        .output()
        .expect("resume");
    assert!(again.status.success(), "{}", stderr(&again));
    let tb = read(&py, &out);
    assert_eq!(tb["files"], 1, "one event file");
    let records = metrics(&out);
    let steps: Vec<u64> = records
        .iter()
        .map(|r| r["step"].as_u64().expect("step"))
        .collect();
    assert_eq!(steps, vec![1, 2, 3, 4, 5, 6]);
    compare(&tb, &records);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run directory where the event file cannot be created stops the run
/// before step 1 with an error naming the file (a read-only directory; as
/// root, which writes anywhere, the fault-injection hook).
#[test]
fn an_unwritable_log_stops_the_run_before_step_1() {
    let dir = common::temp("tensorboard", "unwritable");
    let m = dir.join("c.shard");
    std::fs::write(&m, MODEL).expect("write");
    let out = dir.join("run");
    std::fs::create_dir_all(&out).expect("mkdir");
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = shardc();
    cmd.args(["run", "--out"]).arg(&out).arg(&m);
    if root {
        cmd.env("SHARDC_FAULT_EVENTS_FAIL", "1");
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    }
    let o = cmd.output().expect("run");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("events.out.tfevents.") && err.contains("ermission denied"),
        "{err}"
    );
    assert!(!err.contains("step     1"), "stopped before step 1: {err}");
    if !root {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
