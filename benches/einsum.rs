//! `cargo bench --bench einsum`: the forward of each einsum the standard
//! library's attention runs, beside the two contractions its derivative
//! runs (one per operand), and the plain product of the QKV projection's
//! size. Median of 101 calls each on seed 004's widened test model (B 32,
//! T 32, D 128, H 4), with the binary's allocator pooling as in a run. A
//! derivative costs as many multiply-adds as its forward, so each backward
//! column should read about the forward's time (bwd/fwd about 2); where it
//! reads more, the difference is copies (`src/prim/einsum_plan.rs`). Prints
//! figures only.

use candle_core::{Device, Tensor};
use shardc::prim::einsum::einsum;
use std::time::Instant;

// The allocator `shardc` runs with (large blocks reused, not faulted in
// again on every call).
#[global_allocator]
static ALLOC: shardc::heap::Heap = shardc::heap::Heap;

fn median_ms(f: &mut dyn FnMut()) -> f64 {
    f();
    let mut v: Vec<f64> = (0..101)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rand(dims: &[usize]) -> Tensor {
    Tensor::randn(0f32, 1.0, dims, &Device::Cpu).expect("a random tensor")
}

fn main() {
    shardc::heap::steps_begin();
    let (b, t, d, h) = (32usize, 32usize, 128usize, 4usize);
    let e = d / h;
    let size = |c: char| match c {
        'b' => b,
        't' => t,
        'd' => d,
        'h' => h,
        'e' => e,
        'k' => 3,
        _ => unreachable!("a letter the bench does not use"),
    };
    println!(
        "{:<22} {:>10} {:>12} {:>12} {:>10}",
        "einsum", "forward", "d/d left", "d/d right", "bwd/fwd"
    );
    for (l, r, o) in [("btd", "dkhe", "kbthe"), ("bthe", "hed", "btd")] {
        let shape = |s: &str| s.chars().map(size).collect::<Vec<_>>();
        let (x, w, g) = (rand(&shape(l)), rand(&shape(r)), rand(&shape(o)));
        let fwd = median_ms(&mut || {
            einsum(&[l, r], o, &[&x, &w]).expect("forward");
        });
        let dl = median_ms(&mut || {
            einsum(&[o, r], l, &[&g, &w]).expect("d/d left");
        });
        let dr = median_ms(&mut || {
            einsum(&[o, l], r, &[&g, &x]).expect("d/d right");
        });
        println!(
            "{:<22} {:>8.3}ms {:>10.3}ms {:>10.3}ms {:>9.2}x",
            format!("{l},{r}->{o}"),
            fwd,
            dl,
            dr,
            (dl + dr) / fwd
        );
    }
    let (m, k, n) = (b * t, d, 3 * d);
    let (a, w) = (rand(&[m, k]), rand(&[k, n]));
    let mm = median_ms(&mut || {
        a.matmul(&w).expect("product");
    });
    println!("{:<22} {:>8.3}ms", format!("[{m},{k}]@[{k},{n}]"), mm);
}
