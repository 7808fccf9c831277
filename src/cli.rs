//! Command-line interface (clap). Exit codes: 0 clean, 1 diagnostics with errors,
//! 2 usage or I/O error.

use crate::diag::render::{self, Style};
use crate::diag::Code;
use crate::world::{self, Compilation, Options};
use clap::{Parser, Subcommand, ValueEnum};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

// Writing to a closed pipe (`shardc lower f | head`) is not an error worth a panic.
macro_rules! out {
    ($($t:tt)*) => {{
        let _ = write!(std::io::stdout().lock(), $($t)*);
    }};
}
macro_rules! outln {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

#[derive(Parser, Debug)]
#[command(
    name = "shardc",
    version,
    about = "Check and run sharded model definitions (.shard files)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Human,
    Json,
}

#[derive(Subcommand, Debug)]
pub enum FdoAction {
    /// Print the statistics in a directory of `fdo_stats_*.npz` files (each
    /// process's newest, merged by maximum), as `shardc run` would load them.
    Show { dir: PathBuf },
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Check shapes, dtypes and shardings without running anything.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Print the inferred type of every weight, parameter and binding.
        #[arg(long)]
        types: bool,
        /// Output format for diagnostics.
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
        /// Every collective must be written explicitly (like `pragma strict`).
        #[arg(long)]
        strict: bool,
        /// Never use colour.
        #[arg(long)]
        no_color: bool,
        /// Check this array file (.safetensors, .npz, or a directory of .npy) as
        /// every `train`'s data, as `run --data` would use it.
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Re-check a file on every save of it or anything it imports.
    Watch {
        file: PathBuf,
        #[arg(long)]
        strict: bool,
    },
    /// Per-device memory, FLOPs and communication per step, from types alone.
    Plan {
        file: PathBuf,
        /// Override mesh axis sizes, e.g. `--mesh dp=16,pp=8,tp=8`.
        #[arg(long, value_parser = parse_mesh)]
        mesh: Option<MeshArg>,
        /// Print the plan as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the SPMD program each `train` declaration lowers to, and verify it.
    Lower {
        file: PathBuf,
        #[arg(long, value_parser = parse_mesh)]
        mesh: Option<MeshArg>,
    },
    /// Draw how tensors lie on the mesh, as grids of the devices holding each piece
    ///
    /// Every parameter (or the named ones, e.g. `w1` or `blocks.0.attn`), the
    /// inputs and the output: what is split, what is replicated, FSDP's gathered
    /// layout and pipeline stages.
    Show {
        file: PathBuf,
        /// Parameter names or their last parts; `input`, `output`. None: all.
        names: Vec<String>,
        #[arg(long, value_parser = parse_mesh)]
        mesh: Option<MeshArg>,
        /// Which model, when the file has several `train` declarations.
        #[arg(long)]
        model: Option<String>,
    },
    /// Train a model on a mesh of virtual devices (or one device per MPI process).
    Run(RunArgs),
    /// Language server on stdio (diagnostics on every edit, types on hover).
    Lsp,
    /// Feedback-directed optimization files of embedding tables.
    Fdo {
        #[command(subcommand)]
        action: FdoAction,
    },
    /// Explain a diagnostic code, e.g. `shardc explain E0203`.
    Explain { code: Option<String> },
    /// Format files in place: indentation by nesting, a space after `,` and `:`
    /// and around `=` `->` and braces, no trailing space, at most one blank line;
    /// hand-aligned gaps stay. Only whitespace inside lines changes. `-` (or no
    /// file) formats stdin to stdout. A file that does not parse is left alone.
    Fmt {
        files: Vec<PathBuf>,
        /// Write nothing; list the files that are not formatted and exit 1 if any.
        #[arg(long)]
        check: bool,
    },
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match cli.command {
        Command::Check {
            files,
            types,
            format,
            strict,
            no_color,
            data,
        } => {
            let style = if !no_color && std::io::stderr().is_terminal() {
                Style::Color
            } else {
                Style::Plain
            };
            check(
                &files,
                types,
                format,
                &Options {
                    strict,
                    data,
                    ..Options::default()
                },
                style,
            )
        }
        Command::Watch { file, strict } => crate::watch::run(
            &file,
            &Options {
                strict,
                ..Options::default()
            },
        ),
        Command::Explain { code } => explain(code.as_deref()),
        Command::Fmt { files, check } => fmt(&files, check),
        Command::Lsp => crate::lsp::run(),
        Command::Fdo {
            action: FdoAction::Show { dir },
        } => match crate::embed::load(&dir) {
            Ok(l) => {
                for w in &l.warnings {
                    eprintln!("warning: {w}");
                }
                out!("{}", crate::embed::render(&l.stats, &l.files));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        Command::Run(args) => run(args),
        Command::Show {
            file,
            names,
            mesh,
            model,
        } => show(
            &file,
            &names,
            mesh.map(|m| m.0).unwrap_or_default(),
            model.as_deref(),
        ),
        Command::Lower { file, mesh } => lower(&file, mesh.map(|m| m.0).unwrap_or_default()),
        Command::Plan { file, mesh, json } => {
            plan(&file, mesh.map(|m| m.0).unwrap_or_default(), json)
        }
    }
}

/// `shardc fmt`: exit 0 when all is formatted (or was rewritten), 1 when
/// `--check` found a file to format, 2 when a file could not be read or written.
fn fmt(files: &[PathBuf], check: bool) -> ExitCode {
    use std::io::Read;
    if files.is_empty() || files.iter().any(|f| f.as_os_str() == "-") {
        let mut src = String::new();
        if let Err(e) = std::io::stdin().read_to_string(&mut src) {
            eprintln!("error: cannot read standard input: {e}");
            return ExitCode::from(2);
        }
        if let Some(errors) = syntax_errors(std::path::Path::new("<stdin>"), &src) {
            eprint!("{errors}");
            eprintln!("error: standard input was not formatted: it does not parse");
            return ExitCode::from(2);
        }
        let out = crate::fmt::format(&src);
        if check {
            return ExitCode::from(u8::from(out != src));
        }
        print!("{out}");
        return ExitCode::SUCCESS;
    }
    let mut code = 0u8;
    for f in files {
        let src = match std::fs::read_to_string(f) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: cannot read `{}`: {e}", f.display());
                code = 2;
                continue;
            }
        };
        // Like rustfmt, leave a file that does not parse alone, and say why.
        if let Some(errors) = syntax_errors(f, &src) {
            eprint!("{errors}");
            eprintln!(
                "error: `{}` was not formatted: it does not parse",
                f.display()
            );
            code = 2;
            continue;
        }
        let out = crate::fmt::format(&src);
        if out == src {
            continue;
        }
        if check {
            out!("{} is not formatted", f.display());
            code = code.max(1);
        } else if let Err(e) = std::fs::write(f, &out) {
            eprintln!("error: cannot write `{}`: {e}", f.display());
            code = 2;
        } else {
            out!("formatted {}", f.display());
        }
    }
    ExitCode::from(code)
}

/// The rendered syntax error of a source, if it has one (stage 1 of the one
/// compile path, so it reads exactly as `shardc check` prints it).
fn syntax_errors(path: &std::path::Path, src: &str) -> Option<String> {
    let (sources, d) = world::syntax(path, src.to_string());
    d.map(|d| render::human(&d, &sources, Style::Plain))
}

fn check(files: &[PathBuf], types: bool, format: Format, opts: &Options, style: Style) -> ExitCode {
    let mut worst = 0u8;
    let mut json_out = Vec::new();
    for f in files {
        let c = match world::compile(f, opts) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("error: cannot read `{}`: {e}", f.display());
                worst = 2;
                continue;
            }
        };
        if c.has_errors() {
            worst = worst.max(1);
        }
        match format {
            Format::Json => {
                let diags: Vec<serde_json::Value> = c
                    .diagnostics
                    .iter()
                    .map(|d| render::json(d, &c.sources))
                    .collect();
                let mut obj =
                    serde_json::json!({ "file": f.display().to_string(), "diagnostics": diags });
                if types {
                    obj["types"] = serde_json::to_value(&c.checked.types).unwrap_or_default();
                }
                json_out.push(obj);
            }
            Format::Human => {
                let mut err = std::io::stderr().lock();
                for d in &c.diagnostics {
                    let _ = write!(err, "{}", render::human(d, &c.sources, style));
                }
                if types {
                    out!("{}", types_table(&c));
                }
                let _ = writeln!(err, "{}", c.summary(&f.display().to_string()));
            }
        }
    }
    if format == Format::Json {
        let v = if json_out.len() == 1 {
            json_out.remove(0)
        } else {
            serde_json::Value::Array(json_out)
        };
        outln!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    }
    ExitCode::from(worst)
}

/// The `--types` listing, grouped by layer instance and function.
pub fn types_table(c: &Compilation) -> String {
    let mut scopes: Vec<&str> = Vec::new();
    for t in &c.checked.types {
        if !scopes.contains(&t.scope.as_str()) {
            scopes.push(&t.scope);
        }
    }
    let mut out = String::new();
    for s in scopes {
        out.push_str(&format!("── {s}\n"));
        let rows: Vec<_> = c.checked.types.iter().filter(|t| t.scope == s).collect();
        let nw = rows.iter().map(|t| t.name.len()).max().unwrap_or(0);
        let tw = rows.iter().map(|t| t.ty.chars().count()).max().unwrap_or(0);
        for t in rows {
            let f = c.sources.get(t.span.file);
            let (line, _) = f.line_col(t.span.start as usize);
            let at = if t.span.file == c.program.root {
                format!(":{line}")
            } else {
                format!("{}:{line}", f.name)
            };
            let pad = tw.saturating_sub(t.ty.chars().count());
            out.push_str(&format!(
                "  {:<6} {:<nw$}  {}{}   per device {}",
                t.kind,
                t.name,
                t.ty,
                " ".repeat(pad),
                t.local
            ));
            if let Some(u) = &t.used_as {
                out.push_str(&format!("   (gathered for use: {u})"));
            }
            out.push_str(&format!("   {at}\n"));
        }
    }
    out
}

#[derive(Clone, Debug)]
pub struct MeshArg(Vec<(String, i64)>);

fn parse_mesh(s: &str) -> Result<MeshArg, String> {
    let mut v = Vec::new();
    for part in s.split(',').filter(|p| !p.trim().is_empty()) {
        let (a, n) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}`: write axis=size, e.g. dp=4"))?;
        let n: i64 = n
            .trim()
            .parse()
            .map_err(|_| format!("`{part}`: the size must be a positive integer"))?;
        if n < 1 {
            return Err(format!("`{part}`: the size must be at least 1"));
        }
        v.push((a.trim().to_string(), n));
    }
    Ok(MeshArg(v))
}

/// Compile for a command that needs a clean program: checks `--mesh` names and
/// reports errors (exit 1) or unreadable files (exit 2).
fn compile_clean(
    file: &std::path::Path,
    mesh: Vec<(String, i64)>,
    data: Option<PathBuf>,
    speak: bool,
) -> Result<Compilation, ExitCode> {
    // Every process of a multi-process run compiles the same file; one reports.
    macro_rules! eprintln {
        ($($t:tt)*) => {{
            if speak {
                std::eprintln!($($t)*);
            }
        }};
    }
    macro_rules! eprint {
        ($($t:tt)*) => {{
            if speak {
                std::eprint!($($t)*);
            }
        }};
    }
    let opts = Options {
        mesh: mesh.clone(),
        data,
        ..Options::default()
    };
    let c = world::compile(file, &opts).map_err(|e| {
        eprintln!("error: cannot read `{}`: {e}", file.display());
        ExitCode::from(2)
    })?;
    for (axis, _) in &mesh {
        if !c.program.meshes.iter().any(|m| m.axis(axis).is_some()) {
            eprintln!(
                "error: --mesh names axis `{axis}`, which no mesh in `{}` has",
                file.display()
            );
            return Err(ExitCode::from(2));
        }
    }
    if c.has_errors() {
        let style = if std::io::stderr().is_terminal() {
            Style::Color
        } else {
            Style::Plain
        };
        for d in c.diagnostics.iter().filter(|d| d.is_error()) {
            eprint!("{}", render::human(d, &c.sources, style));
        }
        eprintln!("{}", c.summary(&file.display().to_string()));
        return Err(ExitCode::from(1));
    }
    Ok(c)
}

fn plan(file: &std::path::Path, mesh: Vec<(String, i64)>, json: bool) -> ExitCode {
    let c = match compile_clean(file, mesh, None, true) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if c.plans.is_empty() {
        eprintln!(
            "error: `{}` has no `train` declaration to plan",
            file.display()
        );
        return ExitCode::from(2);
    }
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&c.plans).unwrap_or_default()
        );
    } else {
        for p in &c.plans {
            outln!("{}", crate::plan::render(p, &c.sources));
        }
    }
    ExitCode::SUCCESS
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    file: PathBuf,
    /// Override mesh axis sizes, e.g. `--mesh dp=2,mp=4` (the checker re-validates).
    #[arg(long, value_parser = parse_mesh)]
    mesh: Option<MeshArg>,
    /// Steps to train (default: the file's `steps`).
    #[arg(long)]
    steps: Option<usize>,
    /// Random seed for initialisation, data and dropout (default: the file's `seed`).
    #[arg(long)]
    seed: Option<u64>,
    /// Which model to train when the file has several `train` declarations.
    #[arg(long)]
    model: Option<String>,
    /// Write the per-step training losses as JSON `{"losses": [...]}`.
    #[arg(long)]
    dump_losses: Option<PathBuf>,
    /// Compute in f64 (for checking numerics).
    #[arg(long)]
    f64: bool,
    /// Print the per-device memory measured on device 0, next to the plan's figures.
    #[arg(long)]
    mem: bool,
    /// Run directory for metrics.jsonl and loss.svg (default: runs/MODEL).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print only errors and the final summary.
    #[arg(long)]
    quiet: bool,
    /// Print one JSON record per step on stdout instead of progress.
    #[arg(long)]
    json: bool,
    /// Continue from the newest checkpoint in the `checkpoint` directory (also
    /// onto a different `--mesh`: checkpoints hold global arrays).
    #[arg(long)]
    resume: bool,
    /// Write the initial global parameters (dotted layer paths) to a safetensors
    /// file, then train as usual.
    #[arg(long)]
    dump_init: Option<PathBuf>,
    /// Start from the parameters in this safetensors file (same names and shapes).
    #[arg(long)]
    init: Option<PathBuf>,
    /// Train on the arrays in this file instead of the `data:` source: `x` and
    /// `y` shaped [steps, batch, ...] or [batch, ...] (.safetensors, .npz, or a
    /// directory of .npy files).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Where the devices run: `virtual` (threads of this process) or `mpi` (one
    /// device per process: `mpirun -np N shardc run FILE --backend mpi`; needs a
    /// shardc built with `--features mpi`).
    #[arg(long, value_enum, default_value_t = Backend::Virtual)]
    backend: Backend,
    /// Live reload: on every save of the file (or its imports), recompile, and
    /// apply an edit that keeps the parameters (the forward, optimizer settings,
    /// clipping) from the next step on, keeping the parameters and optimizer state.
    #[arg(long)]
    watch: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Every device on a thread of this process.
    Virtual,
    /// One device per MPI process, on one machine or several.
    Mpi,
}

/// The processes a run is spread over, as the command line sees them.
enum Procs {
    /// This process runs every device.
    Here,
    #[cfg(feature = "mpi")]
    Mpi(crate::runtime::mpi::Mpi),
}

impl Procs {
    fn start(backend: Backend) -> Result<Procs, String> {
        match backend {
            Backend::Virtual => Ok(Procs::Here),
            #[cfg(feature = "mpi")]
            Backend::Mpi => {
                // Before MPI starts any thread: the launcher says how many of
                // the run's processes share this machine.
                let local = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"]
                    .iter()
                    .find_map(|v| std::env::var(v).ok()?.parse::<usize>().ok())
                    .unwrap_or(1);
                crate::runtime::mesh::share_cores(local);
                crate::runtime::mpi::Mpi::init().map(Procs::Mpi)
            }
            #[cfg(not(feature = "mpi"))]
            Backend::Mpi => Err("this shardc was built without MPI; build it with `cargo build --release --features mpi` (needs Open MPI and libclang: `apt-get install libopenmpi-dev openmpi-bin libclang-dev`)".into()),
        }
    }
    /// This process's index and the number of processes.
    fn process(&self) -> (usize, usize) {
        match self {
            Procs::Here => (0, 1),
            #[cfg(feature = "mpi")]
            Procs::Mpi(m) => (m.rank(), m.size()),
        }
    }
    /// Processes on this machine (they share its memory).
    fn on_this_machine(&self) -> usize {
        match self {
            Procs::Here => 1,
            #[cfg(feature = "mpi")]
            Procs::Mpi(m) => m.local_size(),
        }
    }
    fn cluster(&self) -> &dyn crate::runtime::mesh::Cluster {
        match self {
            Procs::Here => &crate::runtime::mesh::InProcess,
            #[cfg(feature = "mpi")]
            Procs::Mpi(m) => m,
        }
    }
    /// The run failed on this process in a way the others may not have seen:
    /// stop them (they may be waiting for this one in a collective).
    fn fail(&self) {
        #[cfg(feature = "mpi")]
        if let Procs::Mpi(m) = self {
            m.abort();
        }
    }
}

fn run(args: RunArgs) -> ExitCode {
    let RunArgs {
        file,
        mesh,
        steps,
        seed,
        model,
        dump_losses: dump,
        f64,
        mem,
        out: out_dir,
        quiet,
        json,
        resume,
        dump_init,
        init,
        data,
        backend,
        watch,
    } = args;
    if watch && backend == Backend::Mpi {
        eprintln!("error: --watch reloads edits into a run on the virtual mesh; it does not combine with --backend mpi");
        return ExitCode::from(2);
    }
    let data_opt = data.clone();
    let mesh_opt = mesh.as_ref().map(|m| m.0.clone()).unwrap_or_default();
    let procs = match Procs::start(backend) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (process, processes) = procs.process();
    // Every process compiles and trains; the first one speaks and writes files.
    let lead = process == 0;
    let (quiet, json, mem) = (quiet || !lead, json && lead, mem && lead);
    let file = file.as_path();
    use crate::runtime::train;
    let c = match compile_clean(file, mesh.map(|m| m.0).unwrap_or_default(), data, lead) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (prog, train, mut cfg, src) = match c.prepare(model.as_deref()) {
        Ok(x) => x,
        Err(e) => {
            if lead {
                eprintln!("error: {e}");
            }
            return ExitCode::from(2);
        }
    };
    let devices: i64 = prog.mesh.iter().map(|m| m.1).product();
    if backend == Backend::Virtual {
        // (Under MPI this was done before MPI started its threads.)
        crate::runtime::mesh::share_cores(devices as usize);
    }
    if processes > 1 && devices as usize != processes {
        if lead {
            eprintln!(
                "error: the mesh of `{}` has {devices} devices, but MPI started {processes} processes; start one process per device (`mpirun -np {devices} ...`)",
                prog.model
            );
        }
        return ExitCode::from(2);
    }
    // The command line's overrides, for the file's config and every reloaded one.
    let adjust = |cfg: &mut train::Config| {
        if let Some(s) = steps {
            cfg.steps = s;
        }
        if let Some(s) = seed {
            cfg.seed = s;
        }
        if f64 {
            cfg.dtype = candle_core::DType::F64;
        }
    };
    adjust(&mut cfg);
    let mesh_txt: Vec<String> = prog.mesh.iter().map(|(a, n)| format!("{a}={n}")).collect();
    // Virtual devices share this machine's memory: refuse a run that cannot fit.
    let plan = c.plans.iter().find(|p| p.model == prog.model);
    if let (Some(p), Some(avail)) = (plan, available_memory()) {
        // The devices on this machine: all of them, or one per local process.
        let here = if processes > 1 {
            procs.on_this_machine()
        } else {
            devices as usize
        };
        let scale = if f64 { 2.0 } else { 1.0 };
        let need = p.total_memory() * here as f64 * scale;
        if need > avail {
            if !lead {
                // Machines differ: this one may be the only one short of memory.
                eprintln!(
                    "error: MPI process {process} needs about {} on its machine ({here} device(s) × {} each), but only {} is available; nothing was allocated",
                    crate::plan::human_bytes(need),
                    crate::plan::human_bytes(need / here as f64),
                    crate::plan::human_bytes(avail)
                );
                return ExitCode::from(1);
            }
            out!("{}", crate::plan::render(p, &c.sources));
            eprintln!(
                "error: this run needs about {} on this machine ({} devices × {} each), but only {} is available; nothing was allocated",
                crate::plan::human_bytes(need),
                here,
                crate::plan::human_bytes(need / devices as f64),
                crate::plan::human_bytes(avail)
            );
            return ExitCode::from(1);
        }
        // The plan counts what stays live; a step also holds short-lived
        // temporaries (backward products, the gradient all-reduce). Measured on
        // the full GPT-J, the process peaked about TRANSIENT above the plan.
        if need * TRANSIENT > avail && !quiet {
            eprintln!(
                "warning: this run needs about {} ({} per device), and a step's temporaries can add about {:.0}%; only {} is available, so it may run out of memory",
                crate::plan::human_bytes(need),
                crate::plan::human_bytes(need / here as f64),
                (TRANSIENT - 1.0) * 100.0,
                crate::plan::human_bytes(avail)
            );
        }
    }
    if let Some(path) = dump_init.as_ref().filter(|_| lead) {
        match crate::runtime::checkpoint::dump_init(prog, cfg.seed, path) {
            Ok(n) => {
                if !quiet {
                    eprintln!("wrote {n} initial parameters to `{}`", path.display())
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(path) = &init {
        match crate::runtime::checkpoint::load_init(prog, path) {
            Ok(m) => cfg.init = m,
            Err(e) => {
                eprintln!("error: --init: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if resume {
        match crate::runtime::checkpoint::resume(prog, &mut cfg) {
            Ok(msg) => {
                if lead {
                    eprintln!("{msg}")
                }
            }
            Err(e) => {
                eprintln!("error: cannot resume: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if !quiet {
        let over = if processes > 1 {
            format!(", {processes} MPI processes")
        } else {
            String::new()
        };
        eprintln!(
            "training {} on {} ({}{over}) for {} steps, batch {}, {} {}",
            prog.model,
            train.mesh,
            mesh_txt.join(", "),
            cfg.steps,
            cfg.batch,
            cfg.optimizer.name(),
            if f64 { "f64" } else { "f32" }
        );
        // A mesh declared for other hardware runs here as a simulation: say so.
        match (train.mesh_kind.as_str(), backend) {
            ("cuda", _) => eprintln!(
                "note: `{}` is declared `kind: cuda`; this shardc has no CUDA backend, so its devices are simulated on the CPU",
                train.mesh
            ),
            ("mpi", Backend::Virtual) => eprintln!(
                "note: `{}` is declared `kind: mpi`; this run simulates its devices in one process (`mpirun -np {devices} shardc run ... --backend mpi` spreads them over processes)",
                train.mesh
            ),
            _ => {}
        }
    }
    let dir = out_dir.unwrap_or_else(|| PathBuf::from("runs").join(&prog.model));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!(
            "error: cannot create the run directory `{}`: {e}",
            dir.display()
        );
        return ExitCode::from(2);
    }
    let bar = (!quiet && !json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(cfg.steps as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:30} {pos}/{len} steps  {msg}  [{elapsed} < {eta}]",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    // `log_every: N` thins the plain per-step lines (metrics.jsonl keeps every step).
    let log_every = train.log_every.max(1);
    let start = std::time::Instant::now();
    let mut last = start;
    let mut records: Vec<crate::runtime::report::Record> = Vec::new();
    let reloads = crate::runtime::reload::Reloads::default();
    let compiled: std::sync::Mutex<Vec<crate::source::SourceMap>> = Default::default();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let say = |m: &str| match &bar {
        Some(b) => b.suspend(|| eprintln!("{m}")),
        None => eprintln!("{m}"),
    };
    let watch_opts = Options {
        mesh: mesh_opt,
        data: data_opt,
        ..Options::default()
    };
    let style = if std::io::stderr().is_terminal() {
        Style::Color
    } else {
        Style::Plain
    };
    let res = std::thread::scope(|scope| {
        if watch {
            let live = crate::watch::Live {
                file,
                opts: &watch_opts,
                model: model.as_deref(),
                adjust: &adjust,
                reloads: &reloads,
                compiled: &compiled,
                say: &say,
                stop: &stop,
                style,
            };
            let (read, cfg) = (&c.read, &cfg);
            scope.spawn(move || crate::watch::feed_reloads(live, read, prog, cfg));
            if !quiet {
                say(&format!("watching {} file(s): a saved edit that keeps the parameters applies from the next step", c.read.len()));
            }
        }
        let res = train::run_on(
            procs.cluster(),
            prog,
            &cfg,
            &src,
            false,
            watch.then_some(&reloads),
            &mut |r| {
                let now = std::time::Instant::now();
                let secs = (now - last).as_secs_f64();
                last = now;
                let rec = crate::runtime::report::Record {
                    step: r.step + 1,
                    loss: r.loss,
                    lr: r.lr,
                    grad_norm: r.grad_norm,
                    step_ms: secs * 1e3,
                    examples_per_s: cfg.batch as f64 / secs.max(1e-9),
                    eval_loss: r.eval_loss,
                    events: r.notes.clone(),
                };
                // Limits and FDO changes are worth a line even when steps are thinned.
                if !quiet && !json {
                    for n in &rec.events {
                        match &bar {
                            Some(b) => b.println(format!("step {}: {n}", rec.step)),
                            None => eprintln!("step {:>5}: {n}", rec.step),
                        }
                    }
                }
                if json {
                    outln!("{}", serde_json::to_string(&rec).unwrap_or_default());
                } else if let Some(b) = &bar {
                    b.set_position(rec.step as u64);
                    b.set_message(format!(
                        "loss {:.4}  {:.0} examples/s",
                        rec.loss, rec.examples_per_s
                    ));
                } else if !quiet
                    && (rec.step == 1
                        || rec.step == cfg.steps
                        || rec.step.is_multiple_of(log_every)
                        || rec.eval_loss.is_some())
                {
                    let eval = rec
                        .eval_loss
                        .map_or(String::new(), |e| format!("  eval {e:.6}"));
                    eprintln!(
                "step {:>5}/{}  loss {:.6}{eval}  lr {:.3e}  |g| {:.4}  {:.0} ms  {:.0} examples/s",
                rec.step,
                cfg.steps,
                rec.loss,
                rec.lr,
                rec.grad_norm,
                rec.step_ms,
                rec.examples_per_s
            );
                }
                records.push(rec);
            },
        );
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        res
    });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    if !lead {
        // The first process reports; the others only say why they stopped.
        return match res {
            Ok(_) => ExitCode::SUCCESS,
            Err(e) if e.step.is_some() => ExitCode::from(1),
            Err(e) => {
                eprintln!("error: the run stopped on MPI process {process}: {e}");
                procs.fail();
                ExitCode::from(1)
            }
        };
    }
    let wrote = crate::runtime::report::write_metrics(&dir, &records)
        .map_err(|e| e.to_string())
        .and_then(|_| {
            crate::runtime::report::write_loss_curve(
                &dir,
                &format!("{} on {}", prog.model, mesh_txt.join(", ")),
                &records,
            )
        });
    if let Err(e) = &wrote {
        eprintln!(
            "warning: could not write the run's metrics to `{}`: {e}",
            dir.display()
        );
    }
    match res {
        Ok(out) => {
            if let Some(path) = dump {
                let json = serde_json::json!({ "losses": out.losses });
                if let Err(e) = std::fs::write(&path, json.to_string()) {
                    eprintln!("error: cannot write `{}`: {e}", path.display());
                    return ExitCode::from(2);
                }
            }
            if let (true, Some(m)) = (mem, &out.memory) {
                let planned = plan.cloned().unwrap_or_default();
                let row = |name: &str, got: f64, want: f64| {
                    format!(
                        "  {name:<16} {:>12} {:>12}\n",
                        crate::plan::human_bytes(got),
                        crate::plan::human_bytes(want)
                    )
                };
                let mut t = format!(
                    "memory on device 0 (measured vs planned)\n  {:<16} {:>12} {:>12}\n",
                    "", "measured", "planned"
                );
                t += &row("params", m.params, planned.params);
                t += &row("grads", m.grads, planned.grads);
                t += &row(
                    "optimizer state",
                    m.optimizer_state,
                    planned.optimizer_state,
                );
                t += &row(
                    "gathered params",
                    m.gathered_params,
                    planned.gathered_params,
                );
                t += &row("activations", m.activations, planned.activations);
                t += &row("total", m.total(), planned.total_memory());
                out!("{t}");
            }
            let first = out.losses.first().copied().unwrap_or(f64::NAN);
            let lastl = out.losses.last().copied().unwrap_or(f64::NAN);
            let secs = start.elapsed().as_secs_f64();
            let written = if wrote.is_ok() {
                format!("; wrote {}/{{metrics.jsonl, loss.svg}}", dir.display())
            } else {
                String::new()
            };
            eprintln!("done: {} steps in {secs:.1} s ({:.0} examples/s), loss {first:.4} → {lastl:.4}{written}", out.losses.len(), out.losses.len() as f64 * cfg.batch as f64 / secs.max(1e-9));
            ExitCode::SUCCESS
        }
        Err(e) => {
            // Point at the source of the op a runtime error names, in the
            // program in force then (the file's, or a reload's).
            let kept = compiled.lock().ok();
            let at = e.node.and_then(|(i, generation)| {
                let n = match generation {
                    0 => prog.nodes.get(i)?.clone(),
                    g => reloads.get(g)?.prog.nodes.get(i)?.clone(),
                };
                let sources = match generation {
                    0 => &c.sources,
                    g => kept.as_ref()?.get(g - 1)?,
                };
                Some((sources.describe(n.span), n.ty.to_string()))
            });
            // Or at the table a SparseCore limit belongs to.
            let table = e
                .table
                .as_ref()
                .and_then(|n| c.program.tables.iter().find(|t| &t.name.name == n));
            match (at, table) {
                (Some((place, ty)), _) => {
                    eprintln!("error: the run stopped: {e}\n  --> {place} (a value of type {ty})")
                }
                (None, Some(t)) => eprintln!(
                    "error: the run stopped: {e}\n  --> {} (the table)",
                    c.sources.describe(t.name.span)
                ),
                (None, None) => eprintln!("error: the run stopped: {e}"),
            }
            if e.step.is_none() {
                procs.fail();
            }
            ExitCode::from(1)
        }
    }
}

/// Peak resident memory over planned memory, measured on the full-size GPT-J
/// (`models/gptj.shard`, 8 devices): what the refusal check warns within.
const TRANSIENT: f64 = 1.3;

/// Bytes this machine can still give (Linux `MemAvailable`), if known.
fn available_memory() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}

fn show(
    file: &std::path::Path,
    names: &[String],
    mesh: Vec<(String, i64)>,
    model: Option<&str>,
) -> ExitCode {
    let c = match compile_clean(file, mesh, None, true) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let prog = match c.settings(model) {
        Ok((p, ..)) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let text = crate::layout::show(prog, names);
    if text.is_empty() {
        let known: Vec<&str> = prog.params.iter().map(|p| p.name.as_str()).collect();
        eprintln!(
            "error: `{}` has no parameter named {}; it has {}",
            prog.model,
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(" or "),
            known.join(", ")
        );
        return ExitCode::from(2);
    }
    let mesh: Vec<String> = prog.mesh.iter().map(|(a, n)| format!("{a}={n}")).collect();
    outln!("{} on {}\n", prog.model, mesh.join(", "));
    out!("{text}");
    ExitCode::SUCCESS
}

fn lower(file: &std::path::Path, mesh: Vec<(String, i64)>) -> ExitCode {
    let c = match compile_clean(file, mesh, None, true) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut ok = true;
    for p in &c.programs {
        out!("{}", p.render(&c.sources));
        let errs = p.verify();
        if errs.is_empty() {
            outln!(
                "verified: {} ops, {} collectives per step (same sequence on every device)\n",
                p.nodes.len(),
                p.collectives().len()
            );
        } else {
            ok = false;
            for e in errs {
                outln!("verify error: {e}");
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn explain(code: Option<&str>) -> ExitCode {
    let Some(code) = code else {
        for c in Code::ALL {
            outln!("{}  {}", c.as_str(), c.title());
        }
        return ExitCode::SUCCESS;
    };
    match Code::parse(code) {
        Some(c) => {
            out!("{}", c.explanation());
            ExitCode::SUCCESS
        }
        None => {
            eprintln!("error: unknown diagnostic code `{code}`; `shardc explain` lists them all");
            ExitCode::from(2)
        }
    }
}
