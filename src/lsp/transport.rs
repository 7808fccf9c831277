//! The LSP base protocol, read tolerantly: header blocks, `Content-Length`
//! framing and JSON-RPC decoding for `shardc lsp`. lsp-server's own reader
//! stops for good at the first malformed frame (and allocates whatever length a
//! header announces); this one reports what it skipped and reads on. It works
//! over any `BufRead`, so the fuzz test (`tests/fuzz_lsp.rs`) drives it without
//! a process.
//!
//! The rules:
//! - a header block is ASCII `Name: value` lines ended by `\r\n` (a bare `\n`
//!   is accepted), then an empty line; a line longer than [`MAX_HEADER_LINE`]
//!   is cut to its last [`MAX_HEADER_LINE`] bytes as it is read;
//! - a block without a `Content-Length`, with an unreadable one, or with one
//!   above [`MAX_BODY`] is skipped ([`Frame::Skipped`] says why) and reading goes
//!   on with the bytes after it, as headers: a body that was never read is
//!   skipped line by line until the next header block;
//! - resynchronising: in a line with bytes before `Content-Length` (the tail of
//!   a body whose length was wrong, or garbage), the header is read from the
//!   last `Content-Length` on and the bytes before it are skipped;
//! - a body that is not JSON or not a JSON-RPC message decodes to an
//!   [`Invalid`] (answered with JSON-RPC's `Parse error` or `Invalid Request`);
//! - the end of the input, or a read error, ends the frames.
//!
//! Memory stays bounded: a header line holds at most [`MAX_HEADER_LINE`] bytes,
//! a body at most [`MAX_BODY`], and a body grows with the bytes that arrive,
//! not with the length its header announced.

use lsp_server::{ErrorCode, Message, Notification, Request, RequestId, Response};
use serde_json::Value;
use std::io::{self, BufRead};

/// The largest body read (64 MiB); a `Content-Length` above it is refused.
pub const MAX_BODY: usize = 64 << 20;

/// The most bytes of one header line kept (8 KiB); longer lines keep their end.
pub const MAX_HEADER_LINE: usize = 8 << 10;

/// One step of reading the input.
#[derive(Debug)]
pub enum Frame {
    /// A body of the length its header block announced (not yet decoded).
    Body(Vec<u8>),
    /// Bytes that were not a frame were skipped; why, for the log.
    Skipped(String),
}

/// The framing parser: yields the frames of `input` until it ends.
pub struct Framer<R> {
    input: R,
    max_body: usize,
    max_line: usize,
    /// A body read after bytes that were skipped: returned on the next call.
    pending: Option<Vec<u8>>,
    done: bool,
}

/// What a header block said about its body's length.
enum Length {
    Missing,
    Bytes(usize),
    /// Digits, but more than the limit (or than 64 bits hold).
    TooLarge(String),
    Unreadable(String),
}

/// One header line as read: its bytes (without the line end), how many bytes
/// of it were dropped for length, and whether a line end was found.
struct Line {
    bytes: Vec<u8>,
    dropped: usize,
    ended: bool,
}

impl<R: BufRead> Framer<R> {
    /// A framer with the default limits ([`MAX_BODY`], [`MAX_HEADER_LINE`]).
    pub fn new(input: R) -> Self {
        Self::with_limits(input, MAX_BODY, MAX_HEADER_LINE)
    }

    /// A framer with other limits (the fuzz test uses small ones). A limit of
    /// 0 is taken as 1.
    pub fn with_limits(input: R, max_body: usize, max_line: usize) -> Self {
        Framer {
            input,
            max_body,
            max_line: max_line.max(1),
            pending: None,
            done: false,
        }
    }

    /// The next frame, or `None` once the input has ended (or cannot be read).
    pub fn next_frame(&mut self) -> Option<Frame> {
        if let Some(body) = self.pending.take() {
            return Some(Frame::Body(body));
        }
        if self.done {
            return None;
        }
        match self.header_block() {
            Ok(frame) => frame,
            Err(e) => {
                self.done = true;
                Some(Frame::Skipped(format!(
                    "cannot read the input ({e}); stopping"
                )))
            }
        }
    }

    /// Reads one header block and, when it announces a readable length, the
    /// body after it.
    fn header_block(&mut self) -> io::Result<Option<Frame>> {
        let mut length = Length::Missing;
        let mut lines = 0usize;
        // Bytes that were not (part of) a header, and the first line holding some.
        let mut skipped = 0usize;
        let mut sample: Option<Vec<u8>> = None;
        loop {
            let line = self.read_line()?;
            if !line.ended {
                self.done = true;
                if lines == 0 && line.dropped + line.bytes.len() == 0 {
                    return Ok(None);
                }
                return Ok(Some(Frame::Skipped(format!(
                    "the input ended inside a header block{}",
                    preview(sample.as_deref().unwrap_or(&line.bytes))
                ))));
            }
            if line.bytes.is_empty() && line.dropped == 0 {
                if lines == 0 {
                    // Blank lines between frames.
                    continue;
                }
                break;
            }
            lines += 1;
            let (before, rest) = split_header(&line.bytes);
            let header = parse_header(rest);
            let garbage = line.dropped
                + if header.is_some() {
                    before
                } else {
                    line.bytes.len()
                };
            if garbage > 0 && sample.is_none() {
                sample = Some(line.bytes.clone());
            }
            skipped += garbage;
            let Some((name, value)) = header else {
                continue;
            };
            if name.eq_ignore_ascii_case("content-length") {
                length = match (length, self.length_of(value)) {
                    (Length::Missing, l) => l,
                    (Length::Bytes(a), Length::Bytes(b)) if a == b => Length::Bytes(a),
                    (Length::Bytes(_), _) | (_, Length::Bytes(_)) => {
                        Length::Unreadable("given twice, with different values".into())
                    }
                    (first, _) => first,
                };
            }
            // Content-Type and any other header: JSON in UTF-8 is all there is.
        }
        let sample = preview(sample.as_deref().unwrap_or_default());
        let skipped_note = if skipped > 0 {
            format!(
                "; {} that were not a header skipped{sample}",
                bytes(skipped)
            )
        } else {
            String::new()
        };
        let frame = match length {
            Length::Bytes(n) => {
                let body = self.read_body(n)?;
                if body.len() < n {
                    self.done = true;
                    Frame::Skipped(format!(
                        "the input ended {} into a body of {}{skipped_note}",
                        bytes(body.len()),
                        bytes(n)
                    ))
                } else if skipped > 0 {
                    self.pending = Some(body);
                    Frame::Skipped(format!(
                        "skipped {} that were not a header, up to the next header block{sample}",
                        bytes(skipped)
                    ))
                } else {
                    Frame::Body(body)
                }
            }
            Length::Missing => Frame::Skipped(format!(
                "skipped a header block without Content-Length ({} line{}){skipped_note}",
                lines,
                if lines == 1 { "" } else { "s" }
            )),
            Length::Unreadable(v) => Frame::Skipped(format!(
                "skipped a header block whose Content-Length is not a length ({v}){skipped_note}"
            )),
            Length::TooLarge(v) => Frame::Skipped(format!(
                "refused a body of {v} bytes (the limit is {}): its bytes are skipped up to the next header block{skipped_note}",
                match self.max_body {
                    n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{} MiB", n >> 20),
                    n => bytes(n),
                }
            )),
        };
        Ok(Some(frame))
    }

    fn length_of(&self, value: &[u8]) -> Length {
        let shown = || format!("{:?}", String::from_utf8_lossy(truncated(value, 40)));
        if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
            return Length::Unreadable(shown());
        }
        // All ASCII digits: UTF-8, and too many of them only overflow.
        match std::str::from_utf8(value).ok().map(str::parse::<u64>) {
            Some(Ok(n)) => match usize::try_from(n) {
                Ok(n) if n <= self.max_body => Length::Bytes(n),
                _ => Length::TooLarge(n.to_string()),
            },
            _ => Length::TooLarge(format!("{} (a {}-digit number)", shown(), value.len())),
        }
    }

    /// How many bytes are buffered, reading when none are (and retrying when
    /// interrupted); 0 at the end of the input. After a non-zero answer,
    /// `fill_buf` returns those bytes without reading: after 0 it would read
    /// again, which on a terminal waits for more input.
    fn available(&mut self) -> io::Result<usize> {
        loop {
            match self.input.fill_buf() {
                Ok(b) => return Ok(b.len()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }

    /// One line, keeping at most `max_line` bytes of it (its end) however long
    /// it is; the bytes before are counted, not kept.
    fn read_line(&mut self) -> io::Result<Line> {
        let max = self.max_line;
        let mut line = Line {
            bytes: Vec::new(),
            dropped: 0,
            ended: false,
        };
        loop {
            if self.available()? == 0 {
                return Ok(line);
            }
            let buf = self.input.fill_buf()?;
            let (take, used, ended) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..i], i + 1, true),
                None => (buf, buf.len(), false),
            };
            if take.len() >= max {
                line.dropped += line.bytes.len() + take.len() - max;
                line.bytes.clear();
                line.bytes.extend_from_slice(&take[take.len() - max..]);
            } else {
                line.bytes.extend_from_slice(take);
                if line.bytes.len() > max {
                    let excess = line.bytes.len() - max;
                    line.bytes.drain(..excess);
                    line.dropped += excess;
                }
            }
            self.input.consume(used);
            if ended {
                if line.bytes.last() == Some(&b'\r') {
                    line.bytes.pop();
                }
                line.ended = true;
                return Ok(line);
            }
        }
    }

    /// Up to `n` bytes (fewer only at the end of the input), grown as they come.
    fn read_body(&mut self, n: usize) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        while body.len() < n {
            if self.available()? == 0 {
                break;
            }
            let buf = self.input.fill_buf()?;
            let k = buf.len().min(n - body.len());
            body.extend_from_slice(&buf[..k]);
            self.input.consume(k);
        }
        Ok(body)
    }
}

impl<R: BufRead> Iterator for Framer<R> {
    type Item = Frame;
    fn next(&mut self) -> Option<Frame> {
        self.next_frame()
    }
}

/// Splits a line into the bytes before its header and the header: from the
/// last `Content-Length` on when bytes come before it (resynchronising on the
/// tail of a body whose length was wrong, or on garbage), else the whole line.
fn split_header(line: &[u8]) -> (usize, &[u8]) {
    const CL: &[u8] = b"content-length";
    let at = line
        .windows(CL.len())
        .rposition(|w| w.eq_ignore_ascii_case(CL));
    match at {
        Some(i) if i > 0 && parse_header(&line[i..]).is_some() => (i, &line[i..]),
        _ => (0, line),
    }
}

/// `Name: value` with a token name; the value without surrounding blanks.
fn parse_header(line: &[u8]) -> Option<(&str, &[u8])> {
    let colon = line.iter().position(|&b| b == b':')?;
    let name = std::str::from_utf8(&line[..colon]).ok()?.trim_end();
    let token = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if name.is_empty() || !name.chars().all(token) {
        return None;
    }
    let value = line[colon + 1..].trim_ascii();
    Some((name, value))
}

fn truncated(b: &[u8], n: usize) -> &[u8] {
    &b[..b.len().min(n)]
}

/// ` ("first bytes…")` of skipped bytes, for the log.
fn preview(b: &[u8]) -> String {
    if b.is_empty() {
        return String::new();
    }
    let more = if b.len() > 40 { "…" } else { "" };
    format!(
        " ({:?}{more})",
        String::from_utf8_lossy(truncated(b, 40)).as_ref()
    )
}

fn bytes(n: usize) -> String {
    if n == 1 {
        "1 byte".into()
    } else {
        format!("{n} bytes")
    }
}

/// A body that gets an error response instead of being handled.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    /// The request's id when one could be read (a number or a string, echoed
    /// as sent), else `null`.
    pub id: Value,
    /// [`ErrorCode::ParseError`] or [`ErrorCode::InvalidRequest`].
    pub code: i32,
    pub message: String,
}

impl Invalid {
    fn new(id: Value, code: ErrorCode, message: impl Into<String>) -> Self {
        Invalid {
            id,
            code: code as i32,
            message: message.into(),
        }
    }

    /// The JSON-RPC error response. lsp-server's `Response` cannot carry a
    /// `null` id (or one that is not a string or a 32-bit integer), so this is
    /// written as JSON of its own.
    pub fn response(&self) -> Value {
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": self.id,
            "error": {"code": self.code, "message": self.message},
        })
    }
}

/// What a body is.
#[derive(Debug)]
pub enum Decoded {
    Message(Message),
    /// Not JSON, or not a JSON-RPC request or notification: answer with this.
    Invalid(Invalid),
    /// A malformed response from the client: JSON-RPC answers no response, so
    /// this is only logged.
    Ignored(String),
}

/// Decodes one body into a message. Requests need an id that is a string or a
/// 32-bit integer (what lsp-server's `RequestId` holds); `params` may be
/// anything (each handler reads its own and answers `null` when they do not fit).
pub fn decode(body: &[u8]) -> Decoded {
    let null = || Value::Null;
    if let Err(e) = std::str::from_utf8(body) {
        return Decoded::Invalid(Invalid::new(
            null(),
            ErrorCode::ParseError,
            format!("Parse error: the body is not UTF-8 ({e})"),
        ));
    }
    // serde_json stops at 128 levels of nesting, so deep input cannot overflow the stack.
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return Decoded::Invalid(Invalid::new(
                null(),
                ErrorCode::ParseError,
                format!("Parse error: the body is not JSON ({e})"),
            ))
        }
    };
    let Value::Object(mut obj) = value else {
        let what = match value {
            Value::Array(_) => "an array (batches are not part of LSP)",
            Value::String(_) => "a string",
            Value::Number(_) => "a number",
            Value::Bool(_) => "a boolean",
            _ => "null",
        };
        return Decoded::Invalid(Invalid::new(
            null(),
            ErrorCode::InvalidRequest,
            format!("Invalid Request: a JSON-RPC message is an object, not {what}"),
        ));
    };
    let raw_id = obj.get("id").cloned();
    let echo = match &raw_id {
        Some(v @ (Value::Number(_) | Value::String(_))) => v.clone(),
        _ => null(),
    };
    let invalid = |message: String| {
        Decoded::Invalid(Invalid::new(
            echo.clone(),
            ErrorCode::InvalidRequest,
            format!("Invalid Request: {message}"),
        ))
    };
    match obj.get("jsonrpc") {
        None => {}
        Some(Value::String(v)) if v == "2.0" => {}
        Some(v) => return invalid(format!("`jsonrpc` must be \"2.0\", not {}", short(v))),
    }
    match obj.remove("method") {
        Some(Value::String(method)) => {
            let params = obj.remove("params").unwrap_or(Value::Null);
            let method_shown = clip(&method, 80);
            match raw_id {
                None => Decoded::Message(Message::Notification(Notification { method, params })),
                Some(id) => match request_id(&id) {
                    Some(id) => Decoded::Message(Message::Request(Request { id, method, params })),
                    None => invalid(format!(
                        "the id of `{method_shown}` must be a string or a 32-bit integer, not {}",
                        short(&id)
                    )),
                },
            }
        }
        Some(m) => invalid(format!("`method` must be a string, not {}", short(&m))),
        None if raw_id.is_some() && (obj.contains_key("result") || obj.contains_key("error")) => {
            match serde_json::from_value::<Response>(Value::Object(obj)) {
                Ok(r) => Decoded::Message(Message::Response(r)),
                Err(e) => Decoded::Ignored(format!(
                    "dropped a malformed response ({})",
                    clip(&e.to_string(), 200)
                )),
            }
        }
        None => invalid(
            "a message needs a `method` (a request or a notification), or an `id` and a `result` or `error` (a response)"
                .into(),
        ),
    }
}

fn request_id(id: &Value) -> Option<RequestId> {
    match id {
        Value::String(s) => Some(RequestId::from(s.clone())),
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .map(RequestId::from),
        _ => None,
    }
}

/// A value for a message: its JSON, cut to 60 characters.
fn short(v: &Value) -> String {
    clip(&v.to_string(), 60)
}

/// `s` cut to `n` characters (with `…` when cut), so that messages and log
/// lines stay short whatever the input holds.
pub fn clip(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// What the reader hands the server loop.
#[derive(Debug)]
pub enum Incoming {
    Message(Message),
    /// Answer with this error response.
    Invalid(Invalid),
    /// Something was skipped: log this line.
    Log(String),
}

/// Reads `input` to its end, handing each message, error to answer and line to
/// log to `deliver`; stops early when `deliver` returns `false` (the server is
/// gone) or once an `exit` notification has been delivered.
pub fn read_messages<R: BufRead>(input: R, mut deliver: impl FnMut(Incoming) -> bool) {
    let mut framer = Framer::new(input);
    while let Some(frame) = framer.next_frame() {
        let incoming = match frame {
            Frame::Skipped(why) => Incoming::Log(why),
            Frame::Body(body) => match decode(&body) {
                Decoded::Message(m) => Incoming::Message(m),
                Decoded::Invalid(i) => Incoming::Invalid(i),
                Decoded::Ignored(why) => Incoming::Log(why),
            },
        };
        let exit =
            matches!(&incoming, Incoming::Message(Message::Notification(n)) if n.method == "exit");
        if !deliver(incoming) || exit {
            return;
        }
    }
}
