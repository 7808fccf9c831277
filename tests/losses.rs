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

/// The masked-loss model of `scripts/masked_fixtures.py`: an embedding and a
/// vocabulary-parallel projection (logits `E[x] @ W`), its cross-entropy
/// ignoring the targets equal to `ignore`.
fn masked_model(data: &str, ignore: i64, accumulate: usize) -> String {
    format!("import nn\nmesh host(dp: 2, tp: 2)\nconst V = 16\nconst D = 8\nconst T = 6\nmodel Masked {{\n  emb = Embed(V, D)\n  w: f32[D, V@tp] init normal(0.5)\n  fn forward(x: i32[B@dp, T]) -> f32[B@dp, T, V@tp] {{ emb(x) @ w }}\n}}\ntrain Masked on host {{\n  data: arrays(path: \"{data}.npz\"), batch: 8, steps: 3, accumulate: {accumulate}\n  loss: softmax_cross_entropy(ignore_index: {ignore})\n  metrics: [accuracy]\n  optimizer: sgd(lr: 0.5)\n}}\n")
}

/// The fixture's numpy reference (`tests/fixtures/masked/reference.json`).
fn masked_reference() -> serde_json::Value {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/masked/reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("the fixture")).expect("JSON")
}

fn floats(v: &serde_json::Value) -> Vec<f64> {
    v.as_array()
        .expect("a list")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}

/// Losses of 3 steps of `text` from the fixture's initial parameters, each
/// step's report seen by `each`.
fn fixture_train(
    file: &str,
    text: &str,
    mesh: &[(&str, i64)],
    f64: bool,
    each: &mut dyn FnMut(&train::StepReport),
) -> Vec<f64> {
    let r = masked_reference();
    let (prog, mut cfg, src) = setup_text(file, text, mesh, None);
    if f64 {
        cfg.dtype = candle_core::DType::F64;
    }
    cfg.init = [("emb.w", floats(&r["embed"])), ("w", floats(&r["head"]))]
        .into_iter()
        .map(|(n, v)| (n.to_string(), v))
        .collect();
    train::run(&prog, &cfg, &src, false, each)
        .expect("runs")
        .losses
}

/// Losses and accuracies of 3 steps of the masked model from the fixture's
/// initial parameters.
fn masked_run(data: &str, mesh: &[(&str, i64)], accumulate: usize, f64: bool) -> [Vec<f64>; 2] {
    let ignore = masked_reference()["data"][data]["ignore_index"]
        .as_i64()
        .expect("an id");
    let file = format!("tests/fixtures/masked/{data}_{accumulate}.shard");
    let text = masked_model(data, ignore, accumulate);
    let mut accuracy = Vec::new();
    let losses = fixture_train(&file, &text, mesh, f64, &mut |s| {
        accuracy.push(s.metrics[0].1)
    });
    [losses, accuracy]
}

/// A masked LM (Hugging Face's -100 labels) and a padded LM (the pad id
/// ignored): the loss is the mean over the step's counted targets, as numpy
/// computes it, on one device, on a dp × tp mesh (the logits split over the
/// vocabulary) and with `accumulate: 2` (whose microbatches count different
/// numbers of targets: each divides by the whole step's count); accuracy
/// counts only those targets.
#[test]
fn ignored_targets_count_neither_in_the_loss_nor_its_mean() {
    let r = masked_reference();
    for data in ["mlm", "padded"] {
        let want = floats(&r["data"][data]["losses"]);
        let want_acc = floats(&r["data"][data]["accuracy"]);
        for (mesh, acc) in [
            (&[("dp", 1), ("tp", 1)], 1),
            (&[("dp", 2), ("tp", 2)], 1),
            (&[("dp", 1), ("tp", 1)], 2),
            (&[("dp", 2), ("tp", 2)], 2),
        ] {
            let [got, accuracy] = masked_run(data, mesh, acc, true);
            let d = max_rel(&got, &want);
            assert!(
                d < 1e-12,
                "{data} {mesh:?} accumulate {acc}: {got:?} vs numpy {want:?}"
            );
            assert_eq!(accuracy.len(), 3);
            for (a, b) in accuracy.iter().zip(&want_acc) {
                assert!(
                    (a - b).abs() < 1e-12,
                    "{data} {mesh:?}: accuracy {accuracy:?} vs {want_acc:?}"
                );
            }
        }
        // In f32, accumulation equals the full batch.
        let [full, _] = masked_run(data, &[("dp", 2), ("tp", 2)], 1, false);
        let [halves, _] = masked_run(data, &[("dp", 2), ("tp", 2)], 2, false);
        let d = max_rel(&halves, &full);
        assert!(d < 1e-6, "{data}: accumulate 2 {halves:?} vs {full:?}");
        assert!(
            max_rel(&full, &want) < 1e-5,
            "{data}: f32 {full:?} vs {want:?}"
        );
    }
}

/// The masked loss's gradients against finite differences, on a dp × tp mesh.
#[test]
fn ignored_targets_gradients_match_finite_differences() {
    for (data, ignore) in [("mlm", -100), ("padded", 0)] {
        finite_differences(
            &format!("tests/fixtures/masked/{data}_fd.shard"),
            &masked_model(data, ignore, 1),
            &[("dp", 2), ("tp", 2)],
        );
    }
}

/// Through a pipeline (2 stages, 2 microbatches that count different numbers
/// of targets), the padded LM's losses and accuracies equal one device's.
#[test]
fn ignored_targets_through_a_pipeline_equal_one_device() {
    let text = "import nn\nmesh host(pp: 2, dp: 2)\nconst V = 16\nconst D = 8\nconst T = 6\nlayer Block(D) {\n  w: f32[D, D] init normal(0.3)\n  fn forward(x: f32[B@dp, T, D]) -> f32[B@dp, T, D] { tanh(x @ w) }\n}\nmodel Piped {\n  emb = Embed(V, D)\n  blocks = repeat(2, Block(D), stages: pp, microbatches: 2)\n  w: f32[D, V] init normal(0.5)\n  fn forward(x: i32[B@dp, T]) -> f32[B@dp, T, V] { blocks(emb(x)) @ w }\n}\ntrain Piped on host {\n  data: arrays(path: \"padded.npz\"), batch: 8, steps: 3\n  loss: softmax_cross_entropy(ignore_index: 0)\n  metrics: [accuracy]\n  optimizer: sgd(lr: 0.5)\n}\n";
    let run = |mesh: &[(&str, i64)]| {
        let (prog, mut cfg, src) =
            setup_text("tests/fixtures/masked/piped.shard", text, mesh, None);
        cfg.dtype = candle_core::DType::F64;
        let mut seen = Vec::new();
        train::run(&prog, &cfg, &src, false, &mut |r| {
            seen.push((r.loss, r.metrics[0].1))
        })
        .expect("runs");
        seen
    };
    let (staged, one) = (run(&[("pp", 2), ("dp", 2)]), run(&[("pp", 1), ("dp", 1)]));
    assert_eq!(staged.len(), 3);
    for ((l2, a2), (l1, a1)) in staged.iter().zip(&one) {
        assert!((l2 - l1).abs() < 1e-12 * l1.abs(), "{staged:?} vs {one:?}");
        assert!((a2 - a1).abs() < 1e-12, "{staged:?} vs {one:?}");
    }
}

/// The weighted model: the masked model's logits, and a loss function
/// taking per-token weights from the data (the array `mask`), normalised by
/// the step's total weight.
fn weighted_model(accumulate: usize) -> String {
    format!("import nn\nmesh host(dp: 2, tp: 2)\nconst V = 16\nconst D = 8\nconst T = 6\nmodel Weighted {{\n  emb = Embed(V, D)\n  w: f32[D, V@tp] init normal(0.5)\n  fn forward(x: i32[B@dp, T]) -> f32[B@dp, T, V@tp] {{ emb(x) @ w }}\n  fn weighted(z: f32[B@dp, T, V@tp], y: i32[B@dp, T], mask: f32[B@dp, T]) -> f32[] {{\n    sum(mask * softmax_cross_entropy_rows(z, y)) / step_total(mask)\n  }}\n}}\ntrain Weighted on host {{\n  data: arrays(path: \"weighted.npz\"), batch: 8, steps: 3, accumulate: {accumulate}\n  loss: weighted\n  optimizer: sgd(lr: 0.5)\n}}\n")
}

/// Losses of 3 steps of `text` from the fixture's initial parameters.
fn fixture_run(file: &str, text: &str, mesh: &[(&str, i64)], f64: bool) -> Vec<f64> {
    fixture_train(file, text, mesh, f64, &mut |_| {})
}

/// A loss function with per-token weights from the data: the weighted mean
/// over each step's whole batch, as numpy computes it, on one device, on a
/// dp × tp mesh and with `accumulate: 2` (whose microbatches hold different
/// total weights: `step_total` divides each by the step's).
#[test]
fn weighted_loss_function_equals_numpy_on_every_mesh_and_accumulation() {
    let want = floats(&masked_reference()["data"]["weighted"]["losses"]);
    for (mesh, acc) in [
        (&[("dp", 1), ("tp", 1)], 1),
        (&[("dp", 2), ("tp", 2)], 1),
        (&[("dp", 1), ("tp", 1)], 2),
        (&[("dp", 2), ("tp", 2)], 2),
        (&[("dp", 2), ("tp", 1)], 4),
    ] {
        let file = format!("tests/fixtures/masked/weighted_{acc}.shard");
        let got = fixture_run(&file, &weighted_model(acc), mesh, true);
        let d = max_rel(&got, &want);
        assert!(
            d < 1e-12,
            "{mesh:?} accumulate {acc}: {got:?} vs numpy {want:?}"
        );
    }
    // In f32, accumulation equals the full batch.
    let file = "tests/fixtures/masked/weighted_f32.shard";
    let mesh = &[("dp", 2), ("tp", 2)];
    let full = fixture_run(file, &weighted_model(1), mesh, false);
    let halves = fixture_run(file, &weighted_model(2), mesh, false);
    assert!(max_rel(&halves, &full) < 1e-6, "{halves:?} vs {full:?}");
    assert!(max_rel(&full, &want) < 1e-5, "f32 {full:?} vs {want:?}");
}

/// Without `step_total`, each microbatch divides by its own total weight:
/// accumulation changes the loss, which is why `step_total` exists.
#[test]
fn a_per_microbatch_normaliser_differs_under_accumulation() {
    let text = |acc| weighted_model(acc).replace("step_total(mask)", "psum(sum(mask), dp)");
    let file = "tests/fixtures/masked/weighted_local.shard";
    let mesh = &[("dp", 2), ("tp", 2)];
    let full = fixture_run(file, &text(1), mesh, true);
    let halves = fixture_run(file, &text(2), mesh, true);
    let want = floats(&masked_reference()["data"]["weighted"]["losses"]);
    assert!(max_rel(&full, &want) < 1e-12, "{full:?} vs {want:?}");
    assert!(max_rel(&halves, &full) > 1e-4, "{halves:?} vs {full:?}");
}

/// The weighted loss's gradients against finite differences, on dp × tp.
#[test]
fn weighted_loss_gradients_match_finite_differences() {
    finite_differences(
        "tests/fixtures/masked/weighted_fd.shard",
        &weighted_model(1),
        &[("dp", 2), ("tp", 2)],
    );
}

/// Through a pipeline (2 stages, 2 microbatches of different total weight),
/// the weighted loss equals one device's and numpy's.
#[test]
fn weighted_loss_through_a_pipeline_equals_one_device() {
    let text = "import nn\nmesh host(pp: 2, dp: 2)\nconst V = 16\nconst D = 8\nconst T = 6\nlayer Block(D) {\n  w: f32[D, D] init normal(0.3)\n  fn forward(x: f32[B@dp, T, D]) -> f32[B@dp, T, D] { tanh(x @ w) }\n}\nmodel Piped {\n  emb = Embed(V, D)\n  blocks = repeat(2, Block(D), stages: pp, microbatches: 2)\n  w: f32[D, V] init normal(0.5)\n  fn forward(x: i32[B@dp, T]) -> f32[B@dp, T, V] { blocks(emb(x)) @ w }\n  fn weighted(z: f32[B@dp, T, V], y: i32[B@dp, T], mask: f32[B@dp, T]) -> f32[] {\n    sum(mask * softmax_cross_entropy_rows(z, y)) / step_total(mask)\n  }\n}\ntrain Piped on host {\n  data: arrays(path: \"weighted.npz\"), batch: 8, steps: 3\n  loss: weighted\n  optimizer: sgd(lr: 0.5)\n}\n";
    let run = |text: &str, mesh: &[(&str, i64)]| {
        let (prog, mut cfg, src) = setup_text(
            "tests/fixtures/masked/weighted_piped.shard",
            text,
            mesh,
            None,
        );
        cfg.dtype = candle_core::DType::F64;
        train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("runs")
            .losses
    };
    let staged = run(text, &[("pp", 2), ("dp", 2)]);
    // One device, and the whole batch at once.
    let one = run(
        &text.replace("microbatches: 2", "microbatches: 1"),
        &[("pp", 1), ("dp", 1)],
    );
    assert_eq!(staged.len(), 3);
    assert!(max_rel(&staged, &one) < 1e-12, "{staged:?} vs {one:?}");
}

/// Data without the loss function's weights: E0305 naming the array, the
/// parameter it feeds and what the file holds.
#[test]
fn missing_weights_array_is_named() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/masked");
    let text = weighted_model(1).replace("weighted.npz", "padded.npz");
    let c = shardc::world::compile_source(&dir.join("nomask.shard"), text, &Default::default());
    let errors: Vec<_> = c.diagnostics.iter().filter(|d| d.is_error()).collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    let d = errors[0];
    assert_eq!(d.code.as_str(), "E0305");
    assert!(d.message.contains("has no array `mask`"), "{}", d.message);
    let help = d.help.as_deref().unwrap_or_default();
    assert!(
        help.contains("third parameter `mask`") && help.contains("`x` and `y`"),
        "{help}"
    );
}
