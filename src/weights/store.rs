//! Reading pretrained checkpoints as the Hugging Face Hub holds them: one
//! `.safetensors` file, a sharded checkpoint through its
//! `model.safetensors.index.json`, or a model directory (with `config.json`)
//! holding either. Only headers are read up front; each tensor is read from
//! its file when it is used (positioned reads, not a memory map: a file cut
//! short while a run reads it is an error, not a SIGBUS), and widened from
//! its stored float type (f64, f32, bf16, f16) to f64.

use safetensors::tensor::{Dtype, TensorInfo};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The largest safetensors header read (the format's own limit).
const MAX_HEADER: u64 = 100_000_000;
/// The largest index file read.
const MAX_INDEX: u64 = 64 << 20;

/// Why a checkpoint cannot be read.
#[derive(Debug)]
pub enum StoreError {
    Unreadable {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Not a safetensors file (or cut short): its header or length is wrong.
    NotSafetensors { path: PathBuf, why: String },
    /// An index that is not the Hub's `{"weight_map": {name: file}}`.
    BadIndex { path: PathBuf, why: String },
    /// An index naming a shard that is not there.
    MissingShard {
        index: PathBuf,
        shard: String,
        tensor: String,
        error: std::io::Error,
    },
    /// An index naming a tensor its shard does not hold.
    NotInShard {
        index: PathBuf,
        shard: String,
        tensor: String,
    },
    /// A directory without a checkpoint in it.
    NoCheckpoint { dir: PathBuf, found: Vec<String> },
    /// A tensor that is not stored as floats.
    NotFloat { tensor: String, dtype: Dtype },
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreError::Unreadable { path, error } => {
                write!(f, "cannot read `{}`: {error}", path.display())
            }
            StoreError::NotSafetensors { path, why } => {
                write!(
                    f,
                    "`{}` is not a whole safetensors file: {why}",
                    path.display()
                )
            }
            StoreError::BadIndex { path, why } => write!(
                f,
                "`{}` is not a safetensors index (`{{\"weight_map\": {{tensor: file}}}}`): {why}",
                path.display()
            ),
            StoreError::MissingShard {
                index,
                shard,
                tensor,
                error,
            } => write!(
                f,
                "`{}` puts `{tensor}` in the shard `{shard}`, which cannot be read: {error}",
                index.display()
            ),
            StoreError::NotInShard {
                index,
                shard,
                tensor,
            } => write!(
                f,
                "`{}` puts `{tensor}` in the shard `{shard}`, which does not hold it",
                index.display()
            ),
            StoreError::NoCheckpoint { dir, found } => {
                write!(
                    f,
                    "`{}` holds no `model.safetensors.index.json` or `.safetensors` file",
                    dir.display()
                )?;
                if !found.is_empty() {
                    write!(f, " (it holds {})", found.join(", "))?;
                }
                Ok(())
            }
            StoreError::NotFloat { tensor, dtype } => write!(
                f,
                "`{tensor}` is stored as {dtype:?}; shardc reads F64, F32, BF16 and F16 tensors"
            ),
        }
    }
}

impl std::error::Error for StoreError {}

type Res<T> = Result<T, StoreError>;

/// One safetensors file: its tensors' places, and where its data begins.
struct Shard {
    path: PathBuf,
    file: std::fs::File,
    data_start: u64,
    tensors: HashMap<String, TensorInfo>,
}

/// A tensor as stored: its shape and dtype.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub shape: Vec<usize>,
    pub dtype: Dtype,
}

/// An opened checkpoint: every tensor name, each in its shard.
pub struct Store {
    /// What the user named.
    pub path: PathBuf,
    shards: Vec<Shard>,
    where_: BTreeMap<String, usize>,
}

fn unreadable(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |error| StoreError::Unreadable {
        path: path.to_path_buf(),
        error,
    }
}

fn open_shard(path: &Path) -> Res<Shard> {
    use std::os::unix::fs::FileExt;
    let file = crate::files::open_regular(path).map_err(unreadable(path))?;
    let len = file.metadata().map_err(unreadable(path))?.len();
    let bad = |why: String| StoreError::NotSafetensors {
        path: path.to_path_buf(),
        why,
    };
    let mut n8 = [0u8; 8];
    file.read_exact_at(&mut n8, 0)
        .map_err(|_| bad(format!("{len} bytes, too short for a header")))?;
    let n = u64::from_le_bytes(n8);
    if n > MAX_HEADER || n + 8 > len {
        return Err(bad(format!(
            "its header claims {n} bytes; the file has {len}"
        )));
    }
    let mut header = vec![0u8; n as usize];
    file.read_exact_at(&mut header, 8)
        .map_err(unreadable(path))?;
    let raw: HashMap<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|e| bad(format!("its header is not JSON: {e}")))?;
    let mut tensors = HashMap::new();
    let mut end = 0usize;
    for (name, v) in raw {
        if name == "__metadata__" {
            continue;
        }
        let info: TensorInfo =
            serde_json::from_value(v).map_err(|e| bad(format!("the entry of `{name}`: {e}")))?;
        let (a, b) = info.data_offsets;
        let elems = info
            .shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d));
        let want = elems
            .and_then(|e| e.checked_mul(info.dtype.bitsize()))
            .map(|b| b.div_ceil(8));
        if b < a || want != Some(b - a) {
            return Err(bad(format!(
                "`{name}` ({:?} {:?}) has {} bytes of data",
                info.dtype,
                info.shape,
                b.saturating_sub(a)
            )));
        }
        end = end.max(b);
        tensors.insert(name, info);
    }
    let data_start = 8 + n;
    if data_start + end as u64 != len {
        return Err(bad(format!(
            "the header describes {} bytes of data; the file holds {} (cut short or padded)",
            end,
            len - data_start
        )));
    }
    Ok(Shard {
        path: path.to_path_buf(),
        file,
        data_start,
        tensors,
    })
}

/// The Hub's index: `weight_map` from tensor name to shard file.
fn read_index(path: &Path) -> Res<BTreeMap<String, String>> {
    let bytes = crate::files::read_regular(path, MAX_INDEX).map_err(unreadable(path))?;
    let v: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| StoreError::BadIndex {
            path: path.to_path_buf(),
            why: e.to_string(),
        })?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| StoreError::BadIndex {
            path: path.to_path_buf(),
            why: "no `weight_map` object".into(),
        })?;
    map.iter()
        .map(|(k, v)| match v.as_str() {
            Some(s) if !s.contains('/') && !s.contains('\\') && s != ".." => {
                Ok((k.clone(), s.to_string()))
            }
            _ => Err(StoreError::BadIndex {
                path: path.to_path_buf(),
                why: format!("the shard of `{k}` is not a file name beside the index: {v}"),
            }),
        })
        .collect()
}

impl Store {
    /// Open a `.safetensors` file, an index, or a directory holding either.
    pub fn open(path: &Path) -> Res<Store> {
        let meta = std::fs::metadata(path).map_err(unreadable(path))?;
        if meta.is_dir() {
            let index = path.join("model.safetensors.index.json");
            if index.is_file() {
                return Store::indexed(path, &index);
            }
            let single = path.join("model.safetensors");
            if single.is_file() {
                return Store::single(path, &single);
            }
            let mut found: Vec<String> = std::fs::read_dir(path)
                .map_err(unreadable(path))?
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            found.sort();
            let st: Vec<&String> = found
                .iter()
                .filter(|n| n.ends_with(".safetensors"))
                .collect();
            if let [one] = st.as_slice() {
                return Store::single(path, &path.join(one));
            }
            found.truncate(8);
            return Err(StoreError::NoCheckpoint {
                dir: path.to_path_buf(),
                found,
            });
        }
        if path.to_string_lossy().ends_with(".index.json") {
            return Store::indexed(path, path);
        }
        Store::single(path, path)
    }

    fn single(named: &Path, file: &Path) -> Res<Store> {
        let shard = open_shard(file)?;
        let where_ = shard.tensors.keys().map(|k| (k.clone(), 0)).collect();
        Ok(Store {
            path: named.to_path_buf(),
            shards: vec![shard],
            where_,
        })
    }

    fn indexed(named: &Path, index: &Path) -> Res<Store> {
        let map = read_index(index)?;
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut shards: Vec<Shard> = Vec::new();
        let mut by_file: HashMap<String, usize> = HashMap::new();
        let mut where_ = BTreeMap::new();
        for (tensor, file) in &map {
            let i = match by_file.get(file) {
                Some(&i) => i,
                None => {
                    let shard = open_shard(&dir.join(file)).map_err(|e| match e {
                        StoreError::Unreadable { error, .. } => StoreError::MissingShard {
                            index: index.to_path_buf(),
                            shard: file.clone(),
                            tensor: tensor.clone(),
                            error,
                        },
                        other => other,
                    })?;
                    shards.push(shard);
                    by_file.insert(file.clone(), shards.len() - 1);
                    shards.len() - 1
                }
            };
            if !shards[i].tensors.contains_key(tensor) {
                return Err(StoreError::NotInShard {
                    index: index.to_path_buf(),
                    shard: file.clone(),
                    tensor: tensor.clone(),
                });
            }
            where_.insert(tensor.clone(), i);
        }
        Ok(Store {
            path: named.to_path_buf(),
            shards,
            where_,
        })
    }

    /// Every tensor name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.where_.keys().map(String::as_str)
    }

    /// A tensor's shape and dtype.
    pub fn stored(&self, name: &str) -> Option<Stored> {
        let info = self.shards[*self.where_.get(name)?].tensors.get(name)?;
        Some(Stored {
            shape: info.shape.clone(),
            dtype: info.dtype,
        })
    }

    /// The shard file holding a tensor.
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        Some(self.shards[*self.where_.get(name)?].path.as_path())
    }

    /// A tensor's values, widened to f64 (`None` when there is no such tensor).
    pub fn floats(&self, name: &str) -> Option<Res<Vec<f64>>> {
        use std::os::unix::fs::FileExt;
        let shard = &self.shards[*self.where_.get(name)?];
        let info = shard.tensors.get(name)?;
        Some((|| {
            let decode: fn(&[u8]) -> f64 = match info.dtype {
                Dtype::F64 => |c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])),
                Dtype::F32 => |c| f64::from(f32::from_le_bytes(c.try_into().unwrap_or([0; 4]))),
                Dtype::BF16 => |c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
                Dtype::F16 => |c| half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
                dtype => {
                    return Err(StoreError::NotFloat {
                        tensor: name.to_string(),
                        dtype,
                    })
                }
            };
            let width = info.dtype.bitsize() / 8;
            let (a, b) = info.data_offsets;
            let mut bytes = Vec::new();
            bytes
                .try_reserve_exact(b - a)
                .map_err(|_| StoreError::Unreadable {
                    path: shard.path.clone(),
                    error: std::io::Error::new(
                        std::io::ErrorKind::OutOfMemory,
                        format!("`{name}` needs {} bytes", b - a),
                    ),
                })?;
            bytes.resize(b - a, 0);
            shard
                .file
                .read_exact_at(&mut bytes, shard.data_start + a as u64)
                .map_err(unreadable(&shard.path))?;
            Ok(bytes.chunks_exact(width).map(decode).collect())
        })())
    }
}
