//! Weight tying by path in the editor: on `embed.w` (and `lm.embed.w`),
//! go-to-definition lands on the weight's declaration in the sublayer's layer,
//! whether that layer is declared before or after the model using it.

#[path = "common/lsp.rs"]
mod lsp;

use lsp::{scratch, uri, Server};
use serde_json::json;

const TIED: &str = "mesh m(dp: 2)\n\nmodel Tied {\n  lm = LM()\n  fn forward(ids: i32[B@dp, 8]) -> f32[B@dp, 8, 64] {\n    einsum(\"btd,vd->btv\", lm(ids), lm.embed.w)\n  }\n}\n\nlayer LM {\n  embed = Table()\n  fn forward(ids: i32[B, 8]) -> f32[B, 8, 16] { embed(ids) }\n}\n\nlayer Table {\n  w: f32[64, 16] init normal(0.02)\n  fn forward(ids: i32[B, 8]) -> f32[B, 8, 16] { embed(w, ids) }\n}\n";

#[test]
fn definition_of_a_member_path_is_the_sublayers_weight() {
    let dir = scratch("lsp-members", "tied");
    let file = dir.join("tied.shard");
    std::fs::write(&file, TIED).expect("write");
    let u = uri(&file);
    let mut s = Server::start();
    s.initialize(json!({}));
    s.open(&u, TIED);
    let _ = s.diags(&u);
    let line = 5; // `einsum(..., lm.embed.w)`
    let col = TIED
        .lines()
        .nth(line)
        .and_then(|l| l.find("lm.embed.w"))
        .expect("the path") as u64;
    let mut at = |c: u64| {
        s.request(
            "textDocument/definition",
            json!({"textDocument": {"uri": u}, "position": {"line": line, "character": c}}),
        )
    };
    // `w` → `  w: f32[64, 16] ...` (line 15); `embed` → line 10; `lm` → line 3.
    for (c, want) in [(col + 9, 15), (col + 4, 10), (col, 3)] {
        let r = at(c);
        let got = r["range"]["start"]["line"]
            .as_u64()
            .or_else(|| r[0]["range"]["start"]["line"].as_u64());
        assert_eq!(got, Some(want), "definition at column {c}: {r}");
    }
}
