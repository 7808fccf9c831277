//! A pipelined stack in the plan: what each rank of the stage axis holds
//! (activations and gathered parameters, from the schedule's order) and how
//! long it waits. Each pass takes time in proportion to its FLOPs (the same
//! per-node FLOPs the step's total counts): a piece's forward, a backward
//! twice that, each half of a split backward once; the first piece also runs
//! what comes before the stack, the last what comes after it and, in its
//! forward, the loss's backward — as the runtime's ranks do. The schedule's
//! verifier times the lists with those costs ([`sch::verify::idle`]): each
//! rank's idle share is what the runtime measures.

use super::{PipelinePlan, Plan};
use crate::schedule as sch;
use crate::spmd::Program;

/// FLOPs of one pass of one microbatch through a piece.
struct PassCost {
    /// A piece's forward (every piece repeats the same layers).
    piece: f64,
    /// Before the stack (the first piece) and after it (the last).
    pre: f64,
    post: f64,
    pieces: usize,
}

impl PassCost {
    fn of(&self, a: sch::Action) -> f64 {
        let first = a.stage == 0;
        let last = a.stage + 1 == self.pieces;
        let pre = if first { self.pre } else { 0.0 };
        match a.pass {
            // The last piece also runs what follows the stack, forward and
            // backward, from the loss.
            sch::Pass::F => self.piece + pre + if last { 3.0 * self.post } else { 0.0 },
            sch::Pass::B => 2.0 * (self.piece + pre),
            // The input-gradient half also runs the backward of what comes
            // before the stack.
            sch::Pass::I => self.piece + 2.0 * pre,
            sch::Pass::W => self.piece,
        }
        .max(1.0)
    }
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
    let pieces = pp.virtual_stages();
    let per = pp.blocks.len() / pieces;
    let Ok(schedule) = pp.schedule.make(ranks, m, true) else {
        return;
    };
    let Ok(verified) = sch::verify::verify(&schedule) else {
        return;
    };
    let start = pp.blocks.first().map_or(0, |b| b.0 as usize);
    let end = pp.blocks.last().map_or(0, |b| b.1 as usize);
    // Node range of piece `v`, and what happens outside the stack on it.
    let range = |v: usize| -> std::ops::Range<usize> {
        match (pp.blocks.get(v * per), pp.blocks.get((v + 1) * per - 1)) {
            (Some(a), Some(b)) if per > 0 => a.0 as usize..b.1 as usize,
            _ => 0..0,
        }
    };
    let outside = |v: usize| -> Vec<std::ops::Range<usize>> {
        let mut r = Vec::new();
        if v == 0 {
            r.push(0..start);
        }
        if v + 1 == pieces {
            r.push(end..usize::MAX);
        }
        r
    };
    let sum = |v: &[f64], r: std::ops::Range<usize>| -> f64 {
        v.get(r.start.min(v.len())..r.end.min(v.len()))
            .map_or(0.0, |x| x.iter().sum())
    };
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
    let cost = PassCost {
        piece: sum(flops, range(0)),
        pre: sum(flops, 0..start),
        post: sum(flops, end..usize::MAX),
        pieces,
    };
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
        uniform_bubble: verified.bubble,
        in_flight,
        activations,
        gathered,
        cotangents,
        timeline: sch::draw(&schedule, &verified.ticks),
    });
}
