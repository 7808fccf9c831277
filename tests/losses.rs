//! Losses and metrics beside softmax cross-entropy: sigmoid binary
//! cross-entropy (its value where it is known, its gradients against finite
//! differences, sharded against one device) and the metrics logged each step
//! (accuracy and AUC from hand-computed cases).

mod numerics;

use numerics::*;
use shardc::runtime::train;
use shardc::spec::{Metric, AUC_BINS};

/// A model whose logit is `x @ w + b`, trained on synthetic 0/1 targets.
fn logistic(w_init: &str, metrics: &str) -> String {
    format!("mesh host(data: 2)\nmodel Logit {{\n  w: f32[6, 1] init {w_init}\n  b: f32[1] init zeros\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 1] {{ x @ w + b }}\n}}\ntrain Logit on host {{\n  data: synthetic(), batch: 16, steps: 3\n  loss: sigmoid_binary_cross_entropy{metrics}\n  optimizer: sgd(lr: 0.5)\n}}\n")
}

/// At logit 0 every element costs ln 2, whatever its target.
#[test]
fn binary_cross_entropy_at_zero_logits_is_ln_2() {
    let (prog, mut cfg, src) = setup_text("bce.shard", &logistic("zeros", ""), &[], None);
    cfg.dtype = candle_core::DType::F64;
    cfg.steps = 1;
    let out = train::run(&prog, &cfg, &src, false, &mut |_| {}).expect("runs");
    assert!(
        (out.losses[0] - std::f64::consts::LN_2).abs() < 1e-12,
        "{}",
        out.losses[0]
    );
}

#[test]
fn binary_cross_entropy_gradients_match_finite_differences() {
    finite_differences("bce_fd.shard", &logistic("normal(0.5)", ""), &[]);
}

#[test]
fn binary_cross_entropy_sharded_equals_one_device() {
    compare_text(
        "bce_mesh.shard",
        &logistic("normal(0.5)", ""),
        &[("data", 2)],
        &[("data", 1)],
        None,
    );
}

/// Accuracy and AUC are logged each step, and do not depend on the mesh.
#[test]
fn metrics_are_logged_and_equal_on_every_mesh() {
    let text = logistic("normal(0.5)", "\n  metrics: [accuracy, auc]");
    let run = |mesh: &[(&str, i64)]| {
        let (prog, cfg, src) = setup_text("bce_metrics.shard", &text, mesh, None);
        let mut seen = Vec::new();
        train::run(&prog, &cfg, &src, false, &mut |r| {
            seen.push(r.metrics.clone())
        })
        .expect("runs");
        seen
    };
    let (two, one) = (run(&[("data", 2)]), run(&[("data", 1)]));
    assert_eq!(two.len(), 3);
    for (a, b) in two.iter().zip(&one) {
        assert_eq!(
            a.iter().map(|m| m.0).collect::<Vec<_>>(),
            [Metric::Accuracy, Metric::Auc]
        );
        for ((_, x), (_, y)) in a.iter().zip(b) {
            assert!(
                (x - y).abs() < 1e-12 && (0.0..=1.0).contains(x),
                "{x} vs {y}"
            );
        }
    }
}

/// Positives in bins 500 and 900, negatives in bins 100 and 500: of the four
/// (positive, negative) pairs three rank right and one ties (half): 3.5 / 4.
#[test]
fn auc_from_binned_scores() {
    let mut sums = vec![0.0; 2 * AUC_BINS];
    sums[500] += 1.0;
    sums[900] += 1.0;
    sums[AUC_BINS + 100] += 1.0;
    sums[AUC_BINS + 500] += 1.0;
    assert_eq!(Metric::Auc.value(&sums), 0.875);
    // Perfectly separated, and inverted.
    let mut sums = vec![0.0; 2 * AUC_BINS];
    sums[AUC_BINS - 1] = 5.0;
    sums[AUC_BINS] = 7.0;
    assert_eq!(Metric::Auc.value(&sums), 1.0);
    let mut sums = vec![0.0; 2 * AUC_BINS];
    sums[0] = 5.0;
    sums[2 * AUC_BINS - 1] = 7.0;
    assert_eq!(Metric::Auc.value(&sums), 0.0);
    // One class only: undefined.
    let mut sums = vec![0.0; 2 * AUC_BINS];
    sums[3] = 2.0;
    assert!(Metric::Auc.value(&sums).is_nan());
    assert_eq!(Metric::Accuracy.value(&[3.0, 4.0]), 0.75);
}

/// `add_loss` adds `weight × term` to the loss: its value is the plain loss
/// plus the weighted term, its gradient matches finite differences, and a
/// sharded run equals one device (the replicated term's cotangent is split
/// over the devices holding it).
#[test]
fn added_loss_joins_the_loss_and_its_gradient() {
    let text = |weight: &str| {
        format!("mesh host(data: 2)\nmodel Net {{\n  w: f32[8, 4] init normal(0.5)\n  fn forward(x: f32[B@data, 8]) -> f32[B@data, 4] {{\n    let y = x @ w\n    add_loss(y, reduce(mean(y * y)), weight: {weight}, name: l2)\n  }}\n}}\ntrain Net on host {{ data: synthetic(classes: 4), batch: 8, steps: 2, optimizer: sgd(lr: 0.1) }}\n")
    };
    let run = |weight: &str| {
        let (prog, mut cfg, src) = setup_text("aux.shard", &text(weight), &[], None);
        cfg.dtype = candle_core::DType::F64;
        cfg.steps = 1;
        let mut term = 0.0;
        let out =
            train::run(&prog, &cfg, &src, false, &mut |r| term = r.observed[0].1[0]).expect("runs");
        (out.losses[0], term)
    };
    let (plain, term) = run("0.0");
    let (with, term2) = run("0.5");
    assert_eq!(term, term2);
    assert!(term > 0.0);
    assert!(
        (with - (plain + 0.5 * term)).abs() < 1e-12,
        "{with} vs {plain} + 0.5 × {term}"
    );
    finite_differences("aux_fd.shard", &text("0.5"), &[]);
    compare_text(
        "aux_mesh.shard",
        &text("0.5"),
        &[("data", 2)],
        &[("data", 1)],
        None,
    );
}

/// A pipelined model: `add_loss` inside its stages and after them, an
/// `observe`d value, and metrics. The losses, gradients, logged values and
/// metrics equal the same model on one device (the stages' values cross the
/// stage axis once per step; a term's cotangent is split only over the
/// devices of its own stage).
#[test]
fn a_pipelined_model_adds_losses_observes_and_logs_metrics() {
    let text = "mesh host(pp: 2, data: 2)\nlayer Block(D) {\n  w: f32[D, D] init normal(0.4)\n  fn forward(x: f32[B@data, D]) -> f32[B@data, D] {\n    let h = tanh(x @ w)\n    add_loss(h, reduce(mean(h * h)), weight: 0.1, name: act)\n  }\n}\nmodel Deep {\n  blocks = repeat(4, Block(6), stages: pp, microbatches: 2)\n  head: f32[6, 1] init normal(0.5)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 1] {\n    let z = blocks(x) @ head\n    let zz: f32[] = mean(z * z)\n    observe(add_loss(z, zz, weight: 0.01, name: size), zz, name: seen)\n  }\n}\ntrain Deep on host {\n  data: synthetic(), batch: 8, steps: 3, seed: 2\n  loss: sigmoid_binary_cross_entropy\n  metrics: [accuracy, auc]\n  optimizer: sgd(lr: 0.2)\n}\n";
    compare_text(
        "pipe_aux.shard",
        text,
        &[("pp", 2), ("data", 2)],
        &[("pp", 1), ("data", 1)],
        None,
    );
    finite_differences("pipe_aux_fd.shard", text, &[("pp", 2), ("data", 2)]);
    let run = |mesh: &[(&str, i64)]| {
        let (prog, mut cfg, src) = setup_text("pipe_aux_log.shard", text, mesh, None);
        cfg.dtype = candle_core::DType::F64;
        let mut seen = Vec::new();
        train::run(&prog, &cfg, &src, false, &mut |r| {
            seen.push((r.loss, r.observed.clone(), r.metrics.clone()))
        })
        .expect("runs");
        seen
    };
    let (staged, one) = (
        run(&[("pp", 2), ("data", 2)]),
        run(&[("pp", 1), ("data", 1)]),
    );
    assert_eq!(staged.len(), 3);
    for ((l2, o2, m2), (l1, o1, m1)) in staged.iter().zip(&one) {
        assert!((l2 - l1).abs() < 1e-12 * l1.abs().max(1.0), "{l2} vs {l1}");
        let names: Vec<&str> = o2.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["act", "size", "seen"], "{o2:?}");
        for ((n2, v2), (n1, v1)) in o2.iter().zip(o1) {
            assert_eq!(n2, n1);
            assert!(v2[0] > 0.0, "{n2}: {v2:?}");
            assert!((v2[0] - v1[0]).abs() < 1e-12, "{n2}: {v2:?} vs {v1:?}");
        }
        assert_eq!(m2.len(), 2, "{m2:?}");
        assert_eq!(m2, m1);
    }
}
