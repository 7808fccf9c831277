//! Every pipeline schedule — GPipe, 1F1B, interleaved 1F1B (2 chunks per
//! rank), ZB-H1 and ZBV (the backward split into its input- and
//! weight-gradient passes) — trains a dp × pp × tp transformer (seed 004's
//! shape, `tests/models/t3d_small.shard` with 8 layers) like one device:
//! f64 gradients within 1e-12, f32 losses within 1e-6 over 10 steps, and the
//! schedules' gradients bit-identical to one another (each sums a
//! parameter's microbatches in the same order), and central differences. The
//! activations `--mem` measures on the first rank are the plan's; a schedule
//! file runs like the built-in schedule it writes out.

mod numerics;

use numerics::*;
use shardc::runtime::train;

const FILE: &str = "tests/models/t3d_small.shard";

/// The small transformer with 8 layers, 8 microbatches of 2 examples and
/// `schedule` (`chunks: 2` for interleaved).
fn model(schedule: &str) -> String {
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FILE))
        .expect("model file");
    let chunks = if schedule == "interleaved" {
        ", chunks: 2"
    } else {
        ""
    };
    let out = text
        .replace("const L = 4", "const L = 8")
        .replace("accumulate: 2", "accumulate: 1")
        .replace(
            "schedule: gpipe, microbatches: 4",
            &format!("schedule: {schedule}{chunks}, microbatches: 8"),
        );
    assert!(
        out.contains("microbatches: 8") && out.contains("L = 8"),
        "the model file changed"
    );
    out
}

const SCHEDULES: [&str; 5] = ["gpipe", "one_f_one_b", "interleaved", "zb_h1", "zbv"];
const ONE: [(&str, i64); 3] = [("dp", 1), ("pp", 1), ("tp", 1)];

fn max_abs_rel(a: &[f64], b: &[f64]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| ((x - y) / y.abs().max(1e-300)).abs())
        .fold(0.0, f64::max)
}

#[test]
fn every_schedule_matches_one_device_on_four_stages() {
    let mesh = [("dp", 1), ("pp", 4), ("tp", 2)];
    let (g1, _) = grads_and_losses_text(FILE, &model("gpipe"), &ONE, None, 1, true);
    let (_, l1) = grads_and_losses_text(FILE, &model("gpipe"), &ONE, None, 10, false);
    let mut first: Option<Vec<(String, Vec<f64>)>> = None;
    for schedule in SCHEDULES {
        let text = model(schedule);
        let (g, _) = grads_and_losses_text(FILE, &text, &mesh, None, 1, true);
        assert_eq!(g.len(), g1.len());
        for ((n, a), (n1, b)) in g.iter().zip(&g1) {
            assert_eq!(n, n1);
            let r = max_rel(a, b);
            eprintln!("{schedule}: gradient of `{n}` within {r:e} of one device");
            assert!(r < 1e-12, "{schedule}: gradient of `{n}` differs by {r:e}");
            assert!(
                a.iter().any(|x| *x != 0.0),
                "{schedule}: `{n}` has no gradient"
            );
        }
        match &first {
            None => first = Some(g),
            Some(f) => {
                for ((n, a), (_, b)) in g.iter().zip(f) {
                    let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
                    assert!(
                        same,
                        "{schedule}: gradient of `{n}` is not GPipe's bit for bit"
                    );
                }
            }
        }
        let (_, l) = grads_and_losses_text(FILE, &text, &mesh, None, 10, false);
        let r = max_abs_rel(&l, &l1);
        eprintln!("{schedule}: 10 losses within {r:e} of one device");
        assert_eq!(l.len(), 10);
        assert!(r < 1e-6, "{schedule}: losses {l:?} vs {l1:?}");
    }
}

#[test]
fn chunked_schedules_match_one_device_with_data_parallel() {
    let mesh = [("dp", 2), ("pp", 2), ("tp", 2)];
    for schedule in ["interleaved", "zb_h1", "zbv"] {
        compare_text(FILE, &model(schedule), &mesh, &ONE, None);
    }
}

/// The activations measured on the first rank are what the plan counts from
/// the schedule's order on that rank.
#[test]
fn planned_activations_are_measured() {
    for schedule in SCHEDULES {
        let text = model(schedule).replace(
            "mesh pod(dp: 2, pp: 2, tp: 2)",
            "mesh pod(dp: 1, pp: 4, tp: 2)",
        );
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("sched.shard");
        let c = shardc::world::compile_source(&path, text, &Default::default());
        assert!(!c.has_errors(), "{schedule}");
        let plan = c.plans.first().cloned().expect("a plan");
        let (prog, _, cfg, src) = c.prepare(None).expect("runnable");
        let mut cfg = cfg;
        cfg.steps = 1;
        let out = train::run(prog, &cfg, &src, false, &mut |_| {}).expect("runs");
        let measured = out.memory.expect("measured").activations;
        let pp = plan.pipeline.as_ref().expect("a pipeline");
        eprintln!(
            "{schedule}: planned {} (per rank {:?}, in flight {:?}), measured {measured}, bubble {:.1}%",
            plan.activations,
            pp.activations,
            pp.in_flight,
            pp.bubble * 100.0
        );
        assert_eq!(plan.activations, measured, "{schedule}");
    }
}

/// A user's schedule file in torchtitan's CSV layout (here ZB-H1's own
/// timeline, written out with its idle cells) runs like the built-in
/// schedule: the same gradients, bit for bit, and the same losses.
#[test]
fn a_schedule_file_runs_like_the_built_in_schedule() {
    use shardc::schedule::{verify, Schedule};
    let s = Schedule::zb_h1(4, 8).expect("zb_h1");
    let v = verify::verify(&s).expect("verified");
    let mut csv = String::from("# ZB-H1, 4 ranks, 8 microbatches\n");
    for r in 0..4 {
        let row: Vec<String> = v
            .ticks
            .iter()
            .map(|t| {
                t[r].map_or(String::new(), |a| {
                    format!("{}{:?}{}", a.stage, a.pass, a.mb)
                })
            })
            .collect();
        csv.push_str(&row.join(","));
        csv.push('\n');
    }
    let dir = std::env::temp_dir().join(format!("shardc-schedule-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("zb.csv");
    std::fs::write(&path, &csv).expect("written");
    let text = model("zb_h1").replace(
        "schedule: zb_h1",
        &format!("schedule: \"{}\"", path.display()),
    );
    assert!(text.contains("zb.csv"));
    // The file is what runs: the plan names it and times its passes.
    let c = shardc::world::compile_source(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FILE),
        text.replace(
            "mesh pod(dp: 2, pp: 2, tp: 2)",
            "mesh pod(dp: 1, pp: 4, tp: 2)",
        ),
        &shardc::world::Options {
            grants: vec![dir.clone()],
            ..Default::default()
        },
    );
    let errors: Vec<String> = c
        .diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| format!("{:?}: {}", d.code, d.message))
        .collect();
    assert!(errors.is_empty(), "{errors:?}");
    let pp = c.plans[0].pipeline.as_ref().expect("a pipeline");
    assert!(
        pp.schedule.ends_with("zb.csv") && pp.split,
        "{}",
        pp.schedule
    );
    // Timed like the built-in schedule it lists.
    let built = shardc::world::compile_source(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FILE),
        model("zb_h1").replace(
            "mesh pod(dp: 2, pp: 2, tp: 2)",
            "mesh pod(dp: 1, pp: 4, tp: 2)",
        ),
        &shardc::world::Options::default(),
    );
    let bp = built.plans[0].pipeline.as_ref().expect("a pipeline");
    assert_eq!((pp.bubble, &pp.idle), (bp.bubble, &bp.idle));
    assert!(v.bubble > 0.0 && pp.idle.len() == 4);
    let mesh = [("dp", 1), ("pp", 4), ("tp", 2)];
    let (gf, lf) = grads_and_losses_text(FILE, &text, &mesh, None, 1, true);
    let (gb, lb) = grads_and_losses_text(FILE, &model("zb_h1"), &mesh, None, 1, true);
    for ((n, a), (_, b)) in gf.iter().zip(&gb) {
        let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "gradient of `{n}` differs from the built-in ZB-H1's");
    }
    assert_eq!(lf, lb);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Central differences on the small stack (4 layers, 2 ranks, 4
/// microbatches) under the schedules that cut it into pieces or split the
/// backward: the split halves together are the derivative.
#[test]
fn split_and_chunked_schedules_pass_finite_differences() {
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FILE))
        .expect("model file")
        .replace("accumulate: 2", "accumulate: 1");
    for (schedule, chunks) in [("zbv", ""), ("zb_h1", "")] {
        let t = text.replace(
            "schedule: gpipe, microbatches: 4",
            &format!("schedule: {schedule}{chunks}, microbatches: 4"),
        );
        assert!(t.contains(schedule), "the model file changed");
        finite_differences(
            &format!("fd_{schedule}.shard"),
            &t,
            &[("dp", 1), ("pp", 2), ("tp", 1)],
        );
    }
}

/// `shardc plan --device` compares the schedules a stack can run: the file's
/// own first, each with its bubble, worst peak and step time; a checkpointed
/// stack is not offered the split-backward schedules, and a stack the
/// pieces do not divide not the chunked ones.
#[test]
fn plan_device_compares_the_schedules_the_stack_can_run() {
    let bin = env!("CARGO_BIN_EXE_shardc");
    let run = |file: &str| {
        let out = std::process::Command::new(bin)
            .args(["plan", file, "--device", "h100-80g", "--json"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .expect("shardc runs");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        v[0]["device"]["schedules"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    let t3d = run("models/transformer_3d.shard");
    let names: Vec<&str> = t3d.iter().filter_map(|c| c["schedule"].as_str()).collect();
    assert_eq!(
        names,
        ["one_f_one_b", "gpipe", "interleaved", "zb_h1", "zbv"]
    );
    assert_eq!(t3d[0]["current"], true);
    let bubble = |k: usize| t3d[k]["bubble"].as_f64().unwrap_or(1.0);
    assert!(bubble(4) < bubble(3) && bubble(3) < bubble(2) && bubble(2) < bubble(0));
    assert!(t3d.iter().all(|c| c["step_seconds"].as_f64().is_some()));
    // GPT-3 175B checkpoints its blocks: no split backward offered.
    let gpt3 = run("examples/gpt3_175b.shard");
    let names: Vec<&str> = gpt3.iter().filter_map(|c| c["schedule"].as_str()).collect();
    assert_eq!(names, ["one_f_one_b", "gpipe", "interleaved"]);
}

/// `shardc plan --profile`: measured node times replace FLOPs in the
/// pipeline's timing, each attributed to the pass that runs it. Time spent
/// only before the stack (the first rank's forwards) leaves the other rank
/// idle throughout; time spent only in weight gradients keeps both ranks of
/// ZB-H1 busy (nothing waits for a weight pass) but not of 1F1B (whose whole
/// backwards chain across the ranks). A profile of another program is
/// refused.
#[test]
fn a_profile_times_the_pipeline_passes() {
    use shardc::plan::measured::{self, Profile, ProfileError};
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(FILE);
    let plan = |schedule: &str, nodes: &dyn Fn(usize, usize, usize) -> [f64; 3]| {
        let text = model(schedule).replace("dp: 2, pp: 2, tp: 2", "dp: 1, pp: 2, tp: 1");
        let c = shardc::world::compile_source(&path, text, &Default::default());
        assert!(!c.has_errors(), "{schedule}");
        let prog = &c.programs[0];
        let pp = prog.pipeline.as_ref().expect("a pipeline");
        let (start, end) = (pp.blocks[0].0 as usize, pp.blocks[7].1 as usize);
        let profile = Profile {
            format: measured::FORMAT.into(),
            model: prog.model.clone(),
            program: measured::fingerprint(prog),
            steps: 1,
            nodes: (0..prog.nodes.len())
                .map(|i| nodes(i, start, end))
                .collect(),
        };
        let mut p = c.plans[0].clone();
        let file = std::path::Path::new("profile.json");
        measured::retime(&mut p, (prog, None), &profile, file).expect("its own program");
        let pl = p.pipeline.expect("a pipeline");
        assert_eq!(pl.timed_by.as_deref(), Some("profile.json"));
        // The same profile for another mesh's program.
        let other = shardc::world::compile_source(
            &path,
            model(schedule).replace("dp: 2, pp: 2, tp: 2", "dp: 1, pp: 2, tp: 2"),
            &Default::default(),
        );
        let mut q = other.plans[0].clone();
        let refused = measured::retime(&mut q, (&other.programs[0], None), &profile, file);
        assert!(
            matches!(refused, Err(ProfileError::Program { .. })),
            "{refused:?}"
        );
        pl.idle
    };
    let before_stack =
        |i: usize, start: usize, _: usize| [f64::from(u8::from(i < start)), 0.0, 0.0];
    assert_eq!(plan("one_f_one_b", &before_stack), vec![0.0, 1.0]);
    let weights = |i: usize, start: usize, end: usize| {
        [0.0, 0.0, f64::from(u8::from((start..end).contains(&i)))]
    };
    assert_eq!(plan("zb_h1", &weights), vec![0.0, 0.0]);
    let chained = plan("one_f_one_b", &weights);
    assert!(chained.iter().all(|x| *x > 0.05), "{chained:?}");
}
