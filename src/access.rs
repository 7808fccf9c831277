//! The file-access policy: which files a model file can make shardc read, and
//! where it can make `shardc run` write. A `.shard` file is code someone else
//! may have written, so the paths it names are confined:
//!
//! - **Reads** (imports, `text(...)`, `arrays(...)`) stay inside the directory
//!   of the file given on the command line, after symlinks are resolved.
//! - **Writes** (`checkpoint: { dir }`, `fdo: { dir }`) are relative to the run
//!   directory (`--out`, default `runs/MODEL`) and may not climb out of it.
//!
//! Anything else needs an explicit grant on the command line (`--allow-path
//! DIR`), as do paths the command line names itself (`--data`, `--out`).
//! [`Confined`] enforces the read side for every reader (the CLI, tests and the
//! editor server all compile through it); [`output_dir`] judges the write side.

use crate::files::{normalize, Files};
use std::io;
use std::path::{Component, Path, PathBuf};

/// Directories a compile may read under: the model's own, and granted ones.
#[derive(Clone, Debug, Default)]
pub struct Allowed {
    /// Each as written (made absolute) and as the disk resolves it.
    dirs: Vec<(PathBuf, PathBuf)>,
}

impl Allowed {
    pub fn new(files: &dyn Files, dirs: impl IntoIterator<Item = PathBuf>) -> Allowed {
        Allowed {
            dirs: dirs
                .into_iter()
                .map(|d| {
                    let abs = absolute(&d);
                    let canon = absolute(&files.canonical(&abs));
                    (abs, canon)
                })
                .collect(),
        }
    }

    /// Whether `path` (and what its symlinks lead to) lies under an allowed directory.
    pub fn allows(&self, files: &dyn Files, path: &Path) -> bool {
        let abs = absolute(path);
        let canon = absolute(&files.canonical(&abs));
        let under = |p: &Path| {
            self.dirs
                .iter()
                .any(|(a, c)| p.starts_with(a) || p.starts_with(c))
        };
        under(&abs) && under(&canon)
    }

    /// The directories, for messages.
    pub fn describe(&self) -> String {
        let v: Vec<String> = self
            .dirs
            .iter()
            .map(|(a, _)| format!("`{}`", a.display()))
            .collect();
        v.join(", ")
    }
}

/// `path` made absolute against the working directory, with `.` and `..` resolved
/// lexically.
pub fn absolute(path: &Path) -> PathBuf {
    if path.is_absolute() {
        normalize(path)
    } else {
        let cwd = std::env::current_dir().unwrap_or_default();
        normalize(&cwd.join(path))
    }
}

/// A file system that reads only under [`Allowed`] directories.
pub struct Confined<'a> {
    base: &'a dyn Files,
    allowed: Allowed,
}

impl<'a> Confined<'a> {
    pub fn new(base: &'a dyn Files, allowed: Allowed) -> Confined<'a> {
        Confined { base, allowed }
    }

    fn check(&self, path: &Path) -> io::Result<()> {
        if self.allowed.allows(self.base, path) {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "outside the directories this model may read ({}); grant access with `--allow-path DIR`",
                    self.allowed.describe()
                ),
            ))
        }
    }
}

impl Files for Confined<'_> {
    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.check(path)?;
        self.base.read(path)
    }
    fn read_text(&self, path: &Path) -> io::Result<String> {
        self.check(path)?;
        self.base.read_text(path)
    }
    fn read_source(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.check(path)?;
        self.base.read_source(path)
    }
    fn reader(&self, path: &Path) -> io::Result<Box<dyn std::io::Read + '_>> {
        self.check(path)?;
        self.base.reader(path)
    }
    fn canonical(&self, path: &Path) -> PathBuf {
        self.base.canonical(path)
    }
    fn on_disk(&self, path: &Path) -> Option<PathBuf> {
        // Readers that open the disk themselves get a path only when allowed.
        self.check(path).ok()?;
        self.base.on_disk(path)
    }
}

/// Why a model file's output directory was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Escape {
    /// `/abs/path`, not under a granted directory.
    Absolute,
    /// `../x` or `a/../../x`: climbs out of the run directory.
    Parent,
    /// Empty, or `.`: the run directory itself (rotation would sweep it).
    Empty,
}

/// Judge an output directory written in a model file: `Ok` with the path to use
/// (relative to the run directory, or a granted absolute one) or why not.
pub fn output_dir(written: &str, grants: &[PathBuf]) -> Result<PathBuf, Escape> {
    let p = Path::new(written);
    if p.is_absolute() {
        let abs = normalize(p);
        return if grants.iter().any(|g| abs.starts_with(absolute(g))) {
            Ok(abs)
        } else {
            Err(Escape::Absolute)
        };
    }
    let mut depth = 0usize;
    for c in p.components() {
        match c {
            Component::ParentDir => {
                depth = depth.checked_sub(1).ok_or(Escape::Parent)?;
            }
            Component::Normal(_) => depth += 1,
            _ => {}
        }
    }
    if depth == 0 {
        return Err(Escape::Empty);
    }
    Ok(normalize(p))
}

/// Whether `dir` (which exists), with symlinks resolved, is still inside `root`
/// or a granted directory: a symlink planted in the run directory must not carry
/// checkpoint writes and rotation elsewhere.
pub fn stays_inside(dir: &Path, root: &Path, grants: &[PathBuf]) -> bool {
    // The read side's rule, on the disk: under an allowed directory both as
    // written and with symlinks resolved.
    let disk = crate::files::Disk;
    dir.exists()
        && Allowed::new(
            &disk,
            std::iter::once(root.to_path_buf()).chain(grants.iter().cloned()),
        )
        .allows(&disk, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_dirs_stay_in_the_run_directory() {
        assert_eq!(output_dir("ckpt", &[]), Ok(PathBuf::from("ckpt")));
        assert_eq!(output_dir("a/../b", &[]), Ok(PathBuf::from("b")));
        assert_eq!(output_dir("../x", &[]), Err(Escape::Parent));
        assert_eq!(output_dir("a/../../x", &[]), Err(Escape::Parent));
        assert_eq!(output_dir("/tmp/x", &[]), Err(Escape::Absolute));
        assert_eq!(output_dir(".", &[]), Err(Escape::Empty));
        assert_eq!(output_dir("", &[]), Err(Escape::Empty));
        assert_eq!(
            output_dir("/data/ck/run1", &[PathBuf::from("/data/ck")]),
            Ok(PathBuf::from("/data/ck/run1"))
        );
        assert_eq!(
            output_dir("/data/other", &[PathBuf::from("/data/ck")]),
            Err(Escape::Absolute)
        );
    }

    #[test]
    fn reads_stay_in_allowed_directories() {
        let mut m = crate::files::Memory::new();
        m.insert("/p/model.shard", "");
        let allowed = Allowed::new(&m, [PathBuf::from("/p")]);
        assert!(allowed.allows(&m, Path::new("/p/lib/x.shard")));
        assert!(allowed.allows(&m, Path::new("/p/lib/../x.shard")));
        assert!(!allowed.allows(&m, Path::new("/p/../etc/shadow")));
        assert!(!allowed.allows(&m, Path::new("/etc/shadow")));
        assert!(!allowed.allows(&m, Path::new("/pp/x.shard")));
    }
}
