//! A schedule file: a user's own pipeline schedule in torchtitan's CSV
//! layout, read and verified before anything runs. Each row is a rank, each
//! column a time step; a cell is `STAGE` `PASS` `MICROBATCH` — `0F3` the
//! forward of microbatch 3 through piece 0, `B` the whole backward, `I` and
//! `W` its input- and weight-gradient halves — or empty (idle). Blank lines
//! and lines starting with `#` are skipped. A piece lives on the rank whose
//! row lists most of its passes. Every problem is a diagnostic that points at its cell:
//! unreadable cells and a shape that does not fit the stack (E0232), and
//! what [`super::verify`] rejects — a pass missing, twice or on the wrong
//! rank, a deadlock, messages taken out of order (E0233).

use super::data::{Action, Pass, Schedule};
use super::verify::{verify, ScheduleError};
use crate::diag::{Problem, ScheduleFileProblem};
use crate::source::{FileId, Span};
use std::collections::HashMap;

/// What the stack asks of the file.
pub struct Stack<'a> {
    /// Ranks on the stage axis, and its name.
    pub ranks: usize,
    pub axis: &'a str,
    pub microbatches: usize,
    /// Repetitions in the stack.
    pub layers: usize,
    /// The `schedule: "..."` in the `.shard` file.
    pub span: Span,
}

/// The cells of a parsed file: each rank's passes, with where each is.
struct Cells {
    orders: Vec<Vec<Action>>,
    /// Where each rank lists each pass (twice or more when it repeats it).
    at: HashMap<(usize, Action), Vec<Span>>,
}

/// Read `text` (file `file`) as a schedule for `stack`: the schedule, or the
/// problems found (each with its span).
pub fn read(file: FileId, text: &str, stack: &Stack) -> Result<Schedule, Vec<Problem>> {
    let cells = parse(file, text, stack)?;
    let whole = Span::new(file, 0, text.len().min(1 << 20));
    let stages = cells
        .orders
        .iter()
        .flatten()
        .map(|a| a.stage + 1)
        .max()
        .unwrap_or(0);
    // A piece lives on the rank listing most of its passes (the lowest of
    // those tied): a stray pass elsewhere is then on the wrong rank.
    let mut count = vec![vec![0usize; cells.orders.len()]; stages];
    for (r, order) in cells.orders.iter().enumerate() {
        for a in order {
            count[a.stage][r] += 1;
        }
    }
    let placement: Vec<usize> = count
        .iter()
        .map(|c| {
            let most = c.iter().copied().max().unwrap_or(0);
            match most {
                0 => usize::MAX,
                _ => c.iter().position(|n| *n == most).unwrap_or(usize::MAX),
            }
        })
        .collect();
    let problem = |problem| Problem::ScheduleFile {
        span: whole,
        problem,
    };
    if let Some(k) = placement.iter().position(|r| *r == usize::MAX) {
        return Err(vec![problem(ScheduleFileProblem::StageNowhere {
            stage: k,
            stages,
        })]);
    }
    if stages == 0 || !stack.layers.is_multiple_of(stages) {
        return Err(vec![Problem::ScheduleFile {
            span: stack.span,
            problem: ScheduleFileProblem::Layers {
                stages,
                layers: stack.layers,
            },
        }]);
    }
    let schedule = Schedule {
        name: "file".into(),
        ranks: stack.ranks,
        microbatches: stack.microbatches,
        placement,
        orders: cells.orders,
    };
    match verify(&schedule) {
        Ok(_) => Ok(schedule),
        Err(e) => Err(vec![unsound(&e, &cells.at, stack.span)]),
    }
}

/// A cell as the file writes it: `1I3`.
fn cell(a: Action) -> String {
    format!("{}{:?}{}", a.stage, a.pass, a.mb)
}

/// The verifier's objection, at the cell it names.
fn unsound(e: &ScheduleError, at: &HashMap<(usize, Action), Vec<Span>>, stack: Span) -> Problem {
    let first = |rank: usize, a: Action| at.get(&(rank, a)).and_then(|v| v.first()).copied();
    let here = |rank: usize, a: Action| first(rank, a).unwrap_or(stack);
    let last = |rank: usize, a: Action| {
        at.get(&(rank, a))
            .and_then(|v| v.last())
            .copied()
            .unwrap_or(stack)
    };
    // Where a pass is listed, on whichever rank.
    let anywhere = |a: Action| {
        at.iter()
            .filter(|((_, b), _)| *b == a)
            .filter_map(|(_, v)| v.first().copied())
            .min_by_key(|s| s.start)
            .unwrap_or(stack)
    };
    let (span, problem) = match e {
        ScheduleError::Shape(s) => (stack, ScheduleFileProblem::Shape(s.clone())),
        ScheduleError::WrongRank { rank, action } => (
            here(*rank, *action),
            ScheduleFileProblem::WrongRank {
                rank: *rank,
                cell: cell(*action),
            },
        ),
        ScheduleError::Twice { rank, action } => (
            last(*rank, *action),
            ScheduleFileProblem::Twice {
                rank: *rank,
                cell: cell(*action),
            },
        ),
        ScheduleError::Missing { action } => (
            stack,
            ScheduleFileProblem::Missing {
                cell: cell(*action),
            },
        ),
        ScheduleError::Mixed { action } => (
            anywhere(*action),
            ScheduleFileProblem::Mixed {
                cell: cell(*action),
            },
        ),
        ScheduleError::Deadlock {
            rank,
            tick,
            action,
            waits_for,
        } => (
            here(*rank, *action),
            ScheduleFileProblem::Deadlock {
                rank: *rank,
                tick: *tick,
                cell: cell(*action),
                waits_for: cell(*waits_for),
            },
        ),
        ScheduleError::Order {
            from,
            to,
            index,
            sent,
            taken,
        } => (
            here(*from, *sent),
            ScheduleFileProblem::Order {
                from: *from,
                to: *to,
                index: *index,
                sent: cell(*sent),
                taken: cell(*taken),
            },
        ),
    };
    Problem::ScheduleUnsound { span, problem }
}

/// The rows and cells, each checked on its own: a cell that is not a pass,
/// a microbatch beyond the stack's, a row count that is not the ranks.
fn parse(file: FileId, text: &str, stack: &Stack) -> Result<Cells, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut cells = Cells {
        orders: Vec::new(),
        at: HashMap::new(),
    };
    let mut offset = 0usize;
    for line in text.split_inclusive('\n') {
        let start = offset;
        offset += line.len();
        let body = line.trim_end_matches(['\n', '\r']);
        if body.trim().is_empty() || body.trim_start().starts_with('#') {
            continue;
        }
        let rank = cells.orders.len();
        let mut order = Vec::new();
        let mut col = start;
        for raw in body.split(',') {
            let lead = raw.len() - raw.trim_start().len();
            let text = raw.trim();
            let span = Span::new(file, col + lead, col + lead + text.len());
            col += raw.len() + 1;
            if text.is_empty() {
                continue;
            }
            let problem = match action(text) {
                // At most a piece per layer.
                Some(a) if a.stage >= stack.layers => ScheduleFileProblem::Piece {
                    cell: text.to_string(),
                    stage: a.stage,
                    layers: stack.layers,
                },
                Some(a) if a.mb < stack.microbatches => {
                    order.push(a);
                    cells.at.entry((rank, a)).or_default().push(span);
                    continue;
                }
                Some(a) => ScheduleFileProblem::Microbatch {
                    cell: text.to_string(),
                    mb: a.mb,
                    microbatches: stack.microbatches,
                },
                None => ScheduleFileProblem::Cell(text.to_string()),
            };
            problems.push(Problem::ScheduleFile { span, problem });
        }
        cells.orders.push(order);
    }
    if cells.orders.len() != stack.ranks {
        problems.push(Problem::ScheduleFile {
            span: stack.span,
            problem: ScheduleFileProblem::Ranks {
                rows: cells.orders.len(),
                ranks: stack.ranks,
                axis: stack.axis.to_string(),
            },
        });
    }
    if problems.is_empty() {
        Ok(cells)
    } else {
        Err(problems)
    }
}

/// `0F3`, `12W0`: stage digits, one pass letter, microbatch digits.
fn action(text: &str) -> Option<Action> {
    let letter = text.find(|c: char| !c.is_ascii_digit())?;
    let (stage, rest) = text.split_at(letter);
    let mut chars = rest.chars();
    let pass = match chars.next()? {
        'F' => Pass::F,
        'B' => Pass::B,
        'I' => Pass::I,
        'W' => Pass::W,
        _ => return None,
    };
    let mb = chars.as_str();
    if stage.is_empty() || mb.is_empty() || !mb.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Action {
        pass,
        mb: mb.parse().ok()?,
        stage: stage.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_parse_as_torchtitan_writes_them() {
        let a = |pass, stage, mb| Some(Action { pass, mb, stage });
        assert_eq!(action("0F3"), a(Pass::F, 0, 3));
        assert_eq!(action("12W10"), a(Pass::W, 12, 10));
        assert_eq!(action("1I0"), a(Pass::I, 1, 0));
        for bad in ["F3", "0F", "0X3", "0F3x", "0SEND_F3", "-1F0", "0F-1"] {
            assert_eq!(action(bad), None, "{bad}");
        }
    }
}
