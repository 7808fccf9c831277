//! Parameters out of a run: the final parameters every run keeps
//! (`RUN_DIR/final/params.safetensors`, the model's own names: a valid
//! `--init`), the first step's gradients (`run --dump-grads`) and `shardc
//! export`, which writes a run's parameters in another library's names and
//! layouts through a weight map (`model.safetensors` for `from_pretrained`).

use crate::runtime::train::Named;
use crate::weights::Bound;
use clap::ValueEnum;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The float type a file is written in.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutDtype {
    F32,
    F64,
    Bf16,
    F16,
}

impl OutDtype {
    fn dtype(self) -> Dtype {
        match self {
            OutDtype::F32 => Dtype::F32,
            OutDtype::F64 => Dtype::F64,
            OutDtype::Bf16 => Dtype::BF16,
            OutDtype::F16 => Dtype::F16,
        }
    }

    fn bytes(self, v: &[f64]) -> Vec<u8> {
        match self {
            OutDtype::F32 => v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect(),
            OutDtype::F64 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            OutDtype::Bf16 => v
                .iter()
                .flat_map(|x| half::bf16::from_f64(*x).to_le_bytes())
                .collect(),
            OutDtype::F16 => v
                .iter()
                .flat_map(|x| half::f16::from_f64(*x).to_le_bytes())
                .collect(),
        }
    }
}

/// Tensors to write: name, shape, values.
pub type Tensors = Vec<(String, Vec<usize>, Vec<f64>)>;

/// Write tensors to one safetensors file, through a temporary file renamed
/// into place (a killed writer leaves no half-written file under the name).
pub fn write(
    path: &Path,
    tensors: &Tensors,
    dtype: OutDtype,
    meta: HashMap<String, String>,
) -> Result<(), String> {
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, s, v)| (n.clone(), s.clone(), dtype.bytes(v)))
        .collect();
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, s, b)| {
            TensorView::new(dtype.dtype(), s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| format!("`{n}`: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let name = path
        .file_name()
        .map_or_else(|| "out".to_string(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(".{name}.tmp-{}", std::process::id()));
    safetensors::tensor::serialize_to_file(views, Some(meta), &tmp)
        .map_err(|e| format!("cannot write `{}`: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        format!("cannot write `{}`: {e}", path.display())
    })
}

/// Named global arrays as tensors under the program's shapes, in the
/// program's order; through `bound` when given (each under the checkpoint's
/// name, in its layout).
pub fn tensors(
    prog: &crate::spmd::Program,
    named: Named,
    bound: Option<&Bound>,
) -> Result<Tensors, String> {
    let mut by_name: HashMap<String, Vec<f64>> = named.into_iter().collect();
    let mut out = Vec::new();
    match bound {
        None => {
            for p in &prog.params {
                if let Some(v) = by_name.remove(&p.name) {
                    out.push((p.name.clone(), p.stored.known_shape(), v));
                }
            }
        }
        Some(b) => {
            for bd in &b.bindings {
                let p = &prog.params[bd.param];
                let Some(v) = by_name.remove(&p.name) else {
                    continue;
                };
                let v = bd
                    .to_file(v, &p.stored.known_shape())
                    .map_err(|e| format!("`{}` → `{}`: {e}", p.name, bd.source))?;
                out.push((bd.source.clone(), bd.file_shape.clone(), v));
            }
        }
    }
    Ok(out)
}

/// `RUN_DIR/final/params.safetensors`: the parameters after the last step,
/// by the model's names, in the run's float type; the previous `final/` is
/// replaced only once the new one is whole.
pub fn save_final(
    dir: &Path,
    prog: &crate::spmd::Program,
    last: Named,
    f64: bool,
    step: usize,
) -> Result<PathBuf, String> {
    let tensors = tensors(prog, last, None)?;
    let fin = dir.join("final");
    let tmp = dir.join(format!(".final.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("cannot create `{}`: {e}", tmp.display()))?;
    let meta = HashMap::from([
        ("format".to_string(), "shardc-params-1".to_string()),
        ("model".to_string(), prog.model.clone()),
        ("step".to_string(), step.to_string()),
    ]);
    let dtype = if f64 { OutDtype::F64 } else { OutDtype::F32 };
    write(&tmp.join("params.safetensors"), &tensors, dtype, meta)?;
    let _ = std::fs::remove_dir_all(&fin);
    std::fs::rename(&tmp, &fin).map_err(|e| format!("cannot write `{}`: {e}", fin.display()))?;
    Ok(fin.join("params.safetensors"))
}

/// `shardc export`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// The model file the parameters were trained with.
    pub file: PathBuf,
    /// What to export: a run directory (its `final/`), a checkpoint
    /// directory (`step-NNNNNNNN`), or a safetensors file of the model's
    /// parameters (`--dump-init`'s, `final/params.safetensors`).
    #[arg(long)]
    pub from: PathBuf,
    /// The directory to write `model.safetensors` into (created).
    #[arg(long)]
    pub out: PathBuf,
    /// A weight map (TOML): write the map's names and layouts (e.g.
    /// `models/maps/llama_hf.toml` for `from_pretrained`). Without one, the
    /// model's own names.
    #[arg(long)]
    pub map: Option<PathBuf>,
    /// The float type written.
    #[arg(long, value_enum, default_value_t = OutDtype::F32)]
    pub dtype: OutDtype,
    /// Which model, when the file has several `train` declarations.
    #[arg(long)]
    pub model: Option<String>,
    /// A `config.json` to copy beside the weights (the one of the checkpoint
    /// the run started from): `from_pretrained` needs it, and shardc does
    /// not write one.
    #[arg(long)]
    pub config: Option<PathBuf>,
}

/// The safetensors file holding a run's parameters: a run directory's
/// `final/`, a parameter file's directory, a checkpoint directory, or a file.
fn params_file(from: &Path) -> Result<PathBuf, String> {
    if !from.is_dir() {
        return Ok(from.to_path_buf());
    }
    ["final/params.safetensors", "params.safetensors", "tensors.safetensors"]
        .iter()
        .map(|f| from.join(f))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            format!(
                "`{}` holds no `final/params.safetensors` (a run directory), `params.safetensors` or `tensors.safetensors` (a checkpoint)",
                from.display()
            )
        })
}

/// `shardc export`: a run's parameters, whole, in the names and layouts of a
/// weight map (or the model's own), in one `model.safetensors`.
pub fn export(args: &ExportArgs, grants: &[PathBuf]) -> std::process::ExitCode {
    use std::process::ExitCode;
    let opts = crate::world::Options {
        grants: grants.to_vec(),
        map: args.map.clone(),
        ..Default::default()
    };
    let c = match super::compile_clean(&args.file, &opts, true) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let prog = match c.settings(args.model.as_deref()) {
        Ok((p, ..)) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let fail = |e: String| {
        eprintln!("error: {e}");
        ExitCode::from(2)
    };
    let file = match params_file(&args.from) {
        Ok(f) => f,
        Err(e) => return fail(e),
    };
    let store = match crate::weights::Store::open(&file) {
        Ok(s) => s,
        Err(e) => return fail(e.to_string()),
    };
    let mut named = Vec::new();
    let mut missing = Vec::new();
    for p in &prog.params {
        // A checkpoint names parameters `param/NAME`.
        let found = store
            .floats(&p.name)
            .or_else(|| store.floats(&format!("param/{}", p.name)));
        match found {
            Some(Ok(v)) if v.len() == p.stored.known_shape().iter().product::<usize>() => {
                named.push((p.name.clone(), v))
            }
            Some(Ok(v)) => {
                return fail(format!(
                    "`{}` holds {} values for `{}`, which has {:?}",
                    file.display(),
                    v.len(),
                    p.name,
                    p.stored.known_shape()
                ))
            }
            Some(Err(e)) => return fail(e.to_string()),
            None => missing.push(p.name.clone()),
        }
    }
    if !missing.is_empty() {
        return fail(format!(
            "`{}` does not hold {} parameter(s) of `{}`: {}",
            file.display(),
            missing.len(),
            prog.model,
            missing
                .iter()
                .take(8)
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let bound = c.map.as_ref().map(|m| crate::weights::bind(m, prog).0);
    let tensors = match tensors(prog, named, bound.as_ref()) {
        Ok(t) => t,
        Err(e) => return fail(e),
    };
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        return fail(format!("cannot create `{}`: {e}", args.out.display()));
    }
    let dest = args.out.join("model.safetensors");
    // transformers reads `format: pt` to know the layout is PyTorch's.
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    if let Err(e) = write(&dest, &tensors, args.dtype, meta) {
        return fail(e);
    }
    if let Some(cfg) = &args.config {
        let copied = crate::files::read_regular(cfg, 16 << 20)
            .map_err(|e| format!("cannot read `{}`: {e}", cfg.display()))
            .and_then(|b| {
                serde_json::from_slice::<serde_json::Value>(&b)
                    .map_err(|e| format!("`{}` is not JSON: {e}", cfg.display()))?;
                let to = args.out.join("config.json");
                std::fs::write(&to, b).map_err(|e| format!("cannot write `{}`: {e}", to.display()))
            });
        if let Err(e) = copied {
            return fail(e);
        }
    }
    let dtype = args
        .dtype
        .to_possible_value()
        .map_or_else(String::new, |v| v.get_name().to_string());
    eprintln!(
        "wrote {} tensors ({dtype}) to `{}`",
        tensors.len(),
        dest.display()
    );
    ExitCode::SUCCESS
}
