//! Weight tying by path: `embed.w` in a model's forward is the very parameter
//! the `embed` sublayer holds (one parameter, its gradient the sum over both
//! uses), sharded runs equal one device, and gradients match finite
//! differences.

mod numerics;

use numerics::*;

const TIED: &str = "import nn
mesh m(dp: 2, tp: 2)
model Tied {
  embed = Embed(16@tp, 6)
  norm = RMSNorm(6)
  fn forward(ids: i32[B@dp, 4]) -> f32[B@dp, 4, 16@tp] {
    einsum(\"btd,vd->btv\", norm(embed(ids)), embed.w)
  }
}
train Tied on m {
  data: shakespeare_words(vocab: 16, seq: 4)
  batch: 4, steps: 10
  loss: softmax_cross_entropy
  optimizer: adam(lr: 0.01)
}
";

#[test]
fn a_tied_weight_is_one_parameter() {
    let (prog, _, _) = setup_text("tied.shard", TIED, &[], None);
    let names: Vec<&str> = prog.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["embed.w", "norm.scale"]);
    // Used twice: by the lookup and by the head.
    let uses = prog
        .nodes
        .iter()
        .filter(|n| {
            n.args
                .iter()
                .any(|a| matches!(prog.nodes[*a as usize].op, shardc::spmd::Op::Param(0)))
        })
        .count();
    assert!(uses >= 2, "embed.w is read {uses} time(s)");
}

#[test]
fn tied_weights_train_the_same_on_a_mesh_and_match_finite_differences() {
    compare_text(
        "tied.shard",
        TIED,
        &[("dp", 2), ("tp", 2)],
        &[("dp", 1), ("tp", 1)],
        None,
    );
    finite_differences("tied.shard", TIED, &[("dp", 2), ("tp", 2)]);
}
