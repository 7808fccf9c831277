//! The worker pool a device's parallel work goes over (large products,
//! cross-entropy's row passes, row maxima, broadcast ops, Adam's step): the
//! calling thread and the helpers that are free take the parts of a job as
//! they get to them, and the caller never waits for a helper that has not
//! started. Every user splits so that the bits do not depend on the parts.
//!
//! candle's pool (`candle_core::utils::barrier_pool`) hands every worker its
//! slice and waits until each has checked in. Beside a busy process on one of
//! this VM's two cores, the worker there gets the core for a time slice now
//! and then, and each product waited for it: a 1-device `shakespeare_dense`
//! step went from 2.9 to 5.5–8.4 ms, the classifier's from 4.3 to 8.8–14.8 ms
//! (on one thread they took 2.5 and 5–6 ms beside the same process). Here a
//! job's parts go to whoever claims them first (one atomic counter), so the
//! caller, on the free core, takes every part a helper has not claimed; it
//! waits only for a part a helper is in the middle of, and parts are small
//! (several per thread), so that wait is short.
//!
//! Helpers spin for a bounded time after a job ([`SPIN`]), then sleep until
//! the next one, so an idle pool costs nothing. One job runs at a time: a
//! caller that finds the pool busy (another device's product, or a part
//! calling back in) runs its job alone. The helpers are started on first use;
//! their number is what the process gave this device ([`set_threads`]).

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

/// How long a helper spins for the next job before it sleeps: long enough to
/// bridge the elementwise ops between one product and the next, short enough
/// not to hold a shared core.
const SPIN: Duration = Duration::from_micros(200);

/// Parts per thread a job is cut in ([`ranges`]): enough that a thread on a
/// core another process holds delays only a small one.
pub const PER_THREAD: usize = 4;

/// A job's parts, run by `f`, and who has claimed and finished them.
struct Job {
    /// The caller's closure, borrowed for the job's life: it is called only
    /// for a part claimed below `parts`, and the caller returns only when
    /// every part is `done` (see [`run`]).
    f: *const (dyn Fn(usize) + Sync),
    parts: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    panicked: AtomicBool,
}

// SAFETY: `f` points at a `Sync` closure that outlives every call made
// through it (the type's comment); the rest is atomics.
unsafe impl Send for Job {}
unsafe impl Sync for Job {}

impl Job {
    /// Claim and run parts until none is left.
    fn work(&self) {
        loop {
            let p = self.next.fetch_add(1, Ordering::Relaxed);
            if p >= self.parts {
                return;
            }
            // SAFETY: a part below `parts` was claimed, so the caller is
            // still in `run`, waiting for it: the closure is alive.
            let f = unsafe { &*self.f };
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(p))).is_err() {
                self.panicked.store(true, Ordering::Relaxed);
            }
            self.done.fetch_add(1, Ordering::Release);
        }
    }
}

struct Pool {
    /// The job in progress, if any; `generation` counts the jobs posted.
    job: Mutex<Option<Arc<Job>>>,
    generation: AtomicU64,
    /// Held by the caller of the job in progress.
    busy: Mutex<()>,
    /// Each helper's thread and whether it sleeps (started after the pool).
    helpers: OnceLock<Vec<(Thread, Arc<AtomicBool>)>>,
}

/// Threads a device's products may use, the caller's included (1: no pool).
static THREADS: AtomicUsize = AtomicUsize::new(1);
static POOL: Pool = Pool {
    job: Mutex::new(None),
    generation: AtomicU64::new(0),
    busy: Mutex::new(()),
    helpers: OnceLock::new(),
};

/// The threads each device may use, from the cores this process gets and the
/// devices it runs. Takes effect before the pool's first job.
pub fn set_threads(n: usize) {
    THREADS.store(n.max(1), Ordering::Relaxed);
}

/// Threads a product may be split over (the caller's included).
pub fn threads() -> usize {
    THREADS.load(Ordering::Relaxed)
}

/// The helpers, started on first use.
fn helpers() -> &'static [(Thread, Arc<AtomicBool>)] {
    POOL.helpers.get_or_init(|| {
        let mut helpers = Vec::new();
        for k in 1..threads() {
            let asleep = Arc::new(AtomicBool::new(false));
            let a = asleep.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("shardc-pool-{k}"))
                .spawn(move || helper(&a));
            // A helper that cannot start leaves the others (or the caller
            // alone) to do the work.
            if let Ok(h) = spawned {
                helpers.push((h.thread().clone(), asleep));
            }
        }
        helpers
    })
}

/// A helper's life: take each job posted, spin a while for the next, then
/// sleep until woken.
fn helper(asleep: &AtomicBool) {
    let pool = &POOL;
    let mut seen = pool.generation.load(Ordering::Acquire);
    loop {
        let started = Instant::now();
        let mut spins = 0u32;
        while pool.generation.load(Ordering::Acquire) == seen {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(64) && started.elapsed() > SPIN {
                asleep.store(true, Ordering::SeqCst);
                // A job posted between the check above and here unparks us.
                if pool.generation.load(Ordering::SeqCst) == seen {
                    std::thread::park();
                }
                asleep.store(false, Ordering::SeqCst);
            } else {
                std::hint::spin_loop();
            }
        }
        seen = pool.generation.load(Ordering::Acquire);
        let job = pool.job.lock().ok().and_then(|j| j.clone());
        if let Some(job) = job {
            job.work();
        }
    }
}

/// `0..n` (items of `work` each) in consecutive ranges, one per part of a
/// job: [`PER_THREAD`] per thread of the pool, each of at least `min_work`;
/// one range when the pool has one thread.
pub fn ranges(n: usize, work: usize, min_work: usize) -> Vec<std::ops::Range<usize>> {
    let threads = threads();
    let most = (n.saturating_mul(work) / min_work.max(1)).clamp(1, n.max(1));
    let parts = if threads <= 1 {
        1
    } else {
        (threads * PER_THREAD).min(most)
    };
    (0..parts)
        .map(|p| p * n / parts..(p + 1) * n / parts)
        .collect()
}

/// The least work (elements of a row pass) a part of one is given.
pub const PART_WORK: usize = 1 << 15;

/// A part of a row pass: its first row, its row count, its output (`width`
/// elements per row, to be written whole).
pub type RowFill<'a, T> = dyn Fn(usize, usize, &mut [MaybeUninit<T>]) + Sync + 'a;

/// A `rows × width` output made by `f` over parts of the rows ([`ranges`],
/// `work` per row), each part on whichever thread takes it; `None` if a part
/// did not run. `f` must write every element of its part's output.
pub fn rows_into<T: Send>(
    rows: usize,
    width: usize,
    work: usize,
    f: &RowFill<'_, T>,
) -> Option<Vec<T>> {
    let len = rows.checked_mul(width)?;
    let mut out: Vec<T> = Vec::with_capacity(len);
    let ranges = ranges(rows, work, PART_WORK);
    let mut parts = Vec::with_capacity(ranges.len());
    let mut rest = &mut out.spare_capacity_mut()[..len];
    for r in ranges {
        let (mine, after) = std::mem::take(&mut rest).split_at_mut(r.len() * width);
        rest = after;
        parts.push(Mutex::new((r, mine)));
    }
    let written = AtomicUsize::new(0);
    run(parts.len(), &|p| {
        if let Some(Ok(mut g)) = parts.get(p).map(Mutex::lock) {
            let (r, mine) = &mut *g;
            f(r.start, r.len(), mine);
            written.fetch_add(r.len(), Ordering::Relaxed);
        }
    });
    drop(parts);
    if written.load(Ordering::Relaxed) != rows {
        return None;
    }
    // SAFETY: every part wrote all of its rows' elements (`f`'s contract),
    // the parts cover the rows, and every part ran (the count above).
    unsafe { out.set_len(len) };
    Some(out)
}

/// Run `f(0)`, …, `f(parts - 1)`, each once, over this thread and the
/// pool's free helpers; returns when every part has run. A part that panics
/// panics here after the others have run.
pub fn run(parts: usize, f: &(dyn Fn(usize) + Sync)) {
    if parts == 0 {
        return;
    }
    let alone = || (0..parts).for_each(f);
    if parts == 1 || threads() <= 1 {
        return alone();
    }
    let pool = &POOL;
    let helpers = helpers();
    // Another caller's job is in progress (or a part calls back in).
    let Ok(_busy) = pool.busy.try_lock() else {
        return alone();
    };
    // SAFETY (lifetime): the job forgets `f`'s lifetime; `f` is called only
    // for claimed parts, and this function returns only once all are done.
    let f: *const (dyn Fn(usize) + Sync + '_) = f;
    let f: *const (dyn Fn(usize) + Sync + 'static) = unsafe { std::mem::transmute(f) };
    let job = Arc::new(Job {
        f,
        parts,
        next: AtomicUsize::new(0),
        done: AtomicUsize::new(0),
        panicked: AtomicBool::new(false),
    });
    match pool.job.lock() {
        Ok(mut j) => *j = Some(job.clone()),
        Err(_) => return alone(),
    }
    pool.generation.fetch_add(1, Ordering::SeqCst);
    for (t, asleep) in helpers {
        if asleep.load(Ordering::SeqCst) {
            t.unpark();
        }
    }
    job.work();
    // Only parts a helper is in the middle of remain.
    let mut spins = 0u32;
    while job.done.load(Ordering::Acquire) < parts {
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    if let Ok(mut j) = pool.job.lock() {
        j.take();
    }
    if job.panicked.load(Ordering::Relaxed) {
        panic!("a part of a pooled job panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every part runs exactly once, from one caller or several at once, and
    /// a job after an idle gap (sleeping helpers) still finishes.
    #[test]
    fn every_part_runs_once() {
        set_threads(3);
        let check = |parts: usize| {
            let hits: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
            run(parts, &|p| {
                hits[p].fetch_add(1, Ordering::Relaxed);
            });
            assert!(
                hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                "{parts}"
            );
        };
        for parts in [0, 1, 2, 7, 64, 1000] {
            check(parts);
        }
        std::thread::sleep(SPIN * 5);
        check(100);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..50).for_each(|k| check(k % 9 + 1)));
            }
        });
    }
}
