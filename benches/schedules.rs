//! `cargo bench --bench schedules`: each pipeline schedule's planned bubble
//! and idle share per rank — its passes timed by FLOPs, and by the node
//! times one `--profile` run of the 1F1B file measured and one of the ZB-H1
//! file (`shardc plan --profile`) — beside the idle share each rank
//! measures on the virtual mesh, and the step time: medians of 5 rounds,
//! each the two profiles and then a 4-step run of every schedule. Prints
//! figures only. The model is `tests/models/t3d_small.shard` widened (D 128,
//! T 32, 8 layers) on pp = 2 — one device per core of a 2-core machine — or
//! pp = 4 with `SHARDC_BENCH_PP=4`; `SHARDC_BENCH_D=256` widens it (T = D / 4).

use shardc::plan::measured;
use shardc::runtime::{profile, train};
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
    let with = |schedule: &str, chunks: &str| {
        base.replace(
            "schedule: gpipe, microbatches: 4",
            &format!("schedule: {schedule}{chunks}, microbatches: 8"),
        )
    };
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let schedules = [
        ("gpipe", ""),
        ("one_f_one_b", ""),
        ("interleaved", ", chunks: 2"),
        ("zb_h1", ""),
        ("zbv", ""),
    ];
    // Per schedule: the FLOPs plan; per round, the plan timed by that
    // round's 1F1B profile, the idle measured and the step time. Each round
    // profiles and then runs every schedule, so a plan and the runs it is
    // compared with see the machine at the same time (this VM's cores drift
    // by tens of percent over minutes).
    let n = schedules.len();
    let mut flops: Vec<(f64, Vec<f64>)> = vec![(0.0, Vec::new()); n];
    let (mut profiled, mut idle, mut steps) = (vec![vec![]; n], vec![vec![]; n], vec![vec![]; n]);
    let mut split = vec![vec![]; n];
    for _ in 0..ROUNDS {
        let profile = profile_of(&path, with("one_f_one_b", ""));
        let zb = profile_of(&path, with("zb_h1", ""));
        for (k, (schedule, chunks)) in schedules.iter().enumerate() {
            let c = world::compile_source(&path, with(schedule, chunks), &Options::default());
            assert!(!c.has_errors(), "{schedule}: errors");
            let pipeline = c.plans[0].pipeline.as_ref().expect("a pipeline");
            flops[k] = (pipeline.bubble, pipeline.idle.clone());
            // Each rank's idle share as `shardc plan --profile` gives it.
            let timed_by = |profile: &measured::Profile| {
                let mut timed = c.plans[0].clone();
                let file = Path::new("profile.json");
                measured::retime(&mut timed, (&c.programs[0], None), profile, file)
                    .expect("the same program");
                timed.pipeline.map(|p| p.idle).unwrap_or_default()
            };
            profiled[k].push(timed_by(&profile));
            split[k].push(timed_by(&zb));
            let (prog, _, mut cfg, src) = c.prepare(None).expect("runnable");
            cfg.steps = 4;
            let t = Instant::now();
            let out = train::run(prog, &cfg, &src, false, &mut |_| {}).expect("runs");
            steps[k].push(t.elapsed().as_secs_f64() / cfg.steps as f64);
            idle[k].push(out.pipeline_idle.unwrap_or_default());
        }
    }
    println!(
        "{:<24} {:>8} {:>16} {:>16} {:>16} {:>16} {:>10} {:>12}",
        format!("schedule (pp={pp}, m=8)"),
        "bubble",
        "plan: FLOPs",
        "1F1B profile",
        "ZB-H1 profile",
        "measured",
        "|Δ| best",
        "step"
    );
    for (k, (schedule, chunks)) in schedules.iter().enumerate() {
        let ranks = flops[k].1.len();
        let planned = per_rank(&profiled[k], ranks);
        let zb = per_rank(&split[k], ranks);
        let got = per_rank(&idle[k], ranks);
        // The worst rank's distance from the measured idle, of the better
        // profile for this schedule.
        let gap = |p: &[f64]| {
            p.iter()
                .zip(&got)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max)
        };
        println!(
            "{:<24} {:>7.1}% {:>16} {:>16} {:>16} {:>16} {:>9.1}% {:>9.2} ms",
            format!("{schedule}{chunks}"),
            flops[k].0 * 100.0,
            percents(Some(&flops[k].1)),
            percents(Some(&planned)),
            percents(Some(&zb)),
            percents(Some(&got)),
            gap(&planned).min(gap(&zb)) * 100.0,
            median(steps[k].clone()) * 1e3
        );
    }
}

/// Rounds of (a 1F1B and a ZB-H1 profile, then one 4-step run of each
/// schedule).
const ROUNDS: usize = 5;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Per rank, the median over rounds.
fn per_rank(rounds: &[Vec<f64>], ranks: usize) -> Vec<f64> {
    (0..ranks)
        .map(|r| median(rounds.iter().filter_map(|v| v.get(r).copied()).collect()))
        .collect()
}

fn percents(v: Option<&[f64]>) -> String {
    v.unwrap_or_default()
        .iter()
        .map(|x| format!("{:.1}%", x * 100.0))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What `shardc run --profile` writes: the node times of a 10-step run of
/// `text` (the first step left out; each node's median step).
fn profile_of(path: &Path, text: String) -> measured::Profile {
    let c = world::compile_source(path, text, &Options::default());
    let (prog, _, mut cfg, src) = c.prepare(None).expect("runnable");
    cfg.steps = 10;
    profile::enable();
    train::run(prog, &cfg, &src, false, &mut |_| {}).expect("runs");
    let (nodes, steps) = profile::pass_times(prog.nodes.len()).expect("profiling");
    profile::disable();
    if let Ok(f) = std::env::var("SHARDC_BENCH_DUMP") {
        let _ = std::fs::write(
            f,
            serde_json::to_string(&measured::Profile {
                format: measured::FORMAT.into(),
                model: prog.model.clone(),
                program: measured::fingerprint(prog),
                steps,
                nodes: nodes.clone(),
            })
            .unwrap(),
        );
    }
    measured::Profile {
        format: measured::FORMAT.into(),
        model: prog.model.clone(),
        program: measured::fingerprint(prog),
        steps,
        nodes,
    }
}
