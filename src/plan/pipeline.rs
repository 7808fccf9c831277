//! A pipelined stack in the plan: what each rank of the stage axis holds
//! (activations and gathered parameters, from the schedule's order) and how
//! long it waits. Each pass takes time in proportion to its FLOPs (the same
//! per-node FLOPs the step's total counts): a piece's forward, a backward
//! twice that, each half of a split backward once; the first piece also runs
//! what comes before the stack, the last what comes after it and, in its
//! forward, the loss's backward — as the runtime's ranks do. Or, with a
//! profile ([`super::measured`]), each pass takes the time its nodes took in
//! a run. The schedule's verifier times the lists with those costs
//! ([`sch::verify::idle`]): each rank's idle share is what the runtime
//! measures.

use super::{PipelinePlan, Plan};
use crate::schedule as sch;
use crate::spmd::Program;

/// What one pass of one microbatch costs on each piece of the stack: its
/// forward, its whole backward and the backward's two halves.
#[derive(Debug)]
pub(super) struct PassCost {
    f: Vec<f64>,
    b: Vec<f64>,
    i: Vec<f64>,
    w: Vec<f64>,
}

impl PassCost {
    fn of(&self, a: sch::Action) -> f64 {
        let v = match a.pass {
            sch::Pass::F => &self.f,
            sch::Pass::B => &self.b,
            sch::Pass::I => &self.i,
            sch::Pass::W => &self.w,
        };
        v.get(a.stage).copied().unwrap_or(0.0)
    }

    /// From FLOPs: every piece's forward the first piece's (the stack's
    /// repetitions are alike), a backward twice that, each half of a split
    /// one once; the first piece also runs what comes before the stack
    /// (its whole backward in the input half), the last what comes after it,
    /// forward and backward, in its forward (from the loss).
    fn from_flops(flops: &[f64], at: &Pieces) -> PassCost {
        let piece = sum(flops, at.range(0));
        let pre = sum(flops, 0..at.start);
        let post = sum(flops, at.end..usize::MAX);
        let n = at.pieces;
        let pre_of = |v: usize| if v == 0 { pre } else { 0.0 };
        let post_of = |v: usize| if v + 1 == n { post } else { 0.0 };
        let each = |g: &dyn Fn(usize) -> f64| (0..n).map(|v| g(v).max(1.0)).collect();
        PassCost {
            f: each(&|v| piece + pre_of(v) + 3.0 * post_of(v)),
            b: each(&|v| 2.0 * (piece + pre_of(v))),
            i: each(&|v| piece + 2.0 * pre_of(v)),
            w: each(&|_| piece),
        }
    }

    /// From times measured per node (`shardc run --profile`: each node's
    /// forward, and its derivatives' time toward data and toward weights),
    /// the same attribution: each piece its own nodes, the first piece also
    /// those before the stack (their whole backward in the input half), the
    /// last those after it (forward and backward in its forward).
    pub(super) fn measured(nodes: &[[f64; 3]], at: &Pieces) -> PassCost {
        let col = |k: usize, r: std::ops::Range<usize>| -> f64 {
            nodes
                .get(r.start.min(nodes.len())..r.end.min(nodes.len()))
                .map_or(0.0, |v| v.iter().map(|x| x[k]).sum())
        };
        let all = |r: std::ops::Range<usize>| col(0, r.clone()) + col(1, r.clone()) + col(2, r);
        let back = |r: std::ops::Range<usize>| col(1, r.clone()) + col(2, r);
        let n = at.pieces;
        let (mut f, mut b, mut i, mut w) = (vec![], vec![], vec![], vec![]);
        for v in 0..n {
            let r = at.range(v);
            let pre = if v == 0 { 0..at.start } else { 0..0 };
            let (pre_f, pre_b) = (col(0, pre.clone()), back(pre));
            let post = if v + 1 == n {
                all(at.end..usize::MAX)
            } else {
                0.0
            };
            f.push(col(0, r.clone()) + pre_f + post);
            b.push(back(r.clone()) + pre_b);
            i.push(col(1, r.clone()) + pre_b);
            w.push(col(2, r));
        }
        PassCost { f, b, i, w }
    }
}

fn sum(v: &[f64], r: std::ops::Range<usize>) -> f64 {
    v.get(r.start.min(v.len())..r.end.min(v.len()))
        .map_or(0.0, |x| x.iter().sum())
}

/// Where a pipelined stack's pieces lie among the program's nodes.
pub(super) struct Pieces {
    /// Pieces of the stack (ranks × chunks) and blocks per piece.
    pieces: usize,
    per: usize,
    /// The stack's first node and the first after it.
    start: usize,
    end: usize,
    blocks: Vec<(usize, usize)>,
}

impl Pieces {
    pub(super) fn of(pp: &crate::spmd::Pipeline) -> Pieces {
        let pieces = pp.virtual_stages();
        Pieces {
            pieces,
            per: pp.blocks.len() / pieces.max(1),
            start: pp.blocks.first().map_or(0, |b| b.0 as usize),
            end: pp.blocks.last().map_or(0, |b| b.1 as usize),
            blocks: pp
                .blocks
                .iter()
                .map(|b| (b.0 as usize, b.1 as usize))
                .collect(),
        }
    }

    /// Node range of piece `v`.
    fn range(&self, v: usize) -> std::ops::Range<usize> {
        match (
            self.blocks.get(v * self.per),
            self.blocks.get(((v + 1) * self.per).wrapping_sub(1)),
        ) {
            (Some(a), Some(b)) if self.per > 0 => a.0..b.1,
            _ => 0..0,
        }
    }

    /// What runs outside the stack on piece `v`.
    fn outside(&self, v: usize) -> Vec<std::ops::Range<usize>> {
        let mut r = Vec::new();
        if v == 0 {
            r.push(0..self.start);
        }
        if v + 1 == self.pieces {
            r.push(self.end..usize::MAX);
        }
        r
    }
}

/// Each rank's idle share of a chunk, its passes costing `cost`.
pub(super) fn idle(pp: &crate::spmd::Pipeline, cost: &PassCost) -> Option<Vec<f64>> {
    let ranks = pp.stages.max(1);
    let schedule = pp.schedule.make(ranks, pp.microbatches.max(1), true).ok()?;
    sch::verify::idle(&schedule, &|a| cost.of(a)).ok()
}

/// Each rank keeps, per microbatch in flight through each of its pieces of
/// the stack, that piece's share of one microbatch's activations (the first
/// piece also those before the stack, the last those after it), as the
/// schedule's order on the rank holds them ([`sch::held_peak`]).
pub(super) fn pipeline(
    plan: &mut Plan,
    prog: &Program,
    pp: &crate::spmd::Pipeline,
    acts: &[f64],
    (gathered, regathered): (&[f64], f64),
    (cts, flops): (&[f64], &[f64]),
) {
    let ranks = pp.stages.max(1);
    let m = pp.microbatches.max(1);
    let at = Pieces::of(pp);
    let pieces = at.pieces;
    let Ok(schedule) = pp.schedule.make(ranks, m, true) else {
        return;
    };
    let Ok(verified) = sch::verify::verify(&schedule) else {
        return;
    };
    let range = |v: usize| at.range(v);
    let outside = |v: usize| at.outside(v);
    let most = |r: std::ops::Range<usize>| -> f64 {
        cts.get(r.start.min(cts.len())..r.end.min(cts.len()))
            .map_or(0.0, |v| v.iter().fold(0.0, |a, b| a.max(*b)))
    };
    // The plan's values count the first rank's pieces only; the stack's
    // repetitions are alike, so every piece holds what the first holds, and
    // a piece after the first also the value it received: the first piece's
    // result, which the second reads.
    let received = match prog.read_from_outside(&range(1)).as_slice() {
        [one] if pieces > 1 => Some(*one),
        _ => None,
    };
    let weight = |v: &[f64], k: usize| -> f64 {
        let got = match received {
            Some(i) if k > 0 => v.get(i).copied().unwrap_or(0.0),
            _ => 0.0,
        };
        sum(v, range(0)) + got + outside(k).into_iter().map(|r| sum(v, r)).sum::<f64>()
    };
    let per_rank = |v: &[f64], once: f64| -> Vec<f64> {
        schedule
            .orders
            .iter()
            .map(|o| sch::held_peak(o, &|k| weight(v, k)) + once)
            .collect()
    };
    let activations = per_rank(acts, plan.recompute_activations);
    let gathered = per_rank(gathered, regathered);
    let in_flight: Vec<usize> = schedule
        .orders
        .iter()
        .map(|o| sch::held_peak(o, &|_| 1.0) as usize)
        .collect();
    // Each rank runs backward over its own pieces (the first piece also
    // before the stack, the last after it, and the loss): the cotangents it
    // holds at once.
    let cotangents: Vec<f64> = (0..ranks)
        .map(|r| {
            (0..pieces)
                .filter(|k| schedule.placement.get(*k) == Some(&r))
                .map(|k| {
                    outside(k)
                        .into_iter()
                        .map(|x| most(x.start..x.end.min(cts.len())))
                        .fold(most(range(0)), f64::max)
                })
                .fold(0.0, f64::max)
        })
        .collect();
    let cost = PassCost::from_flops(flops, &at);
    let idle = sch::verify::idle(&schedule, &|a| cost.of(a)).unwrap_or_default();
    plan.activations = activations.first().copied().unwrap_or(plan.activations);
    plan.gathered_params = gathered.first().copied().unwrap_or(plan.gathered_params);
    plan.cotangents = cotangents.first().copied().unwrap_or(plan.cotangents);
    plan.pipeline = Some(PipelinePlan {
        axis: pp.axis.clone(),
        stages: ranks,
        chunks: pp.schedule.chunks(ranks),
        microbatches: m,
        schedule: pp.schedule.name(),
        label: pp.schedule.label(),
        split: pp.schedule.splits_backward(),
        bubble: idle.iter().sum::<f64>() / idle.len().max(1) as f64,
        idle,
        timed_by: None,
        uniform_bubble: verified.bubble,
        in_flight,
        activations,
        gathered,
        cotangents,
        timeline: sch::draw(&schedule, &verified.ticks),
    });
}
