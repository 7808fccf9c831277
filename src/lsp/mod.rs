//! `shardc lsp`: a language server on stdio. It runs the same
//! `world::compile` as the CLI on every open or edit, publishes the diagnostics,
//! answers hovers with the inferred type of the binding under the cursor, and
//! formats documents as `shardc fmt` does.
//!
//! Input is read by [`transport`] on a thread of its own, which never stops at
//! malformed input: a body that is not a JSON-RPC message is answered with a
//! protocol error, a broken header block is logged (on stderr) and skipped, and
//! the end of the input ends the server. Each message is handled under
//! `catch_unwind`, so a bug in one handler answers an internal error instead
//! of ending the session. Output uses lsp-server's `Message` and its writer.

pub mod transport;

use crate::check::TypeEntry;
use crate::diag::Severity;
use crate::files::{Disk, Overlay};
use crate::world::{self, Options};
use lsp_server::{ErrorCode, Message, Notification, Request, Response};
use lsp_types::notification::{
    DidChangeTextDocument, DidOpenTextDocument, Notification as _, PublishDiagnostics,
};
use lsp_types::request::{Formatting, HoverRequest, Initialize, Request as _, Shutdown};
use lsp_types::{
    Diagnostic, DiagnosticSeverity, Hover, HoverContents, HoverProviderCapability, MarkupContent,
    MarkupKind, NumberOrString, OneOf, Position, PublishDiagnosticsParams, Range,
    ServerCapabilities, TextDocumentSyncCapability, TextDocumentSyncKind, TextEdit, Uri,
};
use serde_json::Value;
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::process::ExitCode;
use transport::{clip, Incoming};

fn path_of(uri: &Uri) -> PathBuf {
    let s = uri.as_str();
    let raw = s.strip_prefix("file://").unwrap_or(s);
    // Undo percent-encoding (spaces and friends in paths).
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            // Two hex digits (`get`: a slice that is not, never a panic).
            let hex = raw
                .get(i + 1..i + 3)
                .filter(|h| h.bytes().all(|c| c.is_ascii_hexdigit()));
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    PathBuf::from(String::from_utf8_lossy(&out).into_owned())
}

/// LSP positions: 0-based line and character.
fn position(text: &str, offset: usize) -> Position {
    let before = text.get(..offset.min(text.len())).unwrap_or("");
    let line = before.matches('\n').count();
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count());
    Position {
        line: line as u32,
        character: col as u32,
    }
}

fn offset(text: &str, p: Position) -> usize {
    let mut off = 0;
    for (i, l) in text.split('\n').enumerate() {
        if i == p.line as usize {
            return off
                + l.char_indices()
                    .nth(p.character as usize)
                    .map_or(l.len(), |(b, _)| b);
        }
        off += l.len() + 1;
    }
    text.len()
}

struct Doc {
    text: String,
    types: Vec<(usize, usize, TypeEntry)>,
    /// No syntax error: formatting is offered only then (as `shardc fmt`).
    parses: bool,
}

/// Compiles `text` as the document `uri`, records it in `docs` and returns its
/// `publishDiagnostics` notification.
fn check(uri: &Uri, text: String, docs: &mut HashMap<String, Doc>) -> Notification {
    // Imports are read from the open buffers first, then the disk.
    let mut files = Overlay::new(&Disk);
    for (u, d) in docs.iter() {
        if let Ok(u) = u.parse::<Uri>() {
            files.insert(path_of(&u), d.text.clone());
        }
    }
    files.insert(path_of(uri), text.clone());
    let c = world::compile_text(&files, &path_of(uri), text.clone(), &Options::default());
    let root = c.program.root;
    let diagnostics: Vec<Diagnostic> = c
        .diagnostics
        .iter()
        .filter(|d| d.primary.span.file == root)
        .map(|d| {
            let mut message = d.message.clone();
            if let Some(h) = &d.help {
                message.push_str(&format!("\nhelp: {h}"));
            }
            for n in &d.notes {
                message.push_str(&format!("\nnote: {n}"));
            }
            Diagnostic {
                range: Range {
                    start: position(&text, d.primary.span.start as usize),
                    end: position(&text, d.primary.span.end as usize),
                },
                severity: Some(match d.severity {
                    Severity::Error => DiagnosticSeverity::ERROR,
                    Severity::Warning => DiagnosticSeverity::WARNING,
                    Severity::Note => DiagnosticSeverity::INFORMATION,
                }),
                code: Some(NumberOrString::String(d.code.as_str().to_string())),
                source: Some("shardc".into()),
                message,
                ..Diagnostic::default()
            }
        })
        .collect();
    let params = PublishDiagnosticsParams {
        uri: uri.clone(),
        diagnostics,
        version: None,
    };
    let note = Notification {
        method: PublishDiagnostics::METHOD.to_string(),
        params: serde_json::to_value(params).unwrap_or_default(),
    };
    let types = c
        .checked
        .types
        .iter()
        .filter(|t| t.span.file == root)
        .map(|t| (t.span.start as usize, t.span.end as usize, t.clone()))
        .collect();
    let parses = !c
        .diagnostics
        .iter()
        .any(|d| d.code == crate::diag::Code::E0001 && d.primary.span.file == root);
    docs.insert(
        uri.as_str().to_string(),
        Doc {
            text,
            types,
            parses,
        },
    );
    note
}

/// `textDocument/formatting`: `shardc fmt`'s output as one edit of the whole
/// document; none when it is formatted or does not parse.
fn formatting(
    p: lsp_types::DocumentFormattingParams,
    docs: &HashMap<String, Doc>,
) -> Option<Vec<TextEdit>> {
    let doc = docs.get(p.text_document.uri.as_str())?;
    if !doc.parses {
        return None;
    }
    let new_text = crate::fmt::format(&doc.text);
    if new_text == doc.text {
        return Some(vec![]);
    }
    Some(vec![TextEdit {
        range: Range {
            start: Position::new(0, 0),
            end: position(&doc.text, doc.text.len()),
        },
        new_text,
    }])
}

fn hover(p: lsp_types::HoverParams, docs: &HashMap<String, Doc>) -> Option<Hover> {
    let doc = docs.get(p.text_document_position_params.text_document.uri.as_str())?;
    let at = offset(&doc.text, p.text_document_position_params.position);
    let (_, _, t) = doc.types.iter().find(|(s, e, _)| *s <= at && at <= *e)?;
    let mut value = format!(
        "```shard\n{}: {}\n```\nper device: `{}`",
        t.name, t.ty, t.local
    );
    if let Some(u) = &t.used_as {
        value.push_str(&format!("\n\ngathered for use: `{u}`"));
    }
    if let Some((ty, mesh)) = &t.layout {
        // Where the pieces live, as `shardc show` draws it.
        let topo = crate::mesh::Topology::of(mesh);
        let grid = crate::layout::draw(&t.name, ty, &topo, None);
        let grid: String = grid.lines().skip(1).map(|l| format!("{l}\n")).collect();
        value.push_str(&format!("\n\n```text\n{grid}```"));
    }
    Some(Hover {
        contents: HoverContents::Markup(MarkupContent {
            kind: MarkupKind::Markdown,
            value,
        }),
        range: None,
    })
}

/// How a session ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// `exit` after `shutdown`.
    Exit,
    /// `exit` without `shutdown` first (exit code 1, as the protocol says).
    ExitWithoutShutdown,
    /// The input ended (the client closed it).
    InputEnded,
    /// The output could not be written (the client stopped reading).
    OutputClosed,
    /// The reader thread could not be started.
    NoReader,
}

/// What [`serve`] reports when a session ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Session {
    pub end: End,
    /// Messages whose handling panicked (each logged, and answered with an
    /// internal error when it was a request). A bug when not 0.
    pub panics: usize,
    /// The reader thread panicked (a bug in [`transport`]); the session then
    /// ends as if the input had.
    pub reader_panicked: bool,
}

impl Session {
    /// The process's exit code: 0 after `exit` with `shutdown` or at the end of
    /// the input, 1 for `exit` without `shutdown` or a closed output, 2 when
    /// the server could not start.
    pub fn exit_code(&self) -> u8 {
        match self.end {
            End::Exit | End::InputEnded => 0,
            End::ExitWithoutShutdown | End::OutputClosed => 1,
            End::NoReader => 2,
        }
    }
}

/// `shardc lsp`: serves stdin and stdout, logging to stderr.
pub fn run() -> ExitCode {
    let input = std::io::BufReader::with_capacity(64 << 10, std::io::stdin());
    let session = serve(input, std::io::stdout().lock(), &mut std::io::stderr());
    // A reader still blocked on stdin (after an `exit`, or a closed stdout)
    // ends with the process.
    ExitCode::from(session.exit_code())
}

/// Serves one client: reads messages from `input` on a thread of its own
/// ([`transport::read_messages`]), handles them on this one, writes responses
/// and notifications to `output` and a line per skipped or malformed input to
/// `log`. Returns at `exit`, at the end of `input`, or when `output` fails;
/// never because of what `input` holds. In the first two cases the reader has
/// stopped; after a failed `output` it may still be blocked on `input`, and is
/// left to stop at its next message.
pub fn serve<R, W>(input: R, output: W, log: &mut dyn Write) -> Session
where
    R: BufRead + Send + 'static,
    W: Write,
{
    // A short queue: the reader stays at most two messages ahead.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Incoming>(2);
    let reader = std::thread::Builder::new()
        .name("shardc-lsp-reader".into())
        .spawn(move || transport::read_messages(input, |m| tx.send(m).is_ok()));
    let mut session = Session {
        end: End::InputEnded,
        panics: 0,
        reader_panicked: false,
    };
    let reader = match reader {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(log, "shardc lsp: cannot start the reader thread: {e}");
            session.end = End::NoReader;
            return session;
        }
    };
    let mut server = Server {
        out: output,
        log,
        docs: HashMap::new(),
        state: State::Uninitialized,
        output_closed: false,
    };
    for incoming in rx.iter() {
        match incoming {
            Incoming::Log(line) => server.log(&line),
            Incoming::Invalid(invalid) => {
                server.log(&format!("answered: {}", invalid.message));
                server.send_value(&invalid.response());
            }
            Incoming::Message(msg) => {
                let request = match &msg {
                    Message::Request(r) => Some((r.id.clone(), clip(&r.method, 80))),
                    _ => None,
                };
                match catch_unwind(AssertUnwindSafe(|| server.handle(msg))) {
                    Ok(None) => {}
                    Ok(Some(end)) => {
                        session.end = end;
                        break;
                    }
                    Err(payload) => {
                        session.panics += 1;
                        let what = payload
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| payload.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "a panic".into());
                        server.log(&format!(
                            "internal error (a bug) handling a message: {what}"
                        ));
                        if let Some((id, method)) = request {
                            server.send(Message::Response(Response::new_err(
                                id,
                                ErrorCode::InternalError as i32,
                                format!("shardc lsp failed on `{method}` (a bug): {what}"),
                            )));
                        }
                    }
                }
            }
        }
        if server.output_closed {
            session.end = End::OutputClosed;
            break;
        }
    }
    drop(rx);
    if session.end != End::OutputClosed {
        session.reader_panicked = reader.join().is_err();
        if session.reader_panicked {
            server.log("the reader stopped on an internal error (a bug); stopping");
        }
    }
    session
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Uninitialized,
    Running,
    ShutDown,
}

/// The server's side of a session: the open documents and the output.
struct Server<'a, W: Write> {
    out: W,
    log: &'a mut dyn Write,
    docs: HashMap<String, Doc>,
    state: State,
    output_closed: bool,
}

/// An error response's code and message.
type Refusal = (ErrorCode, String);

fn params<P: serde::de::DeserializeOwned>(req: &Request) -> Result<P, Refusal> {
    serde_json::from_value(req.params.clone()).map_err(|e| {
        (
            ErrorCode::InvalidParams,
            format!(
                "the params of `{}` do not fit: {}",
                clip(&req.method, 80),
                clip(&e.to_string(), 200)
            ),
        )
    })
}

fn capabilities() -> Result<Value, Refusal> {
    let caps = ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Kind(TextDocumentSyncKind::FULL)),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        document_formatting_provider: Some(OneOf::Left(true)),
        ..ServerCapabilities::default()
    };
    let caps = serde_json::to_value(caps).map_err(|e| (ErrorCode::InternalError, e.to_string()))?;
    Ok(serde_json::json!({
        "capabilities": caps,
        "serverInfo": {"name": "shardc", "version": env!("CARGO_PKG_VERSION")},
    }))
}

impl<W: Write> Server<'_, W> {
    fn log(&mut self, line: &str) {
        let _ = writeln!(self.log, "shardc lsp: {line}");
    }

    fn send(&mut self, msg: Message) {
        if self.output_closed {
            return;
        }
        if let Err(e) = msg.write(&mut self.out) {
            self.log(&format!("cannot write to the client ({e}); stopping"));
            self.output_closed = true;
        }
    }

    /// A message lsp-server's types cannot hold (an error response whose id
    /// is `null`), framed as its writer frames.
    fn send_value(&mut self, v: &Value) {
        if self.output_closed {
            return;
        }
        let text = v.to_string();
        let r = write!(self.out, "Content-Length: {}\r\n\r\n{text}", text.len())
            .and_then(|()| self.out.flush());
        if let Err(e) = r {
            self.log(&format!("cannot write to the client ({e}); stopping"));
            self.output_closed = true;
        }
    }

    /// Handles one message; `Some` when it ends the session.
    fn handle(&mut self, msg: Message) -> Option<End> {
        match msg {
            Message::Request(req) => self.request(req),
            Message::Notification(n) if n.method == "exit" => {
                return Some(match self.state {
                    State::ShutDown => End::Exit,
                    _ => End::ExitWithoutShutdown,
                });
            }
            Message::Notification(n) => self.notification(n),
            // The server sends no requests, so no response is awaited.
            Message::Response(_) => {}
        }
        None
    }

    fn request(&mut self, req: Request) {
        let answer: Result<Value, Refusal> = match (self.state, req.method.as_str()) {
            (State::Uninitialized, Initialize::METHOD) => {
                self.state = State::Running;
                capabilities()
            }
            (State::Uninitialized, m) => Err((
                ErrorCode::ServerNotInitialized,
                format!("`{}` before `initialize`", clip(m, 80)),
            )),
            (State::ShutDown, m) => Err((
                ErrorCode::InvalidRequest,
                format!(
                    "`{}` after `shutdown`: only the `exit` notification is expected",
                    clip(m, 80)
                ),
            )),
            (State::Running, Initialize::METHOD) => Err((
                ErrorCode::InvalidRequest,
                "`initialize` was already sent".into(),
            )),
            (State::Running, Shutdown::METHOD) => {
                self.state = State::ShutDown;
                Ok(Value::Null)
            }
            (State::Running, HoverRequest::METHOD) => params(&req).and_then(|p| {
                serde_json::to_value(hover(p, &self.docs))
                    .map_err(|e| (ErrorCode::InternalError, e.to_string()))
            }),
            (State::Running, Formatting::METHOD) => params(&req).and_then(|p| {
                serde_json::to_value(formatting(p, &self.docs))
                    .map_err(|e| (ErrorCode::InternalError, e.to_string()))
            }),
            // Every request gets an answer, or the client waits for it.
            (State::Running, m) => Err((
                ErrorCode::MethodNotFound,
                format!("shardc lsp does not handle `{}`", clip(m, 80)),
            )),
        };
        let response = match answer {
            Ok(result) => Response {
                id: req.id,
                result: Some(result),
                error: None,
            },
            Err((code, message)) => Response::new_err(req.id, code as i32, message),
        };
        self.send(Message::Response(response));
    }

    fn notification(&mut self, n: Notification) {
        // Before `initialize` notifications are dropped (the protocol says so),
        // and after `shutdown` there is nothing left to do.
        if self.state != State::Running {
            return;
        }
        let note = if n.method == DidOpenTextDocument::METHOD {
            serde_json::from_value::<lsp_types::DidOpenTextDocumentParams>(n.params).map(|p| {
                Some(check(
                    &p.text_document.uri,
                    p.text_document.text,
                    &mut self.docs,
                ))
            })
        } else if n.method == DidChangeTextDocument::METHOD {
            serde_json::from_value::<lsp_types::DidChangeTextDocumentParams>(n.params).map(|p| {
                let uri = p.text_document.uri;
                let last = p.content_changes.into_iter().last();
                last.map(|c| check(&uri, c.text, &mut self.docs))
            })
        } else {
            Ok(None)
        };
        match note {
            Ok(Some(note)) => self.send(Message::Notification(note)),
            Ok(None) => {}
            Err(e) => self.log(&format!(
                "ignored `{}`: its params do not fit ({e})",
                n.method
            )),
        }
    }
}
