//! Checkpoints: global (unsharded) arrays in safetensors plus a JSON manifest,
//! written to a temporary directory and renamed into place, so a process killed
//! mid-save leaves the previous checkpoint intact. Global arrays make restoring
//! onto a different mesh a matter of taking other pieces.

use safetensors::tensor::{Dtype, TensorView};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const FORMAT: &str = "shardc-checkpoint-1";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TensorInfo {
    pub name: String,
    pub shape: Vec<usize>,
    /// The stored layout on the mesh that wrote it, e.g. `f32[784@data, 512]`.
    pub layout: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub model: String,
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

/// Write one checkpoint and keep only the newest `keep`.
pub fn save(
    dir: &Path,
    keep: usize,
    manifest: &Manifest,
    arrays: &Arrays,
    f64: bool,
) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    let tmp = dir.join(format!(
        ".tmp-step-{:08}-{}",
        manifest.step,
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("cannot create `{}`: {e}", tmp.display()))?;
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = arrays
        .iter()
        .map(|(n, shape, v)| {
            let b: Vec<u8> = if f64 {
                v.iter().flat_map(|x| x.to_le_bytes()).collect()
            } else {
                v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect()
            };
            (n.clone(), shape.clone(), b)
        })
        .collect();
    let dtype = if f64 { Dtype::F64 } else { Dtype::F32 };
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| {
            TensorView::new(dtype, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    let mut meta = HashMap::new();
    meta.insert("format".to_string(), FORMAT.to_string());
    meta.insert("step".to_string(), manifest.step.to_string());
    safetensors::tensor::serialize_to_file(views, Some(meta), &tmp.join("tensors.safetensors"))
        .map_err(|e| e.to_string())?;
    // Fault injection for the kill-during-save test: hold the half-written state.
    if let Some(ms) = std::env::var("SHARDC_FAULT_SAVE_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
    let json = serde_json::to_string_pretty(manifest).map_err(|e| e.to_string())?;
    std::fs::write(tmp.join("manifest.json"), json).map_err(|e| e.to_string())?;
    let dest = step_dir(dir, manifest.step);
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::rename(&tmp, &dest)
        .map_err(|e| format!("cannot move the checkpoint into place: {e}"))?;
    // Half-written directories of processes killed mid-save are garbage now.
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.filter_map(|e| e.ok()) {
            if e.file_name().to_string_lossy().starts_with(".tmp-step-") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    // Keep the one just written and the newest others (a fresh run into a directory
    // with a later step's checkpoints must not lose its own).
    let mut all = list(dir);
    all.retain(|(_, p)| *p != dest);
    all.sort();
    while all.len() + 1 > keep.max(1) {
        let (_, p) = all.remove(0);
        let _ = std::fs::remove_dir_all(p);
    }
    Ok(dest)
}

/// Complete checkpoints in `dir`, by step (temporary directories are ignored).
pub fn list(dir: &Path) -> Vec<(usize, PathBuf)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return vec![];
    };
    rd.filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            let step = name.strip_prefix("step-")?.parse::<usize>().ok()?;
            e.path()
                .join("manifest.json")
                .exists()
                .then(|| (step, e.path()))
        })
        .collect()
}

/// Read a checkpoint: its manifest and arrays, checked against each other.
pub fn load(path: &Path) -> Result<(Manifest, Arrays), String> {
    let m = std::fs::read_to_string(path.join("manifest.json")).map_err(|e| {
        format!(
            "cannot read `{}`: {e}",
            path.join("manifest.json").display()
        )
    })?;
    let manifest: Manifest = serde_json::from_str(&m).map_err(|e| {
        format!(
            "`{}` is not a shardc manifest: {e}",
            path.join("manifest.json").display()
        )
    })?;
    if manifest.format != FORMAT {
        return Err(format!(
            "`{}` has format `{}`, expected `{FORMAT}`",
            path.display(),
            manifest.format
        ));
    }
    let file = path.join("tensors.safetensors");
    let buf = std::fs::read(&file).map_err(|e| format!("cannot read `{}`: {e}", file.display()))?;
    let st = safetensors::SafeTensors::deserialize(&buf)
        .map_err(|e| format!("`{}` is corrupt: {e}", file.display()))?;
    let mut arrays = Vec::new();
    for t in &manifest.tensors {
        let v = st.tensor(&t.name).map_err(|_| {
            format!(
                "`{}` lacks the tensor `{}` its manifest lists",
                file.display(),
                t.name
            )
        })?;
        if v.shape() != t.shape.as_slice() {
            return Err(format!(
                "tensor `{}` has shape {:?} in `{}` but {:?} in the manifest",
                t.name,
                v.shape(),
                file.display(),
                t.shape
            ));
        }
        let data = crate::arrays::decode_float(&v, &t.name)?;
        arrays.push((t.name.clone(), t.shape.clone(), data));
    }
    Ok((manifest, arrays))
}

/// Load the newest checkpoint into `cfg`: parameters, optimizer slots, step.
pub fn resume(
    prog: &crate::spmd::Program,
    cfg: &mut super::config::Config,
) -> Result<String, String> {
    let dir = cfg
        .checkpoint
        .as_ref()
        .map(|c| c.dir.clone())
        .ok_or("the `train` declaration has no `checkpoint` block")?;
    let mut all = list(&dir);
    all.sort();
    let (_, path) = all
        .pop()
        .ok_or_else(|| format!("no checkpoint in `{}`", dir.display()))?;
    let (m, arrays) = load(&path)?;
    if m.model != prog.model {
        return Err(format!(
            "`{}` holds model `{}`, not `{}`",
            path.display(),
            m.model,
            prog.model
        ));
    }
    for p in &prog.params {
        let key = format!("param/{}", p.name);
        let shape: Vec<usize> = p.stored.known_shape();
        let Some((_, s, v)) = arrays.iter().find(|a| a.0 == key) else {
            return Err(format!(
                "`{}` has no tensor for parameter `{}`",
                path.display(),
                p.name
            ));
        };
        if *s != shape {
            return Err(format!(
                "parameter `{}` is {:?} in `{}` but {:?} in the model",
                p.name,
                s,
                path.display(),
                shape
            ));
        }
        cfg.init.insert(p.name.clone(), v.clone());
    }
    for (n, _, v) in &arrays {
        if n.starts_with("opt_") {
            cfg.init_opt.insert(n.clone(), v.clone());
        }
    }
    cfg.start_step = m.step;
    let mesh: Vec<String> = m.mesh.iter().map(|(a, n)| format!("{a}={n}")).collect();
    Ok(format!(
        "resuming from `{}` (step {}, saved on {})",
        path.display(),
        m.step,
        mesh.join(", ")
    ))
}

/// `--dump-init`: the initial global parameters, by dotted layer path, as they would
/// be on any mesh (initialisation does not depend on the layout).
pub fn dump_init(prog: &crate::spmd::Program, seed: u64, path: &Path) -> Result<usize, String> {
    let mut arrays: Arrays = Vec::new();
    for p in &prog.params {
        let shape: Vec<usize> = p.stored.known_shape();
        let n: usize = shape.iter().product();
        let idx: Vec<u64> = (0..n as u64).collect();
        let v = p.init.values(
            &p.stored,
            seed ^ crate::init::hash_str(&p.name),
            &idx,
            &prog.bound,
        );
        arrays.push((p.name.clone(), shape, v));
    }
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = arrays
        .iter()
        .map(|(n, s, v)| {
            (
                n.clone(),
                s.clone(),
                v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect(),
            )
        })
        .collect();
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| {
            TensorView::new(Dtype::F32, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    safetensors::tensor::serialize_to_file(views, None, path)
        .map_err(|e| format!("cannot write `{}`: {e}", path.display()))?;
    Ok(arrays.len())
}

/// `--init`: initial parameters from a safetensors file with those names. Every
/// parameter must be there with its global shape.
pub fn load_init(
    prog: &crate::spmd::Program,
    path: &Path,
) -> Result<HashMap<String, Vec<f64>>, String> {
    let buf = std::fs::read(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    let st = safetensors::SafeTensors::deserialize(&buf)
        .map_err(|e| format!("`{}` is not a safetensors file: {e}", path.display()))?;
    let mut out = HashMap::new();
    for p in &prog.params {
        let shape: Vec<usize> = p.stored.known_shape();
        let v = st.tensor(&p.name).map_err(|_| {
            format!(
                "`{}` has no tensor `{}` (shape {shape:?})",
                path.display(),
                p.name
            )
        })?;
        if v.shape() != shape.as_slice() {
            return Err(format!(
                "tensor `{}` in `{}` has shape {:?}, but the model's is {shape:?}",
                p.name,
                path.display(),
                v.shape()
            ));
        }
        let data = crate::arrays::decode_float(&v, &p.name)?;
        out.insert(p.name.clone(), data);
    }
    Ok(out)
}
