//! The editor and the language's newer forms: `loss:` completes the trained
//! model's functions beside the built-in losses, and each name of
//! `let (a, b) = split(...)` is a definition that its uses go to.

#[path = "common/lsp.rs"]
mod lsp;

use lsp::{pos, scratch, uri, Server};
use serde_json::json;

const TEXT: &str = "mesh m(dp: 2)\n\nmodel Reg {\n  w: f32[6, 4] init normal(0.1)\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 2] {\n    let (a, b) = split(x @ w, 2, dim: 1)\n    a * b\n  }\n  fn l1(z: f32[B@dp, 2], y: f32[B@dp, 2]) -> f32[] { mean(abs(z - y)) }\n}\n\ntrain Reg on m {\n  batch: 8, steps: 2\n  loss: l1\n  optimizer: sgd(lr: 0.1)\n}\n";

#[test]
fn loss_completes_model_functions_and_tuple_names_are_definitions() {
    let dir = scratch("lsp-loss-fn", "reg");
    let file = dir.join("reg.shard");
    std::fs::write(&file, TEXT).expect("write");
    let u = uri(&file);
    let mut s = Server::start();
    s.initialize(json!({}));
    s.open(&u, TEXT);
    let diags = s.diags(&u);
    assert!(
        diags.iter().all(|d| d["severity"] != 1),
        "no errors: {diags:?}"
    );
    let c = s.request(
        "textDocument/completion",
        json!({"textDocument": {"uri": u}, "position": pos(TEXT, "l1\n", 0)}),
    );
    let labels: Vec<&str> = c
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["label"].as_str())
        .collect();
    assert!(labels.contains(&"l1"), "{c}");
    assert!(labels.contains(&"softmax_cross_entropy"), "{c}");
    assert!(!labels.contains(&"forward"), "{c}");
    // `b` in `a * b` goes to its name in `let (a, b)` (line 5).
    let r = s.request(
        "textDocument/definition",
        json!({"textDocument": {"uri": u}, "position": pos(TEXT, "b\n  }", 0)}),
    );
    let start = if r["range"].is_null() {
        &r[0]["range"]["start"]
    } else {
        &r["range"]["start"]
    };
    assert_eq!(start["line"], 5, "{r}");
    assert_eq!(start["character"], 12, "{r}");
}
