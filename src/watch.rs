//! `shardc watch`: re-check on every save of the file or anything it imported,
//! and the [`Watcher`] that `shardc run --watch` shares. Watches parent
//! directories (editors save by rename) and filters by path.

use crate::diag::render::{self, Style};
use crate::runtime::reload::{self, Reloads};
use crate::runtime::train::Config;
use crate::source::SourceMap;
use crate::spmd::Program;
use crate::world::{self, Options};
use notify_debouncer_full::notify::{RecommendedWatcher, RecursiveMode};
use notify_debouncer_full::{new_debouncer, DebounceEventResult, Debouncer, RecommendedCache};
use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

/// One check, rendered; returns the files it read and whether it was clean.
fn check_once(
    file: &Path,
    opts: &Options,
    style: Style,
    out: &mut impl Write,
) -> (Vec<PathBuf>, bool) {
    if style == Style::Color {
        let _ = write!(out, "\x1b[2J\x1b[H");
    }
    match world::compile(file, opts) {
        Ok(c) => {
            for d in &c.diagnostics {
                let _ = write!(out, "{}", render::human(d, &c.sources, style));
            }
            let _ = writeln!(out, "{}", c.summary(&file.display().to_string()));
            (c.read.clone(), !c.has_errors())
        }
        Err(e) => {
            let _ = writeln!(
                out,
                "error: cannot read `{}`: {e} (waiting for it to appear)",
                file.display()
            );
            (vec![file.to_path_buf()], false)
        }
    }
}

/// The files a compile read, watched through their parent directories (an
/// editor's save by rename would end a watch on the file itself).
pub struct Watcher {
    debouncer: Debouncer<RecommendedWatcher, RecommendedCache>,
    rx: mpsc::Receiver<DebounceEventResult>,
    dirs: BTreeSet<PathBuf>,
    files: BTreeSet<PathBuf>,
}

impl Watcher {
    pub fn new() -> Result<Watcher, String> {
        let (tx, rx) = mpsc::channel::<DebounceEventResult>();
        let debouncer = new_debouncer(Duration::from_millis(100), None, tx)
            .map_err(|e| format!("cannot watch files: {e}"))?;
        Ok(Watcher {
            debouncer,
            rx,
            dirs: BTreeSet::new(),
            files: BTreeSet::new(),
        })
    }

    /// Watch these files (what the last compile read) from now on.
    pub fn set_files(&mut self, read: &[PathBuf]) {
        self.files = read.iter().map(|p| canonical(p)).collect();
        for f in &self.files {
            let dir = f
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .map_or_else(|| PathBuf::from("."), Path::to_path_buf);
            if self.dirs.insert(dir.clone()) {
                if let Err(e) = self.debouncer.watch(&dir, RecursiveMode::NonRecursive) {
                    eprintln!("warning: cannot watch `{}`: {e}", dir.display());
                }
            }
        }
    }

    pub fn count(&self) -> usize {
        self.files.len()
    }

    /// Wait until one of the files changes: `Some(true)`; `Some(false)` when
    /// `timeout` passes first; `None` when the watch itself ended.
    pub fn changed(&self, timeout: Option<Duration>) -> Option<bool> {
        let deadline = timeout.map(|t| std::time::Instant::now() + t);
        loop {
            let got = match deadline {
                None => self.rx.recv().map_err(|_| true),
                Some(d) => {
                    let left = d.saturating_duration_since(std::time::Instant::now());
                    self.rx
                        .recv_timeout(left)
                        .map_err(|e| e == mpsc::RecvTimeoutError::Disconnected)
                }
            };
            match got {
                Ok(Ok(events)) => {
                    // Reading a file (the compile itself) is an event too: only
                    // writes, creations, renames and removals count.
                    let hit = events
                        .iter()
                        .filter(|e| !e.kind.is_access() && !e.kind.is_other())
                        .flat_map(|e| e.paths.iter())
                        .any(|p| {
                            self.files.contains(&canonical(p))
                                || self.files.iter().any(|f| {
                                    f.file_name() == p.file_name() && f.parent() == p.parent()
                                })
                        });
                    if hit {
                        return Some(true);
                    }
                }
                Ok(Err(errs)) => {
                    for e in errs {
                        eprintln!("warning: watch error: {e}");
                    }
                }
                Err(true) => return None,
                Err(false) => return Some(false),
            }
        }
    }
}

pub fn run(file: &Path, opts: &Options) -> ExitCode {
    let style = if std::io::stdout().is_terminal() {
        Style::Color
    } else {
        Style::Plain
    };
    let mut watcher = match Watcher::new() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut was_clean = None;
    loop {
        let mut out = std::io::stdout().lock();
        let (read, clean) = check_once(file, opts, style, &mut out);
        if clean && was_clean == Some(false) {
            let _ = writeln!(out, "✓ clean again");
        }
        watcher.set_files(&read);
        let _ = writeln!(
            out,
            "watching {} file(s) for changes (ctrl-c to stop)",
            watcher.count()
        );
        let _ = out.flush();
        drop(out);
        was_clean = Some(clean);
        if watcher.changed(None).is_none() {
            return ExitCode::from(2);
        }
    }
}

/// What `shardc run --watch` needs to recompile the running model on every save.
pub struct Live<'a> {
    pub file: &'a Path,
    pub opts: &'a Options,
    pub model: Option<&'a str>,
    /// The command line's overrides (steps, seed, dtype), applied to each edit.
    pub adjust: &'a (dyn Fn(&mut Config) + Sync),
    pub reloads: &'a Reloads,
    /// Each accepted reload's sources (generation N at N - 1): a runtime error
    /// names a node of the program in force, whose spans point into them.
    pub compiled: &'a Mutex<Vec<SourceMap>>,
    /// Prints a message (above a progress bar, if there is one).
    pub say: &'a (dyn Fn(&str) + Sync),
    /// Set when the training has ended.
    pub stop: &'a AtomicBool,
    pub style: Style,
}

/// Recompile on every save of the files the model read. A clean edit that the
/// running training can take (see [`crate::runtime::reload`]) is published to
/// `reloads`; an edit with errors or one that changes what a reload cannot is
/// reported, and the training goes on with the last good program.
pub fn feed_reloads(live: Live, read: &[PathBuf], prog: &Program, cfg: &Config) {
    let mut watcher = match Watcher::new() {
        Ok(w) => w,
        Err(e) => {
            (live.say)(&format!("warning: {e}; edits will not reach this run"));
            return;
        }
    };
    watcher.set_files(read);
    let (mut cur_prog, mut cur_cfg) = (prog.clone(), cfg.clone());
    while !live.stop.load(Ordering::SeqCst) {
        match watcher.changed(Some(Duration::from_millis(200))) {
            None => return,
            Some(false) => continue,
            Some(true) => {}
        }
        let c = match world::compile(live.file, live.opts) {
            Ok(c) => c,
            Err(e) => {
                (live.say)(&format!(
                    "edit not applied: cannot read `{}`: {e}",
                    live.file.display()
                ));
                continue;
            }
        };
        watcher.set_files(&c.read);
        if c.has_errors() {
            let mut text = String::new();
            for d in c.diagnostics.iter().filter(|d| d.is_error()) {
                text += &render::human(d, &c.sources, live.style);
            }
            text += &c.summary(&live.file.display().to_string());
            text += "\nedit not applied: the training goes on with the last good program";
            (live.say)(&text);
            continue;
        }
        // The program and settings only: the data stays what the run started with.
        let prepared = c.settings(live.model).map(|(p, _, mut cfg)| {
            (live.adjust)(&mut cfg);
            (p.clone(), cfg)
        });
        let (new_prog, new_cfg) = match prepared {
            Ok(x) => x,
            Err(e) => {
                (live.say)(&format!("edit not applied: {e}"));
                continue;
            }
        };
        match reload::compare(&cur_prog, &cur_cfg, &new_prog, &new_cfg) {
            Ok(summary) => {
                let Ok(mut kept) = live.compiled.lock() else {
                    return;
                };
                let g = live
                    .reloads
                    .publish(new_prog.clone(), new_cfg.clone(), 0, summary.clone());
                kept.push(c.sources);
                (live.say)(&format!(
                    "edit accepted as reload {g}: {summary}; it applies from the next step"
                ));
                (cur_prog, cur_cfg) = (new_prog, new_cfg);
            }
            Err(why) => (live.say)(&format!(
                "edit not applied (restart the run to apply it): {}",
                why.join("; ")
            )),
        }
    }
}
