//! Positions and addresses. LSP positions count characters in the encoding the
//! client and server agreed on (UTF-16 unless the client offers UTF-8 or
//! UTF-32); the compiler's spans are byte offsets. This module converts
//! between them without ever splitting a character, and between `file://`
//! URIs and paths (the standard library, which ships inside the binary, is
//! given a read-only copy on disk so that editors can open it).

use lsp_types::{ClientCapabilities, Position, PositionEncodingKind, Range, Uri};
use std::path::{Path, PathBuf};

/// How a position's `character` counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Encoding {
    Utf8,
    #[default]
    Utf16,
    Utf32,
}

impl Encoding {
    /// The client's first offered encoding that this server speaks; UTF-16
    /// (the protocol's default) when it offers none.
    pub fn negotiate(caps: &ClientCapabilities) -> Encoding {
        let offered = caps
            .general
            .as_ref()
            .and_then(|g| g.position_encodings.as_ref());
        for kind in offered.into_iter().flatten() {
            match kind.as_str() {
                "utf-8" => return Encoding::Utf8,
                "utf-16" => return Encoding::Utf16,
                "utf-32" => return Encoding::Utf32,
                _ => {}
            }
        }
        Encoding::Utf16
    }

    pub fn kind(self) -> PositionEncodingKind {
        match self {
            Encoding::Utf8 => PositionEncodingKind::UTF8,
            Encoding::Utf16 => PositionEncodingKind::UTF16,
            Encoding::Utf32 => PositionEncodingKind::UTF32,
        }
    }

    fn width(self, c: char) -> usize {
        match self {
            Encoding::Utf8 => c.len_utf8(),
            Encoding::Utf16 => c.len_utf16(),
            Encoding::Utf32 => 1,
        }
    }

    /// `s`'s length in this encoding's units.
    pub fn len(self, s: &str) -> usize {
        match self {
            Encoding::Utf8 => s.len(),
            _ => s.chars().map(|c| self.width(c)).sum(),
        }
    }
}

/// A text with its line starts, for converting many positions.
pub struct Lines<'a> {
    text: &'a str,
    starts: Vec<usize>,
    enc: Encoding,
}

impl<'a> Lines<'a> {
    pub fn new(text: &'a str, enc: Encoding) -> Lines<'a> {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Lines { text, starts, enc }
    }

    /// The largest character boundary at or before `offset`.
    fn floor(&self, offset: usize) -> usize {
        let mut o = offset.min(self.text.len());
        while !self.text.is_char_boundary(o) {
            o -= 1;
        }
        o
    }

    /// The position of a byte offset (clamped to the text).
    pub fn position(&self, offset: usize) -> Position {
        let offset = self.floor(offset);
        let line = match self.starts.binary_search(&offset) {
            Ok(l) => l,
            Err(l) => l.saturating_sub(1),
        };
        let start = self.starts.get(line).copied().unwrap_or(0);
        let col = self.enc.len(self.text.get(start..offset).unwrap_or(""));
        Position::new(line as u32, col as u32)
    }

    pub fn range(&self, start: usize, end: usize) -> Range {
        Range::new(self.position(start), self.position(end.max(start)))
    }

    /// The byte offset of a position: a line past the end is the end of the
    /// text, a character past the line's end is its end, and one inside a
    /// character (half a surrogate pair) is the character's end.
    pub fn offset(&self, p: Position) -> usize {
        let Some(&start) = self.starts.get(p.line as usize) else {
            return self.text.len();
        };
        let line = &self.text[start..];
        let line = &line[..line.find('\n').unwrap_or(line.len())];
        let line = line.strip_suffix('\r').unwrap_or(line);
        let mut units = 0usize;
        for (i, c) in line.char_indices() {
            if units >= p.character as usize {
                return start + i;
            }
            units += self.enc.width(c);
        }
        start + line.len()
    }

    pub fn text(&self) -> &'a str {
        self.text
    }
}

/// How byte offsets of the text a file was analysed in move to the buffer's
/// text now, after edits the last good parse has not seen: the common prefix
/// keeps its offsets, the common suffix shifts by the change in length, and
/// what lies between was edited and maps nowhere. An answer there is
/// withheld, never given at a stale place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shift {
    prefix: usize,
    old_tail: usize,
    new_tail: usize,
}

impl Shift {
    pub fn between(old: &str, new: &str) -> Shift {
        let (a, b) = (old.as_bytes(), new.as_bytes());
        let mut prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
        while !old.is_char_boundary(prefix) || !new.is_char_boundary(prefix) {
            prefix -= 1;
        }
        let room = a.len().min(b.len()) - prefix;
        let mut suffix = a
            .iter()
            .rev()
            .zip(b.iter().rev())
            .take(room)
            .take_while(|(x, y)| x == y)
            .count();
        while !old.is_char_boundary(a.len() - suffix) || !new.is_char_boundary(b.len() - suffix) {
            suffix -= 1;
        }
        Shift {
            prefix,
            old_tail: a.len() - suffix,
            new_tail: b.len() - suffix,
        }
    }

    /// An offset of the analysed text in the buffer now (`None`: edited),
    /// as the start of something: at an insertion point, after the text
    /// inserted there.
    pub fn forward(&self, o: usize) -> Option<usize> {
        if o >= self.old_tail {
            Some(o - self.old_tail + self.new_tail)
        } else if o <= self.prefix {
            Some(o)
        } else {
            None
        }
    }

    /// [`Shift::forward`] as the end of something: at an insertion point,
    /// before the text inserted there.
    pub fn forward_end(&self, o: usize) -> Option<usize> {
        if o <= self.prefix {
            Some(o)
        } else {
            self.forward(o)
        }
    }

    /// An offset of the buffer now in the analysed text (`None`: typed since).
    pub fn back(&self, o: usize) -> Option<usize> {
        if o >= self.new_tail {
            Some(o - self.new_tail + self.old_tail)
        } else if o <= self.prefix {
            Some(o)
        } else {
            None
        }
    }

    /// [`Shift::back`], an offset inside the edit going to where it starts
    /// (what scopes a completion there).
    pub fn near(&self, o: usize) -> usize {
        self.back(o).unwrap_or(self.prefix)
    }
}

/// A file's analysed text seen in the buffer now: ranges of the analysis
/// mapped through the edits since ([`Shift`]), in the buffer's positions.
pub struct View<'a> {
    pub lines: Lines<'a>,
    pub shift: Shift,
}

impl<'a> View<'a> {
    /// `analysed` seen as `now` (the same text: every offset maps to itself).
    pub fn new(analysed: &str, now: &'a str, enc: Encoding) -> View<'a> {
        View {
            lines: Lines::new(now, enc),
            shift: Shift::between(analysed, now),
        }
    }

    /// An analysed byte range in the buffer's positions; `None` where the
    /// range was edited since.
    pub fn range(&self, start: usize, end: usize) -> Option<Range> {
        let (s, e) = (self.shift.forward(start)?, self.shift.forward_end(end)?);
        // A range whose text changed length was edited inside.
        if e < s || e - s != end.saturating_sub(start) {
            return None;
        }
        Some(self.lines.range(s, e))
    }

    /// An analysed byte offset's position in the buffer now.
    pub fn position(&self, o: usize) -> Option<Position> {
        Some(self.lines.position(self.shift.forward(o)?))
    }
}

/// The path a `file://` URI names (percent-encoding undone).
pub fn path_of(uri: &Uri) -> PathBuf {
    let s = uri.as_str();
    let raw = s.strip_prefix("file://").unwrap_or(s);
    // `file://localhost/x` and `file:///x` name the same file.
    let raw = raw.strip_prefix("localhost").unwrap_or(raw);
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
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

/// The `file://` URI of a path (bytes other than unreserved ones and `/`
/// percent-encoded); `None` only if the result does not parse.
pub fn uri_of(path: &Path) -> Option<Uri> {
    let mut s = String::from("file://");
    for &b in path.to_string_lossy().as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'.' | b'_' | b'~') {
            s.push(b as char);
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s.parse().ok()
}

/// Where the standard library's read-only copies live.
pub fn std_dir() -> PathBuf {
    std::env::temp_dir().join(format!("shardc-std-{}", env!("CARGO_PKG_VERSION")))
}

/// The one name a file has, whatever its spelling: stdlib modules
/// (`<std>/nn.shard`) their copy's path, others their canonical path.
pub fn key(path: &Path) -> PathBuf {
    if let Ok(rest) = path.strip_prefix("<std>") {
        return std_dir().join(rest);
    }
    std::fs::canonicalize(path).unwrap_or_else(|_| crate::files::normalize(path))
}

/// Whether `key` is a stdlib module's copy.
pub fn is_std(key: &Path) -> bool {
    key.starts_with(std_dir())
}

/// Writes the stdlib module `key` names to its copy when the copy is missing
/// or differs (another version wrote it): an editor can then open it.
pub fn materialize_std(key: &Path) {
    let Some(name) = key.file_stem().and_then(|n| n.to_str()) else {
        return;
    };
    let Some((_, text)) = crate::resolve::STDLIB.iter().find(|(n, _)| *n == name) else {
        return;
    };
    if std::fs::read_to_string(key).ok().as_deref() == Some(*text) {
        return;
    }
    let _ = std::fs::create_dir_all(std_dir());
    let _ = crate::files::write_replace(key, text.as_bytes());
}

#[cfg(test)]
mod tests {
    #[test]
    fn shifts_keep_the_unedited_text_and_drop_the_edit() {
        let old = "let a = f(x)\nlet b = g(y)\n";
        let new = "let a = f(x)\nlet z = gelu(\nlet b = g(y)\n";
        let sh = super::Shift::between(old, new);
        // `a` before the edit, `b` after it (shifted), `let z = gelu(` typed.
        assert_eq!(sh.forward(4), Some(4));
        let b_old = old.find("b =").unwrap_or(0);
        let b_new = new.find("b =").unwrap_or(0);
        assert_eq!(sh.forward(b_old), Some(b_new));
        assert_eq!(sh.back(b_new), Some(b_old));
        let gelu = new.find("gelu").unwrap_or(0);
        assert_eq!(sh.back(gelu), None);
        // A completion there is scoped where the edit starts.
        assert_eq!(sh.near(gelu), "let a = f(x)\nlet ".len());
        // The same text maps to itself.
        let same = super::Shift::between(old, old);
        assert!((0..=old.len()).all(|o| same.forward(o) == Some(o) && same.back(o) == Some(o)));
    }

    use super::*;

    #[test]
    fn positions_after_a_non_bmp_character() {
        let text = "// 🦀 x\nlet y";
        for (enc, col) in [
            (Encoding::Utf16, 6),
            (Encoding::Utf8, 8),
            (Encoding::Utf32, 5),
        ] {
            let l = Lines::new(text, enc);
            let x = text.find('x').unwrap_or(0);
            assert_eq!(l.position(x), Position::new(0, col));
            assert_eq!(l.offset(Position::new(0, col)), x);
            assert_eq!(l.offset(Position::new(9, 0)), text.len());
            assert_eq!(l.offset(Position::new(1, 99)), text.len());
        }
        // Half a surrogate pair: the end of the emoji.
        let l = Lines::new(text, Encoding::Utf16);
        assert_eq!(l.offset(Position::new(0, 4)), 7);
    }

    #[test]
    fn uris_round_trip() {
        let p = Path::new("/tmp/a b/ü.shard");
        let u = uri_of(p).map(|u| path_of(&u));
        assert_eq!(u.as_deref(), Some(p));
    }
}
