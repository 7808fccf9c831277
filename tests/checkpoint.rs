//! Activation checkpointing (`repeat(..., checkpoint: full)`, or keeping
//! named values: `checkpoint: [h]`): gradients and
//! losses bit-identical to no checkpointing (dropout included: a block is
//! recomputed with its own seed), on one device, on a tensor-parallel mesh
//! and in a pipeline; the plan's activations shrink to the blocks' results
//! plus one block, the recompute FLOPs are one more forward of the blocks,
//! and the activations `--mem` measures are within 0.9-1.0 of the plan's.

mod numerics;

use numerics::*;
use shardc::runtime::train;

/// A stack of MLP blocks with dropout, split over `tp`, optionally in
/// pipeline stages over `pp`; `policy` is the repeat's extra arguments.
fn stack(mesh: &str, policy: &str) -> String {
    format!(
        "mesh {mesh}\n\nlayer Block(D) {{\n  w1: f32[D, 4 * D@tp] init normal(0.2)\n  w2: f32[4 * D@tp, D] init normal(0.2)\n  fn forward(x: f32[B@dp, D]) -> f32[B@dp, D] {{\n    let h = dropout(tanh(x @ w1), 0.1)\n    x + psum(h @ w2, tp)\n  }}\n}}\n\nmodel Deep {{\n  blocks = repeat(4, Block(8){policy})\n  head: f32[8, 4] init normal(0.3)\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {{ blocks(x) @ head }}\n}}\n\ntrain Deep on m {{\n  data: synthetic(classes: 4)\n  batch: 8, steps: 3, seed: 5\n  optimizer: adam(lr: 1e-2)\n}}\n"
    )
}

fn run(name: &str, text: &str, f64: bool) -> train::RunOutput {
    let (prog, mut cfg, src) = setup_text(name, text, &[], None);
    if f64 {
        cfg.dtype = candle_core::DType::F64;
    }
    train::run(&prog, &cfg, &src, true, &mut |_| {}).expect("runs")
}

fn assert_same_bits(mesh: &str, without: &str, with: &str) {
    for f64 in [false, true] {
        let a = run("ck_a.shard", &stack(mesh, without), f64);
        let b = run("ck_b.shard", &stack(mesh, with), f64);
        assert_eq!(a.losses, b.losses, "{mesh}: losses");
        let (ga, gb) = (a.first_grads.expect("grads"), b.first_grads.expect("grads"));
        assert_eq!(ga.len(), gb.len());
        for ((na, va), (nb, vb)) in ga.iter().zip(&gb) {
            assert_eq!(na, nb);
            assert!(
                va.iter().zip(vb).all(|(x, y)| x.to_bits() == y.to_bits()),
                "{mesh}: gradient of `{na}` differs"
            );
        }
    }
}

#[test]
fn checkpointing_gives_the_same_bits() {
    assert_same_bits("m(dp: 1, tp: 1)", "", ", checkpoint: full");
    assert_same_bits("m(dp: 2, tp: 2)", "", ", checkpoint: full");
}

/// `checkpoint: [h]` keeps the named value of each block too.
#[test]
fn checkpointing_selected_values_gives_the_same_bits() {
    assert_same_bits("m(dp: 2, tp: 2)", "", ", checkpoint: [h]");
}

#[test]
fn checkpointing_in_a_pipeline_gives_the_same_bits() {
    let staged = ", stages: pp, microbatches: 4";
    assert_same_bits(
        "m(pp: 2, dp: 2, tp: 1)",
        staged,
        &format!("{staged}, checkpoint: full"),
    );
}

fn plan_and_memory(text: &str) -> (shardc::plan::Plan, train::Memory) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ck_plan.shard");
    let c = shardc::world::compile_source(&path, text.to_string(), &Default::default());
    assert!(!c.has_errors());
    let plan = c.plans.first().cloned().expect("a plan");
    let (prog, _, cfg, src) = c.prepare(None).expect("runnable");
    let mut cfg = cfg;
    cfg.steps = 1;
    let out = train::run(prog, &cfg, &src, false, &mut |_| {}).expect("runs");
    (plan, out.memory.expect("measured"))
}

#[test]
fn checkpointing_plans_and_measures_less_memory() {
    let (p0, m0) = plan_and_memory(&stack("m(dp: 2, tp: 2)", ""));
    let (p1, m1) = plan_and_memory(&stack("m(dp: 2, tp: 2)", ", checkpoint: full"));
    // One more forward of the blocks, nothing else.
    assert_eq!(p0.recompute_flops, 0.0);
    assert!(p1.recompute_flops > 0.0 && p1.recompute_flops < p1.forward_flops);
    assert_eq!(p1.forward_flops, p0.forward_flops);
    assert!(
        p1.activations < 0.7 * p0.activations,
        "{} vs {}",
        p1.activations,
        p0.activations
    );
    // Keeping `h` lies between: more kept, less recomputed.
    let (p2, m2) = plan_and_memory(&stack("m(dp: 2, tp: 2)", ", checkpoint: [h]"));
    assert!(p1.activations < p2.activations && p2.activations < p0.activations);
    assert!(p2.recompute_flops < p1.recompute_flops && p2.recompute_flops > 0.0);
    for (plan, measured) in [(&p0, &m0), (&p1, &m1), (&p2, &m2)] {
        let r = measured.activations / plan.activations;
        assert!(
            (0.9..=1.0).contains(&r),
            "measured {} vs planned {}",
            measured.activations,
            plan.activations
        );
    }
}

/// `stack` with `directive` (`checkpoint(full)`, `checkpoint(h)`) in the
/// block layer.
fn with_directive(text: &str, directive: &str) -> String {
    let head = "layer Block(D) {\n";
    assert!(text.contains(head));
    text.replace(head, &format!("{head}  {directive}\n"))
}

/// Two blocks called as members (no `repeat`).
fn two_calls(directive: &str) -> String {
    let text = stack("m(dp: 2, tp: 2)", "").replace(
        "  blocks = repeat(4, Block(8))\n",
        "  b0 = Block(8)\n  b1 = Block(8)\n",
    );
    let text = text.replace("blocks(x) @ head", "b1(b0(x)) @ head");
    assert!(text.contains("b1(b0(x))"));
    if directive.is_empty() {
        text
    } else {
        with_directive(&text, directive)
    }
}

/// A layer's `checkpoint(...)` directive checkpoints every call of its
/// `forward`: its repetitions as `checkpoint:` on the `repeat` would (which
/// may still say `none`), and plain calls too; same bits, less memory,
/// measured as planned.
#[test]
fn a_layer_directive_checkpoints_every_call() {
    let mesh = "m(dp: 2, tp: 2)";
    let activations = |text: &str| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ck_dir.shard");
        let c = shardc::world::compile_source(&path, text.to_string(), &Default::default());
        assert!(!c.has_errors(), "{text}");
        c.plans.first().expect("a plan").activations
    };
    let plain = stack(mesh, "");
    let full = activations(&stack(mesh, ", checkpoint: full"));
    assert_eq!(
        activations(&with_directive(&plain, "checkpoint(full)")),
        full
    );
    assert_eq!(
        activations(&with_directive(
            &stack(mesh, ", checkpoint: none"),
            "checkpoint(full)"
        )),
        activations(&plain)
    );
    assert_eq!(
        activations(&with_directive(&plain, "checkpoint(h)")),
        activations(&stack(mesh, ", checkpoint: [h]"))
    );
    // Repetitions and plain calls: the same bits as without.
    for f64 in [false, true] {
        for (a, b) in [
            (plain.clone(), with_directive(&plain, "checkpoint(full)")),
            (two_calls(""), two_calls("checkpoint(full)")),
        ] {
            let (x, y) = (run("ck_a.shard", &a, f64), run("ck_b.shard", &b, f64));
            assert_eq!(x.losses, y.losses);
            for ((n, u), (_, v)) in x
                .first_grads
                .expect("grads")
                .iter()
                .zip(&y.first_grads.expect("grads"))
            {
                assert!(
                    u.iter().zip(v).all(|(p, q)| p.to_bits() == q.to_bits()),
                    "gradient of `{n}` differs"
                );
            }
        }
    }
    let (p0, _) = plan_and_memory(&two_calls(""));
    let (p1, m1) = plan_and_memory(&two_calls("checkpoint(full)"));
    assert!(p1.activations < p0.activations && p1.recompute_flops > 0.0);
    let r = m1.activations / p1.activations;
    assert!(
        (0.9..=1.0).contains(&r),
        "measured {} vs planned {}",
        m1.activations,
        p1.activations
    );
}

/// Layers checkpointed by their directive inside a stack that is not: the
/// plan still proposes checkpointing the stack, with the peak the stack
/// checkpointed plans; the run has the bits of one without directives.
#[test]
fn a_stack_of_checkpointed_layers_can_still_be_checkpointed_whole() {
    let text = |directive: &str, policy: &str| {
        format!("mesh m(dp: 2)\n\nlayer Inner(D) {{\n  {directive}\n  w: f32[D, D] init normal(0.2)\n  fn forward(x: f32[B@dp, D]) -> f32[B@dp, D] {{ tanh(x @ w) }}\n}}\n\nlayer Outer(D) {{\n  a = Inner(D)\n  b = Inner(D)\n  fn forward(x: f32[B@dp, D]) -> f32[B@dp, D] {{ x + b(a(x)) }}\n}}\n\nmodel Deep {{\n  blocks = repeat(3, Outer(8){policy})\n  head: f32[8, 4] init normal(0.3)\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {{ blocks(x) @ head }}\n}}\n\ntrain Deep on m {{\n  data: synthetic(classes: 4)\n  batch: 8, steps: 3, seed: 5\n  optimizer: adam(lr: 1e-2)\n}}\n")
    };
    let plan = |t: &str| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ck_nested.shard");
        let c = shardc::world::compile_source(&path, t.to_string(), &Default::default());
        assert!(!c.has_errors(), "{t}");
        c.plans.first().cloned().expect("a plan")
    };
    let inner = plan(&text("checkpoint(full)", ""));
    let whole = plan(&text("checkpoint(full)", ", checkpoint: full"));
    let none = plan(&text("", ""));
    assert!(inner.activations < none.activations);
    let best = whole.peaks().into_iter().reduce(f64::max);
    assert_eq!(inner.peak_if_checkpointed, best);
    assert_eq!(whole.peak_if_checkpointed, None);
    for f64 in [false, true] {
        let a = run("ck_n0.shard", &text("", ""), f64);
        let b = run("ck_n1.shard", &text("checkpoint(full)", ""), f64);
        let c = run(
            "ck_n2.shard",
            &text("checkpoint(full)", ", checkpoint: full"),
            f64,
        );
        assert_eq!(a.losses, b.losses);
        assert_eq!(a.losses, c.losses);
    }
}
