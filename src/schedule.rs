//! Pipeline schedules: which pass of which microbatch each rank runs, in
//! which order, for every schedule in the registry
//! ([`crate::vocab::PIPELINE_SCHEDULES`]: GPipe, 1F1B, interleaved 1F1B,
//! ZB-H1, ZBV). A schedule is data ([`data::Schedule`]); [`verify`] checks it
//! and times it; the plan counts the bubble and each rank's activations from
//! it, and the runtime runs each rank's list as it is.

use crate::vocab::Pipe;

pub mod data;
pub mod verify;

pub mod file;

pub use data::{Action, GenError, Pass, Schedule};

/// What a pipelined stack runs: a built-in schedule with its pieces per
/// rank, or a schedule file (torchtitan's CSV layout, [`file`]), read and
/// verified after lowering.
#[derive(Clone, Debug, PartialEq)]
pub enum Source {
    Built {
        pipe: Pipe,
        chunks: usize,
    },
    File {
        /// As the `.shard` file writes it, and where.
        written: String,
        span: crate::source::Span,
        /// Once read and verified (`None`: not yet, or it failed).
        schedule: Option<Box<Schedule>>,
    },
}

impl Default for Source {
    fn default() -> Source {
        Source::Built {
            pipe: Pipe::default(),
            chunks: 1,
        }
    }
}

impl Source {
    /// Pieces of the stack: ranks × chunks, or the file's stages.
    pub fn pieces(&self, ranks: usize) -> usize {
        match self {
            Source::Built { chunks, .. } => ranks.max(1) * chunks.max(&1),
            Source::File {
                schedule: Some(s), ..
            } => s.stages(),
            Source::File { .. } => ranks.max(1),
        }
    }

    /// The rank each piece lives on.
    pub fn placement(&self, ranks: usize) -> Vec<usize> {
        match self {
            Source::Built { pipe, chunks } => placement(*pipe, ranks, *chunks),
            Source::File {
                schedule: Some(s), ..
            } => s.placement.clone(),
            Source::File { .. } => (0..ranks.max(1)).collect(),
        }
    }

    /// The schedule for `ranks` ranks and `m` microbatches (forwards alone
    /// when not `train`).
    pub fn make(&self, ranks: usize, m: usize, train: bool) -> Result<Schedule, GenError> {
        match self {
            Source::Built { pipe, chunks } => make(*pipe, ranks, *chunks, m, train),
            Source::File {
                schedule: Some(s), ..
            } => Ok(passes_for((**s).clone(), train)),
            Source::File { .. } => Err(GenError::Empty),
        }
    }

    /// As `shardc plan` names it.
    pub fn label(&self) -> String {
        match self {
            Source::Built { pipe, .. } => pipe.label().to_string(),
            Source::File { written, .. } => format!("`{written}`"),
        }
    }

    /// As `--json` names it: the registry's word, or the file as written.
    pub fn name(&self) -> String {
        match self {
            Source::Built { pipe, .. } => pipe.name().to_string(),
            Source::File { written, .. } => written.clone(),
        }
    }

    /// Pieces per rank, when every rank holds as many.
    pub fn chunks(&self, ranks: usize) -> usize {
        self.pieces(ranks) / ranks.max(1)
    }

    /// Whether backwards run split into input- and weight-gradient passes.
    pub fn splits_backward(&self) -> bool {
        match self {
            Source::Built { pipe, .. } => pipe.splits_backward(),
            Source::File { schedule, .. } => schedule
                .as_ref()
                .is_some_and(|s| s.orders.iter().flatten().any(|a| a.pass == Pass::I)),
        }
    }
}

/// The rank each virtual stage lives on: in order (one chunk per rank),
/// round-robin (interleaved), or a V (ZBV).
pub fn placement(pipe: Pipe, ranks: usize, chunks: usize) -> Vec<usize> {
    let ranks = ranks.max(1);
    match pipe {
        Pipe::Zbv => (0..2 * ranks)
            .map(|s| if s < ranks { s } else { 2 * ranks - 1 - s })
            .collect(),
        Pipe::GPipe | Pipe::OneFOneB | Pipe::ZbH1 | Pipe::Interleaved => {
            (0..ranks * chunks.max(1)).map(|s| s % ranks).collect()
        }
    }
}

/// The schedule `pipe` makes for `ranks` ranks, `chunks` virtual stages per
/// rank and `m` microbatches; evaluation (`train` false) runs its forwards
/// alone, in the same order.
pub fn make(
    pipe: Pipe,
    ranks: usize,
    chunks: usize,
    m: usize,
    train: bool,
) -> Result<Schedule, GenError> {
    let s = match pipe {
        Pipe::GPipe => Schedule::gpipe(ranks, m),
        Pipe::OneFOneB => Schedule::one_f_one_b(ranks, m),
        Pipe::Interleaved => Schedule::interleaved(ranks, chunks, m),
        Pipe::ZbH1 => Schedule::zb_h1(ranks, m),
        Pipe::Zbv => Schedule::zbv(ranks, m),
    }?;
    Ok(passes_for(s, train))
}

/// The passes a step runs: all of them training; the forwards alone, in the
/// same order, evaluating.
fn passes_for(mut s: Schedule, train: bool) -> Schedule {
    if !train {
        for o in &mut s.orders {
            o.retain(|a| a.pass == Pass::F);
        }
    }
    s
}

/// The most a rank's held activations weigh at once, running `order`: a
/// forward keeps its stage's `weight`, the backward (or its weight-gradient
/// half, which reads them last) frees it. It follows from the rank's own
/// order, whatever the timing.
pub fn held_peak(order: &[Action], weight: &dyn Fn(usize) -> f64) -> f64 {
    let (mut live, mut most) = (0.0f64, 0.0f64);
    for a in order {
        match a.pass {
            Pass::F => {
                live += weight(a.stage);
                most = most.max(live);
            }
            Pass::B | Pass::W => live -= weight(a.stage),
            Pass::I => {}
        }
    }
    most
}

/// The timeline as text: one row per rank, a cell per time unit (`F3` the
/// forward of microbatch 3, `B`, `I` and `W` the backward whole or its
/// halves, a letter after the microbatch the rank's chunk when it holds
/// more than one; `··` idle).
pub fn draw(s: &Schedule, ticks: &[Vec<Option<Action>>]) -> String {
    let chunk = |a: &Action| {
        let mine: Vec<usize> = (0..s.stages())
            .filter(|k| s.placement[*k] == s.placement[a.stage])
            .collect();
        match mine.len() {
            0 | 1 => String::new(),
            _ => {
                let c = mine.iter().position(|k| *k == a.stage).unwrap_or(0);
                char::from(b'a' + (c % 26) as u8).to_string()
            }
        }
    };
    let label = |a: &Action| format!("{:?}{}{}", a.pass, a.mb, chunk(a));
    let w = ticks
        .iter()
        .flatten()
        .flatten()
        .map(|a| label(a).len())
        .max()
        .unwrap_or(2);
    let mut out = String::new();
    for r in 0..s.ranks {
        out.push_str(&format!("  rank {r:<3} "));
        for row in ticks {
            let cell = match row.get(r).copied().flatten() {
                Some(a) => label(&a),
                None => "·".repeat(w),
            };
            out.push_str(&format!("{cell:<w$} "));
        }
        out.push('\n');
    }
    out
}
