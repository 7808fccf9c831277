//! Frozen parameters and buffers: `freeze(...)` on weights and sublayers and
//! `frozen: true` on tables take no step and keep no optimizer state (their
//! runs equal runs without them, their plan counts no slots, a checkpoint
//! holds their initial values and no moments), and a weight's computed `init`
//! equals its formula, whole or split over the mesh.

mod numerics;

use numerics::*;
use shardc::runtime::train;
use shardc::world::{self, Options};
use std::path::Path;

/// A two-layer model on `data: 2` whose first layer's output is multiplied by
/// `scale` (a sublayer holding one weight of ones) and by `mask` (ones).
fn scaled(freeze: &str, use_scale: bool) -> String {
    let y = if use_scale {
        "s(x @ w1) * mask"
    } else {
        "x @ w1"
    };
    format!(
        "mesh host(data: 2)\nlayer Scale {{\n  g: f32[8] init ones\n  fn forward(x: f32[B, 8]) -> f32[B, 8] {{ x * g }}\n}}\nmodel M {{\n  s = Scale()\n  mask: f32[8] init ones\n  w1: f32[6, 8] init normal(0.3)\n  w2: f32[8, 3] init normal(0.3)\n  {freeze}\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] {{ tanh({y}) @ w2 }}\n}}\ntrain M on host {{ data: synthetic(classes: 3), batch: 8, steps: 6, seed: 1, optimizer: adam(lr: 0.05) }}\n"
    )
}

fn losses(text: &str) -> Vec<u64> {
    let (prog, cfg, src) = setup_text("frozen.shard", text, &[], None);
    train::run(&prog, &cfg, &src, false, &mut |_| {})
        .expect("run")
        .losses
        .iter()
        .map(|l| l.to_bits())
        .collect()
}

/// Multiplying by frozen ones changes nothing, step after step; trained, the
/// same weights move and the losses part (so the comparison can fail).
#[test]
fn frozen_weights_and_sublayers_take_no_step() {
    let plain = losses(&scaled("", false));
    assert_eq!(losses(&scaled("freeze(s, mask)", true)), plain);
    assert_ne!(losses(&scaled("", true)), plain, "trained, they move");
    assert_ne!(
        losses(&scaled("freeze(s)", true)),
        plain,
        "mask still trains"
    );
}

fn plan(text: &str) -> shardc::plan::Plan {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("frozen.shard");
    let c = world::compile_source(&path, text.to_string(), &Options::default());
    assert!(!c.has_errors());
    c.plans.into_iter().next().expect("a plan")
}

/// Adam keeps two slots per trained element and none for frozen ones.
#[test]
fn frozen_weights_keep_no_optimizer_state() {
    let p = plan(&scaled("freeze(s, mask)", true));
    let trained = (6 * 8 + 8 * 3) as f64 * 4.0;
    assert_eq!(p.params, trained + 16.0 * 4.0);
    assert_eq!(p.optimizer_state, 2.0 * trained);
    let (prog, _, _) = setup_text("frozen.shard", &scaled("freeze(s, mask)", true), &[], None);
    assert_eq!(frozen_names(&prog), ["s.g", "mask"]);
}

/// A buffer computed from `arange` and `cos` equals the formula, stored whole
/// or split over `mp`; runs on 2 × 2 devices equal one device.
#[test]
fn a_computed_initial_value_equals_its_formula() {
    for layout in ["f32[4, 6]", "f32[4, 6@mp]"] {
        let text = format!(
            "mesh host(data: 2, mp: 2)\nmodel B {{\n  cosines: {layout} init cos(reshape(cast(arange(24), f32), [4, 6]) * 0.1)\n  w: f32[6@mp, 3] init normal(0.3)\n  freeze(cosines)\n  fn forward(x: f32[B@data, 4]) -> f32[B@data, 3] {{ reduce((x @ cosines) @ w) }}\n}}\ntrain B on host {{ data: synthetic(classes: 3), batch: 8, steps: 3, optimizer: sgd(lr: 0.1) }}\n"
        );
        let (prog, cfg, _) = setup_text("buffer.shard", &text, &[], None);
        let p = prog
            .params
            .iter()
            .find(|p| p.name == "cosines")
            .expect("cosines");
        let v = shardc::runtime::buffers::initial(&prog, p, cfg.seed).expect("computed");
        assert_eq!(v.len(), 24);
        for (i, x) in v.iter().enumerate() {
            assert!(
                (x - (i as f64 * 0.1).cos()).abs() < 1e-12,
                "{layout}[{i}]: {x}"
            );
        }
        compare_text(
            "buffer.shard",
            &text,
            &[("data", 2), ("mp", 2)],
            &[("data", 1), ("mp", 1)],
            None,
        );
        finite_differences("buffer.shard", &text, &[("data", 2), ("mp", 2)]);
    }
}

/// A frozen table is looked up and never updated: a checkpoint after training
/// holds its initial rows and no optimizer slots for it.
#[test]
fn a_frozen_table_keeps_its_rows_and_no_slots() {
    let base = std::env::temp_dir().join(format!("shardc-frozen-table-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let text = format!(
        "mesh host(data: 2)\ntable words {{ vocab: 32, dim: 4, frozen: true, shard: rows(data) }}\nfeature ids: i32[B, 2] -> words\nmodel Bag {{\n  w: f32[4, 3] init normal(0.3)\n  fn forward(x: i32[B@data, 2]) -> f32[B@data, 3] {{ lookup(ids, x) @ w }}\n}}\ntrain Bag on host {{ data: synthetic(classes: 3), batch: 8, steps: 4, optimizer: adam(lr: 0.1), checkpoint: {{ every: 4, dir: \"{}\" }} }}\n",
        base.display()
    );
    let (prog, cfg, src) = setup_text("table.shard", &text, &[], None);
    train::run(&prog, &cfg, &src, false, &mut |_| {}).expect("run");
    let mut resumed = cfg.clone();
    shardc::runtime::checkpoint::resume(&prog, &mut resumed).expect("resume");
    let p = prog
        .params
        .iter()
        .find(|p| p.name == "tables.words")
        .expect("table");
    assert!(p.frozen);
    let initial = shardc::runtime::buffers::initial(&prog, p, cfg.seed).expect("initial");
    let saved = resumed.init.get("tables.words").expect("saved rows");
    assert_eq!(saved.len(), initial.len());
    for (i, (a, b)) in saved.iter().zip(&initial).enumerate() {
        assert_eq!(*a as f32, *b as f32, "row element {i} changed");
    }
    let w0 = shardc::runtime::buffers::initial(&prog, &prog.params[1], cfg.seed).expect("w");
    let w = resumed.init.get("w").expect("saved w");
    assert!(
        w.iter().zip(&w0).any(|(a, b)| *a as f32 != *b as f32),
        "the dense weight trained"
    );
    assert!(resumed
        .init_opt
        .keys()
        .all(|k| !k.ends_with("tables.words")));
    assert!(resumed.init_opt.contains_key("opt_m/w"));
    let _ = std::fs::remove_dir_all(&base);
}
