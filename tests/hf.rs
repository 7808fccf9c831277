//! Hugging Face checkpoints in and out through the shipped weight maps
//! (`models/maps/{llama,gpt2}_hf.toml`), against what the real transformers
//! and PyTorch computed (`tests/fixtures/hf/`, written by
//! `scripts/hf_fixtures.py`): a tiny Llama saved in f32, in bf16 and sharded
//! into two files, and a tiny GPT-2 (tied head) in f32 and bf16, train like
//! PyTorch's AdamW on a dp × tp mesh; their first gradients equal PyTorch's
//! under HF's names, and `shardc export` writes exactly the fixture's
//! tensors. Bad checkpoints and maps are clear errors.

use safetensors::tensor::{Dtype, TensorView};
use std::path::{Path, PathBuf};
use std::process::Output;

mod common;

use common::{shardc, stderr};

const FIX: &str = "tests/fixtures/hf";
const MAP: &str = "models/maps/llama_hf.toml";

/// A fixture model: its name in the fixtures, its model file and its map.
struct Hf {
    name: &'static str,
    model: &'static str,
    map: &'static str,
}

const LLAMA: Hf = Hf {
    name: "llama",
    model: "tests/fixtures/hf/llama.shard",
    map: MAP,
};
const GPT2: Hf = Hf {
    name: "gpt2",
    model: "models/gpt2.shard",
    map: "models/maps/gpt2_hf.toml",
};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn temp(name: &str) -> PathBuf {
    common::temp("hf", name)
}

/// `shardc run` of the Llama fixture from `init` through the map, on the
/// fixture's batches; its output and its per-step losses.
fn run(dir: &Path, init: &Path, extra: &[&str]) -> (Output, Vec<f64>) {
    run_hf(&LLAMA, dir, init, extra)
}

/// [`run`] of any fixture model.
fn run_hf(hf: &Hf, dir: &Path, init: &Path, extra: &[&str]) -> (Output, Vec<f64>) {
    let losses = dir.join("losses.json");
    let out = shardc()
        .args(["run", "--quiet", "--map", hf.map, "--data"])
        .arg(format!("{FIX}/batches.npz"))
        .arg("--init")
        .arg(init)
        .arg("--out")
        .arg(dir.join("run"))
        .arg("--dump-losses")
        .arg(&losses)
        .args(extra)
        // The fixture's batches are 5 steps.
        .args(if extra.contains(&"--steps") {
            &[][..]
        } else {
            &["--steps", "5"][..]
        })
        .arg(hf.model)
        .output()
        .expect("spawn");
    let l = if out.status.success() {
        common::losses(&losses)
    } else {
        vec![]
    };
    (out, l)
}

fn expected(model: &str, key: &str) -> Vec<f64> {
    let text =
        std::fs::read_to_string(root().join(FIX).join("expected.json")).expect("expected.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    v[model][key]
        .as_array()
        .expect("losses")
        .iter()
        .map(|x| x.as_f64().expect("number"))
        .collect()
}

/// Name → (dtype, shape, values as f64) of a safetensors file.
fn tensors(path: &Path) -> Vec<(String, Dtype, Vec<usize>, Vec<f64>)> {
    let bytes = std::fs::read(path).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut out: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let vals = match v.dtype() {
                Dtype::F32 => v
                    .data()
                    .chunks_exact(4)
                    .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
                    .collect(),
                _ => vec![],
            };
            (n, v.dtype(), v.shape().to_vec(), vals)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let rel = ((g - w) / w).abs();
        assert!(
            rel <= tol,
            "{what}: step {} {g} vs PyTorch {w} ({rel:.2e} > {tol:.0e})",
            i + 1
        );
    }
}

#[test]
fn f32_bf16_and_sharded_checkpoints_train_like_pytorch() {
    for (hf, init, key, tol) in [
        (&LLAMA, "llama-f32", "losses_f32", 1e-6),
        (&LLAMA, "llama-sharded", "losses_f32", 1e-6),
        (
            &LLAMA,
            "llama-sharded/model.safetensors.index.json",
            "losses_f32",
            1e-6,
        ),
        (&LLAMA, "llama-f32/model.safetensors", "losses_f32", 1e-6),
        // PyTorch trained the same bf16 weights upcast to f32 (the issue's
        // bound is 1e-2; both sides start from the same values).
        (&LLAMA, "llama-bf16", "losses_bf16", 1e-5),
        (&GPT2, "gpt2-f32", "losses_f32", 1e-6),
        (&GPT2, "gpt2-bf16", "losses_bf16", 1e-5),
    ] {
        let dir = temp(&init.replace('/', "_"));
        let (out, got) = run_hf(hf, &dir, &root().join(FIX).join(init), &[]);
        assert!(out.status.success(), "{init}: {}", stderr(&out));
        assert_close(&got, &expected(hf.name, key), tol, init);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn first_step_gradients_match_pytorch_under_hf_names() {
    for hf in [&LLAMA, &GPT2] {
        let dir = temp(&format!("grads-{}", hf.name));
        let grads = dir.join("grads.safetensors");
        let (out, _) = run_hf(
            hf,
            &dir,
            &root().join(FIX).join(format!("{}-f32", hf.name)),
            &[
                "--steps",
                "1",
                "--dump-grads",
                grads.to_str().expect("utf-8"),
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let got = tensors(&grads);
        let want = tensors(
            &root()
                .join(FIX)
                .join(format!("grads-{}.safetensors", hf.name)),
        );
        let names = |t: &[(String, Dtype, Vec<usize>, Vec<f64>)]| {
            t.iter().map(|x| x.0.clone()).collect::<Vec<_>>()
        };
        assert_eq!(names(&got), names(&want), "{}", hf.name);
        for ((n, _, gs, g), (_, _, ws, w)) in got.iter().zip(&want) {
            assert_eq!(gs, ws, "{n}");
            let scale = w.iter().fold(0f64, |m, x| m.max(x.abs()));
            let diff = g.iter().zip(w).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
            assert!(
                diff <= 1e-5 * scale,
                "{n}: max difference {diff:.3e} of max {scale:.3e}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn export_writes_the_checkpoints_names_shapes_and_dtypes() {
    for hf in [&GPT2, &LLAMA] {
        let dir = temp(&format!("export-{}", hf.name));
        let src = root().join(FIX).join(format!("{}-f32", hf.name));
        let (out, _) = run_hf(hf, &dir, &src, &["--steps", "2"]);
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(dir.join("run/final/params.safetensors").is_file());
        let fixture = tensors(&src.join("model.safetensors"));
        for (dtype, flag) in [(Dtype::F32, "f32"), (Dtype::BF16, "bf16")] {
            let to = dir.join(format!("hf-{flag}"));
            let out = shardc()
                .args(["export", "--map", hf.map, "--dtype", flag, "--from"])
                .arg(dir.join("run"))
                .arg("--out")
                .arg(&to)
                .arg("--config")
                .arg(src.join("config.json"))
                .arg(hf.model)
                .output()
                .expect("spawn");
            assert!(out.status.success(), "{}", stderr(&out));
            assert!(to.join("config.json").is_file());
            let got = tensors(&to.join("model.safetensors"));
            let keys = |t: &[(String, Dtype, Vec<usize>, Vec<f64>)]| {
                t.iter()
                    .map(|x| (x.0.clone(), x.2.clone()))
                    .collect::<Vec<_>>()
            };
            assert_eq!(keys(&got), keys(&fixture), "{} {flag}", hf.name);
            assert!(got.iter().all(|t| t.1 == dtype), "{flag}");
        }
        if hf.name == "gpt2" {
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        }
        // The exported checkpoint starts a run exactly where the run's own
        // final parameters do.
        let (a, la) = run(&dir.join("a"), &dir.join("hf-f32"), &["--steps", "1"]);
        assert!(a.status.success(), "{}", stderr(&a));
        let out = shardc()
            .args(["run", "--quiet", "--steps", "1", "--data"])
            .arg(format!("{FIX}/batches.npz"))
            .arg("--init")
            .arg(dir.join("run/final"))
            .arg("--out")
            .arg(dir.join("b"))
            .arg("--dump-losses")
            .arg(dir.join("b.json"))
            .arg(format!("{FIX}/llama.shard"))
            .output()
            .expect("spawn");
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(la, common::losses(&dir.join("b.json")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Write tensors (name, dtype, shape, bytes) as a safetensors file.
fn write(path: &Path, t: &[(String, Dtype, Vec<usize>, Vec<u8>)]) {
    let views: Vec<(String, TensorView)> = t
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    safetensors::tensor::serialize_to_file(views, None, path).expect("write");
}

fn raw(path: &Path) -> Vec<(String, Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).expect("read");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    st.tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect()
}

#[test]
fn jax_names_load_through_a_few_lines_of_map() {
    let dir = temp("jax");
    let dump = dir.join("init.safetensors");
    let out = shardc()
        .args(["run", "--quiet", "--steps", "1", "--data"])
        .arg(format!("{FIX}/batches.npz"))
        .arg("--dump-init")
        .arg(&dump)
        .arg("--out")
        .arg(dir.join("a"))
        .arg("--dump-losses")
        .arg(dir.join("a.json"))
        .arg(format!("{FIX}/llama.shard"))
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    // Flax's naming of the same tree: `layers_0/attn_norm/scale`, `layers_0/wq`,
    // `embed/w`; no RoPE tables (computed).
    let renamed: Vec<_> = raw(&dump)
        .into_iter()
        .filter(|t| !t.0.contains("rope"))
        .map(|(n, d, s, b)| {
            let n = n
                .strip_prefix("lm.")
                .expect("lm.")
                .replace("blocks.", "layers_");
            let n = n
                .replacen("layers_0.", "layers_0/", 1)
                .replacen("layers_1.", "layers_1/", 1);
            (n.replace('.', "/"), d, s, b)
        })
        .collect();
    let jax = dir.join("jax.safetensors");
    write(&jax, &renamed);
    let map = dir.join("jax.toml");
    std::fs::write(
        &map,
        "root = \"lm\"\n\
         [[tensor]]\nfrom = \"layers_{i}/{norm}/scale\"\nto = \"blocks.{i}.{norm}.scale\"\n\
         [[tensor]]\nfrom = \"layers_{i}/{w}\"\nto = \"blocks.{i}.{w}\"\n\
         [[tensor]]\nfrom = \"{layer}/{p}\"\nto = \"{layer}.{p}\"\n",
    )
    .expect("write");
    let out = shardc()
        .args(["run", "--steps", "1", "--data"])
        .arg(format!("{FIX}/batches.npz"))
        .arg("--init")
        .arg(&jax)
        .arg("--map")
        .arg(&map)
        .arg("--out")
        .arg(dir.join("b"))
        .arg("--dump-losses")
        .arg(dir.join("b.json"))
        .arg(format!("{FIX}/llama.shard"))
        .output()
        .expect("spawn");
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("4 computed buffer(s) not in the file"),
        "{err}"
    );
    assert_eq!(
        common::losses(&dir.join("a.json")),
        common::losses(&dir.join("b.json"))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A run from `init` that must fail with every one of `want` in its error.
fn refused(dir: &Path, init: &Path, map: Option<&Path>, want: &[&str]) {
    let mut c = shardc();
    c.args(["run", "--quiet", "--steps", "1", "--data"])
        .arg(format!("{FIX}/batches.npz"))
        .arg("--init")
        .arg(init)
        .arg("--map")
        .arg(map.unwrap_or(Path::new(MAP)))
        .arg("--out")
        .arg(dir.join("run"))
        .arg(format!("{FIX}/llama.shard"));
    let out = c.output().expect("spawn");
    let err = stderr(&out);
    assert!(matches!(out.status.code(), Some(1 | 2)), "{err}");
    for w in want {
        assert!(err.contains(w), "`{w}` not in: {err}");
    }
    assert!(!dir.join("run/final").exists(), "nothing trained: {err}");
}

#[test]
fn bad_checkpoints_are_named_errors() {
    let dir = temp("bad");
    let fix = root().join(FIX);
    // An index naming a shard that is not there.
    let sharded = dir.join("sharded");
    std::fs::create_dir_all(&sharded).expect("mkdir");
    for e in std::fs::read_dir(fix.join("llama-sharded")).expect("ls") {
        let p = e.expect("entry").path();
        std::fs::copy(&p, sharded.join(p.file_name().expect("name"))).expect("copy");
    }
    std::fs::remove_file(sharded.join("model-00002-of-00002.safetensors")).expect("rm");
    refused(
        &dir,
        &sharded,
        None,
        &[
            "model.safetensors.index.json",
            "model-00002-of-00002.safetensors",
            "cannot be read",
        ],
    );
    // A shard cut short.
    let whole =
        std::fs::read(fix.join("llama-sharded/model-00002-of-00002.safetensors")).expect("read");
    std::fs::write(
        sharded.join("model-00002-of-00002.safetensors"),
        &whole[..whole.len() - 100],
    )
    .expect("write");
    refused(
        &dir,
        &sharded,
        None,
        &["model-00002-of-00002.safetensors", "cut short"],
    );
    // An fp8 tensor.
    let mut t = raw(&fix.join("llama-f32/model.safetensors"));
    let i = t
        .iter()
        .position(|x| x.0 == "model.norm.weight")
        .expect("norm");
    let n: usize = t[i].2.iter().product();
    t[i] = (
        t[i].0.clone(),
        Dtype::F8_E4M3,
        t[i].2.clone(),
        vec![0x38; n],
    );
    let fp8 = dir.join("fp8.safetensors");
    write(&fp8, &t);
    refused(
        &dir,
        &fp8,
        None,
        &["`model.norm.weight` is F8_E4M3", "F64, F32, BF16 or F16"],
    );
    // A layout that gives another shape than the file's (k_proj is [KV·E, D]).
    let map = std::fs::read_to_string(root().join(MAP)).expect("map");
    let wrong = dir.join("wrong.toml");
    std::fs::write(
        &wrong,
        map.replacen(
            "to = \"blocks.{i}.wk\"\nlayout = \"(h e) d -> d h e\"",
            "to = \"blocks.{i}.wk\"\nlayout = \"d (h e) -> d h e\"",
            1,
        ),
    )
    .expect("write");
    refused(
        &dir,
        &fix.join("llama-f32"),
        Some(&wrong),
        &["`model.layers.0.self_attn.k_proj.weight` is [32, 64] in the file; the map's layout \"d (h e) -> d h e\" for `lm.blocks.0.wk` gives [64, 32]"],
    );
    // A map that leaves a parameter out stops at check time.
    let partial = dir.join("partial.toml");
    std::fs::write(
        &partial,
        map.replacen("to = \"norm.scale\"", "to = \"norm.scales\"", 1),
    )
    .expect("write");
    refused(
        &dir,
        &fix.join("llama-f32"),
        Some(&partial),
        &["E0601", "no rule of `partial.toml` names `lm.norm.scale`"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_run_keeps_its_final_parameters_whatever_the_checkpoint_cadence() {
    let dir = temp("final");
    let model = dir.join("m.shard");
    std::fs::write(
        &model,
        "import nn\nmesh m(dp: 2)\nmodel C {\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 3] { a(x) }\n}\n\
         train C on m { data: synthetic(classes: 3), batch: 4, steps: 5, optimizer: sgd(lr: 0.3), checkpoint: { every: 3, dir: \"ck\" } }\n",
    )
    .expect("write");
    let out = shardc()
        .args(["run", "--quiet", "--out"])
        .arg(dir.join("run"))
        .arg(&model)
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    let fin = dir.join("run/final/params.safetensors");
    let bytes = std::fs::read(&fin).expect("final/ written");
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).expect("safetensors");
    let m = meta.metadata().clone().unwrap_or_default();
    assert_eq!(m.get("step").map(String::as_str), Some("5"));
    assert_eq!(m.get("model").map(String::as_str), Some("C"));
    // The checkpoint after step 3 is the only one; final/ is after step 5
    // and differs from it.
    let ck = raw(&dir.join("run/ck/step-00000003/tensors.safetensors"));
    let fin = raw(&fin);
    let w3 = &ck.iter().find(|t| t.0 == "param/a.w").expect("a.w").3;
    let w5 = &fin.iter().find(|t| t.0 == "a.w").expect("a.w").3;
    assert_ne!(w3, w5);
    // `export` reads a checkpoint (its directory or its file) as well as a run.
    for from in [
        dir.join("run/ck/step-00000003"),
        dir.join("run/ck/step-00000003/tensors.safetensors"),
    ] {
        let to = dir.join("export");
        let out = shardc()
            .arg("export")
            .arg("--from")
            .arg(&from)
            .arg("--out")
            .arg(&to)
            .arg(&model)
            .output()
            .expect("spawn");
        assert!(out.status.success(), "{}", stderr(&out));
        let got = raw(&to.join("model.safetensors"));
        assert_eq!(&got.iter().find(|t| t.0 == "a.w").expect("a.w").3, w3);
    }
    let out = shardc()
        .arg("export")
        .arg("--from")
        .arg(&dir)
        .arg("--out")
        .arg(dir.join("x"))
        .arg(&model)
        .output()
        .expect("spawn");
    assert!(
        stderr(&out).contains("holds no `final/params.safetensors` (a run directory)"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
