//! What the plan knows about the devices a model will run on: each kind's
//! memory, peak matmul throughput and interconnect bandwidth (vendors'
//! published figures), and the verdict of `shardc plan --device NAME`:
//! whether every pipeline stage's peak fits, and a step time and MFU
//! estimate from the plan's FLOPs and bytes.

use serde::Serialize;

/// One kind of accelerator.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Device {
    pub name: String,
    /// Usable memory, bytes.
    pub memory: f64,
    /// Dense bf16 matmul peak, FLOP/s (`None`: a memory size only).
    pub bf16: Option<f64>,
    /// Dense f32 matmul peak, FLOP/s (TF32 tensor cores on NVIDIA GPUs, as
    /// JAX's and PyTorch's default matmul precision uses them; TPUs run f32
    /// matmuls as several bf16 passes: a third of the bf16 peak).
    pub f32: Option<f64>,
    /// Interconnect bandwidth per device and direction, bytes/s.
    pub link: Option<f64>,
    /// What the figures are.
    pub about: String,
}

/// The devices `--device` knows by name: (name, memory bytes, bf16 FLOP/s,
/// f32 FLOP/s, link bytes/s per direction, description).
const KNOWN: &[(&str, f64, f64, f64, f64, &str)] = &[
    (
        "h100-80g",
        80e9,
        989e12,
        494.5e12,
        450e9,
        "NVIDIA H100 SXM 80 GB: 989 TFLOP/s bf16, 495 TFLOP/s tf32 (dense), NVLink 900 GB/s",
    ),
    (
        "a100-80g",
        80e9,
        312e12,
        156e12,
        300e9,
        "NVIDIA A100 SXM 80 GB: 312 TFLOP/s bf16, 156 TFLOP/s tf32 (dense), NVLink 600 GB/s",
    ),
    (
        "a100-40g",
        40e9,
        312e12,
        156e12,
        300e9,
        "NVIDIA A100 SXM 40 GB: 312 TFLOP/s bf16, 156 TFLOP/s tf32 (dense), NVLink 600 GB/s",
    ),
    (
        "tpu-v5p",
        95e9,
        459e12,
        153e12,
        300e9,
        "Google TPU v5p: 95 GB HBM, 459 TFLOP/s bf16, ICI 4,800 Gbit/s",
    ),
    (
        "tpu-v5e",
        16e9,
        197e12,
        65.7e12,
        100e9,
        "Google TPU v5e: 16 GB HBM, 197 TFLOP/s bf16, ICI 1,600 Gbit/s",
    ),
];

/// The names `--device` accepts besides a size.
pub fn names() -> Vec<&'static str> {
    KNOWN.iter().map(|k| k.0).collect()
}

/// A device by name (`h100-80g`), or a memory size (`24GiB`, `40GB`, `16g`:
/// GiB unless `GB` says decimal).
pub fn parse(s: &str) -> Result<Device, String> {
    let t = s.trim().to_ascii_lowercase();
    if let Some(k) = KNOWN.iter().find(|k| k.0 == t) {
        return Ok(Device {
            name: k.0.into(),
            memory: k.1,
            bf16: Some(k.2),
            f32: Some(k.3),
            link: Some(k.4),
            about: k.5.into(),
        });
    }
    let (num, unit) = match t.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => t.split_at(i),
        None => (t.as_str(), "gib"),
    };
    let scale = match unit.trim() {
        "gib" | "g" | "" => 1024f64.powi(3),
        "gb" => 1e9,
        "tib" => 1024f64.powi(4),
        _ => 0.0,
    };
    match num.parse::<f64>() {
        Ok(n) if scale > 0.0 && n.is_finite() && n > 0.0 => Ok(Device {
            name: s.trim().into(),
            memory: n * scale,
            bf16: None,
            f32: None,
            link: None,
            about: format!("{} of memory", crate::units::human_bytes(n * scale)),
        }),
        _ => Err(format!(
            "unknown device `{s}`: use one of {}, or a memory size like `24GiB`",
            names().join(", ")
        )),
    }
}

/// The plan measured against a device.
#[derive(Clone, Debug, Serialize)]
pub struct Verdict {
    pub device: Device,
    /// Per pipeline stage (one entry without a pipeline): its peak bytes.
    pub peaks: Vec<f64>,
    pub fits: bool,
    /// Seconds per optimizer step: compute at the peak (stretched by the
    /// pipeline bubble) plus communication at the link's bandwidth, not
    /// overlapped; `None` for a size-only device.
    pub step_seconds: Option<f64>,
    pub compute_seconds: Option<f64>,
    pub comm_seconds: Option<f64>,
    /// Model FLOPs utilisation of that step: the model's FLOPs (without
    /// checkpointing's recompute) / (time × peak).
    pub mfu: Option<f64>,
    /// `bf16` or `f32`: which peak the estimate uses.
    pub precision: &'static str,
    /// When it does not fit: the changes that save memory, with their peaks.
    pub proposals: Vec<super::Proposal>,
    /// A pipelined model: every schedule its stack can run, against the
    /// device, the file's own first ([`super::schedules`]).
    pub schedules: Vec<super::schedules::Compared>,
}

/// `plan` on `device`.
pub fn verdict(plan: &super::Plan, device: Device) -> Verdict {
    let peaks = plan.peaks();
    let fits = peaks.iter().all(|p| *p <= device.memory);
    let precision = if plan.bf16 { "bf16" } else { "f32" };
    let peak = if plan.bf16 { device.bf16 } else { device.f32 };
    let bubble = plan.pipeline.as_ref().map_or(0.0, |p| p.bubble);
    let compute = peak.map(|f| plan.step_flops() / f / (1.0 - bubble).max(1e-9));
    // `+ 0.0`: an empty sum is −0.0, printed as "-0.00 ms".
    let bytes: f64 = plan
        .comms
        .iter()
        .map(|c| c.bytes * c.count as f64)
        .sum::<f64>()
        + 0.0;
    let comm = device.link.map(|l| bytes / l);
    let step = compute.zip(comm).map(|(a, b)| a + b);
    let mfu = step
        .zip(peak)
        .filter(|(s, _)| *s > 0.0)
        .map(|(s, f)| plan.model_step_flops() / (s * f));
    Verdict {
        device,
        peaks,
        fits,
        step_seconds: step,
        compute_seconds: compute,
        comm_seconds: comm,
        mfu,
        precision,
        proposals: if fits { vec![] } else { plan.proposals.clone() },
        schedules: Vec::new(),
    }
}

/// The verdict as text.
pub fn render(v: &Verdict) -> String {
    use crate::units::human_bytes;
    let mut s = format!("device: {} ({})\n", v.device.name, v.device.about);
    let (worst, peak) =
        v.peaks.iter().enumerate().fold(
            (0, 0.0f64),
            |(i, m), (j, p)| if *p > m { (j, *p) } else { (i, m) },
        );
    let staged = v.peaks.len() > 1;
    let at = if staged {
        format!(" on stage {worst}")
    } else {
        String::new()
    };
    if v.fits {
        s.push_str(&format!(
            "  fits: peak {}{at}, {:.0}% of its {}\n",
            human_bytes(peak),
            100.0 * peak / v.device.memory,
            human_bytes(v.device.memory)
        ));
    } else {
        let over: Vec<String> = v
            .peaks
            .iter()
            .enumerate()
            .filter(|(_, p)| **p > v.device.memory)
            .map(|(i, _)| i.to_string())
            .collect();
        s.push_str(&format!(
            "  does not fit: peak {}{at}, {:.1}× its {}{}\n",
            human_bytes(peak),
            peak / v.device.memory,
            human_bytes(v.device.memory),
            if staged {
                format!(" (stages over: {})", over.join(", "))
            } else {
                String::new()
            }
        ));
    }
    for p in &v.proposals {
        s.push_str(&format!(
            "  with {}: peak {}, {}\n",
            p.change,
            human_bytes(p.peak),
            if p.peak <= v.device.memory {
                "fits"
            } else {
                "still over"
            }
        ));
    }
    if let (Some(t), Some(c), Some(m), Some(mfu)) =
        (v.step_seconds, v.compute_seconds, v.comm_seconds, v.mfu)
    {
        s.push_str(&format!(
            "  step ≈ {} (compute {} at the {} peak{}, communication {} at the link's bandwidth, not overlapped): MFU ≈ {:.0}%\n",
            seconds(t),
            seconds(c),
            v.precision,
            if staged { ", stretched by the bubble" } else { "" },
            seconds(m),
            100.0 * mfu
        ));
    }
    if !v.schedules.is_empty() {
        s.push_str(
            "  schedules this stack can run (worst rank's peak; step and MFU estimated as above):
",
        );
        for c in &v.schedules {
            let chunks = if c.chunks > 1 {
                format!(" × {}", c.chunks)
            } else {
                String::new()
            };
            s.push_str(&format!(
                "    {:<22} bubble {:>5.1}%  peak {:>10}{}  step ≈ {:>9}  MFU ≈ {:>3.0}%{}\n",
                format!("{}{chunks}", c.label),
                c.bubble * 100.0,
                human_bytes(c.peak),
                if c.fits { "" } else { " (over)" },
                c.step_seconds.map_or("-".to_string(), seconds),
                100.0 * c.mfu.unwrap_or(0.0),
                if c.current { "  ← this file" } else { "" }
            ));
        }
    }
    s
}

fn seconds(t: f64) -> String {
    if t >= 1.0 {
        format!("{t:.2} s")
    } else {
        format!("{:.2} ms", t * 1e3)
    }
}
