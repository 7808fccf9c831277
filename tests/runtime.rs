//! Numerics of `shardc run`: sharded runs against mesh-of-1 runs (gradients per
//! tensor at init, first losses), determinism, and finite differences in f64 for
//! every differentiated op and collective.

mod numerics;

use numerics::*;
use shardc::runtime::train::{self, Named};
use shardc::world::{self, Options};
use std::path::Path;

#[test]
fn data_parallel_matches_one_device() {
    compare(
        "models/fsdp_mlp.shard",
        &[("data", 8)],
        &[("data", 1)],
        Some("DPClassifier"),
    );
}

/// Trap: a loss averaged across devices before differentiation scales FSDP
/// gradients by the device count. Compared per tensor, so a constant factor shows.
#[test]
fn fsdp_matches_one_device() {
    compare(
        "models/fsdp_mlp.shard",
        &[("data", 8)],
        &[("data", 1)],
        Some("FSDPClassifier"),
    );
}

/// Also covers the trap of LayerNorm scales replicated across tensor-parallel shards
/// whose gradients must be summed over them, and the all_gather transpose (a
/// gathered replicated value whose gradient must not be doubled).
#[test]
fn tensor_parallel_gptj_matches_one_device() {
    compare(
        "tests/models/gptj_small.shard",
        &[("dp", 4), ("mp", 2)],
        &[("dp", 1), ("mp", 1)],
        None,
    );
}

/// The full seed-001 model (d_model 3072, about 1 GB of parameters): too big and
/// slow for CI (16 GiB of tensors and about 21 s per step on dp=4 × mp=2 here),
/// so it runs on request: `cargo test --release --test runtime -- --ignored
/// gptj_full`. In f32 (f64 would need 32 GiB). The 8-device run goes first, while
/// the process is fresh: it peaks near this machine's 24 GiB. The gradients at
/// init come from one step under SGD (the optimizer does not touch them, and
/// Adam's slots would not fit beside the gathered gradients).
#[test]
#[ignore]
fn gptj_full_size_matches_one_device() {
    let file = "models/gptj.shard";
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .expect("model file");
    let sgd = text.replace("optimizer: adam(lr: 1e-5)", "optimizer: sgd(lr: 1e-5)");
    assert_ne!(sgd, text, "the model's optimizer line changed");
    let run = |text: &str, mesh: &[(&str, i64)], steps: usize, grads: bool| {
        let (prog, mut cfg, src) = setup_text(file, text, mesh, None);
        cfg.steps = steps;
        let out = train::run(&prog, &cfg, &src, grads, &mut |r| {
            eprintln!("{mesh:?} step {} loss {}", r.step + 1, r.loss)
        })
        .expect("run");
        (out.first_grads, out.losses)
    };
    let one = [("dp", 1), ("mp", 1)];
    let sharded = [("dp", 4), ("mp", 2)];
    // The first 10 losses under the file's own Adam.
    let (_, l8) = run(&text, &sharded, 10, false);
    let (_, l1) = run(&text, &one, 10, false);
    for (i, (x, y)) in l8.iter().zip(&l1).enumerate() {
        eprintln!("loss {i}: {x} vs {y}");
        assert!(((x - y) / y).abs() < 1e-4, "loss {i}: {x} vs {y}");
    }
    let (g8, _) = run(&sgd, &sharded, 1, true);
    let g8 = g8.expect("grads");
    let (g1, _) = run(&sgd, &one, 1, true);
    let g1 = g1.expect("grads");
    for ((n8, a), (n1, b)) in g8.iter().zip(&g1) {
        assert_eq!(n8, n1);
        let r = max_rel(a, b);
        eprintln!("gradient of `{n8}`: relative difference {r:e}");
        assert!(r < 1e-5, "gradient of `{n8}` differs by {r:e}");
    }
}

/// Seed 004's shape: pipeline stages over pp × Megatron tp × data parallel, with
/// both schedules, on dp=2 × pp=2 × tp=2 and on pp=4 × tp=2, against one device.
#[test]
fn pipeline_matches_one_device_with_both_schedules() {
    let file = "tests/models/t3d_small.shard";
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .expect("model file");
    let one = [("dp", 1), ("pp", 1), ("tp", 1)];
    for schedule in ["gpipe", "one_f_one_b"] {
        let t = text.replace("schedule: gpipe", &format!("schedule: {schedule}"));
        compare_text(file, &t, &[("dp", 2), ("pp", 2), ("tp", 2)], &one, None);
        compare_text(file, &t, &[("dp", 1), ("pp", 4), ("tp", 2)], &one, None);
    }
}

/// The full seed-004 model (`models/transformer_3d.shard`), both schedules, both
/// meshes: minutes of compute, so on request:
/// `cargo test --release --test runtime -- --ignored transformer_3d_full`.
#[test]
#[ignore]
fn transformer_3d_full_matches_one_device_with_both_schedules() {
    let file = "models/transformer_3d.shard";
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .expect("model file")
        // No checkpoints or eval in a comparison.
        .replace("  eval: { every: 50, steps: 10 }\n", "")
        .replace("  checkpoint: { every: 100, keep: 1, dir: \"ckpt\" }\n", "");
    let one = [("dp", 1), ("pp", 1), ("tp", 1)];
    for schedule in ["gpipe", "one_f_one_b"] {
        let t = text.replace("schedule: one_f_one_b", &format!("schedule: {schedule}"));
        compare_text(file, &t, &[("dp", 2), ("pp", 2), ("tp", 2)], &one, None);
        compare_text(file, &t, &[("dp", 1), ("pp", 4), ("tp", 2)], &one, None);
    }
}

/// With 8 microbatches on 2 stages, 1F1B holds at most 2 microbatches' activations
/// on the first stage where GPipe holds all 8: the measured peak is lower.
#[test]
fn one_f_one_b_holds_fewer_activations_than_gpipe() {
    let file = "tests/models/t3d_small.shard";
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .expect("model file")
        .replace("microbatches: 4", "microbatches: 8")
        .replace("accumulate: 2", "accumulate: 1");
    let peak = |schedule: &str| {
        let t = text.replace("schedule: gpipe", &format!("schedule: {schedule}"));
        let (prog, mut cfg, src) = setup_text(file, &t, &[], None);
        cfg.steps = 1;
        let out = train::run(&prog, &cfg, &src, false, &mut |_| {}).expect("run");
        out.memory.expect("measured").activations
    };
    let (gpipe, ofob) = (peak("gpipe"), peak("one_f_one_b"));
    assert!(
        ofob > 0.0 && ofob * 3.0 < gpipe,
        "1F1B {ofob} vs GPipe {gpipe} bytes"
    );
}

#[test]
fn same_seed_same_losses_bit_for_bit() {
    let (_, a) = grads_and_losses(
        "models/fsdp_mlp.shard",
        &[("data", 8)],
        Some("FSDPClassifier"),
        5,
        false,
    );
    let (_, b) = grads_and_losses(
        "models/fsdp_mlp.shard",
        &[("data", 8)],
        Some("FSDPClassifier"),
        5,
        false,
    );
    assert_eq!(
        a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
}

#[test]
fn training_lowers_the_loss() {
    let (_, l) = grads_and_losses(
        "models/fsdp_mlp.shard",
        &[("data", 8)],
        Some("DPClassifier"),
        15,
        false,
    );
    assert!(l[l.len() - 1] < 0.5 * l[0], "{l:?}");
}

/// Loss at the given global parameter values (f64, one step, no update counted).
const FD_MESH: &str = "mesh m(dp: 2, mp: 2)\n";

#[test]
fn finite_differences_elementwise_and_matmul() {
    let text = format!(
        "{FD_MESH}model M {{\n  w: f32[6, 8@mp] init normal(0.5)\n  b: f32[8@mp] init normal(0.5)\n  v: f32[8@mp, 5] init normal(0.5)\n  c: f32[5] init normal(0.5)\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 5] {{\n    let h = x @ w + b\n    let g = relu(h) * 0.5 + gelu(h) - silu(h) / 2.0 + tanh(h) * sigmoid(h) + square(h) * 0.1 - exp(h * 0.1) + 3.0 - h\n    psum(g @ v, mp) * c + c / (square(c) + 1.0)\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 5), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }}\n"
    );
    finite_differences("fd_elementwise.shard", &text, &[]);
}

#[test]
fn finite_differences_layer_norm_einsum_attention() {
    let text = format!(
        "{FD_MESH}import nn\nmodel M {{\n  ln = LayerNorm(8)\n  wq: f32[8, 2@mp, 4] init normal(0.5)\n  wo: f32[2@mp, 4, 5] init normal(0.5)\n  fn forward(x: f32[B@dp, 3, 8]) -> f32[B@dp, 3, 5] {{\n    let h = ln(x)\n    let q = einsum(\"btd,dhe->bthe\", h, wq)\n    let a = causal_attention(q, q * 0.5, q)\n    psum(einsum(\"bthe,hed->btd\", a, wo), mp)\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 5), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }}\n"
    );
    finite_differences("fd_attention.shard", &text, &[]);
}

#[test]
fn finite_differences_vocab_parallel_embedding_and_sharded_loss() {
    let text = format!(
        "{FD_MESH}import nn\nmodel M {{\n  e = Embed(16@mp, 6)\n  w: f32[6, 16@mp] init normal(0.5)\n  fn forward(ids: i32[B@dp, 3]) -> f32[B@dp, 3, 16@mp] {{\n    e(ids) @ w\n  }}\n}}\ntrain M on m {{ data: synthetic(), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }}\n"
    );
    finite_differences("fd_embed.shard", &text, &[]);
}

#[test]
fn finite_differences_collectives_and_reshards() {
    // all_gather ↔ psum_scatter, all-reduce ↔ all-reduce, slice ↔ pad, FSDP gather.
    let text = format!(
        "{FD_MESH}model M {{\n  shard_params(dp, min_size: 4)\n  w: f32[6, 8@mp] init normal(0.5)\n  v: f32[8, 4] init normal(0.5)\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 4] {{\n    let g: f32[B@dp, 8@_] = tanh(x @ w)\n    let r: f32[B@_, 4] = g @ v\n    let back: f32[B@dp, 4] = r\n    tanh(back)\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 4), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }}\n"
    );
    finite_differences("fd_collectives.shard", &text, &[]);
}

#[test]
fn finite_differences_shape_ops_and_remaining_elementwise() {
    // log, sqrt, abs, reshape, transpose, indexing, dropout (the same mask for the
    // same seed and step) and cast. (stop_gradient has no finite-difference check: it
    // differs from the derivative by design.)
    let text = format!(
        "{FD_MESH}model M {{\n  w: f32[6, 8@mp] init normal(0.5)\n  v: f32[4, 3] init normal(0.5)\n  fn forward(x: f32[B@dp, 2, 6]) -> f32[B@dp, 3] {{\n    let h: f32[B@dp, 2, 8@_] = x @ w\n    let e = log(square(h) + 1.0) + sqrt(abs(h) + 0.5) + cast(h, f32) * h\n    let t = transpose(e, [0, 2, 1])\n    let r = reshape(t, [B, 4, 4])\n    let q = transpose(r, [1, 0, 2])\n    let d = dropout(cast(q, f32), 0.25)\n    tanh(d[1] @ v) + tanh(q[0] @ v)\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 3), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }}\n"
    );
    finite_differences("fd_shapes.shard", &text, &[]);
}

#[test]
fn finite_differences_softmax_rms_norm_rsqrt_one_hot() {
    // softmax, log_softmax (over a split dim: gathered first), rms_norm, rsqrt,
    // one_hot with its class dim split, and axis_index as a per-device constant.
    let text = format!(
        "{FD_MESH}import nn\nmodel M {{\n  n = RMSNorm(8)\n  w: f32[6, 8@mp] init normal(0.5)\n  v: f32[8, 3] init normal(0.5)\n  u: f32[6, 4] init normal(0.5)\n  z: f32[4, 3] init normal(0.5)\n  fn forward(x: f32[B@dp, 6], ids: i32[B@dp]) -> f32[B@dp, 3] {{\n    let h = x @ w\n    let s = softmax(h) + log_softmax(h, dim: 1) * 0.1 + rsqrt(square(h) + 1.0)\n    let o: f32[B@dp, 4@_] = one_hot(ids, 4@mp)\n    let k = psum(sum(cast(axis_index(mp), f32) + 1.0), mp)\n    tanh(n(s) @ v) * k + (o * (x @ u)) @ z\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 3, vocab: 4), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }}\n"
    );
    finite_differences("fd_softmax.shard", &text, &[]);
    // The forward pass itself (one_hot's windows) against one device; axis_index
    // sums to 1 there and to 1 + 2 on mp=2, so compare with k pinned to 3.
    let pinned = text
        .replace(
            "    let k = psum(sum(cast(axis_index(mp), f32) + 1.0), mp)\n",
            "",
        )
        .replace("* k", "* 3.0");
    let losses = |mesh: &[(&str, i64)]| {
        let (prog, mut cfg, src) = setup_text("fd_softmax.shard", &pinned, mesh, None);
        cfg.dtype = candle_core::DType::F64;
        cfg.steps = 3;
        train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("run")
            .losses
    };
    let (a, b) = (losses(&[]), losses(&[("dp", 1), ("mp", 1)]));
    assert!(max_rel(&a, &b) < 1e-12, "{a:?} vs {b:?}");
}

/// `stop_gradient` passes values and blocks gradients: a weight used only through
/// it gets a zero gradient, while the loss still depends on it.
#[test]
fn stop_gradient_blocks_the_gradient() {
    let text = format!(
        "{FD_MESH}model M {{\n  w: f32[6, 3] init normal(0.5)\n  u: f32[6, 3] init normal(0.5)\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 3] {{\n    stop_gradient(x @ w) + x @ u\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 3), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }}\n"
    );
    let (prog, mut cfg, src) = setup_text("sg.shard", &text, &[], None);
    cfg.dtype = candle_core::DType::F64;
    let grads = train::run(&prog, &cfg, &src, true, &mut |_| {})
        .expect("run")
        .first_grads
        .expect("grads");
    let g = |n: &str| grads.iter().find(|p| p.0 == n).expect(n).1.clone();
    assert!(g("w").iter().all(|x| *x == 0.0));
    assert!(g("u").iter().any(|x| *x != 0.0));
}

#[test]
fn finite_differences_reductions_and_explicit_reducing_collectives() {
    // sum/mean/max/min over a split dim leave a pending reduction; psum, pmax, pmin
    // and pmean finish it (pmax/pmin route the cotangent to the extremum).
    let text = format!(
        "{FD_MESH}model M {{\n  w: f32[6, 8@mp] init normal(0.5)\n  v: f32[8@mp, 3] init normal(0.5)\n  fn forward(x: f32[B@dp, 3, 6]) -> f32[B@dp, 3] {{\n    let h = x @ w\n    let m = pmax(max(h, dim: 2), mp)\n    let n = pmin(min(h, dim: -1), mp)\n    let s = psum(sum(h, dim: 2), mp)\n    let a = psum(mean(h, dim: [2]), mp)\n    let p = pmean(h @ v, mp)\n    m * 0.5 + n * 0.3 + tanh(s * 0.1) + a - sum(p, dim: 2) * 0.2 + max(tanh(p), dim: 2)\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 3), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }}\n"
    );
    finite_differences("fd_reductions.shard", &text, &[]);
}

#[test]
fn finite_differences_ppermute_and_all_to_all() {
    // ppermute's transpose is the inverse permutation; all_to_all's moves the axis back.
    let model = |shift: i64| {
        format!(
            "{FD_MESH}model M {{\n  w: f32[6, 8] init normal(0.5)\n  v: f32[8@dp, 3] init normal(0.5)\n  fn forward(x: f32[B@dp, 4, 6]) -> f32[B@dp, 4, 3] {{\n    let h = tanh(x @ w)\n    let r = ppermute(h, dp, shift: {shift})\n    let t = all_to_all(h * r + r, dp, from: 0, to: 2)\n    let back: f32[B@dp, 4, 3] = psum(t @ v, dp)\n    back\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 3), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }}\n"
        )
    };
    finite_differences("fd_permute.shard", &model(1), &[]);
    // On four devices along dp, shifts 1 and -1 differ.
    finite_differences("fd_permute4.shard", &model(1), &[("dp", 4), ("mp", 1)]);
    finite_differences("fd_permute4.shard", &model(-1), &[("dp", 4), ("mp", 1)]);
}

/// The native all_to_all and ppermute against their definitions: gather then slice,
/// and a rotation of the global array.
#[test]
fn all_to_all_and_ppermute_agree_with_their_definitions() {
    let run = |body: &str, mesh: &[(&str, i64)]| {
        let text = format!("mesh m(dp: 4)\nmodel M {{\n  w: f32[6, 8] init normal(0.5)\n  v: f32[8, 3] init normal(0.5)\n  fn forward(x: f32[B@dp, 4, 6]) -> f32[B@dp, 4, 3] {{\n    let h = tanh(x @ w)\n{body}\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 3), batch: 8, steps: 3, optimizer: sgd(lr: 0.1) }}\n");
        let (prog, mut cfg, src) = setup_text("a2a.shard", &text, mesh, None);
        cfg.dtype = candle_core::DType::F64;
        train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("run")
            .losses
    };
    let native = run("    let t = all_to_all(h, dp, from: 0, to: 2)\n    let back: f32[B@dp, 4, 3] = t @ v\n    back", &[]);
    let resharded = run(
        "    let t: f32[B, 4, 8@dp] = h\n    let back: f32[B@dp, 4, 3] = t @ v\n    back",
        &[],
    );
    let one = run("    h @ v", &[("dp", 1)]);
    assert!(
        max_rel(&native, &resharded) < 1e-12,
        "{native:?} vs {resharded:?}"
    );
    assert!(max_rel(&native, &one) < 1e-12, "{native:?} vs {one:?}");
    // Rotating the batch by one block and back leaves the model unchanged.
    let there_and_back = run(
        "    let r = ppermute(ppermute(h, dp, shift: 1), dp, shift: -1)\n    r @ v",
        &[],
    );
    assert!(max_rel(&there_and_back, &one) < 1e-12);
}

/// psum of a large tensor (reduced in chunks, then gathered) has the same bits as
/// the sum in group order, for groups over one axis and over two, with sizes the
/// group does not divide.
#[test]
fn chunked_psum_equals_the_ordered_sum_bit_for_bit() {
    use shardc::mesh::{Collectives, Topology};
    use shardc::runtime::mesh::Comm;
    let topo = Topology {
        axes: vec![("a".into(), 2), ("b".into(), 3)],
    };
    let comm = Comm::new(topo.clone());
    let dev = candle_core::Device::Cpu;
    // 70007 elements: above the chunking threshold, and 3 and 6 do not divide it.
    let value = |r: usize| -> Vec<f32> {
        (0..70007)
            .map(|i| ((i * 7 + r * 13) as f32 * 0.001).sin() * 1e3)
            .collect()
    };
    for axes in [
        vec!["b".to_string()],
        vec!["a".to_string(), "b".to_string()],
    ] {
        let results: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..6)
                .map(|r| {
                    let (comm, axes, dev) = (&comm, &axes, &dev);
                    s.spawn(move || {
                        let t = candle_core::Tensor::from_vec(value(r), (7, 10001), dev)
                            .and_then(|t| comm.psum(r, &t, axes))
                            .and_then(|t| t.flatten_all())
                            .and_then(|t| t.to_vec1::<f32>());
                        t.expect("psum")
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("device")).collect()
        });
        for (r, got) in results.iter().enumerate() {
            let group = topo.group(r, &axes);
            let mut want = value(group[0]);
            for m in &group[1..] {
                for (w, x) in want.iter_mut().zip(value(*m)) {
                    *w += x;
                }
            }
            assert!(
                got.iter()
                    .zip(&want)
                    .all(|(g, w)| g.to_bits() == w.to_bits()),
                "device {r}, axes {axes:?}: chunked psum differs from the ordered sum"
            );
        }
    }
}

/// `shardc plan` predicts the per-device memory that a run measures, within 10%.
#[test]
fn plan_matches_measured_memory() {
    for (file, model, mesh) in [
        ("models/fsdp_mlp.shard", Some("DPClassifier"), vec![]),
        ("models/fsdp_mlp.shard", Some("FSDPClassifier"), vec![]),
        ("tests/models/gptj_small.shard", None, vec![]),
        ("models/shakespeare.shard", None, vec![]),
        ("tests/models/t3d_small.shard", None, vec![]),
    ] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let c = world::compile(
            &path,
            &Options {
                mesh,
                ..Options::default()
            },
        )
        .expect("readable");
        let (prog, mut cfg, src) = setup(file, &[], model);
        cfg.steps = 1;
        let out = train::run(&prog, &cfg, &src, false, &mut |_| {}).expect("run");
        let measured = out.memory.expect("memory").total();
        let planned = c
            .plans
            .iter()
            .find(|p| p.model == prog.model)
            .expect("plan")
            .total_memory();
        let r = (planned - measured).abs() / measured;
        assert!(
            r < 0.10,
            "{file} {model:?}: plan {planned} vs measured {measured} ({:.1}% off)",
            r * 100.0
        );
    }
}

/// A NaN in the loss stops the run with the step and the op that produced it.
#[test]
fn nan_loss_names_the_step_and_the_op() {
    let text = "mesh m(dp: 2)\nmodel M {\n  w: f32[4, 3] init normal(1.0)\n  fn forward(x: f32[B@dp, 4]) -> f32[B@dp, 3] {\n    let h = x @ w\n    log(h * 0.0 - 1.0)\n  }\n}\ntrain M on m { data: synthetic(classes: 3), batch: 4, steps: 3, optimizer: sgd(lr: 0.1) }\n";
    let (prog, cfg, src) = setup_text("nan.shard", text, &[], None);
    let err = train::run(&prog, &cfg, &src, false, &mut |_| {})
        .err()
        .expect("the run must stop");
    assert!(err.message().contains("step 1"), "{err}");
    assert!(
        matches!(err.fault, shardc::fault::Fault::Numerical(_)),
        "{err:?}"
    );
    assert_eq!(err.step, Some(1));
    let (node, generation) = err.node.expect("the op to blame");
    assert_eq!(generation, 0);
    assert!(matches!(&prog.nodes[node].op, shardc::spmd::Op::Prim(p) if p.get().name() == "log"));
}

/// Seed 000: the embedding table (rows split over `device`, gathered for the
/// lookup, gradients reduce-scattered back) and the two dense layers.
#[test]
fn shakespeare_matches_one_device() {
    compare(
        "models/shakespeare.shard",
        &[("device", 8)],
        &[("device", 1)],
        None,
    );
}

#[test]
fn finite_differences_table_lookup() {
    let text = "mesh m(dp: 2) { sparsecores: 2 }\ntable t { vocab: 16, dim: 4, init: normal(1.0), combiner: mean, optimizer: adagrad(lr: 0.1), shard: rows(dp) }\nfeature f: i32[B * 3, 1] -> t\nimport nn\nmodel M {\n  d = Dense(12 -> 5)\n  fn forward(ids: i32[B@dp, 3]) -> f32[B@dp, 5] {\n    d(tanh(reshape(lookup(f, ids), [B@dp, 12])))\n  }\n}\ntrain M on m { data: synthetic(classes: 5), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }\n";
    finite_differences("fd_lookup.shard", text, &[]);
}

/// Gradient accumulation over 4 microbatches gives the full-batch gradient.
#[test]
fn accumulated_gradient_equals_full_batch_gradient() {
    let model = "import nn\nmesh m(data: 4)\nmodel C {\n  a = Dense(6 -> 8)\n  b = Dense(8 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { b(silu(a(x))) }\n}\n";
    let grads = |extra: &str| {
        let text = format!("{model}train C on m {{ data: synthetic(classes: 3), batch: 32, steps: 1, optimizer: sgd(lr: 0.1){extra} }}\n");
        let (prog, mut cfg, src) = setup_text("acc.shard", &text, &[], None);
        cfg.dtype = candle_core::DType::F64;
        train::run(&prog, &cfg, &src, true, &mut |_| {})
            .expect("run")
            .first_grads
            .expect("grads")
    };
    let full = grads("");
    let acc = grads(", accumulate: 4");
    for ((n, a), (_, b)) in acc.iter().zip(&full) {
        assert!(max_rel(a, b) < 1e-9, "`{n}` differs by {:e}", max_rel(a, b));
    }
}

/// optax.warmup_cosine_decay_schedule(init, peak, warmup, decay_steps, end).
#[test]
fn warmup_cosine_matches_optax() {
    let s = schedule(
        "warmup_cosine",
        &[
            ("init", 1e-7),
            ("peak", 3e-4),
            ("warmup", 100.0),
            ("decay", 1000.0),
            ("end", 3e-5),
        ],
    );
    assert!(close(s.at(0), 1e-7));
    assert!(close(s.at(50), 1e-7 + (3e-4 - 1e-7) * 0.5));
    assert!(close(s.at(100), 3e-4));
    // Halfway through the cosine part: end + (peak - end) / 2.
    assert!(close(s.at(550), 3e-5 + (3e-4 - 3e-5) * 0.5));
    assert!(close(s.at(1000), 3e-5));
    assert!(close(s.at(5000), 3e-5));
}

fn schedule(name: &str, args: &[(&str, f64)]) -> shardc::spec::Schedule {
    let kind = shardc::vocab::Lr::from_name(name).expect("a registered schedule");
    shardc::spec::Schedule::build(kind, &|k: &str| args.iter().find(|a| a.0 == k).map(|a| a.1))
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 + 1e-9 * b.abs()
}

/// Linear, constant and warmup-stable-decay schedules, and inverse square root.
#[test]
fn schedules_follow_their_formulas() {
    let lin = schedule(
        "warmup_linear",
        &[
            ("init", 0.0),
            ("peak", 1e-3),
            ("warmup", 10.0),
            ("decay", 110.0),
            ("end", 1e-4),
        ],
    );
    assert!(close(lin.at(5), 5e-4));
    assert!(close(lin.at(10), 1e-3));
    assert!(close(lin.at(60), 1e-3 + (1e-4 - 1e-3) * 0.5));
    assert!(close(lin.at(500), 1e-4));
    let flat = schedule("warmup_constant", &[("peak", 2e-3), ("warmup", 4.0)]);
    assert!(close(flat.at(1), 5e-4));
    assert!(close(flat.at(4), 2e-3) && close(flat.at(10_000), 2e-3));
    let wsd = schedule(
        "wsd",
        &[
            ("peak", 1e-3),
            ("warmup", 10.0),
            ("stable", 80.0),
            ("decay", 10.0),
            ("end", 0.0),
        ],
    );
    assert!(close(wsd.at(10), 1e-3) && close(wsd.at(89), 1e-3));
    assert!(close(wsd.at(95), 5e-4));
    assert!(close(wsd.at(100), 0.0) && close(wsd.at(200), 0.0));
    let isq = schedule("inverse_sqrt", &[("peak", 1e-3), ("warmup", 100.0)]);
    assert!(close(isq.at(50), 5e-4) && close(isq.at(100), 1e-3));
    assert!(close(isq.at(400), 5e-4));
}

/// Clipping by global norm: with a tiny limit the update is the clipped gradient.
#[test]
fn clipping_scales_the_update_to_the_limit() {
    let text = "mesh m(data: 2)\nmodel C {\n  w: f32[4, 3] init normal(1.0)\n  fn forward(x: f32[B@data, 4]) -> f32[B@data, 3] { x @ w }\n}\ntrain C on m { data: synthetic(classes: 3), batch: 8, steps: 2, optimizer: sgd(lr: 1.0), clip_grad_norm: 0.001 }\n";
    let (prog, mut cfg, src) = setup_text("clip.shard", text, &[], None);
    cfg.dtype = candle_core::DType::F64;
    let g0 = train::run(&prog, &cfg, &src, true, &mut |_| {})
        .expect("run")
        .first_grads
        .expect("grads");
    let norm: f64 = g0
        .iter()
        .flat_map(|(_, v)| v.iter())
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt();
    assert!(
        norm > 0.001,
        "the test needs a gradient larger than the limit"
    );
    // After one SGD step with lr 1 the parameters moved by exactly the clipped gradient.
    let p0 = global_params(&prog, &cfg);
    let moved: f64 = {
        // Loss after the step, from a fresh run whose initial values are the updated ones.
        let updated: Named = p0
            .iter()
            .zip(&g0)
            .map(|((n, p), (_, g))| {
                (
                    n.clone(),
                    p.iter().zip(g).map(|(a, b)| a - b * 0.001 / norm).collect(),
                )
            })
            .collect();
        let expected = loss_at(&prog, &cfg, &src, &updated);
        let mut two = cfg.clone();
        two.steps = 2;
        let l = train::run(&prog, &two, &src, false, &mut |_| {})
            .expect("run")
            .losses;
        (l[1] - expected).abs()
    };
    assert!(
        moved < 1e-12,
        "the second loss differs from the clipped update's by {moved:e}"
    );
}

fn ckpt_model(dir: &Path) -> String {
    format!(
        "import nn\nmesh m(data: 4)\nmodel C {{\n  a = Dense(6 -> 8)\n  b = Dense(8 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] {{ b(dropout(silu(a(x)), 0.1)) }}\n}}\ntrain C on m {{ data: synthetic(classes: 3), batch: 16, steps: 40, seed: 3, optimizer: adamw(lr: 0.01), checkpoint: {{ every: 10, keep: 2, dir: \"{}\" }} }}\n",
        dir.display()
    )
}

/// 40 steps straight, or 20 steps then a resume from the checkpoint: the same
/// losses, bit for bit (parameters, Adam moments, step count, data and dropout).
#[test]
fn resume_continues_bit_for_bit() {
    let base = std::env::temp_dir().join(format!("shardc-resume-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (a, b) = (base.join("a"), base.join("b"));
    let (prog, cfg, src) = setup_text("ckpt.shard", &ckpt_model(&a), &[], None);
    let straight = train::run(&prog, &cfg, &src, false, &mut |_| {})
        .expect("run")
        .losses;
    let (prog, mut cfg, src) = setup_text("ckpt.shard", &ckpt_model(&b), &[], None);
    let full = cfg.steps;
    cfg.steps = 20;
    let first = train::run(&prog, &cfg, &src, false, &mut |_| {})
        .expect("run")
        .losses;
    assert_eq!(shardc::runtime::checkpoint::list(&b).len(), 2, "keep: 2");
    cfg.steps = full;
    shardc::runtime::checkpoint::resume(&prog, &mut cfg).expect("resume");
    assert_eq!(cfg.start_step, 20);
    let rest = train::run(&prog, &cfg, &src, false, &mut |_| {})
        .expect("run")
        .losses;
    let joined: Vec<u64> = first.iter().chain(&rest).map(|x| x.to_bits()).collect();
    assert_eq!(
        joined,
        straight.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    let _ = std::fs::remove_dir_all(&base);
}

/// Saved on data=4, resumed on data=2 × 1: the checkpoint is resharded on load.
#[test]
fn resume_onto_a_different_mesh() {
    let base = std::env::temp_dir().join(format!("shardc-remesh-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (prog, mut cfg, src) = setup_text("ckpt.shard", &ckpt_model(&base), &[], None);
    let straight = train::run(&prog, &cfg, &src, false, &mut |_| {})
        .expect("run")
        .losses;
    // A second run, from nothing (the first run's checkpoints are newer).
    let _ = std::fs::remove_dir_all(&base);
    cfg.steps = 20;
    train::run(&prog, &cfg, &src, false, &mut |_| {}).expect("run");
    let (prog2, mut cfg2, src2) =
        setup_text("ckpt.shard", &ckpt_model(&base), &[("data", 2)], None);
    shardc::runtime::checkpoint::resume(&prog2, &mut cfg2).expect("resume");
    let rest = train::run(&prog2, &cfg2, &src2, false, &mut |_| {})
        .expect("run")
        .losses;
    assert_eq!(rest.len(), 20, "resumed after step 20");
    for (i, (x, y)) in rest.iter().zip(&straight[20..]).enumerate() {
        assert!(((x - y) / y).abs() < 1e-4, "step {}: {x} vs {y}", i + 21);
    }
    let _ = std::fs::remove_dir_all(&base);
}

/// A checkpoint directory left half-written (a process killed mid-save) is ignored:
/// the last complete checkpoint still resumes.
#[test]
fn a_half_written_checkpoint_is_ignored() {
    let base = std::env::temp_dir().join(format!("shardc-killed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let (prog, mut cfg, src) = setup_text("ckpt.shard", &ckpt_model(&base), &[], None);
    cfg.steps = 10;
    train::run(&prog, &cfg, &src, false, &mut |_| {}).expect("run");
    // What a kill during the next save leaves: a temporary directory, partly written.
    let tmp = base.join(".tmp-step-00000020-999");
    std::fs::create_dir_all(&tmp).expect("tmp");
    std::fs::write(tmp.join("tensors.safetensors"), b"partial").expect("write");
    let mut c2 = cfg.clone();
    c2.steps = 40;
    let msg = shardc::runtime::checkpoint::resume(&prog, &mut c2).expect("resume");
    assert_eq!(c2.start_step, 10, "{msg}");
    // And a corrupt complete-looking checkpoint is a clear error, not a crash.
    let bad = base.join("step-00000030");
    std::fs::create_dir_all(&bad).expect("dir");
    std::fs::write(bad.join("manifest.json"), "{ not json").expect("write");
    let mut c3 = cfg.clone();
    let err = shardc::runtime::checkpoint::resume(&prog, &mut c3).expect_err("must fail");
    assert!(err.to_string().contains("manifest"), "{err}");
    let _ = std::fs::remove_dir_all(&base);
}

/// `--dump-init` then `--init` of the same file reproduces the same losses; a
/// missing or mis-shaped tensor is an error naming it.
#[test]
fn dump_init_then_init_reproduces_the_run() {
    let path = std::env::temp_dir().join(format!("shardc-init-{}.safetensors", std::process::id()));
    let (prog, mut cfg, src) = setup("models/fsdp_mlp.shard", &[], Some("DPClassifier"));
    cfg.steps = 3;
    let a = train::run(&prog, &cfg, &src, false, &mut |_| {})
        .expect("run")
        .losses;
    shardc::runtime::checkpoint::dump_init(&prog, cfg.seed, &path).expect("dump");
    let mut c2 = cfg.clone();
    let init = shardc::runtime::checkpoint::load_init(&prog, &path, None).expect("load");
    assert!(init.unused.is_empty(), "{:?}", init.unused);
    c2.init = init.params;
    let b = train::run(&prog, &c2, &src, false, &mut |_| {})
        .expect("run")
        .losses;
    assert_eq!(
        a.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        b.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    let (other, _, _) = setup("tests/models/gptj_small.shard", &[], None);
    let err = shardc::runtime::checkpoint::load_init(&other, &path, None)
        .expect_err("wrong model")
        .to_string();
    assert!(err.contains("embed.w"), "{err}");
    let _ = std::fs::remove_file(&path);
}

/// `eval: { every, steps }` reports a held-out loss on those steps and changes nothing
/// about training.
#[test]
fn eval_reports_held_out_loss_without_touching_training() {
    let model = "import nn\nmesh m(data: 2)\nmodel C {\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { a(x) }\n}\n";
    let run = |extra: &str| {
        let text = format!("{model}train C on m {{ data: synthetic(classes: 3), batch: 8, steps: 10, optimizer: adam(lr: 0.01){extra} }}\n");
        let (prog, cfg, src) = setup_text("eval.shard", &text, &[], None);
        let mut evals = Vec::new();
        let losses = train::run(&prog, &cfg, &src, false, &mut |r| evals.push(r.eval_loss))
            .expect("run")
            .losses;
        (losses, evals)
    };
    let (plain, _) = run("");
    let (with_eval, evals) = run(", eval: { every: 5, steps: 2 }");
    assert_eq!(
        plain.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        with_eval.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    );
    let at: Vec<usize> = evals
        .iter()
        .enumerate()
        .filter(|(_, e)| e.is_some())
        .map(|(i, _)| i + 1)
        .collect();
    assert_eq!(at, vec![5, 10]);
    assert!(evals.iter().flatten().all(|e| e.is_finite() && *e > 0.0));
}

/// Numbers of sizes fold when the file is checked: `1.0 / sqrt(E)` inside a
/// generic layer is 0.25 for `E = 16`, and `exp(0.0)`, `sqrt(4.0)` are 1 and
/// 2: the run equals the one with those constants written out, bit for bit.
#[test]
fn scalar_functions_of_sizes_fold_to_their_numbers() {
    let run = |scale: &str, one: &str, two: &str| {
        let text = format!("import nn\nmesh m(dp: 2)\nlayer Scaled(E) {{\n  w : f32[E, E] init normal(0.1)\n  fn forward(x: f32[B, E]) -> f32[B, E] {{ (x @ w) * {scale} }}\n}}\nmodel M {{\n  s = Scaled(16)\n  out = Dense(16 -> 3)\n  fn forward(x: f32[B@dp, 16]) -> f32[B@dp, 3] {{ out(s(x) * {one} + x * {two} * 0.0) }}\n}}\ntrain M on m {{ data: synthetic(classes: 3), batch: 8, steps: 4, optimizer: adam(lr: 0.01) }}\n");
        let (prog, cfg, src) = setup_text("fold.shard", &text, &[], None);
        let l = train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("run")
            .losses;
        l.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(
        run("(1.0 / sqrt(E))", "exp(0.0)", "sqrt(4.0)"),
        run("0.25", "1.0", "2.0")
    );
}

/// A number argument of an elementwise function, dropout's rate, a norm's
/// `eps` may be any expression that folds (`C * 1.0`, `1.0 / sqrt(E)`,
/// `-inf`-free arithmetic of sizes): the run equals the one with the numbers
/// written out, bit for bit.
#[test]
fn number_arguments_fold_from_sizes_and_constants() {
    let run = |lo: &str, hi: &str, cut: &str, eps: &str| {
        let text = format!("import nn\nconst C = 4\nmesh m(dp: 2)\nlayer Gate(E) {{\n  w : f32[E] init ones\n  fn forward(x: f32[B, E]) -> f32[B, E] {{\n    let h = rms_norm(x, w, eps: {eps})\n    let c = clamp(h, {lo}, {hi})\n    where(less(c, {cut}), c, maximum(h, {lo}))\n  }}\n}}\nmodel M {{\n  a = Dense(6 -> 6)\n  g = Gate(6)\n  out = Dense(6 -> 3)\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 3] {{ out(g(a(x))) }}\n}}\ntrain M on m {{ data: synthetic(classes: 3), batch: 8, steps: 4, optimizer: adam(lr: 0.01) }}\n");
        let (prog, cfg, src) = setup_text("numbers.shard", &text, &[], None);
        let l = train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("run")
            .losses;
        l.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(
        run(
            "-1.0 / sqrt(E - 2)",
            "C * 0.125",
            "C / 8.0 - 0.25",
            "1.0 / (C * 250000.0)"
        ),
        run("-0.5", "0.5", "0.25", "0.000001")
    );
}

/// A model held by another as a sublayer trains exactly as the same
/// declaration written as a `layer`, with its parameters under the member.
#[test]
fn a_model_held_as_a_sublayer_trains_as_a_layer() {
    let run = |kind: &str| {
        let text = format!("import nn\nmesh m(dp: 2)\n{kind} {{\n  a = Dense(6 -> 6)\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 6] {{ relu(a(x)) }}\n}}\nmodel Outer {{\n  i = Inner()\n  out = Dense(6 -> 3)\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 3] {{ out(i(x)) }}\n}}\ntrain Outer on m {{ data: synthetic(classes: 3), batch: 8, steps: 4, optimizer: adam(lr: 0.01) }}\n");
        let (prog, cfg, src) = setup_text("held.shard", &text, &[], None);
        let names: Vec<String> = prog.params.iter().map(|p| p.name.clone()).collect();
        let l = train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("run")
            .losses;
        (names, l.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
    };
    let (model, layer) = (run("model Inner"), run("layer Inner()"));
    assert!(model.0.contains(&"i.a.w".to_string()), "{:?}", model.0);
    assert_eq!(model, layer);
}

/// A sublayer's own function, `p.scale(x)`, runs on the sublayer's
/// parameters: the run equals calling its `forward` (which calls `scale`)
/// bit for bit, and has the same parameters.
#[test]
fn a_sublayers_function_is_callable_on_its_parameters() {
    let run = |call: &str| {
        let text = format!("import nn\nmesh m(dp: 2)\nlayer Proj(D) {{\n  w : f32[D, D] init normal(0.1)\n  fn scale(x: f32[B, D]) -> f32[B, D] {{ x @ w }}\n  fn forward(x: f32[B, D]) -> f32[B, D] {{ scale(x) }}\n}}\nmodel M {{\n  p = Proj(6)\n  out = Dense(6 -> 3)\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 3] {{ out(relu({call})) }}\n}}\ntrain M on m {{ data: synthetic(classes: 3), batch: 8, steps: 4, optimizer: adam(lr: 0.01) }}\n");
        let (prog, cfg, src) = setup_text("sub.shard", &text, &[], None);
        let names: Vec<String> = prog.params.iter().map(|p| p.name.clone()).collect();
        let l = train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("run")
            .losses;
        (names, l.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
    };
    let (a, b) = (run("p.scale(x)"), run("p(x)"));
    assert!(a.0.contains(&"p.w".to_string()), "{:?}", a.0);
    assert_eq!(a, b);
}

/// `inf` is a number: `maximum(y, y * 0.0 - inf)` is `y`, so the run equals
/// the one without it bit for bit, on every device.
#[test]
fn minus_inf_is_a_number_that_changes_nothing_under_maximum() {
    let run = |body: &str| {
        let text = format!("import nn\nmesh m(data: 2)\nmodel C {{\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] {{ let y = a(x)\n {body} }}\n}}\ntrain C on m {{ data: synthetic(classes: 3), batch: 8, steps: 4, optimizer: adam(lr: 0.01) }}\n");
        let (prog, cfg, src) = setup_text("inf.shard", &text, &[], None);
        let l = train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("run")
            .losses;
        l.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(run("maximum(y, y * 0.0 - inf)"), run("y"));
}

/// An `.npz` as `numpy.savez_compressed` writes it (deflated) trains exactly as
/// the stored archive of the same arrays, and held-out arrays may hold their own
/// number of batches (3 here, against 1 training batch): eval steps 0, 1, 2 read
/// three different batches, so the held-out losses of one eval are not all equal.
#[test]
fn deflated_npz_with_its_own_held_out_batches_trains_as_stored() {
    let run = |file: &str| {
        let text = format!("import nn\nmesh m(data: 2)\nmodel C {{\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] {{ a(x) }}\n}}\ntrain C on m {{ data: arrays(path: \"tests/ui/data/{file}\"), batch: 4, steps: 4, optimizer: sgd(lr: 0.5), eval: {{ every: 2, steps: 3 }} }}\n");
        let (prog, cfg, src) = setup_text("held3.shard", &text, &[], None);
        let mut evals = Vec::new();
        let losses = train::run(&prog, &cfg, &src, false, &mut |r| evals.push(r.eval_loss))
            .expect("run")
            .losses;
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        (
            bits(&losses),
            bits(&evals.into_iter().flatten().collect::<Vec<_>>()),
        )
    };
    let stored = run("cls_held3.npz");
    assert_eq!(stored.1.len(), 2, "two evals");
    assert_eq!(run("cls_held3_deflated.npz"), stored);
    // One held-out batch repeated three times would give the loss of that batch.
    let one = {
        let text = "import nn\nmesh m(data: 2)\nmodel C {\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { a(x) }\n}\ntrain C on m { data: arrays(path: \"tests/ui/data/cls_held3.npz\"), batch: 4, steps: 4, optimizer: sgd(lr: 0.5), eval: { every: 2, steps: 1 } }\n";
        let (prog, cfg, src) = setup_text("held1.shard", text, &[], None);
        let mut evals = Vec::new();
        train::run(&prog, &cfg, &src, false, &mut |r| evals.push(r.eval_loss)).expect("run");
        evals.into_iter().flatten().next().expect("eval")
    };
    assert_ne!(
        one.to_bits(),
        stored.1[0],
        "the three held-out batches differ"
    );
}

/// `data: arrays(...)` trains on exactly the file's batches: five batches of
/// `[5, 4, 6]` / `[5, 4]` (step `s` takes batch `s mod 5`), checked against plain
/// SGD on a softmax classifier computed here from the fixture's own formulas.
#[test]
fn array_data_trains_on_exactly_those_batches() {
    let text = "import nn\nmesh m(data: 2)\nmodel C {\n  a = Dense(6 -> 3)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 3] { a(x) }\n}\ntrain C on m { data: arrays(path: \"tests/ui/data/cls_steps.safetensors\"), batch: 4, steps: 7, optimizer: sgd(lr: 0.5) }\n";
    let (prog, mut cfg, src) = setup_text("arrays.shard", text, &[], None);
    cfg.dtype = candle_core::DType::F64;
    let losses = train::run(&prog, &cfg, &src, false, &mut |_| {})
        .expect("run")
        .losses;
    // tests/ui/data/make.py: x[i] = ((7i mod 11) - 5) / 4 as f32, y[i] = i mod 3.
    let x: Vec<f64> = (0..120)
        .map(|i| (((i * 7) % 11) as f64 - 5.0) * 0.25)
        .collect();
    let y: Vec<usize> = (0..20).map(|i| i % 3).collect();
    let init = global_params(&prog, &cfg);
    let get = |n: &str| init.iter().find(|p| p.0 == n).expect(n).1.clone();
    let (mut w, mut b) = (get("a.w"), get("a.b"));
    for (s, got) in losses.iter().enumerate() {
        let k = s % 5;
        let (mut gw, mut gb, mut loss) = (vec![0.0; 18], [0.0; 3], 0.0);
        for r in 0..4 {
            let xr = &x[(k * 4 + r) * 6..(k * 4 + r + 1) * 6];
            let z: Vec<f64> = (0..3)
                .map(|c| b[c] + (0..6).map(|i| xr[i] * w[i * 3 + c]).sum::<f64>())
                .collect();
            let m = z.iter().cloned().fold(f64::MIN, f64::max);
            let e: f64 = z.iter().map(|v| (v - m).exp()).sum();
            let label = y[k * 4 + r];
            loss += (e.ln() + m - z[label]) / 4.0;
            for c in 0..3 {
                let g = ((z[c] - m).exp() / e - f64::from(u8::from(c == label))) / 4.0;
                gb[c] += g;
                for i in 0..6 {
                    gw[i * 3 + c] += xr[i] * g;
                }
            }
        }
        assert!(
            ((got - loss) / loss).abs() < 1e-10,
            "step {s}: {got} vs {loss}"
        );
        w.iter_mut().zip(&gw).for_each(|(w, g)| *w -= 0.5 * g);
        b.iter_mut().zip(&gb).for_each(|(b, g)| *b -= 0.5 * g);
    }
    assert_eq!(losses.len(), 7);
}

fn table_model(extra_table: &str, extra_train: &str) -> String {
    format!("mesh m(dp: 2) {{ sparsecores: 2 }}\ntable t {{ vocab: 64, dim: 4, init: normal(1.0), combiner: sum, optimizer: adamw(lr: 0.1, weight_decay: 0.1), shard: rows(dp){extra_table} }}\nfeature f: i32[B * 3, 1] -> t\nimport nn\nmodel M {{\n  d = Dense(12 -> 5)\n  fn forward(ids: i32[B@dp, 3]) -> f32[B@dp, 5] {{\n    d(tanh(reshape(lookup(f, ids), [B@dp, 12])))\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 5, vocab: 8), batch: 8, steps: 3, optimizer: adam(lr: 0.1){extra_train} }}\n")
}

/// A table's optimizer updates only the rows looked up (ids below 8 here): every
/// other row keeps its initial value, as SparseCore's sparse updates do. AdamW
/// takes the masked composed step; SGD and Adagrad the fused one (a zero gradient
/// leaves their rows still).
#[test]
fn a_table_updates_only_the_rows_it_looked_up() {
    for opt in [
        "adamw(lr: 0.1, weight_decay: 0.1)",
        "adagrad(lr: 0.1)",
        "sgd(lr: 0.1)",
    ] {
        let dir = std::env::temp_dir().join(format!("shardc-rows-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let text = table_model(
            "",
            &format!(", checkpoint: {{ every: 3, dir: \"{}\" }}", dir.display()),
        )
        .replace("adamw(lr: 0.1, weight_decay: 0.1)", opt);
        let (prog, cfg, src) = setup_text("rows.shard", &text, &[], None);
        train::run(&prog, &cfg, &src, false, &mut |_| {}).expect("run");
        let init = global_params(&prog, &cfg);
        let before = &init.iter().find(|p| p.0 == "tables.t").expect("table").1;
        let (_, arrays) =
            shardc::runtime::checkpoint::load(&dir.join("step-00000003")).expect("ckpt");
        let after = &arrays
            .iter()
            .find(|a| a.0 == "param/tables.t")
            .expect("saved")
            .2;
        let same =
            |row: usize| (0..4).all(|c| before[row * 4 + c] as f32 == after[row * 4 + c] as f32);
        assert!(
            (8..64).all(same),
            "{opt}: rows never looked up are untouched"
        );
        assert!(
            (0..8).filter(|r| !same(*r)).count() >= 4,
            "{opt}: looked-up rows moved"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// `overflow: drop` trains with the excess ids dropped and says so; `error` stops
/// with the table, device, partition and counts, and names the other policies.
#[test]
fn overflow_policies_drop_grow_and_error() {
    let limit = ", max_ids_per_partition: 2, max_unique_ids_per_partition: 2";
    let run = |policy: &str| {
        let text = table_model(&format!("{limit}, overflow: {policy}"), "");
        let (prog, cfg, src) = setup_text("overflow.shard", &text, &[], None);
        let mut notes = Vec::new();
        let r = train::run(&prog, &cfg, &src, false, &mut |s| {
            notes.extend(s.notes.clone())
        });
        (r.map(|o| o.losses), notes)
    };
    let (dropped, notes) = run("drop");
    let dropped = dropped.expect("drop trains");
    assert!(notes.iter().any(|n| n.contains("dropped")), "{notes:?}");
    let (grown, notes) = run("grow");
    let grown = grown.expect("grow trains");
    assert!(notes.iter().any(|n| n.contains("raised")), "{notes:?}");
    assert_ne!(dropped, grown, "dropped ids change the lookup");
    let (err, _) = run("error");
    let err = err.expect_err("error stops");
    assert!(
        err.message().contains("table `t`")
            && err.message().contains("partition")
            && err.message().contains("overflow: grow"),
        "{err}"
    );
    assert_eq!(err.table.as_deref(), Some("t"));
}

/// Issue 19 point 2: with ids dropped (`overflow: drop`), mean and sqrtn keep
/// the whole sample's normaliser, as jax-tpu-embedding does: three ids a sample,
/// all weights 1, so mean is the kept ids' sum / 3 and sqrtn their sum / √3
/// (renormalising over the kept ids would divide by fewer). Same losses for
/// several steps (same gradients too, under SGD), with ids really dropped.
#[test]
fn dropped_ids_keep_the_whole_samples_normaliser() {
    let run = |combiner: &str, scale: &str| {
        let text = format!("mesh m(dp: 2) {{ sparsecores: 2 }}\ntable t {{ vocab: 64, dim: 4, init: normal(1.0), combiner: {combiner}, optimizer: sgd(lr: 0.5), shard: rows(dp), max_ids_per_partition: 2, max_unique_ids_per_partition: 2, overflow: drop }}\nfeature f: i32[B, 3] -> t\nmodel M {{\n  w: f32[4, 5] init normal(0.5)\n  fn forward(ids: i32[B@dp, 3]) -> f32[B@dp, 5] {{\n    tanh(lookup(f, ids) {scale}) @ w\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 5, vocab: 16), batch: 8, steps: 4, optimizer: sgd(lr: 0.5) }}\n");
        let (prog, mut cfg, src) = setup_text("normaliser.shard", &text, &[], None);
        cfg.dtype = candle_core::DType::F64;
        let mut notes = Vec::new();
        let out = train::run(&prog, &cfg, &src, false, &mut |s| {
            notes.extend(s.notes.clone())
        })
        .expect("trains");
        (out.losses, notes)
    };
    let (sum3, notes) = run("sum", "/ 3.0");
    assert!(notes.iter().any(|n| n.contains("dropped")), "{notes:?}");
    let (mean, _) = run("mean", "");
    let (sumr3, _) = run("sum", "/ 1.7320508075688772");
    let (sqrtn, _) = run("sqrtn", "");
    assert_eq!(mean.len(), 4);
    for (got, want) in [(&mean, &sum3), (&sqrtn, &sumr3)] {
        for (s, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() < 1e-12, "step {s}: {g} vs {w}");
        }
    }
}

/// A table's FTRL step against TensorFlow's FTRL-proximal formulas, by hand from
/// the step's gradient (lr 0.5, l1 0.01, l2 0.1, accumulator starting at 0.1).
#[test]
fn ftrl_table_step_matches_the_formula() {
    let dir = std::env::temp_dir().join(format!("shardc-ftrl-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!("mesh m(dp: 2) {{ sparsecores: 2 }}\ntable t {{ vocab: 16, dim: 4, init: normal(1.0), combiner: sum, optimizer: ftrl(lr: 0.5, l1: 0.01, l2: 0.1), shard: rows(dp) }}\nfeature f: i32[B * 3, 1] -> t\nimport nn\nmodel M {{\n  d = Dense(12 -> 5)\n  fn forward(ids: i32[B@dp, 3]) -> f32[B@dp, 5] {{\n    d(tanh(reshape(lookup(f, ids), [B@dp, 12])))\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 5, vocab: 16), batch: 4, steps: 1, optimizer: sgd(lr: 0.1), checkpoint: {{ every: 1, dir: \"{}\" }} }}\n", dir.display());
    let (prog, mut cfg, src) = setup_text("ftrl.shard", &text, &[], None);
    cfg.dtype = candle_core::DType::F64;
    let out = train::run(&prog, &cfg, &src, true, &mut |_| {}).expect("run");
    let grads = out.first_grads.expect("grads");
    let g = &grads.iter().find(|p| p.0 == "tables.t").expect("grad").1;
    let init = global_params(&prog, &cfg);
    let w0 = &init.iter().find(|p| p.0 == "tables.t").expect("init").1;
    let (_, arrays) = shardc::runtime::checkpoint::load(&dir.join("step-00000001")).expect("ckpt");
    let w1 = &arrays
        .iter()
        .find(|a| a.0 == "param/tables.t")
        .expect("saved")
        .2;
    let (lr, l1, l2) = (0.5f64, 0.01f64, 0.1f64);
    let mut moved = 0;
    for k in 0..w0.len() {
        let row_touched = (0..4).any(|c| g[k / 4 * 4 + c] != 0.0);
        let want = if row_touched {
            let acc = 0.1 + g[k] * g[k];
            let sigma = (acc.sqrt() - 0.1f64.sqrt()) / lr;
            let lin = g[k] - sigma * w0[k];
            let quad = acc.sqrt() / lr + 2.0 * l2;
            moved += 1;
            if lin.abs() > l1 {
                (l1 * lin.signum() - lin) / quad
            } else {
                0.0
            }
        } else {
            w0[k]
        };
        assert!(
            (w1[k] - want).abs() < 1e-9,
            "element {k}: {} vs {want}",
            w1[k]
        );
    }
    assert!(moved > 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Per-id weights through every combiner (sum, mean Σw·r/Σw, sqrtn Σw·r/√Σw²):
/// gradients reach the table and the weights' own parameters, also with ids
/// dropped (a dropped id's weight still moves the normaliser).
#[test]
fn finite_differences_weighted_lookup_combiners() {
    let drop = ", max_ids_per_partition: 1, max_unique_ids_per_partition: 1, overflow: drop";
    for (combiner, limits) in [
        ("sum", ""),
        ("mean", ""),
        ("sqrtn", ""),
        ("mean", drop),
        ("sqrtn", drop),
    ] {
        let text = format!("mesh m(dp: 2) {{ sparsecores: 2 }}\ntable t {{ vocab: 16, dim: 4, init: normal(1.0), combiner: {combiner}, optimizer: sgd(lr: 0.1), shard: rows(dp){limits} }}\nfeature f: i32[B, 3] -> t\nmodel M {{\n  u: f32[6, 3] init normal(0.5)\n  w: f32[4, 5] init normal(0.5)\n  fn forward(ids: i32[B@dp, 3], x: f32[B@dp, 6]) -> f32[B@dp, 5] {{\n    tanh(lookup(f, ids, sigmoid(x @ u) + 0.5)) @ w\n  }}\n}}\ntrain M on m {{ data: synthetic(classes: 5, vocab: 16), batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }}\n");
        finite_differences(
            &format!("fd_weighted_{combiner}_{}.shard", limits.len()),
            &text,
            &[],
        );
    }
}

/// Seed 000 with the reference's own settings (limits 64, FDO every 15 steps with
/// no headroom) dies where the reference library would abort: FDO lowers the limit
/// to what the first 15 steps needed, and a later step needs more. `grow` carries
/// it through all 100 steps, logging the raise.
#[test]
fn seed_000_survives_where_the_reference_dies() {
    let dir = std::env::temp_dir().join(format!("shardc-seed000-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/shakespeare.shard"),
    )
    .expect("model")
    .replace(
        "fdo: { every: 15, dir: \"fdo\", headroom: 1.2 }",
        &format!("fdo: {{ every: 15, dir: \"{}\" }}", dir.display()),
    );
    let run = |policy: &str| {
        let t = text.replace("overflow: grow", &format!("overflow: {policy}"));
        let (prog, cfg, src) = setup_text("seed000.shard", &t, &[], None);
        let mut notes = Vec::new();
        let r = train::run(&prog, &cfg, &src, false, &mut |s| {
            notes.extend(s.notes.clone())
        });
        (r.map(|o| o.losses.len()), notes)
    };
    let (err, _) = run("error");
    let err = err.expect_err("the reference's settings abort");
    assert!(err.message().contains("set by FDO after step 15"), "{err}");
    assert_eq!(err.step, Some(22));
    let (done, notes) = run("grow");
    assert_eq!(done.expect("grow trains"), 100);
    assert!(
        notes
            .iter()
            .any(|n| n.contains("raised `max_ids_per_partition`")),
        "{notes:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Large parameters are stepped by the optimizer in row blocks (to bound its
/// temporaries): a replicated 2048 × 2050 weight (stepped in blocks) trains like
/// the same weight stored split over `data` by FSDP (each half stepped whole).
#[test]
fn blockwise_optimizer_steps_match_whole_ones() {
    let model = |fsdp: &str| {
        format!("mesh m(data: 2)\nmodel M {{\n  {fsdp}\n  w: f32[2048, 2050] init normal(0.02)\n  fn forward(x: f32[B@data, 2048]) -> f32[B@data, 2050] {{ reduce(x @ w) }}\n}}\ntrain M on m {{ data: synthetic(classes: 2050), batch: 4, steps: 3, optimizer: adamw(lr: 0.01, weight_decay: 0.1) }}\n")
    };
    let losses = |text: &str| {
        let (prog, mut cfg, src) = setup_text("blocks.shard", text, &[], None);
        cfg.dtype = candle_core::DType::F64;
        train::run(&prog, &cfg, &src, false, &mut |_| {})
            .expect("run")
            .losses
    };
    let blocked = losses(&model(""));
    let whole = losses(&model("shard_params(data, min_size: 16)"));
    assert!(
        max_rel(&blocked, &whole) < 1e-10,
        "{blocked:?} vs {whole:?}"
    );
    assert!(blocked[2] < blocked[0], "it trains");
}

/// `loss: mse` with the output split over `mp`, and replicated over it: its
/// gradients against finite differences in f64, and a sharded run against one
/// device (gradients per tensor, first 10 losses).
#[test]
fn mse_loss_finite_differences_and_sharded_against_one_device() {
    let text = format!(
        "{FD_MESH}model M {{\n  w: f32[6, 8@mp] init normal(0.5)\n  v: f32[8@mp, 4] init normal(0.5)\n  u: f32[4, 6@mp] init normal(0.5)\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 6@mp] {{\n    tanh(psum(tanh(x @ w) @ v, mp)) @ u\n  }}\n}}\ntrain M on m {{ data: synthetic(), batch: 4, steps: 1, loss: mse, optimizer: sgd(lr: 0.1) }}\n"
    );
    finite_differences("mse.shard", &text, &[]);
    compare_text("mse.shard", &text, &[], &[("dp", 1), ("mp", 1)], None);
    // The output replicated over `mp`: each copy's cotangent is an addend.
    let text = format!(
        "{FD_MESH}model M {{
  w: f32[6, 8@mp] init normal(0.5)
  v: f32[8@mp, 4] init normal(0.5)
  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 4] {{
    tanh(psum(tanh(x @ w) @ v, mp))
  }}
}}
train M on m {{ data: synthetic(), batch: 4, steps: 1, loss: mse, optimizer: sgd(lr: 0.1) }}
"
    );
    finite_differences("mse_replicated.shard", &text, &[]);
    compare_text(
        "mse_replicated.shard",
        &text,
        &[],
        &[("dp", 1), ("mp", 1)],
        None,
    );
}

/// Regression on array data: the losses are the mean squared error of a
/// hand-computed linear model trained by SGD on exactly those batches.
#[test]
fn mse_on_array_data_matches_a_hand_computed_regression() {
    let text = "import nn\nmesh m(data: 2)\nmodel R {\n  a = Dense(6 -> 2)\n  fn forward(x: f32[B@data, 6]) -> f32[B@data, 2] { a(x) }\n}\ntrain R on m { data: arrays(path: \"tests/ui/data/reg_steps.npz\"), batch: 4, steps: 5, loss: mse, optimizer: sgd(lr: 0.1) }\n";
    let (prog, mut cfg, src) = setup_text("reg.shard", text, &[], None);
    cfg.dtype = candle_core::DType::F64;
    let losses = train::run(&prog, &cfg, &src, false, &mut |_| {})
        .expect("run")
        .losses;
    // tests/ui/data/make.py: x[i] = ((7i mod 11) - 5) / 4, y[i] = ((7i mod 11) - 5) / 10,
    // as f64, in 3 batches of 4 rows.
    let v = |i: usize, s: f64| (((i * 7) % 11) as f64 - 5.0) * s;
    let init = global_params(&prog, &cfg);
    let get = |n: &str| init.iter().find(|p| p.0 == n).expect(n).1.clone();
    let (mut w, mut b) = (get("a.w"), get("a.b"));
    for (s, got) in losses.iter().enumerate() {
        let k = s % 3;
        let (mut gw, mut gb, mut loss) = (vec![0.0; 12], [0.0; 2], 0.0);
        for r in 0..4 {
            let row = k * 4 + r;
            for c in 0..2 {
                let z = b[c]
                    + (0..6)
                        .map(|i| v(row * 6 + i, 0.25) * w[i * 2 + c])
                        .sum::<f64>();
                let d = z - v(row * 2 + c, 0.1);
                loss += d * d / 8.0;
                gb[c] += 2.0 * d / 8.0;
                for i in 0..6 {
                    gw[i * 2 + c] += v(row * 6 + i, 0.25) * 2.0 * d / 8.0;
                }
            }
        }
        assert!(
            ((got - loss) / loss).abs() < 1e-10,
            "step {s}: {got} vs {loss}"
        );
        w.iter_mut().zip(&gw).for_each(|(w, g)| *w -= 0.1 * g);
        b.iter_mut().zip(&gb).for_each(|(b, g)| *b -= 0.1 * g);
    }
    assert_eq!(losses.len(), 5);
}
