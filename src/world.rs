//! The single entry point of the compiler: the CLI, `watch`, the tests and the
//! editor server all call [`compile`]. There is no second path.

use crate::check::{Checked, Checker};
use crate::diag::Diagnostic;
use crate::resolve::{Loader, Program};
use crate::source::{SourceFile, SourceMap};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Every collective must be written explicitly (also `pragma strict`).
    pub strict: bool,
    /// `--mesh dp=4,mp=2`: axis sizes that replace the file's (the checker re-validates).
    pub mesh: Vec<(String, i64)>,
    /// `--data PATH`: an array file that replaces every `train`'s `data:` source.
    pub data: Option<PathBuf>,
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
}

impl Compilation {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(|d| d.is_error())
    }
    pub fn errors(&self) -> usize {
        self.diagnostics.iter().filter(|d| d.is_error()).count()
    }
}

/// Compile a file from disk. Only an unreadable root file is an `Err`.
pub fn compile(path: &Path, opts: &Options) -> std::io::Result<Compilation> {
    let text = std::fs::read_to_string(path)?;
    Ok(compile_source(path, text, opts))
}

/// Compile source text as if it were the file at `path` (imports resolve next to it).
pub fn compile_source(path: &Path, text: String, opts: &Options) -> Compilation {
    let mut sources = SourceMap::default();
    let mut diagnostics = Vec::new();
    let name = display_name(path);
    let root = sources.add(SourceFile::new(path.to_path_buf(), name, text));
    let mut loader = Loader::new(&mut sources, &mut diagnostics);
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
    let (diags, checked) = Checker::new(&program, &spec, opts.strict).run();
    diagnostics.extend(diags);
    let lowered: Vec<crate::spmd::Program> = checked
        .models
        .iter()
        .map(|m| crate::lower::lower(m, &checked.bodies))
        .collect();
    let clean = !diagnostics.iter().any(|d| d.is_error());
    let plans = lowered
        .iter()
        .filter(|_| clean)
        .filter_map(|p| {
            let t = spec.train(Some(&p.model))?;
            Some(crate::plan::of(p, t, &spec, &sources))
        })
        .collect();
    let programs: Vec<crate::spmd::Program> =
        lowered.into_iter().filter(|p| p.folds.is_empty()).collect();
    let (diags, data, mut data_read) = crate::data::check(&spec, &programs, opts.data.as_deref());
    diagnostics.extend(diags);
    read.append(&mut data_read);
    // Stable order: by file, then position, errors before notes at the same place.
    diagnostics.sort_by_key(|d| (d.primary.span.file, d.primary.span.start, d.severity));
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
    }
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
