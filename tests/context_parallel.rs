//! Context parallelism: `causal_attention` on a sequence split over a mesh
//! axis runs as ring attention (K/V blocks passed around the axis by
//! `ppermute`, online softmax) instead of gathering the sequence. A small
//! Llama with its sequence split over 4 devices trains like one device (1e-5),
//! its f64 gradients match one device's and finite differences, and the
//! activations a device keeps are a quarter of the unsplit ones (measured).

mod numerics;

use numerics::*;
use shardc::runtime::train;
use std::path::Path;

/// `models/llama.shard` with its sequence split over `cp` (4 devices) and
/// the batch over `dp`, no tensor parallelism.
fn llama_cp() -> String {
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("models/llama.shard"))
            .expect("the model");
    let swaps = [
        ("mesh pod(dp: 2, tp: 2)", "mesh pod(dp: 2, cp: 4)"),
        (
            "LlamaLM(VOCAB@tp, T, D, H@tp, KV@tp, E, F@tp, L, ROPE_BASE)",
            "LlamaLM(VOCAB, T@cp, D, H, KV, E, F, L, ROPE_BASE)",
        ),
        (
            "ids: i32[B@dp, T]) -> f32[B@dp, T, VOCAB@tp]",
            "ids: i32[B@dp, T@cp]) -> f32[B@dp, T@cp, VOCAB]",
        ),
    ];
    let mut out = text;
    for (a, b) in swaps {
        assert!(out.contains(a), "models/llama.shard changed: no `{a}`");
        out = out.replace(a, b);
    }
    out
}

/// Attention alone between two projections, the sequence split over `cp`.
fn attention(mesh: &str, t: i64) -> String {
    format!(
        "mesh m({mesh})\n\nconst T = {t}\nconst D = 8\nconst H = 2\n\nmodel M {{\n  wqkv: f32[D, 3, H, D / H] init normal(0.3)\n  wo: f32[H, D / H, D] init normal(0.3)\n  fn forward(x: f32[B, T@cp, D]) -> f32[B, T@cp, D] {{\n    let qkv = einsum(\"btd,dkhe->kbthe\", x, wqkv)\n    let a = causal_attention(qkv[0], qkv[1], qkv[2])\n    einsum(\"bthe,hed->btd\", a, wo)\n  }}\n}}\n\ntrain M on m {{\n  data: synthetic(), batch: 2, steps: 3, seed: 7\n  loss: mse\n  optimizer: adam(lr: 1e-2)\n}}\n"
    )
}

#[test]
fn a_llama_with_its_sequence_split_over_4_devices_trains_like_one_device() {
    trains_like_one_device(
        "models/llama_cp.shard",
        &llama_cp(),
        &[("dp", 1), ("cp", 1)],
    );
}

/// The first 10 losses (f32) of `text` on its own mesh equal those on the
/// mesh `one` (one device) to 1e-5.
fn trains_like_one_device(file: &str, text: &str, one: &[(&str, i64)]) {
    let losses = |mesh: &[(&str, i64)]| {
        let (prog, mut cfg, src) = setup_text(file, text, mesh, None);
        cfg.steps = 10;
        train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("runs")
            .losses
    };
    let (a, b) = (losses(&[]), losses(one));
    assert_eq!(a.len(), 10);
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            ((x - y) / y).abs() < 1e-5,
            "{file}: loss {}: {x} over cp vs {y} on one device",
            i + 1
        );
    }
}

#[test]
fn ring_attention_gradients_match_one_device_and_finite_differences() {
    compare_text(
        "models/llama_cp_grads.shard",
        &llama_cp(),
        &[("dp", 1), ("cp", 4)],
        &[("dp", 1), ("cp", 1)],
        None,
    );
    // Every block position: 4 devices of 2, and 3 of 2 (an odd ring).
    finite_differences("cp_fd.shard", &attention("cp: 4", 8), &[("cp", 4)]);
    finite_differences("cp_fd3.shard", &attention("cp: 3", 6), &[("cp", 3)]);
}

/// The lowered op carries its ring; the plan shows the ring's ppermutes
/// over `cp` and gathers nothing over it.
#[test]
fn the_ring_is_lowered_and_planned() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("cp_plan.shard");
    let c = shardc::world::compile_source(&path, attention("cp: 4", 8), &Default::default());
    assert!(!c.has_errors());
    let prog = c.programs.first().expect("a program");
    let lowered = prog.render(&c.sources);
    assert!(
        lowered.contains("causal_attention(%3, %4, %5, ring: cp)"),
        "{lowered}"
    );
    let plan = c.plans.first().expect("a plan");
    let on_cp: Vec<&str> = plan
        .comms
        .iter()
        .filter(|c| c.axes == ["cp"] && !c.kind.starts_with("grad"))
        .map(|c| c.kind.as_str())
        .collect();
    assert_eq!(on_cp, ["ppermute (ring attention)"], "{:?}", plan.comms);
}

/// What a device keeps for backward: a quarter over 4 devices (measured
/// and planned), since every value keeps its quarter of the sequence.
#[test]
fn attention_activations_per_device_are_a_quarter_over_4_devices() {
    let text = attention("cp: 4", 16);
    let measured = |mesh: &[(&str, i64)]| {
        let (prog, cfg, src) = setup_text("cp_mem.shard", &text, mesh, None);
        train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("runs")
            .memory
            .expect("measured")
            .activations
    };
    let (split, whole) = (measured(&[]), measured(&[("cp", 1)]));
    assert_eq!(split * 4.0, whole, "{split} vs {whole}");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("cp_mem.shard");
    let c = shardc::world::compile_source(&path, text, &Default::default());
    assert_eq!(c.plans.first().expect("a plan").activations, split);
}

/// Grouped-query attention (4 query heads, 2 key/value heads) through
/// `attention(…, causal:, window:)`, the sequence split over `cp`.
fn windowed(mesh: &str, t: i64, mask: &str) -> String {
    format!(
        "mesh m({mesh})\n\nconst T = {t}\nconst D = 8\nconst H = 4\nconst KV = 2\nconst E = 2\n\nmodel W {{\n  wq: f32[D, H, E] init normal(0.3)\n  wkv: f32[D, 2, KV, E] init normal(0.3)\n  wo: f32[H, E, D] init normal(0.3)\n  fn forward(x: f32[B, T@cp, D]) -> f32[B, T@cp, D] {{\n    let q = einsum(\"btd,dhe->bthe\", x, wq)\n    let kv = einsum(\"btd,dkhe->kbthe\", x, wkv)\n    let a = attention(q, kv[0], kv[1]{mask})\n    einsum(\"bthe,hed->btd\", a, wo)\n  }}\n}}\n\ntrain W on m {{\n  data: synthetic(), batch: 2, steps: 3, seed: 7\n  loss: mse\n  optimizer: adam(lr: 1e-2)\n}}\n"
    )
}

/// A Mistral-style sliding window (causal, 5 positions) with grouped-query
/// heads on a sequence of 16 split over 4 devices: the ring skips the 9 of
/// 16 blocks the mask hides (the plan says so and counts only the rest),
/// trains like one device (1e-5) and its gradients match finite
/// differences; a bidirectional ring (no block skipped) too, on an odd ring.
#[test]
fn a_sliding_window_on_a_split_sequence_skips_blocks_and_trains_like_one_device() {
    let text = windowed("cp: 4", 16, ", causal: true, window: 5");
    let c = shardc::world::compile_source(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("window_cp.shard"),
        text.clone(),
        &Default::default(),
    );
    let notes: Vec<String> = c.diagnostics.iter().map(|d| d.message.clone()).collect();
    assert!(
        notes
            .iter()
            .any(|m| m.contains("the mask skips 9 of 16 blocks")),
        "{notes:?}"
    );
    let flops = |text: &str| {
        let c = shardc::world::compile_source(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("window_cp.shard"),
            text.to_string(),
            &Default::default(),
        );
        c.plans.first().expect("a plan").step_flops()
    };
    let full = flops(&windowed("cp: 4", 16, ""));
    assert!(flops(&text) < full, "the skipped blocks are not counted");
    trains_like_one_device("window_cp.shard", &text, &[("cp", 1)]);
    compare_text(
        "window_cp_grads.shard",
        &text,
        &[("cp", 4)],
        &[("cp", 1)],
        None,
    );
    finite_differences("window_cp_fd.shard", &text, &[("cp", 4)]);
    let both_ways = windowed("cp: 3", 6, "");
    finite_differences("bidir_cp_fd.shard", &both_ways, &[("cp", 3)]);
    compare_text(
        "bidir_cp.shard",
        &both_ways,
        &[("cp", 3)],
        &[("cp", 1)],
        None,
    );
}
