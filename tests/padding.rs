//! `embed(w, ids, padding: P)` (the stdlib's `EmbedPad`): PyTorch's
//! `padding_idx`. Row `P` is looked up like any other but gets no gradient,
//! so training never changes it; every other row's gradient is as without
//! padding; a vocabulary-parallel run equals one device.

mod numerics;

use numerics::*;
use shardc::runtime::train;

fn model(layer: &str) -> String {
    format!(
        "import nn
mesh m(dp: 2, tp: 2)
model P {{
  e = {layer}
  norm = RMSNorm(6)
  fn forward(ids: i32[B@dp, 4]) -> f32[B@dp, 4, 16@tp] {{
    einsum(\"btd,vd->btv\", norm(e(ids)), e.w)
  }}
}}
train P on m {{
  data: shakespeare_words(vocab: 16, seq: 4)
  batch: 4, steps: 10
  loss: softmax_cross_entropy
  optimizer: adam(lr: 0.01)
}}
"
    )
}

/// Row `r` of a [16, 6] table.
fn row(v: &[f64], r: usize) -> &[f64] {
    &v[r * 6..(r + 1) * 6]
}

#[test]
fn the_padding_row_gets_no_gradient_and_never_changes() {
    let pad = 0;
    let plain = model("Embed(16@tp, 6)");
    let padded = model(&format!("EmbedPad(16@tp, 6, {pad})"));
    let mesh = [("dp", 2), ("tp", 2)];
    let (g0, _) = grads_and_losses_text("plain.shard", &plain, &mesh, None, 1, true);
    let (g1, _) = grads_and_losses_text("padded.shard", &padded, &mesh, None, 1, true);
    let (w0, w1) = (&g0[0].1, &g1[0].1);
    assert_eq!((g0[0].0.as_str(), g1[0].0.as_str()), ("e.w", "e.w"));
    // The pad id (0, the unknown word) is in the batch: without padding its row has a gradient
    // (from the lookup and from the tied head).
    assert!(row(w0, pad).iter().any(|x| *x != 0.0));
    // With padding the lookup's part is gone; the head's stays (PyTorch's
    // padding_idx stops the embedding's gradient only).
    assert_ne!(row(w0, pad), row(w1, pad));
    for r in (0..16).filter(|r| *r != pad) {
        assert_eq!(row(w0, r), row(w1, r), "row {r}");
    }
    // An untied table: the row never changes.
    let untied = "import nn
mesh m(dp: 2, tp: 2)
model U {
  e = EmbedPad(16@tp, 6, 0)
  head = Dense(6 -> 16@tp)
  fn forward(ids: i32[B@dp, 4]) -> f32[B@dp, 4, 16@tp] { head(e(ids)) }
}
train U on m {
  data: shakespeare_words(vocab: 16, seq: 4)
  batch: 4, steps: 10
  loss: softmax_cross_entropy
  optimizer: adam(lr: 0.01)
}
";
    let (prog, mut cfg, src) = setup_text("untied.shard", untied, &mesh, None);
    let start = global_params(&prog, &cfg);
    cfg.keep_final = true;
    let out = train::run(&prog, &cfg, &src, false, &mut |_| {}).expect("run");
    let last = out.last.expect("final parameters");
    let (before, after) = (&start[0].1, &last[0].1);
    assert_eq!(last[0].0, "e.w");
    // The run holds f32: the initial values as it holds them.
    let held: Vec<f64> = before.iter().map(|x| f64::from(*x as f32)).collect();
    assert_eq!(row(&held, pad), row(after, pad), "the padding row moved");
    assert_ne!(row(before, 2), row(after, 2), "row 2 did not train");
}

#[test]
fn padding_on_a_mesh_equals_one_device() {
    compare_text(
        "padded.shard",
        &model("EmbedPad(16@tp, 6, 0)"),
        &[("dp", 2), ("tp", 2)],
        &[("dp", 1), ("tp", 1)],
        None,
    );
}
