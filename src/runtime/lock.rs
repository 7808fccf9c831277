//! One run per run directory. Two `shardc run`s with the same `--out` would
//! trample each other's checkpoints and metrics, so a run holds an advisory lock
//! on `.shardc.lock` in its directory for as long as it trains: the kernel's
//! `flock`, through `std::fs::File::try_lock`. A killed run's lock goes with its
//! process, so nothing stale can block a later run; the file it leaves still
//! names it, and the next run says whose lock it took over. The file is never
//! deleted (a deleted lock file lets two runs lock two different files); a run
//! that ends cleanly empties it.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The lock file's name inside the run directory.
pub const FILE: &str = ".shardc.lock";

/// A held lock on a run directory; released when dropped (or the process ends).
#[derive(Debug)]
pub struct RunLock {
    file: File,
    /// What the file said when this run took the lock: a run that was killed
    /// (or crashed) before it could release it.
    pub stale: Option<String>,
}

/// Why a run directory could not be locked.
#[derive(Debug)]
pub enum LockError {
    /// Another process holds the lock; `holder` is what its lock file says.
    Held { path: PathBuf, holder: String },
    Io {
        path: PathBuf,
        error: std::io::Error,
    },
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Held { path, holder } => {
                let dir = path.parent().unwrap_or(Path::new("."));
                let who = if holder.is_empty() {
                    "another run (it has not written its name yet)".to_string()
                } else {
                    holder.clone()
                };
                write!(
                    f,
                    "the run directory `{}` is in use by {who}; wait for it to finish, or give this run another `--out`",
                    dir.display()
                )
            }
            LockError::Io { path, error } => {
                write!(f, "cannot lock `{}`: {error}", path.display())
            }
        }
    }
}

impl std::error::Error for LockError {}

/// This process, as a lock file names it: `pid 123 on host h since <unix time>`.
fn holder() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "an unknown host".into());
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format!(
        "pid {} on host {host} (started at unix time {since})",
        std::process::id()
    )
}

/// The first line of a lock file's text, bounded (the file is in a directory
/// others may write into).
fn first_line(text: &str) -> String {
    text.lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

impl RunLock {
    /// Lock `dir` (which must exist) for this run, or say who holds it.
    pub fn acquire(dir: &Path) -> Result<RunLock, LockError> {
        let path = dir.join(FILE);
        let io = |error| LockError::Io {
            path: path.clone(),
            error,
        };
        let mut opts = std::fs::OpenOptions::new();
        opts.read(true).write(true).create(true).truncate(false);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            // A link planted at the lock's name is not followed.
            opts.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
        }
        let mut file = opts.open(&path).map_err(io)?;
        if !file.metadata().map_err(io)?.is_file() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file",
            )));
        }
        let mut said = String::new();
        let read = |file: &mut File, said: &mut String| {
            let _ = file.take(4096).read_to_string(said);
        };
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                read(&mut file, &mut said);
                return Err(LockError::Held {
                    path,
                    holder: first_line(&said),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
        }
        read(&mut file, &mut said);
        let stale = Some(first_line(&said)).filter(|s| !s.is_empty());
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", holder()).map_err(io)?;
        file.sync_all().map_err(io)?;
        Ok(RunLock { file, stale })
    }
}

impl Drop for RunLock {
    /// A clean end empties the file (so the next run knows no one was killed
    /// holding it); the lock itself goes when the file is closed.
    fn drop(&mut self) {
        let _ = self.file.set_len(0);
        let _ = self.file.unlock();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_and_a_released_one_is_not_stale() {
        let dir = std::env::temp_dir().join(format!("shardc-lock-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let first = RunLock::acquire(&dir).expect("first");
        assert!(first.stale.is_none());
        // flock locks belong to the open file: a second open in this process
        // conflicts as another process's would.
        let e = RunLock::acquire(&dir).expect_err("second");
        let shown = e.to_string();
        assert!(
            shown.contains(&format!("pid {}", std::process::id())) && shown.contains("in use by"),
            "{shown}"
        );
        drop(first);
        let again = RunLock::acquire(&dir).expect("after release");
        assert!(again.stale.is_none(), "{:?}", again.stale);
        drop(again);
        // What a killed run leaves: a lock file naming it, no lock held.
        std::fs::write(
            dir.join(FILE),
            "pid 4242 on host h (started at unix time 1)\n",
        )
        .expect("write");
        let taken = RunLock::acquire(&dir).expect("stale");
        assert_eq!(
            taken.stale.as_deref(),
            Some("pid 4242 on host h (started at unix time 1)")
        );
        drop(taken);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
