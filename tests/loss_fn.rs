//! A loss written as a function of the model (`loss: NAME` naming a `fn` of
//! the output and the targets): equal to the built-in loss it restates, its
//! gradients against finite differences, sharded against one device (the
//! output split over two axes), pipelined, and targets of either kind.

mod numerics;

use numerics::*;
use shardc::runtime::train;

/// A classifier whose logits are split over `mp`, trained with `loss`.
fn classifier(loss: &str, loss_fn: &str) -> String {
    format!(
        "mesh host(data: 2, mp: 2)\nmodel Cls {{\n  w: f32[6, 4@mp] init normal(0.5)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 4@mp] {{ x @ w }}\n{loss_fn}}}\ntrain Cls on host {{\n  data: synthetic(classes: 4), batch: 8, steps: 3, seed: 3\n  loss: {loss}\n  optimizer: adam(lr: 0.05)\n}}\n"
    )
}

fn losses_f64(name: &str, text: &str, steps: usize) -> Vec<f64> {
    let (prog, mut cfg, src) = setup_text(name, text, &[], None);
    cfg.dtype = candle_core::DType::F64;
    cfg.steps = steps;
    train::run(&prog, &cfg, &src, false, &mut |_| {})
        .expect("runs")
        .losses
}

/// A loss function calling the `softmax_cross_entropy` op trains exactly as
/// `loss: softmax_cross_entropy` does (same data: integer targets are class
/// ids).
#[test]
fn a_loss_function_restating_cross_entropy_equals_the_built_in() {
    let f =
        "  fn ce(z: f32[B@data, 4@mp], y: i32[B@data]) -> f32[] { softmax_cross_entropy(z, y) }\n";
    let built_in = losses_f64("lf_ce_a.shard", &classifier("softmax_cross_entropy", ""), 5);
    let custom = losses_f64("lf_ce_b.shard", &classifier("ce", f), 5);
    assert_eq!(built_in.len(), 5);
    for (a, b) in built_in.iter().zip(&custom) {
        assert!(
            (a - b).abs() <= 1e-12 * a.abs().max(1.0),
            "{built_in:?} vs {custom:?}"
        );
    }
}

/// Mean squared error written out equals `loss: mse` (float targets).
#[test]
fn a_loss_function_restating_mse_equals_the_built_in() {
    let f = "  fn sq(z: f32[B@data, 4@mp], y: f32[B@data, 4@mp]) -> f32[] { mean((z - y) * (z - y)) }\n";
    let built_in = losses_f64("lf_mse_a.shard", &classifier("mse", ""), 5);
    let custom = losses_f64("lf_mse_b.shard", &classifier("sq", f), 5);
    for (a, b) in built_in.iter().zip(&custom) {
        assert!(
            (a - b).abs() <= 1e-12 * a.abs().max(1.0),
            "{built_in:?} vs {custom:?}"
        );
    }
}

/// A loss no built-in gives: label-smoothed cross-entropy plus a penalty on
/// the logits' size, with the logits split over `mp` and the rows over `data`.
const SMOOTHED: &str = "  fn smoothed(z: f32[B@data, 4@mp], y: i32[B@data]) -> f32[] {\n    let uniform: f32[] = mean(log_softmax(z))\n    let size: f32[] = mean(z * z)\n    0.9 * softmax_cross_entropy(z, y) - 0.1 * uniform + 0.01 * size\n  }\n";

#[test]
fn a_loss_function_gradients_match_finite_differences() {
    finite_differences("lf_fd.shard", &classifier("smoothed", SMOOTHED), &[]);
}

#[test]
fn a_loss_function_sharded_equals_one_device() {
    compare_text(
        "lf_mesh.shard",
        &classifier("smoothed", SMOOTHED),
        &[("data", 2), ("mp", 2)],
        &[("data", 1), ("mp", 1)],
        None,
    );
}

/// A pipelined model computes its loss function on the last stage.
#[test]
fn a_pipelined_model_trains_with_a_loss_function() {
    let text = "import nn\nmesh host(pp: 2, data: 2)\nlayer Block(D) {\n  w: f32[D, D] init normal(0.3)\n  fn forward(x: f32[B@data, D]) -> f32[B@data, D] { tanh(x @ w) }\n}\nmodel Deep {\n  blocks = repeat(2, Block(6), stages: pp, microbatches: 2)\n  head = Linear(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { head(blocks(x)) }\n  fn huber(z: f32[B@data, 3], y: f32[B@data, 3]) -> f32[] {\n    let a = abs(z - y)\n    mean(where(less(a, 1.0), 0.5 * a * a, a - 0.5))\n  }\n}\ntrain Deep on host {\n  batch: 8, steps: 3, seed: 1\n  loss: huber\n  optimizer: sgd(lr: 0.1)\n}\n";
    compare_text(
        "lf_pipe.shard",
        text,
        &[("pp", 2), ("data", 2)],
        &[("pp", 1), ("data", 1)],
        None,
    );
}
