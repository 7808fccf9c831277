//! The candle-only path (`SHARDC_KERNELS=candle`: none of shardc's own CPU
//! kernels — fused optimizer steps, fast reductions and elementwise passes,
//! cross-entropy's fused passes, split matmuls — only candle's ops, as a GPU
//! runs them) trains the four seed models like the default path: their
//! losses agree to 1e-5 (relative) over a few steps, through the real
//! command line. The generated primitive tests run on it too
//! (`tests/prims.rs`).

use std::path::Path;
use std::process::Command;

fn losses(file: &str, candle_only: bool) -> Vec<f64> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::temp_dir().join(format!(
        "shardc-kernels-{}-{}-{candle_only}",
        std::process::id(),
        file.replace('/', "_")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch");
    let dump = dir.join("losses.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardc"));
    cmd.args([
        "run",
        &root.join(file).display().to_string(),
        "--steps",
        "3",
        "--quiet",
    ])
    .arg("--out")
    .arg(dir.join("run"))
    .arg("--dump-losses")
    .arg(&dump);
    if candle_only {
        cmd.env("SHARDC_KERNELS", "candle");
    } else {
        cmd.env_remove("SHARDC_KERNELS");
    }
    let out = cmd.output().expect("shardc runs");
    assert!(
        out.status.success(),
        "{file} (candle only: {candle_only}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&dump).expect("losses written");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let _ = std::fs::remove_dir_all(&dir);
    v["losses"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|x| x.as_f64())
        .collect()
}

#[test]
fn seed_models_train_the_same_on_the_candle_only_path() {
    // Seed 000 (embedding table, 8 devices), seed 003 (DP and FSDP), seed
    // 001's GPT-J (dp × mp) and seed 004's 3-D model (dp × pp × tp), the last
    // two at test size.
    for file in [
        "models/shakespeare.shard",
        "models/fsdp_mlp.shard",
        "tests/models/gptj_small.shard",
        "tests/models/t3d_small.shard",
    ] {
        let own = losses(file, false);
        let candle = losses(file, true);
        assert_eq!(own.len(), 3, "{file}");
        assert_eq!(candle.len(), own.len(), "{file}");
        for (i, (a, b)) in own.iter().zip(&candle).enumerate() {
            assert!(
                ((a - b) / b).abs() < 1e-5,
                "{file}: loss {i} is {a} with shardc's kernels, {b} with candle's only"
            );
        }
    }
}
