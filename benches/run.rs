//! `cargo bench --bench run`: steady-state training step time, throughput and
//! per-device memory of `shardc run` on each model's mesh. Prints figures only.
//! Set SHARDC_BENCH_FULL=1 to include the full-size GPT-J of seed 001 (slow).

use shardc::runtime::train;
use shardc::world::{self, Options};
use std::path::Path;
use std::time::Instant;

fn bench(file: &str, model: Option<&str>, steps: usize) -> f64 {
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
    med
}

fn main() {
    let ours = bench("models/fsdp_mlp.shard", Some("DPClassifier"), 12);
    let base = baseline_dp_mlp(12);
    println!(
        "{:<34} {:<16} step {:>9.2} ms   shardc / baseline = {:.2}×",
        "hand-written candle DP MLP (baseline)",
        "data=8",
        base * 1e3,
        ours / base
    );
    bench("models/fsdp_mlp.shard", Some("FSDPClassifier"), 12);
    bench("tests/models/gptj_small.shard", None, 12);
    if std::env::var_os("SHARDC_BENCH_FULL").is_some() {
        bench("models/gptj.shard", None, 3);
    }
}

/// Baseline: seed 003's data-parallel classifier written by hand in candle (candle's
/// own autograd, the same virtual mesh and all-reduce, the same AdamW), to compare
/// `shardc run`'s step time with. Same shapes: batch 128 in 4 microbatches, 784 →
/// 512 → 10, silu, dropout 0.1 (a fixed mask here), data=8.
fn baseline_dp_mlp(steps: usize) -> f64 {
    use candle_core::{DType, Device, Tensor, Var, D};
    use shardc::runtime::mesh::{Collectives, Comm, Topology};
    let topo = Topology {
        axes: vec![("data".into(), 8)],
    };
    let comm = Comm::new(topo.clone());
    let (micro, k) = (32usize, 4usize);
    let local = micro / 8;
    let times = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for rank in 0..8 {
            let (comm, times) = (&comm, &times);
            s.spawn(move || -> candle_core::Result<()> {
                let dev = Device::Cpu;
                let w1 = Var::from_tensor(&(Tensor::randn(0f32, 1.0, (784, 512), &dev)? / 28.0)?)?;
                let b1 = Var::zeros(512, DType::F32, &dev)?;
                let w2 = Var::from_tensor(&(Tensor::randn(0f32, 1.0, (512, 10), &dev)? / 22.6)?)?;
                let b2 = Var::zeros(10, DType::F32, &dev)?;
                let vars = [&w1, &b1, &w2, &b2];
                let mut m: Vec<Tensor> = vars
                    .iter()
                    .map(|v| v.zeros_like())
                    .collect::<candle_core::Result<_>>()?;
                let mut v2: Vec<Tensor> = m.clone();
                let x = Tensor::randn(0f32, 1.0, (local, 784), &dev)?;
                let y: Vec<u32> = (0..local as u32)
                    .map(|i| (i * 7 + rank as u32) % 10)
                    .collect();
                let onehot = Tensor::from_vec(
                    (0..local * 10)
                        .map(|i| {
                            if y[i / 10] as usize == i % 10 {
                                1f32
                            } else {
                                0.0
                            }
                        })
                        .collect::<Vec<_>>(),
                    (local, 10),
                    &dev,
                )?;
                let mask = (Tensor::rand(0f32, 1.0, (local, 512), &dev)?
                    .ge(0.1)?
                    .to_dtype(DType::F32)?
                    / 0.9)?;
                for step in 1..=steps {
                    let t0 = Instant::now();
                    let mut acc: Option<Vec<Tensor>> = None;
                    for _ in 0..k {
                        let h = (x
                            .matmul(w1.as_tensor())?
                            .broadcast_add(b1.as_tensor())?
                            .silu()?
                            * &mask)?;
                        let logits = h.matmul(w2.as_tensor())?.broadcast_add(b2.as_tensor())?;
                        let mx = logits.max_keepdim(D::Minus1)?;
                        let lse = logits
                            .broadcast_sub(&mx)?
                            .exp()?
                            .sum_keepdim(D::Minus1)?
                            .log()?
                            .add(&mx)?;
                        let loss = ((lse.squeeze(1)? - logits.mul(&onehot)?.sum(1)?)?
                            .sum_all()?
                            / micro as f64)?;
                        let g = loss.backward()?;
                        let gs: Vec<Tensor> = vars
                            .iter()
                            .map(|v| {
                                g.get(v).cloned().unwrap_or(
                                    v.zeros_like().unwrap_or_else(|_| v.as_tensor().clone()),
                                )
                            })
                            .collect();
                        acc = Some(match acc {
                            None => gs,
                            Some(a) => a
                                .iter()
                                .zip(&gs)
                                .map(|(a, b)| a + b)
                                .collect::<candle_core::Result<_>>()?,
                        });
                    }
                    let grads = acc.unwrap_or_default();
                    for (i, v) in vars.iter().enumerate() {
                        let g = (comm.psum(rank, &grads[i], &["data".to_string()])? / k as f64)?;
                        m[i] = ((&m[i] * 0.9)? + (&g * 0.1)?)?;
                        v2[i] = ((&v2[i] * 0.999)? + (g.sqr()? * 0.001)?)?;
                        let mh = (&m[i] / (1.0 - 0.9f64.powi(step as i32)))?;
                        let vh = (&v2[i] / (1.0 - 0.999f64.powi(step as i32)))?;
                        let d = (mh.div(&(vh.sqrt()? + 1e-8)?)? + (v.as_tensor() * 1e-4)?)?;
                        v.set(&(v.as_tensor() - (d * 1e-3)?)?)?;
                    }
                    if rank == 0 {
                        if let Ok(mut t) = times.lock() {
                            t.push(t0.elapsed().as_secs_f64());
                        }
                    }
                }
                Ok(())
            });
        }
    });
    let mut t = times.into_inner().unwrap_or_default();
    t.remove(0);
    t.sort_by(|a, b| a.total_cmp(b));
    t.get(t.len() / 2).copied().unwrap_or(f64::NAN)
}
