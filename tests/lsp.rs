//! `shardc lsp` end to end over stdio: open a file with an error, receive its
//! diagnostics, hover a binding for its type, format, shut down; and malformed
//! input (a body that is not JSON, a header block without `Content-Length`, a
//! `Content-Length` of 2^62, garbage bytes) is answered or logged and skipped,
//! and the next request is still answered. Every wait has a timeout.
//!
//! Then the editor features, each over stdio: diagnostics across the import
//! graph (an error in an imported file shows in both files, an unsaved edit
//! to an imported buffer changes the importer's, `didClose` clears), UTF-16
//! and UTF-8 positions after a non-BMP character, `--strict`, definition
//! (into the standard library), references and rename across files,
//! completion (exactly the mesh's axes after `@`), signature help, hover,
//! inlay hints, code actions, symbols, semantic tokens and folding.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);

/// A running `shardc lsp`: frames from its stdout arrive on `rx` (read on a
/// thread, so a silent server fails the test instead of hanging it), its
/// stderr is collected; it is killed if the test ends early.
struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Value>,
    stderr: Option<JoinHandle<String>>,
    /// Messages received while waiting for another.
    stash: Vec<Value>,
}

/// One frame of the server's output; `None` at its end.
fn read_frame(r: &mut impl BufRead) -> Option<Value> {
    let mut len = None;
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let line = line.trim();
        if line.is_empty() {
            break;
        }
        if let Some(n) = line.strip_prefix("Content-Length: ") {
            len = Some(n.parse::<usize>().expect("the server's Content-Length"));
        }
    }
    let mut buf = vec![0u8; len.expect("the server sends Content-Length")];
    r.read_exact(&mut buf).ok()?;
    Some(serde_json::from_slice(&buf).expect("the server sends JSON"))
}

impl Server {
    fn start() -> Server {
        Server::start_with(&[])
    }

    fn start_with(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_shardc"))
            .arg("lsp")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let stdin = child.stdin.take();
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            while let Some(v) = read_frame(&mut out) {
                if tx.send(v).is_err() {
                    break;
                }
            }
        });
        let mut err = child.stderr.take().expect("stderr");
        let stderr = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        Server {
            child,
            stdin,
            rx,
            stderr: Some(stderr),
            stash: vec![],
        }
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let w = self.stdin.as_mut().expect("stdin open");
        w.write_all(bytes).expect("write");
        w.flush().expect("flush");
    }

    fn send(&mut self, v: Value) {
        let s = v.to_string();
        self.send_raw(format!("Content-Length: {}\r\n\r\n{s}", s.len()).as_bytes());
    }

    /// The next frame the server sends, within the timeout.
    fn recv(&self) -> Value {
        self.rx
            .recv_timeout(TIMEOUT)
            .expect("an answer from shardc lsp within the timeout")
    }

    fn initialize(&mut self) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}));
        let init = self.recv();
        self.send(json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}));
        init
    }

    /// A hover on a document that is not open: answered with `null`.
    fn hover_nothing(&mut self, id: i64) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": "textDocument/hover", "params": {"textDocument": {"uri": "file:///tmp/shardc-lsp-none.shard"}, "position": {"line": 0, "character": 0}}}));
        let r = self.recv();
        assert_eq!(r["id"], id, "{r}");
        assert_eq!(r["result"], Value::Null, "{r}");
    }

    /// Waits for the process to end (closing its stdin first when `close`):
    /// its exit status and everything it logged.
    fn wait(mut self, close: bool) -> (std::process::ExitStatus, String) {
        if close {
            self.stdin = None;
        }
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            assert!(start.elapsed() < TIMEOUT, "shardc lsp did not exit");
            std::thread::sleep(Duration::from_millis(10));
        };
        let log = self
            .stderr
            .take()
            .map(|h| h.join().expect("stderr reader"))
            .unwrap_or_default();
        (status, log)
    }

    /// `shutdown`, `exit`: the server exits with status 0. Returns its log.
    fn finish(mut self) -> String {
        self.send(json!({"jsonrpc": "2.0", "id": 999, "method": "shutdown"}));
        let r = self.recv();
        assert_eq!(r["id"], 999, "{r}");
        self.send(json!({"jsonrpc": "2.0", "method": "exit"}));
        let (status, log) = self.wait(false);
        assert!(status.success(), "{status}\n{log}");
        log
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn diagnostics_and_hover() {
    let mut s = Server::start();
    let init = s.initialize();
    assert_eq!(init["result"]["capabilities"]["hoverProvider"], true);
    assert_eq!(
        init["result"]["capabilities"]["documentFormattingProvider"],
        true
    );
    let text = "mesh m(dp: 2)\nmodel M {\n  w: f32[8, 4] init zeros\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 4] {\n    let h = x @ w\n    h\n  }\n}\n";
    let uri = "file:///tmp/shardc-lsp-test.shard";
    s.send(json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "shard", "version": 1, "text": text}}}));
    let diags = s.recv();
    assert_eq!(diags["method"], "textDocument/publishDiagnostics");
    let d = &diags["params"]["diagnostics"][0];
    assert_eq!(d["code"], "E0208", "{diags}");
    assert_eq!(d["range"]["start"]["line"], 4);
    // Fix it, then hover `h`.
    let fixed = text.replace("B@dp, 6", "B@dp, 8");
    s.send(json!({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [{"text": fixed}]}}));
    let diags = s.recv();
    assert_eq!(
        diags["params"]["diagnostics"].as_array().map(|a| a.len()),
        Some(0),
        "{diags}"
    );
    s.send(json!({"jsonrpc": "2.0", "id": 2, "method": "textDocument/hover", "params": {"textDocument": {"uri": uri}, "position": {"line": 4, "character": 8}}}));
    let hover = s.recv();
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
    s.send(json!({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {"textDocument": {"uri": uri, "version": 3}, "contentChanges": [{"text": messy}]}}));
    let _ = s.recv();
    s.send(json!({"jsonrpc": "2.0", "id": 4, "method": "textDocument/formatting", "params": {"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": true}}}));
    let edits = s.recv();
    assert_eq!(edits["id"], 4, "{edits}");
    assert_eq!(edits["result"][0]["newText"], fixed.as_str(), "{edits}");
    assert_eq!(edits["result"][0]["range"]["end"]["line"], 8, "{edits}");
    // A request the server does not handle gets an error, not silence.
    s.send(json!({"jsonrpc": "2.0", "id": 5, "method": "textDocument/prepareTypeHierarchy", "params": {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 0}}}));
    let none = s.recv();
    assert_eq!(none["id"], 5, "{none}");
    assert_eq!(none["error"]["code"], -32601, "{none}");
    s.finish();
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
    f.extend_from_slice(body);
    f
}

#[test]
fn invalid_json_gets_a_parse_error_and_the_server_goes_on() {
    let mut s = Server::start();
    s.initialize();
    let uri = "file:///tmp/shardc-lsp-robust.shard";
    let text = "mesh m(dp: 2)\nmodel M {\n  w: f32[8, 4] init zeros\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {\n    let h = x @ w\n    h\n  }\n}\n";
    s.send(json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "shard", "version": 1, "text": text}}}));
    assert_eq!(s.recv()["method"], "textDocument/publishDiagnostics");
    // Not JSON: Parse error, and no id can be read.
    s.send_raw(&frame(br#"{"jsonrpc": "2.0", "id": 7, "method": "#));
    let r = s.recv();
    assert_eq!(r["error"]["code"], -32700, "{r}");
    assert_eq!(r["id"], Value::Null, "{r}");
    // Not UTF-8.
    s.send_raw(&frame(b"{\"jsonrpc\": \"2.0\", \"method\": \"\xff\xfe\"}"));
    assert_eq!(s.recv()["error"]["code"], -32700);
    // JSON, but not a JSON-RPC message: Invalid Request, with the id when there is one.
    s.send_raw(&frame(b"[1, 2]"));
    let r = s.recv();
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(r["id"], Value::Null, "{r}");
    s.send(json!({"jsonrpc": "2.0", "id": 8}));
    let r = s.recv();
    assert_eq!(r["error"]["code"], -32600, "{r}");
    assert_eq!(r["id"], 8, "{r}");
    s.send(json!({"jsonrpc": "2.0", "id": 9, "method": 42}));
    assert_eq!(s.recv()["id"], 9);
    // A request whose params do not fit: Invalid params.
    s.send(json!({"jsonrpc": "2.0", "id": 10, "method": "textDocument/hover", "params": "nope"}));
    let r = s.recv();
    assert_eq!(r["error"]["code"], -32602, "{r}");
    assert_eq!(r["id"], 10, "{r}");
    // The server still answers: a hover and a format on the open document.
    s.send(json!({"jsonrpc": "2.0", "id": 11, "method": "textDocument/hover", "params": {"textDocument": {"uri": uri}, "position": {"line": 4, "character": 8}}}));
    let hover = s.recv();
    assert_eq!(hover["id"], 11, "{hover}");
    let value = hover["result"]["contents"]["value"]
        .as_str()
        .unwrap_or_default();
    assert!(value.contains("h: f32[B@dp, 4]"), "{hover}");
    s.send(json!({"jsonrpc": "2.0", "id": 12, "method": "textDocument/formatting", "params": {"textDocument": {"uri": uri}, "options": {"tabSize": 2, "insertSpaces": true}}}));
    let edits = s.recv();
    assert_eq!(edits["id"], 12, "{edits}");
    assert_eq!(edits["result"], json!([]), "{edits}");
    let log = s.finish();
    assert!(log.contains("Parse error"), "{log}");
}

#[test]
fn a_header_block_without_content_length_is_logged_and_skipped() {
    let mut s = Server::start();
    s.initialize();
    let skipped = json!({"jsonrpc": "2.0", "id": 3, "method": "textDocument/hover", "params": {}})
        .to_string();
    s.send_raw(
        format!("Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n\r\n{skipped}")
            .as_bytes(),
    );
    s.hover_nothing(4);
    // A length that is not a number: skipped too.
    s.send_raw(format!("Content-Length: twelve\r\n\r\n{skipped}").as_bytes());
    s.hover_nothing(5);
    // Header lines ended by a bare `\n` are accepted.
    let hover = json!({"jsonrpc": "2.0", "id": 6, "method": "textDocument/hover", "params": {"textDocument": {"uri": "file:///none.shard"}, "position": {"line": 0, "character": 0}}}).to_string();
    s.send_raw(format!("Content-Length: {}\n\n{hover}", hover.len()).as_bytes());
    assert_eq!(s.recv()["id"], 6);
    let log = s.finish();
    assert!(log.contains("without Content-Length"), "{log}");
    assert!(log.contains("not a length"), "{log}");
}

#[test]
fn a_content_length_of_2_to_the_62_is_refused_without_aborting() {
    let mut s = Server::start();
    s.initialize();
    // The announced body never comes; part of one does.
    s.send_raw(b"Content-Length: 4611686018427387904\r\n\r\n{\"jsonrpc\": \"2.0\", \"id\": 2, \"method\": \"shutdown\"}");
    s.hover_nothing(3);
    // More than 64 bits hold.
    s.send_raw(b"Content-Length: 99999999999999999999999999\r\n\r\n");
    s.hover_nothing(4);
    // Just above the 64 MiB limit, with no body.
    s.send_raw(format!("Content-Length: {}\r\n\r\n", (64 << 20) + 1).as_bytes());
    s.hover_nothing(5);
    let log = s.finish();
    assert!(
        log.contains("refused a body of 4611686018427387904 bytes"),
        "{log}"
    );
}

#[test]
fn garbage_bytes_then_a_valid_request() {
    let mut s = Server::start();
    s.initialize();
    // Pseudo-random bytes (newlines, invalid UTF-8, NULs), then a line far
    // longer than a header line may be, then a request.
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let garbage: Vec<u8> = (0..64 << 10)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect();
    s.send_raw(&garbage);
    s.hover_nothing(2);
    s.send_raw(&vec![b'x'; 200 << 10]);
    s.hover_nothing(3);
    s.send_raw(b"\r\n\r\n\r\n: : :\r\n\r\n");
    s.hover_nothing(4);
    let log = s.finish();
    assert!(log.contains("not a header"), "{log}");
}

#[test]
fn the_session_ends_at_exit_or_at_the_end_of_input() {
    // A request before `initialize` is refused; the end of the input ends the
    // server, with status 0.
    let mut s = Server::start();
    s.send(json!({"jsonrpc": "2.0", "id": 1, "method": "textDocument/hover", "params": {}}));
    let r = s.recv();
    assert_eq!(r["error"]["code"], -32002, "{r}");
    s.initialize();
    let (status, log) = s.wait(true);
    assert!(status.success(), "{status}\n{log}");
    // `exit` without `shutdown`: status 1, as the protocol says.
    let mut s = Server::start();
    s.initialize();
    s.send(json!({"jsonrpc": "2.0", "method": "exit"}));
    let (status, log) = s.wait(false);
    assert_eq!(status.code(), Some(1), "{log}");
}

// ── editor features ──────────────────────────────────────────────────────

/// A fresh directory for a test's files (canonical, so that it is spelled as
/// the server spells it).
fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-lsp-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    std::fs::canonicalize(&d).expect("canonical")
}

fn uri(p: &std::path::Path) -> String {
    format!("file://{}", p.display())
}

/// Line and UTF-16 column of the first `needle` in `text` (plus `skip` characters).
fn pos(text: &str, needle: &str, skip: usize) -> Value {
    let at = text.find(needle).expect("needle in text");
    let line = text[..at].matches('\n').count();
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let col = text[start..at].encode_utf16().count() + skip;
    json!({"line": line, "character": col})
}

impl Server {
    fn open(&mut self, uri: &str, text: &str) {
        self.send(json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "shard", "version": 1, "text": text}}}));
    }

    fn change(&mut self, uri: &str, version: i64, text: &str) {
        self.send(json!({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {"textDocument": {"uri": uri, "version": version}, "contentChanges": [{"text": text}]}}));
    }

    /// The first message (stashed or new) that `want` accepts; others are stashed.
    fn wait_for(&mut self, want: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.stash.iter().position(&want) {
            return self.stash.remove(i);
        }
        loop {
            let v = self.recv();
            if want(&v) {
                return v;
            }
            self.stash.push(v);
        }
    }

    /// The next diagnostics published for `uri`.
    fn diags(&mut self, uri: &str) -> Vec<Value> {
        let v = self.wait_for(|v| {
            v["method"] == "textDocument/publishDiagnostics" && v["params"]["uri"] == uri
        });
        v["params"]["diagnostics"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn request(&mut self, id: i64, method: &str, params: Value) -> Value {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        let r = self.wait_for(|v| v["id"] == id);
        assert!(r.get("error").is_none(), "{method}: {r}");
        r["result"].clone()
    }

    fn at(&mut self, id: i64, method: &str, uri: &str, position: Value) -> Value {
        self.request(
            id,
            method,
            json!({"textDocument": {"uri": uri}, "position": position}),
        )
    }
}

const LIB: &str = "layer Proj(D) {\n  w: f32[D, 4] init zeros\n  fn forward(x: f32[B, 8]) -> f32[B, 4] {\n    x @ w\n  }\n}\n";
const MAIN: &str = "import \"lib.shard\"\nmesh m(dp: 2)\nmodel M {\n  p = Proj(8)\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {\n    p(x)\n  }\n}\n";

fn codes(ds: &[Value]) -> Vec<String> {
    ds.iter()
        .map(|d| d["code"].as_str().unwrap_or("").to_string())
        .collect()
}

#[test]
fn an_error_in_an_imported_file_shows_in_both_files() {
    let dir = scratch("import-error");
    let broken = LIB.replace("f32[D, 4]", "f32[6, 4]");
    std::fs::write(dir.join("lib.shard"), &broken).expect("write");
    let (lib, main) = (uri(&dir.join("lib.shard")), uri(&dir.join("main.shard")));
    let mut s = Server::start();
    s.initialize();
    s.open(&main, MAIN);
    // In the imported file (not open), where the error is.
    let in_lib = s.diags(&lib);
    assert_eq!(codes(&in_lib), ["E0208"], "{in_lib:?}");
    assert_eq!(in_lib[0]["range"]["start"]["line"], 3, "{in_lib:?}");
    // In the importer, at the instantiation, with the original as related information.
    let in_main = s.diags(&main);
    assert_eq!(codes(&in_main), ["E0208"], "{in_main:?}");
    assert_eq!(in_main[0]["range"]["start"], pos(MAIN, "Proj", 0));
    let related = &in_main[0]["relatedInformation"][0];
    assert_eq!(related["location"]["uri"], lib.as_str(), "{in_main:?}");
    assert_eq!(related["location"]["range"]["start"]["line"], 3);
    assert!(in_main[0]["message"]
        .as_str()
        .unwrap_or("")
        .contains("lib.shard"));
    // A syntax error in the imported file: shown at the import.
    std::fs::write(dir.join("lib.shard"), "layer Proj(D) {\n  w: f32[D, 4\n}\n").expect("write");
    s.send(json!({"jsonrpc": "2.0", "method": "workspace/didChangeWatchedFiles", "params": {"changes": []}}));
    let in_main = s.diags(&main);
    let syntax = in_main
        .iter()
        .find(|d| d["code"] == "E0001")
        .expect("E0001 in the importer");
    assert_eq!(
        syntax["range"]["start"],
        pos(MAIN, "import", 0),
        "{in_main:?}"
    );
    s.finish();
}

#[test]
fn an_unused_import_is_faded_and_its_quick_fix_removes_it() {
    let dir = scratch("unused-import");
    std::fs::write(dir.join("lib.shard"), LIB).expect("write");
    let main = uri(&dir.join("main.shard"));
    // MAIN without the layer it takes from lib.shard.
    let text = "import \"lib.shard\"\nmesh pod(dp: 2)\nmodel M {\n  w: f32[4, 4] init normal(0.1)\n  fn forward(x: f32[B@dp, 4]) -> f32[B@dp, 4] {\n    x @ w\n  }\n}\ntrain M on pod { batch: 8, steps: 1, optimizer: sgd(lr: 0.1), loss: mse }\n";
    let mut s = Server::start();
    s.initialize();
    s.open(&main, text);
    let d = s.diags(&main);
    assert_eq!(codes(&d), ["W0007"], "{d:?}");
    // DiagnosticTag.Unnecessary: editors fade it.
    assert_eq!(d[0]["tags"], json!([1]), "{d:?}");
    let actions = s.request(
        2,
        "textDocument/codeAction",
        json!({"textDocument": {"uri": main}, "range": d[0]["range"], "context": {"diagnostics": []}}),
    );
    let edit = &actions[0]["edit"]["changes"][&main][0];
    assert_eq!(edit["newText"], "", "{actions}");
    assert_eq!(edit["range"]["start"], pos(text, "import", 0), "{actions}");
    assert_eq!(edit["range"]["end"], pos(text, "\nmesh", 0), "{actions}");
    s.finish();
}

#[test]
fn data_checks_and_plans_wait_for_a_pause() {
    let dir = scratch("pause");
    let u = uri(&dir.join("q.shard"));
    let text = "import nn\nmesh pod(dp: 2, mp: 2)\nmodel M {\n  l = Linear(8 -> 8@mp)\n  w: f32[8@mp, 8] init normal(0.1)\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 8] {\n    l(x) @ w\n  }\n}\ntrain M on pod {\n  data: arrays(path: \"missing.npz\")\n  batch: 8, steps: 2, optimizer: sgd(lr: 0.1), loss: mse\n}\n";
    let mut s = Server::start();
    s.initialize();
    s.open(&u, text);
    // At once: the checks that do not read data or plan.
    let quick = s.diags(&u);
    assert_eq!(codes(&quick), ["N0001"], "{quick:?}");
    let said = |d: &Value| d["message"].as_str().unwrap_or("").to_string();
    assert!(!said(&quick[0]).contains("per step"), "{quick:?}");
    // After the pause: the data file's error, and the plan's calls per step.
    let full = s.diags(&u);
    assert_eq!(codes(&full), ["N0001", "E0304"], "{full:?}");
    assert!(
        said(&full[0]).contains("256 B per step (2 calls)"),
        "{full:?}"
    );
    // A hover answers from the full check even before the pause ends.
    s.change(&u, 2, &text.replace("steps: 2", "steps: 3"));
    let hover = s.at(2, "textDocument/hover", &u, pos(text, "l(x) @", 5));
    let shown = hover["contents"]["value"].as_str().unwrap_or("");
    assert!(shown.contains("per step"), "{hover}");
    s.finish();
}

#[test]
fn an_unsaved_edit_to_an_imported_buffer_changes_the_importers_diagnostics() {
    let dir = scratch("overlay");
    std::fs::write(dir.join("lib.shard"), LIB).expect("write");
    let (lib, main) = (uri(&dir.join("lib.shard")), uri(&dir.join("main.shard")));
    let mut s = Server::start();
    s.initialize();
    s.open(&main, MAIN);
    assert_eq!(s.diags(&main), Vec::<Value>::new());
    s.open(&lib, LIB);
    assert_eq!(s.diags(&lib), Vec::<Value>::new());
    // Break the imported buffer without saving: the importer is re-checked.
    s.change(&lib, 2, &LIB.replace("f32[D, 4]", "f32[6, 4]"));
    assert_eq!(codes(&s.diags(&lib)), ["E0208"]);
    assert_eq!(codes(&s.diags(&main)), ["E0208"]);
    // Fix it: both are clean again.
    s.change(&lib, 3, LIB);
    assert_eq!(s.diags(&lib), Vec::<Value>::new());
    assert_eq!(s.diags(&main), Vec::<Value>::new());
    // Closing a buffer clears its diagnostics.
    s.change(&main, 2, &MAIN.replace("p(x)", "q(x)"));
    assert_eq!(codes(&s.diags(&main)), ["E0100"]);
    s.send(json!({"jsonrpc": "2.0", "method": "textDocument/didClose", "params": {"textDocument": {"uri": main}}}));
    assert_eq!(s.diags(&main), Vec::<Value>::new());
    s.finish();
}

#[test]
fn queued_edits_are_checked_once_the_latest_wins() {
    let uri = "file:///tmp/shardc-lsp-coalesce.shard";
    let good = "mesh m(dp: 2)\nmodel M {\n  w: f32[8, 4] init zeros\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {\n    x @ w\n  }\n}\n";
    let mut s = Server::start();
    s.initialize();
    s.open(uri, good);
    assert!(s.diags(uri).is_empty());
    // Many edits at once, the last one clean: no diagnostics of the broken
    // ones may be the last word, and the queue is drained before checking.
    for v in 2..40 {
        s.change(uri, v, &good.replace("B@dp, 8]", &format!("B@dp, {v}]")));
    }
    s.change(uri, 40, good);
    let r = s.at(
        2,
        "textDocument/hover",
        uri,
        json!({"line": 0, "character": 5}),
    );
    assert!(r.is_object(), "{r}");
    let published: Vec<Value> = s
        .stash
        .drain(..)
        .filter(|v| v["method"] == "textDocument/publishDiagnostics")
        .collect();
    assert!(
        published.len() < 39,
        "{} checks for 39 edits",
        published.len()
    );
    let last = published.last().expect("diagnostics");
    assert_eq!(last["params"]["diagnostics"], json!([]), "{last}");
    assert_eq!(last["params"]["version"], 40, "{last}");
    s.finish();
}

#[test]
fn positions_after_a_non_bmp_character() {
    let uri = "file:///tmp/shardc-lsp-emoji.shard";
    let text = "mesh m(dp: 2)\nmodel M {\n  w: f32[8, 4] init zeros\n  fn forward(x: f32[B@dp, 6]) -> f32[B@dp, 4] {\n    /* 🦀🦀 */ let h = x @ w\n    h\n  }\n}\n";
    let line = text.lines().nth(4).unwrap_or("");
    let mut starts = vec![];
    for (encs, want) in [
        (json!(["utf-16"]), "utf-16"),
        (json!(["utf-8", "utf-16"]), "utf-8"),
        (json!(null), "utf-16"),
    ] {
        let mut s = Server::start();
        s.send(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {"general": {"positionEncodings": encs}}}}));
        let init = s.recv();
        assert_eq!(
            init["result"]["capabilities"]["positionEncoding"], want,
            "{init}"
        );
        s.open(uri, text);
        let d = s.diags(uri);
        assert_eq!(codes(&d), ["E0208"]);
        let c = d[0]["range"]["start"]["character"].as_u64().unwrap_or(0) as usize;
        starts.push((want, c));
        // Hover and definition after the emoji, in the session's encoding.
        let col = |needle: &str| {
            let b = line.find(needle).unwrap_or(0);
            if want == "utf-8" {
                b
            } else {
                line[..b].encode_utf16().count()
            }
        };
        let h = s.at(
            2,
            "textDocument/hover",
            uri,
            json!({"line": 4, "character": col("@ w") + 2}),
        );
        assert!(
            h["contents"]["value"]
                .as_str()
                .unwrap_or("")
                .contains("w: f32[8, 4]"),
            "{h}"
        );
        let def = s.at(
            3,
            "textDocument/definition",
            uri,
            json!({"line": 4, "character": col("w\n").max(col("@ w") + 2)}),
        );
        assert_eq!(
            def["range"]["start"],
            json!({"line": 2, "character": 2}),
            "{def}"
        );
        s.finish();
    }
    // The same place, counted in UTF-16 units and in bytes.
    let (u16c, u8c) = (starts[0].1, starts[1].1);
    assert_eq!(line[..u8c].encode_utf16().count(), u16c);
    assert_ne!(u16c, u8c);
}

#[test]
fn strict_applies_to_every_file() {
    let dir = scratch("strict");
    let text = "import nn\nmesh pod(dp: 2, tp: 2)\nmodel E {\n  embed = Embed(4096@tp, 256)\n  fn forward(ids: i32[B@dp, 64@tp]) {\n    let tokens: i32[B@dp, 64@_] = ids\n    embed(tokens)\n  }\n}\n";
    let u = uri(&dir.join("g.shard"));
    for (args, code, severity) in [(vec![], "N0001", 3), (vec!["--strict"], "E0216", 1)] {
        let mut s = Server::start_with(&args);
        s.initialize();
        s.open(&u, text);
        let d = s.diags(&u);
        assert_eq!(codes(&d), [code], "{d:?}");
        assert_eq!(d[0]["severity"], severity, "{args:?}: {d:?}");
        s.finish();
    }
}

#[test]
fn rename_of_a_layer_updates_every_file() {
    let dir = scratch("rename");
    std::fs::write(dir.join("lib.shard"), LIB).expect("write");
    std::fs::write(dir.join("main.shard"), MAIN).expect("write");
    let (lib, main) = (uri(&dir.join("lib.shard")), uri(&dir.join("main.shard")));
    // From the use in the importer, and from the declaration with only the
    // imported file open (the importer beside it is found).
    for (open, text, at) in [
        (&main, MAIN, pos(MAIN, "Proj", 1)),
        (&lib, LIB, pos(LIB, "Proj", 2)),
    ] {
        let mut s = Server::start();
        s.initialize();
        s.open(open, text);
        let _ = s.diags(open);
        let prep = s.at(2, "textDocument/prepareRename", open, at.clone());
        // `p = Proj(8)` and `layer Proj(D)`: both at column 6.
        assert_eq!(prep["start"]["character"], 6, "{prep}");
        let r = s.request(
            3,
            "textDocument/rename",
            json!({"textDocument": {"uri": open}, "position": at, "newName": "Projection"}),
        );
        let changes = &r["changes"];
        assert_eq!(
            changes[&lib],
            json!([{"range": {"start": {"line": 0, "character": 6}, "end": {"line": 0, "character": 10}}, "newText": "Projection"}]),
            "{r}"
        );
        assert_eq!(
            changes[&main],
            json!([{"range": {"start": pos(MAIN, "Proj", 0), "end": pos(MAIN, "Proj", 4)}, "newText": "Projection"}]),
            "{r}"
        );
        // References: the declaration and the use.
        let refs = s.request(4, "textDocument/references", json!({"textDocument": {"uri": open}, "position": at, "context": {"includeDeclaration": true}}));
        assert_eq!(refs.as_array().map(|a| a.len()), Some(2), "{refs}");
        // Not a name: refused.
        s.send(json!({"jsonrpc": "2.0", "id": 5, "method": "textDocument/rename", "params": {"textDocument": {"uri": open}, "position": at, "newName": "fn"}}));
        let bad = s.wait_for(|v| v["id"] == 5);
        assert!(bad["error"].is_object(), "{bad}");
        s.finish();
    }
}

const GPT: &str = "import nn\n\nmesh pod(dp: 4, mp: 2)\nmesh other(x: 8)\n\nconst D = 64 // width\n\n// A block.\nlayer Block(D) {\n  up = Dense(D -> 4 * D@mp)\n  w: f32[D, D] init normal(0.02)\n\n  fn forward(x: f32[B@dp, D]) -> f32[B@dp, D] {\n    let h = up(x)\n    let g = gelu(h)\n    x + psum(g @ w, mp)\n  }\n}\n\nmodel M {\n  b = Block(D)\n  fn forward(x: f32[B@dp, D]) -> f32[B@dp, D] {\n    b(x)\n  }\n}\n\ntrain M on pod {\n  data: synthetic(classes: 10)\n  batch: 8, steps: 2\n  optimizer: adam(lr: 1e-3)\n}\n";

#[test]
fn definition_hover_and_completion() {
    let dir = scratch("features");
    let u = uri(&dir.join("gpt.shard"));
    let mut s = Server::start();
    s.initialize();
    s.open(&u, GPT);
    let _ = s.diags(&u);
    // Into the standard library: a file the editor can open.
    let def = s.at(2, "textDocument/definition", &u, pos(GPT, "Dense", 1));
    let target = def["uri"].as_str().unwrap_or("").to_string();
    assert!(target.ends_with("/nn.shard"), "{def}");
    let on_disk =
        std::fs::read_to_string(target.trim_start_matches("file://")).expect("the stdlib copy");
    let line = def["range"]["start"]["line"].as_u64().unwrap_or(0) as usize;
    assert!(
        on_disk
            .lines()
            .nth(line)
            .unwrap_or("")
            .starts_with("layer Dense"),
        "{def}"
    );
    // Parameters, constants, axes, layers, sublayers, lets.
    for (needle, skip, decl) in [
        ("D -> 4", 0, "Block(D)"),
        ("@mp)", 1, "mp: 2"),
        ("Block(D)\n  f", 0, "layer Block"),
        ("b(x)", 0, "b = Block"),
        ("h)\n", 0, "h = up"),
        ("pod {", 0, "pod(dp"),
    ] {
        let def = s.at(3, "textDocument/definition", &u, pos(GPT, needle, skip));
        let want = pos(GPT, decl, 0);
        assert_eq!(
            def["range"]["start"]["line"], want["line"],
            "{needle}: {def}"
        );
    }
    // Hover: a constant's value, an axis's size, a built-in's registry row.
    let hover = |s: &mut Server, id, needle: &str, skip| {
        let h = s.at(id, "textDocument/hover", &u, pos(GPT, needle, skip));
        h["contents"]["value"].as_str().unwrap_or("").to_string()
    };
    assert!(hover(&mut s, 4, "Block(D)\n  fn", 6).contains("const D = 64"));
    assert!(hover(&mut s, 16, "D@mp", 0).contains("layer parameter of `Block`"));
    let axis = hover(&mut s, 5, "@mp)", 1);
    assert!(axis.contains("2 devices"), "{axis}");
    let gelu = hover(&mut s, 6, "gelu", 0);
    assert!(
        gelu.contains("gelu(x)") && gelu.contains("built-in"),
        "{gelu}"
    );
    let psum = hover(&mut s, 7, "psum", 0);
    assert!(psum.contains("collective"), "{psum}");
    assert!(hover(&mut s, 8, "let g", 4).contains("g: f32[8@dp, 256@mp]"));
    assert!(hover(&mut s, 9, "Dense", 0).contains("layer Dense(IN -> OUT)"));
    // Completion after `@`: exactly the axes of the mesh the model trains on.
    let typing = GPT.replace("w: f32[D, D]", "w: f32[D, D@");
    s.change(&u, 2, &typing);
    let _ = s.diags(&u);
    let labels = |r: &Value| -> Vec<String> {
        let mut v: Vec<String> = r
            .as_array()
            .into_iter()
            .flatten()
            .map(|i| i["label"].as_str().unwrap_or("").to_string())
            .collect();
        v.sort();
        v
    };
    let c = s.at(
        10,
        "textDocument/completion",
        &u,
        pos(&typing, "D@ init", 2),
    );
    assert_eq!(labels(&c), ["dp", "mp"], "{c}");
    // In a collective's axis argument too.
    let c = s.at(11, "textDocument/completion", &u, pos(GPT, "mp)\n  }", 0));
    assert_eq!(labels(&c), ["dp", "mp"], "{c}");
    s.change(&u, 3, GPT);
    let _ = s.diags(&u);
    // A train's options, optimizers, built-in ops with their signatures.
    let c = s.at(12, "textDocument/completion", &u, pos(GPT, "  batch", 2));
    assert!(labels(&c).contains(&"optimizer".to_string()), "{c}");
    let c = s.at(13, "textDocument/completion", &u, pos(GPT, "adam", 0));
    assert_eq!(
        labels(&c),
        ["adagrad", "adam", "adamw", "ftrl", "lion", "muon", "sgd"],
        "{c}"
    );
    let c = s.at(14, "textDocument/completion", &u, pos(GPT, "gelu", 0));
    let items = c.as_array().cloned().unwrap_or_default();
    let softmax = items
        .iter()
        .find(|i| i["label"] == "softmax")
        .expect("softmax offered");
    assert!(
        softmax["detail"]
            .as_str()
            .unwrap_or("")
            .starts_with("softmax("),
        "{softmax}"
    );
    assert!(items.iter().any(|i| i["label"] == "h"), "lets in scope");
    assert!(items.iter().any(|i| i["label"] == "up"), "sublayers");
    // Signature help inside a call.
    let sig = s.at(
        15,
        "textDocument/signatureHelp",
        &u,
        pos(GPT, "mp)\n  }", 0),
    );
    assert!(
        sig["signatures"][0]["label"]
            .as_str()
            .unwrap_or("")
            .starts_with("psum("),
        "{sig}"
    );
    assert_eq!(sig["activeParameter"], 1, "{sig}");
    s.finish();
}

#[test]
fn call_hierarchy_of_layers() {
    let dir = scratch("calls");
    let u = uri(&dir.join("gpt.shard"));
    let mut s = Server::start();
    let init = s.initialize();
    assert_eq!(
        init["result"]["capabilities"]["callHierarchyProvider"], true,
        "{init}"
    );
    s.open(&u, GPT);
    let _ = s.diags(&u);
    let names = |calls: &Value, side: &str| -> Vec<String> {
        calls
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| c[side]["name"].as_str().unwrap_or("").to_string())
            .collect()
    };
    let block = s.at(
        2,
        "textDocument/prepareCallHierarchy",
        &u,
        pos(GPT, "Block", 0),
    );
    assert_eq!(block[0]["name"], "Block", "{block}");
    assert_eq!(block[0]["selectionRange"]["start"], pos(GPT, "Block", 0));
    // Who instantiates Block: the model, at `Block(D)`.
    let incoming = s.request(3, "callHierarchy/incomingCalls", json!({"item": block[0]}));
    assert_eq!(names(&incoming, "from"), ["M"], "{incoming}");
    assert_eq!(
        incoming[0]["fromRanges"][0]["start"],
        pos(GPT, "= Block", 2),
        "{incoming}"
    );
    // What Block is built of: nn's Dense.
    let outgoing = s.request(4, "callHierarchy/outgoingCalls", json!({"item": block[0]}));
    assert_eq!(names(&outgoing, "to"), ["Dense"], "{outgoing}");
    assert_eq!(
        outgoing[0]["fromRanges"][0]["start"],
        pos(GPT, "Dense", 0),
        "{outgoing}"
    );
    // And the model is built of Block.
    let m = s.at(
        5,
        "textDocument/prepareCallHierarchy",
        &u,
        pos(GPT, "M {", 0),
    );
    let outgoing = s.request(6, "callHierarchy/outgoingCalls", json!({"item": m[0]}));
    assert_eq!(names(&outgoing, "to"), ["Block"], "{outgoing}");
    // A name that is not a layer has no hierarchy.
    let none = s.at(
        7,
        "textDocument/prepareCallHierarchy",
        &u,
        pos(GPT, "gelu", 0),
    );
    assert!(none.is_null(), "{none}");
    s.finish();
}

#[test]
fn hints_actions_symbols_tokens_and_folding() {
    let dir = scratch("outline");
    let u = uri(&dir.join("gpt.shard"));
    let mut s = Server::start();
    let init = s.initialize();
    let caps = &init["result"]["capabilities"];
    for c in [
        "definitionProvider",
        "referencesProvider",
        "renameProvider",
        "completionProvider",
        "signatureHelpProvider",
        "inlayHintProvider",
        "codeActionProvider",
        "documentSymbolProvider",
        "semanticTokensProvider",
        "foldingRangeProvider",
        "workspaceSymbolProvider",
        "documentLinkProvider",
        "hoverProvider",
        "documentFormattingProvider",
    ] {
        assert!(!caps[c].is_null() && caps[c] != false, "{c}: {caps}");
    }
    s.open(&u, GPT);
    let _ = s.diags(&u);
    let whole = json!({"start": {"line": 0, "character": 0}, "end": {"line": 99, "character": 0}});
    let hints = s.request(
        2,
        "textDocument/inlayHint",
        json!({"textDocument": {"uri": u}, "range": whole}),
    );
    let labels: Vec<&str> = hints
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h["label"].as_str())
        .collect();
    assert_eq!(
        labels,
        [": f32[8@dp, 256@mp]", ": f32[8@dp, 256@mp]"],
        "{hints}"
    );
    assert_eq!(hints[0]["position"], pos(GPT, "h = up", 1));
    // A fix-it becomes a quick fix.
    let typo = GPT.replace("gelu(h)", "gelu(hh)");
    s.change(&u, 2, &typo);
    let d = s.diags(&u);
    assert_eq!(codes(&d), ["E0100"], "{d:?}");
    let actions = s.request(
        3,
        "textDocument/codeAction",
        json!({"textDocument": {"uri": u}, "range": d[0]["range"], "context": {"diagnostics": []}}),
    );
    let edit = &actions[0]["edit"]["changes"][&u][0];
    assert_eq!(edit["newText"], "h", "{actions}");
    assert_eq!(edit["range"]["start"], pos(&typo, "hh", 0), "{actions}");
    s.change(&u, 3, GPT);
    let _ = s.diags(&u);
    let syms = s.request(
        4,
        "textDocument/documentSymbol",
        json!({"textDocument": {"uri": u}}),
    );
    let names: Vec<&str> = syms
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x["name"].as_str())
        .collect();
    assert_eq!(
        names,
        ["pod", "other", "D", "Block", "M", "train M"],
        "{syms}"
    );
    let block = &syms[3]["children"];
    let kids: Vec<&str> = block
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x["name"].as_str())
        .collect();
    assert_eq!(kids, ["D", "up", "w", "forward"], "{syms}");
    let toks = s.request(
        5,
        "textDocument/semanticTokens/full",
        json!({"textDocument": {"uri": u}}),
    );
    let data = toks["data"].as_array().cloned().unwrap_or_default();
    assert!(data.len() > 5 * 20, "{toks}");
    // The first token: `pod`, a mesh (namespace), declared.
    assert_eq!(
        &data[..5],
        &[json!(2), json!(5), json!(3), json!(0), json!(1)],
        "{toks}"
    );
    let folds = s.request(
        6,
        "textDocument/foldingRange",
        json!({"textDocument": {"uri": u}}),
    );
    let block_line = pos(GPT, "layer Block", 0)["line"].clone();
    assert!(
        folds
            .as_array()
            .into_iter()
            .flatten()
            .any(|f| f["startLine"] == block_line),
        "{folds}"
    );
    let hl = s.at(7, "textDocument/documentHighlight", &u, pos(GPT, "h)\n", 0));
    assert_eq!(hl.as_array().map(|a| a.len()), Some(2), "{hl}");
    s.finish();
}

#[test]
fn incremental_edits_count_utf16_units() {
    let uri = "file:///tmp/shardc-lsp-incremental.shard";
    let text = "mesh m(dp: 2)\nmodel M {\n  w: f32[8, 4] init zeros\n  fn forward(x: f32[B@dp, 8]) -> f32[B@dp, 4] {\n    /* 🦀🦀 */ let h = x @ v\n    h\n  }\n}\n";
    let mut s = Server::start();
    s.initialize();
    s.open(uri, text);
    let d = s.diags(uri);
    assert_eq!(codes(&d), ["E0100"], "{d:?}");
    let v = pos(text, "v\n", 0);
    assert_eq!(d[0]["range"]["start"], v, "{d:?}");
    // Replace `v` by `w`, addressed in UTF-16 units after the emoji.
    let end = json!({"line": v["line"], "character": v["character"].as_u64().unwrap_or(0) + 1});
    s.send(json!({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [{"range": {"start": v, "end": end}, "text": "w"}]}}));
    assert_eq!(s.diags(uri), Vec::<Value>::new());
    s.finish();
}
