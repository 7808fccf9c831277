//! Fuzzing `shardc lsp`'s input side in process: random byte streams, soups of
//! header and JSON pieces, and whole valid sessions (initialize, open a model,
//! hover, format, shut down) mutated (bytes inserted, deleted, flipped to
//! invalid UTF-8, wrong and huge `Content-Length`s, deeply nested or huge
//! JSON, odd ids, truncation), each delivered in random chunk sizes. Every case
//! goes through the framing parser alone (small and default limits) and through
//! the whole message loop (`lsp::serve`), and must not panic, must finish
//! within a generous hang guard, and the server's output must be well-formed
//! frames of JSON-RPC.
//!
//! 256 cases per property; `SHARDC_FUZZ_CASES=N` runs N (a long campaign:
//! `scripts/fuzz.sh`, which runs every fuzz target in release).

use proptest::prelude::*;
use proptest::sample::Index;
use serde_json::{json, Value};
use shardc::lsp::transport::{self, Decoded, Frame, Framer};
use shardc::lsp::{self, End};
use std::io::{BufReader, Read};
use std::path::Path;
use std::sync::{mpsc, OnceLock};
use std::time::Duration;

/// Not a timing assertion: only a case that never ends fails it.
const HANG_GUARD: Duration = Duration::from_secs(10);

fn cases() -> u32 {
    std::env::var("SHARDC_FUZZ_CASES")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(256)
}

/// The models and examples, as documents to open.
fn texts() -> &'static [String] {
    static TEXTS: OnceLock<Vec<String>> = OnceLock::new();
    TEXTS.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut v: Vec<String> = ["models", "examples"]
            .iter()
            .flat_map(|d| std::fs::read_dir(root.join(d)).expect("a source dir"))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "shard"))
            .map(|p| std::fs::read_to_string(p).expect("readable"))
            .collect();
        v.sort();
        v
    })
}

/// Hands out its bytes in chunks of the given sizes (cycled), so frames and
/// header lines are split at random points.
struct Chunked {
    data: Vec<u8>,
    pos: usize,
    sizes: Vec<usize>,
    turn: usize,
}

impl Read for Chunked {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let size = self.sizes[self.turn % self.sizes.len()].max(1);
        self.turn += 1;
        let n = size.min(buf.len()).min(self.data.len() - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// How the input arrives: chunk sizes and the buffer size of the reader.
#[derive(Debug, Clone)]
struct Delivery {
    sizes: Vec<usize>,
    buffer: usize,
}

fn delivery() -> impl Strategy<Value = Delivery> {
    (
        proptest::collection::vec(prop_oneof![1usize..8, 8usize..600, 600usize..70_000], 1..6),
        prop_oneof![1usize..16, 16usize..9000, Just(64 << 10)],
    )
        .prop_map(|(sizes, buffer)| Delivery { sizes, buffer })
}

fn reader(input: &[u8], d: &Delivery) -> BufReader<Chunked> {
    BufReader::with_capacity(
        d.buffer,
        Chunked {
            data: input.to_vec(),
            pos: 0,
            sizes: d.sizes.clone(),
            turn: 0,
        },
    )
}

/// Everything a case must hold; an error says what did not.
fn run_case(input: &[u8], d: &Delivery) -> Result<(), String> {
    // The framer alone, with small limits: bodies stay within them.
    let mut frames = 0usize;
    for frame in Framer::with_limits(reader(input, d), 300, 40) {
        frames += 1;
        if let Frame::Body(b) = frame {
            if b.len() > 300 {
                return Err(format!(
                    "a body of {} bytes passed a 300-byte limit",
                    b.len()
                ));
            }
            let _ = transport::decode(&b);
        }
        if frames > input.len() + 2 {
            return Err("more frames than input bytes".into());
        }
    }
    // Default limits: what the framer yields decodes, and every error
    // response is JSON-RPC's Parse error or Invalid Request.
    for frame in Framer::new(reader(input, d)) {
        if let Frame::Body(b) = frame {
            if let Decoded::Invalid(i) = transport::decode(&b) {
                if i.code != -32700 && i.code != -32600 {
                    return Err(format!("error code {} for an invalid body", i.code));
                }
                let r = i.response();
                if r["jsonrpc"] != "2.0"
                    || !(r["id"].is_null() || r["id"].is_number() || r["id"].is_string())
                {
                    return Err(format!("malformed error response {r}"));
                }
            }
        }
    }
    // The whole loop.
    let mut out = Vec::new();
    let mut log = Vec::new();
    let session = lsp::serve(reader(input, d), &mut out, &mut log);
    if session.panics > 0 || session.reader_panicked {
        return Err(format!(
            "the server panicked: {session:?}\nlog:\n{}",
            String::from_utf8_lossy(&log)
        ));
    }
    if !matches!(
        session.end,
        End::Exit | End::ExitWithoutShutdown | End::InputEnded
    ) {
        return Err(format!("ended as {:?}", session.end));
    }
    // Its output: frames of JSON-RPC 2.0 objects, nothing else.
    for frame in Framer::new(&out[..]) {
        match frame {
            Frame::Body(b) => {
                let v: Value = serde_json::from_slice(&b)
                    .map_err(|e| format!("the server wrote a body that is not JSON: {e}"))?;
                if v["jsonrpc"] != "2.0" {
                    return Err(format!("the server wrote {v}"));
                }
            }
            Frame::Skipped(why) => {
                return Err(format!("the server's output has a bad frame: {why}"))
            }
        }
    }
    Ok(())
}

/// Runs a case on a thread of its own: a panic or a hang fails it.
fn check(input: Vec<u8>, d: Delivery) -> Result<(), TestCaseError> {
    let (tx, rx) = mpsc::channel();
    let bytes = input.clone();
    let dd = d.clone();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(|| run_case(&bytes, &dd));
        let _ = tx.send(r);
    });
    let shown = || {
        let s = String::from_utf8_lossy(&input);
        let cut: String = s.chars().take(3000).collect();
        format!("{} bytes, delivered as {d:?}:\n{cut:?}", input.len())
    };
    match rx.recv_timeout(HANG_GUARD) {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(why))) => Err(TestCaseError::fail(format!("{why}\ninput: {}", shown()))),
        Ok(Err(_)) => Err(TestCaseError::fail(format!(
            "panicked on input: {}",
            shown()
        ))),
        Err(_) => Err(TestCaseError::fail(format!(
            "no end within {HANG_GUARD:?} on input: {}",
            shown()
        ))),
    }
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut f = format!("Content-Length: {}\r\n\r\n", body.len()).into_bytes();
    f.extend_from_slice(body);
    f
}

/// A whole valid session on one of the models, as frames.
fn session(text: &str, line: u32, character: u32) -> Vec<Vec<u8>> {
    let uri = format!(
        "file://{}/models/fuzz-lsp.shard",
        env!("CARGO_MANIFEST_DIR")
    );
    let td = json!({"uri": uri});
    [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"capabilities": {}}}),
        json!({"jsonrpc": "2.0", "method": "initialized", "params": {}}),
        json!({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {"uri": uri, "languageId": "shard", "version": 1, "text": text}}}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "textDocument/hover", "params": {"textDocument": td, "position": {"line": line, "character": character}}}),
        json!({"jsonrpc": "2.0", "id": "f", "method": "textDocument/formatting", "params": {"textDocument": td, "options": {"tabSize": 2, "insertSpaces": true}}}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "textDocument/definition", "params": {"textDocument": td, "position": {"line": 0, "character": 0}}}),
        json!({"jsonrpc": "2.0", "method": "textDocument/didChange", "params": {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [{"text": format!("{text}\n")}]}}),
        json!({"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 2}}),
        json!({"jsonrpc": "2.0", "id": 4, "method": "shutdown"}),
        json!({"jsonrpc": "2.0", "method": "exit"}),
    ]
    .iter()
    .map(|v| frame(v.to_string().as_bytes()))
    .collect()
}

/// Bodies that are JSON (or nearly) but odd: deep nesting, huge strings, ids
/// and methods of every type.
fn odd_body(kind: usize, n: usize) -> Vec<u8> {
    let depth = [1, 127, 128, 129, 5_000, 200_000][n % 6];
    match kind % 12 {
        0 => format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes(),
        1 => format!(
            "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"textDocument/hover\",\"params\":{}0{}}}",
            "{\"a\":".repeat(depth),
            "}".repeat(depth)
        )
        .into_bytes(),
        2 => "[".repeat(depth).into_bytes(),
        3 => format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"textDocument/didOpen\",\"params\":{{\"textDocument\":{{\"uri\":\"file:///x.shard\",\"languageId\":\"shard\",\"version\":1,\"text\":\"{}\"}}}}}}",
            "x".repeat(depth * 5)
        )
        .into_bytes(),
        4 => {
            let ids = ["null", "1.5", "1099511627776", "-1", "\"\"", "[]", "{}", "true", "2147483648", "-2147483649", "1e3"];
            format!("{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"textDocument/hover\"}}", ids[n % ids.len()]).into_bytes()
        }
        5 => {
            let methods = ["null", "1", "[\"initialize\"]", "{}", "\"\"", "\"exit\"", "\"shutdown\"", "\"initialize\"", "\"$/x\""];
            format!("{{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":{}}}", methods[n % methods.len()]).into_bytes()
        }
        6 => {
            let params = ["null", "1", "\"s\"", "[]", "{}", "[1,2,3]", "{\"textDocument\":7}"];
            let methods = ["textDocument/hover", "textDocument/formatting", "textDocument/didOpen", "textDocument/didChange", "initialize"];
            format!(
                "{{\"jsonrpc\":\"2.0\",{}\"method\":\"{}\",\"params\":{}}}",
                if n.is_multiple_of(2) { "\"id\":5," } else { "" },
                methods[n % methods.len()],
                params[n % params.len()]
            )
            .into_bytes()
        }
        7 => b"{\"jsonrpc\":\"2.0\",\"id\":1,\"result\":null}".to_vec(),
        8 => b"{\"jsonrpc\":\"2.0\",\"id\":{},\"error\":5}".to_vec(),
        9 => b"{\"jsonrpc\":\"1.0\",\"id\":1,\"method\":\"x\"}".to_vec(),
        10 => vec![0xff, 0xfe, b'{', 0xc0, 0x80, b'}'],
        _ => b"\"\\ud800\"".to_vec(),
    }
}

/// A Content-Length value that is wrong in some way.
fn bad_length(real: usize, n: usize) -> String {
    match n % 10 {
        0 => "0".into(),
        1 => (real + 1 + n % 50).to_string(),
        2 => real.saturating_sub(1 + n % 50).to_string(),
        3 => "4611686018427387904".into(),
        4 => "18446744073709551616".into(),
        5 => ((64 << 20) + 1).to_string(),
        6 => "-5".into(),
        7 => "".into(),
        8 => format!("{real} {real}"),
        _ => "0x10".into(),
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    Flip(Index, u8),
    Truncate(Index),
    Duplicate(Index, usize, Index),
    Length(Index, usize),
    OddFrame(Index, usize, usize),
    DropCr(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (
            any::<Index>(),
            proptest::collection::vec(any::<u8>(), 1..40)
        )
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        (any::<Index>(), 1usize..200).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (
            any::<Index>(),
            prop_oneof![
                any::<u8>(),
                Just(0xffu8),
                Just(0x80u8),
                Just(b'\n'),
                Just(b'\r'),
                Just(b':')
            ]
        )
            .prop_map(|(i, b)| Mutation::Flip(i, b)),
        any::<Index>().prop_map(Mutation::Truncate),
        (any::<Index>(), 1usize..300, any::<Index>())
            .prop_map(|(a, n, b)| Mutation::Duplicate(a, n, b)),
        (any::<Index>(), any::<usize>()).prop_map(|(i, n)| Mutation::Length(i, n)),
        (any::<Index>(), any::<usize>(), any::<usize>())
            .prop_map(|(i, k, n)| Mutation::OddFrame(i, k, n)),
        any::<Index>().prop_map(Mutation::DropCr),
    ]
}

/// Applies a mutation to a session's frames (joined, or one frame's framing).
fn mutate(frames: &mut Vec<Vec<u8>>, m: &Mutation) {
    match m {
        Mutation::Length(i, n) => {
            let f = i.index(frames.len());
            let body_at = frames[f]
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map_or(0, |p| p + 4);
            let body = frames[f][body_at..].to_vec();
            let mut out =
                format!("Content-Length: {}\r\n\r\n", bad_length(body.len(), *n)).into_bytes();
            out.extend_from_slice(&body);
            frames[f] = out;
        }
        Mutation::OddFrame(i, k, n) => {
            let at = i.index(frames.len() + 1);
            frames.insert(at, frame(&odd_body(*k, *n)));
        }
        Mutation::DropCr(i) => {
            let f = i.index(frames.len());
            if let Some(p) = frames[f].iter().position(|&b| b == b'\r') {
                frames[f].remove(p);
            }
        }
        _ => {
            let mut all: Vec<u8> = frames.concat();
            let len = all.len();
            match m {
                Mutation::Insert(i, b) => {
                    let at = i.index(len + 1);
                    all.splice(at..at, b.iter().copied());
                }
                Mutation::Delete(i, n) if len > 0 => {
                    let at = i.index(len);
                    all.drain(at..(at + n).min(len));
                }
                Mutation::Flip(i, b) if len > 0 => all[i.index(len)] = *b,
                Mutation::Truncate(i) => all.truncate(i.index(len + 1)),
                Mutation::Duplicate(a, n, b) if len > 0 => {
                    let from = a.index(len);
                    let piece = all[from..(from + n).min(len)].to_vec();
                    let to = b.index(len + 1);
                    all.splice(to..to, piece);
                }
                _ => {}
            }
            *frames = vec![all];
        }
    }
}

const PIECES: &[&str] = &[
    "Content-Length: ",
    "content-length:",
    "CONTENT-LENGTH :",
    "Content-Type: application/vscode-jsonrpc; charset=utf-8",
    "X-Other: 1",
    "\r\n",
    "\r\n\r\n",
    "\n",
    "\r",
    ":",
    " ",
    "0",
    "2",
    "17",
    "64",
    "4611686018427387904",
    "18446744073709551616",
    "{",
    "}",
    "[",
    "]",
    "\"jsonrpc\":\"2.0\",",
    "\"id\":1,",
    "\"id\":null,",
    "\"method\":\"initialize\"",
    "\"method\":\"textDocument/hover\"",
    "\"method\":\"exit\"",
    "\"method\":\"shutdown\"",
    "\"params\":{}",
    "\"result\":null",
    "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{}}",
    "\u{0}",
    "é",
    "\u{feff}",
];

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..4096), d in delivery()) {
        check(bytes, d)?;
    }

    #[test]
    fn header_and_json_soup(pieces in proptest::collection::vec(proptest::sample::select(PIECES), 0..200), d in delivery()) {
        check(pieces.concat().into_bytes(), d)?;
    }

    #[test]
    fn mutated_sessions(
        which in any::<Index>(),
        line in 0u32..40,
        character in 0u32..30,
        mutations in proptest::collection::vec(mutation(), 0..6),
        d in delivery(),
    ) {
        let texts = texts();
        let mut frames = session(&texts[which.index(texts.len())], line, character);
        for m in &mutations {
            mutate(&mut frames, m);
        }
        check(frames.concat(), d)?;
    }
}

/// The unmutated session is answered in full, however it is chunked: the
/// mutations above start from a session that works.
#[test]
fn the_unmutated_session_is_answered() {
    for (k, text) in texts().iter().enumerate() {
        let input = session(text, 0, 0).concat();
        let d = Delivery {
            sizes: vec![1 + k * 7, 3, 4096],
            buffer: 5 + k,
        };
        let mut out = Vec::new();
        let mut log = Vec::new();
        let s = lsp::serve(reader(&input, &d), &mut out, &mut log);
        assert_eq!(s.end, End::Exit, "{}", String::from_utf8_lossy(&log));
        let ids: Vec<Value> = Framer::new(&out[..])
            .filter_map(|f| match f {
                Frame::Body(b) => serde_json::from_slice::<Value>(&b).ok(),
                Frame::Skipped(_) => None,
            })
            .filter_map(|v| v.get("id").cloned())
            .collect();
        assert_eq!(
            ids,
            vec![json!(1), json!(2), json!("f"), json!(3), json!(4)]
        );
        assert!(log.is_empty(), "{}", String::from_utf8_lossy(&log));
    }
}
