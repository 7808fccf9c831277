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

/// What `--init` read: every parameter's values, the file's tensors the
/// model has no parameter for (with the nearest parameter name, if any), and
/// the computed buffers the file lacks (computed as the model says).
#[derive(Debug, Default)]
pub struct Init {
    pub params: HashMap<String, Vec<f64>>,
    pub unused: Vec<(String, Option<String>)>,
    pub recomputed: Vec<String>,
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

    /// One note naming the computed buffers the file did not hold.
    pub fn note(&self) -> Option<String> {
        (!self.recomputed.is_empty()).then(|| {
            format!(
                "{} computed buffer(s) not in the file are computed as the model says: {}",
                self.recomputed.len(),
                names(&self.recomputed, |n| format!("`{n}`"))
            )
        })
    }
}

/// A parameter's tensor as the file should hold it: the parameter, the
/// file's name for it (the same without a map), and the shape.
#[derive(Debug)]
pub struct Wanted {
    pub param: String,
    pub source: String,
    pub shape: Vec<usize>,
    /// The map's layout that gives `shape`, if any.
    pub layout: Option<String>,
}

impl std::fmt::Display for Wanted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.param == self.source {
            write!(f, "`{}` {:?}", self.param, self.shape)
        } else {
            write!(
                f,
                "`{}` {:?} (for `{}`)",
                self.source, self.shape, self.param
            )
        }
    }
}

/// Why `--init` could not use a file.
#[derive(Debug)]
pub enum InitError {
    Store(crate::weights::StoreError),
    /// The file does not fit the model: parameters without a tensor (with
    /// the nearest unclaimed tensor name), tensors of another shape (the
    /// file's), tensors of a dtype that is not a float.
    Mismatch {
        path: PathBuf,
        missing: Vec<(Wanted, Option<String>)>,
        shapes: Vec<(Wanted, Vec<usize>)>,
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
            InitError::Store(e) => e.fmt(f),
            InitError::Mismatch {
                path,
                missing,
                shapes,
                dtypes,
            } => {
                write!(f, "`{}` does not fit the model", path.display())?;
                if !missing.is_empty() {
                    let list = names(missing, |(w, near)| match near {
                        Some(m) => format!("{w} (the file has `{m}`)"),
                        None => w.to_string(),
                    });
                    write!(f, "; no tensor for {} parameter(s): {list}", missing.len())?;
                }
                if !shapes.is_empty() {
                    let list = names(shapes, |(w, file)| {
                        match &w.layout {
                        Some(l) => format!(
                            "`{}` is {file:?} in the file; the map's layout \"{l}\" for `{}` gives {:?}",
                            w.source, w.param, w.shape
                        ),
                        None => format!(
                            "`{}` is {file:?} in the file, {:?} in the model",
                            w.source, w.shape
                        ),
                    }
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

/// `--init`: initial parameters from a checkpoint (a safetensors file, a
/// sharded checkpoint's index, or a directory holding either), by the model's
/// own names or through a weight map. Every parameter must be there with its
/// shape, in a float dtype; a computed buffer the file lacks is computed;
/// tensors nothing claims are reported in [`Init::unused`].
pub fn load_init(
    prog: &crate::spmd::Program,
    path: &Path,
    map: Option<&crate::weights::WeightMap>,
) -> Result<Init, InitError> {
    let store = crate::weights::Store::open(path).map_err(InitError::Store)?;
    let bound = match map {
        Some(m) => crate::weights::bind(m, prog).0,
        None => crate::weights::identity(prog),
    };
    let claimed: std::collections::HashSet<&str> =
        bound.bindings.iter().map(|b| b.source.as_str()).collect();
    let (mut missing, mut shapes, mut dtypes) = (vec![], vec![], vec![]);
    let mut out = Init::default();
    for b in &bound.bindings {
        let p = &prog.params[b.param];
        let want = || Wanted {
            param: p.name.clone(),
            source: b.source.clone(),
            shape: b.file_shape.clone(),
            layout: b.layout.as_ref().map(|l| l.text().to_string()),
        };
        let Some(stored) = store.stored(&b.source) else {
            if b.optional {
                out.recomputed.push(p.name.clone());
                continue;
            }
            let unclaimed = store.names().filter(|n| !claimed.contains(n));
            let near = crate::diag::did_you_mean(&b.source, unclaimed);
            missing.push((want(), near));
            continue;
        };
        if stored.shape != b.file_shape {
            shapes.push((want(), stored.shape));
            continue;
        }
        match store.floats(&b.source) {
            Some(Ok(data)) => {
                let values = b.to_param(data, &p.stored.known_shape()).map_err(|e| {
                    InitError::Store(crate::weights::StoreError::NotSafetensors {
                        path: path.to_path_buf(),
                        why: e.0,
                    })
                })?;
                out.params.insert(p.name.clone(), values);
            }
            Some(Err(crate::weights::StoreError::NotFloat { tensor, dtype })) => {
                dtypes.push((tensor, format!("{dtype:?}")))
            }
            Some(Err(e)) => return Err(InitError::Store(e)),
            None => missing.push((want(), None)),
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
    // Computed buffers no rule names (a map leaves RoPE tables out).
    for (i, p) in prog.params.iter().enumerate() {
        if matches!(p.init, crate::init::Init::Computed(_))
            && !bound.bindings.iter().any(|b| b.param == i)
        {
            out.recomputed.push(p.name.clone());
        }
    }
    let sources: Vec<&str> = bound.bindings.iter().map(|b| b.source.as_str()).collect();
    out.unused = store
        .names()
        .filter(|n| !claimed.contains(n))
        .map(|n| {
            (
                n.to_string(),
                crate::diag::did_you_mean(n, sources.iter().copied()),
            )
        })
        .collect();
    Ok(out)
}
