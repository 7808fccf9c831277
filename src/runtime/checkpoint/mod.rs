//! Checkpoints: global (unsharded) arrays in safetensors plus a JSON manifest,
//! written to a temporary directory and renamed into place, so a process killed
//! mid-save leaves the previous checkpoint intact. Global arrays make restoring
//! onto a different mesh a matter of taking other pieces. Nothing is trusted
//! blindly: each tensor carries a SHA-256 in the manifest, a save is read back
//! before older checkpoints are rotated away, and a resume checks the files
//! against each other and against the program (`verify`).

mod error;
pub mod write;

pub use error::{CheckpointError, ParamProblem, Untrusted};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
pub use write::Sink;

/// Version 2 added the run id and a checksum per tensor.
pub const FORMAT: &str = "shardc-checkpoint-2";

type Res<T> = Result<T, CheckpointError>;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TensorInfo {
    pub name: String,
    pub shape: Vec<usize>,
    /// The stored layout on the mesh that wrote it, e.g. `f32[784@data, 512]`.
    pub layout: String,
    /// SHA-256 of the tensor's stored bytes (little-endian, in the file's dtype).
    #[serde(default)]
    pub sha256: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub model: String,
    /// The run series that wrote it: a fresh run draws one, a resumed run keeps
    /// its checkpoint's. Rotation deletes only its own series' checkpoints.
    #[serde(default)]
    pub run: String,
    /// Steps completed: a resumed run starts with step `step + 1`.
    pub step: usize,
    pub seed: u64,
    /// The random state: every random draw is a pure function of the seed and a
    /// counter (the step), so the seed and step restore it exactly.
    #[serde(default)]
    pub rng: String,
    /// Training examples consumed so far (step × batch): where the data continues.
    #[serde(default)]
    pub data_position: usize,
    pub mesh: Vec<(String, i64)>,
    pub dtype: String,
    pub optimizer: String,
    pub tensors: Vec<TensorInfo>,
}

/// Named global arrays: `param/NAME`, `opt_m/NAME`, `opt_v/NAME`.
pub type Arrays = Vec<(String, Vec<usize>, Vec<f64>)>;

fn step_dir(dir: &Path, step: usize) -> PathBuf {
    dir.join(format!("step-{step:08}"))
}

/// A fresh run series' id: distinct for every run started (time, process, a
/// counter), stable across its resumes.
pub fn new_run_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut h = Sha256::new();
    h.update(now.to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    h.update(COUNT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    write::hex(&h.finalize()[..8])
}

fn sha256(b: &[u8]) -> String {
    write::hex(&Sha256::digest(b))
}

fn werr(path: &Path, e: &dyn std::fmt::Display) -> CheckpointError {
    CheckpointError::Write {
        path: path.to_path_buf(),
        error: e.to_string(),
    }
}

/// Write one checkpoint, read it back to verify it, and keep the newest `keep`
/// of this run series (older ones only; never another series', never one newer
/// than this, which a fallback resume left behind). `manifest` lists the
/// tensors (their checksums are filled in here); `fill` puts each one's values
/// into the [`Sink`] in the order given, as it gathers them (see [`write`]).
/// `Err(E)`: `fill` failed; `Ok(Err(_))`: the checkpoint was not written.
pub fn save<E>(
    dir: &Path,
    keep: usize,
    manifest: &Manifest,
    f64: bool,
    fill: impl FnOnce(&[usize], &mut Sink) -> Result<(), E>,
) -> Result<Res<PathBuf>, E> {
    if let Err(e) = std::fs::create_dir_all(dir) {
        return Ok(Err(werr(dir, &e)));
    }
    // Fault injection for the failed-save test (a full disk, a lost mount).
    if std::env::var_os("SHARDC_FAULT_SAVE_FAIL").is_some() {
        return Ok(Err(werr(dir, &"injected failure (SHARDC_FAULT_SAVE_FAIL)")));
    }
    let tmp = dir.join(format!(
        ".tmp-step-{:08}-{}",
        manifest.step,
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    if let Err(e) = std::fs::create_dir_all(&tmp) {
        return Ok(Err(werr(&tmp, &e)));
    }
    let meta = HashMap::from([
        ("format".to_string(), FORMAT.to_string()),
        ("step".to_string(), manifest.step.to_string()),
    ]);
    let file = tmp.join("tensors.safetensors");
    let sums = write::stream(&file, manifest, f64, meta, fill);
    let done = match sums {
        Ok(Ok(sums)) => Ok(finish(dir, keep, manifest, &tmp, sums)),
        Ok(Err(e)) => Ok(Err(e)),
        Err(e) => Err(e),
    };
    if !matches!(done, Ok(Ok(_))) {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    done
}

/// The rest of a save once its tensors are written to `tmp`: the manifest
/// with their checksums, the rename into place, the read-back, the rotation.
fn finish(
    dir: &Path,
    keep: usize,
    manifest: &Manifest,
    tmp: &Path,
    sums: Vec<String>,
) -> Res<PathBuf> {
    let mut manifest = manifest.clone();
    for (t, sum) in manifest.tensors.iter_mut().zip(sums) {
        t.sha256 = sum;
    }
    // Fault injection for the kill-during-save test: hold the half-written state.
    if let Some(ms) = std::env::var("SHARDC_FAULT_SAVE_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    let json = serde_json::to_string_pretty(&manifest).map_err(|e| werr(tmp, &e))?;
    let mpath = tmp.join("manifest.json");
    std::fs::write(&mpath, json).map_err(|e| werr(&mpath, &e))?;
    let dest = step_dir(dir, manifest.step);
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::rename(tmp, &dest).map_err(|e| werr(&dest, &e))?;
    // Trust what is on the disk, not what was meant to be: read it back.
    let written = read_manifest(&dest)?;
    write::verify(&dest.join("tensors.safetensors"), &written)?;
    // Half-written directories of processes killed mid-save are garbage now
    // (only ones that hold nothing but a checkpoint's files).
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.filter_map(|e| e.ok()) {
            if e.file_name().to_string_lossy().starts_with(".tmp-step-") && only_ours(&e.path()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    let mut older: Vec<(usize, PathBuf)> = list(dir)
        .into_iter()
        .filter(|(s, p)| {
            *s < manifest.step
                && read_manifest(p).is_ok_and(|m| m.run == manifest.run)
                && p.join("tensors.safetensors").is_file()
        })
        .collect();
    older.sort();
    let keep_older = keep.max(1) - 1;
    while older.len() > keep_older {
        let (_, p) = older.remove(0);
        let _ = std::fs::remove_dir_all(p);
    }
    Ok(dest)
}

/// A directory holding nothing but a checkpoint's two files.
fn only_ours(dir: &Path) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.filter_map(|e| e.ok()).all(|e| {
        let n = e.file_name();
        e.file_type().is_ok_and(|t| t.is_file())
            && (n == "tensors.safetensors" || n == "manifest.json")
    })
}

/// The step a directory's name gives, only when the name is exactly what
/// [`step_dir`] writes for it: `step-` and at least 8 digits, no sign, no extra
/// leading zeros (`step-+0000012` and `step-000000012` are not checkpoints).
fn named_step(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("step-")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let step: usize = digits.parse().ok()?;
    (format!("step-{step:08}") == name).then_some(step)
}

/// What a directory entry named `step-…` is.
enum Found {
    /// A directory (not a link to one) named exactly as [`step_dir`] names it.
    Step(usize),
    Suspect(Untrusted),
}

/// The one rule [`list`] and [`suspects`] share; `None` for entries not named
/// like a checkpoint (temporary directories, anything else).
fn classify(e: &std::fs::DirEntry) -> Option<Found> {
    let name = e.file_name();
    let name = name.to_string_lossy();
    if !name.starts_with("step-") {
        return None;
    }
    let kind = e.file_type().ok()?;
    Some(if kind.is_symlink() {
        Found::Suspect(Untrusted::Link)
    } else if !kind.is_dir() {
        Found::Suspect(Untrusted::NotDirectory)
    } else {
        named_step(&name).map_or(Found::Suspect(Untrusted::Name), Found::Step)
    })
}

/// Complete checkpoints in `dir`, by step: directories (not links to one) whose
/// name is one shardc writes, holding a manifest. Temporary directories are
/// ignored; anything else named like a checkpoint is one of [`suspects`].
pub fn list(dir: &Path) -> Vec<(usize, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return vec![];
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| match classify(&e)? {
            Found::Step(step) => e
                .path()
                .join("manifest.json")
                .exists()
                .then(|| (step, e.path())),
            Found::Suspect(_) => None,
        })
        .collect()
}

/// Entries of `dir` named like a checkpoint that shardc did not write as one: a
/// name it would not write, a symbolic link, something other than a directory.
/// A resume refuses them rather than guess what they hold.
pub fn suspects(dir: &Path) -> Vec<(PathBuf, Untrusted)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return vec![];
    };
    let mut out: Vec<(PathBuf, Untrusted)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| match classify(&e)? {
            Found::Suspect(why) => Some((e.path(), why)),
            Found::Step(_) => None,
        })
        .collect();
    out.sort();
    out
}

/// A checkpoint's own files must be files in it, not links to elsewhere.
fn own_files(path: &Path) -> Res<()> {
    for name in ["manifest.json", "tensors.safetensors"] {
        let f = path.join(name);
        if std::fs::symlink_metadata(&f).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(CheckpointError::Untrusted {
                path: f,
                why: Untrusted::Link,
            });
        }
    }
    Ok(())
}

fn read_manifest(path: &Path) -> Res<Manifest> {
    let mpath = path.join("manifest.json");
    let m = crate::files::read_regular(&mpath, 64 << 20).map_err(|e| CheckpointError::Io {
        path: mpath.clone(),
        error: e.to_string(),
    })?;
    serde_json::from_slice(&m).map_err(|e| CheckpointError::NotManifest {
        path: mpath,
        error: e.to_string(),
    })
}

/// Read a checkpoint and verify it: its manifest's format and step, every listed
/// tensor present with its shape and checksum, nothing unlisted.
pub fn load(path: &Path) -> Res<(Manifest, Arrays)> {
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(CheckpointError::Untrusted {
            path: path.to_path_buf(),
            why: Untrusted::Link,
        });
    }
    own_files(path)?;
    let manifest = read_manifest(path)?;
    if manifest.format != FORMAT {
        return Err(CheckpointError::Format {
            path: path.to_path_buf(),
            found: manifest.format,
        });
    }
    let named = path.file_name().and_then(|n| named_step(n.to_str()?));
    if let Some(named) = named.filter(|n| *n != manifest.step) {
        return Err(CheckpointError::StepMismatch {
            path: path.to_path_buf(),
            named,
            manifest: manifest.step,
        });
    }
    let file = path.join("tensors.safetensors");
    let buf = crate::files::read_regular(&file, crate::files::DATA_CAP).map_err(|e| {
        CheckpointError::Io {
            path: file.clone(),
            error: e.to_string(),
        }
    })?;
    let corrupt = |e: &dyn std::fmt::Display| CheckpointError::Corrupt {
        path: file.clone(),
        error: e.to_string(),
    };
    let st = safetensors::SafeTensors::deserialize(&buf).map_err(|e| corrupt(&e))?;
    for name in st.names() {
        if !manifest.tensors.iter().any(|t| t.name == *name) {
            return Err(CheckpointError::Unlisted {
                path: file.clone(),
                tensor: name.to_string(),
            });
        }
    }
    let mut arrays = Vec::new();
    for t in &manifest.tensors {
        let v = st.tensor(&t.name).map_err(|_| CheckpointError::Missing {
            path: file.clone(),
            tensor: t.name.clone(),
        })?;
        if v.shape() != t.shape.as_slice() {
            return Err(CheckpointError::Shape {
                path: file.clone(),
                tensor: t.name.clone(),
                file: v.shape().to_vec(),
                manifest: t.shape.clone(),
            });
        }
        if sha256(v.data()) != t.sha256 {
            return Err(CheckpointError::Checksum {
                path: file.clone(),
                tensor: t.name.clone(),
            });
        }
        let data = crate::arrays::decode_float(&v, &t.name).map_err(|e| corrupt(&e))?;
        arrays.push((t.name.clone(), t.shape.clone(), data));
    }
    Ok((manifest, arrays))
}

/// A fresh run's claim on its checkpoint directory: refused when the directory
/// holds another run's checkpoints, unless `overwrite` (then they are deleted).
/// `root` is the run directory: the checkpoint directory, symlinks resolved,
/// must stay inside it (or a granted directory).
pub fn claim(dir: &Path, root: &Path, grants: &[PathBuf], fresh: bool, overwrite: bool) -> Res<()> {
    std::fs::create_dir_all(dir).map_err(|e| CheckpointError::Write {
        path: dir.to_path_buf(),
        error: e.to_string(),
    })?;
    if !crate::access::stays_inside(dir, root, grants) {
        return Err(CheckpointError::Escapes {
            dir: dir.to_path_buf(),
        });
    }
    if !fresh {
        return Ok(());
    }
    let mut found = list(dir);
    found.sort();
    if found.is_empty() {
        return Ok(());
    }
    if !overwrite {
        return Err(CheckpointError::Foreign {
            dir: dir.to_path_buf(),
            steps: found.iter().map(|f| f.0).collect(),
        });
    }
    for (_, p) in found {
        if only_ours(&p) {
            let _ = std::fs::remove_dir_all(p);
        }
    }
    Ok(())
}

/// What to do when the newest checkpoint fails verification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Refuse, naming the problem (the default).
    Refuse,
    /// Warn and resume from the newest checkpoint that passes.
    NewestValid,
}

/// Load the newest checkpoint into `cfg`: parameters, optimizer slots, step, run.
pub fn resume(
    prog: &crate::spmd::Program,
    cfg: &mut super::config::Config,
) -> Result<String, CheckpointError> {
    resume_with(prog, cfg, Fallback::Refuse)
}

/// [`resume`], choosing what a failed verification does.
pub fn resume_with(
    prog: &crate::spmd::Program,
    cfg: &mut super::config::Config,
    fallback: Fallback,
) -> Result<String, CheckpointError> {
    let dir = cfg
        .checkpoint
        .as_ref()
        .map(|c| c.dir.clone())
        .ok_or(CheckpointError::NoBlock)?;
    let mut all = list(&dir);
    all.sort();
    let mut skipped: Vec<(PathBuf, CheckpointError)> = Vec::new();
    let mut newest_error = None;
    for (path, why) in suspects(&dir) {
        let e = CheckpointError::Untrusted {
            path: path.clone(),
            why,
        };
        if fallback == Fallback::Refuse {
            return Err(e);
        }
        skipped.push((path, e));
    }
    while let Some((_, path)) = all.pop() {
        let checked = load(&path).and_then(|(m, a)| {
            if m.step > cfg.steps {
                return Err(CheckpointError::BeyondRun {
                    path: path.clone(),
                    step: m.step,
                    steps: cfg.steps,
                });
            }
            verify::fits(&path, &m, &a, prog, cfg)?;
            Ok((m, a))
        });
        match checked {
            Ok((m, arrays)) => {
                verify::apply(&m, arrays, cfg);
                let mesh: Vec<String> = m.mesh.iter().map(|(a, n)| format!("{a}={n}")).collect();
                let mut msg = String::new();
                for (p, e) in &skipped {
                    msg += &format!("warning: skipped `{}`: {e}\n", p.display());
                }
                msg += &format!(
                    "resuming from `{}` (step {}, saved on {})",
                    path.display(),
                    m.step,
                    mesh.join(", ")
                );
                return Ok(msg);
            }
            Err(e) if fallback == Fallback::NewestValid => {
                newest_error.get_or_insert_with(|| e.clone());
                skipped.push((path, e));
            }
            Err(e) => return Err(e),
        }
    }
    Err(match newest_error {
        Some(e) => CheckpointError::NoneValid {
            dir,
            newest: Box::new(e),
        },
        None => CheckpointError::NoCheckpoint { dir },
    })
}

mod verify;

mod init;
pub use init::{dump_init, load_init, Init, InitError};
