//! The single entry point of the compiler: the CLI, `watch`, the tests and the
//! editor server all call [`compile`]. There is no second path.

use crate::check::{Checked, Checker};
use crate::diag::Diagnostic;
use crate::files::{Disk, Files};
use crate::resolve::{Loader, Program};
use crate::runtime::config::Config;
use crate::runtime::data::Source;
use crate::source::{SourceFile, SourceMap};
use crate::spmd::Program as Program_;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Every collective must be written explicitly (also `pragma strict`).
    pub strict: bool,
    /// `--mesh dp=4,mp=2`: axis sizes that replace the file's (the checker re-validates).
    pub mesh: Vec<(String, i64)>,
    /// `--data PATH`: an array file that replaces every `train`'s `data:` source.
    pub data: Option<PathBuf>,
    /// `--allow-path DIR`: directories outside the model's own that it may read
    /// (imports, data) and write (absolute checkpoint and FDO directories).
    pub grants: Vec<PathBuf>,
    /// `shardc run --f64`: the run holds every float in f64 (W0002 does not apply).
    pub f64: bool,
    /// `--map FILE.toml`: a weight map, checked against every trained model.
    pub map: Option<PathBuf>,
    /// The editor's check at each keystroke: no plans and no data or
    /// weight-map checks (they read files and take most of the time on a
    /// large model); the editor runs them once the user pauses.
    pub quick: bool,
    /// One of the auto-sharder's many trial compiles (`shardc shard`): plans,
    /// but no data or weight-map checks and no choice among fix-its (each
    /// would read files or compile again).
    pub trial: bool,
}

pub struct Compilation {
    pub sources: SourceMap,
    pub diagnostics: Vec<Diagnostic>,
    pub program: Program,
    /// The typed `train` and table declarations.
    pub spec: crate::spec::Spec,
    pub checked: Checked,
    /// The SPMD program of each `train` whose model checked clean (one that
    /// repeats a layer too many times to unroll is planned but not here).
    pub programs: Vec<crate::spmd::Program>,
    /// One static plan per lowered `train`, when the file has no errors.
    pub plans: Vec<crate::plan::Plan>,
    /// Real files the compile read (the root, its imports, its data files): what
    /// `watch` watches.
    pub read: Vec<PathBuf>,
    /// The data each `train` reads from files, checked against its program.
    pub data: Vec<crate::data::TrainData>,
    /// `--map`: the weight map, when it read and bound without errors.
    pub map: Option<crate::weights::WeightMap>,
}

impl Compilation {
    /// The lowered program of the chosen `train` (the first, or the one for
    /// `model`) and its run configuration, without its data (what `shardc show`
    /// and a live reload need).
    pub fn settings(
        &self,
        model: Option<&str>,
    ) -> Result<(&Program_, &crate::spec::Train, Config), String> {
        let t = self.spec.train(model).ok_or_else(|| {
            format!(
                "no `train` declaration{}",
                model.map_or(String::new(), |m| format!(" for `{m}`"))
            )
        })?;
        let prog = self
            .programs
            .iter()
            .find(|p| p.model == t.model)
            .ok_or_else(|| format!("`{}` could not be lowered", t.model))?;
        Ok((prog, t, Config::new(t, &self.spec, prog)))
    }

    /// Everything a run needs from a clean compilation: the lowered program of
    /// the chosen `train`, its configuration and its data.
    pub fn prepare(
        &self,
        model: Option<&str>,
    ) -> Result<(&Program_, &crate::spec::Train, Config, Source), String> {
        let (prog, t, cfg) = self.settings(model)?;
        let loaded = self.data.iter().find(|d| d.model == t.model);
        // A file source that did not load has a diagnostic: an error, never a fallback.
        let src = crate::runtime::config::source(t, prog, loaded.map(|d| &d.data))?;
        let like_output = prog.targets(cfg.loss).is_some_and(|x| !x.classes);
        if like_output && matches!(src, Source::Tokens { .. }) {
            // The data stage reports this (E0305); never train on ids as targets.
            return Err(format!(
                "`loss: {}` needs targets shaped like the output; a text source gives token ids",
                t.loss_name()
            ));
        }
        Ok((prog, t, cfg, src))
    }

    /// `checked models/gptj.shard: 0 errors, 2 notes`
    pub fn summary(&self, name: &str) -> String {
        let c = self;
        let errors = c.errors();
        let warnings = c
            .diagnostics
            .iter()
            .filter(|d| d.severity == crate::diag::Severity::Warning)
            .count();
        let notes = c.diagnostics.len() - errors - warnings;
        let plural = |n: usize, w: &str| {
            if n == 1 {
                format!("1 {w}")
            } else {
                format!("{n} {w}s")
            }
        };
        // Warnings are named only when there are some.
        let rest = if warnings > 0 {
            format!("{}, {}", plural(warnings, "warning"), plural(notes, "note"))
        } else {
            plural(notes, "note")
        };
        if errors == 0 {
            format!("✓ {name}: clean ({rest})")
        } else {
            format!("✗ {name}: {}, {rest}", plural(errors, "error"))
        }
    }

    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(|d| d.is_error())
    }
    pub fn errors(&self) -> usize {
        self.diagnostics.iter().filter(|d| d.is_error()).count()
    }
}

/// Compile a file from disk. Only an unreadable root file is an `Err`.
pub fn compile(path: &Path, opts: &Options) -> std::io::Result<Compilation> {
    compile_in(&Disk, path, opts)
}

/// Compile source text as if it were the file at `path` (imports and data
/// are read from the disk next to it).
pub fn compile_source(path: &Path, text: String, opts: &Options) -> Compilation {
    compile_text(&Disk, path, text, opts)
}

/// Compile the file at `path` of a file system (the disk, an editor's buffers
/// over it, files in memory). Only an unreadable root file is an `Err`.
pub fn compile_in(files: &dyn Files, path: &Path, opts: &Options) -> std::io::Result<Compilation> {
    let bytes = files.read_source(path)?;
    Ok(match String::from_utf8(bytes) {
        Ok(text) => compile_text(files, path, text, opts),
        Err(e) => not_utf8(path, e),
    })
}

/// A root file that is not UTF-8: its text (lossily, for the snippet) and E0004
/// at the first bad byte; nothing else is compiled.
fn not_utf8(path: &Path, e: std::string::FromUtf8Error) -> Compilation {
    let offset = e.utf8_error().valid_up_to();
    let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
    let mut sources = SourceMap::default();
    let root = sources.add(SourceFile::new(
        path.to_path_buf(),
        display_name(path),
        text,
    ));
    let end = sources.get(root).text[offset..]
        .chars()
        .next()
        .map_or(offset, |c| offset + c.len_utf8());
    let diagnostics = vec![crate::diag::Problem::NotUtf8 {
        span: crate::source::Span::new(root, offset, end),
        offset,
    }
    .diagnostic()];
    Compilation {
        sources,
        diagnostics,
        program: Program::default(),
        spec: Default::default(),
        checked: Default::default(),
        programs: vec![],
        plans: vec![],
        read: vec![path.to_path_buf()],
        data: vec![],
        map: None,
    }
}

/// The stack every compile runs on. Every recursive walk of the syntax tree is
/// bounded by the parser's limits (`parse::MAX_NESTING`, `parse::MAX_CHAIN`) and
/// the resolver's; this is the room those bounds were measured to need, with a
/// wide margin, whatever thread the caller is on (a test's 2 MiB thread, the
/// editor server's). Untouched stack pages cost nothing.
pub const COMPILE_STACK: usize = 256 << 20;

/// Compile `text` as the file at `path` of a file system.
pub fn compile_text(files: &dyn Files, path: &Path, text: String, opts: &Options) -> Compilation {
    let slot = std::sync::Mutex::new(Some(text));
    let work = || {
        let text = slot
            .lock()
            .ok()
            .and_then(|mut t| t.take())
            .unwrap_or_default();
        let mut c = compile_here(files, path, text, opts);
        if !opts.trial {
            choose_fixes(files, path, opts, &mut c);
        }
        c
    };
    // `&work`, not `work`: the fallback below calls it again.
    #[allow(clippy::needless_borrows_for_generic_args)]
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("compile".into())
            .stack_size(COMPILE_STACK)
            .spawn_scoped(s, &work);
        match worker {
            Ok(h) => h
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread to be had (a resource limit): compile on this one.
            Err(_) => work(),
        }
    })
}

/// N0001's label says bytes per call; where a plan counts the collective
/// (a clean file), it also says how many calls a step makes (a `repeat`'s
/// blocks, forward and backward, every microbatch) and so the bytes per step.
fn calls_per_step(diagnostics: &mut [crate::diag::Diagnostic], plans: &[crate::plan::Plan]) {
    for d in diagnostics
        .iter_mut()
        .filter(|d| d.code == crate::diag::Code::N0001)
    {
        let span = d.primary.span;
        // A gather over several axes is one note and one collective per axis
        // in the plan: their bytes add up. One model's plan counts it.
        let Some(p) = plans
            .iter()
            .find(|p| p.comms.iter().any(|c| c.span == span))
        else {
            continue;
        };
        let here: Vec<&crate::plan::Comm> = p.comms.iter().filter(|c| c.span == span).collect();
        let calls = here.iter().map(|c| c.count).max().unwrap_or(0);
        let bytes: f64 = here.iter().map(|c| c.bytes * c.count as f64).sum();
        d.primary.text = format!(
            "{}, {} per step ({calls} call{})",
            d.primary.text,
            crate::units::human_bytes(bytes),
            if calls == 1 { "" } else { "s" }
        );
    }
}

/// A fix-it among equally near names ([`crate::diag::Fix::also`]: `mp` on a
/// mesh `(dp, tp)`) keeps the name whose file checks with the fewest errors:
/// each is tried by compiling the root file with every error of the same code
/// at the same word replaced by it (the first wins a tie). The help names the
/// kept one.
fn choose_fixes(files: &dyn Files, path: &Path, opts: &Options, c: &mut Compilation) {
    let Some((root, file)) = c.sources.files().next() else {
        return;
    };
    let text = file.text.clone();
    let mut chosen: std::collections::HashMap<(crate::diag::Code, String), String> =
        Default::default();
    for i in 0..c.diagnostics.len() {
        let d = &c.diagnostics[i];
        let Some(fix) = d
            .fix
            .as_ref()
            .filter(|f| !f.also.is_empty() && f.span.file == root)
        else {
            continue;
        };
        let Some(word) = text.get(fix.span.range()) else {
            continue;
        };
        let key = (d.code, word.to_string());
        let pick = match chosen.get(&key) {
            Some(p) => p.clone(),
            None => {
                let mut spans: Vec<std::ops::Range<usize>> = c
                    .diagnostics
                    .iter()
                    .filter(|e| e.code == d.code)
                    .filter_map(|e| e.fix.as_ref())
                    .filter(|f| f.span.file == root && text.get(f.span.range()) == Some(word))
                    .map(|f| f.span.range())
                    .collect();
                spans.sort_by_key(|r| r.start);
                spans.dedup();
                let mut best: Option<(usize, &String)> = None;
                for cand in std::iter::once(&fix.replacement).chain(&fix.also) {
                    let mut edited = text.clone();
                    for r in spans.iter().rev() {
                        edited.replace_range(r.clone(), cand);
                    }
                    let tried = compile_here(files, path, edited, opts);
                    let errors = tried.diagnostics.iter().filter(|d| d.is_error()).count();
                    if best.is_none_or(|(e, _)| errors < e) {
                        best = Some((errors, cand));
                    }
                }
                let pick = best.map_or_else(|| fix.replacement.clone(), |b| b.1.clone());
                chosen.insert(key, pick.clone());
                pick
            }
        };
        let d = &mut c.diagnostics[i];
        let Some(fix) = d.fix.as_mut() else { continue };
        if fix.replacement != pick {
            let (was, now) = (format!("`{}`", fix.replacement), format!("`{pick}`"));
            d.help = d.help.as_ref().map(|h| h.replace(&was, &now));
            fix.also.retain(|a| *a != pick);
            fix.also
                .insert(0, std::mem::replace(&mut fix.replacement, pick));
        }
    }
}

fn compile_here(files: &dyn Files, path: &Path, text: String, opts: &Options) -> Compilation {
    // Everything the model names is read through the access policy: its own
    // directory, the granted ones, and what the command line named.
    let own = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let allowed = crate::access::Allowed::new(
        files,
        std::iter::once(own)
            .chain(opts.grants.iter().cloned())
            .chain(opts.data.iter().cloned())
            .chain(opts.map.iter().cloned()),
    );
    let confined = crate::access::Confined::new(files, allowed);
    let files: &dyn Files = &confined;
    let mut sources = SourceMap::default();
    let mut diagnostics = Vec::new();
    let name = display_name(path);
    let root = sources.add(SourceFile::new(path.to_path_buf(), name, text));
    let mut loader = Loader::new(&mut sources, &mut diagnostics, files);
    loader.load(root);
    let mut read = vec![path.to_path_buf()];
    read.append(&mut loader.read);
    let mut program = loader.resolve(root);
    for m in &mut program.meshes {
        for (axis, size) in &opts.mesh {
            if let Some(a) = m.axes.iter_mut().find(|a| a.0 == *axis) {
                a.1 = *size;
            }
        }
    }
    let (spec, diags) = crate::spec::build(&program, &sources);
    diagnostics.extend(diags);
    diagnostics.extend(output_dirs(&spec, &opts.grants));
    let flags = crate::check::Flags {
        strict: opts.strict,
        f64: opts.f64,
    };
    let (diags, checked) = Checker::new(&program, &spec, flags)
        .reusing(&sources, !opts.trial)
        .run();
    diagnostics.extend(diags);
    // Each trained model's program, with its step's loss after the model,
    // and what its step adds to the report.
    let mut step_notes = Vec::new();
    let lowered: Vec<crate::spmd::Program> = checked
        .models
        .iter()
        .map(|m| {
            let mut p = crate::lower::lower(m, &checked.bodies);
            if let Some(t) = spec.train(Some(&p.model)) {
                let span = t.loss_span.unwrap_or(t.span);
                crate::step::attach(&mut p, t.loss, t.loss_ignore, &t.metrics, span);
                step_notes.extend(
                    crate::step::check(&p, t, &spec)
                        .iter()
                        .map(|x| x.diagnostic()),
                );
            }
            p
        })
        .collect();
    diagnostics.extend(step_notes);
    let mut lowered = lowered;
    for p in &mut lowered {
        schedule_file(p, files, &mut sources, &mut diagnostics, &mut read);
    }
    let clean = !opts.quick && !diagnostics.iter().any(|d| d.is_error());
    let plans: Vec<crate::plan::Plan> = lowered
        .iter()
        .filter(|_| clean)
        .filter_map(|p| {
            let t = spec.train(Some(&p.model))?;
            Some(if opts.trial {
                crate::plan::bare(p, t, &spec, &sources)
            } else {
                crate::plan::of(p, t, &spec, &sources)
            })
        })
        .collect();
    calls_per_step(&mut diagnostics, &plans);
    let programs: Vec<crate::spmd::Program> =
        lowered.into_iter().filter(|p| p.folds.is_empty()).collect();
    let data = if opts.quick || opts.trial {
        Default::default()
    } else {
        let (diags, data, mut data_read) =
            crate::data::check(&spec, &programs, opts.data.as_deref(), files);
        diagnostics.extend(diags);
        read.append(&mut data_read);
        data
    };
    let map = opts
        .map
        .as_deref()
        .filter(|_| !opts.quick && !opts.trial)
        .and_then(|m| weight_map(m, root, files, &mut sources, &programs, &mut diagnostics));
    if let Some(m) = &opts.map {
        read.push(m.clone());
    }
    // Stable order: by file, then position, errors before notes at the same place.
    diagnostics.sort_by_key(|d| (d.primary.span.file, d.primary.span.start, d.severity));
    for d in &mut diagnostics {
        d.settle_fix(&sources);
    }
    Compilation {
        sources,
        diagnostics,
        program,
        spec,
        checked,
        programs,
        plans,
        read,
        data,
        map,
    }
}

/// `--map`: the weight map read, parsed and bound to every program (its
/// problems as diagnostics); `None` when it cannot be read or has errors.
fn weight_map(
    path: &Path,
    root: crate::source::FileId,
    files: &dyn Files,
    sources: &mut SourceMap,
    programs: &[crate::spmd::Program],
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<crate::weights::WeightMap> {
    let text = match files.read_text(path) {
        Ok(t) => t,
        Err(e) => {
            let span = crate::source::Span::new(root, 0, 0);
            diagnostics.push(Diagnostic::new(
                crate::diag::Code::E0600,
                format!("cannot read the weight map `{}`: {e}", path.display()),
                crate::diag::Label::new(span, "checked against this model"),
            ));
            return None;
        }
    };
    let file = sources.add(SourceFile::new(
        path.to_path_buf(),
        display_name(path),
        text,
    ));
    let map = match crate::weights::parse(file, path, &sources.get(file).text) {
        Ok(m) => m,
        Err(problems) => {
            diagnostics.extend(problems.into_iter().map(|p| p.diagnostic()));
            return None;
        }
    };
    let before = diagnostics.len();
    for p in programs {
        let (_, problems) = crate::weights::bind(&map, p);
        diagnostics.extend(problems.into_iter().map(|p| p.diagnostic()));
    }
    let clean = !diagnostics[before..].iter().any(|d| d.is_error());
    clean.then_some(map)
}

/// A pipelined stack's `schedule: "FILE"`: read (relative to the `.shard`
/// file naming it), parsed and verified (E0232, E0233, each at its cell), and
/// given to the program.
fn schedule_file(
    prog: &mut crate::spmd::Program,
    files: &dyn Files,
    sources: &mut SourceMap,
    diagnostics: &mut Vec<Diagnostic>,
    read: &mut Vec<PathBuf>,
) {
    use crate::diag::{Problem, ScheduleFileProblem, ScheduleProblem};
    use crate::schedule::Source;
    let checkpointed = !prog.checkpoints.is_empty();
    let Some(pp) = prog.pipeline.as_mut() else {
        return;
    };
    let Source::File {
        written,
        span,
        schedule: slot @ None,
    } = &mut pp.schedule
    else {
        return;
    };
    let span = *span;
    let base = sources.get(span.file).path.parent().map(Path::to_path_buf);
    let path = base.unwrap_or_default().join(written.as_str());
    read.push(path.clone());
    let text = match files.read_text(&path) {
        Ok(t) => t,
        Err(e) => {
            let problem = ScheduleFileProblem::Unreadable(format!("`{}`: {e}", path.display()));
            diagnostics.push(Problem::ScheduleFile { span, problem }.diagnostic());
            return;
        }
    };
    let file = sources.add(SourceFile::new(path.clone(), display_name(&path), text));
    let stack = crate::schedule::file::Stack {
        ranks: pp.stages,
        axis: &pp.axis,
        microbatches: pp.microbatches,
        layers: pp.blocks.len(),
        span,
    };
    match crate::schedule::file::read(file, &sources.get(file).text, &stack) {
        Ok(s)
            if checkpointed
                && s.orders
                    .iter()
                    .flatten()
                    .any(|a| a.pass == crate::schedule::Pass::I) =>
        {
            let problem = ScheduleProblem::Checkpointed {
                schedule: format!("`{written}`"),
            };
            diagnostics.push(Problem::Schedule { span, problem }.diagnostic());
        }
        Ok(s) => *slot = Some(Box::new(s)),
        Err(problems) => diagnostics.extend(problems.iter().map(Problem::diagnostic)),
    }
}

/// The access policy's write side: each `train`'s checkpoint and FDO directory
/// must stay inside the run directory, or under a granted one.
fn output_dirs(spec: &crate::spec::Spec, grants: &[PathBuf]) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for t in &spec.trains {
        let dirs = [
            (
                t.checkpoint.as_ref().map(|c| &c.dir),
                t.checkpoint_dir_span,
                "checkpoint",
            ),
            (t.fdo.as_ref().map(|f| &f.dir), t.fdo_dir_span, "fdo"),
        ];
        for (dir, span, what) in dirs {
            let (Some(dir), Some(span)) = (dir, span) else {
                continue;
            };
            if let Err(escape) = crate::access::output_dir(&dir.to_string_lossy(), grants) {
                out.push(
                    crate::diag::Problem::OutputEscapes {
                        span,
                        what,
                        dir: dir.display().to_string(),
                        escape,
                    }
                    .diagnostic(),
                );
            }
        }
    }
    out
}

/// Stage 1 alone on one file (no imports, checks or data): its syntax error as
/// a diagnostic, with the source map to render it. For `shardc fmt`, which must
/// not read a model's imports or training data to re-indent it.
pub fn syntax(path: &Path, text: String) -> (SourceMap, Option<Diagnostic>) {
    let mut sources = SourceMap::default();
    let name = display_name(path);
    let root = sources.add(SourceFile::new(path.to_path_buf(), name, text));
    let problem = crate::parse::parse(root, &sources.get(root).text).err();
    (sources, problem.map(|p| p.diagnostic()))
}

fn display_name(path: &Path) -> String {
    if let Ok(cwd) = std::env::current_dir() {
        if let Ok(rel) = path.strip_prefix(&cwd) {
            return rel.display().to_string();
        }
    }
    path.display().to_string()
}
