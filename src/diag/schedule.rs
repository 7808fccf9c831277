//! A pipeline schedule's problems (E0231 what a built-in schedule needs of
//! its stack, E0232 and E0233 a schedule file that cannot be read or run)
//! and their wording: the schedule verifier's vocabulary, kept apart from
//! the rest of [`super::problem`].

use super::{Code, Diagnostic, Label};
use crate::source::Span;

/// Why a pipelined stack cannot run its schedule (E0231).
#[derive(Clone, Debug, PartialEq)]
pub enum ScheduleProblem {
    /// `chunks:` given to a schedule that fixes its own (`fixed`).
    Chunks {
        /// The schedule as `shardc plan` names it (GPipe, ZBV, ...).
        schedule: &'static str,
        chunks: i64,
        fixed: usize,
    },
    /// The repetitions do not split into stages × chunks pieces.
    Layers {
        layers: u64,
        stages: usize,
        chunks: usize,
        axis: String,
    },
    /// The microbatches are not a multiple of the stages.
    Microbatches {
        /// The schedule as `shardc plan` names it (GPipe, ZBV, ...).
        schedule: &'static str,
        microbatches: usize,
        stages: usize,
    },
    /// A checkpointed stack under a schedule that splits the backward.
    Checkpointed { schedule: String },
    /// `chunks:` beside a schedule file.
    FileChunks { chunks: i64 },
}

/// What is wrong with a schedule file (E0232: reading it; E0233: what the
/// verifier refuses). Passes are written as the file writes them (`1I3`).
#[derive(Clone, Debug, PartialEq)]
pub enum ScheduleFileProblem {
    /// The file cannot be read (why).
    Unreadable(String),
    /// A cell that is not STAGE, F/B/I/W, MICROBATCH.
    Cell(String),
    /// A microbatch the stack does not have.
    Microbatch {
        cell: String,
        mb: usize,
        microbatches: usize,
    },
    /// A piece beyond the stack's layers (at most a piece per layer).
    Piece {
        cell: String,
        stage: usize,
        layers: usize,
    },
    /// Not one row per rank of the stage axis.
    Ranks {
        rows: usize,
        ranks: usize,
        axis: String,
    },
    /// A piece below the highest that no row lists.
    StageNowhere {
        stage: usize,
        stages: usize,
    },
    /// The file's pieces do not divide the stack's layers.
    Layers {
        stages: usize,
        layers: usize,
    },
    /// The verifier's shape check (why).
    Shape(String),
    WrongRank {
        rank: usize,
        cell: String,
    },
    Twice {
        rank: usize,
        cell: String,
    },
    Missing {
        cell: String,
    },
    Mixed {
        cell: String,
    },
    Deadlock {
        rank: usize,
        tick: usize,
        cell: String,
        waits_for: String,
    },
    Order {
        from: usize,
        to: usize,
        index: usize,
        sent: String,
        taken: String,
    },
}

/// E0231: what a schedule needs of its stack, and the nearest thing that fits.
pub(super) fn schedule_problem(span: Span, problem: &ScheduleProblem) -> Diagnostic {
    let d = |msg: String, label: String| Diagnostic::new(Code::E0231, msg, Label::new(span, label));
    match problem {
        ScheduleProblem::Chunks { schedule, chunks, fixed } => d(
            format!("`chunks: {chunks}` for the {schedule} schedule, which places {fixed} piece(s) of the stack on each rank"),
            "not for this schedule".into(),
        )
        .note("only `schedule: interleaved` takes a number of chunks")
        .help("remove `chunks`, or use `schedule: interleaved`"),
        ScheduleProblem::Layers { layers, stages, chunks, axis } => {
            let pieces = stages * chunks;
            let lower = (*layers as usize / pieces) * pieces;
            let upper = lower + pieces;
            let near = if lower > 0 { format!("{lower} or {upper}") } else { upper.to_string() };
            d(
                format!("{layers} repeated layers cannot be cut into {stages} stages over `{axis}` × {chunks} chunks ({pieces} equal pieces)"),
                format!("{layers} is not a multiple of {pieces}"),
            )
            .help(format!("use a layer count that is a multiple of {pieces} (e.g. {near}), or fewer chunks"))
        }
        ScheduleProblem::Microbatches { schedule, microbatches, stages } => {
            let up = microbatches.div_ceil(*stages).max(1) * stages;
            d(
                format!("the {schedule} schedule runs microbatches in groups of the {stages} stages, and {microbatches} is not a multiple of {stages}"),
                format!("{microbatches} microbatches"),
            )
            .help(format!("use {up} microbatches (the batch must divide into them too)"))
            .fix(span, up.to_string())
        }
        ScheduleProblem::FileChunks { chunks } => d(
            format!("`chunks: {chunks}` beside a schedule file"),
            "not for a file".into(),
        )
        .note("a schedule file's piece numbers say how many pieces each rank holds")
        .help("remove `chunks`"),
        ScheduleProblem::Checkpointed { schedule } => d(
            format!("the {schedule} schedule splits each backward into input- and weight-gradient passes, which a checkpointed stack does not run yet"),
            "checkpointed and split".into(),
        )
        .help("use `schedule: one_f_one_b` or `interleaved` with checkpointing, or drop `checkpoint` from this stack"),
    }
}

/// E0232 and E0233: a schedule file's problem, at its cell when it has one.
pub(super) fn schedule_file(span: Span, problem: &ScheduleFileProblem) -> Diagnostic {
    use ScheduleFileProblem as P;
    let read =
        |msg: String, label: &str| Diagnostic::new(Code::E0232, msg, Label::new(span, label));
    let run = |msg: String, label: &str| Diagnostic::new(Code::E0233, msg, Label::new(span, label));
    let cells = "a cell is the piece, the pass (F forward, B backward, I and W its input- and weight-gradient halves) and the microbatch: `0F3`; an empty cell is idle";
    match problem {
        P::Unreadable(why) => read(format!("cannot read the schedule file: {why}"), "named here")
            .help("give a path relative to this `.shard` file"),
        P::Cell(c) => read(format!("`{c}` is not a pass"), "not STAGE PASS MICROBATCH")
            .note(cells)
            .help("write the pass as torchtitan's CSV does, e.g. `0F3`, `1I3`, `1W3`"),
        P::Microbatch { cell, mb, microbatches } => read(format!("`{cell}` names microbatch {mb}, but the stack runs {microbatches} (0 to {})", microbatches.saturating_sub(1)), "no such microbatch")
            .help(format!("number the microbatches from 0 to {}, or set `microbatches: {}`", microbatches.saturating_sub(1), mb + 1)),
        P::Piece { cell, stage, layers } => read(format!("`{cell}` names piece {stage}, but the stack's {layers} layers make at most {layers} pieces"), "no such piece")
            .help(format!("number the pieces from 0, at most {}", layers.saturating_sub(1))),
        P::Ranks { rows, ranks, axis } => read(format!("the schedule file has {rows} row(s), one per rank, but `{axis}` has {ranks}"), "read from here")
            .help(format!("write one row per rank of `{axis}` ({ranks})")),
        P::StageNowhere { stage, stages } => read(format!("the file lists pieces up to {} but never piece {stage}", stages - 1), "in this file")
            .help(format!("list piece {stage}'s passes on the rank that holds it")),
        P::Layers { stages, layers } => read(format!("the file cuts the stack into {stages} pieces, which do not divide its {layers} layers"), "this schedule")
            .help(format!("use a number of pieces that divides {layers}")),
        P::Shape(why) => run(format!("the schedule does not fit the stack: {why}"), "this schedule"),
        P::WrongRank { rank, cell } => run(format!("rank {rank} lists `{cell}`, a piece another rank holds"), "on the wrong rank")
            .note("a piece lives on the rank whose row lists most of its passes")
            .help(format!("move `{cell}` to the row of the rank that holds its piece")),
        P::Twice { rank, cell } => run(format!("rank {rank} lists `{cell}` twice"), "the second time")
            .help(format!("remove one `{cell}`")),
        P::Missing { cell } => run(format!("no rank runs `{cell}`"), "this schedule")
            .note("every microbatch needs a forward and a backward (whole, or both halves) through every piece")
            .help(format!("add `{cell}` to the row of the rank that holds its piece, after what it needs")),
        P::Mixed { cell } => run(format!("`{cell}` is a whole backward, but the schedule splits others into `I` and `W`"), "whole")
            .help(format!("give every backward whole (`B`) or every one as its two halves (`I`, `W`): here `{}` and `{}`", cell.replacen('B', "I", 1), cell.replacen('B', "W", 1))),
        P::Deadlock { rank, tick, cell, waits_for } => run(format!("deadlock at time {tick}: rank {rank}'s next pass `{cell}` waits for `{waits_for}`, which cannot come"), "waits forever")
            .note("each rank runs its row in order; a pass waits for the passes it needs, on any rank")
            .help(format!("move `{waits_for}` before `{cell}`, or `{cell}` later in its row")),
        P::Order { from, to, index, sent, taken } => run(format!("rank {from} sends its message #{index} to rank {to} for `{sent}`, but rank {to} takes `{taken}` then"), "sent out of order")
            .note("two ranks must pass their messages in the same order")
            .help(format!("swap the passes so that rank {to} takes `{sent}` first")),
    }
}
