//! `shardc plan --device` on a pipelined model compares schedules: every
//! built-in schedule the stack can run (the layers cut into its pieces, the
//! microbatches in its groups, a split backward only without checkpointing),
//! planned like the file's own — each rank's memory from the schedule's
//! order, the bubble from its timeline — and each measured against the
//! device ([`super::device::verdict`]): worst peak, step time, MFU.

use super::{plan_of, Plan};
use crate::schedule::Source;
use crate::source::SourceMap;
use crate::spec::{Spec, Train};
use crate::spmd::Program;
use crate::vocab::PIPELINE_SCHEDULES;
use serde::Serialize;

/// One schedule against the device.
#[derive(Clone, Debug, Serialize)]
pub struct Compared {
    /// The schedule's word (or the file), and as the plan prints it.
    pub schedule: String,
    pub label: String,
    pub chunks: usize,
    /// The one the file runs.
    pub current: bool,
    pub bubble: f64,
    /// The worst rank's peak bytes.
    pub peak: f64,
    pub fits: bool,
    pub step_seconds: Option<f64>,
    pub mfu: Option<f64>,
}

/// The plans of the other schedules the stack of `prog` can run (the
/// file's own is its plan already).
pub fn alternatives(
    prog: &Program,
    train: &Train,
    spec: &Spec,
    sources: &SourceMap,
) -> Vec<(Source, Plan)> {
    let Some(pp) = &prog.pipeline else {
        return Vec::new();
    };
    let (layers, ranks, m) = (pp.blocks.len(), pp.stages.max(1), pp.microbatches);
    let checkpointed = !prog.checkpoints.is_empty();
    let mut out = Vec::new();
    for def in PIPELINE_SCHEDULES.defs {
        let pipe = def.tag;
        let chunks = match (&pp.schedule, pipe.fixed_chunks()) {
            (Source::Built { pipe: p, chunks }, None) if *p == pipe => *chunks,
            (_, fixed) => fixed.unwrap_or(2),
        };
        let source = Source::Built { pipe, chunks };
        let fits = layers.is_multiple_of(ranks * chunks)
            && (!pipe.needs_multiple() || m.is_multiple_of(ranks))
            && !(checkpointed && pipe.splits_backward());
        if !fits || source == pp.schedule {
            continue;
        }
        let mut other = prog.clone();
        if let Some(p) = other.pipeline.as_mut() {
            p.schedule = source.clone();
        }
        out.push((source, plan_of(&other, train, spec, sources)));
    }
    out
}

/// The file's own plan (`current`, its schedule first) and the others'
/// against `device`.
pub fn compare(
    current: (&Source, &Plan),
    others: &[(Source, Plan)],
    device: &super::device::Device,
) -> Vec<Compared> {
    std::iter::once(current)
        .chain(others.iter().map(|(s, p)| (s, p)))
        .enumerate()
        .map(|(k, (source, plan))| {
            let v = super::device::verdict(plan, device.clone());
            let ranks = plan.pipeline.as_ref().map_or(1, |p| p.stages);
            Compared {
                schedule: source.name(),
                label: source.label(),
                chunks: source.chunks(ranks),
                current: k == 0,
                bubble: plan.pipeline.as_ref().map_or(0.0, |p| p.bubble),
                peak: v.peaks.iter().copied().fold(0.0, f64::max),
                fits: v.fits,
                step_seconds: v.step_seconds,
                mfu: v.mfu,
            }
        })
        .collect()
}
