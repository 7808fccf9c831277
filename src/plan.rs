//! Static plan: per-device memory, FLOPs and a communication manifest, computed from
//! types alone while checking (nothing is allocated), so it works for meshes far
//! larger than this machine.

use crate::source::{SourceMap, Span};
use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Comm {
    pub kind: String,
    pub axes: Vec<String>,
    /// Bytes each device sends/receives per step (forward and backward).
    pub bytes: f64,
    /// How often per step (repeated layers, forward + backward).
    pub count: u64,
    #[serde(skip)]
    pub span: Span,
    pub source: String,
    /// Written in the source (`psum`) or inserted by the compiler.
    pub explicit: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Plan {
    pub model: String,
    pub mesh: String,
    pub mesh_axes: Vec<(String, i64)>,
    pub batch: Option<i64>,
    pub optimizer: String,
    pub params: f64,
    pub grads: f64,
    pub optimizer_state: f64,
    pub activations: f64,
    /// Parameters stored per device before gathering for use (FSDP) vs used.
    pub gathered_params: f64,
    pub forward_flops: f64,
    pub comms: Vec<Comm>,
    /// Sizes that stayed symbolic, so the figures above omit them.
    pub unknown: Vec<String>,
    /// Embedding tables as SparseCore stacks them.
    pub stacks: Vec<StackPlan>,
    /// A pipelined stack: stages, schedule, bubble, per-stage activations.
    pub pipeline: Option<PipelinePlan>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct PipelinePlan {
    pub axis: String,
    pub stages: usize,
    pub microbatches: usize,
    pub schedule: String,
    /// Idle share of each device's step.
    pub bubble: f64,
    /// Per stage: the most microbatches in flight, and their activation bytes.
    pub in_flight: Vec<usize>,
    pub activations: Vec<f64>,
    /// The schedule drawn as text, one row per stage.
    pub timeline: String,
}

/// One stack of embedding tables: its shards and the tables placed in them.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StackPlan {
    pub name: String,
    pub dim: usize,
    pub partitions: usize,
    pub rows_per_shard: usize,
    /// Table bytes on each device (its SparseCores' shards, f32).
    pub bytes_per_device: f64,
    /// (table, vocab → padded, row offset in shard, shard rotation).
    pub tables: Vec<(String, usize, usize, usize, usize)>,
}

impl Plan {
    pub fn total_memory(&self) -> f64 {
        self.params + self.grads + self.optimizer_state + self.activations + self.gathered_params
    }
    pub fn step_flops(&self) -> f64 {
        // Backward costs about twice the forward (two products per matmul).
        3.0 * self.forward_flops
    }
}

pub use crate::units::{human_bytes, human_flops};

pub fn render(p: &Plan, sources: &SourceMap) -> String {
    let _ = sources;
    let devices: i64 = p.mesh_axes.iter().map(|a| a.1).product();
    let axes: Vec<String> = p
        .mesh_axes
        .iter()
        .map(|(a, n)| format!("{a}={n}"))
        .collect();
    let mut s = format!(
        "plan: {} on {} ({}; {} devices){}\n\n",
        p.model,
        p.mesh,
        axes.join(", "),
        devices,
        p.batch.map_or(String::new(), |b| format!(", batch {b}"))
    );
    s.push_str("per-device memory\n");
    let rows = [
        ("params", p.params, "stored layout".to_string()),
        (
            "gathered params",
            p.gathered_params,
            "FSDP weights gathered for use (peak, one layer at a time is not modelled)".into(),
        ),
        ("grads", p.grads, "same layout as params".into()),
        ("optimizer state", p.optimizer_state, p.optimizer.clone()),
        (
            "activations",
            p.activations,
            "forward values kept for backward".into(),
        ),
    ];
    for (name, v, why) in rows {
        if name == "gathered params" && v == 0.0 {
            continue;
        }
        s.push_str(&format!("  {name:<16} {:>12}   {why}\n", human_bytes(v)));
    }
    s.push_str(&format!(
        "  {:<16} {:>12}\n\n",
        "total",
        human_bytes(p.total_memory())
    ));
    s.push_str(&format!(
        "compute per device per step: {} (forward {}, backward ≈ 2× forward)\n\n",
        human_flops(p.step_flops()),
        human_flops(p.forward_flops)
    ));
    s.push_str("communication per device per step\n");
    if p.comms.is_empty() {
        s.push_str("  none\n");
    } else {
        s.push_str(&format!(
            "  {:<34} {:<10} {:>12} {:>6}  source\n",
            "collective", "axes", "bytes", "count"
        ));
        let mut total = 0.0;
        for c in &p.comms {
            let kind = if c.explicit {
                c.kind.clone()
            } else {
                format!("{} (inserted)", c.kind)
            };
            s.push_str(&format!(
                "  {:<34} {:<10} {:>12} {:>6}  {}\n",
                kind,
                c.axes.join(","),
                human_bytes(c.bytes),
                c.count,
                c.source
            ));
            total += c.bytes * c.count as f64;
        }
        s.push_str(&format!(
            "  {:<34} {:<10} {:>12}\n",
            "total",
            "",
            human_bytes(total)
        ));
    }
    if let Some(pp) = &p.pipeline {
        s.push_str(&format!(
            "\npipeline: {} stages over `{}`, {} microbatches per pass (one pass per accumulated chunk), {}: bubble {:.1}%\n",
            pp.stages,
            pp.axis,
            pp.microbatches,
            if pp.schedule == "one_f_one_b" { "1F1B" } else { "GPipe" },
            pp.bubble * 100.0
        ));
        s.push_str(&format!(
            "  {:<8} {:>10} {:>14}\n",
            "stage", "in flight", "activations"
        ));
        for (k, (n, b)) in pp.in_flight.iter().zip(&pp.activations).enumerate() {
            s.push_str(&format!("  {:<8} {:>10} {:>14}\n", k, n, human_bytes(*b)));
        }
        s.push_str("  (each stage holds its layers' parameters; the layers before and after the stack are on every device)\n");
        s.push_str(&pp.timeline);
    }
    for st in &p.stacks {
        s.push_str(&format!(
            "\nembedding stack `{}`: dim {} (padded), {} partitions × {} rows, {} per device\n",
            st.name,
            st.dim,
            st.partitions,
            st.rows_per_shard,
            human_bytes(st.bytes_per_device)
        ));
        s.push_str(&format!(
            "  {:<16} {:>16} {:>14} {:>9}\n",
            "table", "vocab → padded", "row offset", "rotation"
        ));
        for (name, v, pv, off, rot) in &st.tables {
            s.push_str(&format!(
                "  {:<16} {:>16} {:>14} {:>9}\n",
                name,
                format!("{v} → {pv}"),
                off,
                rot
            ));
        }
    }
    if !p.unknown.is_empty() {
        s.push_str(&format!(
            "\nnot counted (symbolic sizes): {}\n",
            p.unknown.join(", ")
        ));
    }
    s
}
