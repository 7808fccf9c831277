//! Checked functions kept from one compilation to the next (the editor's).
//!
//! Why: the language server checks the whole buffer at every keystroke, and
//! checking a layer's function is most of that (a 2,000-line file of 125
//! layers spent ~60% of an edit in the type checker, re-checking 124 layers
//! the edit did not touch). A call of a layer's function ([`Checker::call_fn`])
//! that checked cleanly (no diagnostic, no new instance, a tensor result) is
//! kept with everything it did: the bodies it made (each also a memo entry),
//! the binding types it recorded, the weights it read. The next compilation
//! replays it when the call is the same: the same instance, function,
//! argument types, bound sizes and flags, and the same text for every
//! declaration of the instance's tree, the same constants and layer names.
//!
//! Spans are kept as the text around them places them: the file, the
//! top-level item (by a hash of its text, [`crate::reparse`]'s pieces) and
//! the offset in it; a replay finds each item again in the new text, or is
//! not made (the call is checked). The call's own arguments are the
//! caller's: their spans come from the call being replayed. A test compiles
//! every `.shard` file of the repository after an edit that moves every item
//! and compares with a compilation that kept nothing.
//!
//! Only the language server turns it on ([`remember`]).

use super::{Body, BodyId, Checker, Inst, Op, Val};
use crate::diag::{Diagnostic, Severity};
use crate::source::{FileId, SourceMap, Span};
use crate::types::TType;
use rustc_hash::FxHashMap;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

static ON: AtomicBool = AtomicBool::new(false);

/// By the compilation's root file: the calls its last compilation checked
/// or replayed (what an edit of that buffer can reuse; older ones are let go,
/// so memory stays about one compilation's bodies per open buffer).
static CACHE: Mutex<Option<HashMap<PathBuf, Calls>>> = Mutex::new(None);

type Calls = HashMap<String, Arc<Entry>>;

/// At most this many root files are kept; past it the cache starts over.
const MAX_ROOTS: usize = 256;

/// Body references at or above this are to bodies made before the call
/// (`Entry::external`), below it to the call's own (`Entry::bodies`).
const EXTERNAL: usize = usize::MAX / 2;

/// Calls replayed in this process (for tests: a comparison that replayed
/// nothing compared nothing).
static REPLAYED: AtomicUsize = AtomicUsize::new(0);

/// Keeps checked calls for this process (`shardc lsp`).
pub fn remember() {
    ON.store(true, Ordering::Relaxed);
}

/// Drops every kept call.
pub fn forget() {
    if let Ok(mut c) = CACHE.lock() {
        *c = None;
    }
}

/// How many calls this process replayed.
pub fn replayed() -> usize {
    REPLAYED.load(Ordering::Relaxed)
}

/// A span as the text around it places it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    Default,
    At {
        /// Index into [`Entry::files`].
        file: u32,
        /// Hash of the text of the top-level item it is in.
        piece: u64,
        off: u32,
        len: u32,
    },
}

struct KeptType {
    span: Place,
    scope: String,
    name: String,
    kind: &'static str,
    t: TType,
    used_as: Option<String>,
}

/// What one clean call did.
pub(super) struct Entry {
    files: Vec<PathBuf>,
    /// The bodies it made, in order: memo key, body (references encoded,
    /// see [`EXTERNAL`]), each value's place, and the call's result.
    bodies: Vec<(String, Body, Vec<Place>, Val)>,
    /// Memo keys of the bodies made before the call that it refers to.
    external: Vec<String>,
    types: Vec<KeptType>,
    /// Declarations of the weights it read.
    weights: Vec<Place>,
    /// The notes it reported (N0001's inserted collectives), with the place
    /// of each of their spans ([`spans_of`] order).
    notes: Vec<(Diagnostic, Vec<Place>)>,
}

/// Every span of a diagnostic, in one order.
fn spans_of(d: &mut Diagnostic) -> Vec<&mut Span> {
    let mut out = vec![&mut d.primary.span];
    out.extend(d.secondary.iter_mut().map(|l| &mut l.span));
    out.extend(d.fix.iter_mut().map(|f| &mut f.span));
    out.extend(d.trace.iter_mut().map(|l| &mut l.span));
    out
}

/// One file cut into top-level items.
struct Pieces {
    starts: Vec<usize>,
    ends: Vec<usize>,
    hashes: Vec<u64>,
    /// Item start by hash; `None` when two items have the same text.
    at: FxHashMap<u64, Option<usize>>,
}

/// What a compilation knows to keep and replay: the sources, each file's
/// items, and each instance's dependency hash.
pub(super) struct Reuse<'p> {
    sources: &'p SourceMap,
    pieces: FxHashMap<FileId, Option<Pieces>>,
    by_path: FxHashMap<PathBuf, FileId>,
    deps: FxHashMap<String, Option<u64>>,
    /// Constants, layer names and flags: one hash for the compilation.
    globals: u64,
    /// The root file, the calls its last compilation kept, and those this
    /// one checked or replayed (kept in their place at the end, [`Reuse::commit`],
    /// unless this is a trial compilation).
    root: PathBuf,
    last: Calls,
    touched: Calls,
    commit: bool,
    /// Calls replayed so far in this compilation.
    replays: usize,
}

/// What a call did so far, to be kept if it ends clean.
pub(super) struct Mark {
    replays: usize,
    bodies: usize,
    types: usize,
    diags: usize,
    insts: usize,
    weights: usize,
}

fn hash_of<T: Hash + ?Sized>(t: &T) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

impl<'p> Reuse<'p> {
    /// `None` when the cache is off or the program has what it does not
    /// track (tables and features, read by name from any body).
    pub(super) fn new(
        sources: &'p SourceMap,
        prog: &crate::resolve::Program,
        flags: (bool, bool),
        commit: bool,
    ) -> Option<Reuse<'p>> {
        if !ON.load(Ordering::Relaxed) || !prog.tables.is_empty() || !prog.features.is_empty() {
            return None;
        }
        let mut consts: Vec<(&String, i64)> = prog.consts.iter().map(|(k, v)| (k, v.0)).collect();
        consts.sort();
        let mut layers: Vec<&String> = prog.layers.keys().collect();
        layers.sort();
        let by_path = sources
            .files()
            .map(|(id, f)| (f.path.clone(), id))
            .collect();
        let root = sources.get(prog.root).path.clone();
        // Taken, not copied, when this compilation's calls will replace them.
        let last = CACHE
            .lock()
            .ok()
            .and_then(|mut c| {
                let m = c.as_mut()?;
                if commit {
                    m.remove(&root)
                } else {
                    m.get(&root).cloned()
                }
            })
            .unwrap_or_default();
        Some(Reuse {
            sources,
            pieces: FxHashMap::default(),
            by_path,
            deps: FxHashMap::default(),
            globals: hash_of(&(consts, layers, flags)),
            root,
            last,
            touched: HashMap::new(),
            commit,
            replays: 0,
        })
    }

    /// The calls this compilation checked or replayed become what the next
    /// compilation of its root can reuse.
    pub(super) fn commit(self) {
        if !self.commit {
            return;
        }
        if let Ok(mut c) = CACHE.lock() {
            let m = c.get_or_insert_with(HashMap::new);
            if m.len() >= MAX_ROOTS && !m.contains_key(&self.root) {
                m.clear();
            }
            m.insert(self.root, self.touched);
        }
    }

    fn pieces(&mut self, file: FileId) -> Option<&Pieces> {
        let sources = self.sources;
        self.pieces
            .entry(file)
            .or_insert_with(|| {
                let text = &sources.files().nth(file.0 as usize)?.1.text;
                let starts = crate::reparse::pieces(text)?;
                let ends: Vec<usize> = starts
                    .iter()
                    .skip(1)
                    .copied()
                    .chain(std::iter::once(text.len()))
                    .collect();
                let hashes: Vec<u64> = starts
                    .iter()
                    .zip(&ends)
                    .map(|(s, e)| hash_of(text.get(*s..*e).unwrap_or_default()))
                    .collect();
                let mut at: FxHashMap<u64, Option<usize>> = FxHashMap::default();
                for (h, s) in hashes.iter().zip(&starts) {
                    at.entry(*h).and_modify(|x| *x = None).or_insert(Some(*s));
                }
                Some(Pieces {
                    starts,
                    ends,
                    hashes,
                    at,
                })
            })
            .as_ref()
    }

    /// The text of every declaration in `inst`'s tree, as one hash (`None`
    /// when a declaration's text cannot be read).
    fn deps(&mut self, inst: &Inst) -> Option<u64> {
        if let Some(d) = self.deps.get(&inst.key) {
            return *d;
        }
        let mut texts: Vec<&str> = Vec::new();
        let mut todo = vec![inst];
        let mut seen = std::collections::HashSet::new();
        let mut ok = true;
        while let Some(i) = todo.pop() {
            if !seen.insert(i.key.as_str()) {
                continue;
            }
            let span = i.decl.span;
            match self
                .sources
                .files()
                .nth(span.file.0 as usize)
                .and_then(|(_, f)| f.text.get(span.start as usize..span.end as usize))
            {
                Some(t) => texts.push(t),
                None => ok = false,
            }
            let mut subs: Vec<(&String, &Val)> = i.subs.iter().collect();
            subs.sort_by(|a, b| a.0.cmp(b.0));
            for (_, v) in subs {
                match v {
                    Val::Layer(s) | Val::Repeat(_, s, _, _) => todo.push(s),
                    _ => {}
                }
            }
        }
        let d = ok.then(|| hash_of(&texts));
        self.deps.insert(inst.key.clone(), d);
        d
    }

    /// The cache key of a call with memo key `memo` on `inst`.
    pub(super) fn key(&mut self, memo: &str, inst: &Inst) -> Option<String> {
        let deps = self.deps(inst)?;
        Some(format!("{memo}|{deps:x}|{:x}", self.globals))
    }

    fn place(&mut self, span: Span, files: &mut Vec<FileId>) -> Option<Place> {
        if span == Span::default() {
            return Some(Place::Default);
        }
        let p = self.pieces(span.file)?;
        let i = p.starts.partition_point(|s| *s <= span.start as usize);
        let i = i.checked_sub(1)?;
        let (start, end) = (p.starts[i], p.ends[i]);
        if span.end as usize > end {
            return None;
        }
        let piece = p.hashes[i];
        let file = match files.iter().position(|f| *f == span.file) {
            Some(k) => k,
            None => {
                files.push(span.file);
                files.len() - 1
            }
        };
        Some(Place::At {
            file: u32::try_from(file).ok()?,
            piece,
            off: span.start - u32::try_from(start).ok()?,
            len: span.end - span.start,
        })
    }

    /// The files of an entry as this compilation numbers them.
    fn ids(&self, files: &[PathBuf]) -> Vec<Option<FileId>> {
        files.iter().map(|f| self.by_path.get(f).copied()).collect()
    }

    fn span(&mut self, place: Place, ids: &[Option<FileId>]) -> Option<Span> {
        let Place::At {
            file,
            piece,
            off,
            len,
        } = place
        else {
            return Some(Span::default());
        };
        let id = (*ids.get(file as usize)?)?;
        let start = (*self.pieces(id)?.at.get(&piece)?)?;
        let start = u32::try_from(start).ok()? + off;
        Some(Span {
            file: id,
            start,
            end: start + len,
        })
    }
}

impl Checker<'_> {
    /// Where the checker stands before a call it may keep.
    pub(super) fn mark(&self) -> Mark {
        Mark {
            replays: self.reuse.as_ref().map_or(0, |r| r.replays),
            bodies: self.out.bodies.0.len(),
            types: self.out.types.len(),
            diags: self.diags.len(),
            insts: self.insts.len(),
            weights: self.weight_log.len(),
        }
    }

    /// Keeps the call checked since `m` under `key`, if it was clean. A call
    /// inside which some call was replayed is not kept: what it holds is
    /// kept already, and its own key changes with the edit that made it miss
    /// (typing in one layer would copy the whole model at every keystroke).
    pub(super) fn keep(&mut self, key: String, m: Mark, result: &Val) {
        if self.reuse.as_ref().is_some_and(|r| r.replays != m.replays) {
            return;
        }
        let notes_only = self
            .diags
            .get(m.diags..)
            .is_some_and(|ds| ds.iter().all(|d| d.severity == Severity::Note));
        if !matches!(result, Val::T(_))
            || !notes_only
            || self.insts.len() != m.insts
            || self.out.bodies.0.len() <= m.bodies
        {
            return;
        }
        if let Some(e) = self.entry(&m) {
            if let Some(r) = self.reuse.as_mut() {
                r.touched.insert(key, Arc::new(e));
            }
        }
    }

    fn entry(&mut self, m: &Mark) -> Option<Entry> {
        let mut files = Vec::new();
        let mut external: Vec<String> = Vec::new();
        let mut bodies = Vec::new();
        let reuse = self.reuse.as_mut()?;
        for id in m.bodies..self.out.bodies.0.len() {
            let (key, result) = self
                .memo_of
                .get(&id)
                .and_then(|k| Some((k.clone(), self.memo.get(k)?.1.clone())))?;
            let mut body = self.out.bodies.0.get(id)?.clone();
            let mut places = Vec::with_capacity(body.values.len());
            for v in &mut body.values {
                places.push(reuse.place(v.span, &mut files)?);
                v.span = Span::default();
                let r = match &mut v.op {
                    Op::Call(c) => Some(&mut c.body),
                    Op::Weight { computed, .. } => computed.as_mut(),
                    _ => None,
                };
                if let Some(b) = r {
                    if *b >= m.bodies {
                        *b -= m.bodies;
                    } else {
                        let k = self.memo_of.get(b)?;
                        let j = match external.iter().position(|e| e == k) {
                            Some(j) => j,
                            None => {
                                external.push(k.clone());
                                external.len() - 1
                            }
                        };
                        *b = EXTERNAL + j;
                    }
                }
            }
            bodies.push((key, body, places, result));
        }
        let mut types = Vec::new();
        for t in self.out.types.get(m.types..)? {
            types.push(KeptType {
                span: reuse.place(t.span, &mut files)?,
                scope: t.scope.clone(),
                name: t.name.clone(),
                kind: t.kind,
                t: t.t.clone(),
                used_as: t.used_as.clone(),
            });
        }
        let mut weights = Vec::new();
        for s in self.weight_log.get(m.weights..)? {
            weights.push(reuse.place(*s, &mut files)?);
        }
        let mut notes = Vec::new();
        for d in self.diags.get(m.diags..)? {
            let mut d = d.clone();
            let mut places = Vec::new();
            for s in spans_of(&mut d) {
                places.push(reuse.place(*s, &mut files)?);
                *s = Span::default();
            }
            notes.push((d, places));
        }
        let files = files
            .iter()
            .map(|id| Some(reuse.sources.files().nth(id.0 as usize)?.1.path.clone()))
            .collect::<Option<_>>()?;
        Some(Entry {
            files,
            bodies,
            external,
            types,
            weights,
            notes,
        })
    }

    /// Replays the call kept under `key`, its arguments at `args`: the body
    /// and result of the call, or `None` (nothing changed) when none is
    /// kept or its text is not all found again.
    pub(super) fn replay(&mut self, key: &str, args: &[Span]) -> Option<(BodyId, Val)> {
        let reuse = self.reuse.as_mut()?;
        let e = reuse.last.get(key)?.clone();
        let files = reuse.ids(&e.files);
        // Everything is placed before anything changes.
        let mut bodies: Vec<Vec<Span>> = Vec::with_capacity(e.bodies.len());
        for (_, _, places, _) in &e.bodies {
            let mut spans = Vec::with_capacity(places.len());
            for p in places {
                spans.push(reuse.span(*p, &files)?);
            }
            bodies.push(spans);
        }
        let mut types = Vec::with_capacity(e.types.len());
        for t in &e.types {
            types.push(reuse.span(t.span, &files)?);
        }
        let mut weights = Vec::with_capacity(e.weights.len());
        for w in &e.weights {
            weights.push(reuse.span(*w, &files)?);
        }
        let mut notes = Vec::with_capacity(e.notes.len());
        for (d, places) in &e.notes {
            let mut d = d.clone();
            for (s, p) in spans_of(&mut d).into_iter().zip(places) {
                *s = reuse.span(*p, &files)?;
            }
            notes.push(d);
        }
        let external: Vec<BodyId> = e
            .external
            .iter()
            .map(|k| self.memo.get(k).map(|d| d.0))
            .collect::<Option<_>>()?;
        // Every reference is to a body made before it or before the call.
        for (i, (_, body, _, _)) in e.bodies.iter().enumerate() {
            for v in &body.values {
                let r = match &v.op {
                    Op::Call(c) => Some(c.body),
                    Op::Weight { computed, .. } => *computed,
                    _ => None,
                };
                if r.is_some_and(|b| {
                    if b >= EXTERNAL {
                        b - EXTERNAL >= external.len()
                    } else {
                        b >= i
                    }
                }) {
                    return None;
                }
            }
        }
        // The call's own body is the last made; its arguments are this call's.
        let last = e.bodies.len().checked_sub(1)?;
        let mut ids: Vec<BodyId> = Vec::with_capacity(e.bodies.len());
        for (i, ((memo, body, _, result), spans)) in e.bodies.iter().zip(bodies).enumerate() {
            if let Some(done) = self.memo.get(memo) {
                ids.push(done.0);
                continue;
            }
            let mut body = body.clone();
            for (v, s) in body.values.iter_mut().zip(spans) {
                v.span = match v.op {
                    Op::Arg(a) if i == last => args.get(a).copied().unwrap_or(s),
                    _ => s,
                };
                let r = match &mut v.op {
                    Op::Call(c) => Some(&mut c.body),
                    Op::Weight { computed, .. } => computed.as_mut(),
                    _ => None,
                };
                if let Some(b) = r {
                    *b = if *b >= EXTERNAL {
                        *external.get(*b - EXTERNAL)?
                    } else {
                        *ids.get(*b)?
                    };
                }
            }
            self.out.bodies.0.push(body);
            let id = self.out.bodies.0.len() - 1;
            self.memo.insert(memo.clone(), (id, result.clone()));
            self.memo_of.insert(id, memo.clone());
            ids.push(id);
        }
        for (t, span) in e.types.iter().zip(types) {
            self.record_type(span, &t.scope, &t.name, t.kind, &t.t, t.used_as.clone());
        }
        for w in weights {
            self.used_weights.insert(w);
            self.weight_log.push(w);
        }
        self.diags.extend(notes);
        REPLAYED.fetch_add(1, Ordering::Relaxed);
        if let Some(r) = self.reuse.as_mut() {
            r.touched.insert(key.to_string(), e.clone());
            r.replays += 1;
        }
        let (_, _, _, result) = e.bodies.get(last)?;
        Some((*ids.get(last)?, result.clone()))
    }
}
