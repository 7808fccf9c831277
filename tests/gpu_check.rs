//! The GPU check's own parts that run anywhere: `scripts/gpu-check.sh
//! --dry-run` lists every run and comparison and finds its inputs, and
//! `scripts/gpu_compare.py` reads real `--dump-losses` and `--dump-grads`
//! files (here from the CPU's own kernels against the candle-only path) and
//! fails when they differ, so a GPU session's one run is not spent on a
//! broken script.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch");
    d
}

#[test]
fn dry_run_lists_every_run_and_finds_its_inputs() {
    let out_dir = scratch("gpu-check-dry");
    let out = Command::new("bash")
        .arg(root().join("scripts/gpu-check.sh"))
        .arg("--dry-run")
        .arg("--out")
        .arg(&out_dir)
        .output()
        .expect("bash runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "would run: shardc run models/shakespeare.shard --steps 10 --quiet --device cuda",
        "would compare: window: fused attention vs composed on the GPU",
        "would run: shardc run bench/gpu/window.shard --steps 10 --quiet --out",
        "would compare: gpt2_124m bf16: fused kernels vs candle's",
        "--profile",
        "gpu-check: dry run: the inputs are there; nothing ran",
    ] {
        assert!(text.contains(want), "no `{want}` in\n{text}");
    }
    let log = std::fs::read_to_string(out_dir.join("gpu-check.txt")).unwrap_or_default();
    assert!(log.contains("would run:"), "{log}");
}

#[test]
fn compare_reads_dumped_losses_and_gradients_and_fails_on_a_difference() {
    let d = scratch("gpu-compare");
    let dump = |tag: &str, own: bool, seed: &str| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_shardc"));
        c.args([
            "run",
            "tests/models/gptj_small.shard",
            "--steps",
            "2",
            "--quiet",
        ])
        .args(["--seed", seed, "--out"])
        .arg(d.join(format!("run-{tag}")))
        .arg("--dump-losses")
        .arg(d.join(format!("{tag}.json")))
        .arg("--dump-grads")
        .arg(d.join(format!("{tag}.grads")))
        .current_dir(root());
        if !own {
            c.env("SHARDC_KERNELS", "candle");
        }
        let out = c.output().expect("shardc runs");
        assert!(out.status.success(), "{out:?}");
    };
    dump("own", true, "7");
    dump("candle", false, "7");
    dump("other", true, "8");
    let compare = |what: &str, a: &str, b: &str| {
        let out = Command::new("python3")
            .arg(root().join("scripts/gpu_compare.py"))
            .args([
                what,
                &d.join(a).display().to_string(),
                &d.join(b).display().to_string(),
            ])
            .args(["1e-5", "test"])
            .output()
            .expect("python3 runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, text) = compare("losses", "own.json", "candle.json");
    assert!(ok && text.starts_with("ok"), "{text}");
    let (ok, text) = compare("grads", "own.grads", "candle.grads");
    assert!(ok && text.contains("over 24 tensors"), "{text}");
    // Another seed: other weights, other losses and gradients.
    let (ok, text) = compare("losses", "own.json", "other.json");
    assert!(!ok && text.starts_with("FAIL"), "{text}");
    let (ok, text) = compare("grads", "own.grads", "other.grads");
    assert!(!ok && text.starts_with("FAIL"), "{text}");
}
