//! `shardc lsp`: a language server on stdio. Every open buffer is compiled
//! with the same `world::compile_text` as the CLI, with all open buffers laid
//! over the disk ([`state`]); diagnostics go to the file they are in (and to
//! the importer, at the import); navigation, references, rename, hover,
//! completion, signature help, inlay hints, code actions, symbols, semantic
//! tokens, folding and the call hierarchy of layers read an index of each
//! compilation ([`index`], [`nav`], [`complete`], [`outline`], [`calls`]); references and rename also read the `.shard`
//! files of the workspace folders named at `initialize` ([`workspace`]).
//! Positions are UTF-16 unless the client offers UTF-8 or UTF-32 ([`text`]).
//!
//! Input is read by [`transport`] on a thread of its own, which never stops at
//! malformed input: a body that is not a JSON-RPC message is answered with a
//! protocol error, a broken header block is logged (on stderr) and skipped, and
//! the end of the input ends the server. Edits only update the buffers; the
//! queued messages are drained before anything is re-checked, so a burst of
//! `didChange`s costs one check (the latest edit wins). Each message is
//! handled under `catch_unwind`, so a bug in one handler answers an internal
//! error instead of ending the session. Output uses lsp-server's `Message`
//! and its writer.

pub mod calls;
pub mod complete;
pub mod index;
pub mod nav;
pub mod outline;
pub mod state;
pub use state::DEFAULT_MAX_DOCUMENT;
pub mod text;
pub mod transport;
pub mod workspace;

use crate::world::Options;
use lsp_server::{ErrorCode, Message, Notification, Request, Response};
use lsp_types::notification::{
    DidChangeTextDocument, DidChangeWatchedFiles, DidChangeWorkspaceFolders, DidCloseTextDocument,
    DidOpenTextDocument, DidSaveTextDocument, Notification as _, PublishDiagnostics,
};
use lsp_types::request::{
    CodeActionRequest, Completion, DocumentHighlightRequest, DocumentSymbolRequest,
    FoldingRangeRequest, Formatting, GotoDefinition, HoverRequest, Initialize, InlayHintRequest,
    PrepareRenameRequest, References, Rename, Request as _, SemanticTokensFullRequest,
    SemanticTokensRangeRequest, Shutdown, SignatureHelpRequest,
};
use lsp_types::{
    CodeActionKind, CodeActionOptions, CodeActionProviderCapability, CompletionOptions,
    FoldingRangeProviderCapability, HoverProviderCapability, OneOf, RenameOptions,
    SemanticTokensFullOptions, SemanticTokensOptions, SemanticTokensServerCapabilities,
    ServerCapabilities, SignatureHelpOptions, TextDocumentSyncCapability, TextDocumentSyncKind,
    TextDocumentSyncOptions, TextDocumentSyncSaveOptions, WorkspaceFoldersServerCapabilities,
    WorkspaceServerCapabilities,
};
use serde_json::Value;
use std::io::{BufRead, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::process::ExitCode;
use transport::{clip, Incoming};

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
    run_with(Options::default(), state::DEFAULT_MAX_DOCUMENT)
}

/// `shardc lsp` with the command line's options (`--strict`): every file is
/// checked with them; buffers over `max_document` bytes are not analysed
/// (unless the client's `maxDocumentBytes` says otherwise).
pub fn run_with(opts: Options, max_document: usize) -> ExitCode {
    let input = std::io::BufReader::with_capacity(64 << 10, std::io::stdin());
    let session = serve_with(
        input,
        std::io::stdout().lock(),
        &mut std::io::stderr(),
        opts,
        max_document,
    );
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
    serve_with(
        input,
        output,
        log,
        Options::default(),
        state::DEFAULT_MAX_DOCUMENT,
    )
}

/// [`serve`], checking every file with `opts` and analysing buffers of at most
/// `max_document` bytes.
pub fn serve_with<R, W>(
    input: R,
    output: W,
    log: &mut dyn Write,
    opts: Options,
    max_document: usize,
) -> Session
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
    // Items of a buffer an edit did not touch are not parsed again.
    crate::reparse::remember();
    // Layers' checked functions an edit did not touch are not checked again.
    crate::check::remember();
    let mut st = state::State::new(opts);
    st.max_document = max_document;
    let mut server = Server {
        out: output,
        log,
        st,
        phase: Phase::Uninitialized,
        output_closed: false,
        watch_by_registration: false,
    };
    'session: loop {
        // While some buffer waits for its full check, wait only for a pause.
        let first = if server.st.settling() {
            match rx.recv_timeout(PAUSE) {
                Ok(m) => m,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                    server.settle(&mut session, None);
                    continue;
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        } else {
            match rx.recv() {
                Ok(m) => m,
                Err(_) => break,
            }
        };
        // Handle what came, then everything already queued behind it, and
        // only then re-check: queued edits cost one check.
        let mut next = Some(first);
        while let Some(incoming) = next.take() {
            if let Some(end) = server.incoming(incoming, &mut session) {
                session.end = end;
                break 'session;
            }
            if server.output_closed {
                break;
            }
            next = rx.try_recv().ok();
        }
        server.flush(&mut session);
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
enum Phase {
    Uninitialized,
    Running,
    ShutDown,
}

/// The server's side of a session: the workspace state and the output.
struct Server<'a, W: Write> {
    out: W,
    log: &'a mut dyn Write,
    st: state::State,
    phase: Phase,
    output_closed: bool,
    /// The client registers file watchers the server asks for (Neovim,
    /// Helix): on `initialized` it is asked to watch `**/*.shard`, so a
    /// file changed on disk re-checks what imports it.
    watch_by_registration: bool,
}

/// An error response's code and message.
type Refusal = (ErrorCode, String);

/// How long the input stays quiet before the buffers checked quickly at
/// each edit get their plans and data checks ([`state::State::settle`]).
pub const PAUSE: std::time::Duration = std::time::Duration::from_millis(300);

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

fn json<T: serde::Serialize>(v: T) -> Result<Value, Refusal> {
    serde_json::to_value(v).map_err(|e| (ErrorCode::InternalError, e.to_string()))
}

fn capabilities(enc: text::Encoding) -> Result<Value, Refusal> {
    let caps = ServerCapabilities {
        position_encoding: Some(enc.kind()),
        text_document_sync: Some(TextDocumentSyncCapability::Options(
            TextDocumentSyncOptions {
                open_close: Some(true),
                change: Some(TextDocumentSyncKind::INCREMENTAL),
                save: Some(TextDocumentSyncSaveOptions::Supported(true)),
                ..TextDocumentSyncOptions::default()
            },
        )),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        document_formatting_provider: Some(OneOf::Left(true)),
        definition_provider: Some(OneOf::Left(true)),
        references_provider: Some(OneOf::Left(true)),
        document_highlight_provider: Some(OneOf::Left(true)),
        rename_provider: Some(OneOf::Right(RenameOptions {
            prepare_provider: Some(true),
            work_done_progress_options: Default::default(),
        })),
        completion_provider: Some(CompletionOptions {
            trigger_characters: Some(complete::TRIGGERS.iter().map(|s| s.to_string()).collect()),
            ..CompletionOptions::default()
        }),
        signature_help_provider: Some(SignatureHelpOptions {
            trigger_characters: Some(vec!["(".into(), ",".into()]),
            retrigger_characters: None,
            work_done_progress_options: Default::default(),
        }),
        inlay_hint_provider: Some(OneOf::Left(true)),
        code_action_provider: Some(CodeActionProviderCapability::Options(CodeActionOptions {
            code_action_kinds: Some(vec![CodeActionKind::QUICKFIX]),
            ..CodeActionOptions::default()
        })),
        document_symbol_provider: Some(OneOf::Left(true)),
        semantic_tokens_provider: Some(SemanticTokensServerCapabilities::SemanticTokensOptions(
            SemanticTokensOptions {
                legend: outline::legend(),
                full: Some(SemanticTokensFullOptions::Bool(true)),
                range: Some(true),
                work_done_progress_options: Default::default(),
            },
        )),
        folding_range_provider: Some(FoldingRangeProviderCapability::Simple(true)),
        workspace_symbol_provider: Some(OneOf::Left(true)),
        call_hierarchy_provider: Some(lsp_types::CallHierarchyServerCapability::Simple(true)),
        code_lens_provider: Some(lsp_types::CodeLensOptions {
            resolve_provider: Some(false),
        }),
        document_link_provider: Some(lsp_types::DocumentLinkOptions {
            resolve_provider: Some(false),
            work_done_progress_options: Default::default(),
        }),
        workspace: Some(WorkspaceServerCapabilities {
            workspace_folders: Some(WorkspaceFoldersServerCapabilities {
                supported: Some(true),
                change_notifications: Some(OneOf::Left(true)),
            }),
            file_operations: None,
        }),
        ..ServerCapabilities::default()
    };
    Ok(serde_json::json!({
        "capabilities": json(caps)?,
        "serverInfo": {"name": "shardc", "version": env!("CARGO_PKG_VERSION")},
    }))
}

/// A panic's message.
fn what(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
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

    /// One thing from the reader; `Some` when it ends the session.
    fn incoming(&mut self, incoming: Incoming, session: &mut Session) -> Option<End> {
        match incoming {
            Incoming::Log(line) => self.log(&line),
            Incoming::Invalid(invalid) => {
                self.log(&format!("answered: {}", invalid.message));
                self.send_value(&invalid.response());
            }
            Incoming::Message(msg) => {
                let request = match &msg {
                    Message::Request(r) => Some((r.id.clone(), clip(&r.method, 80))),
                    _ => None,
                };
                match catch_unwind(AssertUnwindSafe(|| self.handle(msg, session))) {
                    Ok(end) => return end,
                    Err(payload) => {
                        session.panics += 1;
                        let what = what(payload.as_ref());
                        self.log(&format!(
                            "internal error (a bug) handling a message: {what}"
                        ));
                        if let Some((id, method)) = request {
                            self.send(Message::Response(Response::new_err(
                                id,
                                ErrorCode::InternalError as i32,
                                format!("shardc lsp failed on `{method}` (a bug): {what}"),
                            )));
                        }
                    }
                }
            }
        }
        None
    }

    /// Re-checks what the handled messages changed and publishes.
    fn flush(&mut self, session: &mut Session) {
        if self.st.pending() {
            self.check(session, "checking the buffers", |st| st.flush());
        }
    }

    /// The full check of the buffers checked quickly (or of one of them),
    /// published where it changed what a file shows.
    fn settle(&mut self, session: &mut Session, only: Option<&std::path::Path>) {
        if self.st.settling() {
            self.check(session, "checking the buffers fully", |st| st.settle(only));
        }
    }

    /// Runs a check of the state under `catch_unwind` and sends the
    /// diagnostics it returns; a panic is logged as a bug in `doing`.
    fn check(
        &mut self,
        session: &mut Session,
        doing: &str,
        run: impl FnOnce(&mut state::State) -> Vec<lsp_types::PublishDiagnosticsParams>,
    ) {
        match catch_unwind(AssertUnwindSafe(|| run(&mut self.st))) {
            Ok(notes) => {
                for p in notes {
                    self.send(Message::Notification(Notification {
                        method: PublishDiagnostics::METHOD.to_string(),
                        params: serde_json::to_value(p).unwrap_or_default(),
                    }));
                }
            }
            Err(payload) => {
                session.panics += 1;
                let what = what(payload.as_ref());
                self.log(&format!("internal error (a bug) {doing}: {what}"));
            }
        }
    }

    /// Handles one message; `Some` when it ends the session.
    fn handle(&mut self, msg: Message, session: &mut Session) -> Option<End> {
        match msg {
            Message::Request(req) => {
                // Answers are about the buffers as they are now.
                self.flush(session);
                // Code lenses and hovers show the plan's figures: the
                // buffer asked about gets its full check first.
                if [
                    lsp_types::request::CodeLensRequest::METHOD,
                    HoverRequest::METHOD,
                ]
                .contains(&req.method.as_str())
                {
                    let key = req
                        .params
                        .pointer("/textDocument/uri")
                        .and_then(|u| serde_json::from_value::<lsp_types::Uri>(u.clone()).ok())
                        .map(|u| state::State::key_of(&u));
                    if let Some(key) = key {
                        self.settle(session, Some(&key));
                    }
                }
                // The index, types and lenses the last checks built.
                if let Err(what) = self.st.finish() {
                    session.panics += 1;
                    self.log(&format!("internal error (a bug) {what}"));
                }
                self.request(req);
            }
            Message::Notification(n) if n.method == "exit" => {
                return Some(match self.phase {
                    Phase::ShutDown => End::Exit,
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
        let st = &self.st;
        let answer: Result<Value, Refusal> = match (self.phase, req.method.as_str()) {
            (Phase::Uninitialized, Initialize::METHOD) => {
                // A client whose capabilities do not fit still gets UTF-16.
                let caps = req
                    .params
                    .get("capabilities")
                    .cloned()
                    .and_then(|c| serde_json::from_value(c).ok())
                    .unwrap_or_default();
                self.st.enc = text::Encoding::negotiate(&caps);
                self.watch_by_registration = caps
                    .workspace
                    .as_ref()
                    .and_then(|w| w.did_change_watched_files.as_ref())
                    .and_then(|d| d.dynamic_registration)
                    == Some(true);
                self.st.watched = self.watch_by_registration;
                self.st.roots = workspace::roots_of(&req.params);
                if let Some(n) = req
                    .params
                    .pointer("/initializationOptions/maxDocumentBytes")
                    .and_then(Value::as_u64)
                    .filter(|n| *n > 0)
                {
                    self.st.max_document = usize::try_from(n).unwrap_or(usize::MAX);
                }
                self.phase = Phase::Running;
                capabilities(self.st.enc)
            }
            (Phase::Uninitialized, m) => Err((
                ErrorCode::ServerNotInitialized,
                format!("`{}` before `initialize`", clip(m, 80)),
            )),
            (Phase::ShutDown, m) => Err((
                ErrorCode::InvalidRequest,
                format!(
                    "`{}` after `shutdown`: only the `exit` notification is expected",
                    clip(m, 80)
                ),
            )),
            (Phase::Running, Initialize::METHOD) => Err((
                ErrorCode::InvalidRequest,
                "`initialize` was already sent".into(),
            )),
            (Phase::Running, Shutdown::METHOD) => {
                self.phase = Phase::ShutDown;
                Ok(Value::Null)
            }
            (Phase::Running, HoverRequest::METHOD) => {
                params(&req).and_then(|p| json(nav::hover(st, p)))
            }
            (Phase::Running, Formatting::METHOD) => {
                params(&req).and_then(|p| json(outline::formatting(st, p)))
            }
            (Phase::Running, GotoDefinition::METHOD) => {
                params(&req).and_then(|p| json(nav::definition(st, p)))
            }
            (Phase::Running, References::METHOD) => {
                params(&req).and_then(|p| json(nav::references(st, p)))
            }
            (Phase::Running, DocumentHighlightRequest::METHOD) => {
                params(&req).and_then(|p| json(nav::highlight(st, p)))
            }
            (Phase::Running, PrepareRenameRequest::METHOD) => {
                params(&req).and_then(|p| nav::prepare_rename(st, p).and_then(json))
            }
            (Phase::Running, Rename::METHOD) => {
                params(&req).and_then(|p| nav::rename(st, p).and_then(json))
            }
            (Phase::Running, Completion::METHOD) => {
                params(&req).and_then(|p| json(complete::completion(st, p)))
            }
            (Phase::Running, SignatureHelpRequest::METHOD) => {
                params(&req).and_then(|p| json(complete::signature_help(st, p)))
            }
            (Phase::Running, InlayHintRequest::METHOD) => {
                params(&req).and_then(|p| json(outline::inlay_hints(st, p)))
            }
            (Phase::Running, CodeActionRequest::METHOD) => {
                params(&req).and_then(|p| json(outline::code_actions(st, p)))
            }
            (Phase::Running, DocumentSymbolRequest::METHOD) => {
                params(&req).and_then(|p| json(outline::symbols(st, p)))
            }
            (Phase::Running, SemanticTokensFullRequest::METHOD) => {
                params(&req).and_then(|p| json(outline::semantic_tokens(st, p)))
            }
            (Phase::Running, SemanticTokensRangeRequest::METHOD) => {
                params(&req).and_then(|p| json(outline::semantic_tokens_range(st, p)))
            }
            (Phase::Running, FoldingRangeRequest::METHOD) => {
                params(&req).and_then(|p| json(outline::folding(st, p)))
            }
            (Phase::Running, lsp_types::request::WorkspaceSymbolRequest::METHOD) => {
                params(&req).and_then(|p| json(nav::workspace_symbols(st, p)))
            }
            (Phase::Running, lsp_types::request::CodeLensRequest::METHOD) => {
                params(&req).and_then(|p| json(outline::code_lens(st, p)))
            }
            (Phase::Running, lsp_types::request::DocumentLinkRequest::METHOD) => {
                params(&req).and_then(|p| json(nav::document_links(st, p)))
            }
            (Phase::Running, lsp_types::request::CallHierarchyPrepare::METHOD) => {
                params(&req).and_then(|p| json(calls::prepare(st, p)))
            }
            (Phase::Running, lsp_types::request::CallHierarchyIncomingCalls::METHOD) => {
                params(&req).and_then(|p| json(calls::incoming(st, p)))
            }
            (Phase::Running, lsp_types::request::CallHierarchyOutgoingCalls::METHOD) => {
                params(&req).and_then(|p| json(calls::outgoing(st, p)))
            }
            // Every request gets an answer, or the client waits for it.
            (Phase::Running, m) => Err((
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
        for line in self.st.take_notes() {
            self.log(&line);
        }
    }

    /// Ask the client to report changes of every `.shard` file on disk
    /// (`client/registerCapability`; its answer is not needed).
    fn register_watchers(&mut self) {
        let params = serde_json::json!({
            "registrations": [{
                "id": "shardc-watch-shard-files",
                "method": DidChangeWatchedFiles::METHOD,
                "registerOptions": { "watchers": [{ "globPattern": "**/*.shard" }] },
            }]
        });
        self.send(Message::Request(Request {
            id: lsp_server::RequestId::from("shardc-register-watchers".to_string()),
            method: "client/registerCapability".into(),
            params,
        }));
    }

    fn notification(&mut self, n: Notification) {
        // Before `initialize` notifications are dropped (the protocol says so),
        // and after `shutdown` there is nothing left to do.
        if self.phase != Phase::Running {
            return;
        }
        let method = n.method.clone();
        if method == "initialized" && self.watch_by_registration {
            self.register_watchers();
        }
        let fits = match method.as_str() {
            DidOpenTextDocument::METHOD => {
                serde_json::from_value::<lsp_types::DidOpenTextDocumentParams>(n.params).map(|p| {
                    let d = p.text_document;
                    self.st.open(d.uri, d.text, d.version);
                })
            }
            DidChangeTextDocument::METHOD => serde_json::from_value::<
                lsp_types::DidChangeTextDocumentParams,
            >(n.params)
            .map(|p| {
                let d = p.text_document;
                self.st.change(&d.uri, d.version, p.content_changes);
            }),
            DidCloseTextDocument::METHOD => {
                serde_json::from_value::<lsp_types::DidCloseTextDocumentParams>(n.params)
                    .map(|p| self.st.close(&p.text_document.uri))
            }
            DidSaveTextDocument::METHOD | DidChangeWatchedFiles::METHOD => {
                self.st.disk_changed();
                Ok(())
            }
            DidChangeWorkspaceFolders::METHOD => {
                self.st.roots = workspace::changed(&self.st.roots, &n.params);
                Ok(())
            }
            _ => Ok(()),
        };
        if let Err(e) = fits {
            self.log(&format!(
                "ignored `{}`: its params do not fit ({e})",
                clip(&method, 80)
            ));
        }
    }
}
