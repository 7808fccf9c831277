//! `shardc run`: compile, check that the run fits this machine, train on the
//! virtual mesh or over MPI, and write the run directory (metrics, the loss
//! curve, checkpoints) — nothing outside it unless granted.

use super::*;

mod logs;
mod progress;
use logs::parse_log;
pub use logs::LogArg;
use progress::{progress_say, Progress};

thread_local! {
    /// The `error:` lines a run said, kept for a caller that raises them
    /// (the Python package) while [`Hooks`] are in force on this thread.
    static SAID: std::cell::RefCell<Option<Vec<String>>> = const { std::cell::RefCell::new(None) };
}

/// Say a line on stderr; an error line is also kept for [`Hooks::errors`].
fn say_line(line: String) {
    if line.starts_with("error") {
        SAID.with(|s| {
            if let Some(v) = s.borrow_mut().as_mut() {
                v.push(line.clone());
            }
        });
    }
    std::eprintln!("{line}");
}

// Every line this command says goes through `say_line`.
macro_rules! eprintln {
    ($($t:tt)*) => {{
        say_line(format!($($t)*));
    }};
}

/// A step hook: sees each step's record; `false` ends the run after that step.
pub type StepHook<'h> = dyn FnMut(&crate::runtime::report::Record) -> bool + 'h;

/// What a caller other than the command line (the Python package) adds to a
/// run: a hook on every step, and the run's results in memory.
#[derive(Default)]
pub struct Hooks<'h> {
    pub on_step: Option<&'h mut StepHook<'h>>,
    /// The run's results, when it trained.
    pub outcome: Option<Outcome>,
    /// The `error:` lines the run said, in order.
    pub errors: Vec<String>,
}

/// A finished run's results, in memory.
#[derive(Debug)]
pub struct Outcome {
    /// The run directory.
    pub dir: PathBuf,
    /// This run's losses, one per step it trained.
    pub losses: Vec<f64>,
    /// Every step's record (a resumed run's earlier ones first).
    pub records: Vec<crate::runtime::report::Record>,
    /// The parameters after the last step: name, shape, values.
    pub params: Vec<(String, Vec<usize>, Vec<f64>)>,
    /// Whether the parameters are f64 (else f32).
    pub f64: bool,
    /// The step the run ended before, when its hook stopped it early.
    pub stopped_at: Option<usize>,
}

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    file: PathBuf,
    /// Override mesh axis sizes, e.g. `--mesh dp=2,mp=4` (the checker re-validates).
    #[arg(long, value_parser = parse_mesh)]
    mesh: Option<MeshArg>,
    /// Steps to train (default: the file's `steps`; at most 10,000,000).
    #[arg(long, value_parser = parse_steps)]
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
    /// Time every op and each phase of the step between two device
    /// synchronisations, and print where a step's time goes (slows the run).
    #[arg(long)]
    profile: bool,
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
    /// onto a different `--mesh`: checkpoints hold global arrays). It is
    /// verified first (checksums, model, optimizer, dtype, seed, batch).
    #[arg(long)]
    resume: bool,
    /// With `--resume`: when the newest checkpoint fails verification, resume
    /// from the newest one that passes (the default refuses).
    #[arg(long, requires = "resume")]
    resume_fallback: bool,
    /// A fresh run into a checkpoint directory that holds another run's
    /// checkpoints deletes them (the default refuses).
    #[arg(long, conflicts_with = "resume")]
    overwrite: bool,
    /// Write the initial global parameters (dotted layer paths) to a safetensors
    /// file, then train as usual.
    #[arg(long)]
    dump_init: Option<PathBuf>,
    /// Start from the parameters in this checkpoint: a safetensors file, a
    /// sharded checkpoint's `model.safetensors.index.json`, or a directory
    /// holding either (a Hugging Face model directory). Names and shapes are
    /// the model's own, or a weight map's (`--map`).
    #[arg(long)]
    init: Option<PathBuf>,
    /// A weight map (TOML): the names and layouts of another library's
    /// checkpoints (`models/maps/`), for `--init` and `--dump-grads`.
    #[arg(long)]
    map: Option<PathBuf>,
    /// Write the first step's global gradients to a safetensors file (by the
    /// model's names, or the map's with `--map`), then train as usual.
    #[arg(long)]
    dump_grads: Option<PathBuf>,
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
    /// Where this process's devices compute: `cpu`, or `cuda[:N]` (every
    /// virtual device on that one GPU; needs a shardc built with `--features
    /// cuda`, see scripts/build-cuda.sh).
    #[arg(long, default_value = "cpu")]
    device: crate::runtime::device::DeviceArg,
    /// Where the per-step records go, instead of the file's `log:`: a
    /// comma-separated list of `jsonl` (metrics.jsonl, loss.svg) and
    /// `tensorboard` (an event file), or `none`.
    #[arg(long, value_parser = parse_log)]
    log: Option<LogArg>,
    /// Live reload: on every save of the file (or its imports), recompile, and
    /// apply an edit that keeps the parameters (the forward, optimizer settings,
    /// clipping) from the next step on, keeping the parameters and optimizer state.
    #[arg(long)]
    watch: bool,
}

fn parse_steps(s: &str) -> Result<usize, String> {
    let max = crate::spec::MAX_STEPS;
    match s.parse::<u64>() {
        Ok(n) if (1..=max as u64).contains(&n) => Ok(n as usize),
        _ => Err(format!("a number of steps from 1 to {max}")),
    }
}

/// The most devices the virtual mesh runs (a thread and a copy of the step's
/// state each); larger meshes check and plan, and run over MPI.
const MAX_VIRTUAL_DEVICES: i64 = 4096;

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

/// What the command line changes in the file's configuration (and in every
/// reloaded one): the run directory, steps, seed and `--f64`.
struct Overrides {
    dir: PathBuf,
    steps: Option<usize>,
    seed: Option<u64>,
    f64: bool,
    device: candle_core::Device,
    log: Option<Vec<crate::vocab::LogSink>>,
}

impl Overrides {
    fn apply(&self, cfg: &mut crate::runtime::train::Config) {
        cfg.place(&self.dir);
        if let Some(s) = self.steps {
            cfg.steps = s;
        }
        if let Some(s) = self.seed {
            cfg.seed = s;
        }
        if self.f64 {
            cfg.dtype = candle_core::DType::F64;
        }
        cfg.device = self.device.clone();
        if let Some(l) = &self.log {
            cfg.log = l.clone();
        }
    }
}

/// One `shardc run` after the file compiled: what every stage of the command
/// reads.
struct Ctx<'a> {
    args: &'a RunArgs,
    grants: &'a [PathBuf],
    c: &'a Compilation,
    prog: &'a crate::spmd::Program,
    train: &'a crate::spec::Train,
    procs: &'a Procs,
    /// This process's index and the number of processes; the first speaks
    /// and writes files.
    process: usize,
    processes: usize,
    lead: bool,
    /// What this process prints.
    quiet: bool,
    json: bool,
    mem: bool,
    devices: i64,
    over: Overrides,
}

pub(super) fn run(args: RunArgs, grants: Vec<PathBuf>) -> ExitCode {
    run_with(args, grants, &mut Hooks::default())
}

/// `shardc run` with a caller's [`Hooks`]: its step hook sees every step, and
/// the results and error lines come back in them.
pub fn run_with(args: RunArgs, grants: Vec<PathBuf>, hooks: &mut Hooks) -> ExitCode {
    SAID.with(|s| *s.borrow_mut() = Some(Vec::new()));
    let code = run_hooked(args, grants, hooks);
    hooks.errors = SAID.with(|s| s.borrow_mut().take()).unwrap_or_default();
    code
}

fn run_hooked(args: RunArgs, grants: Vec<PathBuf>, hooks: &mut Hooks) -> ExitCode {
    if args.watch && args.backend == Backend::Mpi {
        eprintln!("error: --watch reloads edits into a run on the virtual mesh; it does not combine with --backend mpi");
        return ExitCode::from(2);
    }
    let device = match args.device.open() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if args.profile {
        crate::runtime::profile::enable();
    }
    let procs = match Procs::start(args.backend) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (process, processes) = procs.process();
    // Every process compiles and trains; the first one speaks and writes files.
    let lead = process == 0;
    let opts = Options {
        mesh: args.mesh.as_ref().map(|m| m.0.clone()).unwrap_or_default(),
        data: args.data.clone(),
        grants: grants.clone(),
        f64: args.f64,
        map: args.map.clone(),
        ..Options::default()
    };
    let c = match compile_clean(&args.file, &opts, lead) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let (prog, train, mut cfg, src) = match c.prepare(args.model.as_deref()) {
        Ok(x) => x,
        Err(e) => {
            if lead {
                eprintln!("error: {e}");
            }
            return ExitCode::from(2);
        }
    };
    let cx = Ctx {
        args: &args,
        grants: &grants,
        c: &c,
        prog,
        train,
        procs: &procs,
        process,
        processes,
        lead,
        quiet: args.quiet || !lead,
        json: args.json && lead,
        mem: args.mem && lead,
        devices: prog
            .mesh
            .iter()
            .fold(1i64, |acc, m| acc.saturating_mul(m.1)),
        // Everything the run writes goes under its directory.
        over: Overrides {
            dir: args
                .out
                .clone()
                .unwrap_or_else(|| PathBuf::from("runs").join(&prog.model)),
            steps: args.steps,
            seed: args.seed,
            f64: args.f64,
            device,
            log: args.log.as_ref().map(|l| l.0.clone()),
        },
    };
    let ready = cx
        .check_devices()
        .and_then(|_| {
            cx.over.apply(&mut cfg);
            cfg.keep_final = true;
            cx.check_memory()
        })
        .and_then(|_| cx.prepare_dirs(&cfg))
        .and_then(|lock| cx.initial_state(&mut cfg).map(|_| lock))
        .inspect(|_| cx.banner(&cfg));
    // Held until the run ends: no second run writes into this directory.
    let _lock = match ready {
        Ok(lock) => lock,
        Err(code) => return code,
    };
    // A parquet, Arrow or text source becomes a stream in the run directory;
    // then every id of a stream is checked before step 1.
    let speak = lead && !args.quiet;
    let src = match super::data::prepare(src, &cx.over.dir, speak, lead, &|| {
        procs.cluster().host_barrier()
    }) {
        Ok(src) => src,
        Err(e) => {
            if lead {
                eprintln!("error: {e}");
            }
            procs.fail();
            return ExitCode::from(2);
        }
    };
    if let Err(e) = super::data::validate(&src, (process, processes), speak) {
        // Each process checks its own share of a stream: whichever finds the
        // bad id says so.
        eprintln!("error: {e}");
        procs.fail();
        return ExitCode::from(2);
    }
    let start = std::time::Instant::now();
    let reloads = crate::runtime::reload::Reloads::default();
    let compiled: std::sync::Mutex<Vec<crate::source::SourceMap>> = Default::default();
    // The TensorBoard log opens before step 1: a run that cannot write it stops here.
    let tensorboard = cfg.log.contains(&crate::vocab::LogSink::Tensorboard);
    let events = match (lead && tensorboard).then(|| cx.events(&cfg)).transpose() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            procs.fail();
            return ExitCode::from(2);
        }
    };
    let stop = crate::runtime::train::Stop::default();
    let hook = hooks.on_step.take();
    // Stopping early is agreed among this process's devices only.
    let stop_here = (processes == 1).then_some(&stop);
    let (res, records) = cx.train(&cfg, &src, (&reloads, &compiled), events, (hook, stop_here));
    if processes > 1 && !args.quiet {
        // Each process reads only its devices' windows of a token stream.
        for (path, read, all) in src.reads() {
            // One write each: the processes share the terminal.
            let line = format!(
                "data: process {process} of {processes} read {read} of {all} bytes of `{}`\n",
                path.display()
            );
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
        }
    }
    let want = (&mut hooks.outcome, stop.stopped_at());
    cx.finish(res, records, &cfg, start, (&reloads, &compiled), want)
}

/// Where a run's results go (the caller's slot), and the step a hook
/// stopped the run before.
type Want<'o> = (&'o mut Option<Outcome>, Option<usize>);

impl Ctx<'_> {
    /// The mesh fits the backend: the virtual mesh's thread count, one MPI
    /// process per device.
    fn check_devices(&self) -> Result<(), ExitCode> {
        let (prog, devices) = (self.prog, self.devices);
        if self.args.backend == Backend::Virtual && devices > MAX_VIRTUAL_DEVICES {
            if self.lead {
                eprintln!(
                    "error: the mesh of `{}` has {devices} devices; the virtual mesh runs at most {MAX_VIRTUAL_DEVICES} (each is a thread of this process). `shardc plan` plans it; `--mesh` runs a smaller one, and `--backend mpi` spreads devices over processes",
                    prog.model
                );
            }
            return Err(ExitCode::from(2));
        }
        if self.args.backend == Backend::Virtual {
            // (Under MPI this was done before MPI started its threads.)
            crate::runtime::mesh::share_cores(devices as usize);
        }
        if self.processes > 1 && devices as usize != self.processes {
            if self.lead {
                eprintln!(
                    "error: the mesh of `{}` has {devices} devices, but MPI started {} processes; start one process per device (`mpirun -np {devices} ...`)",
                    prog.model, self.processes
                );
            }
            return Err(ExitCode::from(2));
        }
        Ok(())
    }

    /// The plan of this run, if there is one.
    fn plan(&self) -> Option<&crate::plan::Plan> {
        self.c.plans.iter().find(|p| p.model == self.prog.model)
    }

    /// Virtual devices share this machine's memory: refuse a run that cannot
    /// fit, warn about one that may not.
    fn check_memory(&self) -> Result<(), ExitCode> {
        let (Some(p), Some(avail)) = (self.plan(), available_memory()) else {
            return Ok(());
        };
        let f64 = self.args.f64;
        // The devices on this machine: all of them, or one per local process.
        let here = if self.processes > 1 {
            self.procs.on_this_machine()
        } else {
            self.devices as usize
        };
        // `--f64` holds every float in f64, mixed precision or not: twice
        // the plan of the same run in f32.
        let scale = if f64 { 2.0 } else { 1.0 };
        let in_f32 = (f64 && self.train.precision != crate::spec::Precision::F32).then(|| {
            let mut t = self.train.clone();
            t.precision = crate::spec::Precision::F32;
            crate::plan::of(self.prog, &t, &self.c.spec, &self.c.sources)
        });
        let sized = in_f32.as_ref().unwrap_or(p);
        // Replicas on one machine share their parameters and optimizer
        // state, unless a reload may give each its own.
        let need = sized.process_memory(here, self.processes == 1 && !self.args.watch) * scale;
        let each = sized.total_memory() * scale;
        let saved = each * here as f64 - need;
        let hb = crate::plan::human_bytes;
        let split = if saved > 0.0 {
            format!(
                "{here} devices × {} each, less {} of replicated parameters and optimizer state they share",
                hb(each),
                hb(saved)
            )
        } else {
            format!("{here} device(s) × {} each", hb(each))
        };
        if need > avail {
            if !self.lead {
                // Machines differ: this one may be the only one short of memory.
                eprintln!(
                    "error: MPI process {} needs about {} on its machine ({split}), but only {} is available; nothing was allocated",
                    self.process,
                    hb(need),
                    hb(avail)
                );
                return Err(ExitCode::from(1));
            }
            out!("{}", crate::plan::render(p, &self.c.sources));
            eprintln!(
                "error: this run needs about {} on this machine ({split}), but only {} is available; nothing was allocated",
                hb(need),
                hb(avail)
            );
            return Err(ExitCode::from(1));
        }
        // The plan counts what stays live; a step also holds short-lived
        // temporaries (backward products, the gradient all-reduce). Measured on
        // the full GPT-J, the process peaked about TRANSIENT above the plan.
        if need * TRANSIENT > avail && !self.quiet {
            eprintln!(
                "warning: this run needs about {} ({split}), and a step's temporaries can add about {:.0}%; only {} is available, so it may run out of memory",
                hb(need),
                (TRANSIENT - 1.0) * 100.0,
                hb(avail)
            );
        }
        Ok(())
    }

    /// `--dump-init`, `--init` and `--resume`: where the parameters (and
    /// the optimizer state) start.
    fn initial_state(&self, cfg: &mut crate::runtime::train::Config) -> Result<(), ExitCode> {
        let (prog, args) = (self.prog, self.args);
        if let Some(path) = args.dump_init.as_ref().filter(|_| self.lead) {
            match crate::runtime::checkpoint::dump_init(prog, cfg.seed, path) {
                Ok(n) => {
                    if !self.quiet {
                        eprintln!("wrote {n} initial parameters to `{}`", path.display())
                    }
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    return Err(ExitCode::from(2));
                }
            }
        }
        if let Some(path) = &args.init {
            match crate::runtime::checkpoint::load_init(prog, path, self.c.map.as_ref()) {
                Ok(m) => {
                    if let Some(w) = m.warning(path).filter(|_| self.lead) {
                        eprintln!("warning: --init: {w}");
                    }
                    if let Some(n) = m.note().filter(|_| self.lead && !self.quiet) {
                        eprintln!("note: --init: {n}");
                    }
                    cfg.init = m.params;
                }
                Err(e) => {
                    eprintln!("error: --init: {e}");
                    return Err(ExitCode::from(2));
                }
            }
        }
        if args.resume {
            let fallback = if args.resume_fallback {
                crate::runtime::checkpoint::Fallback::NewestValid
            } else {
                crate::runtime::checkpoint::Fallback::Refuse
            };
            match crate::runtime::checkpoint::resume_with(prog, cfg, fallback) {
                Ok(msg) => {
                    if self.lead {
                        eprintln!("{msg}")
                    }
                }
                Err(e) => {
                    eprintln!("error: cannot resume: {e}");
                    return Err(ExitCode::from(2));
                }
            }
        }
        Ok(())
    }

    /// `mesh=2, ...` of the program's mesh.
    fn mesh_text(&self) -> String {
        let m: Vec<String> = self
            .prog
            .mesh
            .iter()
            .map(|(a, n)| format!("{a}={n}"))
            .collect();
        m.join(", ")
    }

    /// `training GPT2 on pod (dp=2, tp=2) for 40 steps, batch 16, adamw f32`.
    fn headline(&self, cfg: &crate::runtime::train::Config) -> String {
        let (prog, train) = (self.prog, self.train);
        let mut over = if self.processes > 1 {
            format!(", {} MPI processes", self.processes)
        } else {
            String::new()
        };
        if self.args.device != crate::runtime::device::DeviceArg::Cpu {
            over += &format!(", on {}", self.args.device);
        }
        format!(
            "training {} on {} ({}{over}) for {} steps, batch {}, {} {}",
            prog.model,
            train.mesh,
            self.mesh_text(),
            cfg.steps,
            cfg.batch,
            cfg.optimizer.name(),
            match (self.args.f64, train.precision) {
                (true, _) => "f64".to_string(),
                (false, crate::spec::Precision::F32) => "f32".to_string(),
                (false, p) => format!("{} (f32 master weights)", p.name()),
            }
        )
    }

    /// What is about to train, and where its devices really are.
    fn banner(&self, cfg: &crate::runtime::train::Config) {
        if self.quiet {
            return;
        }
        eprintln!("{}", self.headline(cfg));
        let train = self.train;
        let gpu = self.args.device != crate::runtime::device::DeviceArg::Cpu;
        // A mesh declared for other hardware runs here as a simulation: say so.
        match (train.mesh_kind.as_str(), self.args.backend) {
            ("cuda", _) if !gpu => eprintln!(
                "note: `{}` is declared `kind: cuda`; without `--device cuda` its devices are simulated on the CPU",
                train.mesh
            ),
            ("mpi", Backend::Virtual) => eprintln!(
                "note: `{}` is declared `kind: mpi`; this run simulates its devices in one process (`mpirun -np {} shardc run ... --backend mpi` spreads them over processes)",
                train.mesh, self.devices
            ),
            _ => {}
        }
    }

    /// The run directory, locked for this run (the first process holds the
    /// lock), and inside it the checkpoint directory (a fresh run's own;
    /// symlinks resolved) and FDO's. The first process decides; the others
    /// follow.
    fn prepare_dirs(
        &self,
        cfg: &crate::runtime::train::Config,
    ) -> Result<Option<crate::runtime::lock::RunLock>, ExitCode> {
        let dir = &self.over.dir;
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!(
                "error: cannot create the run directory `{}`: {e}",
                dir.display()
            );
            return Err(ExitCode::from(2));
        }
        if !self.lead {
            return Ok(None);
        }
        let lock = match crate::runtime::lock::RunLock::acquire(dir) {
            Ok(l) => l,
            Err(e) => {
                eprintln!("error: {e}");
                self.procs.fail();
                return Err(ExitCode::from(2));
            }
        };
        if let Some(was) = &lock.stale {
            if !self.quiet {
                eprintln!(
                    "note: took over the lock of `{}` from {was}, which ended without releasing it",
                    dir.display()
                );
            }
        }
        if let Some(ck) = &cfg.checkpoint {
            let fresh = !self.args.resume;
            if let Err(e) = crate::runtime::checkpoint::claim(
                &ck.dir,
                dir,
                self.grants,
                fresh,
                self.args.overwrite,
            ) {
                eprintln!("error: {e}");
                self.procs.fail();
                return Err(ExitCode::from(2));
            }
        }
        if let Some(f) = &cfg.sparse.fdo {
            let made = std::fs::create_dir_all(&f.dir);
            if made.is_err() || !crate::access::stays_inside(&f.dir, dir, self.grants) {
                eprintln!(
                    "error: the FDO directory `{}` cannot be created inside the run directory `{}`",
                    f.dir.display(),
                    dir.display()
                );
                self.procs.fail();
                return Err(ExitCode::from(2));
            }
        }
        Ok(Some(lock))
    }

    /// Train, with live reload when asked for; returns the result and every
    /// step's record (a resumed run's earlier ones first).
    fn train(
        &self,
        cfg: &crate::runtime::train::Config,
        src: &crate::runtime::data::Source,
        (reloads, compiled): (
            &crate::runtime::reload::Reloads,
            &std::sync::Mutex<Vec<crate::source::SourceMap>>,
        ),
        events: Option<crate::runtime::tensorboard::Events>,
        (hook, early): (
            Option<&mut StepHook<'_>>,
            Option<&crate::runtime::train::Stop>,
        ),
    ) -> (
        Result<crate::runtime::train::RunOutput, crate::runtime::train::RunError>,
        Vec<crate::runtime::report::Record>,
    ) {
        let bar = self.progress_bar(cfg);
        let mut progress = Progress::new(self, cfg, &bar, events).with_hook(
            // (A shorter borrow of the caller's hook, for the progress's lifetime.)
            hook.map(|h| -> &mut StepHook { h }),
            early,
        );
        let say = |m: &str| progress_say(&bar, m);
        // (The overrides alone: the processes' handles are not shared across threads.)
        let over = &self.over;
        let adjust = |cfg: &mut crate::runtime::train::Config| over.apply(cfg);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let watch_opts = Options {
            mesh: self
                .args
                .mesh
                .as_ref()
                .map(|m| m.0.clone())
                .unwrap_or_default(),
            data: self.args.data.clone(),
            grants: self.grants.to_vec(),
            f64: self.args.f64,
            ..Options::default()
        };
        let style = if std::io::stderr().is_terminal() {
            Style::Color
        } else {
            Style::Plain
        };
        let res = std::thread::scope(|scope| {
            if self.args.watch {
                let live = crate::watch::Live {
                    file: &self.args.file,
                    opts: &watch_opts,
                    model: self.args.model.as_deref(),
                    adjust: &adjust,
                    reloads,
                    compiled,
                    say: &say,
                    stop: &stop,
                    style,
                };
                let read = &self.c.read;
                let prog = self.prog;
                scope.spawn(move || crate::watch::feed_reloads(live, read, prog, cfg));
                if !self.quiet {
                    say(&format!("watching {} file(s): a saved edit that keeps the parameters applies from the next step", read.len()));
                }
            }
            let extras = crate::runtime::train::Extras {
                want_grads: self.args.dump_grads.is_some(),
                reloads: self.args.watch.then_some(reloads),
                stop: early,
            };
            let res = crate::runtime::train::run_on(
                self.procs.cluster(),
                self.prog,
                cfg,
                src,
                extras,
                &mut |r| progress.step(r),
            );
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            res
        });
        let records = progress.into_records();
        if let Some(b) = &bar {
            b.finish_and_clear();
        }
        (res, records)
    }

    /// A progress bar on a terminal (none with `--quiet` or `--json`).
    fn progress_bar(&self, cfg: &crate::runtime::train::Config) -> Option<indicatif::ProgressBar> {
        (!self.quiet && !self.json && std::io::stderr().is_terminal()).then(|| {
            let b = indicatif::ProgressBar::new(cfg.steps as u64);
            b.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} steps  {msg}  [{elapsed} < {eta}]",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            b
        })
    }

    /// The run's outcome: its files, and what it says.
    fn finish(
        &self,
        res: Result<crate::runtime::train::RunOutput, crate::runtime::train::RunError>,
        records: Vec<crate::runtime::report::Record>,
        cfg: &crate::runtime::train::Config,
        start: std::time::Instant,
        live: (
            &crate::runtime::reload::Reloads,
            &std::sync::Mutex<Vec<crate::source::SourceMap>>,
        ),
        (slot, stopped_at): Want,
    ) -> ExitCode {
        // Every process of a run that ended well takes part (a collective).
        let profile = res.as_ref().ok().and_then(|_| self.profile());
        if !self.lead {
            // The first process reports; the others only say why they stopped.
            return match res {
                Ok(_) => ExitCode::SUCCESS,
                Err(e) if e.step.is_some() => ExitCode::from(1),
                Err(e) => {
                    eprintln!(
                        "error: the run stopped on MPI process {}: {e}",
                        self.process
                    );
                    self.procs.fail();
                    ExitCode::from(1)
                }
            };
        }
        let dir = &self.over.dir;
        let jsonl = cfg.log.contains(&crate::vocab::LogSink::Jsonl);
        let wrote = jsonl.then(|| {
            crate::runtime::report::write_metrics(dir, &self.configuration(cfg), &records)
                .map_err(|e| e.to_string())
                .and_then(|_| {
                    crate::runtime::report::write_loss_curve(
                        dir,
                        &format!("{} on {}", self.prog.model, self.mesh_text()),
                        &records,
                    )
                })
        });
        if let Some(Err(e)) = &wrote {
            eprintln!(
                "warning: could not write the run's metrics to `{}`: {e}",
                dir.display()
            );
        }
        let out = match res {
            Ok(out) => out,
            Err(e) => return self.stopped(e, live),
        };
        let mut out = out;
        let params = out.last.clone().and_then(|last| {
            let tensors = super::weights::tensors(self.prog, last, None);
            tensors.ok()
        });
        if let Err(code) = self.keep(&mut out, cfg, stopped_at) {
            return code;
        }
        if let Some(stopped) = stopped_at.filter(|_| !self.quiet) {
            eprintln!("stopped after step {stopped}, as asked");
        }
        *slot = Some(Outcome {
            dir: dir.clone(),
            losses: out.losses.clone(),
            records,
            params: params.unwrap_or_default(),
            f64: cfg.dtype == candle_core::DType::F64,
            stopped_at,
        });
        if let Some(path) = &self.args.dump_losses {
            let json = serde_json::json!({ "losses": out.losses });
            if let Err(e) = std::fs::write(path, json.to_string()) {
                eprintln!("error: cannot write `{}`: {e}", path.display());
                return ExitCode::from(2);
            }
        }
        if let (true, Some(m)) = (self.mem, &out.memory) {
            out!("{}", self.memory_table(m, out.state_here));
        }
        if self.lead {
            let line = |n: usize| {
                self.prog.nodes.get(n).map_or(String::new(), |node| {
                    format!("{}  {}", self.c.sources.describe(node.span), node.ty)
                })
            };
            let here = (self.devices.max(1) as usize).div_ceil(self.processes.max(1));
            if let Some(table) = crate::runtime::profile::report(&line, here) {
                eprint!("{table}");
            }
            self.write_profile(dir, profile);
        }
        if let Some(line) = self.idle_line(out.pipeline_idle.as_deref()) {
            eprintln!("{line}");
        }
        let first = out.losses.first().copied().unwrap_or(f64::NAN);
        let lastl = out.losses.last().copied().unwrap_or(f64::NAN);
        let secs = start.elapsed().as_secs_f64();
        let written = if let Some(Ok(())) = wrote {
            format!("; wrote {}/{{metrics.jsonl, loss.svg}}", dir.display())
        } else {
            String::new()
        };
        eprintln!(
            "done: {} steps in {secs:.1} s ({:.0} examples/s), loss {first:.4} → {lastl:.4}{written}",
            out.losses.len(),
            out.losses.len() as f64 * cfg.batch as f64 / secs.max(1e-9)
        );
        if std::env::var_os("SHARDC_HOST_READS").is_some() {
            // What a GPU would copy back to the host (tests/host_reads.rs).
            let r = crate::kernels::host::reads();
            eprintln!(
                "host reads: {} reads, {} bytes, {} bytes of floats, largest float read {} bytes",
                r.reads, r.bytes, r.float_bytes, r.largest_float
            );
        }
        ExitCode::SUCCESS
    }

    /// `--mem`: device 0's memory, measured against the plan, and the
    /// process's.
    fn memory_table(&self, m: &crate::runtime::train::Memory, state_here: Option<f64>) -> String {
        let planned = self.plan().cloned().unwrap_or_default();
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
        if m.master_params > 0.0 || planned.master_params > 0.0 {
            t += &row("master params", m.master_params, planned.master_params);
        }
        t += &row("grads", m.grads, planned.grads);
        if m.grad_sum > 0.0 || planned.grad_sum > 0.0 {
            t += &row("grad sum", m.grad_sum, planned.grad_sum);
        }
        t += &row(
            "optimizer state",
            m.optimizer_state,
            planned.optimizer_state,
        );
        if m.gathered_params > 0.0 || planned.gathered_params > 0.0 {
            t += &row(
                "gathered params",
                m.gathered_params,
                planned.gathered_params,
            );
        }
        if m.gathered_grads > 0.0 || planned.gathered_grads > 0.0 {
            t += &row("gathered grads", m.gathered_grads, planned.gathered_grads);
        }
        t += &row("activations", m.activations, planned.activations);
        t += &row("cotangents", m.cotangents, planned.cotangents);
        t += &row("total", m.total(), planned.total_memory());
        let (devices, watch) = (self.devices, self.args.watch);
        // The virtual mesh's devices share replicated state: the process
        // holds less than devices × one device.
        if let (Some(state), true) = (state_here, self.processes == 1 && devices > 1) {
            let n = devices as usize;
            t += &format!(
                "all {n} devices of this process (replicas share parameters and optimizer state)\n"
            );
            let got = n as f64 * (m.total() - m.state()) + state;
            t += &row("total", got, planned.process_memory(n, !watch));
        }
        // The whole process, as the system counts it: the plan's `with
        // shardc` row against the peak resident set so far.
        if let Some(used) = m.device_in_use {
            // On a GPU the tensors are not in the resident set: the figure
            // is what the driver said was in use at the step's peak (the
            // allocator's pool and the CUDA context included).
            t += "the GPU at the first step's peak (in use as the CUDA driver reports it, the context included; planned: its devices)\n";
            let n = devices as usize;
            t += &row("in use", used, planned.process_memory(n, !watch));
            return t;
        }
        let peak = crate::plan::host::peak_resident();
        if let (Some(rss), Some(code), 1) = (peak, crate::plan::host::shardc_code(), self.processes)
        {
            t += "the process at its peak (resident set; planned: its devices and shardc's own code and read-only data)\n";
            let n = devices as usize;
            t += &row("resident", rss, planned.process_memory(n, !watch) + code);
        }
        t
    }

    /// Why the run stopped, pointing at the source of the op a runtime
    /// error names, in the program in force then (the file's, or a
    /// reload's), or at the table a SparseCore limit belongs to.
    /// The run's parameters out: `final/` always, the first step's
    /// gradients with `--dump-grads`.
    fn keep(
        &self,
        out: &mut crate::runtime::train::RunOutput,
        cfg: &crate::runtime::train::Config,
        stopped_at: Option<usize>,
    ) -> Result<(), ExitCode> {
        let f64 = cfg.dtype == candle_core::DType::F64;
        if let Some(last) = out.last.take() {
            let dir = &self.over.dir;
            let steps = stopped_at.unwrap_or(cfg.steps);
            match super::weights::save_final(dir, self.prog, last, f64, steps) {
                Ok(p) if !self.quiet => {
                    eprintln!("saved the final parameters to `{}`", p.display())
                }
                Ok(_) => {}
                Err(e) => {
                    eprintln!("error: the final parameters were not saved: {e}");
                    return Err(ExitCode::from(2));
                }
            }
        }
        let Some(path) = &self.args.dump_grads else {
            return Ok(());
        };
        let Some(grads) = out.first_grads.take() else {
            eprintln!(
                "warning: --dump-grads: this run did not compute step 1 (it resumed at step {}); nothing written",
                cfg.start_step + 1
            );
            return Ok(());
        };
        let bound = self
            .c
            .map
            .as_ref()
            .map(|m| crate::weights::bind(m, self.prog).0);
        let dtype = if f64 {
            super::weights::OutDtype::F64
        } else {
            super::weights::OutDtype::F32
        };
        let meta = std::collections::HashMap::from([
            ("format".to_string(), "shardc-grads-1".to_string()),
            ("model".to_string(), self.prog.model.clone()),
            ("step".to_string(), "1".to_string()),
        ]);
        let wrote = super::weights::tensors(self.prog, grads, bound.as_ref())
            .and_then(|t| super::weights::write(path, &t, dtype, meta).map(|_| t.len()));
        match wrote {
            Ok(n) if !self.quiet => {
                eprintln!(
                    "wrote the first step's gradients of {n} parameters to `{}`",
                    path.display()
                )
            }
            Ok(_) => {}
            Err(e) => {
                eprintln!("error: --dump-grads: {e}");
                return Err(ExitCode::from(2));
            }
        }
        Ok(())
    }

    fn stopped(
        &self,
        e: crate::runtime::train::RunError,
        (reloads, compiled): (
            &crate::runtime::reload::Reloads,
            &std::sync::Mutex<Vec<crate::source::SourceMap>>,
        ),
    ) -> ExitCode {
        let c = self.c;
        let kept = compiled.lock().ok();
        let at = e.node.and_then(|(i, generation)| {
            let n = match generation {
                0 => self.prog.nodes.get(i)?.clone(),
                g => reloads.get(g)?.prog.nodes.get(i)?.clone(),
            };
            let sources = match generation {
                0 => &c.sources,
                g => kept.as_ref()?.get(g - 1)?,
            };
            Some((sources.describe(n.span), n.ty.to_string()))
        });
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
        // A GPU out of memory: what the plan says the devices here need.
        if matches!(e.fault, crate::fault::Fault::Device(ref m) if m.contains("OUT_OF_MEMORY")) {
            if let Some(p) = self.plan() {
                let n = self.devices.max(1) as usize;
                eprintln!(
                    "  the plan: {} per device, {} for the {n} device(s) on this GPU (`shardc plan --device h100-80g` compares with a card; `checkpoint: full` or `precision: bf16` lower it)",
                    crate::plan::human_bytes(p.total_memory()),
                    crate::plan::human_bytes(p.process_memory(n, true))
                );
            }
        }
        if e.step.is_none() {
            self.procs.fail();
        }
        ExitCode::from(1)
    }
}

/// How far above the plan a process's resident memory may peak (a step's
/// short-lived temporaries, the allocator's free pages, the program itself):
/// what the refusal check warns within. Measured on the full-size GPT-J
/// (`models/gptj.shard`, 8 devices in one process): 7.7 GiB resident against
/// 7.1 GiB planned for the process, 1.09×.
const TRANSIENT: f64 = 1.3;

/// Bytes this machine can still give (Linux `MemAvailable`), if known.
fn available_memory() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024.0)
}
