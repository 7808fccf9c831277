//! The process's allocator: mimalloc for small blocks; for large ones
//! (tensors' storage) one arena of pages that a training run reuses for
//! blocks of any size.
//!
//! A training step allocates and frees tensors over and over, on every device
//! thread: activations in the forward pass, gradients in the backward pass,
//! optimizer temporaries after it. mimalloc keeps freed pages in the heap of
//! the thread that allocated them, by size class: on a mesh of 8 virtual
//! devices each thread's heap held its own high-water mark of each class, and
//! GPT-J d_model 768 peaked at 1.41× its plan. glibc returns large blocks to
//! the system and page-faults them in again every step. Keeping freed blocks
//! by exact size (this module's first form) faults nothing in once warm, but
//! holds the most of each size a step ever uses, although activations and
//! gradients are not all alive at once: 1.17× the plan. The arena does at run
//! time what XLA's static buffer assignment does ahead of it: a freed block's
//! pages serve the next request that fits, of whatever size, on any thread
//! (1.11× on d_model 768, 1.28× on 256 where the binary's own pages weigh
//! more, 1.03× on the full-size GPT-J, at the same step times). Resizing
//! pooled blocks to other sizes instead (`mremap`) got within 1.10× only by
//! faulting 40–80 MiB in every step, 6–14% slower.
//!
//! The arena is one reserved stretch of address space, handed out from the
//! bottom; free ranges are merged with their free neighbours and a request
//! takes the smallest free range that holds it (the lowest of equal ones), so
//! a step that repeats the last one's requests finds its pages resident and
//! faults nothing in. [`step_done`], called once per training step, returns to
//! the system the free pages the step did not use (`madvise(MADV_DONTNEED)`;
//! of each free range it keeps the span of what the step freed there), so
//! what a step stops using (a reload, the first step's one-off buffers) does
//! not stay resident.
//!
//! Pooling starts with [`steps_begin`]: before it (compiling, reading data,
//! and in commands that do not train, such as the language server) a large
//! block is its own mapping, mapped when allocated and unmapped when freed,
//! as glibc does; so is a block the arena cannot hold (where address space is
//! short, or the reservation failed).
//!
//! Small blocks (below [`LARGE`]) and over-aligned ones stay with mimalloc,
//! built without transparent huge pages (`no_thp` in Cargo.toml): with them,
//! every 2 MiB a thread's heap touched stayed resident, 20–70 MiB more per
//! process on the benchmark's models (bench/jax). The binary installs
//! [`Heap`] as its global allocator (src/main.rs); in a program that does not,
//! the arena stays empty and these functions do nothing.

use std::alloc::{GlobalAlloc, Layout};
use std::collections::{BTreeMap, BTreeSet};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Blocks from this size up are pages of their own: in the arena while
/// training, else whole mappings.
pub const LARGE: usize = 64 << 10;
const PAGE: usize = 4096;
/// Address space reserved for the arena, the first size the system grants
/// (reserving costs no memory; pages become usable as the arena grows).
const RESERVE: [usize; 3] = [1 << 40, 1 << 36, 1 << 32];
/// The arena is made usable (writable) in steps of this many bytes.
const COMMIT: usize = 64 << 20;
/// Ranges [`step_done`] releases, at most, per visit to the lock.
const BATCH: usize = 64;

/// The global allocator of the `shardc` binary.
pub struct Heap;

/// A free range of the arena.
#[derive(Clone, Copy)]
struct Free {
    len: usize,
    /// Whether its pages are all zero (never handed out, or released):
    /// such a range holds no memory, and merges only with its like.
    zero: bool,
    /// The addresses `lo..hi` span what of it was freed in step `step`: the
    /// part a step uses, which the trim at its end keeps.
    step: u64,
    lo: usize,
    hi: usize,
}

impl Free {
    /// The part used in step `step`, if any.
    fn hot(&self, step: u64) -> Option<(usize, usize)> {
        (self.step == step && self.lo < self.hi).then_some((self.lo, self.hi))
    }
}

/// The arena's bookkeeping. Its maps allocate small nodes, which mimalloc
/// serves: nothing here asks for a large block, so holding the lock while
/// they allocate cannot deadlock.
struct Arena {
    /// The reservation's start; 0 until the first request while pooling.
    base: usize,
    /// Bytes reserved.
    cap: usize,
    /// Bytes from `base` ever handed out; above it, nothing is in use.
    top: usize,
    /// Bytes from `base` made writable.
    committed: usize,
    /// Free ranges below `top` by start address.
    free: BTreeMap<usize, Free>,
    /// The same, by (length, start), for the smallest that fits.
    by_len: BTreeSet<(usize, usize)>,
    /// Training steps done.
    step: u64,
    /// Whether reserving failed (then every large block is its own mapping).
    failed: bool,
}

static ARENA: Mutex<Arena> = Mutex::new(Arena {
    base: 0,
    cap: 0,
    top: 0,
    committed: 0,
    free: BTreeMap::new(),
    by_len: BTreeSet::new(),
    step: 0,
    failed: false,
});
static POOLING: AtomicBool = AtomicBool::new(false);

fn pages(n: usize) -> usize {
    n.div_ceil(PAGE) * PAGE
}

fn pooled(layout: &Layout) -> bool {
    layout.size() >= LARGE && layout.align() <= PAGE
}

fn mmap(size: usize, prot: libc::c_int, flags: libc::c_int) -> *mut u8 {
    // SAFETY: an anonymous private mapping, no address hint.
    let p = unsafe {
        libc::mmap(
            null_mut(),
            size,
            prot,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        null_mut()
    } else {
        p.cast()
    }
}

/// A block of its own, zero.
fn map(size: usize) -> *mut u8 {
    mmap(size, libc::PROT_READ | libc::PROT_WRITE, 0)
}

fn unmap(p: *mut u8, size: usize) {
    // SAFETY: `p` is a mapping of `size` bytes made by `map` (or moved by
    // `mremap`), which nothing uses any more.
    unsafe {
        libc::munmap(p.cast(), size);
    }
}

impl Arena {
    fn holds(&self, p: usize) -> bool {
        self.base != 0 && p >= self.base && p < self.base + self.cap
    }

    /// Reserves the address space, once.
    fn reserve(&mut self) -> bool {
        if self.base != 0 {
            return true;
        }
        if self.failed {
            return false;
        }
        for cap in RESERVE {
            let p = mmap(cap, libc::PROT_NONE, libc::MAP_NORESERVE);
            if !p.is_null() {
                self.base = p as usize;
                self.cap = cap;
                return true;
            }
        }
        self.failed = true;
        false
    }

    fn insert(&mut self, start: usize, f: Free) {
        self.free.insert(start, f);
        self.by_len.insert((f.len, start));
    }

    fn remove(&mut self, start: usize) -> Option<Free> {
        let f = self.free.remove(&start)?;
        self.by_len.remove(&(f.len, start));
        Some(f)
    }

    /// `size` bytes, and whether they are zero; `None` where the arena
    /// cannot hold them.
    fn take(&mut self, size: usize) -> Option<(*mut u8, bool)> {
        if !self.reserve() {
            return None;
        }
        if let Some(&(len, start)) = self.by_len.range((size, 0)..).next() {
            let f = self.remove(start)?;
            if len > size {
                let rest = start + size;
                self.insert(
                    rest,
                    Free {
                        len: len - size,
                        lo: f.lo.max(rest),
                        hi: f.hi.max(rest),
                        ..f
                    },
                );
            }
            return Some((start as *mut u8, f.zero));
        }
        // Nothing free holds it: grow the arena, starting at the free range
        // that ends at the top, if there is one.
        let end = self.base + self.top;
        let (start, zero) = match self.free.range(..end).next_back() {
            Some((&s, f)) if s + f.len == end => (s, f.zero),
            _ => (end, true),
        };
        let top = start - self.base + size;
        if top > self.cap {
            return None;
        }
        if top > self.committed {
            let want = top.next_multiple_of(COMMIT).min(self.cap);
            // SAFETY: a part of the reservation, which only this arena uses.
            let r = unsafe {
                libc::mprotect(
                    (self.base + self.committed) as *mut libc::c_void,
                    want - self.committed,
                    libc::PROT_READ | libc::PROT_WRITE,
                )
            };
            if r != 0 {
                return None;
            }
            self.committed = want;
        }
        if start < end {
            self.remove(start);
        }
        self.top = top;
        Some((start as *mut u8, zero))
    }

    /// Frees `len` bytes at `p` (pages in use, or `zero`: released), merged
    /// with free neighbours of the same kind.
    fn give(&mut self, p: usize, len: usize, zero: bool) {
        let step = self.step;
        let mut f = Free {
            len,
            zero,
            step,
            lo: p,
            hi: if zero { p } else { p + len },
        };
        let mut start = p;
        let merge = |f: &mut Free, g: &Free| {
            f.len += g.len;
            match (f.hot(step), g.hot(step)) {
                (Some((a, b)), Some((c, d))) => (f.lo, f.hi) = (a.min(c), b.max(d)),
                (None, Some(h)) => (f.lo, f.hi) = h,
                _ => {}
            }
        };
        if let Some((&s, &prev)) = self.free.range(..p).next_back() {
            if s + prev.len == p && prev.zero == zero {
                self.remove(s);
                start = s;
                merge(&mut f, &prev);
            }
        }
        if let Some(&next) = self.free.get(&(p + len)) {
            if next.zero == zero {
                self.remove(p + len);
                merge(&mut f, &next);
            }
        }
        self.insert(start, f);
    }

    /// For the trim at the end of the step: takes up to [`BATCH`] free
    /// ranges from address `from` on with pages the step did not use, keeps
    /// the part it did, and puts the others in `out`; returns where to go on
    /// from.
    fn stale(&mut self, from: usize, out: &mut Vec<(usize, usize)>) -> Option<usize> {
        let step = self.step;
        let found: Vec<usize> = self
            .free
            .range(from..)
            .filter(|(&s, f)| !f.zero && f.hot(step) != Some((s, s + f.len)))
            .map(|(&s, _)| s)
            .take(BATCH)
            .collect();
        for &s in &found {
            let Some(f) = self.remove(s) else { continue };
            match f.hot(step) {
                Some((lo, hi)) => {
                    self.insert(lo, Free { len: hi - lo, ..f });
                    out.extend(
                        [(s, lo - s), (hi, s + f.len - hi)]
                            .into_iter()
                            .filter(|c| c.1 > 0),
                    );
                }
                None => out.push((s, f.len)),
            }
        }
        (found.len() == BATCH).then(|| found[BATCH - 1] + 1)
    }
}

/// A block of `size` bytes (a multiple of [`PAGE`]), and whether it is zero.
fn take(size: usize) -> (*mut u8, bool) {
    if POOLING.load(Ordering::Relaxed) {
        if let Ok(mut arena) = ARENA.lock() {
            if let Some(got) = arena.take(size) {
                return got;
            }
        }
    }
    (map(size), true)
}

fn give(p: *mut u8, size: usize) {
    // Arena blocks exist only once pooling has begun (it never ends): before
    // that, and in commands that do not train, no lock is taken.
    if POOLING.load(Ordering::Relaxed) {
        if let Ok(mut arena) = ARENA.lock() {
            if arena.holds(p as usize) {
                arena.give(p as usize, size, false);
                return;
            }
        }
    }
    unmap(p, size);
}

/// From here on, large blocks come from the arena and go back to it. Each
/// device calls it before its first step.
pub fn steps_begin() {
    POOLING.store(true, Ordering::Relaxed);
}

/// Returns to the system the arena's free pages that the step which ended
/// did not use (of each free range, all but the span of what the step freed
/// in it). The runtime calls it once per training step; what a step keeps
/// using stays resident.
pub fn step_done() {
    let mut from = 0;
    loop {
        // Ranges come off the lists while they are released, so that no one
        // is handed pages the kernel is zeroing; the system calls are made
        // outside the lock.
        let mut batch = Vec::with_capacity(2 * BATCH);
        let more = match ARENA.lock() {
            Ok(mut arena) => arena.stale(from, &mut batch),
            Err(_) => return,
        };
        for &(p, len) in &batch {
            // SAFETY: a free range of the arena, off the lists: no one
            // uses it; its pages read as zero afterwards.
            unsafe {
                libc::madvise(p as *mut libc::c_void, len, libc::MADV_DONTNEED);
            }
        }
        if let Ok(mut arena) = ARENA.lock() {
            for &(p, len) in &batch {
                arena.give(p, len, true);
            }
        }
        match more {
            Some(next) => from = next,
            None => break,
        }
    }
    if let Ok(mut arena) = ARENA.lock() {
        arena.step += 1;
    }
}

/// Faults in, writable, the whole pages inside `len` bytes from `ptr`, in one
/// system call, where the kernel has one (Linux ≥ 5.14; elsewhere, and on
/// failure, nothing happens: the pages fault in when used). For memory that
/// is about to be read and then written, and reads as zero until then: the
/// first read would map the shared zero page and the first write replace it
/// (copy-on-write, which flushes the TLB of every core the process runs on).
pub fn populate_write(ptr: *const u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        let page = 4096usize;
        let start = (ptr as usize).div_ceil(page) * page;
        let end = (ptr as usize).saturating_add(len) / page * page;
        if end > start {
            // SAFETY: whole pages inside memory the caller owns; populating
            // changes no byte of it.
            unsafe {
                libc::madvise(
                    start as *mut libc::c_void,
                    end - start,
                    libc::MADV_POPULATE_WRITE,
                );
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}

/// Bytes in free ranges of the arena whose pages are still resident.
pub fn pooled_free() -> usize {
    ARENA
        .lock()
        .map(|a| a.free.values().filter(|f| !f.zero).map(|f| f.len).sum())
        .unwrap_or(0)
}

// SAFETY: a large block is page aligned (so any alignment up to a page
// holds), `pages(size)` bytes, either in the arena or a whole mapping, with
// one owner until freed; everything else is mimalloc's. `dealloc` and
// `realloc` tell the two apart by the layout, which is the one the block was
// allocated with, and arena blocks from whole mappings by address.
unsafe impl GlobalAlloc for Heap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if pooled(&layout) {
            take(pages(layout.size())).0
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { mimalloc::MiMalloc.alloc(layout) }
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if pooled(&layout) {
            let (p, zero) = take(pages(layout.size()));
            if !zero && !p.is_null() {
                // SAFETY: a block of at least `layout.size()` bytes.
                unsafe { p.write_bytes(0, layout.size()) };
            }
            p
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { mimalloc::MiMalloc.alloc_zeroed(layout) }
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if pooled(&layout) {
            give(ptr, pages(layout.size()));
        } else {
            // SAFETY: the caller's contract, passed on.
            unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) }
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees that `new_size` with this alignment
        // is a valid layout.
        let new = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let own_mapping = || ARENA.lock().map(|a| !a.holds(ptr as usize)).unwrap_or(true);
        let (old, want) = (pages(layout.size()), pages(new_size));
        match (pooled(&layout), pooled(&new)) {
            // SAFETY: the caller's contract, passed on.
            (false, false) => unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) },
            (true, true) if old == want => ptr,
            (true, true) if own_mapping() => {
                // SAFETY: `ptr` is a whole mapping of `old` bytes; the kernel
                // grows, shrinks or moves it without copying its pages.
                let p = unsafe { libc::mremap(ptr.cast(), old, want, libc::MREMAP_MAYMOVE) };
                if p == libc::MAP_FAILED {
                    null_mut()
                } else {
                    p.cast()
                }
            }
            _ => {
                // SAFETY: a fresh block of the new layout; both hold at least
                // the smaller size; the old one is freed with its own layout.
                unsafe {
                    let p = self.alloc(new);
                    if !p.is_null() {
                        std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
                        self.dealloc(ptr, layout);
                    }
                    p
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::populate_write;

    /// Populating changes no byte, whatever the range: unaligned, shorter
    /// than a page, empty, or pages that were never touched.
    #[test]
    fn populating_keeps_every_byte() {
        let mut v: Vec<u8> = (0..3 * 4096 + 100).map(|i| (i % 251) as u8).collect();
        let want = v.clone();
        populate_write(v.as_ptr(), v.len());
        populate_write(v[7..].as_ptr(), 5000);
        populate_write(v[1..].as_ptr(), 10);
        populate_write(v.as_ptr(), 0);
        assert_eq!(v, want);
        v[4096] = 9;
        assert_eq!(v[4096], 9);
        // Zeroed memory the allocator may hand out untouched reads as zero
        // after it too.
        let z = vec![0f32; 1 << 18];
        populate_write(z.as_ptr() as *const u8, z.len() * 4);
        assert!(z.iter().all(|x| *x == 0.0));
    }
}
