//! What a run leaves behind for people: `metrics.jsonl` (one record per step) and
//! `loss.svg` (the loss curve), in the run directory (and, from the same
//! records, the TensorBoard log of [`super::tensorboard`]).

use plotters::prelude::*;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub step: usize,
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub step_ms: f64,
    pub examples_per_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f64>,
    /// When the step ended, in seconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<f64>,
    /// SparseCore limits and FDO events of this step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
    /// The step's metrics by name (`accuracy`, `auc`) and the model's added
    /// loss terms and observed values (`add_loss`, `observe`: a number or a
    /// list), as fields of the record; `null` where undefined (AUC of a batch
    /// with one class only).
    #[serde(flatten)]
    pub metrics: std::collections::BTreeMap<String, serde_json::Value>,
}

impl Record {
    /// The metrics as the progress line shows them: `  accuracy 0.8125  auc 0.9012`.
    pub fn metrics_line(&self) -> String {
        self.metrics
            .iter()
            .map(|(k, v)| format!("  {k} {}", short(v)))
            .collect()
    }
}

/// A metric's value for the progress line: numbers to 4 significant places,
/// lists of up to 8 of them.
fn short(v: &serde_json::Value) -> String {
    let num = |x: &serde_json::Value| match x.as_f64() {
        Some(f) if f != 0.0 && (f.abs() >= 1e4 || f.abs() < 1e-3) => format!("{f:.3e}"),
        Some(f) if f.fract() == 0.0 => format!("{f:.0}"),
        Some(f) => format!("{f:.4}"),
        None => "-".into(),
    };
    match v {
        serde_json::Value::Array(xs) if xs.len() <= 8 => {
            format!("[{}]", xs.iter().map(num).collect::<Vec<_>>().join(" "))
        }
        serde_json::Value::Array(xs) => format!("[{} values]", xs.len()),
        x => num(x),
    }
}

/// The records a resumed run continues: those of `metrics.jsonl` up to the step
/// it resumes after (a run killed after its checkpoint logged steps it will redo).
pub fn earlier(dir: &Path, resumed_after: usize) -> Vec<Record> {
    if resumed_after == 0 {
        return vec![];
    }
    let Ok(bytes) = crate::files::read_regular(&dir.join("metrics.jsonl"), 1 << 30) else {
        return vec![];
    };
    String::from_utf8_lossy(&bytes)
        .lines()
        .filter_map(|l| serde_json::from_str::<Record>(l).ok())
        .filter(|r| r.step <= resumed_after)
        .collect()
}

/// Write `metrics.jsonl` (replacing the file, never following a link there):
/// `{"config": ...}` (the run's configuration), then one record per step.
pub fn write_metrics(
    dir: &Path,
    config: &serde_json::Value,
    records: &[Record],
) -> std::io::Result<()> {
    let mut out = Vec::new();
    writeln!(out, "{}", serde_json::json!({ "config": config }))?;
    for r in records {
        writeln!(out, "{}", serde_json::to_string(r).unwrap_or_default())?;
    }
    crate::files::write_replace(&dir.join("metrics.jsonl"), &out)
}

/// The training loss against the step, as an SVG (x is the step number, with
/// integer ticks from the first step recorded to the last).
pub fn write_loss_curve(dir: &Path, title: &str, records: &[Record]) -> Result<(), String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (800, 480)).into_drawing_area();
        draw(&root, title, records).map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    crate::files::write_replace(&dir.join("loss.svg"), svg.as_bytes()).map_err(|e| e.to_string())
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    records: &[Record],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let first = records.iter().map(|r| r.step as i64).min().unwrap_or(1);
    let last = records
        .iter()
        .map(|r| r.step as i64)
        .max()
        .unwrap_or(1)
        .max(first + 1);
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
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(first..last, (lo - pad)..(hi + pad))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc("training loss")
        .x_labels(((last - first + 1) as usize).min(10))
        .x_label_formatter(&|x| x.to_string())
        .draw()?;
    chart.draw_series(LineSeries::new(
        records.iter().map(|r| (r.step as i64, r.loss)),
        &BLUE,
    ))?;
    Ok(())
}
