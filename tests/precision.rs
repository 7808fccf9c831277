//! Mixed precision (`precision: bf16` or `f16` in `train`): the passes run in
//! the 16-bit type (working copies of the weights, activations, their
//! collectives) with softmax, norms, reductions, losses and sums over devices
//! accumulated in f32; master weights, gradients and optimizer state stay
//! f32. The four seed models train as in f32 (10-step loss averages within
//! 2% over 100 steps), `--mem` measures half the parameter and activation
//! bytes, and the plan predicts what is measured.

mod numerics;

use numerics::*;
use shardc::runtime::train;
use std::path::Path;

fn read(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).expect("model file")
}

/// `text` with every `train` declaring `precision: p`.
fn with_precision(text: &str, p: &str) -> String {
    let mut out = String::new();
    for l in text.lines() {
        out.push_str(l);
        out.push('\n');
        if l.starts_with("train ") && l.trim_end().ends_with('{') {
            out.push_str(&format!("  precision: {p}\n"));
        }
    }
    assert!(out.contains("precision:"), "no train to change");
    out
}

fn run(name: &str, text: &str, model: Option<&str>, steps: usize) -> train::RunOutput {
    let (prog, mut cfg, src) = setup_text(name, text, &[], model);
    cfg.steps = steps;
    train::run(&prog, &cfg, &src, false, &mut |_| {}).expect("runs")
}

/// 100 steps in f32 and in `p`: the 16-bit run is not the f32 one, and
/// every 10-step average of its losses is within 2% of f32's.
fn trains_like_f32(file: &str, model: Option<&str>, p: &str) {
    let text = read(file);
    let a = run(file, &text, model, 100).losses;
    let b = run(file, &with_precision(&text, p), model, 100).losses;
    assert_eq!((a.len(), b.len()), (100, 100));
    assert_ne!(a, b, "{file}: {p} computed exactly what f32 did");
    for (k, (x, y)) in a.chunks(10).zip(b.chunks(10)).enumerate() {
        let (x, y) = (x.iter().sum::<f64>(), y.iter().sum::<f64>());
        let r = ((y - x) / x).abs();
        assert!(
            r < 0.02,
            "{file} ({p}): steps {}-{} average {} vs {} in f32 ({:.2}%)\n{b:?}\nvs\n{a:?}",
            10 * k + 1,
            10 * k + 10,
            y / 10.0,
            x / 10.0,
            100.0 * r
        );
    }
}

#[test]
fn seed_000_trains_in_bf16_as_in_f32() {
    trains_like_f32("models/shakespeare.shard", None, "bf16");
}

#[test]
fn seed_001_trains_in_bf16_as_in_f32() {
    trains_like_f32("tests/models/gptj_small.shard", None, "bf16");
}

#[test]
fn seed_003_trains_in_bf16_as_in_f32() {
    trains_like_f32("models/fsdp_mlp.shard", Some("FSDPClassifier"), "bf16");
}

#[test]
fn seed_004_trains_in_bf16_as_in_f32() {
    trains_like_f32("tests/models/t3d_small.shard", None, "bf16");
}

#[test]
fn f16_trains_as_f32_too() {
    trains_like_f32("tests/models/gptj_small.shard", None, "f16");
}

/// The working copies of the weights and the activations take half the
/// bytes; master weights, gradients and optimizer state are f32; the plan
/// says exactly what is measured.
#[test]
fn mem_measures_half_the_parameter_and_activation_bytes() {
    let file = "tests/models/gptj_small.shard";
    let text = read(file);
    let half_text = with_precision(&text, "bf16");
    let full = run(file, &text, None, 1).memory.expect("measured");
    let half = run(file, &half_text, None, 1).memory.expect("measured");
    assert_eq!(half.params, full.params / 2.0);
    assert_eq!(half.activations, full.activations / 2.0);
    assert_eq!(half.master_params, full.params);
    assert_eq!(full.master_params, 0.0);
    assert_eq!(half.grads, full.grads);
    assert_eq!(half.optimizer_state, full.optimizer_state);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let c = shardc::world::compile_source(&path, half_text, &Default::default());
    let plan = c.plans.first().expect("a plan");
    assert_eq!(plan.precision, "bf16");
    assert_eq!(
        (plan.params, plan.master_params, plan.activations),
        (half.params, half.master_params, half.activations)
    );
    assert_eq!(plan.total_memory(), half.total());
}

/// The gradients a bf16 run takes its first step with are f32 and close to
/// f32's (bf16 has 8 significant bits: within a few percent).
#[test]
fn bf16_gradients_are_close_to_f32_ones() {
    let file = "tests/models/gptj_small.shard";
    let text = read(file);
    let grads = |text: &str| {
        let (prog, mut cfg, src) = setup_text(file, text, &[], None);
        cfg.steps = 1;
        train::run(&prog, &cfg, &src, true, &mut |_| {})
            .expect("runs")
            .first_grads
            .expect("grads")
    };
    let (a, b) = (grads(&text), grads(&with_precision(&text, "bf16")));
    for ((n, x), (_, y)) in a.iter().zip(&b) {
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let diff: Vec<f64> = x.iter().zip(y).map(|(p, q)| p - q).collect();
        let r = norm(&diff) / norm(x).max(1e-30);
        assert!(r < 0.05, "gradient of `{n}`: relative difference {r}");
        assert!(x != y, "`{n}`: bf16 gave f32's exact gradient");
    }
}

/// Held-out evaluation after a step sees the weights that step's update
/// left (16-bit copies taken again), as in f32.
#[test]
fn eval_sees_the_updated_weights() {
    let model = "import nn\nmesh m(data: 2)\nmodel C {\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { a(x) }\n}\n";
    let evals = |precision: &str| {
        let text = format!("{model}train C on m {{ data: synthetic(classes: 3), batch: 64, steps: 4, seed: 1, optimizer: sgd(lr: 8.0), eval: {{ every: 1, steps: 1 }}, precision: {precision} }}\n");
        let (prog, cfg, src) = setup_text("eval_bf16.shard", &text, &[], None);
        let mut out = Vec::new();
        train::run(&prog, &cfg, &src, false, &mut |r| out.extend(r.eval_loss)).expect("run");
        out
    };
    let (a, b) = (evals("f32"), evals("bf16"));

    assert_eq!((a.len(), b.len()), (4, 4));
    for w in a.windows(2) {
        assert!(
            ((w[1] - w[0]) / w[0]).abs() > 0.02,
            "the steps change little: {a:?}"
        );
    }
    for (x, y) in a.iter().zip(&b) {
        assert!(((x - y) / x).abs() < 0.01, "bf16 {b:?}\nvs f32 {a:?}");
    }
}
