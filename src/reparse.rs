//! Incremental parsing for the editor: a file is cut into its top-level items
//! (each begins with an item keyword outside brackets, comments and strings)
//! and each item's text is parsed once; an edit re-parses only the item it
//! touches. The cached items are moved to where their text is now (every
//! span shifted), so the tree is the one a whole-file parse gives — a test
//! compares the two on every `.shard` file of the repository. A file any of
//! whose pieces fails to parse is parsed whole, so its syntax error is the
//! whole-file parser's.
//!
//! Why: pest parses about 2 MB/s of this grammar, so a 2,000-line model took
//! 27 ms to parse at every keystroke (`scripts/lsp_bench.py`); the language
//! server and the auto-sharder (one compile per candidate layout) turn the
//! cache on ([`remember`]); other one-shot commands do not.

use crate::ast::*;
use crate::source::{FileId, Span};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

static ON: AtomicBool = AtomicBool::new(false);

/// Items parsed, by their text, with spans as if the text began a file 0.
static CACHE: Mutex<Option<HashMap<String, Arc<Vec<Item>>>>> = Mutex::new(None);

/// At most this many item texts are kept; past it the cache starts over.
const MAX_ENTRIES: usize = 20_000;

/// Turns the item cache on for this process (`shardc lsp`, `shardc shard`).
pub fn remember() {
    ON.store(true, Ordering::Relaxed);
}

/// The syntax tree of `text` as file `file`: from the cached items when the
/// cache is on and every item parses, else by [`crate::parse::parse`].
pub fn parse(file: FileId, text: &str) -> Result<File, Box<crate::diag::Problem>> {
    if !ON.load(Ordering::Relaxed) {
        return crate::parse::parse(file, text);
    }
    match pieces(text).and_then(|cuts| cached(file, text, &cuts)) {
        Some(items) => Ok(File { items }),
        None => crate::parse::parse(file, text),
    }
}

fn cached(file: FileId, text: &str, cuts: &[usize]) -> Option<Vec<Item>> {
    let mut items = Vec::new();
    for (i, &start) in cuts.iter().enumerate() {
        let end = cuts.get(i + 1).copied().unwrap_or(text.len());
        let piece = text.get(start..end)?;
        let hit = CACHE
            .lock()
            .ok()
            .and_then(|c| c.as_ref().and_then(|m| m.get(piece).cloned()));
        let parsed = match hit {
            Some(p) => p,
            None => {
                let p = Arc::new(crate::parse::parse(FileId(0), piece).ok()?.items);
                if let Ok(mut c) = CACHE.lock() {
                    let m = c.get_or_insert_with(HashMap::new);
                    if m.len() >= MAX_ENTRIES {
                        m.clear();
                    }
                    m.insert(piece.to_string(), p.clone());
                }
                p
            }
        };
        let to = To {
            file,
            by: u32::try_from(start).ok()?,
        };
        for item in parsed.iter() {
            let mut item = item.clone();
            item.shift(&to);
            items.push(item);
        }
    }
    Some(items)
}

/// Where each top-level item starts: at an item keyword (a whole word) at
/// bracket depth 0, outside comments and strings. `None` when the brackets
/// do not balance (the whole-file parser reports that).
pub(crate) fn pieces(text: &str) -> Option<Vec<usize>> {
    const ITEMS: [&[u8]; 9] = [
        b"import", b"pragma", b"const", b"mesh", b"layer", b"model", b"table", b"feature", b"train",
    ];
    let b = text.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut cuts = Vec::new();
    let mut depth: usize = 0;
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            i += rest.iter().position(|c| *c == b'\n').unwrap_or(rest.len());
        } else if rest.starts_with(b"/*") {
            i += rest[2..]
                .windows(2)
                .position(|w| w == b"*/")
                .map_or(rest.len(), |k| k + 4);
        } else if rest[0] == b'"' {
            i += 1 + rest[1..]
                .iter()
                .position(|c| *c == b'"' || *c == b'\n')
                .map_or(rest.len() - 1, |k| k + 1);
        } else if matches!(rest[0], b'(' | b'[' | b'{') {
            depth += 1;
            i += 1;
        } else if matches!(rest[0], b')' | b']' | b'}') {
            depth = depth.checked_sub(1)?;
            i += 1;
        } else if word(rest[0]) {
            let len = rest.iter().position(|c| !word(*c)).unwrap_or(rest.len());
            if depth == 0 && ITEMS.contains(&&rest[..len]) {
                cuts.push(i);
            }
            i += len;
        } else {
            i += 1;
        }
    }
    // Text before the first item is comments and blanks (or an error the
    // whole-file parser reports).
    if depth != 0 || cuts.first().is_some_and(|c| *c != 0 && !blank(&text[..*c])) {
        return None;
    }
    if cuts.is_empty() {
        cuts.push(0);
    } else {
        cuts[0] = 0;
    }
    Some(cuts)
}

/// Whether a text is only blanks and comments.
fn blank(text: &str) -> bool {
    let mut t = text.trim_start();
    while !t.is_empty() {
        if let Some(r) = t.strip_prefix("//") {
            t = r.find('\n').map_or("", |k| &r[k..]);
        } else if let Some(r) = t.strip_prefix("/*") {
            match r.find("*/") {
                Some(k) => t = &r[k + 2..],
                None => return false,
            }
        } else {
            return false;
        }
        t = t.trim_start();
    }
    true
}

/// Where a cached item goes: its file, and how far into it its text starts.
struct To {
    file: FileId,
    by: u32,
}

trait Shift {
    fn shift(&mut self, to: &To);
}

impl Shift for Span {
    fn shift(&mut self, to: &To) {
        self.file = to.file;
        self.start = self.start.saturating_add(to.by);
        self.end = self.end.saturating_add(to.by);
    }
}

impl<T: Shift> Shift for Vec<T> {
    fn shift(&mut self, to: &To) {
        for x in self {
            x.shift(to);
        }
    }
}

impl<T: Shift> Shift for Option<T> {
    fn shift(&mut self, to: &To) {
        if let Some(x) = self {
            x.shift(to);
        }
    }
}

impl<T: Shift> Shift for Box<T> {
    fn shift(&mut self, to: &To) {
        (**self).shift(to);
    }
}

impl<A: Shift, B: Shift> Shift for (A, B) {
    fn shift(&mut self, to: &To) {
        self.0.shift(to);
        self.1.shift(to);
    }
}

impl Shift for ReduceOp {
    fn shift(&mut self, _: &To) {}
}

impl Shift for Ident {
    fn shift(&mut self, to: &To) {
        self.span.shift(to);
    }
}

impl Shift for Item {
    fn shift(&mut self, to: &To) {
        match self {
            Item::Import(i) => i.span.shift(to),
            Item::Pragma(p) => p.shift(to),
            Item::Const(c) => {
                c.name.shift(to);
                c.value.shift(to);
                c.span.shift(to);
            }
            Item::Mesh(m) => {
                m.name.shift(to);
                m.axes.shift(to);
                m.options.shift(to);
                m.span.shift(to);
            }
            Item::Layer(l) => {
                // A layer is shared (`Arc`) once resolved, not before.
                l.name.shift(to);
                l.params.shift(to);
                l.members.shift(to);
                l.span.shift(to);
            }
            Item::Table(t) => {
                t.name.shift(to);
                t.options.shift(to);
                t.span.shift(to);
            }
            Item::Feature(f) => {
                f.name.shift(to);
                f.ty.shift(to);
                f.table.shift(to);
                f.span.shift(to);
            }
            Item::Train(t) => {
                t.model.shift(to);
                t.mesh.shift(to);
                t.options.shift(to);
                t.span.shift(to);
            }
        }
    }
}

impl Shift for Member {
    fn shift(&mut self, to: &To) {
        match self {
            Member::Weight {
                name,
                ty,
                init,
                span,
            } => {
                name.shift(to);
                ty.shift(to);
                init.shift(to);
                span.shift(to);
            }
            Member::Sub { name, value, span } => {
                name.shift(to);
                value.shift(to);
                span.shift(to);
            }
            Member::Directive { name, args, span } => {
                name.shift(to);
                args.shift(to);
                span.shift(to);
            }
            Member::Fn(f) => {
                f.name.shift(to);
                f.params.shift(to);
                f.ret.shift(to);
                f.body.shift(to);
                f.span.shift(to);
            }
        }
    }
}

impl Shift for Block {
    fn shift(&mut self, to: &To) {
        for l in &mut self.lets {
            l.name.shift(to);
            l.rest.shift(to);
            l.ty.shift(to);
            l.value.shift(to);
            l.span.shift(to);
        }
        self.result.shift(to);
        self.span.shift(to);
    }
}

impl Shift for Options {
    fn shift(&mut self, to: &To) {
        self.entries.shift(to);
        self.span.shift(to);
    }
}

impl Shift for OptValue {
    fn shift(&mut self, to: &To) {
        match self {
            OptValue::Expr(e) => e.shift(to),
            OptValue::Options(o) => o.shift(to),
        }
    }
}

impl Shift for TypeExpr {
    fn shift(&mut self, to: &To) {
        self.dtype_span.shift(to);
        self.dims.shift(to);
        self.pending.shift(to);
        self.span.shift(to);
    }
}

impl Shift for DimSpec {
    fn shift(&mut self, to: &To) {
        match self {
            DimSpec::Ellipsis(s) => s.shift(to),
            DimSpec::Dim { size, axes, span } => {
                size.shift(to);
                axes.shift(to);
                span.shift(to);
            }
        }
    }
}

impl Shift for DimExpr {
    fn shift(&mut self, to: &To) {
        match self {
            DimExpr::Int(_, s) => s.shift(to),
            DimExpr::Name(i) => i.shift(to),
            DimExpr::Bin(a, _, b, s) => {
                a.shift(to);
                b.shift(to);
                s.shift(to);
            }
        }
    }
}

impl Shift for Expr {
    fn shift(&mut self, to: &To) {
        self.span.shift(to);
        match &mut self.kind {
            ExprKind::Float(_) | ExprKind::Int(_) | ExprKind::Str(_) | ExprKind::Name(_) => {}
            ExprKind::Neg(e) => e.shift(to),
            ExprKind::Bin(a, _, b) => {
                a.shift(to);
                b.shift(to);
            }
            ExprKind::Call(f, args) => {
                f.shift(to);
                args.shift(to);
            }
            ExprKind::Index(e, slices) => {
                e.shift(to);
                slices.shift(to);
            }
            ExprKind::Member(e, name) => {
                e.shift(to);
                name.shift(to);
            }
            ExprKind::List(items) => items.shift(to),
            ExprKind::Local(names, block) => {
                names.shift(to);
                block.shift(to);
            }
        }
    }
}

impl Shift for ListItem {
    fn shift(&mut self, to: &To) {
        match self {
            ListItem::Dim(d) => d.shift(to),
            ListItem::Expr(e) => e.shift(to),
        }
    }
}

impl Shift for Slice {
    fn shift(&mut self, to: &To) {
        match self {
            Slice::Range(a, b, s) => {
                a.shift(to);
                b.shift(to);
                s.shift(to);
            }
            Slice::At(d) => d.shift(to),
        }
    }
}

impl Shift for Arg {
    fn shift(&mut self, to: &To) {
        match self {
            Arg::Pos(e) => e.shift(to),
            Arg::Named(k, v) => {
                k.shift(to);
                v.shift(to);
            }
            Arg::Arrow(a, b, s) => {
                a.shift(to);
                b.shift(to);
                s.shift(to);
            }
        }
    }
}

impl Shift for DimArg {
    fn shift(&mut self, to: &To) {
        self.size.shift(to);
        self.axes.shift(to);
        self.span.shift(to);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `.shard` file of the repository, parsed from cached items (each
    /// item first parsed at another offset, so that every span is moved) and
    /// whole: the same tree.
    #[test]
    fn cached_items_give_the_whole_files_tree() {
        remember();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = Vec::new();
        let mut todo = vec![
            root.join("models"),
            root.join("examples"),
            root.join("tests"),
        ];
        todo.push(root.join("stdlib"));
        while let Some(d) = todo.pop() {
            let Ok(rd) = std::fs::read_dir(&d) else {
                continue;
            };
            for e in rd.flatten() {
                let p = e.path();
                if p.is_dir() {
                    todo.push(p);
                } else if p.extension().is_some_and(|x| x == "shard") {
                    files.push(p);
                }
            }
        }
        assert!(files.len() > 100, "{} files", files.len());
        let mut compared = 0;
        for p in files {
            let Ok(text) = std::fs::read_to_string(&p) else {
                continue;
            };
            // Fill the cache at one offset, then read it at another.
            let _ = parse(FileId(3), &format!("// a first line\n{text}"));
            let moved = parse(FileId(7), &text);
            let whole = crate::parse::parse(FileId(7), &text);
            match (moved, whole) {
                (Ok(a), Ok(b)) => {
                    assert_eq!(format!("{a:?}"), format!("{b:?}"), "{}", p.display());
                    compared += 1;
                }
                (Err(a), Err(b)) => {
                    assert_eq!(format!("{a:?}"), format!("{b:?}"), "{}", p.display())
                }
                (a, b) => panic!("{}: {a:?} vs {b:?}", p.display()),
            }
        }
        assert!(compared > 100, "{compared} files compared");
    }

    #[test]
    fn pieces_start_at_item_keywords_outside_brackets_comments_and_strings() {
        let text = "// layer in a comment\nimport nn\nconst A = 2 /* model */\nlayer L(D) {\n  fn forward(x: f32[B, D]) -> f32[B, D] { x }\n}\ntrain L on m { data: text(path: \"train mesh\") }\n";
        let cuts = pieces(text).expect("balanced");
        let starts: Vec<&str> = cuts.iter().map(|c| &text[*c..*c + 5]).collect();
        assert_eq!(starts, ["// la", "const", "layer", "train"]);
        assert_eq!(pieces("layer L { fn f( }"), None);
    }
}
