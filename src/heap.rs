//! The process's allocator: mimalloc for small blocks; for large ones
//! (tensors' storage) whole page mappings, which a training run keeps and
//! reuses by exact size.
//!
//! A training step allocates and frees tensors of the same sizes over and
//! over, on every device thread. mimalloc keeps freed pages in the heap of the
//! thread that allocated them, by size class: on a mesh of 8 virtual devices
//! each thread's heap held its own high-water mark of each class, and GPT-J
//! d_model 768 peaked at 1.41× its plan (1.22× on one device; 1.17× with this
//! pool, which also made the 8-device steps faster). glibc returns
//! large blocks to the system and page-faults them in again every step. This
//! pool does at run time what XLA's static buffer assignment does ahead of
//! it: a large block freed on any thread goes on one list per exact size (in
//! pages), the next request of that size on any thread takes it back, and
//! once every size a step uses has its blocks, a step maps and faults in no
//! new pages. [`step_done`], called once per training step, returns
//! to the system the blocks of each size that stayed free through the whole
//! step (a size the step no longer asks for, or more blocks of one than the
//! step holds at once), so sizes that change (a reload, checkpoint gathers)
//! do not accumulate.
//!
//! Pooling starts with [`steps_begin`]: before it (compiling, reading data,
//! and in commands that do not train, such as the language server) a large
//! block is mapped when allocated and unmapped when freed, as glibc does.
//!
//! Small blocks (below [`LARGE`]) and over-aligned ones stay with mimalloc,
//! built without transparent huge pages (`no_thp` in Cargo.toml): with them,
//! every 2 MiB a thread's heap touched stayed resident, 20–70 MiB more per
//! process on the benchmark's models (bench/jax). The binary installs
//! [`Heap`] as its global allocator (src/main.rs); in a program that does not,
//! the pool stays empty and these functions do nothing.

use std::alloc::{GlobalAlloc, Layout};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Blocks from this size up are whole mappings, pooled while training.
pub const LARGE: usize = 64 << 10;
const PAGE: usize = 4096;
/// Distinct block sizes the pool tracks at once; a new size beyond them is
/// mapped and unmapped without pooling.
const BUCKETS: usize = 2048;

/// The global allocator of the `shardc` binary.
pub struct Heap;

#[derive(Clone, Copy)]
struct Bucket {
    /// Block size in bytes, a multiple of [`PAGE`].
    size: usize,
    /// The first free block; each free block holds the address of the next.
    head: usize,
    /// Free blocks on the list.
    free: usize,
    /// The fewest free blocks the list had since the last trim.
    low: usize,
    /// Whether a block of this size was asked for or freed since the last trim.
    touched: bool,
}

/// The sizes in use, sorted: found by binary search, and a size no step
/// touched and with no free block leaves at the next trim.
struct Table {
    len: usize,
    b: [Bucket; BUCKETS],
}

const UNUSED: Bucket = Bucket {
    size: 0,
    head: 0,
    free: 0,
    low: 0,
    touched: false,
};

static POOL: Mutex<Table> = Mutex::new(Table {
    len: 0,
    b: [UNUSED; BUCKETS],
});
static POOLING: AtomicBool = AtomicBool::new(false);

fn pages(n: usize) -> usize {
    n.div_ceil(PAGE) * PAGE
}

fn pooled(layout: &Layout) -> bool {
    layout.size() >= LARGE && layout.align() <= PAGE
}

impl Table {
    /// The bucket of `size`, added if there is room.
    fn bucket(&mut self, size: usize) -> Option<&mut Bucket> {
        let i = match self.b[..self.len].binary_search_by_key(&size, |b| b.size) {
            Ok(i) => i,
            Err(_) if self.len == BUCKETS => return None,
            Err(i) => {
                self.b.copy_within(i..self.len, i + 1);
                self.b[i] = Bucket { size, ..UNUSED };
                self.len += 1;
                i
            }
        };
        let b = &mut self.b[i];
        b.touched = true;
        Some(b)
    }
}

/// Takes the first block off `b`'s list.
fn pop(b: &mut Bucket) -> *mut u8 {
    let p = b.head as *mut u8;
    // SAFETY: a free block on the list holds the next one's address.
    b.head = unsafe { p.cast::<usize>().read() };
    b.free -= 1;
    p
}

fn map(size: usize) -> *mut u8 {
    // SAFETY: an anonymous private mapping, no address hint.
    let p = unsafe {
        libc::mmap(
            null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
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

fn unmap(p: *mut u8, size: usize) {
    // SAFETY: `p` is a mapping of `size` bytes made by `map` (or moved by
    // `mremap`), which nothing uses any more.
    unsafe {
        libc::munmap(p.cast(), size);
    }
}

/// A block of `size` bytes (a multiple of [`PAGE`]), and whether it is
/// freshly mapped, hence zero.
fn take(size: usize) -> (*mut u8, bool) {
    if POOLING.load(Ordering::Relaxed) {
        if let Ok(mut table) = POOL.lock() {
            if let Some(b) = table.bucket(size) {
                if b.free > 0 {
                    let p = pop(b);
                    b.low = b.low.min(b.free);
                    return (p, false);
                }
            }
        }
    }
    (map(size), true)
}

fn give(p: *mut u8, size: usize) {
    if POOLING.load(Ordering::Relaxed) {
        if let Ok(mut table) = POOL.lock() {
            if let Some(b) = table.bucket(size) {
                // SAFETY: the block is ours, at least a page, and unused.
                unsafe { p.cast::<usize>().write(b.head) };
                b.head = p as usize;
                b.free += 1;
                return;
            }
        }
    }
    unmap(p, size);
}

/// From here on, large blocks freed are kept for reuse; every block free now
/// is returned to the system (what a run's setup freed, such as initial
/// values in f64 and whole arrays cut into pieces, is not what its steps
/// use). Each device calls it before its first step.
pub fn steps_begin() {
    POOLING.store(true, Ordering::Relaxed);
    trim(true);
}

/// Returns to the system, for each block size, as many free blocks as stayed
/// free since the last call. The runtime calls it once per training step; a
/// size in steady use keeps its blocks.
pub fn step_done() {
    trim(false);
}

fn trim(all: bool) {
    // Blocks come off the lists in batches held on the stack and are
    // unmapped outside the lock: nothing here may allocate (an allocation
    // takes the same lock), and unmapping is slow.
    // The size to go on from: another thread may add sizes between batches.
    let mut from = 0;
    loop {
        let mut batch = [(0usize, 0usize); 64];
        let mut n = 0;
        let more = match POOL.lock() {
            Ok(mut table) => {
                let mut next = table.b[..table.len].partition_point(|b| b.size < from);
                while next < table.len && n < batch.len() {
                    from = table.b[next].size;
                    let b = &mut table.b[next];
                    if all {
                        b.low = b.free;
                    }
                    if b.low > 0 {
                        b.low -= 1;
                        batch[n] = (pop(b) as usize, b.size);
                        n += 1;
                    } else {
                        b.low = b.free;
                        next += 1;
                        from += 1;
                    }
                }
                if next == table.len {
                    // Sizes nothing asked for or freed all step, with no
                    // free block left, leave the table.
                    let len = table.len;
                    let mut kept = 0;
                    for i in 0..len {
                        let b = table.b[i];
                        if b.touched || b.free > 0 {
                            table.b[kept] = Bucket {
                                touched: false,
                                ..b
                            };
                            kept += 1;
                        }
                    }
                    table.len = kept;
                }
                next < table.len
            }
            Err(_) => return,
        };
        for &(p, size) in &batch[..n] {
            unmap(p as *mut u8, size);
        }
        if !more {
            return;
        }
    }
}

/// Bytes in free pooled blocks.
pub fn pooled_free() -> usize {
    POOL.lock()
        .map(|t| t.b[..t.len].iter().map(|b| b.size * b.free).sum())
        .unwrap_or(0)
}

// SAFETY: a large block is a whole mapping of `pages(size)` bytes, page
// aligned (so any alignment up to a page holds), with one owner until freed;
// everything else is mimalloc's. `dealloc` and `realloc` tell the two apart
// by the layout, which is the one the block was allocated with.
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
            let (p, fresh) = take(pages(layout.size()));
            if !fresh {
                // SAFETY: a pooled block of at least `layout.size()` bytes.
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
        match (pooled(&layout), pooled(&new)) {
            // SAFETY: the caller's contract, passed on.
            (false, false) => unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) },
            (true, true) => {
                let (old, want) = (pages(layout.size()), pages(new_size));
                if old == want {
                    return ptr;
                }
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
