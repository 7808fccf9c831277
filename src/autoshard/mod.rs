//! `shardc shard`: the auto-sharder. It writes a layout into a `.shard` file
//! (mesh axes on dimensions, `shard_params`, `checkpoint: full`, with
//! `--allow-bf16` the precision) chosen by the plan's own step time and peak
//! memory on a device, and says at each decision why: its cost, the
//! runner-up and what it lost by, the choices the checker refuses. What the
//! user wrote is kept as a constraint. The result is checked before it is
//! returned: an unsound layout is never written.
//!
//! [`sites`] finds the decisions, [`search`] chooses, [`reasons`] words them.

pub mod reasons;
pub mod search;
pub mod sites;

use crate::diag::{Diagnostic, Problem};
use crate::files::Files;
use crate::plan::device::Device;
use crate::world::{Compilation, Options};
use search::{Evaluator, Move, Outcome, Planned};
use std::path::{Path, PathBuf};

/// A mesh's axes with their sizes, in the declaration's order.
type Mesh = Vec<(String, i64)>;

/// Spaces of at most this many candidates are enumerated whole.
pub const EXACT: u64 = 256;

/// What `shardc shard` was asked.
pub struct Request<'a> {
    pub files: &'a dyn Files,
    pub path: &'a Path,
    /// The trained model (the first `train`'s when `None`).
    pub model: Option<String>,
    /// `--mesh dp=4,tp=2`: axis sizes replacing the file's.
    pub mesh: Vec<(String, i64)>,
    /// `--devices N`: every factorisation of N over the mesh's axes is tried.
    pub devices: Option<u64>,
    pub device: Device,
    /// Whether the search may set `precision: bf16`.
    pub allow_bf16: bool,
    /// Whether the search may put a `repeat`'s blocks in pipeline stages
    /// (`--pipeline`).
    pub pipeline: bool,
    /// Spaces of at most this many candidates are enumerated whole ([`EXACT`]
    /// by default; `u64::MAX` for `--exhaustive`, 0 to always search).
    pub exact: u64,
    pub grants: Vec<PathBuf>,
}

/// How the search went, for `--explain`.
#[derive(Clone, Debug, Default)]
pub struct Explain {
    /// One line per mesh tried.
    pub meshes: Vec<MeshSearch>,
}

#[derive(Clone, Debug, Default)]
pub struct MeshSearch {
    pub mesh: Vec<(String, i64)>,
    pub decisions: usize,
    /// Candidates in the whole space.
    pub space: u64,
    pub exhaustive: bool,
    /// Single choices the checker refused alone (pruned from the sweeps).
    pub refused: usize,
    /// Moves swept (single choices and pairs).
    pub moves: usize,
    pub compiled: usize,
    pub best: Option<Planned>,
    pub seconds: f64,
}

/// A chosen layout.
pub struct Solution {
    /// The output file, formatted.
    pub text: String,
    pub mesh: Vec<(String, i64)>,
    pub planned: Planned,
    pub explain: Explain,
}

/// Why no layout was written.
pub enum Failure {
    /// The input does not check: its own diagnostics.
    Input(Box<Compilation>),
    /// No layout fits the device (E0700).
    NoFit {
        diagnostic: Box<Diagnostic>,
        compilation: Box<Compilation>,
        explain: Explain,
    },
    /// The chosen layout did not check (a bug: never written).
    Unsound(Box<Compilation>),
    Usage(Usage),
}

/// A request that cannot be served, as data; worded by `Display`.
#[derive(Debug)]
pub enum Usage {
    Unreadable(PathBuf, std::io::Error),
    NoTrain {
        model: Option<String>,
        trained: Vec<String>,
    },
    NoMesh(String),
    UnknownAxis {
        axis: String,
        mesh: String,
        axes: Vec<String>,
    },
    /// `--device` a size only: no throughput to time a step with.
    Untimed(String),
    BadDevices(u64),
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Usage::Unreadable(p, e) => write!(f, "cannot read `{}`: {e}", p.display()),
            Usage::NoTrain { model: Some(m), trained } => write!(
                f,
                "the file trains no model `{m}`{}",
                crate::diag::did_you_mean(m, trained.iter().map(String::as_str))
                    .map_or(String::new(), |s| format!(" (did you mean `{s}`?)"))
            ),
            Usage::NoTrain { model: None, .. } => {
                write!(f, "the file has no `train` declaration: nothing to lay out")
            }
            Usage::NoMesh(m) => write!(f, "the mesh `{m}` of the `train` is not declared"),
            Usage::UnknownAxis { axis, mesh, axes } => write!(
                f,
                "`--mesh` names `{axis}`, but the mesh `{mesh}` has the axes {}",
                axes.iter()
                    .map(|a| format!("`{a}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Usage::Untimed(d) => write!(
                f,
                "`--device {d}` gives a memory size only; the search compares step times: name a device ({})",
                crate::plan::device::names().join(", ")
            ),
            Usage::BadDevices(n) => write!(f, "`--devices {n}`: at least one device"),
        }
    }
}

/// The options of a trial compile on `mesh` (empty: the file's own).
fn trial(req: &Request, mesh: Vec<(String, i64)>) -> Options {
    Options {
        mesh,
        grants: req.grants.clone(),
        trial: true,
        ..Default::default()
    }
}

/// Lines the auto-sharder wrote on an earlier run (replaced on each run).
pub const MARK: &str = "// shard:";

/// Chooses a layout for `req`.
pub fn solve(req: &Request) -> Result<Solution, Failure> {
    let raw = req
        .files
        .read_text(req.path)
        .map_err(|e| Failure::Usage(Usage::Unreadable(req.path.to_path_buf(), e)))?;
    let text: String = raw
        .split_inclusive('\n')
        .filter(|l| !l.trim_start().starts_with(MARK))
        .collect();
    if req.device.f32.is_none() {
        return Err(Failure::Usage(Usage::Untimed(req.device.name.clone())));
    }
    // Candidates differ only in their annotations: every other item (the
    // standard library's layers, the train block) is parsed once.
    crate::reparse::remember();
    let opts = trial(req, req.mesh.clone());
    let c = crate::world::compile_text(req.files, req.path, text.clone(), &opts);
    if c.has_errors() {
        return Err(Failure::Input(Box::new(c)));
    }
    let Some(train) = c.spec.train(req.model.as_deref()) else {
        return Err(Failure::Usage(Usage::NoTrain {
            model: req.model.clone(),
            trained: c.spec.trains.iter().map(|t| t.model.clone()).collect(),
        }));
    };
    let model = train.model.clone();
    let Some(mesh) = c.program.mesh(&train.mesh) else {
        return Err(Failure::Usage(Usage::NoMesh(train.mesh.clone())));
    };
    let axes: Vec<String> = mesh.axes.iter().map(|a| a.0.clone()).collect();
    if let Some((a, _)) = req.mesh.iter().find(|(a, _)| !axes.contains(a)) {
        return Err(Failure::Usage(Usage::UnknownAxis {
            axis: a.clone(),
            mesh: mesh.name.clone(),
            axes,
        }));
    }
    let sizes: Vec<(String, i64)> = mesh.axes.iter().map(|a| (a.0.clone(), a.1)).collect();
    let meshes = match req.devices {
        Some(0) => return Err(Failure::Usage(Usage::BadDevices(0))),
        Some(n) => factorisations(n, &axes),
        None => vec![sizes],
    };
    let root = c.program.root;
    let Some(file) = c
        .program
        .syntax
        .iter()
        .find(|(id, _)| *id == root)
        .map(|(_, f)| f.clone())
    else {
        return Err(Failure::Input(Box::new(c)));
    };
    let train_decl = file.items.iter().find_map(|i| match i {
        crate::ast::Item::Train(t) if t.model.name == model => Some(t),
        _ => None,
    });
    // The batch a step runs, which a pipeline's microbatch counts divide.
    let batch = train.batch.map(|b| (b / train.accumulate.max(1)) as u64);
    // The decisions on each mesh (a pipeline's depend on its sizes).
    let decisions: Vec<(Mesh, Vec<sites::Var>)> = meshes
        .into_iter()
        .map(|m| {
            let staging = sites::Staging { mesh: &m, batch };
            let vars = sites::collect(
                &file,
                &text,
                &model,
                &axes,
                train_decl,
                req.allow_bf16,
                req.pipeline.then_some(&staging),
            );
            (m, vars)
        })
        .collect();
    let mut explain = Explain::default();
    let mut best: Option<(Chosen, Evaluator)> = None;
    for (m, vars) in &decisions {
        let mut o = opts.clone();
        o.mesh = m.clone();
        let ev = Evaluator::new(
            req.files,
            req.path,
            &text,
            vars,
            o,
            req.device.clone(),
            model.clone(),
        );
        let (chosen, ev, searched) = search_mesh(ev, m.clone(), req.exact);
        explain.meshes.push(searched);
        if best
            .as_ref()
            .is_none_or(|b| chosen.outcome.beats(&b.0.outcome))
        {
            best = Some((chosen, ev));
        }
    }
    let Some((best, mut ev)) = best else {
        return Err(Failure::Usage(Usage::BadDevices(req.devices.unwrap_or(0))));
    };
    let vars = ev.vars;
    let Outcome::Planned(planned) = best.outcome.clone() else {
        return Err(Failure::Unsound(Box::new(c)));
    };
    if !planned.fits {
        let d = no_fit(req, &c, &text, vars, &best, &planned, &model);
        return Err(Failure::NoFit {
            diagnostic: Box::new(d),
            compilation: Box::new(c),
            explain,
        });
    }
    let (pick, planned, alts) = polish(&mut ev, best.pick.clone(), planned, &best.moves);
    // `--explain` gives the layout written, after that last pass.
    if let Some(m) = explain.meshes.iter_mut().find(|m| m.mesh == best.mesh) {
        m.best = Some(planned.clone());
    }
    let notes = reasons::comments(&text, vars, &pick, &planned, &alts, &req.device);
    let mesh_edits = if req.mesh.is_empty() && req.devices.is_none() {
        Vec::new()
    } else {
        mesh_text(&file, &train.mesh, &best.mesh, &text)
    };
    let written = sites::write_with(
        &text,
        vars,
        &pick,
        notes.into_iter().chain(mesh_edits).collect(),
    );
    let written = crate::fmt::format(&written);
    // The written file, checked as the user will check it.
    let check = trial(req, Vec::new());
    let again = crate::world::compile_text(req.files, req.path, written.clone(), &check);
    if again.has_errors() {
        return Err(Failure::Unsound(Box::new(again)));
    }
    Ok(Solution {
        text: written,
        mesh: best.mesh,
        planned,
        explain,
    })
}

struct Chosen {
    mesh: Vec<(String, i64)>,
    pick: Vec<usize>,
    moves: Vec<Move>,
    outcome: Outcome,
}

/// The search on one mesh: its choice, the evaluator (whose cache the
/// polish reuses) and what `--explain` says of it.
fn search_mesh<'a>(
    mut ev: Evaluator<'a>,
    mesh: Vec<(String, i64)>,
    exact: u64,
) -> (Chosen, Evaluator<'a>, MeshSearch) {
    let started = std::time::Instant::now();
    let space = search::space(ev.vars);
    let whole = space <= exact;
    let (pick, moves, refused) = if whole {
        (search::exhaustive(&mut ev), Vec::new(), 0)
    } else {
        let (moves, refused) = search::moves(&mut ev);
        (search::descend(&mut ev, &moves), moves, refused)
    };
    let outcome = ev.eval(&pick);
    let searched = MeshSearch {
        mesh: mesh.clone(),
        decisions: ev.vars.len(),
        space,
        exhaustive: whole,
        refused,
        moves: moves.len(),
        compiled: ev.compiled,
        best: outcome.planned().cloned(),
        seconds: started.elapsed().as_secs_f64(),
    };
    let chosen = Chosen {
        mesh,
        pick,
        moves,
        outcome,
    };
    (chosen, ev, searched)
}

/// Every single change and pair move from the choice is what its reasons
/// compare with; one that is better (a choice the checker refused at the
/// start) is taken, and the alternatives are made again.
fn polish(
    ev: &mut Evaluator,
    mut pick: Vec<usize>,
    mut planned: Planned,
    moves: &[Move],
) -> (Vec<usize>, Planned, search::Alternatives) {
    let mut alts = search::alternatives(ev, &pick, moves);
    for _ in 0..8 {
        let here = Outcome::Planned(planned.clone());
        let better = alts.iter().flatten().filter(|(_, o)| o.beats(&here)).fold(
            None::<&(Move, Outcome)>,
            |b, x| match b {
                Some(y) if !x.1.beats(&y.1) => Some(y),
                _ => Some(x),
            },
        );
        let Some((m, Outcome::Planned(p))) = better.cloned() else {
            break;
        };
        for (v, c) in m {
            pick[v] = c;
        }
        planned = p;
        alts = search::alternatives(ev, &pick, moves);
    }
    (pick, planned, alts)
}

/// Every way to give the axes sizes whose product is `n`, the first axis
/// largest first (a fixed order).
fn factorisations(n: u64, axes: &[String]) -> Vec<Vec<(String, i64)>> {
    fn go(n: u64, k: usize, acc: &mut Vec<u64>, out: &mut Vec<Vec<u64>>) {
        if k == 1 {
            acc.push(n);
            out.push(acc.clone());
            acc.pop();
            return;
        }
        for d in (1..=n).rev().filter(|d| n.is_multiple_of(*d)) {
            acc.push(d);
            go(n / d, k - 1, acc, out);
            acc.pop();
        }
    }
    let mut out: Vec<Vec<u64>> = Vec::new();
    if axes.is_empty() {
        return Vec::new();
    }
    go(n, axes.len(), &mut Vec::new(), &mut out);
    out.into_iter()
        .map(|f| {
            axes.iter()
                .cloned()
                .zip(f.into_iter().map(|x| x as i64))
                .collect()
        })
        .collect()
}

/// The mesh declaration's sizes replaced by `mesh`'s (a mesh declared in
/// another file is left as it is: `--mesh` is then needed to run the result).
fn mesh_text(
    file: &crate::ast::File,
    name: &str,
    mesh: &[(String, i64)],
    text: &str,
) -> Vec<(usize, usize, String)> {
    let mut out = Vec::new();
    for item in &file.items {
        let crate::ast::Item::Mesh(m) = item else {
            continue;
        };
        if m.name.name != name {
            continue;
        }
        for (axis, size) in &m.axes {
            if let Some((_, n)) = mesh.iter().find(|(a, _)| *a == axis.name) {
                let r = size.span().range();
                if text.get(r.clone()).is_some() {
                    out.push((r.start, r.end, n.to_string()));
                }
            }
        }
    }
    out
}

/// E0700: the best layout's peak, the smallest named device it fits and the
/// smallest mesh (one axis doubled, again and again) on which it fits.
fn no_fit(
    req: &Request,
    c: &Compilation,
    text: &str,
    vars: &[sites::Var],
    best: &Chosen,
    planned: &Planned,
    model: &str,
) -> Diagnostic {
    let mut smallest_mesh = None;
    let written = sites::write(text, vars, &best.pick);
    'grow: for k in 1..=6u32 {
        for i in 0..best.mesh.len() {
            let mut m = best.mesh.clone();
            m[i].1 <<= k;
            let o = trial(req, m.clone());
            let ev = Evaluator::new(
                req.files,
                req.path,
                text,
                vars,
                o,
                req.device.clone(),
                model.to_string(),
            );
            if let Outcome::Planned(p) = ev.judge(written.clone()) {
                if p.fits {
                    smallest_mesh = Some(m);
                    break 'grow;
                }
            }
        }
    }
    let device = crate::plan::device::names()
        .into_iter()
        .filter_map(|n| crate::plan::device::parse(n).ok())
        .filter(|d| d.memory >= planned.peak)
        .min_by(|a, b| a.memory.total_cmp(&b.memory))
        .map(|d| d.name);
    let span = c
        .spec
        .train(Some(model))
        .map_or(crate::source::Span::new(c.program.root, 0, 0), |t| t.span);
    Problem::NoLayoutFits {
        span,
        model: model.to_string(),
        device: req.device.name.clone(),
        memory: req.device.memory,
        peak: planned.peak,
        mesh: best.mesh.clone(),
        smallest_device: device,
        smallest_mesh,
        bf16: req.allow_bf16,
    }
    .diagnostic()
}
