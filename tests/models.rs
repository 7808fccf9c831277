//! The modern models in `models/` (Llama; more as they land): each trains the
//! same on its own mesh as on a mesh of 1 (gradients at init in f64, the first
//! ten losses), its f64 gradients match finite differences, and the parts that
//! make it what it is (RoPE, grouped-query attention) equal a direct
//! computation. Also: an index out of range at run time stops the run at the
//! op's line.

mod numerics;

use numerics::*;
use shardc::runtime::probe::probe;
use shardc::runtime::train;
use shardc::world::{self, Options};
use std::collections::HashMap;
use std::path::Path;

fn read(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).expect("model file")
}

/// The first ten losses (f32) of a sharded run equal a mesh of 1 to 1e-5
/// relative, and the gradients at init (f64) to 1e-5 relative per tensor.
fn matches_one_device(file: &str, text: &str, sharded: &[(&str, i64)], single: &[(&str, i64)]) {
    let (g8, _) = grads_and_losses_text(file, text, sharded, None, 1, true);
    let (g1, _) = grads_and_losses_text(file, text, single, None, 1, true);
    let (prog, _, _) = setup_text(file, text, single, None);
    for ((n, a), (_, b)) in g8.iter().zip(&g1) {
        let r = max_rel(a, b);
        assert!(r < 1e-5, "{file}: gradient of `{n}` differs by {r:e}");
        // Frozen parameters (RoPE's tables) have none.
        let frozen = frozen_names(&prog).contains(&n.as_str());
        assert!(
            b.iter().any(|x| *x != 0.0) != frozen,
            "`{n}` (frozen: {frozen}) has the wrong kind of gradient"
        );
    }
    let (_, l8) = grads_and_losses_text(file, text, sharded, None, 10, false);
    let (_, l1) = grads_and_losses_text(file, text, single, None, 10, false);
    assert_eq!(l8.len(), 10);
    for (i, (x, y)) in l8.iter().zip(&l1).enumerate() {
        assert!(
            ((x - y) / y).abs() < 1e-5,
            "{file}: loss {} is {x} on its mesh vs {y} on one device",
            i + 1
        );
    }
}

/// `text` with each `const NAME = value` line given a new value.
fn with_consts(text: &str, consts: &[(&str, i64)]) -> String {
    text.lines()
        .map(|l| {
            let hit = consts
                .iter()
                .find(|(n, _)| l.starts_with(&format!("const {n} ")));
            match hit {
                Some((n, v)) => format!("const {n} = {v}"),
                None => l.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn llama_matches_one_device() {
    let file = "models/llama.shard";
    matches_one_device(
        file,
        &read(file),
        &[("dp", 2), ("tp", 2)],
        &[("dp", 1), ("tp", 1)],
    );
}

#[test]
fn llama_gradients_match_finite_differences() {
    // A smaller vocabulary and context, so each of the many runs is quick.
    let text = with_consts(
        &read("models/llama.shard"),
        &[("VOCAB", 64), ("T", 8), ("F", 32)],
    );
    finite_differences("models/llama_fd.shard", &text, &[("dp", 2), ("tp", 2)]);
}

/// The model `forward` of which computes `expr` from the weights `weights`.
fn program(weights: &str, expr: &str) -> shardc::spmd::Program {
    let text = format!(
        "import \"llama_layers.shard\"\nmesh m(tp: 2)\nmodel P {{\n{weights}\n  fn forward() {{\n    reduce({expr})\n  }}\n}}\ntrain P on m {{ batch: 1, steps: 1, optimizer: sgd(lr: 0.1) }}\n"
    );
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/probe.shard");
    let c = world::compile_source(&path, text.clone(), &Options::default());
    assert!(
        !c.has_errors(),
        "{text}\n{:?}",
        c.diagnostics
            .iter()
            .map(|d| d.message.clone())
            .collect::<Vec<_>>()
    );
    c.programs.into_iter().next().expect("a program")
}

/// Deterministic values in [-1, 1).
fn values(n: usize, salt: f64) -> Vec<f64> {
    (0..n)
        .map(|i| ((i as f64 + salt) * 0.618_033_988_749_895).fract() * 2.0 - 1.0)
        .collect()
}

/// RoPE with Llama 2's base (10000) and Llama 3's (500000).
#[test]
fn rope_equals_the_rotation_computed_directly() {
    for base in [10000.0, 500000.0] {
        rope_with_base(base);
    }
}

fn rope_with_base(base: f64) {
    let layer = format!("Rope(5, 8, {base})");
    rope_check(&layer, &|i| base.powf(-2.0 * i as f64 / 8.0));
}

/// Llama 3.1's scaled RoPE against Hugging Face's formula
/// (`_compute_llama3_parameters`): at E = 8 and base 500000 the four
/// frequencies' wavelengths (6, 167, 4443, 118,000) are one short, one
/// short, one between ORIG / HIGH = 2048 and ORIG / LOW = 8192, one long.
#[test]
fn scaled_rope_follows_llama_3_1() {
    let (factor, low, high, orig) = (8.0, 1.0, 4.0, 8192.0);
    let hf = |i: usize| {
        let f = 500000f64.powf(-2.0 * i as f64 / 8.0);
        let wavelen = 2.0 * std::f64::consts::PI / f;
        if wavelen > orig / low {
            f / factor
        } else if wavelen < orig / high {
            f
        } else {
            let s = (orig / wavelen - low) / (high - low);
            (1.0 - s) * f / factor + s * f
        }
    };
    rope_check("ScaledRope(5, 8, 500000, 8, 1, 4, 8192)", &hf);
}

/// A rotary layer `layer` (T = 5, E = 8) rotates feature pairs by `t ·
/// freq(i)`.
fn rope_check(layer: &str, freq: &dyn Fn(usize) -> f64) {
    let (t, n, e) = (5usize, 2usize, 8usize);
    let prog = program(
        &format!("  rope = {layer}\n  x: f32[1, 5, 2@tp, 8] init normal(1.0)"),
        "rope(x)",
    );
    let x = values(t * n * e, 3.0);
    let params = HashMap::from([("x".to_string(), x.clone())]);
    let ct = vec![0.0; x.len()];
    let got = probe(&prog, &params, &[], &ct, candle_core::DType::F64, None).expect("runs");
    let half = e / 2;
    for ti in 0..t {
        for h in 0..n {
            let at = |i: usize| x[(ti * n + h) * e + i];
            for i in 0..half {
                let angle = ti as f64 * freq(i);
                let (c, s) = (angle.cos(), angle.sin());
                let want = [at(i) * c - at(i + half) * s, at(i + half) * c + at(i) * s];
                for (j, w) in [(i, want[0]), (i + half, want[1])] {
                    let g = got.output[(ti * n + h) * e + j];
                    assert!(
                        (g - w).abs() < 1e-12,
                        "{layer}: t {ti} head {h} feature {j}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn grouped_query_attention_equals_attention_with_repeated_heads() {
    // 4 query heads, 2 K/V heads: head h reads K/V head h / 2.
    let (t, h, kv, e) = (4usize, 4usize, 2usize, 3usize);
    let gqa = program(
        "  q: f32[1, 4, 4@tp, 3] init normal(1.0)\n  k: f32[1, 4, 2@tp, 3] init normal(1.0)\n  v: f32[1, 4, 2@tp, 3] init normal(1.0)",
        "causal_attention(q, repeat(k, 2, dim: 2), repeat(v, 2, dim: 2))",
    );
    let mha = program(
        "  q: f32[1, 4, 4@tp, 3] init normal(1.0)\n  k: f32[1, 4, 4@tp, 3] init normal(1.0)\n  v: f32[1, 4, 4@tp, 3] init normal(1.0)",
        "causal_attention(q, k, v)",
    );
    let q = values(t * h * e, 1.0);
    let (k, v) = (values(t * kv * e, 2.0), values(t * kv * e, 5.0));
    let widen = |x: &[f64]| -> Vec<f64> {
        let mut out = Vec::new();
        for ti in 0..t {
            for hi in 0..h {
                let src = (ti * kv + hi / (h / kv)) * e;
                out.extend_from_slice(&x[src..src + e]);
            }
        }
        out
    };
    let ct = values(t * h * e, 7.0);
    let run = |prog, k: Vec<f64>, v: Vec<f64>| {
        let p = HashMap::from([("q".into(), q.clone()), ("k".into(), k), ("v".into(), v)]);
        probe(prog, &p, &[], &ct, candle_core::DType::F64, None).expect("runs")
    };
    let a = run(&gqa, k.clone(), v.clone());
    let b = run(&mha, widen(&k), widen(&v));
    assert!(max_rel(&a.output, &b.output) < 1e-12, "outputs differ");
    // The built-in grouped heads of `attention` equal the repeat.
    let built_in = program(
        "  q: f32[1, 4, 4@tp, 3] init normal(1.0)\n  k: f32[1, 4, 2@tp, 3] init normal(1.0)\n  v: f32[1, 4, 2@tp, 3] init normal(1.0)",
        "attention(q, k, v, causal: true)",
    );
    let c = run(&built_in, k.clone(), v.clone());
    assert!(max_rel(&c.output, &a.output) < 1e-12, "outputs differ");
    for ((n, gc), (_, ga)) in c.grads.iter().zip(&a.grads) {
        assert!(max_rel(gc, ga) < 1e-12, "gradient of `{n}` differs");
    }
    // A K/V head's gradient is the sum over the query heads it serves.
    for (name, (ga, gb)) in ["q", "k", "v"].iter().zip(a.grads.iter().zip(&b.grads)) {
        let folded: Vec<f64> = if *name == "q" {
            gb.1.clone()
        } else {
            let mut f = vec![0.0; t * kv * e];
            for ti in 0..t {
                for hi in 0..h {
                    for j in 0..e {
                        f[(ti * kv + hi / (h / kv)) * e + j] += gb.1[(ti * h + hi) * e + j];
                    }
                }
            }
            f
        };
        assert!(
            max_rel(&ga.1, &folded) < 1e-12,
            "gradient of `{name}` differs"
        );
    }
}

#[test]
fn an_index_out_of_range_stops_the_run_at_the_ops_line() {
    let text = "mesh host(data: 2)\n\nmodel Gather {\n  w: f32[6, 4] init normal(0.5)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] {\n    let i = top_k_indices(x @ w, 3)\n    take_along_axis(x @ w, i + 2, dim: 1)\n  }\n}\n\ntrain Gather on host {\n  data: synthetic(classes: 3)\n  batch: 4, steps: 2, seed: 0\n  loss: softmax_cross_entropy\n  optimizer: sgd(lr: 0.3)\n}\n";
    let (prog, cfg, src) = setup_text("oob.shard", text, &[], None);
    let err = match train::run(&prog, &cfg, &src, false, &mut |_| {}) {
        Ok(_) => panic!("an index 4 or 5 into a dimension of 4 ran"),
        Err(e) => e,
    };
    assert!(
        err.message().contains("outside dimension 1"),
        "{}",
        err.message()
    );
    assert!(
        matches!(err.fault, shardc::fault::Fault::Data(_)),
        "{err:?}"
    );
    let (node, generation) = err.node.expect("the error names its op");
    assert_eq!(generation, 0);
    let span = prog.nodes[node].span;
    let line = text[..span.start as usize].lines().count();
    assert_eq!(
        line, 7,
        "the error points at line {line}, not take_along_axis's"
    );
}

#[test]
fn repeat_passes_side_inputs_to_every_block() {
    // Three blocks, each given the same side input `c`: the gradients (through
    // `c` as well as each block's weights) match finite differences, and the
    // sharded run equals one device.
    let file = "tests/ui/repeat_side_inputs.shard";
    let text = read(file);
    finite_differences(file, &text, &[("data", 2)]);
    matches_one_device(file, &text, &[("data", 2)], &[("data", 1)]);
    let (prog, _, _) = setup_text(file, &text, &[], None);
    let blocks = prog
        .params
        .iter()
        .filter(|p| p.name.starts_with("blocks."))
        .count();
    assert_eq!(blocks, 3, "each repetition has its own weight");
}

#[test]
fn dlrm_matches_one_device() {
    let file = "models/dlrm.shard";
    matches_one_device(file, &read(file), &[("data", 4)], &[("data", 1)]);
}

#[test]
fn dlrm_gradients_match_finite_differences() {
    finite_differences(
        "models/dlrm.shard",
        &read("models/dlrm.shard"),
        &[("data", 4)],
    );
}

/// DLRM learns the clicks' rule: the loss falls and AUC (logged each step)
/// rises well above chance.
#[test]
fn dlrm_learns_the_clicks() {
    let (prog, cfg, src) = setup("models/dlrm.shard", &[], None);
    assert_eq!(cfg.steps, 200);
    let mut last = Vec::new();
    let out =
        train::run(&prog, &cfg, &src, false, &mut |r| last = r.metrics.clone()).expect("trains");
    let first = out.losses[0];
    let end = out.losses[190..].iter().sum::<f64>() / 10.0;
    assert!(
        end < 0.75 * first,
        "loss {first} → {end} (the last 10 steps' mean)"
    );
    let auc = last
        .iter()
        .find(|(m, _)| *m == shardc::spec::Metric::Auc)
        .map(|(_, v)| *v)
        .expect("auc logged");
    assert!(auc > 0.8, "AUC {auc}");
}

#[test]
fn mixtral_matches_one_device() {
    let file = "models/mixtral.shard";
    matches_one_device(
        file,
        &read(file),
        &[("dp", 2), ("ep", 4)],
        &[("dp", 1), ("ep", 1)],
    );
}

#[test]
fn mixtral_gradients_match_finite_differences() {
    let text = with_consts(
        &read("models/mixtral.shard"),
        &[("VOCAB", 64), ("T", 8), ("C", 3), ("F", 16)],
    );
    finite_differences("models/mixtral_fd.shard", &text, &[("dp", 2), ("ep", 4)]);
}

/// Every step logs the load-balancing term (one per block, added up), the
/// tokens each expert kept and
/// the tokens dropped; kept and dropped add up to every routing choice (2 per
/// token, per block).
#[test]
fn mixtral_logs_tokens_per_expert_and_dropped_tokens() {
    let (prog, mut cfg, src) = setup("models/mixtral.shard", &[], None);
    cfg.steps = 3;
    let mut seen = Vec::new();
    train::run(&prog, &cfg, &src, false, &mut |r| {
        seen.push(r.observed.clone())
    })
    .expect("trains");
    assert_eq!(seen.len(), 3);
    for step in &seen {
        let get = |n: &str| {
            step.iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
                .expect(n)
        };
        let kept: f64 = get("tokens_per_expert").iter().sum();
        let dropped = get("dropped_tokens")[0];
        assert_eq!(get("tokens_per_expert").len(), 8);
        assert_eq!(kept + dropped, (2 * 2 * 16 * 32) as f64);
        let balance = get("balance")[0];
        assert!(balance > 0.0 && balance.is_finite(), "balance {balance}");
    }
}

/// The examples written with the attention family (a ViT: bidirectional;
/// an encoder–decoder: bidirectional, causal and cross-attention) train on
/// their dp × tp meshes like one device.
#[test]
fn the_attention_family_examples_match_one_device() {
    for file in ["examples/vit.shard", "examples/encoder_decoder.shard"] {
        matches_one_device(
            file,
            &read(file),
            &[("dp", 2), ("tp", 2)],
            &[("dp", 1), ("tp", 1)],
        );
    }
}

/// `attention(…, keys: m)` hides the keys whose entry is 0: its output and
/// the queries' gradient equal attention over the kept keys alone, and the
/// hidden keys and values get no gradient; the heads split over `tp`.
#[test]
fn a_keys_padding_mask_equals_attention_over_the_kept_keys() {
    let (t, s, h, e, kept) = (3usize, 5usize, 2usize, 2usize, [0usize, 1, 3]);
    let masked = program(
        "  q: f32[1, 3, 2@tp, 2] init normal(1.0)\n  k: f32[1, 5, 2@tp, 2] init normal(1.0)\n  v: f32[1, 5, 2@tp, 2] init normal(1.0)\n  m: f32[1, 5] init zeros",
        "attention(q, k, v, keys: m)",
    );
    let short = program(
        "  q: f32[1, 3, 2@tp, 2] init normal(1.0)\n  k: f32[1, 3, 2@tp, 2] init normal(1.0)\n  v: f32[1, 3, 2@tp, 2] init normal(1.0)",
        "attention(q, k, v)",
    );
    let q = values(t * h * e, 1.0);
    let (k, v) = (values(s * h * e, 2.0), values(s * h * e, 5.0));
    let pick = |x: &[f64]| -> Vec<f64> {
        kept.iter()
            .flat_map(|j| x[j * h * e..(j + 1) * h * e].to_vec())
            .collect()
    };
    let ct = values(t * h * e, 7.0);
    let m = vec![1.0, 1.0, 0.0, 1.0, 0.0];
    let p = HashMap::from([
        ("q".into(), q.clone()),
        ("k".into(), k.clone()),
        ("v".into(), v.clone()),
        ("m".into(), m),
    ]);
    let a = probe(&masked, &p, &[], &ct, candle_core::DType::F64, None).expect("runs");
    let p = HashMap::from([
        ("q".into(), q),
        ("k".into(), pick(&k)),
        ("v".into(), pick(&v)),
    ]);
    let b = probe(&short, &p, &[], &ct, candle_core::DType::F64, None).expect("runs");
    assert!(max_rel(&a.output, &b.output) < 1e-12, "outputs differ");
    let grad = |r: &shardc::runtime::probe::Probe, n: &str| -> Vec<f64> {
        r.grads
            .iter()
            .find(|g| g.0 == n)
            .expect("a gradient")
            .1
            .clone()
    };
    assert!(max_rel(&grad(&a, "q"), &grad(&b, "q")) < 1e-12);
    for n in ["k", "v"] {
        let full = grad(&a, n);
        assert!(max_rel(&pick(&full), &grad(&b, n)) < 1e-12, "`{n}`");
        for j in [2, 4] {
            assert!(full[j * h * e..(j + 1) * h * e].iter().all(|x| *x == 0.0));
        }
    }
}
