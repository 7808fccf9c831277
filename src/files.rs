//! The one way the compiler reads files: the model's imports (resolve) and its
//! training data (the data stage) go through [`Files`]. The command line reads
//! the disk ([`Disk`]); the editor server lays its open, unsaved buffers over
//! the disk ([`Overlay`]); tests and the error explanations' examples compile
//! files that exist only in memory ([`Memory`]).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

pub trait Files: Sync {
    /// A file's bytes.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// A file's text (UTF-8).
    fn read_text(&self, path: &Path) -> io::Result<String> {
        let bytes = self.read(path)?;
        String::from_utf8(bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
    }
    /// The path that names this file whatever the spelling (`a/../b` is `b`).
    fn canonical(&self, path: &Path) -> PathBuf {
        normalize(path)
    }
    /// The file's place on the disk, for readers that need one (array files);
    /// `None` when it exists only here.
    fn on_disk(&self, path: &Path) -> Option<PathBuf> {
        let _ = path;
        None
    }
}

/// `a/./b/../c` as `a/c`, without asking the disk.
pub fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// The file system.
pub struct Disk;

impl Files for Disk {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        std::fs::read(path)
    }
    fn read_text(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }
    fn canonical(&self, path: &Path) -> PathBuf {
        std::fs::canonicalize(path).unwrap_or_else(|_| normalize(path))
    }
    fn on_disk(&self, path: &Path) -> Option<PathBuf> {
        Some(path.to_path_buf())
    }
}

/// Files held in memory, by (normalized) path.
#[derive(Default)]
pub struct Memory {
    files: HashMap<PathBuf, Vec<u8>>,
}

impl Memory {
    pub fn new() -> Memory {
        Memory::default()
    }
    pub fn insert(&mut self, path: impl AsRef<Path>, text: impl Into<Vec<u8>>) {
        self.files.insert(normalize(path.as_ref()), text.into());
    }
}

impl Files for Memory {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.files
            .get(&normalize(path))
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such file"))
    }
}

/// Buffers (an editor's unsaved files) laid over another file system.
pub struct Overlay<'a> {
    base: &'a dyn Files,
    buffers: HashMap<PathBuf, String>,
}

impl<'a> Overlay<'a> {
    pub fn new(base: &'a dyn Files) -> Overlay<'a> {
        Overlay {
            base,
            buffers: HashMap::new(),
        }
    }
    pub fn insert(&mut self, path: impl AsRef<Path>, text: String) {
        let key = self.base.canonical(path.as_ref());
        self.buffers.insert(key, text);
    }
}

impl Files for Overlay<'_> {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        match self.buffers.get(&self.base.canonical(path)) {
            Some(t) => Ok(t.clone().into_bytes()),
            None => self.base.read(path),
        }
    }
    fn read_text(&self, path: &Path) -> io::Result<String> {
        match self.buffers.get(&self.base.canonical(path)) {
            Some(t) => Ok(t.clone()),
            None => self.base.read_text(path),
        }
    }
    fn canonical(&self, path: &Path) -> PathBuf {
        self.base.canonical(path)
    }
    fn on_disk(&self, path: &Path) -> Option<PathBuf> {
        self.base.on_disk(path)
    }
}
