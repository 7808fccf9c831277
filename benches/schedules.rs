//! `cargo bench --bench schedules`: each pipeline schedule's planned bubble
//! and idle share per rank beside the idle share each rank measures on the
//! virtual mesh (median of 5 runs of 4 steps), and the step time. Prints
//! figures only. The model is `tests/models/t3d_small.shard` widened (D 128,
//! T 32, 8 layers) on pp = 2 — one device per core of a 2-core machine — or
//! pp = 4 with `SHARDC_BENCH_PP=4`; `SHARDC_BENCH_D=256` widens it (T = D / 4).

use shardc::runtime::train;
use shardc::world::{self, Options};
use std::path::Path;
use std::time::Instant;

fn main() {
    let pp: i64 = std::env::var("SHARDC_BENCH_PP")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    // What `shardc run` does first: each device one core's share of candle's
    // threads (without it, both ranks' ops queue for one shared pool and a
    // pass takes twice as long while the other rank runs).
    shardc::runtime::mesh::share_cores(pp as usize);
    // `SHARDC_BENCH_D=256`: a wider model (T grows with D), where matmuls
    // outweigh the per-op overheads the plan does not model.
    let d: i64 = std::env::var("SHARDC_BENCH_D")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128);
    let file = "tests/models/t3d_small.shard";
    let base = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
        .expect("readable")
        .replace("const T = 8", &format!("const T = {}", d / 4))
        .replace("const D = 32", &format!("const D = {d}"))
        .replace("const L = 4", "const L = 8")
        .replace("accumulate: 2", "accumulate: 1")
        .replace("batch: 16", "batch: 32")
        .replace(
            "mesh pod(dp: 2, pp: 2, tp: 2)",
            &format!("mesh pod(dp: 1, pp: {pp}, tp: 1)"),
        );
    println!(
        "{:<24} {:>8} {:>26} {:>26} {:>12}",
        format!("schedule (pp={pp}, m=8)"),
        "bubble",
        "planned idle per rank",
        "measured idle per rank",
        "step"
    );
    for (schedule, chunks) in [
        ("gpipe", ""),
        ("one_f_one_b", ""),
        ("interleaved", ", chunks: 2"),
        ("zb_h1", ""),
        ("zbv", ""),
    ] {
        let text = base.replace(
            "schedule: gpipe, microbatches: 4",
            &format!("schedule: {schedule}{chunks}, microbatches: 8"),
        );
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
        let c = world::compile_source(&path, text, &Options::default());
        assert!(!c.has_errors(), "{schedule}: errors");
        let pipeline = c.plans[0].pipeline.as_ref();
        let planned = pipeline.map_or(0.0, |p| p.bubble);
        let planned_idle: Vec<String> = pipeline
            .map(|p| {
                p.idle
                    .iter()
                    .map(|x| format!("{:.1}%", x * 100.0))
                    .collect()
            })
            .unwrap_or_default();
        let (prog, _, mut cfg, src) = c.prepare(None).expect("runnable");
        cfg.steps = 4;
        let mut idle: Vec<Vec<f64>> = Vec::new();
        let mut steps: Vec<f64> = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let out = train::run(prog, &cfg, &src, false, &mut |_| {}).expect("runs");
            steps.push(t.elapsed().as_secs_f64() / cfg.steps as f64);
            idle.push(out.pipeline_idle.unwrap_or_default());
        }
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
        };
        let ranks = idle.first().map_or(0, Vec::len);
        let per_rank: Vec<String> = (0..ranks)
            .map(|r| {
                let m = median(idle.iter().filter_map(|v| v.get(r).copied()).collect());
                format!("{:.1}%", m * 100.0)
            })
            .collect();
        println!(
            "{:<24} {:>7.1}% {:>26} {:>26} {:>9.2} ms",
            format!("{schedule}{chunks}"),
            planned * 100.0,
            planned_idle.join(" "),
            per_rank.join(" "),
            median(steps) * 1e3
        );
    }
}
