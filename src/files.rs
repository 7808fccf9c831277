//! The one way the compiler reads files: the model's imports (resolve) and its
//! training data (the data stage) go through [`Files`]. The command line reads
//! the disk ([`Disk`]); the editor server lays its open, unsaved buffers over
//! the disk ([`Overlay`]); tests and the error explanations' examples compile
//! files that exist only in memory ([`Memory`]).

use std::collections::HashMap;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// The most a model's source (and each file it imports) may hold.
pub const SOURCE_CAP: u64 = 16 << 20;
/// The most a data or array file may hold (text corpora, `.npy`, `.npz`,
/// safetensors, FDO statistics).
pub const DATA_CAP: u64 = 64 << 30;

/// Read a regular file of at most `cap` bytes. Devices, FIFOs, sockets and
/// directories are refused before anything is read (a FIFO would block, `/dev/zero`
/// never ends), and a file that grows past `cap` while it is read is refused too.
pub fn read_regular(path: &Path, cap: u64) -> io::Result<Vec<u8>> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a directory, device, FIFO or socket)",
        ));
    }
    if meta.len() > cap {
        return Err(too_big(meta.len(), cap));
    }
    let file = open_regular(path)?;
    let mut buf = Vec::new();
    // The size comes from the file: ask for the memory, never abort without it.
    buf.try_reserve_exact(meta.len() as usize).map_err(|_| {
        io::Error::new(
            io::ErrorKind::OutOfMemory,
            format!(
                "{} bytes, more than this machine can hold in memory",
                meta.len()
            ),
        )
    })?;
    file.take(cap + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > cap {
        return Err(too_big(buf.len() as u64, cap));
    }
    Ok(buf)
}

/// Open a file for reading only if it is a regular file; never blocks on a FIFO
/// (it is opened non-blocking, then checked).
pub fn open_regular(path: &Path) -> io::Result<std::fs::File> {
    let mut opts = std::fs::OpenOptions::new();
    opts.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NONBLOCK);
    }
    let file = opts.open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a directory, device, FIFO or socket)",
        ));
    }
    Ok(file)
}

/// Write a whole file of the run's output without following links: the bytes go
/// to a fresh temporary file beside it (created, never opened through a link),
/// which then replaces `path`. A symlink planted at `path` is replaced, not
/// followed, and a reader never sees a half-written file.
pub fn write_replace(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = std::fs::remove_file(&tmp);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.custom_flags(libc::O_NOFOLLOW);
    }
    let mut f = opts.open(&tmp)?;
    let written = f.write_all(bytes).and_then(|_| f.sync_all());
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

fn too_big(len: u64, cap: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{len} bytes, more than the {cap}-byte limit for this kind of file"),
    )
}

pub trait Files: Sync {
    /// A file's bytes.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// A model's source: at most [`SOURCE_CAP`] bytes from the disk, whatever
    /// the file's name.
    fn read_source(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.read(path)
    }
    /// A data file to read in pieces (a text corpus), never held whole.
    fn reader(&self, path: &Path) -> io::Result<Box<dyn Read + '_>> {
        Ok(Box::new(io::Cursor::new(self.read(path)?)))
    }
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
        read_regular(path, DATA_CAP)
    }
    fn read_source(&self, path: &Path) -> io::Result<Vec<u8>> {
        read_regular(path, SOURCE_CAP)
    }
    fn reader(&self, path: &Path) -> io::Result<Box<dyn Read + '_>> {
        let file = open_regular(path)?;
        let len = file.metadata()?.len();
        if len > DATA_CAP {
            return Err(too_big(len, DATA_CAP));
        }
        Ok(Box::new(file.take(DATA_CAP + 1)))
    }
    fn read_text(&self, path: &Path) -> io::Result<String> {
        let cap = if path.extension().is_some_and(|e| e == "shard") {
            SOURCE_CAP
        } else {
            DATA_CAP
        };
        String::from_utf8(read_regular(path, cap)?)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
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
    fn read_source(&self, path: &Path) -> io::Result<Vec<u8>> {
        match self.buffers.get(&self.base.canonical(path)) {
            Some(t) => Ok(t.clone().into_bytes()),
            None => self.base.read_source(path),
        }
    }
    fn reader(&self, path: &Path) -> io::Result<Box<dyn Read + '_>> {
        match self.buffers.get(&self.base.canonical(path)) {
            Some(t) => Ok(Box::new(io::Cursor::new(t.as_bytes()))),
            None => self.base.reader(path),
        }
    }
    fn canonical(&self, path: &Path) -> PathBuf {
        self.base.canonical(path)
    }
    fn on_disk(&self, path: &Path) -> Option<PathBuf> {
        self.base.on_disk(path)
    }
}
