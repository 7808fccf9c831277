//! Pipeline schedules as data (issue 44): per rank, the ordered list of
//! passes it runs — the forward of microbatch `mb` through virtual stage
//! `stage`, its backward, or the backward split into the input-gradient pass
//! (`I`, on the critical path) and the weight-gradient pass (`W`, deferrable)
//! that zero-bubble schedules move into the bubbles. A model cut into `S`
//! virtual stages places each on one rank: `S = ranks` for GPipe and 1F1B,
//! `S = v · ranks` round-robin for interleaved 1F1B, and a V (stage `s` and
//! stage `2p − 1 − s` on rank `s`) for ZBV.
//!
//! Built-in schedules are generators of this data; [`super::verify`] checks
//! any schedule — built in or written by a user — before anything runs.

/// Which pass of a microbatch through a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pass {
    /// Forward.
    F,
    /// The whole backward (input and weight gradients at once).
    B,
    /// The backward's input gradient: what the previous stage waits for.
    I,
    /// The backward's weight gradient: nothing waits for it.
    W,
}

impl Pass {
    /// Time units the pass takes, the forward's being 1 (the input and the
    /// weight gradient each cost about a forward, as in the zero-bubble
    /// paper's model).
    pub fn cost(self) -> usize {
        match self {
            Pass::B => 2,
            Pass::F | Pass::I | Pass::W => 1,
        }
    }
}

/// One pass of one microbatch through one virtual stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Action {
    pub pass: Pass,
    pub mb: usize,
    pub stage: usize,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}{} of stage {}", self.pass, self.mb, self.stage)
    }
}

/// A schedule: where each virtual stage lives and each rank's passes in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub name: String,
    pub ranks: usize,
    pub microbatches: usize,
    /// Virtual stage `s` runs on rank `placement[s]`.
    pub placement: Vec<usize>,
    /// Per rank, its passes in the order it runs them.
    pub orders: Vec<Vec<Action>>,
}

/// Why a built-in schedule cannot be made for these sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GenError {
    /// Interleaved 1F1B needs the microbatches to be a multiple of the ranks.
    NotMultiple { microbatches: usize, ranks: usize },
    /// Zero ranks, chunks or microbatches.
    Empty,
}

impl std::fmt::Display for GenError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GenError::NotMultiple { microbatches, ranks } => write!(
                f,
                "interleaved 1F1B needs the microbatches ({microbatches}) to be a multiple of the pipeline ranks ({ranks})"
            ),
            GenError::Empty => write!(f, "a schedule needs at least one rank, chunk and microbatch"),
        }
    }
}

fn act(pass: Pass, mb: usize, stage: usize) -> Action {
    Action { pass, mb, stage }
}

impl Schedule {
    /// Virtual stages.
    pub fn stages(&self) -> usize {
        self.placement.len()
    }

    /// GPipe: every forward, then every backward.
    pub fn gpipe(p: usize, m: usize) -> Result<Schedule, GenError> {
        if p == 0 || m == 0 {
            return Err(GenError::Empty);
        }
        let orders = (0..p)
            .map(|r| {
                (0..m)
                    .map(|k| act(Pass::F, k, r))
                    .chain((0..m).map(|k| act(Pass::B, k, r)))
                    .collect()
            })
            .collect();
        Ok(Schedule {
            name: "gpipe".into(),
            ranks: p,
            microbatches: m,
            placement: (0..p).collect(),
            orders,
        })
    }

    /// 1F1B: as many warm-up forwards as ranks after this one, then one
    /// forward and one backward alternately, then the remaining backwards.
    pub fn one_f_one_b(p: usize, m: usize) -> Result<Schedule, GenError> {
        if p == 0 || m == 0 {
            return Err(GenError::Empty);
        }
        let orders = (0..p)
            .map(|r| {
                let w = (p - r - 1).min(m);
                let mut v: Vec<Action> = (0..w).map(|k| act(Pass::F, k, r)).collect();
                for i in 0..m - w {
                    v.push(act(Pass::F, w + i, r));
                    v.push(act(Pass::B, i, r));
                }
                v.extend((m - w..m).map(|k| act(Pass::B, k, r)));
                v
            })
            .collect();
        Ok(Schedule {
            name: "one_f_one_b".into(),
            ranks: p,
            microbatches: m,
            placement: (0..p).collect(),
            orders,
        })
    }

    /// Megatron's interleaved 1F1B: `v` chunks per rank (virtual stage
    /// `c · p + r` on rank `r`); forwards go through the chunks in groups of
    /// `p` microbatches, backwards through them in reverse; the warm-up is
    /// `2 (p − r − 1) + (v − 1) p` forwards. Bubble (p − 1) / (v · m).
    pub fn interleaved(p: usize, v: usize, m: usize) -> Result<Schedule, GenError> {
        if p == 0 || v == 0 || m == 0 {
            return Err(GenError::Empty);
        }
        if !m.is_multiple_of(p) {
            return Err(GenError::NotMultiple {
                microbatches: m,
                ranks: p,
            });
        }
        let total = m * v;
        let nth = |k: usize, forward: bool, r: usize| {
            let c = (k / p) % v;
            let c = if forward { c } else { v - 1 - c };
            let mb = (k / (p * v)) * p + k % p;
            (mb, c * p + r)
        };
        let orders = (0..p)
            .map(|r| {
                let warm = ((p - r - 1) * 2 + (v - 1) * p).min(total);
                let f = |k: usize| {
                    let (mb, s) = nth(k, true, r);
                    act(Pass::F, mb, s)
                };
                let b = |k: usize| {
                    let (mb, s) = nth(k, false, r);
                    act(Pass::B, mb, s)
                };
                let mut out: Vec<Action> = (0..warm).map(f).collect();
                for i in 0..total - warm {
                    out.push(f(warm + i));
                    out.push(b(i));
                }
                out.extend((total - warm..total).map(b));
                out
            })
            .collect();
        Ok(Schedule {
            name: format!("interleaved(chunks: {v})"),
            ranks: p,
            microbatches: m,
            placement: (0..p * v).map(|s| s % p).collect(),
            orders,
        })
    }

    /// ZB-H1: 1F1B's peak memory (p microbatches' activations, its first
    /// rank's) with the backward split, each rank's weight-gradient passes
    /// deferred into what would be idle time (the zero-bubble paper's H1:
    /// (p − 1) units idle per rank against 1F1B's 2 (p − 1)).
    pub fn zb_h1(p: usize, m: usize) -> Result<Schedule, GenError> {
        if p == 0 || m == 0 {
            return Err(GenError::Empty);
        }
        let placement: Vec<usize> = (0..p).collect();
        // 1F1B's peak (its first rank's p microbatches) on every rank.
        let limit = vec![p; p];
        Ok(greedy("zb_h1", p, m, placement, &limit))
    }

    /// ZBV (the V-shaped zero-bubble schedule, as DualPipeV places its
    /// chunks): 2 chunks per rank, stage `s` and stage `2p − 1 − s` on rank
    /// `s`, so the first and last stages share rank 0; backward split, weight
    /// gradients filling the gaps, at most 1F1B's activation memory (2p chunk
    /// activations, each half a stage) per rank.
    pub fn zbv(p: usize, m: usize) -> Result<Schedule, GenError> {
        if p == 0 || m == 0 {
            return Err(GenError::Empty);
        }
        let placement: Vec<usize> = (0..2 * p)
            .map(|s| if s < p { s } else { 2 * p - 1 - s })
            .collect();
        let limit = vec![2 * p; p];
        Ok(greedy("zbv", p, m, placement, &limit))
    }
}

/// A split-backward schedule made by running the passes greedily: at each
/// time unit a free rank starts the most urgent pass that is ready — an input
/// gradient (the critical path), else a forward while it holds fewer than
/// `limit[r]` microbatch-stages' activations (the latest stage first), else a
/// deferred weight gradient — and records it. Forwards go through each stage
/// in microbatch order.
fn greedy(name: &str, p: usize, m: usize, placement: Vec<usize>, limit: &[usize]) -> Schedule {
    use std::collections::HashMap;
    let stages = placement.len();
    let mut done: HashMap<Action, usize> = HashMap::new();
    let mut next_f = vec![0usize; stages];
    let mut next_i = vec![0usize; stages];
    let mut pending_w: Vec<Vec<Action>> = vec![Vec::new(); p];
    let mut held = vec![0usize; p];
    let mut busy_until = vec![0usize; p];
    let mut orders: Vec<Vec<Action>> = vec![Vec::new(); p];
    let total = stages * m * 3;
    let mut count = 0usize;
    let mut t = 0usize;
    let finished =
        |done: &HashMap<Action, usize>, a: Action, t: usize| done.get(&a).is_some_and(|e| *e <= t);
    while count < total && t < 16 * total + 16 {
        for r in 0..p {
            if busy_until[r] > t {
                continue;
            }
            let mine: Vec<usize> = (0..stages).filter(|s| placement[*s] == r).collect();
            // Input gradients, latest microbatch-stage first ready.
            let mut pick = None;
            for &s in mine.iter().rev() {
                let k = next_i[s];
                if k >= m {
                    continue;
                }
                let fwd = finished(&done, act(Pass::F, k, s), t);
                let after = s + 1 == stages || finished(&done, act(Pass::I, k, s + 1), t);
                if fwd && after {
                    pick = Some(act(Pass::I, k, s));
                    break;
                }
            }
            if pick.is_none() && held[r] < limit[r] {
                for &s in mine.iter().rev() {
                    let k = next_f[s];
                    if k >= m {
                        continue;
                    }
                    if s == 0 || finished(&done, act(Pass::F, k, s - 1), t) {
                        pick = Some(act(Pass::F, k, s));
                        break;
                    }
                }
            }
            if pick.is_none() && !pending_w[r].is_empty() {
                pick = Some(pending_w[r].remove(0));
            }
            let Some(a) = pick else { continue };
            match a.pass {
                Pass::F => {
                    next_f[a.stage] += 1;
                    held[r] += 1;
                }
                Pass::I => {
                    next_i[a.stage] += 1;
                    pending_w[r].push(act(Pass::W, a.mb, a.stage));
                }
                Pass::W => held[r] = held[r].saturating_sub(1),
                Pass::B => {}
            }
            busy_until[r] = t + a.pass.cost();
            done.insert(a, t + a.pass.cost());
            orders[r].push(a);
            count += 1;
        }
        t += 1;
    }
    Schedule {
        name: name.into(),
        ranks: p,
        microbatches: m,
        placement,
        orders,
    }
}
