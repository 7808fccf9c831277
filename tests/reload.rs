//! Live reload (`shardc run --watch`): an edit applied at step k trains exactly
//! as stopping after step k and resuming from that checkpoint with the edited
//! file; edits that a running training cannot take are refused with the reason.

use shardc::runtime::mesh::InProcess;
use shardc::runtime::reload::{compare, Reloads};
use shardc::runtime::train::{self, Config};
use shardc::spmd::Program;
use shardc::world::{self, Options};
use std::path::{Path, PathBuf};

fn setup(text: &str) -> (Program, Config, shardc::runtime::data::Source) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("reload.shard");
    let opts = Options {
        grants: vec![std::env::temp_dir()],
        ..Options::default()
    };
    let c = world::compile_source(&path, text.to_string(), &opts);
    assert!(
        !c.has_errors(),
        "{:?}",
        c.diagnostics.iter().map(|d| &d.message).collect::<Vec<_>>()
    );
    let (prog, _, cfg, src) = c.prepare(None).expect("runnable");
    (prog.clone(), cfg, src)
}

/// A tensor-parallel MLP on data × mp, with `act`, `opt` and `extra` settings.
fn model(act: &str, opt: &str, extra: &str, ckpt: &Path) -> String {
    format!(
        "import nn\nmesh m(data: 2, mp: 2)\nmodel C {{\n  a = Dense(6 -> 8@mp)\n  b = Dense(8@mp -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] {{ b({act}(a(x))) }}\n}}\ntrain C on m {{ data: synthetic(classes: 3), batch: 16, steps: 12, seed: 5, optimizer: {opt}{extra}, checkpoint: {{ every: 6, keep: 1, dir: \"{}\" }} }}\n",
        ckpt.display()
    )
}

fn temp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-reload-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn bits(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_reload_equals_stopping_and_resuming_with_the_edited_file() {
    let dir = temp("same");
    let ck = dir.join("ck");
    let before = model("silu", "adam(lr: 0.02)", "", &ck);
    let after = model(
        "gelu",
        "adamw(lr: 0.005, weight_decay: 0.1)",
        ", clip_grad_norm: 0.05",
        &ck,
    );

    // Stop after step 6 (its checkpoint), resume with the edited file.
    let (pa, mut ca, sa) = setup(&before);
    ca.steps = 6;
    let first = train::run(&pa, &ca, &sa, false, &mut |_| {})
        .expect("run")
        .losses;
    let (pb, mut cb, sb) = setup(&after);
    shardc::runtime::checkpoint::resume(&pb, &mut cb).expect("resume");
    assert_eq!(cb.start_step, 6);
    let rest = train::run(&pb, &cb, &sb, false, &mut |_| {})
        .expect("run")
        .losses;

    // One run, with the edit published to take effect at step 6 (0-based).
    let (pa, mut ca, sa) = setup(&model("silu", "adam(lr: 0.02)", "", &dir.join("ck2")));
    ca.checkpoint = None;
    let (pb, cb, _) = setup(&after);
    let summary = compare(&pa, &ca, &pb, &cb).expect("a reload can take this edit");
    assert!(summary.contains("a changed forward"), "{summary}");
    assert!(summary.contains("optimizer adam → adamw"), "{summary}");
    assert!(summary.contains("clip_grad_norm none → 0.05"), "{summary}");
    let reloads = Reloads::default();
    reloads.publish(pb.clone(), cb.clone(), 6, summary);
    let mut notes = Vec::new();
    let extras = train::Extras {
        reloads: Some(&reloads),
        ..train::Extras::default()
    };
    let live = train::run_on(&InProcess, &pa, &ca, &sa, extras, &mut |r| {
        notes.extend(r.notes.iter().map(|n| (r.step, n.clone())))
    })
    .expect("run")
    .losses;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert_eq!(notes[0].0, 6);
    assert!(notes[0].1.starts_with("reload 1: "), "{notes:?}");
    let joined: Vec<f64> = first.iter().chain(&rest).copied().collect();
    assert_eq!(bits(&live), bits(&joined));
    // And the edit mattered: without it the last losses differ.
    let plain = train::run(&pa, &ca, &sa, false, &mut |_| {})
        .expect("run")
        .losses;
    assert_ne!(bits(&plain[6..]), bits(&live[6..]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn edits_a_running_training_cannot_take_are_refused_with_the_reason() {
    let ck = temp("refuse");
    let (p, c, _) = setup(&model("silu", "adam(lr: 0.02)", "", &ck));
    let refused = |text: String| -> String {
        let (q, d, _) = setup(&text);
        compare(&p, &c, &q, &d).expect_err("refused").join("; ")
    };
    let resized = model("silu", "adam(lr: 0.02)", "", &ck).replace("8@mp", "12@mp");
    let why = refused(resized);
    assert!(
        why.contains("parameter `a.w` changed from f32[6, 8@mp] to f32[6, 12@mp]"),
        "{why}"
    );
    let why = refused(model("silu", "sgd(lr: 0.02)", "", &ck));
    assert!(
        why.contains("changed from adam to sgd, which keeps other state"),
        "{why}"
    );
    let why = refused(model("silu", "adam(lr: 0.02)", "", &ck).replace("batch: 16", "batch: 32"));
    assert!(why.contains("the batch"), "{why}");
    let why = refused(
        model("silu", "adam(lr: 0.02)", "", &ck).replace("data: 2, mp: 2", "data: 4, mp: 1"),
    );
    assert!(why.contains("the mesh changed"), "{why}");
    // Settings a reload does not apply are named, not silently dropped.
    let (q, d, _) =
        setup(&model("silu", "adam(lr: 0.02)", "", &ck).replace("steps: 12", "steps: 40"));
    let s = compare(&p, &c, &q, &d).expect("accepted");
    assert!(s.contains("steps apply when the run restarts"), "{s}");
}
