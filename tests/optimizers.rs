//! Lion and Muon train the same on a dp × tp mesh as on one device (their
//! update formulas are unit-tested in f64 in `src/optim/tests.rs`); Muon
//! gathers a tensor-parallel weight's update whole, which `shardc check`
//! reports (N0001) and the plan counts, and steps 1-D weights with AdamW;
//! parameter groups take weight decay off the parameters `no_decay` names
//! and scale the learning rate of those `lr_scale` names.

mod numerics;

use numerics::*;
use shardc::runtime::train;
use shardc::world::{self, Options};
use std::path::Path;

/// A LayerNorm and a Megatron MLP (the first weight split by columns over
/// `tp`, the second by rows) on `dp × tp`.
fn mlp(optimizer: &str) -> String {
    format!(
        "import nn\nmesh host(dp: 2, tp: 2)\nmodel M {{\n  ln = LayerNorm(8)\n  w1: f32[8, 16@tp] init normal(0.3)\n  w2: f32[16@tp, 4] init normal(0.3)\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {{\n    let h = gelu(ln(x) @ w1)\n    let y: f32[B@dp, 4] = h @ w2\n    y\n  }}\n}}\ntrain M on host {{\n  data: synthetic(classes: 4), batch: 16, steps: 10, seed: 3\n  optimizer: {optimizer}\n}}\n"
    )
}

const SHARDED: &[(&str, i64)] = &[("dp", 2), ("tp", 2)];
const ONE: &[(&str, i64)] = &[("dp", 1), ("tp", 1)];

#[test]
fn lion_on_dp_by_tp_equals_one_device() {
    compare_text(
        "lion.shard",
        &mlp("lion(lr: 0.01, weight_decay: 0.01)"),
        SHARDED,
        ONE,
        None,
    );
}

#[test]
fn muon_on_dp_by_tp_equals_one_device() {
    compare_text(
        "muon.shard",
        &mlp("muon(lr: 0.02, weight_decay: 0.01)"),
        SHARDED,
        ONE,
        None,
    );
}

/// Training moves the loss (so the comparisons above can fail).
#[test]
fn lion_and_muon_lower_the_loss() {
    for opt in ["lion(lr: 0.01)", "muon(lr: 0.02)"] {
        let (prog, cfg, src) = setup_text("opt.shard", &mlp(opt), SHARDED, None);
        let l = train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("run")
            .losses;
        assert!(l[9] < l[0] * 0.95, "{opt}: {l:?}");
    }
}

fn compiled(text: &str) -> world::Compilation {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("muon.shard");
    world::compile_source(&path, text.to_string(), &Options::default())
}

/// Muon needs each 2-D weight whole: on `tp`, `w1` and `w2` are gathered
/// over it (N0001 notes, and the plan's rows), while the LayerNorm's 1-D
/// scale and bias step with AdamW (two slots) and are not gathered.
#[test]
fn muon_gathers_split_weights_reported_and_planned() {
    let c = compiled(&mlp("muon(lr: 0.02)"));
    assert!(!c.has_errors());
    let notes: Vec<&str> = c
        .diagnostics
        .iter()
        .filter(|d| d.code.as_str() == "N0001" && d.message.contains("muon"))
        .map(|d| d.message.as_str())
        .collect();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes
        .iter()
        .any(|n| n.contains("`w1`") && n.contains("`tp`")));
    let plan = c.plans.first().expect("plan");
    let gathers: Vec<_> = plan
        .comms
        .iter()
        .filter(|x| x.kind.starts_with("muon all-gather"))
        .collect();
    assert_eq!(gathers.len(), 2);
    // w1: 8×16 f32, each device holds 8×8 and receives the other 8×8.
    let w1 = gathers
        .iter()
        .find(|g| g.source.contains("w1"))
        .expect("w1's gather");
    assert_eq!(
        (w1.bytes, w1.axes.as_slice()),
        (8.0 * 8.0 * 4.0, &["tp".to_string()][..])
    );
    assert!(plan.optimizer_flops > 0.0);
    // Muon keeps one slot for w1 and w2, AdamW two for the LayerNorm's.
    let stored = |n: &str| -> f64 {
        let p = c.programs[0]
            .params
            .iter()
            .find(|p| p.name == n)
            .expect("param");
        p.stored.known_shape().iter().product::<usize>() as f64
    };
    let local = stored("w1") / 2.0 + stored("w2") / 2.0;
    let norm = stored("ln.scale") + stored("ln.bias");
    assert_eq!(plan.optimizer_state, 4.0 * (local + 2.0 * norm));
    // `shardc lower` shows which optimizer steps each weight.
    let (_, t, cfg) = c.settings(None).expect("settings");
    let step = shardc::runtime::train::step_of(&c.programs[0], &cfg);
    let name = |n: &str| {
        let i = c.programs[0]
            .params
            .iter()
            .position(|p| p.name == n)
            .expect("param");
        step.params[i].optimizer.name()
    };
    assert_eq!((name("w1"), name("ln.scale")), ("muon", "adamw"));
    assert_eq!(t.optimizer.name(), "muon");
}

/// The parameters after training `text` (whose `train` has `steps: N` and a
/// checkpoint every N steps into `{dir}`), read back from that checkpoint.
fn trained(text: &str, tag: &str) -> std::collections::HashMap<String, Vec<f64>> {
    let dir = std::env::temp_dir().join(format!("shardc-opt-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = text.replace("{dir}", &dir.display().to_string());
    let (prog, cfg, src) = setup_text("groups.shard", &text, &[], None);
    train::run(&prog, &cfg, &src, false, &mut |_| {}).expect("run");
    let mut resumed = cfg.clone();
    shardc::runtime::checkpoint::resume(&prog, &mut resumed).expect("resume");
    let _ = std::fs::remove_dir_all(&dir);
    resumed.init
}

/// A model whose LayerNorm gets no gradient (its output is multiplied by
/// zero), trained by AdamW with strong decay: with `no_decay: [ln]` its
/// scale stays 1 and its bias 0, exactly; without, decay shrinks the scale
/// by (1 − lr·wd) each step. The dense weight decays either way.
#[test]
fn no_decay_keeps_the_norm_scales() {
    let run = |groups: &str, tag: &str| {
        trained(
            &format!(
                "import nn\nmesh host(dp: 2)\nmodel M {{\n  ln = LayerNorm(6)\n  head = Dense(6 -> 3)\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 3] {{ head(x) + head(ln(x)) * 0.0 }}\n}}\ntrain M on host {{\n  data: synthetic(classes: 3), batch: 8, steps: 5\n  optimizer: adamw(lr: 0.1, weight_decay: 0.5{groups})\n  checkpoint: {{ every: 5, dir: \"{{dir}}\" }}\n}}\n"
            ),
            tag,
        )
    };
    let kept = run(", no_decay: [ln]", "kept");
    assert!(
        kept["ln.scale"].iter().all(|v| *v == 1.0),
        "{:?}",
        kept["ln.scale"]
    );
    assert!(kept["ln.bias"].iter().all(|v| *v == 0.0));
    let decayed = run("", "decayed");
    let shrink = (1.0f64 - 0.1 * 0.5).powi(5);
    for v in &decayed["ln.scale"] {
        assert!((v - shrink).abs() < 1e-5, "{v} vs {shrink}");
    }
    // The dense weight steps the same way in both runs (its gradient does
    // not depend on the LayerNorm), decay included.
    assert_eq!(kept["head.w"], decayed["head.w"]);
}

/// `lr_scale` scales the learning rate of the parameters it names: with
/// plain SGD, `a`'s one step is half as long as it is without the group,
/// and `b`'s is the same.
#[test]
fn lr_scale_scales_a_groups_steps() {
    let run = |groups: &str, tag: &str| {
        trained(
            &format!(
                "mesh host(dp: 1)\nmodel M {{\n  a: f32[4, 3] init normal(0.5)\n  b: f32[4, 3] init normal(0.5)\n  fn forward(x: f32[B@dp, 4]) -> f32[B@dp, 3] {{ x @ a + x @ b }}\n}}\ntrain M on host {{\n  data: synthetic(classes: 3), batch: 8, steps: 1\n  optimizer: sgd(lr: 0.1{groups})\n  checkpoint: {{ every: 1, dir: \"{{dir}}\" }}\n}}\n"
            ),
            tag,
        )
    };
    let (plain, scaled) = (run("", "plain"), run(", lr_scale: { a: 0.5 }", "scaled"));
    let (prog, cfg, _) = setup_text(
        "scale.shard",
        "mesh host(dp: 1)\nmodel M {\n  a: f32[4, 3] init normal(0.5)\n  b: f32[4, 3] init normal(0.5)\n  fn forward(x: f32[B@dp, 4]) -> f32[B@dp, 3] { x @ a + x @ b }\n}\ntrain M on host {\n  data: synthetic(classes: 3), batch: 8, steps: 1\n  optimizer: sgd(lr: 0.1)\n}\n",
        &[],
        None,
    );
    let start = global_params(&prog, &cfg);
    let init = |n: &str| start.iter().find(|x| x.0 == n).expect("param").1.clone();
    for (k, a0) in init("a").iter().enumerate() {
        let (full, half) = (plain["a"][k] - a0, scaled["a"][k] - a0);
        // f32 parameters of about 0.5: a few ulps of them.
        assert!((half - full / 2.0).abs() < 2e-7, "{half} vs {full}/2");
    }
    assert_eq!(plain["b"], scaled["b"]);
    assert_ne!(plain["a"], scaled["a"]);
}
