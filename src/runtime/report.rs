//! What a run leaves behind for people: `metrics.jsonl` (one record per step) and
//! `loss.svg` (the loss curve), in the run directory.

use plotters::prelude::*;
use serde::Serialize;
use std::io::Write;
use std::path::Path;

#[derive(Clone, Debug, Serialize)]
pub struct Record {
    pub step: usize,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub step_ms: f64,
    pub examples_per_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    /// SparseCore limits and FDO events of this step.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
}

pub fn write_metrics(dir: &Path, records: &[Record]) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(dir.join("metrics.jsonl"))?);
    for r in records {
        writeln!(f, "{}", serde_json::to_string(r).unwrap_or_default())?;
    }
    f.flush()
}

/// The training loss against the step, as an SVG.
pub fn write_loss_curve(dir: &Path, title: &str, records: &[Record]) -> Result<(), String> {
    let path = dir.join("loss.svg");
    let root = SVGBackend::new(&path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let n = records.len().max(2) as f64;
    let (lo, hi) = records
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), r| {
            (a.min(r.loss), b.max(r.loss))
        });
    let (lo, hi) = if lo.is_finite() && hi > lo {
        (lo, hi)
    } else {
        (0.0, 1.0)
    };
    let pad = (hi - lo) * 0.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(1f64..n, (lo - pad)..(hi + pad))
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("training loss")
        .draw()
        .map_err(|e| e.to_string())?;
    chart
        .draw_series(LineSeries::new(
            records.iter().map(|r| (r.step as f64 + 1.0, r.loss)),
            &BLUE,
        ))
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
