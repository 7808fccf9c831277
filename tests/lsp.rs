//! `shardc lsp` end to end over stdio: open a file with an error, receive its
//! diagnostics, hover a binding for its type, format, shut down.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

fn send(w: &mut impl Write, v: serde_json::Value) {
    let s = v.to_string();
    write!(w, "Content-Length: {}\r\n\r\n{s}", s.len()).expect("write");
    w.flush().expect("flush");
}

fn recv(r: &mut impl BufRead) -> serde_json::Value {
    let mut len = 0usize;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).expect("header");
        let line = line.trim();
        if line.is_empty() {
            break;
        }
        if let Some(n) = line.strip_prefix("Content-Length: ") {
            len = n.parse().expect("length");
        }
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf).expect("body");
    serde_json::from_slice(&buf).expect("json")
}

#[test]
fn diagnostics_and_hover() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardc"))
        .arg("lsp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut w = child.stdin.take().expect("stdin");
    let mut r = BufReader::new(child.stdout.take().expect("stdout"));
    send(
        &mut w,
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}),
    );
    let init = recv(&mut r);
    assert_eq!(init["result"]["capabilities"]["hoverProvider"], true);
    assert_eq!(
        init["result"]["capabilities"]["documentFormattingProvider"],
        true
    );
    send(
        &mut w,
        serde_json::json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}),
    );
    let text = "mesh m(dp: 2)\nmodel M {\n  w: f32[8, 4] init zeros\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 4] {\n    let h = x @ w\n    h\n  }\n}\n";
    let uri = "file:///tmp/shardc-lsp-test.shard";
    send(
        &mut w,
        serde_json::json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "shard", "version": 1, "text": text}}}),
    );
    let diags = recv(&mut r);
    assert_eq!(diags["method"], "textDocument/publishDiagnostics");
    let d = &diags["params"]["diagnostics"][0];
    assert_eq!(d["code"], "E0208", "{diags}");
    assert_eq!(d["range"]["start"]["line"], 4);
    // Fix it, then hover `h`.
    let fixed = text.replace("B@dp, 6", "B@dp, 8");
    send(
        &mut w,
        serde_json::json!({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [{"text": fixed}]}}),
    );
    let diags = recv(&mut r);
    assert_eq!(
        diags["params"]["diagnostics"].as_array().map(|a| a.len()),
        Some(0),
        "{diags}"
    );
    send(
        &mut w,
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "textDocument/hover", "params": {"textDocument": {"uri": uri}, "position": {"line": 4, "character": 8}}}),
    );
    let hover = recv(&mut r);
    let value = hover["result"]["contents"]["value"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(value.contains("h: f32[B@dp, 4]"), "{hover}");
    // ...and where its pieces live: one row per `dp` shard.
    assert!(value.contains("│  dev 0  │\n  ├"), "{hover}");
    assert!(value.contains("│  dev 1  │\n  └"), "{hover}");
    // Formatting: one edit of the whole document, with `shardc fmt`'s output.
    let messy = fixed.replace("  let h = x @ w", "let h=x @ w");
    send(
        &mut w,
        serde_json::json!({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {"textDocument": {"uri": uri, "version": 3}, "contentChanges": [{"text": messy}]}}),
    );
    let _ = recv(&mut r);
    send(
        &mut w,
        serde_json::json!({"jsonrpc": "2.0", "id": 4, "method": "textDocument/formatting", "params": {"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": true}}}),
    );
    let edits = recv(&mut r);
    assert_eq!(edits["id"], 4, "{edits}");
    assert_eq!(edits["result"][0]["newText"], fixed.as_str(), "{edits}");
    assert_eq!(edits["result"][0]["range"]["end"]["line"], 8, "{edits}");
    // A request the server does not handle gets an error, not silence.
    send(
        &mut w,
        serde_json::json!({"jsonrpc": "2.0", "id": 5, "method": "textDocument/definition", "params": {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 0}}}),
    );
    let none = recv(&mut r);
    assert_eq!(none["id"], 5, "{none}");
    assert_eq!(none["error"]["code"], -32601, "{none}");
    send(
        &mut w,
        serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "shutdown"}),
    );
    let _ = recv(&mut r);
    send(
        &mut w,
        serde_json::json!({"jsonrpc": "2.0", "method": "exit"}),
    );
    let status = child.wait().expect("exit");
    assert!(status.success());
}
