//! `shardc._shardc`: the native half of the Python package (python/shardc/).
//! It links the shardc library itself, so `shardc.run` trains exactly as
//! `shardc run` does (the same argument parser, the same driver, the same run
//! directory), with the GIL released while the devices work. The Python half
//! turns what comes back into typed objects and numpy arrays.

use pyo3::exceptions::{PyFileNotFoundError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use shardc::diag::render::{self, Style};
use shardc::world::{self, Compilation, Options};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Large blocks from one arena a training run reuses, small ones mimalloc's,
/// as in the `shardc` binary (src/heap.rs).
#[global_allocator]
static ALLOC: shardc::heap::Heap = shardc::heap::Heap;

pyo3::create_exception!(
    _shardc,
    CompileError,
    pyo3::exceptions::PyException,
    "A model with errors: args are (summary, diagnostics as JSON, rendered text)."
);
pyo3::create_exception!(
    _shardc,
    RunFailed,
    pyo3::exceptions::PyException,
    "A run that stopped with an error: args are (the error lines,)."
);

/// What every compiling function takes: mesh overrides, granted paths,
/// `strict`, and a `--data` file.
fn options(
    mesh: Vec<(String, i64)>,
    allow: Vec<PathBuf>,
    strict: bool,
    data: Option<PathBuf>,
) -> Options {
    Options {
        mesh,
        grants: allow,
        strict,
        data,
        ..Options::default()
    }
}

/// Diagnostics as `check --format json` gives them, each rendered as the
/// command line shows it, and the summary line.
fn report(c: &Compilation, name: &str) -> (String, Vec<String>, String) {
    let json: Vec<serde_json::Value> = c
        .diagnostics
        .iter()
        .map(|d| render::json(d, &c.sources))
        .collect();
    let rendered = c
        .diagnostics
        .iter()
        .map(|d| render::human(d, &c.sources, Style::Plain))
        .collect();
    (
        serde_json::Value::Array(json).to_string(),
        rendered,
        c.summary(name),
    )
}

/// The file compiled without errors, or `CompileError` with its diagnostics.
fn compile_clean(path: &Path, opts: &Options) -> PyResult<Compilation> {
    let c = world::compile(path, opts).map_err(|e| {
        PyFileNotFoundError::new_err(format!("cannot read `{}`: {e}", path.display()))
    })?;
    for (axis, _) in &opts.mesh {
        if !c.program.meshes.iter().any(|m| m.axis(axis).is_some()) {
            return Err(PyValueError::new_err(format!(
                "mesh names axis `{axis}`, which no mesh in `{}` has",
                path.display()
            )));
        }
    }
    if c.has_errors() {
        let (json, rendered, summary) = report(&c, &path.display().to_string());
        return Err(CompileError::new_err((summary, json, rendered)));
    }
    Ok(c)
}

/// `shardc check`: the diagnostics of a file, or of source text (named
/// `path`, its imports found beside it).
#[pyfunction]
#[pyo3(signature = (path, source=None, strict=false, mesh=vec![], allow=vec![]))]
fn check(
    py: Python<'_>,
    path: PathBuf,
    source: Option<String>,
    strict: bool,
    mesh: Vec<(String, i64)>,
    allow: Vec<PathBuf>,
) -> PyResult<(String, Vec<String>, String, bool)> {
    let opts = options(mesh, allow, strict, None);
    let c = py.detach(|| match source {
        Some(text) => Ok(world::compile_source(&path, text, &opts)),
        None => world::compile(&path, &opts),
    });
    let c = c.map_err(|e| {
        PyFileNotFoundError::new_err(format!("cannot read `{}`: {e}", path.display()))
    })?;
    let (json, rendered, summary) = report(&c, &path.display().to_string());
    Ok((json, rendered, summary, c.has_errors()))
}

/// `shardc plan --json`: the plans as JSON (of `model`, else every trained
/// model), compared with `device` when given.
#[pyfunction]
#[pyo3(signature = (path, mesh=vec![], device=None, model=None, allow=vec![], profile=None))]
fn plan(
    py: Python<'_>,
    path: PathBuf,
    mesh: Vec<(String, i64)>,
    device: Option<String>,
    model: Option<String>,
    allow: Vec<PathBuf>,
    profile: Option<PathBuf>,
) -> PyResult<String> {
    let device = device
        .map(|d| shardc::plan::device::parse(&d))
        .transpose()
        .map_err(PyValueError::new_err)?;
    // `shardc plan --profile`: a run's node times time the pipeline.
    let measured = profile
        .as_deref()
        .map(shardc::plan::measured::load)
        .transpose()
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let timed = measured.as_ref().zip(profile.as_deref());
    let c = py.detach(|| compile_clean(&path, &options(mesh, allow, false, None)))?;
    let plans = shardc::cli::plans_of(&c, &path, model.as_deref(), device, timed)
        .map_err(PyValueError::new_err)?;
    // Each plan as `plan --json` gives it, with its total bytes per device.
    let plans: Vec<serde_json::Value> = plans
        .iter()
        .map(|p| {
            let mut v = serde_json::to_value(p).unwrap_or_default();
            if let Some(o) = v.as_object_mut() {
                o.insert("total_memory".into(), p.total_memory().into());
                o.insert("step_flops".into(), p.step_flops().into());
            }
            v
        })
        .collect();
    Ok(serde_json::Value::Array(plans).to_string())
}

/// `shardc show`: how the named parameters or inputs lie on the mesh.
#[pyfunction]
#[pyo3(signature = (path, names, mesh=vec![], model=None, allow=vec![]))]
fn show(
    py: Python<'_>,
    path: PathBuf,
    names: Vec<String>,
    mesh: Vec<(String, i64)>,
    model: Option<String>,
    allow: Vec<PathBuf>,
) -> PyResult<String> {
    let c = py.detach(|| compile_clean(&path, &options(mesh, allow, false, None)))?;
    let (prog, ..) = c
        .settings(model.as_deref())
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let text = shardc::layout::show(prog, &names);
    if text.is_empty() {
        let known: Vec<&str> = prog.params.iter().map(|p| p.name.as_str()).collect();
        return Err(PyValueError::new_err(format!(
            "`{}` has no parameter or input named {}; its inputs are {}, its parameters {}",
            prog.model,
            names.join(" or "),
            prog.input_names.join(", "),
            known.join(", ")
        )));
    }
    Ok(text)
}

/// A model's name, its parameters' names, global shapes and whether each is
/// a computed buffer (which `init` may leave out), its inputs' names.
type Signature = (String, Vec<(String, Vec<usize>, bool)>, Vec<String>);

/// The trained model's parameters (name and global shape) and inputs
/// (name): what `init=` is checked against. With `data` (an array file),
/// the file is checked against the model too (E0304–E0306 for wrong arrays).
#[pyfunction]
#[pyo3(signature = (path, mesh=vec![], model=None, allow=vec![], data=None))]
fn signature(
    py: Python<'_>,
    path: PathBuf,
    mesh: Vec<(String, i64)>,
    model: Option<String>,
    allow: Vec<PathBuf>,
    data: Option<PathBuf>,
) -> PyResult<Signature> {
    let c = py.detach(|| compile_clean(&path, &options(mesh, allow, false, data)))?;
    let (prog, ..) = c
        .settings(model.as_deref())
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    // A computed buffer (a rotary table) may be left out of `init`, as of `--init`.
    let params = shardc::weights::identity(prog)
        .bindings
        .into_iter()
        .map(|b| (b.source, b.file_shape, b.optional))
        .collect();
    Ok((prog.model.clone(), params, prog.input_names.clone()))
}

/// A safetensors file of `(name, numpy dtype string, shape, bytes)`:
/// how in-memory `init=` arrays reach `--init`.
#[pyfunction]
fn write_safetensors(
    path: PathBuf,
    tensors: Vec<(String, String, Vec<usize>, Vec<u8>)>,
) -> PyResult<()> {
    use safetensors::tensor::{Dtype, TensorView};
    let mut views = Vec::new();
    for (name, dtype, shape, bytes) in &tensors {
        let dt = match dtype.as_str() {
            "<f4" => Dtype::F32,
            "<f8" => Dtype::F64,
            "<f2" => Dtype::F16,
            other => {
                return Err(PyValueError::new_err(format!(
                    "`{name}`: dtype {other} is not a little-endian float (float16, float32 or float64)"
                )))
            }
        };
        let view = TensorView::new(dt, shape.clone(), bytes)
            .map_err(|e| PyValueError::new_err(format!("`{name}`: {e}")))?;
        views.push((name.clone(), view));
    }
    safetensors::serialize_to_file(views, None, &path)
        .map_err(|e| PyValueError::new_err(format!("cannot write `{}`: {e}", path.display())))
}

/// `shardc run` with the command line's words (after `run`). `hook` is called
/// with each step's record as JSON and returns whether to go on; Ctrl-C
/// (SIGINT) ends the run at the next step boundary. Returns the results, or
/// raises `RunFailed` with the run's error lines.
#[pyfunction]
#[pyo3(signature = (words, hook=None))]
fn run<'py>(
    py: Python<'py>,
    words: Vec<String>,
    hook: Option<Py<PyAny>>,
) -> PyResult<Bound<'py, PyDict>> {
    let (args, grants) =
        shardc::cli::run_args(&words).map_err(|e| PyValueError::new_err(e.to_string()))?;
    // An exception from the hook (other than Ctrl-C) ends the run and is raised.
    let mut raised: Option<PyErr> = None;
    let mut interrupted = false;
    let (code, hooks) = py.detach(|| {
        let mut on_step = |rec: &shardc::runtime::report::Record| -> bool {
            Python::attach(|py| {
                let go = match &hook {
                    Some(h) => {
                        let json = serde_json::to_string(rec).unwrap_or_default();
                        h.call1(py, (json,)).and_then(|r| r.extract::<bool>(py))
                    }
                    None => Ok(true),
                };
                let go = go.and_then(|go| py.check_signals().map(|_| go));
                match go {
                    Ok(go) => go,
                    Err(e) if e.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py) => {
                        interrupted = true;
                        false
                    }
                    Err(e) => {
                        raised.get_or_insert(e);
                        false
                    }
                }
            })
        };
        let mut hooks = shardc::cli::Hooks {
            on_step: Some(&mut on_step),
            ..Default::default()
        };
        let code = shardc::cli::run_with(args, grants, &mut hooks);
        (
            code,
            (hooks.outcome.take(), std::mem::take(&mut hooks.errors)),
        )
    });
    if let Some(e) = raised {
        return Err(e);
    }
    let (outcome, errors) = hooks;
    let outcome = match (code == ExitCode::SUCCESS, outcome) {
        (true, Some(o)) => o,
        _ => {
            let lines = if errors.is_empty() {
                vec!["error: the run failed (see the messages above)".to_string()]
            } else {
                errors
            };
            return Err(RunFailed::new_err((lines.join("\n"),)));
        }
    };
    let out = PyDict::new(py);
    out.set_item("dir", outcome.dir.display().to_string())?;
    out.set_item("losses", outcome.losses)?;
    let records: Vec<String> = outcome
        .records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap_or_default())
        .collect();
    out.set_item("records", records)?;
    let dtype = if outcome.f64 { "<f8" } else { "<f4" };
    let params = PyDict::new(py);
    for (name, shape, values) in outcome.params {
        let bytes: Vec<u8> = if outcome.f64 {
            values.iter().flat_map(|v| v.to_le_bytes()).collect()
        } else {
            values
                .iter()
                .flat_map(|v| (*v as f32).to_le_bytes())
                .collect()
        };
        params.set_item(name, (shape, PyBytes::new(py, &bytes)))?;
    }
    out.set_item("dtype", dtype)?;
    out.set_item("params", params)?;
    out.set_item("stopped_at", outcome.stopped_at)?;
    out.set_item("interrupted", interrupted)?;
    Ok(out)
}

/// The `shardc` command (the package's console script): runs the command
/// line `argv` and ends the process with its exit status.
#[pyfunction]
fn cli(py: Python<'_>, argv: Vec<String>) -> PyResult<()> {
    let code = py.detach(|| shardc::cli::main_from(argv));
    let _ = std::io::Write::flush(&mut std::io::stdout());
    // (`ExitCode` says its number only by comparison.)
    let status = (0..=u8::MAX)
        .find(|&n| ExitCode::from(n) == code)
        .unwrap_or(1);
    std::process::exit(i32::from(status))
}

#[pymodule]
fn _shardc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("CompileError", m.py().get_type::<CompileError>())?;
    m.add("RunFailed", m.py().get_type::<RunFailed>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(check, m)?)?;
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    m.add_function(wrap_pyfunction!(show, m)?)?;
    m.add_function(wrap_pyfunction!(signature, m)?)?;
    m.add_function(wrap_pyfunction!(write_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(cli, m)?)?;
    Ok(())
}
