//! `cargo bench --bench run`: steady-state training step time, throughput and
//! per-device memory of `shardc run` on each model's mesh. Prints figures only.
//! Set SHARDC_BENCH_FULL=1 to include the full-size GPT-J of seed 001 (slow).

use shardc::runtime::train;
use shardc::world::{self, Options};
use std::path::Path;
use std::time::Instant;

fn bench(file: &str, model: Option<&str>, steps: usize) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
    let c = world::compile(&path, &Options::default()).expect("readable");
    assert!(!c.has_errors(), "{file} has errors");
    let (prog, _, mut cfg, src) = train::prepare(&c, model).expect("runnable");
    cfg.steps = steps;
    let mut times = Vec::new();
    let mut last = Instant::now();
    let out = train::run(prog, &cfg, &src, false, &mut |_| {
        let now = Instant::now();
        times.push((now - last).as_secs_f64());
        last = now;
    })
    .expect("run");
    // Steady state: drop the first step (allocation, first touch).
    let mut steady: Vec<f64> = times.iter().skip(1).copied().collect();
    steady.sort_by(|a, b| a.total_cmp(b));
    let med = steady.get(steady.len() / 2).copied().unwrap_or(f64::NAN);
    let mesh: Vec<String> = prog.mesh.iter().map(|(a, n)| format!("{a}={n}")).collect();
    let mem = out.memory.map_or(0.0, |m| m.total());
    println!(
        "{:<34} {:<16} step {:>9.2} ms   {:>10.1} examples/s   memory/device {:>10}",
        format!(
            "{file}{}",
            model.map_or(String::new(), |m| format!(" ({m})"))
        ),
        mesh.join(","),
        med * 1e3,
        cfg.batch as f64 / med,
        shardc::plan::human_bytes(mem)
    );
}

fn main() {
    bench("models/fsdp_mlp.shard", Some("DPClassifier"), 12);
    bench("models/fsdp_mlp.shard", Some("FSDPClassifier"), 12);
    bench("tests/models/gptj_small.shard", None, 12);
    if std::env::var_os("SHARDC_BENCH_FULL").is_some() {
        bench("models/gptj.shard", None, 3);
    }
}
