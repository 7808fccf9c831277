//! Whole-document features: formatting (as `shardc fmt`), inlay hints (each
//! `let`'s inferred type and sharding), code actions (the fix-it of every
//! diagnostic shown), document symbols, semantic tokens (of the whole file or
//! a range), folding ranges and code lenses (each trained model's plan).

use super::index::{Kind, Target};
use super::state::State;
use super::text::Lines;
use lsp_types::{
    CodeAction, CodeActionKind, CodeActionOrCommand, CodeActionParams, CodeLens, CodeLensParams,
    Command, DocumentFormattingParams, DocumentSymbol, DocumentSymbolParams,
    DocumentSymbolResponse, FoldingRange, FoldingRangeKind, FoldingRangeParams, InlayHint,
    InlayHintKind, InlayHintLabel, InlayHintParams, InlayHintTooltip, Position, Range,
    SemanticToken, SemanticTokenModifier, SemanticTokenType, SemanticTokens, SemanticTokensLegend,
    SemanticTokensParams, SemanticTokensRangeParams, SemanticTokensRangeResult,
    SemanticTokensResult, SymbolKind, TextEdit, Uri, WorkspaceEdit,
};
use std::collections::HashMap;

/// `textDocument/formatting`: `shardc fmt`'s output as one edit of the whole
/// document; none when it is formatted or does not parse.
pub fn formatting(st: &State, p: DocumentFormattingParams) -> Option<Vec<TextEdit>> {
    let key = State::key_of(&p.text_document.uri);
    let doc = st.docs.get(&key)?;
    if !st.analyses.get(&key).is_some_and(|a| a.parses) {
        return None;
    }
    let new_text = crate::fmt::format(&doc.text);
    if new_text == doc.text {
        return Some(vec![]);
    }
    let lines = Lines::new(&doc.text, st.enc);
    Some(vec![TextEdit {
        range: Range::new(Position::new(0, 0), lines.position(doc.text.len())),
        new_text,
    }])
}

/// Each `let`'s type after its name (the first instance's, when a layer is
/// instantiated with different sizes; all of them in the tooltip).
pub fn inlay_hints(st: &State, p: InlayHintParams) -> Option<Vec<InlayHint>> {
    let at = super::nav::at(st, &p.text_document.uri, p.range.start)?;
    let key = &at.ix.files[at.file].key;
    let lines = &at.view.lines;
    let near = |pos| at.view.shift.near(lines.offset(pos));
    let (from, to) = (near(p.range.start), near(p.range.end));
    let mut by_span: Vec<(usize, Vec<String>)> = Vec::new();
    for (k, s, e, t) in &at.a.types {
        if k != key || t.kind != "let" || *e < from || *s > to {
            continue;
        }
        let ty = t.ty();
        match by_span.iter_mut().find(|(x, _)| x == e) {
            Some((_, v)) => {
                if !v.contains(&ty) {
                    v.push(ty)
                }
            }
            None => by_span.push((*e, vec![ty])),
        }
    }
    by_span.sort();
    Some(
        by_span
            .into_iter()
            // A hint whose binding was edited since the analysis is withheld.
            .filter_map(|(end, tys)| Some((at.view.position(end)?, tys)))
            .map(|(position, tys)| InlayHint {
                position,
                label: InlayHintLabel::String(format!(": {}", tys[0])),
                kind: Some(InlayHintKind::TYPE),
                text_edits: None,
                tooltip: (tys.len() > 1).then(|| {
                    InlayHintTooltip::String(format!("one per instance: {}", tys.join(" | ")))
                }),
                padding_left: None,
                padding_right: None,
                data: None,
            })
            .collect(),
    )
}

/// Each shown diagnostic's fix-it in the range, as a quick fix.
// `WorkspaceEdit` is keyed by `Uri`, whose hash does not change.
#[allow(clippy::mutable_key_type)]
pub fn code_actions(st: &State, p: CodeActionParams) -> Option<Vec<CodeActionOrCommand>> {
    let key = State::key_of(&p.text_document.uri);
    let overlaps = |r: &Range| r.start <= p.range.end && p.range.start <= r.end;
    let mut out = Vec::new();
    let sent = p.context.diagnostics.iter();
    for d in st.shown(&key).iter().chain(sent) {
        if !overlaps(&d.range) {
            continue;
        }
        let Some(fix) = d.data.as_ref().and_then(|x| x.get("fix")) else {
            continue;
        };
        let (Some(uri), Some(range), Some(new_text)) = (
            fix.get("uri")
                .and_then(|u| u.as_str())
                .and_then(|u| u.parse::<Uri>().ok()),
            fix.get("range")
                .and_then(|r| serde_json::from_value::<Range>(r.clone()).ok()),
            fix.get("newText").and_then(|t| t.as_str()),
        ) else {
            continue;
        };
        let title = fix
            .get("title")
            .and_then(|t| t.as_str())
            .unwrap_or("apply the suggested fix")
            .to_string();
        let duplicate = out.iter().any(|a: &CodeActionOrCommand| {
            matches!(a, CodeActionOrCommand::CodeAction(x) if x.title == title)
        });
        if duplicate {
            continue;
        }
        let mut changes = HashMap::new();
        changes.insert(
            uri,
            vec![TextEdit {
                range,
                new_text: new_text.to_string(),
            }],
        );
        out.push(CodeActionOrCommand::CodeAction(CodeAction {
            title,
            kind: Some(CodeActionKind::QUICKFIX),
            diagnostics: Some(vec![d.clone()]),
            edit: Some(WorkspaceEdit {
                changes: Some(changes),
                ..WorkspaceEdit::default()
            }),
            is_preferred: Some(true),
            ..CodeAction::default()
        }));
    }
    Some(out)
}

pub fn symbol_kind(k: Kind) -> SymbolKind {
    match k {
        Kind::Const => SymbolKind::CONSTANT,
        Kind::Mesh => SymbolKind::NAMESPACE,
        Kind::Axis => SymbolKind::ENUM_MEMBER,
        Kind::Layer | Kind::Model => SymbolKind::CLASS,
        Kind::Param => SymbolKind::TYPE_PARAMETER,
        Kind::Weight => SymbolKind::FIELD,
        Kind::Sub => SymbolKind::PROPERTY,
        Kind::Fn => SymbolKind::METHOD,
        Kind::FnParam | Kind::Let => SymbolKind::VARIABLE,
        Kind::Table | Kind::Feature => SymbolKind::STRUCT,
        Kind::Train => SymbolKind::EVENT,
    }
}

/// The outline: declarations, with a mesh's axes and a layer's parameters,
/// members and functions under them.
pub fn symbols(st: &State, p: DocumentSymbolParams) -> Option<DocumentSymbolResponse> {
    let at = super::nav::at(st, &p.text_document.uri, Position::new(0, 0))?;
    let ix = at.ix;
    let view = &at.view;
    // A declaration edited since the analysis is left out until it parses.
    let shown = |i: usize| {
        let d = &ix.defs[i];
        !matches!(d.kind, Kind::Let | Kind::FnParam)
            && view.range(d.full.0, d.full.1).is_some()
            && view.range(d.name_span.0, d.name_span.1).is_some()
    };
    #[allow(deprecated)]
    let make = |i: usize| -> DocumentSymbol {
        let d = &ix.defs[i];
        DocumentSymbol {
            name: if d.kind == Kind::Train {
                format!("train {}", d.name)
            } else {
                d.name.clone()
            },
            detail: Some(ix.header(d)),
            kind: symbol_kind(d.kind),
            tags: None,
            deprecated: None,
            range: view.range(d.full.0, d.full.1).unwrap_or_default(),
            selection_range: view.range(d.name_span.0, d.name_span.1).unwrap_or_default(),
            children: None,
        }
    };
    let mine: Vec<usize> = (0..ix.defs.len())
        .filter(|&i| ix.defs[i].file == at.file && shown(i))
        .collect();
    let mut out = Vec::new();
    for &i in mine.iter().filter(|&&i| ix.defs[i].container.is_none()) {
        let mut s = make(i);
        let kids: Vec<DocumentSymbol> = mine
            .iter()
            .filter(|&&j| ix.defs[j].container == Some(i))
            .map(|&j| make(j))
            .collect();
        if !kids.is_empty() {
            s.children = Some(kids);
        }
        out.push(s);
    }
    Some(DocumentSymbolResponse::Nested(out))
}

const TOKEN_TYPES: &[SemanticTokenType] = &[
    SemanticTokenType::NAMESPACE,
    SemanticTokenType::CLASS,
    SemanticTokenType::ENUM_MEMBER,
    SemanticTokenType::VARIABLE,
    SemanticTokenType::PARAMETER,
    SemanticTokenType::PROPERTY,
    SemanticTokenType::METHOD,
    SemanticTokenType::FUNCTION,
    SemanticTokenType::STRUCT,
    SemanticTokenType::TYPE_PARAMETER,
];

const TOKEN_MODIFIERS: &[SemanticTokenModifier] = &[
    SemanticTokenModifier::DECLARATION,
    SemanticTokenModifier::READONLY,
    SemanticTokenModifier::DEFAULT_LIBRARY,
];

pub fn legend() -> SemanticTokensLegend {
    SemanticTokensLegend {
        token_types: TOKEN_TYPES.to_vec(),
        token_modifiers: TOKEN_MODIFIERS.to_vec(),
    }
}

fn token_type(k: Kind) -> u32 {
    match k {
        Kind::Mesh => 0,
        Kind::Layer | Kind::Model => 1,
        Kind::Axis => 2,
        Kind::Const | Kind::Let => 3,
        Kind::FnParam => 4,
        Kind::Weight | Kind::Sub => 5,
        Kind::Fn => 6,
        Kind::Table | Kind::Feature | Kind::Train => 8,
        Kind::Param => 9,
    }
}

/// Every name the index knows, classified (keywords, numbers and comments
/// are the grammars' job).
pub fn semantic_tokens(st: &State, p: SemanticTokensParams) -> Option<SemanticTokensResult> {
    tokens(st, &p.text_document.uri, None).map(SemanticTokensResult::Tokens)
}

/// The tokens of [`semantic_tokens`] that overlap the range (a token the
/// range's start or end falls inside included); the first one's position is
/// relative to the start of the file, as the protocol says.
pub fn semantic_tokens_range(
    st: &State,
    p: SemanticTokensRangeParams,
) -> Option<SemanticTokensRangeResult> {
    tokens(st, &p.text_document.uri, Some(p.range)).map(SemanticTokensRangeResult::Tokens)
}

fn tokens(st: &State, uri: &Uri, range: Option<Range>) -> Option<SemanticTokens> {
    let at = super::nav::at(st, uri, Position::new(0, 0))?;
    let ix = at.ix;
    let view = &at.view;
    // The range as byte offsets of the analysed text: a token overlaps it
    // when it starts before its end and ends after its start (or at an
    // empty range's point).
    let window = range.map(|r| {
        let near = |p| view.shift.near(view.lines.offset(p));
        let (s, e) = (near(r.start), near(r.end));
        (s.min(e), s.max(e))
    });
    let inside = |o: &&super::index::Occ| match window {
        None => true,
        Some((s, e)) if s == e => o.start <= s && s <= o.end,
        Some((s, e)) => o.start < e && o.end > s,
    };
    let mut data = Vec::new();
    let (mut line, mut col) = (0u32, 0u32);
    for o in ix.occs.iter().filter(|o| o.file == at.file).filter(inside) {
        let (ty, mut mods) = match o.target {
            Target::Def(d) => {
                let d = &ix.defs[d];
                let std = super::text::is_std(&ix.files[d.file].key);
                let ro = matches!(d.kind, Kind::Const | Kind::Axis);
                (token_type(d.kind), (ro as u32) << 1 | (std as u32) << 2)
            }
            Target::Op(_) | Target::Library(_) => (7, 1 << 2),
            Target::File(_) => continue,
        };
        if o.is_def {
            mods |= 1;
        }
        // A token edited since the analysis is withheld.
        let Some(r) = view.range(o.start, o.end) else {
            continue;
        };
        let (s, e) = (r.start, r.end);
        if s.line != e.line || (s.line, s.character) < (line, col) && !data.is_empty() {
            continue;
        }
        let delta_line = s.line - line;
        let delta_start = if delta_line == 0 {
            s.character - col
        } else {
            s.character
        };
        data.push(SemanticToken {
            delta_line,
            delta_start,
            length: e.character - s.character,
            token_type: ty,
            token_modifiers_bitset: mods,
        });
        (line, col) = (s.line, s.character);
    }
    Some(SemanticTokens {
        result_id: None,
        data,
    })
}

/// Declarations over several lines, and runs of comment lines.
pub fn folding(st: &State, p: FoldingRangeParams) -> Option<Vec<FoldingRange>> {
    let at = super::nav::at(st, &p.text_document.uri, Position::new(0, 0))?;
    let ix = at.ix;
    let text = &ix.files[at.file].text;
    let lines = Lines::new(text, st.enc);
    // Folds of the analysed text; while the buffer differs, none.
    if at.text != text.as_str() {
        return Some(Vec::new());
    }
    let mut out = Vec::new();
    for d in ix.defs.iter().filter(|d| d.file == at.file) {
        if !matches!(
            d.kind,
            Kind::Mesh | Kind::Layer | Kind::Model | Kind::Fn | Kind::Table | Kind::Train
        ) {
            continue;
        }
        let (s, e) = (lines.position(d.full.0), lines.position(d.full.1));
        if e.line > s.line {
            out.push(FoldingRange {
                start_line: s.line,
                end_line: e.line,
                kind: Some(FoldingRangeKind::Region),
                ..FoldingRange::default()
            });
        }
    }
    let mut run: Option<(u32, u32)> = None;
    let all: Vec<&str> = text.split('\n').collect();
    for (i, l) in all.iter().enumerate() {
        let i = i as u32;
        if l.trim_start().starts_with("//") {
            run = Some(run.map_or((i, i), |(s, _)| (s, i)));
            continue;
        }
        if let Some((s, e)) = run.take() {
            if e > s {
                out.push(FoldingRange {
                    start_line: s,
                    end_line: e,
                    kind: Some(FoldingRangeKind::Comment),
                    ..FoldingRange::default()
                });
            }
        }
    }
    if let Some((s, e)) = run.filter(|(s, e)| e > s) {
        out.push(FoldingRange {
            start_line: s,
            end_line: e,
            kind: Some(FoldingRangeKind::Comment),
            ..FoldingRange::default()
        });
    }
    Some(out)
}

/// Code lenses: the plan of each trained model in one line (memory per
/// device, FLOPs and bytes communicated per step, the mesh) over its `train`
/// and its `model` declaration, for the file's own mesh (as `shardc plan`
/// prints them; none while the file has errors).
pub fn code_lens(st: &State, p: CodeLensParams) -> Option<Vec<CodeLens>> {
    let at = super::nav::at(st, &p.text_document.uri, Position::new(0, 0))?;
    let key = &at.ix.files[at.file].key;
    let lenses =
        at.a.lenses
            .iter()
            .filter(|(k, ..)| k == key)
            .filter_map(|(_, s, e, title)| {
                let r = at.view.range(*s, *e)?;
                Some(CodeLens {
                    // On the declaration's first line.
                    range: Range::new(r.start, r.start),
                    command: Some(Command {
                        title: title.clone(),
                        command: String::new(),
                        arguments: None,
                    }),
                    data: None,
                })
            })
            .collect();
    Some(lenses)
}
