//! `shardc watch`: re-check on every save of the file or anything it imported.
//! Watches parent directories (editors save by rename) and filters by path.

use crate::cli::summary;
use crate::diag::render::{self, Style};
use crate::world::{self, Options};
use notify_debouncer_full::{new_debouncer, notify::RecursiveMode, DebounceEventResult};
use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::mpsc;
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
            let _ = writeln!(out, "{}", summary(&c, &file.display().to_string()));
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

pub fn run(file: &Path, opts: &Options) -> ExitCode {
    let style = if std::io::stdout().is_terminal() {
        Style::Color
    } else {
        Style::Plain
    };
    let (tx, rx) = mpsc::channel::<DebounceEventResult>();
    let mut debouncer = match new_debouncer(Duration::from_millis(100), None, tx) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: cannot watch files: {e}");
            return ExitCode::from(2);
        }
    };
    let mut watched_dirs: BTreeSet<PathBuf> = BTreeSet::new();
    let mut was_clean = None;
    loop {
        let mut out = std::io::stdout().lock();
        let (read, clean) = check_once(file, opts, style, &mut out);
        if clean && was_clean == Some(false) {
            let _ = writeln!(out, "✓ clean again");
        }
        let _ = writeln!(
            out,
            "watching {} file(s) for changes (ctrl-c to stop)",
            read.len()
        );
        let _ = out.flush();
        drop(out);
        was_clean = Some(clean);
        let files: BTreeSet<PathBuf> = read.iter().map(|p| canonical(p)).collect();
        for f in &files {
            let dir = f
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from("."));
            let dir = if dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                dir
            };
            if watched_dirs.insert(dir.clone()) {
                if let Err(e) = debouncer.watch(&dir, RecursiveMode::NonRecursive) {
                    eprintln!("warning: cannot watch `{}`: {e}", dir.display());
                }
            }
        }
        // Wait for an event touching one of the files we read.
        loop {
            match rx.recv() {
                Ok(Ok(events)) => {
                    let hit = events.iter().flat_map(|e| e.paths.iter()).any(|p| {
                        files.contains(&canonical(p))
                            || files
                                .iter()
                                .any(|f| f.file_name() == p.file_name() && f.parent() == p.parent())
                    });
                    if hit {
                        break;
                    }
                }
                Ok(Err(errs)) => {
                    for e in errs {
                        eprintln!("warning: watch error: {e}");
                    }
                }
                Err(_) => return ExitCode::from(2),
            }
        }
    }
}
