//! Lowering: every seed model becomes an SPMD program that verifies, with one
//! parameter per layer path and the collectives the types call for.

use shardc::spmd::Op;
use shardc::world::{self, Options};
use std::path::Path;

fn programs(file: &str) -> Vec<shardc::spmd::Program> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let c = world::compile(&p, &Options::default()).expect("readable");
    assert!(!c.has_errors(), "{file} has errors");
    c.programs
}

#[test]
fn seed_models_lower_and_verify() {
    for m in [
        "models/shakespeare.shard",
        "models/gptj.shard",
        "models/fsdp_mlp.shard",
        "models/transformer_3d.shard",
        "examples/gpt3_175b.shard",
    ] {
        let ps = programs(m);
        assert!(!ps.is_empty(), "{m} lowered to nothing");
        for p in ps {
            assert_eq!(p.verify(), Vec::<String>::new(), "{m}");
            assert!(p.output.is_some(), "{m} has no output");
        }
    }
}

#[test]
fn repeated_blocks_get_their_own_parameters() {
    let p = &programs("models/gptj.shard")[0];
    let names: Vec<&str> = p.params.iter().map(|p| p.name.as_str()).collect();
    assert!(
        names.contains(&"blocks.0.wq") && names.contains(&"blocks.1.wq"),
        "{names:?}"
    );
    assert!(
        names.contains(&"embed.w") && names.contains(&"head.w"),
        "{names:?}"
    );
    // One all-reduce per block (psum over mp) plus the embedding's.
    let psums = p
        .nodes
        .iter()
        .filter(|n| matches!(&n.op, Op::Prim(p) if p.get().name() == "psum" && p.get().attrs() == ["mp"]))
        .count();
    assert_eq!(psums, 2);
}

#[test]
fn fsdp_gathers_each_sharded_weight_before_use() {
    let ps = programs("models/fsdp_mlp.shard");
    let gathers = |p: &shardc::spmd::Program| {
        p.nodes
            .iter()
            .filter(|n| matches!(&n.op, Op::Prim(p) if p.get().name() == "all_gather"))
            .count()
    };
    assert_eq!(gathers(&ps[0]), 0, "plain data parallel gathers nothing");
    assert_eq!(
        gathers(&ps[1]),
        3,
        "three of four FSDP weights exceed min_size and are split"
    );
}

#[test]
fn annotated_layout_change_becomes_a_reshard() {
    let p = &programs("models/transformer_3d.shard")[0];
    assert!(
        p.nodes.iter().any(|n| n.op.is_reshard()),
        "the sequence-parallel input is gathered"
    );
}

/// Regression (found by the fuzz test): a huge repeat count once made lowering
/// unroll forever. It is checked and planned, but not lowered.
#[test]
fn huge_repeat_is_not_unrolled() {
    let text = "import nn\nmesh pod(dp: 2)\nmodel M {\n  blocks = repeat(9223372036854775807, LayerNorm(8))\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 8] { blocks(x) }\n}\ntrain M on pod { batch: 4, steps: 1, optimizer: sgd(lr: 0.1) }\n";
    let c = world::compile_source(
        Path::new("huge.shard"),
        text.to_string(),
        &Options::default(),
    );
    assert!(!c.has_errors());
    assert!(c.programs.is_empty());
    assert_eq!(c.plans.len(), 1);
}

#[test]
fn backward_visits_only_what_reaches_a_parameter() {
    let p = &programs("models/fsdp_mlp.shard")[0];
    let live = p.on_gradient_path(false);
    assert_eq!(live.len(), p.nodes.len());
    for (i, n) in p.nodes.iter().enumerate() {
        let expect = match &n.op {
            Op::Param(_) => true,
            Op::Input(_) | Op::Targets | Op::Weights => false,
            Op::Prim(_) => n.args.iter().any(|a| live[*a as usize]),
        };
        assert_eq!(live[i], expect, "node {i}");
    }
    // The first layer reads the data (not on the path) and a weight (on it).
    let first = p
        .nodes
        .iter()
        .position(|n| {
            matches!(&n.op, Op::Prim(q) if q.get().name() == "@")
                && n.args
                    .iter()
                    .any(|a| matches!(p.nodes[*a as usize].op, Op::Input(_)))
        })
        .expect("a matmul of the input");
    assert!(live[first]);
    let x = p.nodes[first].args[0] as usize;
    assert!(!live[x], "the data needs no cotangent");
    // A loss function is inlined after the model (`step::attach`), and
    // backward starts at its result: tests/loss_fn.rs trains through it.
}
