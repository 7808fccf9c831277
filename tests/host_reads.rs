//! What the candle-only path (`SHARDC_KERNELS=candle`, the one a GPU takes)
//! reads back to the host during training: ids, labels and scalars (the
//! loss, the gradient norm's terms, metric counts), never a float tensor's
//! data. `SHARDC_HOST_READS=1` makes `shardc run` print the process's counts
//! (`crate::kernels::host`); each seed model, plus a class-split classifier logging
//! accuracy, is held to it. On a GPU each such read is a device→host copy, so
//! an activation read back would be a silent round trip through the host.

use std::path::Path;
use std::process::Command;

/// (reads, bytes, float bytes, largest float read) of a short run.
fn reads(file: &str, steps: usize) -> [u64; 4] {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!(
        "shardc-host-{}-{}-{steps}",
        std::process::id(),
        file.replace('/', "_")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch");
    let out = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .args(["run", &root.join(file).display().to_string(), "--quiet"])
        .args(["--steps", &steps.to_string()])
        .arg("--out")
        .arg(dir.join("run"))
        .env("SHARDC_KERNELS", "candle")
        .env("SHARDC_HOST_READS", "1")
        .output()
        .expect("shardc runs");
    let _ = std::fs::remove_dir_all(&dir);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{file}: {err}");
    let line = err
        .lines()
        .find_map(|l| l.strip_prefix("host reads: "))
        .unwrap_or_else(|| panic!("{file}: no host-reads line in\n{err}"));
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .filter_map(|w| w.parse().ok())
        .collect();
    let [a, b, c, d] = nums[..] else {
        panic!("{file}: cannot read `{line}`")
    };
    [a, b, c, d]
}

#[test]
fn a_step_reads_ids_labels_and_scalars_only() {
    for file in [
        "models/shakespeare.shard",
        "models/fsdp_mlp.shard",
        "tests/models/gptj_small.shard",
        "tests/models/t3d_small.shard",
        "tests/models/accuracy_mp.shard",
    ] {
        let [n2, _, f2, largest] = reads(file, 2);
        let [n4, _, f4, _] = reads(file, 4);
        // The largest float read is a handful of scalars (a pipeline's
        // losses and sums travel together), far below any activation.
        assert!(
            largest <= 256,
            "{file}: a float read of {largest} bytes: a tensor's data went to the host"
        );
        // Reads grow with the steps by a fixed amount per step (none hides
        // in a loop over elements), and the floats among them are scalars.
        let (per, fper) = ((n4 - n2) / 2, (f4 - f2) / 2);
        assert!(per > 0, "{file}: no reads per step? (the loss is one)");
        assert!(fper <= 8 * 64 * 8, "{file}: {fper} bytes of floats a step");
        assert_eq!((n4 - n2) % 2, 0, "{file}: steps read different counts");
    }
}
