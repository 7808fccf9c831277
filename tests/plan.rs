//! `shardc plan` figures against hand-computed values.

use shardc::world::{self, Options};
use std::path::Path;

fn plan_of(file: &str, mesh: Vec<(String, i64)>) -> shardc::plan::Plan {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let c = world::compile(
        &p,
        &Options {
            mesh,
            ..Options::default()
        },
    )
    .expect("readable");
    assert!(!c.has_errors(), "{file} has errors");
    c.plans.into_iter().next().expect("one plan")
}

#[test]
fn gptj_parameter_bytes_per_device() {
    // Per block on mp=2: q,k,v,o 4·3072·4·768/2, w1,w2 2·3072·12288/2, b1 6144, b2 3072,
    // LayerNorm 2·3072; two blocks; vocab-split embedding and head 2·5000·3072/2; ln_f.
    let block = 4 * 3072 * 4 * 768 / 2 + 2 * 3072 * 12288 / 2 + 6144 + 3072 + 2 * 3072;
    let floats = 2 * block + 2 * 5000 * 3072 / 2 + 2 * 3072;
    let p = plan_of("models/gptj.shard", vec![]);
    assert_eq!(p.params, (floats * 4) as f64);
    assert_eq!(p.optimizer_state, 2.0 * p.params, "adam keeps two moments");
    // LayerNorm scales are replicated over mp too: their gradients are summed over it.
    assert!(p
        .comms
        .iter()
        .any(|c| c.kind == "grad all-reduce" && c.axes == ["dp", "mp"]));
}

#[test]
fn mesh_override_rescales_the_plan() {
    let a = plan_of("models/gptj.shard", vec![]);
    let b = plan_of(
        "models/gptj.shard",
        vec![("mp".into(), 4), ("dp".into(), 2)],
    );
    assert!(
        b.params < a.params,
        "more model parallelism, fewer bytes per device"
    );
    assert_eq!(
        b.mesh_axes,
        vec![("dp".to_string(), 2), ("mp".to_string(), 4)]
    );
}

#[test]
fn fsdp_stores_a_shard_and_reduce_scatters_gradients() {
    let c = world::compile(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("models/fsdp_mlp.shard"),
        &Options::default(),
    )
    .expect("readable");
    let dp = &c.plans[0];
    let fsdp = &c.plans[1];
    assert!(
        fsdp.params < dp.params / 4.0,
        "{} vs {}",
        fsdp.params,
        dp.params
    );
    assert!(fsdp
        .comms
        .iter()
        .any(|c| c.kind.starts_with("grad reduce-scatter")));
    assert!(dp
        .comms
        .iter()
        .any(|c| c.kind == "grad all-reduce" && c.axes == ["data"]));
}

#[test]
fn plans_a_175b_model_on_1024_devices() {
    let p = plan_of("examples/gpt3_175b.shard", vec![]);
    let devices: i64 = p.mesh_axes.iter().map(|a| a.1).product();
    assert_eq!(devices, 1024);
    // ≈175e9 parameters over tp·pp = 64 devices: bf16 working copies, 2
    // bytes each (≈ 5.5 GB per device), f32 master weights, gradients and
    // Adam's two moments.
    assert!(p.params > 5.0e9 && p.params < 6.25e9, "{}", p.params);
    assert_eq!(p.master_params, 2.0 * p.params);
    assert_eq!(p.grads, p.master_params);
    assert_eq!(p.optimizer_state, 2.0 * p.master_params);
}

/// The example's mitigations undone: f32, no checkpointing.
fn gpt3_unmitigated() -> shardc::plan::Plan {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gpt3_175b.shard"),
    )
    .expect("the example");
    assert!(text.contains(", checkpoint: full)") && text.contains("precision: bf16\n"));
    let text = text
        .replace(", checkpoint: full)", ")")
        .replace("precision: bf16\n", "");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gpt3_f32.shard");
    let c = world::compile_source(&path, text, &Options::default());
    assert!(!c.has_errors());
    c.plans.into_iter().next().expect("a plan")
}

/// Expert parallelism moves the routed slots only: each all-to-all of
/// `models/mixtral.shard` sends a device's [sequences, experts, capacity, D]
/// queues (2 × 8 × 10 × 32 floats = capacity factor 1.25 × top-2 × its 64
/// tokens × D × 4 bytes = 20,480 bytes) less the quarter it keeps: 15,360
/// bytes per call, per direction, where dispatching every token to every
/// expert would send 8 × as much. Two blocks, forward and backward: 4 calls.
#[test]
fn mixtral_all_to_all_moves_the_routed_slots() {
    let p = plan_of("models/mixtral.shard", vec![]);
    let a2a: Vec<_> = p.comms.iter().filter(|c| c.kind == "all-to-all").collect();
    assert_eq!(a2a.len(), 2, "dispatch and combine");
    let per_call = 1.25 * 2.0 * 64.0 * 32.0 * 4.0 * 3.0 / 4.0;
    for c in a2a {
        assert_eq!(c.axes, ["ep"]);
        assert_eq!(c.count, 4);
        assert_eq!(c.bytes, per_call, "{}", c.source);
    }
}

/// A step is every microbatch: `examples/gpt3_175b.shard` runs batch 1536 as
/// 16 pipeline microbatches of 96, so its compute per step is 16 × one
/// microbatch's (about 6 × parameters × tokens / devices plus attention:
/// 6 × 175e9 × 1536 × 2048 / 1024 ≈ 3.2 PFLOP), and each tensor-parallel
/// all-reduce runs once per microbatch while the gradients are reduced once.
#[test]
fn plan_counts_every_microbatch_of_a_step() {
    let p = plan_of("examples/gpt3_175b.shard", vec![]);
    assert_eq!(p.microbatches, 16);
    assert_eq!((p.step_batch, p.batch), (Some(1536), Some(96)));
    assert_eq!(p.step_flops(), 16.0 * p.microbatch_flops());
    // The model's FLOPs: 6 × parameters × tokens, plus attention's scores
    // and weighted sums (2 × 2·T·D per token and layer, forward; × 3 with
    // backward), over the devices. Checkpointing runs each block's forward
    // once more on top.
    let (layers, t, d) = (96.0, 2048.0, 12288.0);
    let tokens = 1536.0 * t;
    let ideal = (6.0 * 175e9 + 3.0 * 4.0 * t * d * layers) * tokens / 1024.0;
    let r = p.model_step_flops() / ideal;
    assert!(
        (0.9..1.1).contains(&r),
        "{} vs {ideal:e}: {r}",
        p.model_step_flops()
    );
    assert_eq!(
        p.step_flops(),
        p.model_step_flops() + 16.0 * p.recompute_flops
    );
    // Nearly all the forward is in the checkpointed blocks.
    assert!(p.recompute_flops > 0.9 * p.forward_flops);
    for c in &p.comms {
        let per_step = if c.kind == "grad all-reduce" { 1 } else { 0 };
        assert!(
            c.count == per_step || c.count % 16 == 0,
            "{} {:?}: {} calls",
            c.kind,
            c.axes,
            c.count
        );
    }
    // Sequence parallelism's reduce-scatter after each row-parallel matmul:
    // 12 blocks per stage × 16 microbatches × (forward, its recompute, and
    // backward's transpose).
    assert!(p
        .comms
        .iter()
        .any(|c| c.kind == "reduce-scatter" && !c.explicit && c.count == 12 * 16 * 3));
    // `accumulate` counts alike: `models/fsdp_mlp.shard` steps on 128
    // examples as 4 microbatches of 32.
    let acc = plan_of("models/fsdp_mlp.shard", vec![]);
    assert_eq!(
        (acc.microbatches, acc.step_batch, acc.batch),
        (4, Some(128), Some(32))
    );
    assert_eq!(acc.step_flops(), 4.0 * acc.microbatch_flops());
    assert!(acc
        .comms
        .iter()
        .all(|c| c.kind == "grad all-reduce" || c.count % 4 == 0));
}

/// The verdict against a device: each pipeline stage's peak (parameters,
/// gradients, optimizer state and that stage's activations in flight)
/// against its memory, and a step estimate from the plan's FLOPs and bytes.
#[test]
fn a_plan_against_a_device() {
    use shardc::plan::device::{parse, verdict};
    // As written (sequence parallelism, checkpointing, bf16), GPT-3 175B
    // fits an H100's 80 GB on 1024 devices.
    let fit = plan_of("examples/gpt3_175b.shard", vec![]);
    let fv = verdict(&fit, parse("h100-80g").expect("known"));
    assert!(fv.fits, "{:?}", fv.peaks);
    assert!(fv.proposals.is_empty());
    // Without checkpointing and bf16 it does not.
    let p = gpt3_unmitigated();
    let v = verdict(&p, parse("h100-80g").expect("known"));
    assert_eq!(v.peaks.len(), 8);
    assert!(v.peaks.windows(2).all(|w| w[0] > w[1]), "{:?}", v.peaks);
    assert!(!v.fits);
    let pp = p.pipeline.as_ref().expect("pipelined");
    let fixed = p.params + p.grads + p.optimizer_state + p.gathered_params;
    assert_eq!(v.peaks[7], fixed + pp.activations[7] + pp.cotangents[7]);
    // Compute at the f32 (tf32) peak, stretched by the bubble, plus the
    // bytes at NVLink's 450 GB/s per direction.
    let compute = p.step_flops() / 494.5e12 / (1.0 - pp.bubble);
    let bytes: f64 = p.comms.iter().map(|c| c.bytes * c.count as f64).sum();
    assert_eq!(v.compute_seconds, Some(compute));
    assert_eq!(v.step_seconds, Some(compute + bytes / 450e9));
    // It proposes checkpointing, bf16 and both, each with the peak the
    // changed file plans: both is the file as written.
    let proposed = v.proposals.first().map(|p| p.peak).expect("a proposal");
    assert!(proposed < v.peaks[0] / 4.0, "{proposed} vs {:?}", v.peaks);
    let changes: Vec<(&str, f64)> = v
        .proposals
        .iter()
        .map(|p| (p.change.as_str(), p.peak))
        .collect();
    assert_eq!(changes.len(), 3, "{changes:?}");
    assert_eq!(changes[0].1, proposed);
    assert!(changes[1].0.contains("precision: bf16") && changes[1].1 < v.peaks[0]);
    let best = fit.peaks().into_iter().reduce(f64::max);
    assert_eq!((changes[2].0, Some(changes[2].1)), ("both", best));
    assert_eq!(fit.peak_if_checkpointed, None, "nothing left to checkpoint");
    // A memory size alone: a verdict, no estimate.
    let g = plan_of("models/gptj.shard", vec![]);
    let small = verdict(&g, parse("1GiB").expect("a size"));
    assert!(!small.fits && small.step_seconds.is_none());
    assert!(verdict(&g, parse("24 GiB").expect("a size")).fits);
    assert_eq!(parse("40GB").expect("decimal").memory, 40e9);
    assert!(parse("-3GiB").is_err() && parse("h200").is_err());
}

/// With `accumulate`, the plan counts the microbatches' running gradient sum
/// beside the gradients, and a run measures the same bytes (on a data-parallel
/// mesh and in a pipeline); without it, neither has one.
#[test]
fn accumulation_plans_and_measures_its_gradient_sum() {
    let run = |path: &Path, text: String| {
        let c = world::compile_source(path, text, &Default::default());
        assert!(!c.has_errors(), "{}", path.display());
        let plan = c.plans.first().cloned().expect("a plan");
        let (prog, _, mut cfg, src) = c.prepare(None).expect("runnable");
        cfg.steps = 1;
        let out = shardc::runtime::train::run(prog, &cfg, &src, false, &mut |_| {}).expect("runs");
        (plan, out.memory.expect("measured"))
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mlp = |acc: &str| {
        format!(
            "mesh m(dp: 2)\n\nmodel M {{\n  w: f32[8, 4] init normal(0.3)\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {{ tanh(x @ w) }}\n}}\n\ntrain M on m {{\n  data: synthetic(classes: 4)\n  batch: 16, steps: 1, seed: 5{acc}\n  optimizer: adam(lr: 1e-2)\n}}\n"
        )
    };
    let at = root.join("acc_plan.shard");
    for (acc, sum) in [("", false), (", accumulate: 4", true)] {
        let (plan, mem) = run(&at, mlp(acc));
        assert_eq!(plan.grads, 8.0 * 4.0 * 4.0, "{acc:?}");
        let want = if sum { plan.grads } else { 0.0 };
        assert_eq!((plan.grad_sum, mem.grad_sum), (want, want), "{acc:?}");
        assert_eq!(mem.grads, plan.grads);
    }
    // A pipeline sums its own microbatches into one set; its accumulated
    // chunks keep a running sum beside it.
    let t3d = root.join("tests/models/t3d_small.shard");
    let text = std::fs::read_to_string(&t3d).expect("t3d_small");
    assert!(text.contains("accumulate: 2"));
    for (text, sum) in [
        (text.clone(), true),
        (text.replace("accumulate: 2", "accumulate: 1"), false),
    ] {
        let (plan, mem) = run(&t3d, text);
        assert_eq!(plan.grad_sum, mem.grad_sum);
        assert_eq!(plan.grad_sum > 0.0, sum);
        assert_eq!(mem.grads, plan.grads);
    }
}

/// FSDP keeps every gathered weight on the tape until backward has used it
/// (a checkpointed block's are dropped and gathered again while it is
/// recomputed; a pipeline keeps them per microbatch in flight), and holds one
/// weight's full-size gradient until its reduce-scatter: the plan counts
/// those bytes, and a run measures the same. Each microbatch gathers and
/// reduce-scatters every weight once (a recomputed block gathers again).
#[test]
fn fsdp_plans_and_measures_its_gathered_weights() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let at = root.join("fsdp_plan.shard");
    let text = |mesh: &str, policy: &str| {
        format!(
            "mesh m({mesh})\n\nlayer Block(D) {{\n  w: f32[D, D] init normal(0.3)\n  fn forward(x: f32[B@dp, D]) -> f32[B@dp, D] {{ x + tanh(x @ w) }}\n}}\n\nmodel M {{\n  shard_params(dp, min_size: 16)\n  inp: f32[8, 16] init normal(0.3)\n  blocks = repeat(4, Block(16){policy})\n  out: f32[16, 4] init normal(0.3)\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {{ blocks(tanh(x @ inp)) @ out }}\n}}\n\ntrain M on m {{\n  data: synthetic(classes: 4)\n  batch: 16, steps: 1, seed: 5, accumulate: 2\n  optimizer: adam(lr: 1e-2)\n}}\n"
        )
    };
    let run = |text: String| {
        let (plan, out, _) = plan_and_run(&at, &text);
        let mem = out.memory.expect("measured");
        assert_eq!(mem.gathered_params, plan.gathered_params, "{text}");
        assert_eq!(mem.gathered_grads, plan.gathered_grads, "{text}");
        assert_eq!(mem.total(), plan.total_memory(), "{text}");
        plan
    };
    let calls = |plan: &shardc::plan::Plan, kind: &str| -> u64 {
        plan.comms
            .iter()
            .filter(|c| c.kind == kind)
            .map(|c| c.count)
            .sum()
    };
    // Every weight, whole, at once: inp, four blocks' w, out (f32).
    let plain = run(text("dp: 4", ""));
    assert_eq!(
        plain.gathered_params,
        4.0 * (8.0 * 16.0 + 4.0 * 16.0 * 16.0 + 16.0 * 4.0)
    );
    assert_eq!(
        plain.gathered_grads,
        4.0 * 16.0 * 16.0,
        "the largest, one at a time"
    );
    // Six weights, two microbatches.
    assert_eq!(calls(&plain, "param all-gather (FSDP)"), 12);
    assert_eq!(calls(&plain, "grad reduce-scatter (FSDP)"), 12);
    // Checkpointed blocks keep inp and out, and gather one block's w again
    // while recomputing it: four more gathers per microbatch.
    let ck = run(text("dp: 4", ", checkpoint: full"));
    assert_eq!(
        ck.gathered_params,
        4.0 * (8.0 * 16.0 + 16.0 * 4.0 + 16.0 * 16.0)
    );
    assert_eq!(calls(&ck, "param all-gather (FSDP)"), 20);
    assert_eq!(calls(&ck, "grad reduce-scatter (FSDP)"), 12);
    // On one device the gathered weight is the parameter itself: no copy, no
    // traffic.
    let one = run(text("dp: 1", ""));
    assert_eq!((one.gathered_params, one.gathered_grads), (0.0, 0.0));
    assert!(one.comms.is_empty(), "{:?}", one.comms);
    // A pipeline: the first stage keeps its microbatches' gathered weights in
    // flight.
    let pp = run(text("dp: 2, pp: 2", ", stages: pp, microbatches: 2"));
    let stages = pp.pipeline.as_ref().expect("pipelined");
    assert!(stages.in_flight[0] > 1, "{:?}", stages.in_flight);
    assert_eq!(
        pp.gathered_params,
        stages.in_flight[0] as f64 * 4.0 * (8.0 * 16.0 + 2.0 * 16.0 * 16.0)
    );
}

/// The virtual mesh's devices share a replicated parameter piece and, as
/// the optimizer steps it in place, its slots: the plan for one process
/// holding every device counts them once, and a run holds exactly that (each
/// tensor counted once, after the first step). A frozen weight's replicas
/// share it, with no slots.
#[test]
fn one_process_plans_and_holds_replicas_once() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let at = root.join("replicas_plan.shard");
    let text = |optimizer: &str, directive: &str| {
        format!(
            "mesh m(dp: 4, mp: 2)\n\nmodel M {{\n  {directive}\n  w1: f32[8, 16@mp] init normal(0.3)\n  w2: f32[16@mp, 4] init normal(0.3)\n  b: f32[4] init zeros\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {{ psum(tanh(x @ w1) @ w2, mp) + b }}\n}}\n\ntrain M on m {{\n  data: synthetic(classes: 4)\n  batch: 16, steps: 1, seed: 5\n  optimizer: {optimizer}\n}}\n"
        )
    };
    let run = |text: String| {
        let (plan, out, shown) = plan_and_run(&at, &text);
        let mem = out.memory.expect("measured");
        let held = out.state_here.expect("held");
        assert_eq!(mem.total(), plan.total_memory(), "{text}");
        let row = format!(
            "  {:<16} {:>12}",
            "one process",
            shardc::plan::human_bytes(plan.process_memory(8, true))
        );
        assert!(shown.contains(&row), "{shown}");
        assert_eq!(
            8.0 * (mem.total() - mem.state()) + held,
            plan.process_memory(8, true),
            "{text}"
        );
        (plan, held)
    };
    // Per device: w1 and w2 are 8 × 8 and 8 × 4 (split over mp, 4 replicas
    // over dp), b is 4 (8 replicas), f32.
    let (w, b) = (4.0 * (8.0 * 8.0 + 8.0 * 4.0), 4.0 * 4.0);
    // Adam: a piece and its two slots, once per distinct piece (two of w1
    // and w2, one of b).
    let (adam, held) = run(text("adam(lr: 1e-2)", ""));
    assert_eq!(held, 3.0 * (2.0 * w + b));
    assert_eq!(adam.replicas, vec![(4, 3.0 * w), (8, 3.0 * b)]);
    assert_eq!(
        adam.process_memory(8, true),
        8.0 * adam.total_memory() - 3.0 * (6.0 * w + 7.0 * b)
    );
    // Without sharing (a run that reloads), every device keeps its own.
    assert_eq!(adam.process_memory(8, false), 8.0 * adam.total_memory());
    // Part of the mesh in a process (MPI): the bound, every device its own.
    assert_eq!(adam.process_memory(4, true), 4.0 * adam.total_memory());
    // Plain SGD keeps no slots; a frozen weight none either.
    let (sgd, held) = run(text("sgd(lr: 1e-2)", "freeze(b)"));
    assert_eq!(held, 2.0 * w + b);
    assert_eq!(sgd.replicas, vec![(4, w), (8, b)]);
}

/// `text` compiled as the file `at` and trained one step: its plan, what the
/// run measured, and the plan as `shardc plan` prints it.
fn plan_and_run(
    at: &Path,
    text: &str,
) -> (
    shardc::plan::Plan,
    shardc::runtime::train::RunOutput,
    String,
) {
    let c = world::compile_source(at, text.to_string(), &Default::default());
    assert!(!c.has_errors(), "{text}");
    let plan = c.plans.first().cloned().expect("a plan");
    let shown = shardc::plan::render(&plan, &c.sources);
    let (prog, _, mut cfg, src) = c.prepare(None).expect("runnable");
    cfg.steps = 1;
    let out = shardc::runtime::train::run(prog, &cfg, &src, false, &mut |_| {}).expect("runs");
    (plan, out, shown)
}

/// Every float of a run is held in the run's type, whatever the model
/// declares (W0002): an f32 run holds a `bf16` or `f64` weight in f32, and
/// `precision: bf16` holds its working copy in bf16 beside the f32 master.
/// The plan counts those bytes, and a run measures the same.
#[test]
fn declared_float_types_plan_as_the_run_holds_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let at = root.join("dtypes_plan.shard");
    let text = |precision: &str| {
        format!(
            "mesh m(dp: 2)\n\nmodel M {{\n  w1: bf16[8, 16] init normal(0.3)\n  w2: f64[16, 4] init normal(0.3)\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {{\n    cast(tanh(cast(tanh(cast(x, bf16) @ w1), f64) @ w2), f32)\n  }}\n}}\n\ntrain M on m {{\n  data: synthetic(classes: 4)\n  batch: 16, steps: 1, seed: 5{precision}\n  optimizer: adam(lr: 1e-2)\n}}\n"
        )
    };
    let elements = 8.0 * 16.0 + 16.0 * 4.0;
    for (precision, working, master, bf16) in
        [("", 4.0, 0.0, false), (", precision: bf16", 2.0, 4.0, true)]
    {
        let text = text(precision);
        let (plan, out, _) = plan_and_run(&at, &text);
        let mem = out.memory.expect("measured");
        assert_eq!(plan.params, working * elements, "{precision:?}");
        assert_eq!(plan.master_params, master * elements, "{precision:?}");
        assert_eq!(plan.bf16, bf16, "which peak: {precision:?}");
        assert_eq!(mem.params, plan.params, "{precision:?}");
        assert_eq!(mem.total(), plan.total_memory(), "{precision:?}");
    }
}

/// Plan and `--mem` of `text` after one step: (planned, measured) cotangents.
fn cotangents(name: &str, text: &str) -> (f64, f64) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
    let c = world::compile_source(&path, text.to_string(), &Options::default());
    assert!(!c.has_errors(), "{name} has errors");
    let plan = c.plans.first().cloned().expect("a plan");
    let (prog, _, cfg, src) = c.prepare(None).expect("runnable");
    let mut cfg = cfg;
    cfg.steps = 1;
    let out = shardc::runtime::train::run(prog, &cfg, &src, false, &mut |_| {}).expect("runs");
    (plan.cotangents, out.memory.expect("measured").cotangents)
}

/// Backward's cotangents, by hand: on 2 devices each holds 8 rows. From the
/// output's [8, 3] cotangent, `h @ w2` makes relu's [8, 8] (88 floats
/// alive); relu's transpose makes the product's [8, 8] while its own is
/// still held (128 floats, the most); weights' cotangents are the gradients.
/// The run measures the same bytes.
#[test]
fn cotangents_by_hand_and_measured() {
    let mlp = "mesh m(dp: 2)\nmodel M {\n  w1: f32[4, 8] init normal(1.0)\n  w2: f32[8, 3] init normal(1.0)\n  fn forward(x: f32[B@dp, 4]) -> f32[B@dp, 3] {\n    let h = relu(x @ w1)\n    h @ w2\n  }\n}\ntrain M on m { data: synthetic(classes: 3), batch: 16, steps: 1, optimizer: sgd(lr: 0.1) }\n";
    assert_eq!(cotangents("ct_mlp.shard", mlp), (128.0 * 4.0, 128.0 * 4.0));
    // A loss function's backward runs first: its own cotangents (the
    // logits' [4, 2] and the loss's), here fewer than the model's.
    let cls = "mesh host(data: 2, mp: 2)\nmodel Cls {\n  w: f32[6, 4@mp] init normal(0.5)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 4@mp] { tanh(x @ w) * 3.0 }\n  fn ce(z: f32[B@data, 4@mp], y: i32[B@data]) -> f32[] { softmax_cross_entropy(z, y) }\n}\ntrain Cls on host {\n  data: synthetic(classes: 4), batch: 8, steps: 1, seed: 3\n  loss: ce\n  optimizer: adam(lr: 0.05)\n}\n";
    let (planned, measured) = cotangents("ct_cls.shard", cls);
    assert!(planned > 0.0);
    assert_eq!(planned, measured);
}

/// The plan's cotangents equal what runs measure: tensor and data
/// parallelism, FSDP (gathered weights' gradients are `gathered grads`),
/// a pipeline (stage 0, which device 0 runs), accumulated microbatches.
#[test]
fn planned_cotangents_are_measured() {
    for (file, model) in [
        ("models/fsdp_mlp.shard", Some("DPClassifier")),
        ("models/fsdp_mlp.shard", Some("FSDPClassifier")),
        ("tests/models/gptj_small.shard", None),
        ("tests/models/t3d_small.shard", None),
        ("models/shakespeare.shard", None),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let c = world::compile(&path, &Options::default()).expect("readable");
        let (prog, _, cfg, src) = c.prepare(model).expect("runnable");
        let mut cfg = cfg;
        cfg.steps = 1;
        let out = shardc::runtime::train::run(prog, &cfg, &src, false, &mut |_| {}).expect("runs");
        let planned = c
            .plans
            .iter()
            .find(|p| p.model == prog.model)
            .expect("plan")
            .cotangents;
        let measured = out.memory.expect("memory").cotangents;
        assert!(planned > 0.0, "{file}");
        assert_eq!(planned, measured, "{file} {model:?}");
    }
}
