//! `cargo bench --bench check`: time `shardc check` (parse + resolve + check) on each
//! seed model and on a generated 96-layer transformer with GPT-3 175B dimensions on a
//! 1024-device mesh. Prints figures; asserts nothing.

use shardc::world::{self, Options};
use std::path::Path;
use std::time::{Duration, Instant};

fn gpt3_175b() -> String {
    let mut s = String::from(
        "// Generated: GPT-3 175B shapes, 96 blocks, on dp=16 × pp=8 × tp=8 = 1024 devices.\n\
         import nn\n\
         mesh pod(dp: 16, pp: 8, tp: 8)\n\
         const VOCAB = 50304\nconst T = 2048\nconst D = 12288\nconst H = 96\n\
         model GPT3 {\n  embed = Embed(VOCAB@tp, D)\n",
    );
    for i in 0..96 {
        s.push_str(&format!("  b{i} = TransformerBlock(D, H@tp, 4 * D@tp)\n"));
    }
    s.push_str("  ln_f = LayerNorm(D)\n  head = Linear(D -> VOCAB@tp)\n");
    s.push_str(
        "  fn forward(ids: i32[B@dp, T]) -> f32[B@dp, T, VOCAB@tp] {\n    let x0 = embed(ids)\n",
    );
    for i in 0..96 {
        s.push_str(&format!("    let x{} = b{i}(x{i})\n", i + 1));
    }
    s.push_str("    head(ln_f(x96))\n  }\n}\n");
    s.push_str("train GPT3 on pod {\n  data: synthetic(vocab: VOCAB), batch: 1536, steps: 10\n  loss: softmax_cross_entropy, optimizer: adam(lr: 6e-5)\n}\n");
    s
}

fn time(name: &str, path: &Path, text: &str) {
    let opts = Options::default();
    let c = world::compile_source(path, text.to_string(), &opts);
    assert!(!c.has_errors(), "{name} has errors");
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) || samples.len() < 10 {
        let t = Instant::now();
        let c = world::compile_source(path, text.to_string(), &opts);
        samples.push(t.elapsed());
        std::hint::black_box(c.diagnostics.len());
    }
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    println!(
        "{name:<28} mean {:>9.3} ms   median {:>9.3} ms   min {:>9.3} ms   ({} runs)",
        ms(mean),
        ms(samples[samples.len() / 2]),
        ms(samples[0]),
        samples.len()
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for m in ["shakespeare", "gptj", "fsdp_mlp", "transformer_3d"] {
        let p = root.join(format!("models/{m}.shard"));
        let text = std::fs::read_to_string(&p).expect("model file");
        time(&format!("check {m}.shard"), &p, &text);
    }
    time(
        "check gpt3-175b (1024 dev)",
        &root.join("gpt3_175b.shard"),
        &gpt3_175b(),
    );
}
