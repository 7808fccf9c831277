//! Named arrays on disk: `.safetensors`, `.npz`, and directories of `.npy` files.
//! One reader for training data, and one decoder of safetensors views shared with
//! checkpoints and `--init`. Values are held as f64 (exact for integer ids below 2^53).

use safetensors::tensor::{Dtype, TensorView};
use std::path::Path;

#[derive(Clone, Debug, PartialEq)]
pub struct Array {
    pub name: String,
    pub shape: Vec<usize>,
    /// Stored as an integer type (ids, labels).
    pub int: bool,
    /// The element type as stored, for messages (`int32`, `float32`, ...).
    pub dtype: &'static str,
    pub values: Vec<f64>,
}

/// Every array in `path` of a file system: a `.safetensors` or `.npz` file, or
/// a directory whose `NAME.npy` files are the arrays. Errors say what is wrong
/// with the file.
pub fn read(files: &dyn crate::files::Files, path: &Path) -> Result<Vec<Array>, String> {
    let Some(path) = files.on_disk(path) else {
        // Only safetensors files are decoded from their bytes.
        let buf = files.read(path).map_err(|e| io_reason(&e))?;
        return safetensors_arrays(&buf);
    };
    let path = path.as_path();
    let meta = std::fs::metadata(path).map_err(|e| io_reason(&e))?;
    if meta.is_dir() {
        let mut out = Vec::new();
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map_err(|e| io_reason(&e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "npy"))
            .collect();
        entries.sort();
        if entries.is_empty() {
            return Err("the directory holds no `.npy` files".into());
        }
        for p in entries {
            let name = p
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default();
            let t = candle_core::Tensor::read_npy(&p).map_err(|e| {
                format!(
                    "`{}` is not a readable .npy file: {}",
                    p.display(),
                    npy_reason(&e)
                )
            })?;
            out.push(from_tensor(name, &t)?);
        }
        return Ok(out);
    }
    let ext = path
        .extension()
        .map(|x| x.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    match ext.as_str() {
        "safetensors" => {
            let buf = files.read(path).map_err(|e| io_reason(&e))?;
            safetensors_arrays(&buf)
        }
        "npz" => {
            let mut v = candle_core::Tensor::read_npz(path)
                .map_err(|e| format!("not a readable .npz file ({})", npy_reason(&e)))?;
            v.sort_by(|a, b| a.0.cmp(&b.0));
            v.into_iter().map(|(n, t)| from_tensor(n, &t)).collect()
        }
        "npy" => Err("a single `.npy` file holds one unnamed array; put `x.npy` and `y.npy` in a directory and name the directory, or use `.npz`".into()),
        _ => Err("expected a `.safetensors` or `.npz` file, or a directory of `.npy` files".into()),
    }
}

/// The arrays of a safetensors file's bytes, sorted by name.
fn safetensors_arrays(buf: &[u8]) -> Result<Vec<Array>, String> {
    let st = safetensors::SafeTensors::deserialize(buf)
        .map_err(|e| format!("not a safetensors file ({e})"))?;
    let mut names: Vec<String> = st.names().into_iter().map(str::to_string).collect();
    names.sort();
    names
        .into_iter()
        .map(|n| {
            let v = st.tensor(&n).map_err(|e| e.to_string())?;
            let (values, int, dtype) = decode_any(&v, &n)?;
            Ok(Array {
                shape: v.shape().to_vec(),
                name: n,
                int,
                dtype,
                values,
            })
        })
        .collect()
}

fn io_reason(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::NotFound => "no such file or directory".into(),
        _ => e.to_string(),
    }
}

fn npy_reason(e: &candle_core::Error) -> String {
    // candle wraps the cause in context lines; the first line is the useful one.
    e.to_string().lines().next().unwrap_or("").to_string()
}

fn from_tensor(name: String, t: &candle_core::Tensor) -> Result<Array, String> {
    use candle_core::DType as D;
    let flat = t.flatten_all().map_err(|e| e.to_string())?;
    let bad = |e: candle_core::Error| e.to_string();
    let (values, int, dtype): (Vec<f64>, bool, &'static str) = match t.dtype() {
        D::U8 => (
            flat.to_vec1::<u8>()
                .map_err(bad)?
                .into_iter()
                .map(f64::from)
                .collect(),
            true,
            "uint8",
        ),
        D::U32 => (
            flat.to_vec1::<u32>()
                .map_err(bad)?
                .into_iter()
                .map(f64::from)
                .collect(),
            true,
            "uint32",
        ),
        D::I16 => (
            flat.to_vec1::<i16>()
                .map_err(bad)?
                .into_iter()
                .map(f64::from)
                .collect(),
            true,
            "int16",
        ),
        D::I32 => (
            flat.to_vec1::<i32>()
                .map_err(bad)?
                .into_iter()
                .map(f64::from)
                .collect(),
            true,
            "int32",
        ),
        D::I64 => (
            flat.to_vec1::<i64>()
                .map_err(bad)?
                .into_iter()
                .map(|v| v as f64)
                .collect(),
            true,
            "int64",
        ),
        D::F32 => (
            flat.to_vec1::<f32>()
                .map_err(bad)?
                .into_iter()
                .map(f64::from)
                .collect(),
            false,
            "float32",
        ),
        D::F64 => (flat.to_vec1::<f64>().map_err(bad)?, false, "float64"),
        D::F16 | D::BF16 => (
            flat.to_dtype(D::F64)
                .and_then(|t| t.to_vec1::<f64>())
                .map_err(bad)?,
            false,
            if t.dtype() == D::F16 {
                "float16"
            } else {
                "bfloat16"
            },
        ),
        other => return Err(format!("array `{name}` has the unsupported type {other:?}")),
    };
    Ok(Array {
        name,
        shape: t.dims().to_vec(),
        int,
        dtype,
        values,
    })
}

/// A safetensors view's values as f64, whether it is stored as a float (F32, F64)
/// or an integer (I32, I64) type, with that type's name.
pub fn decode_any(v: &TensorView, name: &str) -> Result<(Vec<f64>, bool, &'static str), String> {
    let d = v.data();
    Ok(match v.dtype() {
        Dtype::F32 => (
            d.chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            false,
            "float32",
        ),
        Dtype::F64 => (
            d.chunks_exact(8)
                .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                .collect(),
            false,
            "float64",
        ),
        Dtype::I32 => (
            d.chunks_exact(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64)
                .collect(),
            true,
            "int32",
        ),
        Dtype::I64 => (
            d.chunks_exact(8)
                .map(|c| {
                    i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64
                })
                .collect(),
            true,
            "int64",
        ),
        other => {
            return Err(format!(
                "tensor `{name}` has dtype {other:?}; expected F32, F64, I32 or I64"
            ))
        }
    })
}

/// A stored parameter's values: floats only (checkpoints and `--init`).
pub fn decode_float(v: &TensorView, name: &str) -> Result<Vec<f64>, String> {
    match decode_any(v, name)? {
        (vals, false, _) => Ok(vals),
        (_, true, ty) => Err(format!(
            "tensor `{name}` is {ty}; parameters are stored as F32 or F64"
        )),
    }
}
