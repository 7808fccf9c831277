//! The process allocator (src/heap.rs), installed here as the binary
//! installs it: once a run's steps begin, a freed large block's pages serve
//! the next request that fits, of any size and on any thread (the smallest
//! free range that holds it; neighbours merged), zeroed when asked, intact
//! across threads, and a step's trim returns the pages a whole step left
//! free. One test function, so that no other test's allocations move the
//! arena's figures between its checks.

use shardc::heap::{pooled_free, step_done, steps_begin, Heap, LARGE};

#[global_allocator]
static ALLOC: Heap = Heap;

const MIB: usize = 1 << 20;

fn block(n: usize, fill: u8) -> Vec<u8> {
    vec![fill; n]
}

fn at(b: &[u8]) -> usize {
    b.as_ptr() as usize
}

#[test]
fn large_blocks_reuse_the_arena_and_a_step_trims_it() {
    // Before a run's steps begin, a freed block goes back at once.
    drop(block(MIB, 1));
    assert_eq!(pooled_free(), 0);
    steps_begin();
    assert_eq!(pooled_free(), 0);

    // A freed large block's pages wait in the arena and serve the next
    // request that fits, on any thread.
    let a = block(MIB, 7);
    let addr = at(&a);
    drop(a);
    assert_eq!(pooled_free(), MIB);
    let b = std::thread::spawn(move || {
        let b = block(MIB - 100, 9);
        (at(&b), b)
    })
    .join()
    .expect("thread");
    assert_eq!(b.0, addr, "a block that fits is reused");
    assert_eq!(pooled_free(), 0);
    drop(b);

    // Zeroed requests get zeros from reused pages.
    let z = vec![0u8; MIB];
    assert_eq!(at(&z), addr);
    assert!(z.iter().all(|x| *x == 0));
    drop(z);

    // Small blocks are not the arena's.
    drop(block(LARGE - 1, 1));
    assert_eq!(pooled_free(), MIB);

    // A smaller request takes the start of a free range; the rest stays free.
    let half = block(MIB / 2, 3);
    assert_eq!(at(&half), addr);
    assert_eq!(pooled_free(), MIB / 2);
    // Freed, it merges with its free neighbour: the whole range fits a
    // request of its size again, at the same place.
    drop(half);
    let whole = block(MIB, 4);
    assert_eq!(at(&whole), addr, "neighbours merge");
    drop(whole);

    // The smallest free range that holds a request serves it.
    let (x, gap, y, wall) = (
        block(3 * MIB, 1),
        block(MIB, 1),
        block(2 * MIB, 1),
        block(MIB, 1),
    );
    let (xa, ya) = (at(&x), at(&y));
    drop((x, y));
    let fit = block(2 * MIB - 4096, 2);
    assert_eq!(at(&fit), ya, "the 2 MiB range, not the 3 MiB one");
    let big = block(3 * MIB, 2);
    assert_eq!(at(&big), xa);
    drop((fit, big, gap, wall));

    // A step's trim returns the pages that stayed free through it; what a
    // step uses stays.
    step_done(); // the ranges above were freed this step: kept
    assert!(pooled_free() > 0);
    for _ in 0..3 {
        drop(block(MIB, 2)); // a range used again this step
    }
    step_done();
    assert_eq!(pooled_free(), MIB, "only the range this step used stays");
    step_done();
    assert_eq!(pooled_free(), 0, "and it goes after a step without it");
    // Returned pages read as zero and serve requests again.
    let again = vec![0u8; 2 * MIB];
    assert!(again.iter().all(|x| *x == 0));
    drop(again);
    step_done();
    step_done();
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
    step_done();
    step_done();
    assert_eq!(pooled_free(), 0);
}
