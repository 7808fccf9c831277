//! Command-line interface (clap). Exit codes: 0 clean, 1 diagnostics with errors,
//! 2 usage or I/O error.

use crate::diag::render::{self, Style};
use crate::diag::{Code, Severity};
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
    /// Let a model file read (imports, data) or write (absolute checkpoint and
    /// FDO directories) under DIR, outside its own directory and the run
    /// directory. Repeatable.
    #[arg(long = "allow-path", value_name = "DIR", global = true)]
    pub allow_path: Vec<PathBuf>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Human,
    Json,
    /// One line per diagnostic on stdout, `file:line:col: severity[CODE]:
    /// message`: for Vim's `:make`, Emacs's compilation mode and CI.
    Short,
}

/// `shardc lsp`'s arguments: what editors' clients append
/// (vscode-languageclient adds `--stdio` and `--clientProcessId=PID`) and the
/// documented extra arguments (`shard.server.extraArgs`).
#[derive(clap::Args, Debug)]
pub struct LspArgs {
    /// Serve on stdin and stdout (the only transport; accepted because clients
    /// pass it).
    #[arg(long)]
    pub stdio: bool,
    /// The client's process id (accepted for clients that pass it; the
    /// server ends when its input does).
    #[arg(long = "clientProcessId", value_name = "PID")]
    pub client_process_id: Option<u32>,
    /// Every collective must be written explicitly (like `pragma strict`).
    #[arg(long)]
    pub strict: bool,
    /// Buffers longer than this are not analysed; a warning at the top of
    /// the buffer says so (a client's `maxDocumentBytes` initialization
    /// option overrides it).
    #[arg(long, value_name = "BYTES", default_value_t = crate::lsp::DEFAULT_MAX_DOCUMENT)]
    pub max_document_bytes: usize,
}

#[derive(Subcommand, Debug)]
pub enum FdoAction {
    /// Print the statistics in a directory of `fdo_stats_*.npz` files (each
    /// process's newest, shardc's or the library's), per file, step rows and
    /// device, and the limits they set together, as `shardc run` loads them.
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
        /// Check this weight map (TOML, e.g. `models/maps/llama_hf.toml`)
        /// against every trained model: each parameter named by exactly one
        /// rule, each layout fitting its parameter.
        #[arg(long)]
        map: Option<PathBuf>,
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
        /// Compare with a device: h100-80g, a100-80g, a100-40g, tpu-v5p,
        /// tpu-v5e, or a memory size like `24GiB`. Says whether each
        /// pipeline stage's peak fits (exit 1 when one does not) and
        /// estimates the step time and MFU.
        #[arg(long, value_parser = crate::plan::device::parse)]
        device: Option<crate::plan::device::Device>,
        /// Only this model's plan, when the file has several `train` declarations.
        #[arg(long)]
        model: Option<String>,
        /// Time the pipeline's passes with the node times a run measured
        /// (`shardc run --profile` writes `profile.json` in its run
        /// directory) instead of their FLOPs: each rank's idle share and
        /// the bubble, for the file's schedule and (with --device) the others.
        #[arg(long, value_name = "PROFILE_JSON")]
        profile: Option<PathBuf>,
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
    /// Write a run's parameters as another library's checkpoint (through a
    /// weight map: `model.safetensors` for Hugging Face's `from_pretrained`).
    Export(weights::ExportArgs),
    /// Language server on stdio (diagnostics on every edit, types on hover).
    Lsp(LspArgs),
    /// Feedback-directed optimization files of embedding tables.
    Fdo {
        #[command(subcommand)]
        action: FdoAction,
    },
    /// Choose a layout: write mesh axes, `shard_params` and checkpointing into
    /// the file, each decision with its reason (its cost from the plan, the
    /// runner-up and what it lost by). What the file already says is kept.
    Shard(shard::ShardArgs),
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
    main_from(std::env::args_os())
}

/// The command line `argv` (its first word the program's name): what the
/// Python package's `shardc` script runs.
pub fn main_from<I, T>(argv: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = match Cli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let grants = cli.allow_path;
    match cli.command {
        Command::Check {
            files,
            types,
            format,
            strict,
            no_color,
            data,
            map,
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
                    map,
                    grants,
                    ..Options::default()
                },
                style,
            )
        }
        Command::Watch { file, strict } => crate::watch::run(
            &file,
            &Options {
                strict,
                grants,
                ..Options::default()
            },
        ),
        Command::Explain { code } => explain(code.as_deref()),
        Command::Fmt { files, check } => fmt(&files, check),
        Command::Lsp(args) => lsp(&args),
        Command::Fdo {
            action: FdoAction::Show { dir },
        } => match crate::embed::load(&dir) {
            Ok(l) => {
                for w in &l.warnings {
                    eprintln!("warning: {w}");
                }
                out!("{}", crate::embed::render(&l));
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        },
        Command::Run(args) => run::run(args, grants),
        Command::Export(args) => weights::export(&args, &grants),
        Command::Show {
            file,
            names,
            mesh,
            model,
        } => show(
            &grants,
            &file,
            &names,
            mesh.map(|m| m.0).unwrap_or_default(),
            model.as_deref(),
        ),
        Command::Shard(args) => shard::shard(&grants, &args),
        Command::Lower { file, mesh } => {
            lower(&grants, &file, mesh.map(|m| m.0).unwrap_or_default())
        }
        Command::Plan {
            file,
            mesh,
            json,
            device,
            model,
            profile,
        } => plan(
            &grants,
            &file,
            mesh.map(|m| m.0).unwrap_or_default(),
            json,
            (device, profile.as_deref()),
            model.as_deref(),
        ),
    }
}

/// `shardc lsp`: every file is checked with the command line's options
/// (`--strict`, like `pragma strict` in each file).
fn lsp(args: &LspArgs) -> ExitCode {
    crate::lsp::run_with(
        crate::world::Options {
            strict: args.strict,
            ..Default::default()
        },
        args.max_document_bytes,
    )
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
            Format::Short => {
                for d in &c.diagnostics {
                    out!("{}", render::short(d, &c.sources));
                }
                if types {
                    out!("{}", types_table(&c));
                }
                eprintln!("{}", c.summary(&f.display().to_string()));
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
        let rows: Vec<_> = c
            .checked
            .types
            .iter()
            .filter(|t| t.scope == s)
            .map(|t| (t, t.ty()))
            .collect();
        let nw = rows.iter().map(|(t, _)| t.name.len()).max().unwrap_or(0);
        let tw = rows
            .iter()
            .map(|(_, ty)| ty.chars().count())
            .max()
            .unwrap_or(0);
        for (t, ty) in rows {
            let f = c.sources.get(t.span.file);
            let (line, _) = f.line_col(t.span.start as usize);
            let at = if t.span.file == c.program.root {
                format!(":{line}")
            } else {
                format!("{}:{line}", f.name)
            };
            // Padding by hand: a format width is limited to 65,535.
            let pad = tw.saturating_sub(ty.chars().count());
            let name_pad = nw.saturating_sub(t.name.len());
            out.push_str(&format!(
                "  {:<6} {}{}  {}{}   per device {}",
                t.kind,
                t.name,
                " ".repeat(name_pad),
                ty,
                " ".repeat(pad),
                t.local()
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
pub struct MeshArg(pub Vec<(String, i64)>);

pub fn parse_mesh(s: &str) -> Result<MeshArg, String> {
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

/// What `plan`, `show` and `lower` compile with: the file's grants and `--mesh`.
fn opts_for(grants: &[PathBuf], mesh: Vec<(String, i64)>) -> Options {
    Options {
        mesh,
        grants: grants.to_vec(),
        ..Options::default()
    }
}

/// Compile for a command that needs a clean program: checks `--mesh` names and
/// reports errors (exit 1) or unreadable files (exit 2).
fn compile_clean(
    file: &std::path::Path,
    opts: &Options,
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
    let c = world::compile(file, opts).map_err(|e| {
        eprintln!("error: cannot read `{}`: {e}", file.display());
        ExitCode::from(2)
    })?;
    for (axis, _) in &opts.mesh {
        if !c.program.meshes.iter().any(|m| m.axis(axis).is_some()) {
            eprintln!(
                "error: --mesh names axis `{axis}`, which no mesh in `{}` has",
                file.display()
            );
            return Err(ExitCode::from(2));
        }
    }
    let style = if std::io::stderr().is_terminal() {
        Style::Color
    } else {
        Style::Plain
    };
    if c.has_errors() {
        for d in c.diagnostics.iter().filter(|d| d.is_error()) {
            eprint!("{}", render::human(d, &c.sources, style));
        }
        eprintln!("{}", c.summary(&file.display().to_string()));
        return Err(ExitCode::from(1));
    }
    // Warnings are said before the command goes on (notes, such as each
    // inserted reshard, are `check`'s to list).
    for d in c
        .diagnostics
        .iter()
        .filter(|d| d.severity == Severity::Warning)
    {
        eprint!("{}", render::human(d, &c.sources, style));
    }
    Ok(c)
}

mod data;
mod run;
mod shard;
mod weights;
pub use run::{run_with, Backend, Hooks, Outcome, RunArgs, StepHook};

/// `shardc run`'s arguments from words as the command line takes them (after
/// `run`), and the paths `--allow-path` grants: how the Python package
/// states a run.
pub fn run_args<I, T>(words: I) -> Result<(RunArgs, Vec<PathBuf>), clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let argv = ["shardc".into(), "run".into()]
        .into_iter()
        .chain(words.into_iter().map(Into::into));
    let cli = Cli::try_parse_from(argv)?;
    match cli.command {
        Command::Run(args) => Ok((args, cli.allow_path)),
        _ => Err(clap::Error::new(clap::error::ErrorKind::InvalidSubcommand)),
    }
}

fn plan(
    grants: &[PathBuf],
    file: &std::path::Path,
    mesh: Vec<(String, i64)>,
    json: bool,
    (device, profile): (
        Option<crate::plan::device::Device>,
        Option<&std::path::Path>,
    ),
    model: Option<&str>,
) -> ExitCode {
    let c = match compile_clean(file, &opts_for(grants, mesh), true) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let profile = match profile.map(|p| crate::plan::measured::load(p).map(|m| (m, p))) {
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        Some(Ok(m)) => Some(m),
        None => None,
    };
    let timed = profile.as_ref().map(|(m, p)| (m, *p));
    let plans = match plans_of(&c, file, model, device, timed) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let (Some((_, path)), true) = (&profile, plans.iter().all(|p| p.pipeline.is_none())) {
        eprintln!(
            "warning: `{}` was not used: `--profile` times a pipeline's passes, and no plan here has a pipeline",
            path.display()
        );
    }
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(&plans).unwrap_or_default()
        );
    } else {
        for p in &plans {
            outln!("{}", crate::plan::render(p, &c.sources));
        }
    }
    // A plan that does not fit its device fails, for scripts and CI.
    if plans
        .iter()
        .any(|p| p.device.as_ref().is_some_and(|v| !v.fits))
    {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// The plans `shardc plan` shows: of `model` (else every trained model),
/// each compared with `device` or with this machine's process.
pub fn plans_of(
    c: &Compilation,
    file: &std::path::Path,
    model: Option<&str>,
    device: Option<crate::plan::device::Device>,
    profile: Option<(&crate::plan::measured::Profile, &std::path::Path)>,
) -> Result<Vec<crate::plan::Plan>, String> {
    if c.plans.is_empty() {
        return Err(format!(
            "`{}` has no `train` declaration to plan",
            file.display()
        ));
    }
    let mut plans = c.plans.clone();
    if let Some(m) = model {
        plans.retain(|p| p.model == m);
        if plans.is_empty() {
            let names: Vec<&str> = c.plans.iter().map(|p| p.model.as_str()).collect();
            let hint = crate::diag::did_you_mean(m, names.iter().copied())
                .map_or(String::new(), |s| format!(" (did you mean `{s}`?)"));
            return Err(format!(
                "`{}` trains no model `{m}`{hint}; it trains {}",
                file.display(),
                names
                    .iter()
                    .map(|n| format!("`{n}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if let Some((m, path)) = profile {
        if !plans.iter().any(|p| p.model == m.model) {
            return Err(crate::plan::measured::ProfileError::Model {
                path: path.into(),
                model: m.model.clone(),
            }
            .to_string());
        }
    }
    // A profile times its own model's plans (and the other schedules').
    let retime =
        |p: &mut crate::plan::Plan,
         on: (&crate::spmd::Program, Option<&crate::schedule::Source>)| match profile {
            Some((m, path)) if m.model == p.model => {
                crate::plan::measured::retime(p, on, m, path).map_err(|e| e.to_string())
            }
            _ => Ok(()),
        };
    for p in &mut plans {
        let prog = c.programs.iter().find(|q| q.model == p.model);
        if let Some(prog) = prog {
            retime(p, (prog, None))?;
        }
        match &device {
            Some(d) => {
                let mut v = crate::plan::device::verdict(p, d.clone());
                let train = c.spec.train(Some(&p.model));
                let pipeline = prog.and_then(|q| q.pipeline.as_ref());
                if let (Some(prog), Some(train), Some(pp)) = (prog, train, pipeline) {
                    let mut others =
                        crate::plan::schedules::alternatives(prog, train, &c.spec, &c.sources);
                    for (source, o) in &mut others {
                        retime(o, (prog, Some(&*source)))?;
                    }
                    v.schedules = crate::plan::schedules::compare((&pp.schedule, &*p), &others, d);
                }
                p.device = Some(v);
            }
            // The process on this machine runs this binary.
            None => p.shardc_code = crate::plan::host::shardc_code(),
        }
    }
    Ok(plans)
}

fn show(
    grants: &[PathBuf],
    file: &std::path::Path,
    names: &[String],
    mesh: Vec<(String, i64)>,
    model: Option<&str>,
) -> ExitCode {
    let c = match compile_clean(file, &opts_for(grants, mesh), true) {
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
        let inputs: Vec<&str> = prog.input_names.iter().map(String::as_str).collect();
        let hint = names
            .first()
            .and_then(|n| crate::diag::did_you_mean(n, known.iter().chain(&inputs).copied()))
            .map_or(String::new(), |s| format!(" (did you mean `{s}`?)"));
        eprintln!(
            "error: `{}` has no parameter or input named {}{hint}; its inputs are {} (or `input`, `output`), its parameters {}",
            prog.model,
            names
                .iter()
                .map(|n| format!("`{n}`"))
                .collect::<Vec<_>>()
                .join(" or "),
            inputs.join(", "),
            known.join(", ")
        );
        return ExitCode::from(2);
    }
    let mesh: Vec<String> = prog.mesh.iter().map(|(a, n)| format!("{a}={n}")).collect();
    outln!("{} on {}\n", prog.model, mesh.join(", "));
    out!("{text}");
    ExitCode::SUCCESS
}

fn lower(grants: &[PathBuf], file: &std::path::Path, mesh: Vec<(String, i64)>) -> ExitCode {
    let c = match compile_clean(file, &opts_for(grants, mesh), true) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let mut ok = true;
    for p in &c.programs {
        out!("{}", p.render(&c.sources));
        let mut syncs = String::new();
        if let Some(t) = c.spec.train(Some(&p.model)) {
            let step = crate::step::Step::of_train(p, t, &c.spec);
            out!("{}", step.render(p, &c.sources));
            let n = step
                .params
                .iter()
                .filter(|s| !s.frozen() && !s.reduce.is_empty())
                .count();
            syncs = format!(" and {n} gradient all-reduce(s)");
        }
        let errs = p.verify();
        // The collectives a step runs, as `shardc plan` counts them (forward
        // and backward, every repeat and microbatch): one count of them.
        let calls = c.plans.iter().find(|pl| pl.model == p.model).map(|pl| {
            let mut kinds: Vec<(String, u64)> = Vec::new();
            for cm in &pl.comms {
                match kinds.iter_mut().find(|k| k.0 == cm.kind) {
                    Some(k) => k.1 += cm.count,
                    None => kinds.push((cm.kind.clone(), cm.count)),
                }
            }
            let total: u64 = kinds.iter().map(|k| k.1).sum();
            let each: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
            format!("{total} collective calls per step ({})", each.join(", "))
        });
        if errs.is_empty() {
            outln!(
                "verified: {} ops, {} (same sequence on every device)\n",
                p.nodes.len(),
                calls.unwrap_or_else(|| format!(
                    "{} collectives{syncs} per step",
                    p.collectives().len()
                ))
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
