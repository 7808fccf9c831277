//! `textDocument/semanticTokens/range` over stdio: advertised in the
//! capabilities, and the answer for a range is exactly the whole file's
//! tokens that overlap it (the first one positioned from the file's start,
//! as the protocol's relative encoding says), for ranges that cut through a
//! token, hold none, or lie past the end.

#[path = "common/lsp.rs"]
mod lsp;

use lsp::{scratch, uri, Server};
use serde_json::{json, Value};

const GPT: &str = "import nn\n\nmesh pod(dp: 4, mp: 2)\n\nconst D = 64 // width\n\n// A block.\nlayer Block(D) {\n  up = Dense(D -> 4 * D@mp)\n  w: f32[D, D] init normal(0.02)\n\n  fn forward(x: f32[B@dp, D]) -> f32[B@dp, D] {\n    let h = up(x)\n    let g = gelu(h)\n    x + psum(g @ w, mp)\n  }\n}\n\nmodel M {\n  b = Block(D)\n  fn forward(x: f32[B@dp, D]) -> f32[B@dp, D] {\n    b(x)\n  }\n}\n";

/// Tokens as (line, start, length, type, modifiers), positions absolute.
fn decode(result: &Value) -> Vec<[u64; 5]> {
    let data: Vec<u64> = result["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|v| v.as_u64().expect("a number"))
        .collect();
    assert_eq!(data.len() % 5, 0, "{result}");
    let (mut line, mut col) = (0, 0);
    data.chunks(5)
        .map(|t| {
            if t[0] > 0 {
                col = 0;
            }
            line += t[0];
            col += t[1];
            [line, col, t[2], t[3], t[4]]
        })
        .collect()
}

/// Whether a token overlaps a range of (line, character) pairs.
fn overlaps(t: &[u64; 5], start: (u64, u64), end: (u64, u64)) -> bool {
    let (s, e) = ((t[0], t[1]), (t[0], t[1] + t[2]));
    if start == end {
        return s <= start && start <= e;
    }
    s < end && e > start
}

#[test]
fn range_tokens_are_the_full_tokens_that_overlap_the_range() {
    let dir = scratch("lsp-tokens", "range");
    let file = dir.join("gpt.shard");
    std::fs::write(&file, GPT).expect("write");
    let u = uri(&file);
    let mut s = Server::start();
    let init = s.initialize(json!({}));
    let provider = &init["capabilities"]["semanticTokensProvider"];
    assert_eq!(provider["range"], true, "{init}");
    assert_eq!(provider["full"], true, "{init}");
    s.open(&u, GPT);
    let _ = s.diags(&u);
    let full = decode(&s.request(
        "textDocument/semanticTokens/full",
        json!({"textDocument": {"uri": u}}),
    ));
    assert!(full.len() > 20, "{full:?}");
    // `up = Dense(` starts at line 8; `up` is a token at (8, 2..4). Ranges:
    // the block's body, one starting inside `up`, an empty one inside `w`,
    // lines with no names, the whole file, and one past the end.
    for (start, end) in [
        ((8, 0), (17, 0)),
        ((8, 3), (9, 4)),
        ((9, 2), (9, 2)),
        ((0, 0), (1, 0)),
        ((0, 0), (99, 0)),
        ((40, 0), (50, 0)),
        ((12, 10), (12, 11)),
    ] {
        let r = s.request(
            "textDocument/semanticTokens/range",
            json!({"textDocument": {"uri": u}, "range": {
                "start": {"line": start.0, "character": start.1},
                "end": {"line": end.0, "character": end.1},
            }}),
        );
        let got = decode(&r);
        let want: Vec<[u64; 5]> = full
            .iter()
            .filter(|t| overlaps(t, start, end))
            .copied()
            .collect();
        assert_eq!(got, want, "range {start:?}..{end:?}: {r}");
    }
    // A document that is not open: nothing.
    let none = s.request(
        "textDocument/semanticTokens/range",
        json!({"textDocument": {"uri": "file:///nowhere/x.shard"}, "range": {
            "start": {"line": 0, "character": 0}, "end": {"line": 1, "character": 0}}}),
    );
    assert_eq!(none, Value::Null);
    s.finish();
}
