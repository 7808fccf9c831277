//! The search over layouts. Every candidate is the input file with choices
//! written in, compiled and planned exactly as `shardc check` and `shardc plan
//! --device` do: the checker refuses an unsound one (its first error's code is
//! the reason), the plan gives its step time and peak memory. A candidate
//! fits when every stage's peak is within the device's memory; among those
//! that fit the shortest step wins, among those that do not the smallest peak.
//!
//! Small spaces are enumerated whole. Larger ones are searched from the
//! layout with nothing written: every single choice is tried once (a probe);
//! choices the checker refuses alone are tried in pairs of one axis (`H@tp`
//! needs `KV@tp`); then sweeps over those moves, best probe first, keep every
//! one that improves, until a sweep changes nothing. Single-threaded, in a
//! fixed order, ties kept by the earlier candidate: the same input gives the
//! same layout on any machine.

use super::sites::{Kind, Var};
use crate::diag::Code;
use crate::files::Files;
use crate::plan::device::Device;
use crate::world::Options;
use std::collections::BTreeMap;
use std::path::Path;

/// What the plan says of a candidate that checks.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub step: f64,
    pub compute: f64,
    pub comm: f64,
    /// The largest stage's peak, bytes.
    pub peak: f64,
    pub fits: bool,
}

/// One candidate's fate.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    Planned(Planned),
    /// The checker's first error, or why nothing was planned.
    Refused {
        code: Option<Code>,
        message: String,
    },
}

impl Outcome {
    pub fn planned(&self) -> Option<&Planned> {
        match self {
            Outcome::Planned(p) => Some(p),
            Outcome::Refused { .. } => None,
        }
    }

    /// Whether `self` is strictly better than `other` (by more than rounding).
    pub fn beats(&self, other: &Outcome) -> bool {
        let (Outcome::Planned(a), Some(b)) = (self, other.planned()) else {
            return self.planned().is_some();
        };
        let less = |x: f64, y: f64| x < y * (1.0 - 1e-9);
        match (a.fits, b.fits) {
            (true, false) => true,
            (false, true) => false,
            (true, true) => less(a.step, b.step),
            (false, false) => less(a.peak, b.peak) || (a.peak == b.peak && less(a.step, b.step)),
        }
    }
}

/// Compiles and plans candidates, each once.
pub struct Evaluator<'a> {
    pub files: &'a dyn Files,
    pub path: &'a Path,
    pub text: &'a str,
    pub vars: &'a [Var],
    pub opts: Options,
    pub device: Device,
    pub model: String,
    cache: BTreeMap<Vec<usize>, Outcome>,
    /// Candidates compiled (not counting the cache's answers).
    pub compiled: usize,
}

impl<'a> Evaluator<'a> {
    pub fn new(
        files: &'a dyn Files,
        path: &'a Path,
        text: &'a str,
        vars: &'a [Var],
        opts: Options,
        device: Device,
        model: String,
    ) -> Self {
        Evaluator {
            files,
            path,
            text,
            vars,
            opts,
            device,
            model,
            cache: BTreeMap::new(),
            compiled: 0,
        }
    }

    pub fn eval(&mut self, pick: &[usize]) -> Outcome {
        if let Some(o) = self.cache.get(pick) {
            return o.clone();
        }
        let text = super::sites::write(self.text, self.vars, pick);
        let o = self.judge(text);
        self.compiled += 1;
        self.cache.insert(pick.to_vec(), o.clone());
        o
    }

    /// A written candidate's fate.
    pub fn judge(&self, text: String) -> Outcome {
        let c = crate::world::compile_text(self.files, self.path, text, &self.opts);
        if let Some(d) = c.diagnostics.iter().find(|d| d.is_error()) {
            return Outcome::Refused {
                code: Some(d.code),
                message: d.message.clone(),
            };
        }
        let Some(plan) = c.plans.iter().find(|p| p.model == self.model) else {
            return Outcome::Refused {
                code: None,
                message: format!("`{}` was not planned", self.model),
            };
        };
        let v = crate::plan::device::verdict(plan, self.device.clone());
        let peak = v.peaks.iter().copied().fold(0.0, f64::max);
        Outcome::Planned(Planned {
            step: v.step_seconds.unwrap_or(0.0),
            compute: v.compute_seconds.unwrap_or(0.0),
            comm: v.comm_seconds.unwrap_or(0.0),
            peak,
            fits: v.fits,
        })
    }
}

/// A change of one or more decisions: (decision, choice) pairs.
pub type Move = Vec<(usize, usize)>;

/// For each decision, the other choices (and pair moves) tried from a
/// layout, with their outcomes.
pub type Alternatives = Vec<Vec<(Move, Outcome)>>;

fn apply(pick: &[usize], m: &Move) -> Vec<usize> {
    let mut p = pick.to_vec();
    for &(v, c) in m {
        p[v] = c;
    }
    p
}

/// How many candidates the whole space holds (saturating).
pub fn space(vars: &[Var]) -> u64 {
    vars.iter()
        .fold(1u64, |n, v| n.saturating_mul(v.choices.len() as u64))
}

/// Every candidate, in order; the best.
pub fn exhaustive(ev: &mut Evaluator) -> Vec<usize> {
    let sizes: Vec<usize> = ev.vars.iter().map(|v| v.choices.len()).collect();
    let mut pick = vec![0; sizes.len()];
    let mut best = (pick.clone(), ev.eval(&pick));
    loop {
        // The next candidate, the last decision fastest.
        let mut i = sizes.len();
        loop {
            if i == 0 {
                return best.0;
            }
            i -= 1;
            pick[i] += 1;
            if pick[i] < sizes[i] {
                break;
            }
            pick[i] = 0;
        }
        let o = ev.eval(&pick);
        if o.beats(&best.1) {
            best = (pick.clone(), o);
        }
    }
}

/// The moves the search tries: every single choice the checker takes alone,
/// pairs of one axis the checker takes only together, and each pipeline
/// choice with its `repeat`'s checkpointing; best probe first.
/// Also how many single choices the checker refused alone.
pub fn moves(ev: &mut Evaluator) -> (Vec<Move>, usize) {
    let n = ev.vars.len();
    let start = vec![0; n];
    let mut taken: Vec<(Move, Outcome)> = Vec::new();
    let mut refused: Vec<(usize, usize)> = Vec::new();
    for v in 0..n {
        for c in 1..ev.vars[v].choices.len() {
            let m = vec![(v, c)];
            let o = ev.eval(&apply(&start, &m));
            match o {
                Outcome::Planned(_) => taken.push((m, o)),
                Outcome::Refused { .. } => refused.push((v, c)),
            }
        }
    }
    // A pipeline holds more microbatches in flight than no pipeline: it
    // pays for itself with its stages' blocks recomputed, so each stage
    // choice is also tried with its `repeat`'s checkpointing.
    let staged: Vec<(usize, usize)> = taken
        .iter()
        .filter_map(|(m, _)| m.first().copied())
        .filter(|&(v, _)| ev.vars[v].kind == Kind::Pipeline)
        .collect();
    for (v, c) in staged {
        let at = ev.vars[v].sites.first().map(|s| s.at);
        let Some(k) = (0..n).find(|&k| {
            ev.vars[k].kind == Kind::Checkpoint && ev.vars[k].sites.first().map(|s| s.at) == at
        }) else {
            continue;
        };
        let m = vec![(v, c), (k, 1)];
        let o = ev.eval(&apply(&start, &m));
        if o.planned().is_some() {
            taken.push((m, o));
        }
    }
    for (i, &(v1, c1)) in refused.iter().enumerate() {
        for &(v2, c2) in &refused[i + 1..] {
            let (a, b) = (&ev.vars[v1], &ev.vars[v2]);
            if v1 == v2
                || a.kind != Kind::Dim
                || b.kind != Kind::Dim
                || a.scope != b.scope
                || a.choices[c1].text != b.choices[c2].text
            {
                continue;
            }
            let m = vec![(v1, c1), (v2, c2)];
            let o = ev.eval(&apply(&start, &m));
            if o.planned().is_some() {
                taken.push((m, o));
            }
        }
    }
    // Best probe first; a stable sort keeps the written order among equals.
    let mut ranked: Vec<(usize, Move, Outcome)> = taken
        .into_iter()
        .enumerate()
        .map(|(i, (m, o))| (i, m, o))
        .collect();
    ranked.sort_by(|a, b| {
        if a.2.beats(&b.2) {
            std::cmp::Ordering::Less
        } else if b.2.beats(&a.2) {
            std::cmp::Ordering::Greater
        } else {
            a.0.cmp(&b.0)
        }
    });
    let pruned = refused.len();
    (ranked.into_iter().map(|(_, m, _)| m).collect(), pruned)
}

/// Sweeps over `moves`, keeping every improvement: from nothing written in
/// the order given (best probe first); and for each choice of the model's
/// input dimensions (data parallelism over which axes), from that choice in
/// the written order. The best result.
pub fn descend(ev: &mut Evaluator, moves: &[Move]) -> Vec<usize> {
    let n = ev.vars.len();
    let mut written = moves.to_vec();
    written.sort_by_key(|m| m.first().map_or(0, |x| x.0));
    let mut best = sweeps(ev, vec![0; n], moves);
    let mut best_o = ev.eval(&best);
    for v in (0..n).filter(|&v| ev.vars[v].input) {
        // Nothing on it is where the first sweeps began.
        for c in 1..ev.vars[v].choices.len() {
            let mut start = vec![0; n];
            start[v] = c;
            if ev.eval(&start).planned().is_none() {
                continue;
            }
            let rest: Vec<Move> = written
                .iter()
                .filter(|m| m.iter().all(|x| x.0 != v))
                .cloned()
                .collect();
            let pick = sweeps(ev, start, &rest);
            let o = ev.eval(&pick);
            if o.beats(&best_o) {
                best = pick;
                best_o = o;
            }
        }
    }
    best
}

fn sweeps(ev: &mut Evaluator, start: Vec<usize>, moves: &[Move]) -> Vec<usize> {
    let mut pick = start;
    let mut now = ev.eval(&pick);
    for _ in 0..16 {
        let mut changed = false;
        for m in moves {
            let cand = apply(&pick, m);
            if cand == pick {
                continue;
            }
            let o = ev.eval(&cand);
            if o.beats(&now) {
                pick = cand;
                now = o;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    pick
}

/// For each decision, every other choice (and each pair move that changes
/// it) with the rest as chosen: what the reasons compare with.
pub fn alternatives(ev: &mut Evaluator, best: &[usize], moves: &[Move]) -> Alternatives {
    let mut out = Vec::new();
    for v in 0..ev.vars.len() {
        let mut alts = Vec::new();
        for c in 0..ev.vars[v].choices.len() {
            if c == best[v] {
                continue;
            }
            let m = vec![(v, c)];
            let o = ev.eval(&apply(best, &m));
            alts.push((m, o));
        }
        for m in moves
            .iter()
            .filter(|m| m.len() > 1 && m.iter().any(|x| x.0 == v))
        {
            let cand = apply(best, m);
            if cand == best {
                // Undoing the pair: each of its decisions back to nothing.
                let undo: Move = m.iter().map(|&(w, _)| (w, 0)).collect();
                let o = ev.eval(&apply(best, &undo));
                alts.push((undo, o));
                continue;
            }
            let o = ev.eval(&cand);
            alts.push((m.clone(), o));
        }
        out.push(alts);
    }
    out
}
