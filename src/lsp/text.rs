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
