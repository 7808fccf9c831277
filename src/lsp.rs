//! `shardc lsp`: a language server on stdio (lsp-server). It runs the same
//! `world::compile` as the CLI on every open or edit, publishes the diagnostics,
//! answers hovers with the inferred type of the binding under the cursor, and
//! formats documents as `shardc fmt` does.

use crate::check::TypeEntry;
use crate::diag::Severity;
use crate::files::{Disk, Overlay};
use crate::world::{self, Options};
use lsp_server::{Connection, Message, Notification, Request, Response};
use lsp_types::notification::{
    DidChangeTextDocument, DidOpenTextDocument, Notification as _, PublishDiagnostics,
};
use lsp_types::request::{Formatting, HoverRequest, Request as _};
use lsp_types::{
    Diagnostic, DiagnosticSeverity, Hover, HoverContents, HoverProviderCapability, MarkupContent,
    MarkupKind, NumberOrString, OneOf, Position, PublishDiagnosticsParams, Range,
    ServerCapabilities, TextDocumentSyncCapability, TextDocumentSyncKind, TextEdit, Uri,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

fn path_of(uri: &Uri) -> PathBuf {
    let s = uri.as_str();
    let raw = s.strip_prefix("file://").unwrap_or(s);
    // Undo percent-encoding (spaces and friends in paths).
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&raw[i + 1..i + 3], 16) {
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

fn check(conn: &Connection, uri: &Uri, text: String, docs: &mut HashMap<String, Doc>) {
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
    let note = Notification::new(PublishDiagnostics::METHOD.to_string(), params);
    let _ = conn.sender.send(Message::Notification(note));
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
}

/// `textDocument/formatting`: `shardc fmt`'s output as one edit of the whole
/// document; none when it is formatted or does not parse.
fn formatting(req: &Request, docs: &HashMap<String, Doc>) -> Option<Vec<TextEdit>> {
    let p: lsp_types::DocumentFormattingParams = serde_json::from_value(req.params.clone()).ok()?;
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

fn hover(req: &Request, docs: &HashMap<String, Doc>) -> Option<Hover> {
    let p: lsp_types::HoverParams = serde_json::from_value(req.params.clone()).ok()?;
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

pub fn run() -> ExitCode {
    let (conn, io) = Connection::stdio();
    let caps = ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Kind(TextDocumentSyncKind::FULL)),
        hover_provider: Some(HoverProviderCapability::Simple(true)),
        document_formatting_provider: Some(OneOf::Left(true)),
        ..ServerCapabilities::default()
    };
    let Ok(caps) = serde_json::to_value(caps) else {
        return ExitCode::from(2);
    };
    if conn.initialize(caps).is_err() {
        return ExitCode::from(2);
    }
    let mut docs: HashMap<String, Doc> = HashMap::new();
    for msg in &conn.receiver {
        match msg {
            Message::Request(req) => {
                if conn.handle_shutdown(&req).unwrap_or(true) {
                    break;
                }
                let result = if req.method == HoverRequest::METHOD {
                    serde_json::to_value(hover(&req, &docs))
                } else if req.method == Formatting::METHOD {
                    serde_json::to_value(formatting(&req, &docs))
                } else {
                    // Every request gets an answer, or the client waits for it.
                    let _ = conn.sender.send(Message::Response(Response::new_err(
                        req.id,
                        lsp_server::ErrorCode::MethodNotFound as i32,
                        format!("shardc lsp does not handle `{}`", req.method),
                    )));
                    continue;
                };
                let _ = conn.sender.send(Message::Response(Response {
                    id: req.id,
                    result: Some(result.unwrap_or(serde_json::Value::Null)),
                    error: None,
                }));
            }
            Message::Notification(n) => {
                if n.method == DidOpenTextDocument::METHOD {
                    if let Ok(p) =
                        serde_json::from_value::<lsp_types::DidOpenTextDocumentParams>(n.params)
                    {
                        check(&conn, &p.text_document.uri, p.text_document.text, &mut docs);
                    }
                } else if n.method == DidChangeTextDocument::METHOD {
                    if let Ok(p) =
                        serde_json::from_value::<lsp_types::DidChangeTextDocumentParams>(n.params)
                    {
                        if let Some(last) = p.content_changes.into_iter().last() {
                            check(&conn, &p.text_document.uri, last.text, &mut docs);
                        }
                    }
                }
            }
            Message::Response(_) => {}
        }
    }
    drop(conn);
    let _ = io.join();
    ExitCode::SUCCESS
}
