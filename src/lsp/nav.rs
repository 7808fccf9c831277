//! Going from a name to what it means: go-to-definition, highlights, and
//! references and rename across every file of every open buffer's
//! compilation and every `.shard` file of the workspace ([`super::workspace`]:
//! under the workspace folders and beside the open buffers, open or not,
//! which may import them), and hover (inferred types and layouts of bindings, the
//! declaration of what a name refers to, constants' values, axes' sizes,
//! built-in ops with their row of the op registry); workspace symbols (the
//! declarations of every such file by name) and the links of `import`s.

use super::index::{Index, Kind, Occ, Target};
use super::state::{Analysis, State};
use super::text::{self, Lines, View};
use lsp_server::ErrorCode;
use lsp_types::{
    DocumentHighlight, DocumentHighlightKind, DocumentHighlightParams, DocumentLink,
    DocumentLinkParams, GotoDefinitionParams, GotoDefinitionResponse, Hover, HoverContents,
    HoverParams, Location, MarkupContent, MarkupKind, Position, PrepareRenameResponse,
    ReferenceParams, RenameParams, SymbolInformation, TextDocumentPositionParams, TextEdit, Uri,
    WorkspaceEdit, WorkspaceSymbolParams, WorkspaceSymbolResponse,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A position in a file, seen through a compilation that read the file.
/// The compilation may have analysed an older text (the last that parsed):
/// `view` maps its offsets to the buffer now, and the cursor back.
pub struct At<'a> {
    pub a: &'a Analysis,
    pub ix: &'a Index,
    pub file: usize,
    /// The cursor in the buffer now (completion reads the text before it).
    pub offset: usize,
    /// The cursor in the analysed text; `None` inside text typed since.
    pub here: Option<usize>,
    /// The cursor in the analysed text, one inside text typed since taken
    /// where that text starts (what scopes a completion).
    pub near: usize,
    /// The buffer now.
    pub text: &'a str,
    pub view: View<'a>,
}

impl At<'_> {
    /// The name under the cursor; none inside text typed since the analysis.
    pub fn occ(&self) -> Option<&Occ> {
        self.ix.occ_at(self.file, self.here?)
    }
}

pub fn at<'a>(st: &'a State, uri: &Uri, pos: Position) -> Option<At<'a>> {
    let key = State::key_of(uri);
    let a = st.analyses.get(&key).or_else(|| {
        let mut v: Vec<(&PathBuf, &Analysis)> =
            st.analyses.iter().filter(|(_, a)| a.reads(&key)).collect();
        v.sort_by_key(|(k, _)| *k);
        v.first().map(|(_, a)| *a)
    })?;
    let file = a.index.file_of(&key)?;
    let text = match st.docs.get(&key) {
        Some(d) => d.text.as_str(),
        None => a.index.files[file].text.as_str(),
    };
    let view = View::new(&a.index.files[file].text, text, st.enc);
    let offset = view.lines.offset(pos);
    Some(At {
        a,
        ix: &a.index,
        file,
        offset,
        here: view.shift.back(offset),
        near: view.shift.near(offset),
        text,
        view,
    })
}

fn at_params<'a>(st: &'a State, p: &TextDocumentPositionParams) -> Option<At<'a>> {
    at(st, &p.text_document.uri, p.position)
}

/// A byte range of a file of an index as a location, in the file's buffer
/// when it is open (mapped through the edits since: `None` inside them).
pub fn location(st: &State, ix: &Index, file: usize, start: usize, end: usize) -> Option<Location> {
    let f = ix.files.get(file)?;
    Some(Location {
        uri: st.uri(&f.key)?,
        range: range_now(st, &f.key, &f.text, start, end)?,
    })
}

/// A byte range of `analysed`, the text file `key` was analysed in, in the
/// positions of its buffer now (the text itself when it is not open).
pub fn range_now(
    st: &State,
    key: &Path,
    analysed: &str,
    start: usize,
    end: usize,
) -> Option<lsp_types::Range> {
    match st.docs.get(key) {
        Some(d) if d.text != analysed => View::new(analysed, &d.text, st.enc).range(start, end),
        _ => Some(Lines::new(analysed, st.enc).range(start, end)),
    }
}

pub fn definition(st: &State, p: GotoDefinitionParams) -> Option<GotoDefinitionResponse> {
    let at = at_params(st, &p.text_document_position_params)?;
    let o = at.occ()?;
    let loc = match o.target {
        Target::Def(d) => {
            let d = at.ix.defs.get(d)?;
            location(st, at.ix, d.file, d.name_span.0, d.name_span.1)?
        }
        Target::File(f) => location(st, at.ix, f, 0, 0)?,
        Target::Op(_) | Target::Library(_) => return None,
    };
    Some(GotoDefinitionResponse::Scalar(loc))
}

/// What a name is, the same in every compilation.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Symbol {
    Def(PathBuf, usize),
    Op(&'static str),
    Library(&'static str),
    File(PathBuf),
}

fn symbol(ix: &Index, t: Target) -> Option<Symbol> {
    Some(match t {
        Target::Def(d) => {
            let d = ix.defs.get(d)?;
            Symbol::Def(ix.files.get(d.file)?.key.clone(), d.name_span.0)
        }
        Target::Op(n) => Symbol::Op(n),
        Target::Library(n) => Symbol::Library(n),
        Target::File(f) => Symbol::File(ix.files.get(f)?.key.clone()),
    })
}

fn target(ix: &Index, s: &Symbol) -> Option<Target> {
    Some(match s {
        Symbol::Def(k, start) => Target::Def(ix.def_at(k, *start)?),
        Symbol::Op(n) => Target::Op(n),
        Symbol::Library(n) => Target::Library(n),
        Symbol::File(k) => Target::File(ix.file_of(k)?),
    })
}

/// Indexes of the workspace's `.shard` files ([`super::workspace`]: under
/// the workspace folders, and beside the open buffers) that no open buffer's
/// compilation read and whose text holds `needle` (a file without the name
/// cannot use it): each with its imports, resolved and indexed (not checked).
/// Open buffers are read from the overlay, other files from disk.
pub(super) fn others(st: &State, needle: &str) -> Vec<Arc<Index>> {
    let mut beside: Vec<PathBuf> = st
        .docs
        .keys()
        .filter(|k| !text::is_std(k))
        .filter_map(|k| k.parent().map(Path::to_path_buf))
        .collect();
    beside.sort();
    beside.dedup();
    // What the last search read, while the client reports changes on disk.
    let mut guard = st.kept.lock().ok().filter(|_| st.watched);
    let mut afresh = super::workspace::Kept::default();
    let kept = match guard.as_deref_mut() {
        Some(k) => k,
        None => &mut afresh,
    };
    let scan = kept.listing(&st.roots, &beside);
    if let Some(note) = scan.note {
        st.note(note);
    }
    let mut files = crate::files::Overlay::new(&crate::files::Disk);
    for (k, d) in &st.docs {
        files.insert(k, d.text.clone());
    }
    let todo: Vec<PathBuf> = scan
        .files
        .into_iter()
        .filter(|k| !st.analyses.values().any(|a| a.reads(k)))
        .collect();
    let grants: Vec<PathBuf> = st
        .opts
        .grants
        .iter()
        .chain(st.opts.data.iter())
        .cloned()
        .collect();
    // One file that trips a bug is left out (and logged), not the search.
    let work = || {
        let mut out = Vec::new();
        let mut failed = Vec::new();
        for p in &todo {
            let Some(text) = kept.text(&files, p) else {
                continue;
            };
            if !needle.is_empty() && !text.contains(needle) {
                continue;
            }
            if let Some(ix) = kept.index(p) {
                out.push(ix);
                continue;
            }
            let one = || load(&files, p, text.to_string(), &grants);
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(one)) {
                Ok(Some(ix)) => {
                    let ix = Arc::new(ix);
                    kept.keep_index(p, ix.clone());
                    out.push(ix);
                }
                Ok(None) => {}
                Err(_) => failed.push(p.display().to_string()),
            }
        }
        (out, failed)
    };
    // Indexing recurses along the syntax trees: on the compiler's stack size.
    let (out, failed) = std::thread::scope(|s| {
        std::thread::Builder::new()
            .name("workspace".into())
            .stack_size(crate::world::COMPILE_STACK)
            .spawn_scoped(s, work)
            .ok()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    });
    for f in failed {
        st.note(format!(
            "internal error (a bug) indexing {f} for references: left out"
        ));
    }
    out
}

/// A file and its imports, resolved and indexed (not checked), reading what
/// `shardc check` would let it read: its own directory and the granted ones.
fn load(
    files: &dyn crate::files::Files,
    path: &Path,
    text: String,
    grants: &[PathBuf],
) -> Option<Index> {
    let own = path.parent()?.to_path_buf();
    let allowed =
        crate::access::Allowed::new(files, std::iter::once(own).chain(grants.iter().cloned()));
    let confined = crate::access::Confined::new(files, allowed);
    let mut sources = crate::source::SourceMap::default();
    let mut diags = Vec::new();
    let name = path.display().to_string();
    let root = sources.add(crate::source::SourceFile::new(
        path.to_path_buf(),
        name,
        text,
    ));
    let mut loader = crate::resolve::Loader::new(&mut sources, &mut diags, &confined);
    loader.load(root);
    let program = loader.resolve(root);
    Some(Index::build(&sources, &program))
}

/// The text a file of another compilation must hold to use a symbol.
fn needle(ix: &Index, s: &Symbol) -> String {
    match s {
        Symbol::Def(k, start) => ix
            .def_at(k, *start)
            .and_then(|d| ix.defs.get(d))
            .map(|d| d.name.clone())
            .unwrap_or_default(),
        Symbol::Op(n) | Symbol::Library(n) => n.to_string(),
        Symbol::File(k) => k
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string(),
    }
}

/// The workspace files that may use a symbol ([`others`]); none for a name
/// only its own declaration can see (a `let`, a function's parameter, a
/// layer's dimension parameter: the index resolves them in the enclosing
/// function's or layer's scope alone), so its references and rename read no
/// other file.
fn beyond(st: &State, ix: &Index, t: Target, s: &Symbol) -> Vec<Arc<Index>> {
    let local = match t {
        Target::Def(d) => ix
            .defs
            .get(d)
            .is_some_and(|d| matches!(d.kind, Kind::Let | Kind::FnParam | Kind::Param)),
        Target::Op(_) | Target::Library(_) | Target::File(_) => false,
    };
    if local {
        return Vec::new();
    }
    others(st, &needle(ix, s))
}

/// Every occurrence of a symbol in every index: (file key, start, end, is a
/// declaration), each once.
fn occurrences(
    st: &State,
    s: &Symbol,
    extra: &[Arc<Index>],
) -> Vec<(PathBuf, usize, usize, bool, String)> {
    let mut keys: Vec<&PathBuf> = st.analyses.keys().collect();
    keys.sort();
    let ixs = keys
        .into_iter()
        .map(|k| st.analyses[k].index.as_ref())
        .chain(extra.iter().map(|ix| ix.as_ref()));
    let mut out: Vec<(PathBuf, usize, usize, bool, String)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for ix in ixs {
        let Some(t) = target(ix, s) else { continue };
        for o in ix.occs_of(t) {
            let f = &ix.files[o.file];
            if seen.insert((f.key.clone(), o.start, o.end)) {
                out.push((f.key.clone(), o.start, o.end, o.is_def, f.text.clone()));
            }
        }
    }
    out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
    out
}

fn locations(st: &State, occs: &[(PathBuf, usize, usize, bool, String)]) -> Vec<Location> {
    occs.iter()
        .filter_map(|(k, s, e, _, text)| {
            Some(Location {
                uri: st.uri(k)?,
                range: range_now(st, k, text, *s, *e)?,
            })
        })
        .collect()
}

pub fn references(st: &State, p: ReferenceParams) -> Option<Vec<Location>> {
    let at = at_params(st, &p.text_document_position)?;
    let o = at.occ()?;
    let s = symbol(at.ix, o.target)?;
    let extra = beyond(st, at.ix, o.target, &s);
    let mut occs = occurrences(st, &s, &extra);
    if !p.context.include_declaration {
        occs.retain(|o| !o.3);
    }
    Some(locations(st, &occs))
}

pub fn highlight(st: &State, p: DocumentHighlightParams) -> Option<Vec<DocumentHighlight>> {
    let at = at_params(st, &p.text_document_position_params)?;
    let o = at.occ()?;
    Some(
        at.ix
            .occs_of(o.target)
            .filter(|x| x.file == at.file)
            .filter_map(|x| {
                Some(DocumentHighlight {
                    range: at.view.range(x.start, x.end)?,
                    kind: Some(if x.is_def {
                        DocumentHighlightKind::WRITE
                    } else {
                        DocumentHighlightKind::READ
                    }),
                })
            })
            .collect(),
    )
}

type Refusal = (ErrorCode, String);

/// What can be renamed: a declaration outside the standard library.
fn renamable<'a>(at: &'a At) -> Result<(&'a Occ, usize), Refusal> {
    let refuse = |m: &str| Err((ErrorCode::RequestFailed, m.to_string()));
    let Some(o) = at.occ() else {
        return refuse("there is no name here to rename");
    };
    let d = match o.target {
        Target::Def(d) => d,
        Target::Op(n) | Target::Library(n) => {
            return refuse(&format!("`{n}` is built into the language"))
        }
        Target::File(_) => return refuse("an import is renamed by renaming its file"),
    };
    let Some(def) = at.ix.defs.get(d) else {
        return refuse("there is no name here to rename");
    };
    if text::is_std(&at.ix.files[def.file].key) {
        return refuse(&format!(
            "`{}` is declared in the standard library",
            def.name
        ));
    }
    Ok((o, d))
}

pub fn prepare_rename(
    st: &State,
    p: TextDocumentPositionParams,
) -> Result<Option<PrepareRenameResponse>, Refusal> {
    let Some(at) = at_params(st, &p) else {
        return Ok(None);
    };
    let (o, _) = renamable(&at)?;
    let Some(range) = at.view.range(o.start, o.end) else {
        return Ok(None);
    };
    Ok(Some(PrepareRenameResponse::Range(range)))
}

/// Whether `s` is a name the grammar accepts for a declaration.
pub fn is_ident(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && c.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !super::complete::KEYWORDS.contains(&s)
        && crate::ast::DType::parse(s).is_none()
}

// `WorkspaceEdit` is keyed by `Uri`, whose hash does not change.
#[allow(clippy::mutable_key_type)]
pub fn rename(st: &State, p: RenameParams) -> Result<Option<WorkspaceEdit>, Refusal> {
    let Some(at) = at_params(st, &p.text_document_position) else {
        return Ok(None);
    };
    let (_, d) = renamable(&at)?;
    if !is_ident(&p.new_name) {
        return Err((
            ErrorCode::InvalidParams,
            format!(
                "`{}` is not a name (a letter or `_`, then letters, digits or `_`; not a keyword)",
                super::transport::clip(&p.new_name, 60)
            ),
        ));
    }
    let Some(s) = symbol(at.ix, Target::Def(d)) else {
        return Ok(None);
    };
    let extra = beyond(st, at.ix, Target::Def(d), &s);
    let mut changes: HashMap<Uri, Vec<TextEdit>> = HashMap::new();
    for (k, s, e, _, text) in occurrences(st, &s, &extra) {
        let Some(uri) = st.uri(&k) else { continue };
        // Buffers are edited as the client has them: a use inside text
        // edited since the last parse cannot be placed, so none is renamed.
        let Some(range) = range_now(st, &k, &text, s, e) else {
            return Err((
                ErrorCode::ContentModified,
                format!(
                    "`{}` changed since it last parsed: rename once it parses again",
                    k.display()
                ),
            ));
        };
        changes.entry(uri).or_default().push(TextEdit {
            range,
            new_text: p.new_name.clone(),
        });
    }
    Ok(Some(WorkspaceEdit {
        changes: Some(changes),
        ..WorkspaceEdit::default()
    }))
}

fn markdown(value: String) -> Hover {
    Hover {
        contents: HoverContents::Markup(MarkupContent {
            kind: MarkupKind::Markdown,
            value,
        }),
        range: None,
    }
}

/// A binding's inferred type, per-device shape and layout.
fn typed(t: &crate::check::TypeEntry) -> String {
    let mut value = format!(
        "```shard\n{}: {}\n```\nper device: `{}`",
        t.name,
        t.ty(),
        t.local()
    );
    if let Some(u) = &t.used_as {
        value.push_str(&format!("\n\ngathered for use: `{u}`"));
    }
    if let Some(mesh) = &t.mesh {
        // Where the pieces live, as `shardc show` draws it.
        let topo = crate::mesh::Topology::of(mesh);
        let grid = crate::layout::draw(&t.name, &t.t, &topo, None);
        let grid: String = grid.lines().skip(1).map(|l| format!("{l}\n")).collect();
        value.push_str(&format!("\n\n```text\n{grid}```"));
    }
    value
}

/// The registry's word on a built-in op: its signature and rule.
pub fn op_doc(name: &str) -> Option<String> {
    let d = crate::prim::find(name)?;
    let kind = match d.kind {
        crate::prim::Kind::Collective => "collective",
        _ => "built-in function",
    };
    Some(format!(
        "```shard\n{}\n```\n{kind}: {}",
        d.signature, d.rule
    ))
}

/// An optimizer's, schedule's or data source's name and arguments (the
/// registry's, `crate::vocab`).
pub fn library_args(name: &str) -> Option<(&'static str, Vec<&'static str>)> {
    crate::vocab::call(name).map(|(_, e)| (e.name(), e.args().iter().map(|a| a.name).collect()))
}

fn library_doc(name: &str) -> String {
    match crate::vocab::word(name) {
        Some((what, e)) => crate::vocab::docs::hover(what, e),
        None => format!("```shard\n{name}\n```\nbuilt-in"),
    }
}

/// What a declaration is, for hovers on it and its uses.
fn def_doc(st: &State, a: &Analysis, ix: &Index, d: usize) -> String {
    let def = &ix.defs[d];
    let key = &ix.files[def.file].key;
    // A binding with a type: as the checker inferred it (the first instance).
    if let Some((_, _, _, t)) = a
        .types
        .iter()
        .find(|(k, s, _, _)| k == key && *s == def.name_span.0)
    {
        return typed(t);
    }
    let container = def
        .container
        .and_then(|c| ix.defs.get(c))
        .map(|c| format!(" of `{}`", c.name))
        .unwrap_or_default();
    let mut s = match def.kind {
        Kind::Const => format!(
            "```shard\nconst {} = {}\n```",
            def.name,
            def.value
                .map_or_else(|| ix.header(def).replace("const ", ""), |v| v.to_string())
        ),
        Kind::Axis => {
            let size = def
                .value
                .map(|v| format!(": {v} devices"))
                .unwrap_or_default();
            format!(
                "```shard\n{}\n```\nmesh axis{container}{size}",
                ix.header(def)
            )
        }
        Kind::Mesh => {
            let devices = a
                .meshes
                .iter()
                .find(|(n, _)| *n == def.name)
                .map(|(_, axes)| axes.iter().map(|x| x.1).product::<i64>());
            let devices = devices
                .map(|n| format!("\n\n{n} devices"))
                .unwrap_or_default();
            format!("```shard\n{}\n```{devices}", ix.header(def))
        }
        _ => format!(
            "```shard\n{}\n```\n{}{container}",
            ix.header(def),
            def.kind.word()
        ),
    };
    let doc = ix.doc_comment(def);
    if !doc.is_empty()
        && matches!(
            def.kind,
            Kind::Layer | Kind::Model | Kind::Const | Kind::Mesh | Kind::Table | Kind::Feature
        )
    {
        s.push_str(&format!("\n\n{doc}"));
    }
    let _ = st;
    s
}

pub fn hover(st: &State, p: HoverParams) -> Option<Hover> {
    let at = at_params(st, &p.text_document_position_params)?;
    let key = &at.ix.files[at.file].key;
    // The collectives the plan counts at the innermost expression here.
    let comms: Vec<&str> = {
        let mut here: Vec<&(PathBuf, usize, usize, String)> =
            at.a.comms
                .iter()
                .filter(|(k, s, e, _)| k == key && at.here.is_some_and(|o| *s <= o && o < *e))
                .collect();
        let inner = here.iter().map(|c| c.2 - c.1).min();
        here.retain(|c| Some(c.2 - c.1) == inner);
        here.into_iter().map(|c| c.3.as_str()).collect()
    };
    let with_comms = |v: String| match comms.is_empty() {
        true => v,
        false => format!("{v}\n\n---\n\n{}", comms.join("\n\n")),
    };
    // On a binding the checker typed.
    if let Some((_, _, _, t)) =
        at.a.types
            .iter()
            .find(|(k, s, e, _)| k == key && at.here.is_some_and(|o| *s <= o && o <= *e))
    {
        return Some(markdown(with_comms(typed(t))));
    }
    let Some(o) = at.occ() else {
        return (!comms.is_empty()).then(|| markdown(comms.join("\n\n")));
    };
    let value = match o.target {
        Target::Def(d) => def_doc(st, at.a, at.ix, d),
        Target::Op(n) => op_doc(n)?,
        Target::Library(n) => library_doc(n),
        Target::File(f) => format!("`{}`", at.ix.files.get(f)?.name),
    };
    let mut h = markdown(with_comms(value));
    h.range = at.view.range(o.start, o.end);
    Some(h)
}

/// `workspace/symbol`: the declarations (constants, meshes, layers, models,
/// tables, features, trains and layers' functions) whose name holds the
/// query, ignoring case, in every open buffer's compilation and every
/// `.shard` file of the workspace; each once.
pub fn workspace_symbols(st: &State, p: WorkspaceSymbolParams) -> Option<WorkspaceSymbolResponse> {
    let query = p.query.to_lowercase();
    let wanted = |k: Kind| {
        matches!(
            k,
            Kind::Const
                | Kind::Mesh
                | Kind::Layer
                | Kind::Model
                | Kind::Table
                | Kind::Feature
                | Kind::Train
                | Kind::Fn
        )
    };
    let mut keys: Vec<&PathBuf> = st.analyses.keys().collect();
    keys.sort();
    // Every workspace file: the query matches names ignoring case, so no
    // file can be passed over by its text.
    let extra = others(st, "");
    let ixs = keys
        .into_iter()
        .map(|k| st.analyses[k].index.as_ref())
        .chain(extra.iter().map(|ix| ix.as_ref()));
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for ix in ixs {
        for d in &ix.defs {
            if !wanted(d.kind) || !d.name.to_lowercase().contains(&query) {
                continue;
            }
            let f = &ix.files[d.file];
            if !seen.insert((f.key.clone(), d.name_span.0)) {
                continue;
            }
            let Some(loc) = location(st, ix, d.file, d.name_span.0, d.name_span.1) else {
                continue;
            };
            let container = d
                .container
                .and_then(|c| ix.defs.get(c))
                .map(|c| c.name.clone());
            #[allow(deprecated)]
            out.push(SymbolInformation {
                name: d.name.clone(),
                kind: super::outline::symbol_kind(d.kind),
                tags: None,
                deprecated: None,
                location: loc,
                container_name: container,
            });
        }
    }
    out.sort_by(|a, b| {
        (a.name.as_str(), a.location.uri.as_str()).cmp(&(b.name.as_str(), b.location.uri.as_str()))
    });
    Some(WorkspaceSymbolResponse::Flat(out))
}

/// `textDocument/documentLink`: each `import` of the file, linked to the
/// file it loads (a stdlib module to its copy on disk).
pub fn document_links(st: &State, p: DocumentLinkParams) -> Option<Vec<DocumentLink>> {
    let at = at(st, &p.text_document.uri, Position::new(0, 0))?;
    let ix = at.ix;
    let lines = Lines::new(&ix.files[at.file].text, st.enc);
    let links = ix.files[at.file]
        .imports
        .iter()
        .filter_map(|(s, e, target)| {
            let t = ix.files.get((*target)?)?;
            Some(DocumentLink {
                range: lines.range(*s, *e),
                target: Some(st.uri(&t.key)?),
                tooltip: Some(t.key.display().to_string()),
                data: None,
            })
        })
        .collect();
    Some(links)
}
