//! `shardc show`: tensors drawn as device grids, against golden files in
//! `tests/show/` (`SHARDC_BLESS=1 cargo test --test show` rewrites them).

use std::path::Path;
use std::process::Command;

fn show(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("show")
        .args(args)
        .output()
        .expect("spawn");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn golden(name: &str, got: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/show")
        .join(name);
    if std::env::var_os("SHARDC_BLESS").is_some() {
        std::fs::write(&path, got).expect("bless");
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(
        got,
        want,
        "{} differs (SHARDC_BLESS=1 rewrites it)",
        path.display()
    );
}

#[test]
fn tensor_parallel_and_data_parallel_layouts() {
    // Seed 001: column-parallel w1 (split over mp, replicated over dp), heads split,
    // batch split over dp with logits split over the vocabulary.
    let (ok, out, err) = show(&["models/gptj.shard", "w1", "wq", "input", "output"]);
    assert!(ok, "{err}");
    golden("gptj.txt", &out);
}

#[test]
fn fsdp_parameters_are_stored_split_and_gathered_for_use() {
    let (ok, out, err) = show(&["models/fsdp_mlp.shard", "--model", "FSDPClassifier", "inp"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("used as f32[784, 512]: gathered for each use"),
        "{out}"
    );
    golden("fsdp.txt", &out);
}

#[test]
fn a_3d_mesh_and_a_mesh_override() {
    let (ok, out, err) = show(&[
        "models/transformer_3d.shard",
        "--mesh",
        "dp=1,pp=2,tp=4",
        "blocks.0",
    ]);
    assert!(ok, "{err}");
    golden("t3d_tp4.txt", &out);
}

#[test]
fn an_unknown_name_lists_the_parameters() {
    let (ok, _, err) = show(&["models/fsdp_mlp.shard", "nope"]);
    assert!(!ok);
    assert!(
        err.contains("has no parameter or input named `nope`; its inputs are x (or `input`, `output`), its parameters inp.w, inp.b"),
        "{err}"
    );
}

/// An input is shown by its name in `forward` (and all by `input`); a near
/// miss is named.
#[test]
fn inputs_are_shown_by_name() {
    let (ok, out, err) = show(&["models/gptj.shard", "ids"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("input ids  i32[16@dp, 32]   per device i32[4, 32]"),
        "{out}"
    );
    assert!(!out.contains("embed.w"), "{out}");
    let (ok, _, err) = show(&["models/gptj.shard", "idz"]);
    assert!(!ok);
    assert!(err.contains("did you mean `ids`?"), "{err}");
}
