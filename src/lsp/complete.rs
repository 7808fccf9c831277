//! Completion and signature help. The context comes from the text before the
//! cursor (a buffer being typed in rarely parses): after `@`, in a
//! collective's axis argument or `stages:`, exactly the axes of the mesh the
//! code runs on; in a `train` block its options, optimizer, schedule, loss and
//! data source names; after `import` the stdlib modules and the `.shard` files
//! beside the buffer; elsewhere the names in scope (from the last index of the
//! buffer), layers, constants and the built-in ops with their signatures and
//! rules from the op registry.

use super::index::{Index, Kind};
use super::nav::{self, At};
use super::state::State;
use lsp_types::{
    CompletionItem, CompletionItemKind, CompletionParams, CompletionResponse, Documentation,
    MarkupContent, MarkupKind, ParameterInformation, ParameterLabel, SignatureHelp,
    SignatureHelpParams, SignatureInformation,
};

/// Characters that open a completion.
pub const TRIGGERS: &[&str] = &["@", "(", ",", ":"];

pub const KEYWORDS: &[&str] = &[
    "import", "pragma", "const", "mesh", "layer", "model", "table", "feature", "train", "fn",
    "let", "init", "local", "on",
];

// The options and the words they take are the registry's (`crate::vocab`),
// so completion cannot drift from what `check` accepts.
use crate::vocab::{
    docs::option_detail, Entry, Field, Vocab, DATA_SOURCES, LOG_SINKS, LOSSES, LR_SCHEDULES,
    METRICS, OPTIMIZERS, PIPELINE_SCHEDULES, PRECISIONS, TABLE_OPTIONS, TRAIN_OPTIONS,
};

/// The text before the cursor with comments and strings blanked (same
/// length), so brackets in them do not count.
fn blank(before: &str) -> String {
    let mut out = String::with_capacity(before.len());
    let mut in_str = false;
    let mut chars = before.chars().peekable();
    while let Some(c) = chars.next() {
        if in_str {
            if c == '"' || c == '\n' {
                in_str = false;
                out.push(c);
            } else {
                out.extend(std::iter::repeat_n(' ', c.len_utf8()));
            }
        } else if c == '"' {
            in_str = true;
            out.push(c);
        } else if c == '/' && chars.peek() == Some(&'/') {
            // To the end of the line.
            out.push(' ');
            for c in chars.by_ref() {
                if c == '\n' {
                    out.push('\n');
                    break;
                }
                out.extend(std::iter::repeat_n(' ', c.len_utf8()));
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Where the cursor is.
#[derive(Debug, Default)]
struct Context {
    /// In a comment or a string.
    quiet: bool,
    /// After `@` or inside `@(`.
    axes: bool,
    /// The innermost unclosed bracket: the bracket, and for `(` the callee,
    /// for `{` the start of the line that opened it.
    open: Option<(char, String)>,
    /// Top-level commas since the bracket (the argument's index).
    arg: usize,
    /// `key:` written before the cursor in the current argument or option.
    key: Option<String>,
    /// Only blanks between the bracket (or the last comma or line) and the
    /// name being typed: a key of an options block.
    at_key: bool,
    /// The word before the one being typed, on the same line.
    prev_word: Option<String>,
}

fn ident_end(s: &str) -> &str {
    let n = s
        .bytes()
        .rev()
        .take_while(|b| b.is_ascii_alphanumeric() || *b == b'_')
        .count();
    &s[s.len() - n..]
}

fn context(before: &str) -> Context {
    let line = before.rsplit('\n').next().unwrap_or("");
    let clean = blank(before);
    let mut cx = Context::default();
    let last_line = clean.rsplit('\n').next().unwrap_or("");
    if last_line.len() < line.len() || last_line.trim_end().len() < line.trim_end().len() {
        // The cursor is in a comment (blanked) or after an open quote.
        cx.quiet = true;
    }
    if last_line.matches('"').count() % 2 == 1 {
        cx.quiet = true;
    }
    let prefix = ident_end(&clean);
    let pre = &clean[..clean.len() - prefix.len()];
    // `D@ax`, `D@(a, b`: a sharding (`x @ w` is a product).
    let sharding = |s: &str| {
        s.strip_suffix('@').is_some_and(|r| {
            r.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ')')
        })
    };
    if sharding(pre) {
        cx.axes = true;
    } else {
        let mut s = pre.trim_end();
        loop {
            if let Some(r) = s.strip_suffix(',') {
                s = r.trim_end();
                let w = ident_end(s);
                if w.is_empty() {
                    break;
                }
                s = s[..s.len() - w.len()].trim_end();
            } else if let Some(r) = s.strip_suffix('(') {
                cx.axes = sharding(r);
                break;
            } else {
                break;
            }
        }
    }
    // The innermost open bracket.
    let mut depth = 0usize;
    let mut since = pre.len();
    for (i, c) in pre.char_indices().rev() {
        match c {
            ')' | ']' | '}' => depth += 1,
            '(' | '[' | '{' if depth > 0 => depth -= 1,
            '(' | '[' | '{' => {
                let head = pre[..i].trim_end();
                let what = if c == '{' {
                    head.rsplit('\n').next().unwrap_or("").trim().to_string()
                } else if c == '[' {
                    // `metrics: [`: the option's key.
                    ident_end(head.strip_suffix(':').unwrap_or(head).trim_end()).to_string()
                } else {
                    ident_end(head).to_string()
                };
                cx.open = Some((c, what));
                if since == pre.len() {
                    since = i + 1;
                }
                break;
            }
            ',' if depth == 0 => {
                cx.arg += 1;
                if since == pre.len() {
                    since = i + 1;
                }
            }
            '\n' if depth == 0 && since == pre.len() => {
                // In an options block a new line starts an option too.
                since = i + 1;
            }
            _ => {}
        }
    }
    if !matches!(cx.open, Some(('(' | '[', _))) {
        // In a body `x@w` is a product.
        cx.axes = false;
    }
    let since = since.min(pre.len());
    let current = &pre[since..];
    cx.at_key = current.trim().is_empty();
    // `key: value…` in the current argument or option: the last key.
    if let Some(colon) = current.rfind(':') {
        let k = ident_end(current[..colon].trim_end());
        if !k.is_empty() {
            cx.key = Some(k.to_string());
        }
    }
    let words: Vec<&str> = pre
        .rsplit('\n')
        .next()
        .unwrap_or("")
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| !w.is_empty())
        .collect();
    cx.prev_word = words.last().map(|w| w.to_string());
    cx
}

/// The axes of the mesh the code at the cursor runs on: the only mesh, the
/// `train`'s mesh when in one, the mesh of the `train` of the enclosing
/// model, else the first `train`'s or mesh's.
fn mesh_axes(at: &At, cx: &Context) -> Vec<(String, i64)> {
    let a = at.a;
    let axes_of = |m: &str| a.meshes.iter().find(|x| x.0 == m).map(|x| x.1.clone());
    if a.meshes.len() == 1 {
        return a.meshes[0].1.clone();
    }
    if let Some(('{', head)) = &cx.open {
        let w: Vec<&str> = head.split_whitespace().collect();
        if w.first() == Some(&"train") {
            if let Some(m) = w.get(3).and_then(|m| axes_of(m)) {
                return m;
            }
        }
    }
    let layer = at
        .ix
        .enclosing(at.file, at.near, &[Kind::Layer, Kind::Model])
        .map(|l| at.ix.defs[l].name.clone());
    let mesh = layer
        .and_then(|l| a.trains.iter().find(|t| t.0 == l))
        .or(a.trains.first())
        .map(|t| t.1.clone())
        .or_else(|| a.meshes.first().map(|m| m.0.clone()));
    mesh.and_then(|m| axes_of(&m)).unwrap_or_default()
}

fn item(label: &str, kind: CompletionItemKind, detail: Option<String>) -> CompletionItem {
    CompletionItem {
        label: label.to_string(),
        kind: Some(kind),
        detail,
        ..CompletionItem::default()
    }
}

fn keys(names: &[&str]) -> Vec<CompletionItem> {
    names
        .iter()
        .map(|n| CompletionItem {
            insert_text: Some(format!("{n}: ")),
            ..item(n, CompletionItemKind::PROPERTY, None)
        })
        .collect()
}

/// A declaration's options, each with its meaning.
fn option_keys<T>(v: &Vocab<Field<T>>) -> Vec<CompletionItem> {
    v.defs
        .iter()
        .map(|f| CompletionItem {
            insert_text: Some(format!("{}: ", f.name)),
            ..item(f.name, CompletionItemKind::PROPERTY, Some(option_detail(f)))
        })
        .collect()
}

/// The words of a vocabulary: call-shaped ones with their signature, the
/// others named by what they are; each with its row of the reference.
fn words<D: Entry>(v: &Vocab<D>) -> Vec<CompletionItem> {
    v.defs
        .iter()
        .map(|d| {
            let (kind, detail) = if d.args().is_empty() {
                (CompletionItemKind::ENUM_MEMBER, v.what.to_string())
            } else {
                (CompletionItemKind::FUNCTION, d.signature())
            };
            CompletionItem {
                documentation: Some(Documentation::MarkupContent(MarkupContent {
                    kind: MarkupKind::Markdown,
                    value: d.doc().to_string(),
                })),
                ..item(d.name(), kind, Some(detail))
            }
        })
        .collect()
}

/// The words a `train` or `table` option takes (`None`: an expression).
fn option_values(key: &str) -> Option<Vec<CompletionItem>> {
    Some(match key {
        "optimizer" => words(&OPTIMIZERS),
        "lr" => words(&LR_SCHEDULES),
        "precision" => words(&PRECISIONS),
        "data" => words(&DATA_SOURCES),
        _ => return None,
    })
}

fn op_items(kind: Option<crate::prim::Kind>) -> Vec<CompletionItem> {
    crate::prim::defs()
        .filter(|d| d.kind != crate::prim::Kind::Operator)
        .filter(|d| kind.is_none_or(|k| d.kind == k))
        .map(|d| CompletionItem {
            documentation: Some(Documentation::MarkupContent(MarkupContent {
                kind: MarkupKind::Markdown,
                value: d.rule.to_string(),
            })),
            ..item(
                d.name,
                CompletionItemKind::FUNCTION,
                Some(d.signature.into()),
            )
        })
        .collect()
}

fn def_kind(k: Kind) -> CompletionItemKind {
    match k {
        Kind::Const => CompletionItemKind::CONSTANT,
        Kind::Mesh => CompletionItemKind::MODULE,
        Kind::Axis => CompletionItemKind::ENUM_MEMBER,
        Kind::Layer | Kind::Model => CompletionItemKind::CLASS,
        Kind::Param => CompletionItemKind::TYPE_PARAMETER,
        Kind::Weight | Kind::Sub => CompletionItemKind::FIELD,
        Kind::Fn => CompletionItemKind::METHOD,
        Kind::FnParam | Kind::Let => CompletionItemKind::VARIABLE,
        Kind::Table | Kind::Feature | Kind::Train => CompletionItemKind::STRUCT,
    }
}

/// Names in scope at the cursor: the enclosing function's parameters and
/// the `let`s before the cursor, the layer's members and parameters, and the
/// global declarations of every file the buffer sees.
fn scope(ix: &Index, file: usize, at: usize, only_sizes: bool) -> Vec<CompletionItem> {
    let func = ix.enclosing(file, at, &[Kind::Fn]);
    let layer = ix.enclosing(file, at, &[Kind::Layer, Kind::Model]);
    let mut out: Vec<CompletionItem> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for d in &ix.defs {
        let local = match d.kind {
            Kind::Let => func.is_some() && d.container == func && d.name_span.1 < at,
            Kind::FnParam => func.is_some() && d.container == func,
            Kind::Weight | Kind::Sub | Kind::Fn => layer.is_some() && d.container == layer,
            Kind::Param => layer.is_some() && d.container == layer,
            Kind::Const | Kind::Layer | Kind::Model => true,
            _ => false,
        };
        let size = matches!(d.kind, Kind::Const | Kind::Param);
        if local && (!only_sizes || size) && seen.insert(d.name.clone()) {
            out.push(item(&d.name, def_kind(d.kind), Some(ix.header(d))));
        }
    }
    out
}

/// In a `train` or `table` block (`head` is `train MODEL on MESH` or
/// `table NAME`): its options, or the words the option being written takes.
fn in_options(at: &At, cx: &Context, head: &str) -> Vec<CompletionItem> {
    match cx.key.as_deref() {
        None if cx.at_key && head.starts_with("train") => option_keys(&TRAIN_OPTIONS),
        None if cx.at_key => option_keys(&TABLE_OPTIONS),
        Some("loss") => losses(at, head),
        Some(k) => option_values(k).unwrap_or_else(|| scope(at.ix, at.file, at.near, true)),
        None => scope(at.ix, at.file, at.near, true),
    }
}

/// The built-in losses, and the functions of the trained model (`head` is
/// `train MODEL on MESH`), which `loss:` may name.
fn losses(at: &At, head: &str) -> Vec<CompletionItem> {
    let mut v: Vec<CompletionItem> = words(&LOSSES);
    let model = head.split_whitespace().nth(1).unwrap_or_default();
    let ds = &at.ix.defs;
    let of_model = |d: &super::index::Def| {
        d.container
            .and_then(|c| ds.get(c))
            .is_some_and(|m| m.kind == Kind::Model && m.name == model)
    };
    for d in ds
        .iter()
        .filter(|d| d.kind == Kind::Fn && d.name != "forward")
    {
        if of_model(d) && !v.iter().any(|i| i.label == d.name) {
            v.push(item(
                &d.name,
                CompletionItemKind::FUNCTION,
                Some(format!("loss function of `{model}`")),
            ));
        }
    }
    v
}

pub fn completion(st: &State, p: CompletionParams) -> Option<CompletionResponse> {
    let at = nav::at(
        st,
        &p.text_document_position.text_document.uri,
        p.text_document_position.position,
    )?;
    let before = at.text.get(..at.offset)?;
    let cx = context(before);
    if cx.quiet {
        return None;
    }
    let axes = |cx: &Context| -> Vec<CompletionItem> {
        mesh_axes(&at, cx)
            .into_iter()
            .map(|(n, size)| {
                item(
                    &n,
                    CompletionItemKind::ENUM_MEMBER,
                    Some(format!("{size} devices")),
                )
            })
            .collect()
    };
    let list = |v: Vec<CompletionItem>| Some(CompletionResponse::Array(v));
    if cx.axes {
        return list(axes(&cx));
    }
    match &cx.open {
        Some(('(', callee)) => {
            if let Some(op) = crate::prim::find(callee) {
                if op.kind == crate::prim::Kind::Collective && (cx.arg >= 1 || cx.key.is_some()) {
                    return list(axes(&cx));
                }
            }
            if callee == "repeat" && cx.key.as_deref() == Some("stages") {
                return list(axes(&cx));
            }
            if callee == "repeat" && cx.key.as_deref() == Some("schedule") {
                return list(words(&PIPELINE_SCHEDULES));
            }
            if let Some((_, args)) = nav::library_args(callee) {
                if cx.key.as_deref() == Some("lr") {
                    return list(words(&LR_SCHEDULES));
                }
                if cx.key.is_none() {
                    return list(keys(&args));
                }
                return list(scope(at.ix, at.file, at.near, true));
            }
        }
        Some(('[', key)) if key == "metrics" => return list(words(&METRICS)),
        Some(('[', key)) if key == "log" => return list(words(&LOG_SINKS)),
        Some(('[', _)) => return list(scope(at.ix, at.file, at.near, true)),
        Some(('{', head)) if head.starts_with("train") || head.starts_with("table") => {
            return list(in_options(&at, &cx, head));
        }
        Some(('{', head)) if cx.at_key => {
            // An options-block option of a `train` (`eval: {`): its fields.
            let key = head.trim_end_matches(':').trim();
            if let Some(f) = TRAIN_OPTIONS.find(key).filter(|f| !f.args.is_empty()) {
                let names: Vec<&str> = f.args.iter().map(|a| a.name).collect();
                return list(keys(&names));
            }
        }
        None => {
            // Top level.
            let line = before.rsplit('\n').next().unwrap_or("").trim_start();
            if line.starts_with("import") {
                return list(imports(&at));
            }
            if line.starts_with("train") {
                let kinds: &[Kind] = if cx.prev_word.as_deref() == Some("on") {
                    &[Kind::Mesh]
                } else {
                    &[Kind::Model, Kind::Layer]
                };
                let v = at
                    .ix
                    .defs
                    .iter()
                    .filter(|d| kinds.contains(&d.kind))
                    .map(|d| item(&d.name, def_kind(d.kind), Some(at.ix.header(d))))
                    .collect();
                return list(v);
            }
            if cx.prev_word.is_none() {
                let v = KEYWORDS[..9]
                    .iter()
                    .map(|k| item(k, CompletionItemKind::KEYWORD, None))
                    .collect();
                return list(v);
            }
            return list(scope(at.ix, at.file, at.near, true));
        }
        _ => {}
    }
    // An expression.
    let mut v = scope(at.ix, at.file, at.near, false);
    v.extend(op_items(None));
    v.extend(crate::prim::docs::LIBRARY.iter().map(|n| {
        item(
            n,
            CompletionItemKind::FUNCTION,
            nav::library_args(n).map(|(n, a)| format!("{n}({})", a.join(", "))),
        )
    }));
    for k in ["let", "fn", "init", "local"] {
        v.push(item(k, CompletionItemKind::KEYWORD, None));
    }
    list(v)
}

/// `import` targets: stdlib modules and the `.shard` files beside the buffer.
fn imports(at: &At) -> Vec<CompletionItem> {
    let mut v: Vec<CompletionItem> = crate::resolve::STDLIB
        .iter()
        .map(|(n, _)| {
            item(
                n,
                CompletionItemKind::MODULE,
                Some("standard library".into()),
            )
        })
        .collect();
    let key = &at.ix.files[at.file].key;
    if let Some(dir) = key.parent().filter(|_| !super::text::is_std(key)) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            let mut names: Vec<String> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "shard") && p != key)
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            names.sort();
            for n in names.into_iter().take(200) {
                v.push(CompletionItem {
                    insert_text: Some(format!("\"{n}\"")),
                    ..item(&format!("\"{n}\""), CompletionItemKind::FILE, None)
                });
            }
        }
    }
    v
}

/// A signature's parameters: its text between the brackets, split at the
/// top-level commas.
fn split_params(sig: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (sig.find('('), sig.rfind(')')) else {
        return vec![];
    };
    if close <= open {
        return vec![];
    }
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in sig[open + 1..close].chars() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(cur.trim().to_string());
                cur.clear();
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

pub fn signature_help(st: &State, p: SignatureHelpParams) -> Option<SignatureHelp> {
    let tp = &p.text_document_position_params;
    let at = nav::at(st, &tp.text_document.uri, tp.position)?;
    let cx = context(at.text.get(..at.offset)?);
    let Some(('(', callee)) = &cx.open else {
        return None;
    };
    let (label, doc) = if let Some(op) = crate::prim::find(callee) {
        (op.signature.to_string(), Some(op.rule.to_string()))
    } else if let Some((n, args)) = nav::library_args(callee) {
        let doc = crate::vocab::call(callee).map(|(_, e)| e.doc().to_string());
        (format!("{n}({})", args.join(", ")), doc)
    } else {
        let d = at
            .ix
            .defs
            .iter()
            .find(|d| d.name == *callee && matches!(d.kind, Kind::Layer | Kind::Model))?;
        let h = at.ix.header(d);
        let h = h.strip_prefix("layer ").unwrap_or(&h).to_string();
        (h, Some(at.ix.doc_comment(d)).filter(|s| !s.is_empty()))
    };
    let params = split_params(&label);
    let active = cx
        .key
        .as_ref()
        .and_then(|k| {
            params
                .iter()
                .position(|p| p == k || p.starts_with(&format!("{k}:")))
        })
        .unwrap_or(cx.arg)
        .min(params.len().saturating_sub(1));
    Some(SignatureHelp {
        signatures: vec![SignatureInformation {
            label,
            documentation: doc.map(|d| {
                Documentation::MarkupContent(MarkupContent {
                    kind: MarkupKind::Markdown,
                    value: d,
                })
            }),
            parameters: Some(
                params
                    .into_iter()
                    .map(|p| ParameterInformation {
                        label: ParameterLabel::Simple(p),
                        documentation: None,
                    })
                    .collect(),
            ),
            active_parameter: Some(active as u32),
        }],
        active_signature: Some(0),
        active_parameter: Some(active as u32),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts() {
        assert!(context("let y = x @ f32[B@").axes);
        assert!(context("f32[B@(dp, m").axes);
        assert!(!context("let y = x @ w").axes);
        assert!(!context("fn f() {\n  x@w").axes);
        assert!(context("  up = Dense(D -> 4*D@m").axes);
        let c = context("    x + psum(attn + ff, m");
        assert_eq!(c.open, Some(('(', "psum".into())));
        assert_eq!(c.arg, 1);
        let c = context("train M on pod {\n  optimizer: ad");
        assert_eq!(c.key.as_deref(), Some("optimizer"));
        let c = context("train M on pod {\n  batch: 3\n  ");
        assert!(c.at_key);
        assert!(c.key.is_none());
        assert!(context("// a (comment @").quiet);
        assert_eq!(
            split_params("softmax(x, dim: -1)"),
            vec!["x".to_string(), "dim: -1".to_string()]
        );
    }
}
