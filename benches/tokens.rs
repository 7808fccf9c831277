//! `cargo bench --bench tokens`: how fast a token stream's batches are
//! assembled (`data: tokens(...)`: positioned reads of `seq + 1` ids per
//! example, checked against the vocabulary, shifted into inputs and
//! targets), on one core, from a 200 MB stream of random uint16 ids written
//! to the temporary directory; and how long the run's full pass over the ids
//! takes. Prints figures; asserts nothing.

use shardc::data::stream::{Stream, TokenFile};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let ids: u64 = 100_000_000;
    let path = std::env::temp_dir().join(format!("shardc-bench-tokens-{}.bin", std::process::id()));
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let bytes: Vec<u8> = (0..ids)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x % 50257) as u16).to_le_bytes()
        })
        .collect();
    std::fs::write(&path, &bytes).expect("write the stream");
    drop(bytes);
    let file = Arc::new(TokenFile::open(&path, false).expect("open"));
    let t = Instant::now();
    file.scan((0, file.len), 50257, &mut |_| {}).expect("scan");
    let scan = t.elapsed().as_secs_f64();
    println!(
        "full pass: {ids} ids in {scan:.2} s ({:.0} M ids/s)",
        ids as f64 / scan / 1e6
    );
    for (batch, seq) in [(8usize, 1024usize), (64, 1024), (512, 128)] {
        let s = Stream {
            train: file.clone(),
            train_range: (0, ids * 9 / 10),
            eval: file.clone(),
            eval_range: (ids * 9 / 10, ids),
            seq,
            sequential: false,
            vocab: 50257,
        };
        let steps = 400;
        let t = Instant::now();
        let mut sum = 0.0;
        for step in 0..steps {
            let (x, _) = s.batch(0, step, batch, true, false, None).expect("batch");
            sum += x[0];
        }
        let secs = t.elapsed().as_secs_f64();
        let tokens = (steps * batch * seq) as f64;
        println!(
            "batch {batch} × seq {seq}: {:.1} M tokens/s of batch assembly ({:.3} ms a step) [{sum}]",
            tokens / secs / 1e6,
            secs * 1e3 / steps as f64
        );
    }
    let _ = std::fs::remove_file(&path);
}
