//! The workspace: the folders the client named at `initialize`
//! (`workspaceFolders`, else `rootUri`, else `rootPath`; later changed by
//! `workspace/didChangeWorkspaceFolders`) and the `.shard` files under them.
//! References and rename search these files besides the open buffers'
//! compilations, because a file that uses a layer need not be open.
//!
//! The walk skips `target/`, `node_modules/` and hidden directories (`.git/`
//! among them), never follows a symlink to a directory (no cycles), and stops
//! after [`MAX_FILES`] files or [`MAX_DIRS`] directories, with a note for the
//! log saying so. It lists directories only: the files are read by the
//! caller, through the same [`crate::files::Files`] the checks read with
//! (open buffers from the overlay, the rest from disk).

use super::index::Index;
use super::text;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The workspace's files as the searches across it (references, rename,
/// call hierarchy, workspace symbols) last read them: the listing, each
/// file's text, and its index once a search needed it. The server keeps it
/// only while the client reports changes on disk (`didChangeWatchedFiles`,
/// registered at `initialized`): such a report or a save drops all of it, and
/// an edit to an open buffer drops the indexes that read that buffer. For a
/// client that reports nothing the workspace is read afresh at each search.
#[derive(Default)]
pub struct Kept {
    /// The listing, for the folders and open buffers' directories it is of.
    listing: Option<(Vec<PathBuf>, Vec<PathBuf>, Scan)>,
    files: HashMap<PathBuf, KeptFile>,
}

struct KeptFile {
    text: Arc<str>,
    index: Option<Arc<Index>>,
}

impl Kept {
    /// The `.shard` files under `roots` and beside the open buffers.
    pub fn listing(&mut self, roots: &[PathBuf], beside: &[PathBuf]) -> Scan {
        match &self.listing {
            Some((r, b, scan)) if r == roots && b == beside => scan.clone(),
            _ => {
                let scan = shard_files(roots, beside);
                self.listing = Some((roots.to_vec(), beside.to_vec(), scan.clone()));
                scan
            }
        }
    }

    /// A file's text as last read, else read now.
    pub fn text(&mut self, files: &dyn crate::files::Files, key: &Path) -> Option<Arc<str>> {
        if let Some(f) = self.files.get(key) {
            return Some(f.text.clone());
        }
        let text: Arc<str> = crate::files::Files::read_text(files, key).ok()?.into();
        self.files.insert(
            key.to_path_buf(),
            KeptFile {
                text: text.clone(),
                index: None,
            },
        );
        Some(text)
    }

    /// A file's index as last built.
    pub fn index(&self, key: &Path) -> Option<Arc<Index>> {
        self.files.get(key).and_then(|f| f.index.clone())
    }

    /// Keeps a file's index (built from the text [`Kept::text`] gave).
    pub fn keep_index(&mut self, key: &Path, ix: Arc<Index>) {
        if let Some(f) = self.files.get_mut(key) {
            f.index = Some(ix);
        }
    }

    /// An open buffer changed: what was read through it is dropped.
    pub fn forget(&mut self, key: &Path) {
        self.files
            .retain(|k, f| k != key && f.index.as_ref().is_none_or(|ix| ix.file_of(key).is_none()));
    }
}

/// The most `.shard` files one search reads.
pub const MAX_FILES: usize = 5_000;

/// The most directories one search lists.
pub const MAX_DIRS: usize = 20_000;

/// Directory names never entered (besides hidden ones).
pub const SKIPPED: &[&str] = &["target", "node_modules"];

/// The workspace folders of `initialize`'s params, as canonical paths:
/// `workspaceFolders` when it names any, else `rootUri`, else `rootPath`.
/// Anything that is not a `file://` URI or a string is ignored.
pub fn roots_of(params: &Value) -> Vec<PathBuf> {
    let folders: Vec<PathBuf> = params
        .get("workspaceFolders")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|f| dir_of_uri(f.get("uri"))).collect())
        .unwrap_or_default();
    let roots = if !folders.is_empty() {
        folders
    } else if let Some(d) = dir_of_uri(params.get("rootUri")) {
        vec![d]
    } else {
        params
            .get("rootPath")
            .and_then(Value::as_str)
            .filter(|p| Path::new(p).is_absolute())
            .map(|p| vec![text::key(Path::new(p))])
            .unwrap_or_default()
    };
    dedup(roots)
}

/// `workspace/didChangeWorkspaceFolders`: the roots after the event's
/// removals and additions.
pub fn changed(roots: &[PathBuf], params: &Value) -> Vec<PathBuf> {
    let event = params.get("event");
    let list = |name: &str| -> Vec<PathBuf> {
        event
            .and_then(|e| e.get(name))
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|f| dir_of_uri(f.get("uri"))).collect())
            .unwrap_or_default()
    };
    let removed = list("removed");
    let mut out: Vec<PathBuf> = roots
        .iter()
        .filter(|r| !removed.contains(r))
        .cloned()
        .collect();
    out.extend(list("added"));
    dedup(out)
}

fn dir_of_uri(uri: Option<&Value>) -> Option<PathBuf> {
    let s = uri?.as_str()?;
    if !s.starts_with("file://") {
        return None;
    }
    let uri: lsp_types::Uri = s.parse().ok()?;
    let path = text::path_of(&uri);
    path.is_absolute().then(|| text::key(&path))
}

/// Sorted, each once, none inside another (its files are found under that one).
fn dedup(roots: Vec<PathBuf>) -> Vec<PathBuf> {
    let set: BTreeSet<PathBuf> = roots.into_iter().collect();
    let mut out: Vec<PathBuf> = Vec::new();
    for r in set {
        if !out.iter().any(|o| r.starts_with(o)) {
            out.push(r);
        }
    }
    out
}

/// The `.shard` files a search reads, and a note for the log when a limit cut
/// it short.
#[derive(Clone, Debug, Default)]
pub struct Scan {
    /// File keys ([`text::key`]), in the order found: `beside` first, then
    /// each root breadth first, each directory's entries by name.
    pub files: Vec<PathBuf>,
    pub note: Option<String>,
}

/// The `.shard` files directly in the `beside` directories (the open
/// buffers': a file opened outside the workspace still finds its
/// neighbours), then every one under the `roots`. Standard-library copies
/// are left out (they cannot import anything).
pub fn shard_files(roots: &[PathBuf], beside: &[PathBuf]) -> Scan {
    let mut scan = Scan::default();
    let mut seen: HashSet<PathBuf> = HashSet::new();
    let mut dirs_listed = 0usize;
    let mut todo: VecDeque<(PathBuf, bool)> = beside
        .iter()
        .map(|d| (d.clone(), false))
        .chain(roots.iter().map(|r| (r.clone(), true)))
        .collect();
    let mut entered: HashSet<PathBuf> = HashSet::new();
    while let Some((dir, recurse)) = todo.pop_front() {
        if recurse && !entered.insert(dir.clone()) {
            continue;
        }
        if dirs_listed >= MAX_DIRS {
            scan.note = Some(format!(
                "the workspace has more than {MAX_DIRS} directories: references and rename searched the .shard files of the first {MAX_DIRS} ({} files)",
                scan.files.len()
            ));
            break;
        }
        dirs_listed += 1;
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut entries: Vec<(PathBuf, std::fs::FileType)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| Some((e.path(), e.file_type().ok()?)))
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        for (path, ty) in entries {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if ty.is_dir() {
                if recurse && !name.starts_with('.') && !SKIPPED.contains(&name) {
                    todo.push_back((path, true));
                }
                continue;
            }
            if path.extension().is_none_or(|x| x != "shard") {
                continue;
            }
            // A symlink counts when it leads to a file.
            if ty.is_symlink() && !path.is_file() {
                continue;
            }
            let key = text::key(&path);
            if text::is_std(&key) || !seen.insert(key.clone()) {
                continue;
            }
            if scan.files.len() >= MAX_FILES {
                scan.note = Some(format!(
                    "the workspace has more than {MAX_FILES} .shard files: references and rename searched the first {MAX_FILES} (the open buffers' directories first, then each workspace folder breadth first)"
                ));
                return scan;
            }
            scan.files.push(key);
        }
    }
    scan
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn roots_from_initialize() {
        let folders = json!({
            "rootUri": "file:///nowhere/a",
            "workspaceFolders": [
                {"uri": "file:///nowhere/b", "name": "b"},
                {"uri": "file:///nowhere/b/c", "name": "c"},
                {"uri": "https://example.com/x", "name": "x"},
                {"uri": 3},
            ],
        });
        assert_eq!(roots_of(&folders), vec![PathBuf::from("/nowhere/b")]);
        let root = json!({"rootUri": "file:///nowhere/a", "workspaceFolders": null});
        assert_eq!(roots_of(&root), vec![PathBuf::from("/nowhere/a")]);
        let path = json!({"rootUri": null, "rootPath": "/nowhere/p"});
        assert_eq!(roots_of(&path), vec![PathBuf::from("/nowhere/p")]);
        assert!(roots_of(&json!({"rootPath": "relative"})).is_empty());
        assert!(roots_of(&json!(null)).is_empty());
        assert!(roots_of(&json!({"rootUri": "file://"})).is_empty());
    }

    #[test]
    fn folders_change() {
        let roots = vec![PathBuf::from("/nowhere/a"), PathBuf::from("/nowhere/b")];
        let event = json!({"event": {
            "added": [{"uri": "file:///nowhere/c", "name": "c"}],
            "removed": [{"uri": "file:///nowhere/a", "name": "a"}],
        }});
        assert_eq!(
            changed(&roots, &event),
            vec![PathBuf::from("/nowhere/b"), PathBuf::from("/nowhere/c")]
        );
        assert_eq!(changed(&roots, &json!({})), roots);
    }
}
