//! The process allocator (src/heap.rs), installed here as the binary
//! installs it: large blocks come back by exact size, zeroed when asked,
//! intact across threads, and a step's trim returns what a step did not use.
//! One test function, so that no other test's allocations move the pool's
//! figures between its checks.

use shardc::heap::{pooled_free, step_done, steps_begin, Heap, LARGE};

#[global_allocator]
static ALLOC: Heap = Heap;

const MIB: usize = 1 << 20;

fn block(n: usize, fill: u8) -> Vec<u8> {
    vec![fill; n]
}

#[test]
fn large_blocks_are_pooled_by_size_reused_and_trimmed() {
    // Before a run's steps begin, a freed block goes back at once.
    drop(block(MIB, 1));
    assert_eq!(pooled_free(), 0);
    steps_begin();
    assert_eq!(pooled_free(), 0);

    // A freed large block waits in the pool and serves the next request of
    // its size (in pages), on any thread.
    let a = block(MIB, 7);
    let addr = a.as_ptr() as usize;
    drop(a);
    assert_eq!(pooled_free(), MIB);
    let b = std::thread::spawn(move || {
        let b = block(MIB - 100, 9);
        (b.as_ptr() as usize, b)
    })
    .join()
    .expect("thread");
    assert_eq!(b.0, addr, "a block of the same size in pages is reused");
    assert_eq!(pooled_free(), 0);
    drop(b);

    // Zeroed requests get zeros from a reused block.
    let z = vec![0u8; MIB];
    assert_eq!(z.as_ptr() as usize, addr);
    assert!(z.iter().all(|x| *x == 0));
    drop(z);

    // Small blocks are not pooled.
    drop(block(LARGE - 1, 1));
    assert_eq!(pooled_free(), MIB);

    // A size the step keeps using keeps its block; one it stopped using goes.
    let other = block(3 * MIB, 1);
    drop(other);
    assert_eq!(pooled_free(), 4 * MIB);
    step_done(); // the first trim measures from here
    assert_eq!(pooled_free(), 4 * MIB);
    for _ in 0..3 {
        drop(block(MIB, 2)); // the 1 MiB block is taken and given back
    }
    step_done();
    assert_eq!(pooled_free(), MIB, "the 3 MiB block stayed free all step");
    step_done();
    assert_eq!(pooled_free(), 0, "and the 1 MiB one all the next");
    step_done(); // its size, untouched, leaves the table; it comes back
    drop(block(MIB, 4));
    assert_eq!(pooled_free(), MIB);
    step_done();
    step_done();
    assert_eq!(pooled_free(), 0);

    // Two blocks live at once, then one: the second is surplus next step.
    let (x, y) = (block(2 * MIB, 1), block(2 * MIB, 1));
    drop((x, y));
    step_done();
    drop(block(2 * MIB, 3));
    step_done();
    assert_eq!(pooled_free(), 2 * MIB);
    steps_begin();
    assert_eq!(pooled_free(), 0);

    // Growing and shrinking across the threshold and within pooled sizes
    // keeps the contents.
    let mut v: Vec<u32> = Vec::new();
    for i in 0..(4 * MIB / 4) as u32 {
        v.push(i);
    }
    assert!(v.iter().enumerate().all(|(i, x)| *x == i as u32));
    v.truncate(100);
    v.shrink_to_fit();
    assert_eq!(v, (0..100).collect::<Vec<u32>>());
    let mut w: Vec<u8> = block(LARGE * 2, 5);
    w.truncate(LARGE + 1);
    w.shrink_to_fit();
    assert!(w.iter().all(|x| *x == 5));
    drop((v, w));

    // Many threads freeing each other's blocks: every block holds what its
    // owner wrote.
    let handles: Vec<_> = (0..8u8)
        .map(|t| {
            std::thread::spawn(move || {
                let mut held = Vec::new();
                for i in 0..200usize {
                    let n = LARGE * (1 + (i * 7 + t as usize) % 5) + i % 3;
                    held.push(block(n, t.wrapping_mul(31).wrapping_add(i as u8)));
                    if held.len() > 4 {
                        let b = held.remove(i % held.len());
                        let want = b[0];
                        assert!(b.iter().all(|x| *x == want));
                    }
                }
                held
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().expect("thread"));
    }
    for b in &all {
        let want = b[0];
        assert!(b.iter().all(|x| *x == want));
    }
    drop(all);
    steps_begin();
    assert_eq!(pooled_free(), 0);
}
