//! Initial parameters in and out of safetensors files under the model's own
//! dotted names: `--dump-init` writes what a run would start from, `--init`
//! starts from a file such as a converted pretrained checkpoint. A file is
//! checked against the whole model before any of it is used: every parameter
//! missing, every shape that differs and every tensor the model does not have
//! is named in one error (or, for extra tensors, one warning), with the
//! nearest parameter name where there is one. Half-precision files (bf16,
//! f16: most of the Hugging Face Hub) are widened to the run's float type.

use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::Arrays;

/// `--dump-init`: the initial global parameters, by dotted layer path, as they would
/// be on any mesh (initialisation does not depend on the layout).
pub fn dump_init(prog: &crate::spmd::Program, seed: u64, path: &Path) -> Result<usize, String> {
    let mut arrays: Arrays = Vec::new();
    for p in &prog.params {
        let shape: Vec<usize> = p.stored.known_shape();
        let v = crate::runtime::buffers::initial(prog, p, seed).map_err(|e| e.to_string())?;
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

/// What `--init` read: every parameter's values, and the file's tensors the
/// model has no parameter for (with the nearest parameter name, if any).
#[derive(Debug, Default)]
pub struct Init {
    pub params: HashMap<String, Vec<f64>>,
    pub unused: Vec<(String, Option<String>)>,
}

impl Init {
    /// One warning naming every unused tensor, when there are any.
    pub fn warning(&self, path: &Path) -> Option<String> {
        if self.unused.is_empty() {
            return None;
        }
        Some(format!(
            "`{}` holds {} tensor(s) the model has no parameter for, not used: {}",
            path.display(),
            self.unused.len(),
            names(&self.unused, |(n, near)| match near {
                Some(m) => format!("`{n}` (did you mean `{m}`?)"),
                None => format!("`{n}`"),
            })
        ))
    }
}

/// Why `--init` could not use a file.
#[derive(Debug)]
pub enum InitError {
    Unreadable {
        path: PathBuf,
        error: String,
    },
    NotSafetensors {
        path: PathBuf,
        error: String,
    },
    /// The file does not fit the model: parameters without a tensor (name,
    /// shape, nearest tensor name), tensors of another shape (name, file's,
    /// model's), tensors of a dtype that is not a float.
    Mismatch {
        path: PathBuf,
        missing: Vec<(String, Vec<usize>, Option<String>)>,
        shapes: Vec<(String, Vec<usize>, Vec<usize>)>,
        dtypes: Vec<(String, String)>,
    },
}

/// At most this many names are listed per kind; the rest are counted.
const LISTED: usize = 12;

fn names<T>(items: &[T], show: impl Fn(&T) -> String) -> String {
    let mut out: Vec<String> = items.iter().take(LISTED).map(show).collect();
    if items.len() > LISTED {
        out.push(format!("and {} more", items.len() - LISTED));
    }
    out.join(", ")
}

impl std::fmt::Display for InitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InitError::Unreadable { path, error } => {
                write!(f, "cannot read `{}`: {error}", path.display())
            }
            InitError::NotSafetensors { path, error } => {
                write!(f, "`{}` is not a safetensors file: {error}", path.display())
            }
            InitError::Mismatch {
                path,
                missing,
                shapes,
                dtypes,
            } => {
                write!(f, "`{}` does not fit the model", path.display())?;
                if !missing.is_empty() {
                    let list = names(missing, |(n, s, near)| match near {
                        Some(m) => format!("`{n}` {s:?} (the file has `{m}`)"),
                        None => format!("`{n}` {s:?}"),
                    });
                    write!(f, "; no tensor for {} parameter(s): {list}", missing.len())?;
                }
                if !shapes.is_empty() {
                    let list = names(shapes, |(n, file, model)| {
                        format!("`{n}` is {file:?} in the file, {model:?} in the model")
                    });
                    write!(f, "; {} of another shape: {list}", shapes.len())?;
                }
                if !dtypes.is_empty() {
                    let list = names(dtypes, |(n, d)| format!("`{n}` is {d}"));
                    write!(
                        f,
                        "; {} not stored as floats (F64, F32, BF16 or F16): {list}",
                        dtypes.len()
                    )?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for InitError {}

/// A float tensor's values; `Err` names its dtype when it holds no floats.
fn floats(v: &TensorView) -> Result<Vec<f64>, String> {
    let d = v.data();
    let halves = |f: fn(u16) -> f64| -> Vec<f64> {
        d.chunks_exact(2)
            .map(|c| f(u16::from_le_bytes([c[0], c[1]])))
            .collect()
    };
    match v.dtype() {
        Dtype::BF16 => Ok(halves(|b| half::bf16::from_bits(b).to_f64())),
        Dtype::F16 => Ok(halves(|b| half::f16::from_bits(b).to_f64())),
        Dtype::F32 | Dtype::F64 => crate::arrays::decode_float(v, ""),
        other => Err(format!("{other:?}")),
    }
}

/// `--init`: initial parameters from a safetensors file with the model's
/// names. Every parameter must be there with its global shape, in a float
/// dtype; tensors the model does not have are reported in [`Init::unused`].
pub fn load_init(prog: &crate::spmd::Program, path: &Path) -> Result<Init, InitError> {
    let buf = crate::files::read_regular(path, crate::files::DATA_CAP).map_err(|e| {
        InitError::Unreadable {
            path: path.to_path_buf(),
            error: e.to_string(),
        }
    })?;
    let st =
        safetensors::SafeTensors::deserialize(&buf).map_err(|e| InitError::NotSafetensors {
            path: path.to_path_buf(),
            error: e.to_string(),
        })?;
    let in_file: Vec<String> = {
        let mut n: Vec<String> = st.names().into_iter().map(str::to_string).collect();
        n.sort();
        n
    };
    let params: Vec<&str> = prog.params.iter().map(|p| p.name.as_str()).collect();
    let (mut missing, mut shapes, mut dtypes) = (vec![], vec![], vec![]);
    let mut out = Init::default();
    for p in &prog.params {
        let shape: Vec<usize> = p.stored.known_shape();
        let Ok(v) = st.tensor(&p.name) else {
            let unclaimed = in_file
                .iter()
                .map(String::as_str)
                .filter(|n| !params.contains(n));
            let near = crate::diag::did_you_mean(&p.name, unclaimed);
            missing.push((p.name.clone(), shape, near));
            continue;
        };
        if v.shape() != shape.as_slice() {
            shapes.push((p.name.clone(), v.shape().to_vec(), shape));
            continue;
        }
        match floats(&v) {
            Ok(data) => {
                out.params.insert(p.name.clone(), data);
            }
            Err(dtype) => dtypes.push((p.name.clone(), dtype)),
        }
    }
    if !(missing.is_empty() && shapes.is_empty() && dtypes.is_empty()) {
        return Err(InitError::Mismatch {
            path: path.to_path_buf(),
            missing,
            shapes,
            dtypes,
        });
    }
    out.unused = in_file
        .iter()
        .filter(|n| !params.contains(&n.as_str()))
        .map(|n| {
            (
                n.clone(),
                crate::diag::did_you_mean(n, params.iter().copied()),
            )
        })
        .collect();
    Ok(out)
}
