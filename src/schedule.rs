//! Pipeline schedules (GPipe, 1F1B) as lockstep timelines: what each stage
//! does at each tick, how many microbatches' activations a stage holds at once,
//! and the idle share. The plan counts memory and the bubble from them, and
//! the runtime runs them. The schedules' names and docs are the registry's
//! ([`crate::vocab::PIPELINE_SCHEDULES`]); each stage's order comes from the
//! schedule as data ([`data`]), whose generators also make interleaved 1F1B,
//! ZB-H1 and ZBV and whose static check ([`verify`]) every schedule passes
//! (those three are not run yet: the runtime's stages hold one chunk each and
//! run the backward whole).

use crate::vocab::Pipe;

pub mod data;
pub mod verify;

/// One unit of work: the forward or the backward of microbatch `m` on a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    F(usize),
    B(usize),
}

/// Each stage's order of work under a schedule (`None`: evaluation, forwards
/// only): the stage's list of the schedule as data ([`data::Schedule`]).
pub fn order(schedule: Option<Pipe>, stages: usize, stage: usize, m: usize) -> Vec<Act> {
    let made = match schedule {
        None => return (0..m).map(Act::F).collect(),
        Some(Pipe::OneFOneB) => data::Schedule::one_f_one_b(stages, m),
        Some(Pipe::GPipe) => data::Schedule::gpipe(stages, m),
    };
    made.ok()
        .and_then(|s| s.orders.into_iter().nth(stage))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|a| match a.pass {
            data::Pass::F => Some(Act::F(a.mb)),
            data::Pass::B => Some(Act::B(a.mb)),
            // GPipe and 1F1B do not split the backward.
            data::Pass::I | data::Pass::W => None,
        })
        .collect()
}

/// The lockstep timeline: per tick, what each stage does (`None`: idle). A stage
/// starts its next unit as soon as what it needs arrived in an earlier tick.
/// `schedule` `None` is evaluation: forwards only.
pub fn timeline(schedule: Option<Pipe>, stages: usize, m: usize) -> Vec<Vec<Option<Act>>> {
    let orders: Vec<Vec<Act>> = (0..stages).map(|s| order(schedule, stages, s, m)).collect();
    let mut next = vec![0usize; stages];
    let mut f_done = vec![vec![usize::MAX; m]; stages];
    let mut b_done = vec![vec![usize::MAX; m]; stages];
    let mut ticks = Vec::new();
    let total: usize = orders.iter().map(Vec::len).sum();
    let mut done = 0;
    let mut t = 0usize;
    while done < total && t < 4 * (m + stages) + 8 {
        let mut row = vec![None; stages];
        for s in 0..stages {
            let Some(&a) = orders[s].get(next[s]) else {
                continue;
            };
            let ready = match a {
                Act::F(k) => s == 0 || f_done[s - 1][k] < t,
                Act::B(k) => f_done[s][k] < t && (s + 1 == stages || b_done[s + 1][k] < t),
            };
            if ready {
                row[s] = Some(a);
            }
        }
        for (s, a) in row.iter().enumerate() {
            match a {
                Some(Act::F(k)) => f_done[s][*k] = t,
                Some(Act::B(k)) => b_done[s][*k] = t,
                None => continue,
            }
            next[s] += 1;
            done += 1;
        }
        ticks.push(row);
        t += 1;
    }
    ticks
}

/// The most microbatches whose activations stage `s` holds at once.
pub fn in_flight(ticks: &[Vec<Option<Act>>], s: usize) -> usize {
    let (mut live, mut most) = (0usize, 0usize);
    for row in ticks {
        match row.get(s).copied().flatten() {
            Some(Act::F(_)) => {
                live += 1;
                most = most.max(live);
            }
            Some(Act::B(_)) => live = live.saturating_sub(1),
            None => {}
        }
    }
    most
}

/// Idle share of the timeline.
pub fn bubble(ticks: &[Vec<Option<Act>>]) -> f64 {
    let slots: usize = ticks.iter().map(Vec::len).sum();
    let idle = ticks.iter().flatten().filter(|a| a.is_none()).count();
    idle as f64 / slots.max(1) as f64
}

/// The timeline as text: one row per stage, `F3`/`B3` per tick, `··` idle.
pub fn draw(ticks: &[Vec<Option<Act>>]) -> String {
    let stages = ticks.first().map_or(0, Vec::len);
    // Cells as wide as the widest label (`F15`) and one space, so that labels
    // of 10 microbatches or more do not run together.
    let most = ticks
        .iter()
        .flatten()
        .flatten()
        .map(|a| match a {
            Act::F(k) | Act::B(k) => *k,
        })
        .max()
        .unwrap_or(0);
    let w = 1 + most.to_string().len();
    let mut out = String::new();
    for s in 0..stages {
        out.push_str(&format!("  stage {s:<2} "));
        for row in ticks {
            let cell = match row.get(s).copied().flatten() {
                Some(Act::F(k)) => format!("F{k}"),
                Some(Act::B(k)) => format!("B{k}"),
                None => "·".repeat(w),
            };
            out.push_str(&format!("{cell:<w$} "));
        }
        out.push('\n');
    }
    out
}
