//! `split`, the multi-result op, and `let (a, b, ...) =` that names its
//! results: parts by count and by sizes, along a dimension split over the
//! mesh (gathered) and along a whole one; sharded against one device and
//! against finite differences; the parts equal slices of the operand.

mod numerics;

use numerics::*;

const GATE: &str = "mesh host(data: 2, mp: 2)\n\nmodel Gate {\n  w: f32[8, 6@mp] init normal(0.3)\n  v: f32[3, 4] init normal(0.3)\n  fn forward(x: f32[B@data, 8]) -> f32[B@data, 4] {\n    let (a, b) = split(x @ w, 2, dim: 1)\n    let (c, d, e) = split(a * sigmoid(b), [1, 1, 1], dim: 1)\n    concat(c, d * e, e, dim: 1) @ v\n  }\n}\n\ntrain Gate on host {\n  data: synthetic(classes: 4)\n  batch: 8, steps: 3\n  optimizer: adam(lr: 1e-2)\n}\n";

#[test]
fn split_sharded_equals_one_device() {
    compare_text(
        "split_mesh.shard",
        GATE,
        &[("data", 2), ("mp", 2)],
        &[("data", 1), ("mp", 1)],
        None,
    );
}

#[test]
fn split_gradients_match_finite_differences() {
    finite_differences("split_fd.shard", GATE, &[("data", 2), ("mp", 2)]);
}

/// The parts of `split` are the operand's consecutive ranges: a model built
/// from `split` and one built from slices train identically (f64).
#[test]
fn split_parts_equal_slices() {
    let sliced = GATE
        .replace(
            "let (a, b) = split(x @ w, 2, dim: 1)",
            "let h = all_gather(x @ w, mp, dim: 1)\n    let a = h[:, 0:3]\n    let b = h[:, 3:6]",
        )
        .replace(
            "let (c, d, e) = split(a * sigmoid(b), [1, 1, 1], dim: 1)",
            "let g = a * sigmoid(b)\n    let c = g[:, 0:1]\n    let d = g[:, 1:2]\n    let e = g[:, 2:3]",
        );
    assert_ne!(sliced, GATE);
    let run = |name: &str, text: &str| {
        let (prog, mut cfg, src) = setup_text(name, text, &[], None);
        cfg.dtype = candle_core::DType::F64;
        shardc::runtime::train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("runs")
            .losses
    };
    let (a, b) = (run("split_a.shard", GATE), run("split_b.shard", &sliced));
    assert_eq!(a.len(), 3);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-12 * x.abs().max(1.0), "{a:?} vs {b:?}");
    }
}
