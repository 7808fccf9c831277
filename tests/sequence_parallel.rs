//! Megatron sequence parallelism written as shardings: between the
//! tensor-parallel matmuls, activations (norms, residuals) keep the sequence
//! split over `tp`; the checker inserts an all-gather before the
//! column-parallel matmul and a reduce-scatter after the row-parallel one, in
//! place of the all-reduce plain tensor parallelism needs. The losses equal
//! plain tensor parallelism's and one device's.

mod numerics;

use numerics::*;
use shardc::runtime::train;

/// A two-block transformer MLP stack; `seq` is the activations' sequence
/// layout between blocks (`T@tp` for sequence parallelism, `T` without).
fn model(seq: &str, gathered: &str, reduced: &str) -> String {
    format!(
        "import nn\n\nmesh m(dp: 2, tp: 2)\n\nconst T = 8\nconst D = 16\n\nlayer Block(D) {{\n  ln = LayerNorm(D)\n  w1: f32[D, 4 * D@tp] init normal(0.2)\n  w2: f32[4 * D@tp, D] init normal(0.2)\n  fn forward(x: f32[B@dp, {seq}, D]) -> f32[B@dp, {seq}, D] {{\n    let g: f32[B@dp, {gathered}, D] = ln(x)\n    let y: f32[B@dp, {reduced}, D] = gelu(g @ w1) @ w2\n    x + y\n  }}\n}}\n\nmodel M {{\n  blocks = repeat(2, Block(D))\n  head: f32[D, 4] init normal(0.3)\n  fn forward(x: f32[B@dp, {seq}, D]) -> f32[B@dp, {seq}, 4] {{ blocks(x) @ head }}\n}}\n\ntrain M on m {{\n  data: synthetic(), batch: 8, steps: 10, seed: 3\n  loss: mse\n  optimizer: adam(lr: 1e-2)\n}}\n"
    )
}

fn sp() -> String {
    model("T@tp", "T@_", "T@tp")
}

fn tp() -> String {
    model("T", "T", "T")
}

fn losses(name: &str, text: &str, mesh: &[(&str, i64)]) -> Vec<f64> {
    let (prog, cfg, src) = setup_text(name, text, mesh, None);
    train::run(&prog, &cfg, &src, false, &mut |_| {})
        .expect("runs")
        .losses
}

#[test]
fn sequence_parallel_losses_equal_tensor_parallel_ones() {
    let a = losses("sp.shard", &sp(), &[]);
    let b = losses("tp.shard", &tp(), &[]);
    let one = losses("sp1.shard", &sp(), &[("dp", 1), ("tp", 1)]);
    assert_eq!(a.len(), 10);
    for ((x, y), z) in a.iter().zip(&b).zip(&one) {
        assert!(
            ((x - y) / y).abs() < 1e-6,
            "{a:?}\nvs tensor parallel\n{b:?}"
        );
        assert!(((x - z) / z).abs() < 1e-6, "{a:?}\nvs one device\n{one:?}");
    }
}

#[test]
fn sequence_parallel_gradients_match_one_device() {
    compare_text(
        "sp_grads.shard",
        &sp(),
        &[("dp", 2), ("tp", 2)],
        &[("dp", 1), ("tp", 1)],
        None,
    );
}

/// The plan: an all-gather and a reduce-scatter over `tp` per block and
/// pass, no activation all-reduce; plain tensor parallelism all-reduces.
#[test]
fn the_plan_shows_reduce_scatter_and_all_gather_in_place_of_all_reduce() {
    let plan = |name: &str, text: &str| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
        let c = shardc::world::compile_source(&path, text.to_string(), &Default::default());
        assert!(!c.has_errors());
        c.plans.first().cloned().expect("a plan")
    };
    let kinds = |p: &shardc::plan::Plan| -> Vec<(String, u64)> {
        p.comms
            .iter()
            .filter(|c| c.axes == ["tp"])
            .map(|c| (c.kind.clone(), c.count))
            .collect()
    };
    let s = plan("sp_plan.shard", &sp());
    assert_eq!(
        kinds(&s),
        [
            ("all-gather".to_string(), 4),
            ("reduce-scatter".to_string(), 4)
        ]
    );
    let t = plan("tp_plan.shard", &tp());
    assert_eq!(kinds(&t), [("all-reduce".to_string(), 4)]);
    // Half the activations between the matmuls, the same bytes moved.
    assert!(s.activations < t.activations);
    let bytes = |p: &shardc::plan::Plan| -> f64 {
        p.comms
            .iter()
            .filter(|c| c.axes == ["tp"])
            .map(|c| c.bytes * c.count as f64)
            .sum()
    };
    assert_eq!(bytes(&s), bytes(&t));
}
