//! `shardc lsp` end to end over stdio: open a file with an error, receive its
//! diagnostics, hover a binding for its type, format, shut down; and malformed
//! input (a body that is not JSON, a header block without `Content-Length`, a
//! `Content-Length` of 2^62, garbage bytes) is answered or logged and skipped,
//! and the next request is still answered. Every wait has a timeout.

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
        let mut child = Command::new(env!("CARGO_BIN_EXE_shardc"))
            .arg("lsp")
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
    s.send(json!({"jsonrpc": "2.0", "id": 5, "method": "textDocument/definition", "params": {"textDocument": {"uri": uri}, "position": {"line": 0, "character": 0}}}));
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
