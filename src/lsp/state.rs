//! The server's picture of the workspace: the open buffers, one compilation
//! per open buffer (through `world::compile_text`, with every open buffer laid
//! over the disk, so an unsaved edit to an imported file is what its importers
//! see), and the diagnostics each file is shown. A diagnostic goes to the file
//! it is in; one in an imported file is also shown in the importer, at the
//! instantiation or `import` that brings it in, with the original as related
//! information. Edits only mark buffers dirty: [`State::flush`] re-checks each
//! dirty buffer and every open buffer that imports one, once, however many
//! edits were queued.

use super::index::{Index, Kind, Target};
use super::text::{self, Encoding, Lines};
use super::workspace::Kept;
use crate::check::TypeEntry;
use crate::diag::{self, Severity};
use crate::files::{Disk, Overlay};
use crate::world::{self, Options};
use lsp_types::{
    Diagnostic, DiagnosticRelatedInformation, DiagnosticSeverity, Location, NumberOrString,
    PublishDiagnosticsParams, Uri,
};
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub struct Doc {
    pub uri: Uri,
    pub text: String,
    pub version: i32,
}

/// What one compilation (an open buffer as the root) learned.
pub struct Analysis {
    pub root: usize,
    /// The last index whose root file parsed (navigation keeps working while
    /// a buffer is mid-edit).
    pub index: Arc<Index>,
    /// Types of bindings, by file key: (start, end, entry).
    pub types: Vec<(PathBuf, usize, usize, TypeEntry)>,
    /// Meshes: name and axes with sizes.
    pub meshes: Vec<(String, Vec<(String, i64)>)>,
    /// `train MODEL on MESH`.
    pub trains: Vec<(String, String)>,
    /// The diagnostics this compilation shows, by file key.
    pub shown: HashMap<PathBuf, Vec<Diagnostic>>,
    /// Whether the root file parsed (formatting needs it).
    pub parses: bool,
    /// The plan of each trained model in one line, at its `train` and its
    /// `model` declaration (code lenses): (file key, start, end, summary).
    pub lenses: Vec<(PathBuf, usize, usize, String)>,
    /// Each collective the plan counts at a place in the source (hover):
    /// (file key, start, end, what it moves per call and per step).
    pub comms: Vec<(PathBuf, usize, usize, String)>,
    /// The keys of the files the compilation read (those of the last one
    /// whose root parsed, while it does not).
    pub files: Vec<PathBuf>,
}

impl Analysis {
    /// The keys of every file the compilation read.
    pub fn reads(&self, key: &Path) -> bool {
        self.files.iter().any(|f| f == key)
    }
}

/// The largest buffer analysed unless the client or the command line says
/// otherwise (`maxDocumentBytes`, `--max-document-bytes`): a `.shard` file is a
/// few kilobytes; a huge one would hold the server's memory and a core for
/// minutes at every keystroke.
pub const DEFAULT_MAX_DOCUMENT: usize = 4 << 20;

pub struct State {
    pub enc: Encoding,
    pub opts: Options,
    /// Buffers longer than this many bytes are not analysed ([`State::flush`]
    /// shows one diagnostic saying so).
    pub max_document: usize,
    /// Open buffers by file key.
    pub docs: HashMap<PathBuf, Doc>,
    pub analyses: HashMap<PathBuf, Analysis>,
    /// Buffers edited since the last flush.
    dirty: BTreeSet<PathBuf>,
    /// Re-check every open buffer at the next flush (a buffer opened or closed
    /// can change what any import reads).
    all_dirty: bool,
    /// Buffers whose last analysis was quick ([`Options::quick`]): their
    /// plans and data checks run when the user pauses ([`State::settle`]).
    late: BTreeSet<PathBuf>,
    /// What each file was last shown.
    published: HashMap<PathBuf, (Uri, Vec<Diagnostic>)>,
    /// The workspace folders ([`super::workspace`]), canonical.
    pub roots: Vec<PathBuf>,
    /// Lines for the log from handlers that only read the state.
    notes: Mutex<Vec<String>>,
    /// The workspace's files as the last search read them ([`Kept`]), and
    /// whether the client reports changes on disk (only then is it kept).
    pub kept: Mutex<Kept>,
    pub watched: bool,
    /// Analyses whose diagnostics are out and whose index, types and
    /// lenses are being built on a thread of their own ([`State::finish`]).
    later: HashMap<PathBuf, Building>,
}

impl State {
    pub fn new(opts: Options) -> State {
        State {
            enc: Encoding::Utf16,
            opts,
            max_document: DEFAULT_MAX_DOCUMENT,
            docs: HashMap::new(),
            analyses: HashMap::new(),
            dirty: BTreeSet::new(),
            all_dirty: false,
            late: BTreeSet::new(),
            published: HashMap::new(),
            roots: Vec::new(),
            notes: Mutex::new(Vec::new()),
            later: HashMap::new(),
            kept: Mutex::new(Kept::default()),
            watched: false,
        }
    }

    /// A line for the server's log (written after the request is answered).
    pub fn note(&self, line: String) {
        if let Ok(mut notes) = self.notes.lock() {
            notes.push(line);
        }
    }

    /// The lines [`State::note`] collected since the last call.
    pub fn take_notes(&mut self) -> Vec<String> {
        match self.notes.get_mut() {
            Ok(notes) => std::mem::take(notes),
            Err(poisoned) => std::mem::take(poisoned.into_inner()),
        }
    }

    pub fn key_of(uri: &Uri) -> PathBuf {
        text::key(&text::path_of(uri))
    }

    /// The URI to show a file by: the client's own for open buffers.
    pub fn uri(&self, key: &Path) -> Option<Uri> {
        if let Some(d) = self.docs.get(key) {
            return Some(d.uri.clone());
        }
        if text::is_std(key) {
            text::materialize_std(key);
        }
        text::uri_of(key)
    }

    pub fn open(&mut self, uri: Uri, text: String, version: i32) {
        let key = Self::key_of(&uri);
        self.forget(&key);
        self.docs.insert(key.clone(), Doc { uri, text, version });
        self.dirty.insert(key);
        self.all_dirty = true;
    }

    /// Applies a `didChange`'s edits in order (a change without a range
    /// replaces the whole text).
    pub fn change(
        &mut self,
        uri: &Uri,
        version: i32,
        changes: Vec<lsp_types::TextDocumentContentChangeEvent>,
    ) {
        let key = Self::key_of(uri);
        let enc = self.enc;
        self.forget(&key);
        let Some(doc) = self.docs.get_mut(&key) else {
            return;
        };
        for c in changes {
            match c.range {
                None => doc.text = c.text,
                Some(r) => {
                    let lines = Lines::new(&doc.text, enc);
                    let (s, e) = (lines.offset(r.start), lines.offset(r.end));
                    let (s, e) = (s.min(e), s.max(e));
                    doc.text.replace_range(s..e, &c.text);
                }
            }
        }
        doc.version = version;
        self.dirty.insert(key);
    }

    pub fn close(&mut self, uri: &Uri) {
        let key = Self::key_of(uri);
        self.forget(&key);
        self.docs.remove(&key);
        self.analyses.remove(&key);
        self.all_dirty = true;
    }

    /// Everything changed on disk (`didChangeWatchedFiles`, `didSave`).
    pub fn disk_changed(&mut self) {
        self.all_dirty = true;
        if let Ok(mut k) = self.kept.lock() {
            *k = Kept::default();
        }
    }

    /// What the workspace searches read through buffer `key` is dropped.
    fn forget(&self, key: &Path) {
        if let Ok(mut k) = self.kept.lock() {
            k.forget(key);
        }
    }

    pub fn pending(&self) -> bool {
        self.all_dirty || !self.dirty.is_empty()
    }

    /// Re-checks the dirty buffers and their importers; returns the
    /// `publishDiagnostics` to send.
    pub fn flush(&mut self) -> Vec<PublishDiagnosticsParams> {
        if !self.pending() {
            return vec![];
        }
        let roots: BTreeSet<PathBuf> = if self.all_dirty {
            self.docs.keys().cloned().collect()
        } else {
            self.docs
                .keys()
                .filter(|k| {
                    self.dirty.contains(*k)
                        || self
                            .analyses
                            .get(*k)
                            .is_some_and(|a| self.dirty.iter().any(|d| a.reads(d)))
                })
                .cloned()
                .collect()
        };
        // Buffers opened or edited get an answer even when nothing changed;
        // their importers only when theirs did.
        let forced: BTreeSet<PathBuf> = std::mem::take(&mut self.dirty)
            .into_iter()
            .filter(|k| self.docs.contains_key(k))
            .collect();
        self.all_dirty = false;
        for key in &roots {
            self.reanalyze(key, true);
            self.late.insert(key.clone());
        }
        self.publish(&forced)
    }

    /// Whether some buffer waits for its full check ([`State::settle`]).
    pub fn settling(&self) -> bool {
        !self.late.is_empty()
    }

    /// The full check (plans, data) of the buffers the last flushes checked
    /// quickly, or of `only` among them; returns the `publishDiagnostics` of
    /// the files whose diagnostics changed.
    pub fn settle(&mut self, only: Option<&Path>) -> Vec<PublishDiagnosticsParams> {
        let keys: Vec<PathBuf> = match only {
            Some(k) => self.late.take(k).into_iter().collect(),
            None => std::mem::take(&mut self.late).into_iter().collect(),
        };
        let keys: Vec<PathBuf> = keys
            .into_iter()
            .filter(|k| self.docs.contains_key(k))
            .collect();
        if keys.is_empty() {
            return Vec::new();
        }
        for key in &keys {
            self.reanalyze(key, false);
        }
        self.publish(&BTreeSet::new())
    }

    fn reanalyze(&mut self, key: &Path, quick: bool) {
        let (mut a, later) = self.analyze(key, quick);
        // The last analysis's completion: superseded when this one parsed;
        // else what it built is what the editor keeps.
        if let Some(building) = self.later.remove(key) {
            if a.parses {
                drop_later(building);
            } else if let (Some(done), Some(old)) = (building.join(), self.analyses.get_mut(key)) {
                done.apply(old, key);
            }
        }
        if let Some(old) = self.analyses.get_mut(key).filter(|_| !a.parses) {
            // Mid-edit: keep what the last parse knew.
            a.meshes = std::mem::take(&mut old.meshes);
            a.trains = std::mem::take(&mut old.trains);
            a.types = std::mem::take(&mut old.types);
            // Navigation keeps the last index whose root parsed.
            if old.index.file_of(key).is_some() {
                a.index = old.index.clone();
                a.files = std::mem::take(&mut old.files);
            }
        }
        if let Some(old) = self.analyses.insert(key.to_path_buf(), a) {
            drop_later(old);
        }
        if let Some(later) = later {
            self.later.insert(key.to_path_buf(), Building::start(later));
        }
    }

    /// Completes the analyses whose diagnostics were sent ([`Later`]):
    /// before any request is answered. `Err` names a completion that
    /// panicked (a bug): its analysis answers from what it has.
    pub fn finish(&mut self) -> Result<(), String> {
        let mut failed = Ok(());
        for (key, building) in std::mem::take(&mut self.later) {
            match (building.join(), self.analyses.get_mut(&key)) {
                (Some(done), Some(a)) => done.apply(a, &key),
                (None, _) => failed = Err(format!("indexing {}", key.display())),
                _ => {}
            }
        }
        failed
    }

    fn analyze(&self, key: &Path, quick: bool) -> (Analysis, Option<Later>) {
        let mut files = Overlay::new(&Disk);
        // An oversized buffer is not laid over the disk: an importer reads the
        // file as `shardc check` would (at most 16 MiB).
        for (k, d) in self
            .docs
            .iter()
            .filter(|(_, d)| d.text.len() <= self.max_document)
        {
            files.insert(k, d.text.clone());
        }
        let len = self.docs.get(key).map_or(0, |d| d.text.len());
        if len > self.max_document {
            return (self.oversized(&files, key, len), None);
        }
        let text = self
            .docs
            .get(key)
            .map(|d| d.text.clone())
            .unwrap_or_default();
        let enc = self.enc;
        let opts = Options {
            quick,
            ..self.opts.clone()
        };
        // Indexing walks the syntax trees recursively: on a stack as large as
        // the compiler's.
        let work = || analyze(&files, key, text, &opts, enc);
        std::thread::scope(|s| {
            let worker = std::thread::Builder::new()
                .name("analyze".into())
                .stack_size(world::COMPILE_STACK)
                .spawn_scoped(s, work);
            let (a, later) = match worker {
                Ok(h) => h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)),
                Err(_) => analyze(&files, key, String::new(), &self.opts, enc),
            };
            (a, Some(later))
        })
    }

    /// A buffer over [`State::max_document`]: nothing of it is analysed (an
    /// empty analysis, so requests on it answer emptily), and one diagnostic
    /// at its start says why and how to raise the limit.
    fn oversized(&self, files: &Overlay, key: &Path, len: usize) -> Analysis {
        let (mut a, later) = analyze(files, key, String::new(), &self.opts, self.enc);
        later.build().apply(&mut a, key);
        a.parses = false;
        let diagnostic = Diagnostic {
            range: lsp_types::Range::default(),
            severity: Some(DiagnosticSeverity::WARNING),
            source: Some("shardc".into()),
            message: format!(
                "this document is {len} bytes, more than the {} bytes the editor analyses; it is not checked (raise the limit with the `maxDocumentBytes` initialization option or `shardc lsp --max-document-bytes`, or run `shardc check` on it)",
                self.max_document
            ),
            ..Diagnostic::default()
        };
        a.shown = HashMap::from([(key.to_path_buf(), vec![diagnostic])]);
        a
    }

    /// The union of what every compilation shows each file, sent for the
    /// files whose set changed and for the re-checked roots.
    fn publish(&mut self, roots: &BTreeSet<PathBuf>) -> Vec<PublishDiagnosticsParams> {
        let mut now: HashMap<PathBuf, Vec<Diagnostic>> = HashMap::new();
        for k in self.docs.keys() {
            now.entry(k.clone()).or_default();
        }
        let mut keys: Vec<&PathBuf> = self.analyses.keys().collect();
        keys.sort();
        for k in keys {
            for (file, ds) in &self.analyses[k].shown {
                let all = now.entry(file.clone()).or_default();
                for d in ds {
                    if !all.iter().any(|x| same(x, d)) {
                        all.push(d.clone());
                    }
                }
            }
        }
        for k in self.published.keys() {
            now.entry(k.clone()).or_default();
        }
        let mut out = Vec::new();
        let mut files: Vec<PathBuf> = now.keys().cloned().collect();
        files.sort();
        for file in files {
            let ds = now.remove(&file).unwrap_or_default();
            let before = self.published.get(&file).map(|(_, d)| d);
            if before == Some(&ds) && !roots.contains(&file) {
                continue;
            }
            let Some(uri) = self.uri(&file) else {
                continue;
            };
            let version = self.docs.get(&file).map(|d| d.version);
            out.push(PublishDiagnosticsParams {
                uri: uri.clone(),
                diagnostics: ds.clone(),
                version,
            });
            if ds.is_empty() && !self.docs.contains_key(&file) {
                self.published.remove(&file);
            } else {
                self.published.insert(file, (uri, ds));
            }
        }
        out
    }

    /// The diagnostics last shown for a file.
    pub fn shown(&self, key: &Path) -> &[Diagnostic] {
        self.published.get(key).map_or(&[], |(_, d)| d)
    }
}

fn same(a: &Diagnostic, b: &Diagnostic) -> bool {
    a.range == b.range && a.code == b.code && a.message == b.message
}

fn analyze(
    files: &Overlay,
    key: &Path,
    text: String,
    opts: &Options,
    enc: Encoding,
) -> (Analysis, Later) {
    let c = world::compile_text(files, key, text, opts);
    let root = c.program.root.0 as usize;
    let parses = c.program.syntax.iter().any(|(f, _)| *f == c.program.root);
    let keys: Vec<PathBuf> = c.sources.files().map(|(_, f)| text::key(&f.path)).collect();
    // Placing a diagnostic of an imported file in the importer needs the
    // index; otherwise it is built after the diagnostics are sent.
    let fresh = c
        .diagnostics
        .iter()
        .any(|d| d.primary.span.file != c.program.root && d.severity != Severity::Note)
        .then(|| Arc::new(Index::build(&c.sources, &c.program)));
    let meshes = c
        .program
        .meshes
        .iter()
        .map(|m| {
            let axes = m.axes.iter().map(|a| (a.0.clone(), a.1)).collect();
            (m.name.clone(), axes)
        })
        .collect();
    let trains = c
        .program
        .trains
        .iter()
        .map(|t| (t.model.name.clone(), t.mesh.name.clone()))
        .collect();
    let shown = shown(&c, &keys, fresh.as_deref(), enc);
    let a = Analysis {
        root,
        index: fresh.clone().unwrap_or_default(),
        types: Vec::new(),
        meshes,
        trains,
        shown,
        parses,
        lenses: Vec::new(),
        comms: Vec::new(),
        files: keys.clone(),
    };
    let later = Later { c, keys, fresh };
    (a, later)
}

/// What an analysis still needs once its diagnostics are out: the index
/// (navigation, hovers), the binding types (inlay hints) and the plans'
/// figures (code lenses). Built on a thread of its own after
/// `publishDiagnostics` is sent ([`Building`]), so an edit's diagnostics do
/// not wait for them, and a next edit's check runs beside it.
pub struct Later {
    c: world::Compilation,
    keys: Vec<PathBuf>,
    fresh: Option<Arc<Index>>,
}

/// What [`Later`] built.
pub struct Done {
    index: Arc<Index>,
    types: Vec<(PathBuf, usize, usize, TypeEntry)>,
    lenses: Vec<(PathBuf, usize, usize, String)>,
    comms: Vec<(PathBuf, usize, usize, String)>,
}

impl Later {
    fn build(self) -> Done {
        let Later { c, keys, fresh } = self;
        let fresh = fresh.unwrap_or_else(|| Arc::new(Index::build(&c.sources, &c.program)));
        let types = c
            .checked
            .types
            .iter()
            .filter_map(|t| {
                let k = keys.get(t.span.file.0 as usize)?;
                Some((
                    k.clone(),
                    t.span.start as usize,
                    t.span.end as usize,
                    t.clone(),
                ))
            })
            .collect();
        let (lenses, comms) = costs(&c, &fresh, &keys);
        Done {
            index: fresh,
            types,
            lenses,
            comms,
        }
    }
}

impl Done {
    /// Into the analysis of root `key`. Mid-edit (the root does not parse),
    /// the index and types of the last parse stay ([`State::reanalyze`]).
    fn apply(self, a: &mut Analysis, key: &Path) {
        if a.parses || a.index.file_of(key).is_none() {
            a.index = self.index;
        }
        if a.parses || a.types.is_empty() {
            a.types = self.types;
        }
        a.lenses = self.lenses;
        a.comms = self.comms;
    }
}

/// A [`Later`] being built: on a thread (indexing recurses through the
/// syntax trees: the compiler's stack), or, when no thread can be had,
/// already built.
pub enum Building {
    Thread(std::thread::JoinHandle<Option<Done>>),
    Built(Option<Box<Done>>),
}

impl Building {
    fn start(later: Later) -> Building {
        let slot = Arc::new(Mutex::new(Some(later)));
        let theirs = slot.clone();
        let spawned = std::thread::Builder::new()
            .name("index".into())
            .stack_size(world::COMPILE_STACK)
            .spawn(move || {
                let later = theirs.lock().ok().and_then(|mut l| l.take());
                later.map(Later::build)
            });
        match spawned {
            Ok(h) => Building::Thread(h),
            // No thread to be had (a resource limit): build it here.
            Err(_) => match slot.lock().ok().and_then(|mut l| l.take()) {
                Some(l) => Building::Built(Some(Box::new(l.build()))),
                None => Building::Built(None),
            },
        }
    }

    /// What was built; `None` when building panicked.
    fn join(self) -> Option<Done> {
        match self {
            Building::Thread(h) => h.join().ok().flatten(),
            Building::Built(d) => d.map(|d| *d),
        }
    }
}

/// The diagnostics a compilation shows, by file key.
fn shown(
    c: &world::Compilation,
    keys: &[PathBuf],
    fresh: Option<&Index>,
    enc: Encoding,
) -> HashMap<PathBuf, Vec<Diagnostic>> {
    let root = c.program.root.0 as usize;
    let mut shown: HashMap<PathBuf, Vec<Diagnostic>> = HashMap::new();
    let texts: Vec<Lines> = c
        .sources
        .files()
        .map(|(_, f)| Lines::new(&f.text, enc))
        .collect();
    let loc = |span: crate::source::Span| -> Option<(PathBuf, lsp_types::Range)> {
        let f = span.file.0 as usize;
        Some((
            keys.get(f)?.clone(),
            texts.get(f)?.range(span.start as usize, span.end as usize),
        ))
    };
    for d in &c.diagnostics {
        let Some((file, range)) = loc(d.primary.span) else {
            continue;
        };
        let mut lsp = convert(d, range, &loc);
        shown.entry(file.clone()).or_default().push(lsp.clone());
        // In the importer too, where the imported file comes in.
        let f = d.primary.span.file.0 as usize;
        if f != root && d.severity != Severity::Note {
            let Some(site) = fresh.and_then(|ix| site(ix, root, f, d.primary.span.start as usize))
            else {
                continue;
            };
            let Some(uri) = text::uri_of(&file) else {
                continue;
            };
            let name = c.sources.get(d.primary.span.file).name.clone();
            let mut related = vec![DiagnosticRelatedInformation {
                location: Location { uri, range },
                message: d.message.clone(),
            }];
            related.extend(lsp.related_information.take().unwrap_or_default());
            lsp.message = format!("in {name}: {}", lsp.message);
            lsp.related_information = Some(related);
            lsp.range = texts[root].range(site.0, site.1);
            // A fix-it edits the other file, not this range.
            lsp.data = None;
            shown.entry(keys[root].clone()).or_default().push(lsp);
        }
    }
    shown
}

/// Frees `t` on a thread of its own: a compilation's types and bodies take
/// milliseconds to free (about a tenth of an edit's latency on a 2,000-line
/// file), which the diagnostics need not wait for.
fn drop_later<T: Send + 'static>(t: T) {
    let _ = std::thread::Builder::new()
        .name("drop".into())
        .spawn(move || drop(t));
}

/// The plans' figures where the editor shows them: one line per trained
/// model at its `train` and its `model` declaration, and per collective at
/// its place in the source, its bytes per call, calls per step and bytes per
/// step (`shardc plan`'s figures; none when the file has errors).
#[allow(clippy::type_complexity)]
fn costs(
    c: &world::Compilation,
    ix: &Index,
    keys: &[PathBuf],
) -> (
    Vec<(PathBuf, usize, usize, String)>,
    Vec<(PathBuf, usize, usize, String)>,
) {
    let at = |span: crate::source::Span| -> Option<(PathBuf, usize, usize)> {
        let k = keys.get(span.file.0 as usize)?;
        Some((k.clone(), span.start as usize, span.end as usize))
    };
    let (mut lenses, mut comms) = (Vec::new(), Vec::new());
    for p in &c.plans {
        let line = p.summary();
        if let Some((k, s, e)) = c.spec.train(Some(&p.model)).and_then(|t| at(t.span)) {
            lenses.push((k, s, e, line.clone()));
        }
        let model = ix
            .defs
            .iter()
            .find(|d| d.kind == super::index::Kind::Model && d.name == p.model);
        if let Some(d) = model {
            if let Some(f) = ix.files.get(d.file) {
                lenses.push((f.key.clone(), d.full.0, d.full.1, line));
            }
        }
        for m in p
            .comms
            .iter()
            .filter(|m| m.span != crate::source::Span::default())
        {
            let Some((k, s, e)) = at(m.span) else {
                continue;
            };
            let how = if m.explicit { "" } else { " (inserted)" };
            comms.push((
                k,
                s,
                e,
                format!(
                    "**{}**{how} over `{}`: {} per call × {} calls per step = {} per step (`{}` on `{}`)",
                    m.kind,
                    m.axes.join(", "),
                    crate::units::human_bytes(m.bytes),
                    m.count,
                    crate::units::human_bytes(m.bytes * m.count as f64),
                    p.model,
                    p.mesh
                ),
            ));
        }
    }
    (lenses, comms)
}

/// Where the root file brings in what is at `at` of file `f`: a use of the
/// layer declared there, else the `import` that (maybe through others) loads `f`.
fn site(ix: &Index, root: usize, f: usize, at: usize) -> Option<(usize, usize)> {
    if root >= ix.files.len() || f >= ix.files.len() {
        return None;
    }
    let layer = ix.enclosing(f, at, &[Kind::Layer, Kind::Model]);
    if let Some(l) = layer {
        if let Some(o) = ix
            .occs_of(Target::Def(l))
            .find(|o| o.file == root && !o.is_def)
        {
            return Some((o.start, o.end));
        }
    }
    for &(s, e, t) in &ix.files[root].imports {
        let Some(t) = t else { continue };
        // Files reachable from `t`.
        let mut seen = vec![false; ix.files.len()];
        let mut todo = vec![t];
        while let Some(x) = todo.pop() {
            if x == f {
                return Some((s, e));
            }
            if std::mem::replace(&mut seen[x], true) {
                continue;
            }
            todo.extend(ix.files[x].imports.iter().filter_map(|i| i.2));
        }
    }
    None
}

/// A compiler diagnostic as the protocol's: help and notes in the message,
/// secondary labels and the shape-flow trace as related information, the
/// fix-it in `data` (for code actions).
fn convert(
    d: &diag::Diagnostic,
    range: lsp_types::Range,
    loc: &dyn Fn(crate::source::Span) -> Option<(PathBuf, lsp_types::Range)>,
) -> Diagnostic {
    let mut message = d.message.clone();
    // The primary label says what is at the range (N0001's bytes per call
    // and per step); the editor shows no labels, so it joins the message.
    if !d.primary.text.is_empty() {
        message.push_str(&format!("\n{}", d.primary.text));
    }
    if let Some(h) = &d.help {
        message.push_str(&format!("\nhelp: {h}"));
    }
    for n in &d.notes {
        message.push_str(&format!("\nnote: {n}"));
    }
    let related: Vec<DiagnosticRelatedInformation> = d
        .secondary
        .iter()
        .chain(&d.trace)
        .filter_map(|l| {
            let (k, r) = loc(l.span)?;
            Some(DiagnosticRelatedInformation {
                location: Location {
                    uri: text::uri_of(&k)?,
                    range: r,
                },
                message: if l.text.is_empty() {
                    "here".into()
                } else {
                    l.text.clone()
                },
            })
        })
        .collect();
    let data = d.fix.as_ref().and_then(|fix| {
        let (k, r) = loc(fix.span)?;
        Some(serde_json::json!({
            "fix": {
                "uri": text::uri_of(&k)?.as_str(),
                "range": r,
                "newText": fix.replacement,
                "title": d.help.clone().unwrap_or_else(|| format!("replace with `{}`", fix.replacement)),
            }
        }))
    });
    Diagnostic {
        range,
        severity: Some(match d.severity {
            Severity::Error => DiagnosticSeverity::ERROR,
            Severity::Warning => DiagnosticSeverity::WARNING,
            Severity::Note => DiagnosticSeverity::INFORMATION,
        }),
        code: Some(NumberOrString::String(d.code.as_str().to_string())),
        source: Some("shardc".into()),
        message,
        related_information: (!related.is_empty()).then_some(related),
        tags: d
            .code
            .unnecessary()
            .then(|| vec![lsp_types::DiagnosticTag::UNNECESSARY]),
        data,
        ..Diagnostic::default()
    }
}
