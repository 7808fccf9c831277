//! shardc's CUDA kernels (`src/prim/*.cu`), run in CI where no GPU is: each
//! kernel file is compiled as C++ with `tests/cuda_emu/emu.h`, a CPU
//! stand-in for the CUDA features they use (threads of a block, its
//! barrier, warp shuffles, shared memory), and checked against f64
//! references: fused attention's outputs and gradients for every mask (three
//! head dims), the norms, softmax cross-entropy's passes, the activations
//! against finite differences, the gradient norm's sums of squares and
//! AdamW's step (`src/optim/adam.cu`).
//! What it cannot check (CUDA's own rounding, the launches' plumbing, speed)
//! is `scripts/gpu-check.sh`'s on a GPU.

use std::path::Path;
use std::process::Command;

/// Compile `source` (with `defines`) and run it; its report on failure.
fn run(source: &str, defines: &[&str], name: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args(["-std=c++20", "-O1", "-pthread", "-x", "c++"])
        .args(defines)
        .arg(root.join("tests/cuda_emu").join(source))
        .arg("-o")
        .arg(&bin)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C++ compiler `{cxx}` (set CXX): {e}"));
    assert!(
        out.status.success(),
        "{source} does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&bin)
        .output()
        .expect("the kernels' check runs");
    let report = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{name}:\n{report}");
    assert!(
        report.lines().count() > 5 && !report.contains("FAIL"),
        "{name}:\n{report}"
    );
}

#[test]
fn fused_attention_equals_naive_attention_head_dim_8() {
    run("flash.cpp", &["-DHD=8"], "flash8");
}

#[test]
fn fused_attention_equals_naive_attention_head_dim_64() {
    run("flash.cpp", &["-DHD=64"], "flash64");
}

/// Past 64 the kernels take smaller tiles (16 rows), and 72 is not a
/// multiple of the 8 column groups.
#[test]
fn fused_attention_equals_naive_attention_head_dim_72() {
    run("flash.cpp", &["-DHD=72"], "flash72");
}

#[test]
fn norms_cross_entropy_activations_sums_and_adamw_equal_their_references() {
    run("rows.cpp", &[], "rows");
}
