//! A `shardc lsp` client over stdio for the newer LSP test files
//! (tests/lsp_workspace.rs, tests/lsp_tokens.rs), which include it with
//! `#[path = "common/lsp.rs"] mod lsp;`. It sends what an editor sends
//! (Content-Length frames of JSON-RPC) and waits for answers with a timeout,
//! so a silent server fails a test instead of hanging it. tests/lsp.rs keeps
//! its own copy of the same client.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const TIMEOUT: Duration = Duration::from_secs(60);

/// A running `shardc lsp`: frames from its stdout arrive on `rx` (read on a
/// thread), its stderr is collected; it is killed if the test ends early.
pub struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Value>,
    stderr: Option<JoinHandle<String>>,
    /// Messages received while waiting for another.
    stash: Vec<Value>,
    next_id: i64,
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
    pub fn start() -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_shardc"))
            .arg("lsp")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn shardc lsp");
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
            next_id: 1,
        }
    }

    pub fn send(&mut self, v: Value) {
        let s = v.to_string();
        let w = self.stdin.as_mut().expect("stdin open");
        w.write_all(format!("Content-Length: {}\r\n\r\n{s}", s.len()).as_bytes())
            .expect("write");
        w.flush().expect("flush");
    }

    pub fn notify(&mut self, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// The first message (stashed or new) that `want` accepts; others are stashed.
    pub fn wait_for(&mut self, want: impl Fn(&Value) -> bool) -> Value {
        if let Some(i) = self.stash.iter().position(&want) {
            return self.stash.remove(i);
        }
        loop {
            let v = self
                .rx
                .recv_timeout(TIMEOUT)
                .expect("an answer from shardc lsp within the timeout");
            if want(&v) {
                return v;
            }
            self.stash.push(v);
        }
    }

    /// Whether a message already received but not yet taken matches `want`.
    #[allow(dead_code)]
    pub fn stash_has(&self, want: impl Fn(&Value) -> bool) -> bool {
        self.stash.iter().any(want)
    }

    /// A request's whole response (result or error).
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        self.wait_for(|v| v["id"] == id && v.get("method").is_none())
    }

    /// A request's result; an error response fails the test.
    pub fn request(&mut self, method: &str, params: Value) -> Value {
        let r = self.call(method, params);
        assert!(r.get("error").is_none(), "{method}: {r}");
        r["result"].clone()
    }

    /// `initialize` with these params (`capabilities` added when missing),
    /// then `initialized`; the result.
    pub fn initialize(&mut self, mut params: Value) -> Value {
        if params.get("capabilities").is_none() {
            params["capabilities"] = json!({});
        }
        let r = self.request("initialize", params);
        self.notify("initialized", json!({}));
        r
    }

    pub fn open(&mut self, uri: &str, text: &str) {
        self.notify(
            "textDocument/didOpen",
            json!({"textDocument": {"uri": uri, "languageId": "shard", "version": 1, "text": text}}),
        );
    }

    /// The next diagnostics published for `uri`.
    pub fn diags(&mut self, uri: &str) -> Vec<Value> {
        let v = self.wait_for(|v| {
            v["method"] == "textDocument/publishDiagnostics" && v["params"]["uri"] == uri
        });
        v["params"]["diagnostics"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// `shutdown`, `exit`: the server exits with status 0. Returns its log.
    pub fn finish(mut self) -> String {
        self.request("shutdown", Value::Null);
        self.notify("exit", Value::Null);
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

/// A fresh directory for a test's files, canonical (spelled as the server
/// spells paths).
pub fn scratch(suite: &str, name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("shardc-{suite}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    std::fs::canonicalize(&d).expect("canonical")
}

/// Writes `text` to `dir/rel`, creating directories.
pub fn write(dir: &Path, rel: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(rel);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).expect("mkdir");
    }
    std::fs::write(&p, text).expect("write");
    p
}

pub fn uri(p: &Path) -> String {
    format!("file://{}", p.display())
}

/// Line and UTF-16 column of the first `needle` in `text` (plus `skip` characters).
pub fn pos(text: &str, needle: &str, skip: usize) -> Value {
    let at = text.find(needle).expect("needle in text");
    let line = text[..at].matches('\n').count();
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    let col = text[start..at].encode_utf16().count() + skip;
    json!({"line": line, "character": col})
}
