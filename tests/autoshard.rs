//! `shardc shard` on the seed models with their layouts stripped (every
//! `@axis` but `@_`, every `shard_params`): the layout it writes checks
//! clean, plans no slower than the hand-written one on the same device,
//! trains 10 steps equal to one device, and is the same bytes on every run
//! and thread count. Its search lands within 2% of enumerating every
//! candidate; a model that cannot fit gets E0700, a file that does not check
//! its own diagnostics.

mod numerics;

use numerics::grads_and_losses_text;
use shardc::autoshard::{self, Failure, Request, Solution};
use shardc::files::{Disk, Overlay};
use shardc::plan::device;
use shardc::world::{self, Options};
use std::path::{Path, PathBuf};

fn path(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(file)
}

/// `text` without its layout: `@axis` and `@(a, b)` after a dimension (not
/// `@_`, not the matrix product ` @ `) and `shard_params(...)` lines.
fn strip(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("shard_params("))
        .collect();
    let joined = lines.join("\n") + "\n";
    let b = joined.as_bytes();
    let mut out = String::new();
    let mut i = 0;
    while i < b.len() {
        let after_dim =
            i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b')');
        let next = b.get(i + 1).copied().unwrap_or(b' ');
        if b[i] == b'@' && after_dim && (next.is_ascii_lowercase() || next == b'(') {
            i += 1;
            if b[i] == b'(' {
                while i < b.len() && b[i] != b')' {
                    i += 1;
                }
                i += 1;
            } else {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
            }
            continue;
        }
        out.push(b[i] as char);
        i += 1;
    }
    out
}

fn solve_text(
    file: &str,
    text: &str,
    model: Option<&str>,
    mesh: &[(&str, i64)],
    dev: &str,
    exact: u64,
) -> Result<Solution, Failure> {
    solve_with(file, text, model, mesh, dev, exact, false)
}

fn solve_with(
    file: &str,
    text: &str,
    model: Option<&str>,
    mesh: &[(&str, i64)],
    dev: &str,
    exact: u64,
    pipeline: bool,
) -> Result<Solution, Failure> {
    let p = path(file);
    let mut files = Overlay::new(&Disk);
    files.insert(&p, text.to_string());
    autoshard::solve(&Request {
        files: &files,
        path: &p,
        model: model.map(str::to_string),
        mesh: mesh.iter().map(|(a, n)| (a.to_string(), *n)).collect(),
        devices: None,
        device: device::parse(dev).expect("device"),
        allow_bf16: false,
        pipeline,
        exact,
        grants: vec![],
    })
}

fn solved(file: &str, text: &str, model: Option<&str>, dev: &str) -> Solution {
    match solve_text(file, text, model, &[], dev, autoshard::EXACT) {
        Ok(s) => s,
        Err(Failure::Input(c)) | Err(Failure::Unsound(c)) => panic!(
            "{file}: {:?}",
            c.diagnostics
                .iter()
                .map(|d| d.message.clone())
                .collect::<Vec<_>>()
        ),
        Err(Failure::NoFit { diagnostic, .. }) => panic!("{file}: {}", diagnostic.message),
        Err(Failure::Usage(u)) => panic!("{file}: {u}"),
    }
}

/// The planned step and peak of `text` (as the file `file`) on `dev`.
fn planned(file: &str, text: &str, model: Option<&str>, dev: &str) -> (f64, f64, bool) {
    let c = world::compile_source(&path(file), text.to_string(), &Options::default());
    assert!(!c.has_errors(), "{file} does not check");
    let t = c.spec.train(model).expect("train");
    let p = c.plans.iter().find(|p| p.model == t.model).expect("plan");
    let v = device::verdict(p, device::parse(dev).expect("device"));
    let peak = v.peaks.iter().copied().fold(0.0, f64::max);
    (v.step_seconds.expect("timed"), peak, v.fits)
}

/// The models of `models/` and `examples/` whose layout is annotations only
/// (Mixtral's experts move by an explicit `all_to_all` over `ep`: code, not
/// a layout; GPT-2 BPE reads a tokenizer; GPT-3 175B and Llama 3 8B have
/// their own tests).
const SEEDS: &[(&str, Option<&str>)] = &[
    ("models/shakespeare.shard", None),
    ("models/fsdp_mlp.shard", Some("DPClassifier")),
    ("models/fsdp_mlp.shard", Some("FSDPClassifier")),
    ("models/gptj.shard", None),
    ("models/dlrm.shard", None),
    ("models/gpt2.shard", None),
    ("models/llama.shard", None),
    ("models/transformer_3d.shard", None),
    ("examples/classifier.shard", None),
    ("examples/vit.shard", None),
    ("examples/encoder_decoder.shard", None),
];

#[test]
fn stripped_seed_models_get_a_layout_no_slower_than_the_hand_one() {
    for (file, model) in SEEDS {
        let hand = std::fs::read_to_string(path(file)).expect("model");
        let s = solved(file, &strip(&hand), *model, "h100-80g");
        let (hand_step, _, hand_fits) = planned(file, &hand, *model, "h100-80g");
        let (step, peak, fits) = planned(file, &s.text, *model, "h100-80g");
        assert!(fits, "{file}: the layout does not fit");
        assert_eq!(
            (step, peak),
            (s.planned.step, s.planned.peak),
            "{file}: plan differs from the search's"
        );
        assert!(
            !hand_fits || step <= hand_step,
            "{file} {model:?}: planned step {step:e} s, the hand layout's {hand_step:e} s"
        );
        assert!(
            s.text.contains(autoshard::MARK),
            "{file}: no reasons written"
        );
        println!("{file} {model:?}: {step:e} s vs hand {hand_step:e} s");
    }
}

#[test]
fn llama3_8b_fits_on_64_h100s_where_the_hand_file_does_not() {
    let file = "models/llama3_8b.shard";
    let hand = std::fs::read_to_string(path(file)).expect("model");
    let (_, hand_peak, hand_fits) = planned(file, &hand, None, "h100-80g");
    let s = solved(file, &strip(&hand), None, "h100-80g");
    assert!(!hand_fits && s.planned.fits, "hand peak {hand_peak:e}");
    assert!(s.text.contains("checkpoint(full)"), "{}", s.text);
}

#[test]
fn the_layout_is_the_same_bytes_every_run_and_thread_count() {
    let file = "models/gptj.shard";
    let text = strip(&std::fs::read_to_string(path(file)).expect("model"));
    let a = solved(file, &text, None, "h100-80g").text;
    let b = solved(file, &text, None, "h100-80g").text;
    assert_eq!(a, b);
    // And from the command line, with one thread and with many.
    let dir = std::env::temp_dir().join(format!("shardc-autoshard-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let input = dir.join("gptj.shard");
    std::fs::write(&input, &text).expect("write");
    let mut outs = Vec::new();
    for threads in ["1", "4"] {
        let out = dir.join(format!("out{threads}.shard"));
        let status = std::process::Command::new(env!("CARGO_BIN_EXE_shardc"))
            .args([
                "shard",
                &input.display().to_string(),
                "-o",
                &out.display().to_string(),
            ])
            .env("RAYON_NUM_THREADS", threads)
            .status()
            .expect("shardc");
        assert!(status.success());
        outs.push(std::fs::read_to_string(&out).expect("out"));
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(outs[0], outs[1]);
    // The command line writes what the library chose.
    assert_eq!(outs[0], a);
}

#[test]
fn the_search_is_within_two_percent_of_every_candidate() {
    for (file, model, mesh) in [
        ("models/shakespeare.shard", None, vec![("device", 8)]),
        (
            "models/fsdp_mlp.shard",
            Some("DPClassifier"),
            vec![("data", 8)],
        ),
        ("models/dlrm.shard", None, vec![("data", 4)]),
    ] {
        let text = strip(&std::fs::read_to_string(path(file)).expect("model"));
        let (Ok(searched), Ok(all)) = (
            solve_text(file, &text, model, &mesh, "h100-80g", 0),
            solve_text(file, &text, model, &mesh, "h100-80g", u64::MAX),
        ) else {
            panic!("{file}: not solved");
        };
        let (s, e) = (searched.planned.step, all.planned.step);
        assert!(
            s <= e * 1.02,
            "{file}: search {s:e} s, every candidate {e:e} s"
        );
        assert!(e <= s, "{file}: the enumeration missed {s:e}");
    }
}

/// `text` with `const NAME = value` lines given new values (a smaller GPT-J
/// whose ten steps take seconds, not minutes).
fn with_consts(text: &str, consts: &[(&str, i64)]) -> String {
    text.lines()
        .map(|l| {
            match consts
                .iter()
                .find(|(n, _)| l.starts_with(&format!("const {n} ")))
            {
                Some((n, v)) => format!("const {n} = {v}"),
                None => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn the_layout_trains_like_one_device() {
    let small_gptj = [("D", 64), ("VOCAB", 256)];
    for (file, model, consts, mesh, one) in [
        (
            "models/shakespeare.shard",
            None,
            &[][..],
            vec![("device", 8)],
            vec![("device", 1)],
        ),
        (
            "models/fsdp_mlp.shard",
            Some("DPClassifier"),
            &[][..],
            vec![("data", 8)],
            vec![("data", 1)],
        ),
        (
            "models/gptj.shard",
            None,
            &small_gptj[..],
            vec![("dp", 4), ("mp", 2)],
            vec![("dp", 1), ("mp", 1)],
        ),
    ] {
        let started = std::time::Instant::now();
        let text = with_consts(
            &strip(&std::fs::read_to_string(path(file)).expect("model")),
            consts,
        );
        let s = solved(file, &text, model, "h100-80g");
        let (_, sharded) = grads_and_losses_text(file, &s.text, &mesh, model, 10, false);
        let (_, single) = grads_and_losses_text(file, &s.text, &one, model, 10, false);
        assert_eq!(sharded.len(), 10);
        for (i, (x, y)) in sharded.iter().zip(&single).enumerate() {
            assert!(
                ((x - y) / y).abs() < 1e-5,
                "{file}: loss {} is {x} sharded, {y} on one device",
                i + 1
            );
        }
        println!("{file}: {:.1} s", started.elapsed().as_secs_f64());
    }
}

/// GPT-3 175B with its stack not pipelined and not checkpointed fits no
/// layout of 1024 h100-80g; `--pipeline` cuts the stack over `pp` into a
/// layout that fits and plans a step no slower than the hand file's 1F1B.
#[test]
fn pipeline_lets_gpt3_175b_fit_no_slower_than_the_hand_file() {
    let file = "examples/gpt3_175b.shard";
    let hand = std::fs::read_to_string(path(file)).expect("model");
    let (hand_step, _, hand_fits) = planned(file, &hand, None, "h100-80g");
    let cut = ", stages: pp, schedule: one_f_one_b, microbatches: 16, checkpoint: full";
    assert!(hand.contains(cut) && hand_fits);
    let bare = hand.replace(cut, "");
    let flat = solve_with(file, &bare, None, &[], "h100-80g", autoshard::EXACT, false);
    assert!(matches!(flat, Err(Failure::NoFit { .. })));
    let s = match solve_with(file, &bare, None, &[], "h100-80g", autoshard::EXACT, true) {
        Ok(s) => s,
        Err(_) => panic!("--pipeline found no layout"),
    };
    assert!(s.planned.fits, "{}", s.text);
    assert!(s.text.contains("stages: pp"), "{}", s.text);
    // The microbatch counts offered follow the batch (1536) and the mesh
    // (dp 16): 96, one example per replica in each, plans the shortest step.
    assert!(s.text.contains("microbatches: 96"), "{}", s.text);
    let (step, _, fits) = planned(file, &s.text, None, "h100-80g");
    assert!(
        fits && step <= hand_step,
        "{step} s against the hand file's {hand_step} s"
    );
}

#[test]
fn a_model_no_layout_fits_gets_e0700_with_what_would_fit() {
    let text = "mesh pod(dp: 2)\n\nconst D = 65536\nconst F = 131072\n\nmodel Wide {\n  w : f32[D, F] init normal(0.02)\n\n  fn forward(x: f32[B, D]) -> f32[B, F] {\n    x @ w\n  }\n}\n\ntrain Wide on pod {\n  data: synthetic(classes: F)\n  batch: 8, steps: 10, seed: 0\n  loss: mse\n  optimizer: adamw(lr: 1e-3)\n}\n";
    match solve_text(
        "tests/ui/wide.shard",
        text,
        None,
        &[],
        "a100-40g",
        autoshard::EXACT,
    ) {
        Err(Failure::NoFit { diagnostic, .. }) => {
            assert_eq!(diagnostic.code.as_str(), "E0700");
            let help = diagnostic.help.clone().unwrap_or_default();
            assert!(help.contains("--mesh dp=4"), "{help}");
            assert!(help.contains("--device"), "{help}");
        }
        _ => panic!("expected E0700"),
    }
    // With room, the same file is laid out.
    let s = solve_text(
        "tests/ui/wide.shard",
        text,
        None,
        &[("dp", 8)],
        "a100-40g",
        autoshard::EXACT,
    );
    assert!(s.is_ok_and(|s| s.text.contains("mesh pod(dp: 8)")));
}

#[test]
fn a_file_that_does_not_check_is_refused_with_its_own_diagnostics() {
    let file = "models/gptj.shard";
    let text = std::fs::read_to_string(path(file)).expect("model");
    // H = 4 heads over mp = 3 does not divide.
    match solve_text(
        file,
        &text,
        None,
        &[("mp", 3)],
        "h100-80g",
        autoshard::EXACT,
    ) {
        Err(Failure::Input(c)) => assert!(c.diagnostics.iter().any(|d| d.is_error())),
        _ => panic!("expected the checker's errors"),
    }
    match solve_text(
        file,
        &text,
        None,
        &[("xx", 2)],
        "h100-80g",
        autoshard::EXACT,
    ) {
        Err(Failure::Usage(u)) => assert!(u.to_string().contains("`xx`"), "{u}"),
        _ => panic!("expected a usage error"),
    }
}
