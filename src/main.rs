//! The `shardc` binary: the command line (src/cli) over the library, with the
//! process's allocator.

/// Large blocks from one arena a training run reuses, small ones mimalloc's:
/// see src/heap.rs.
#[global_allocator]
static ALLOC: shardc::heap::Heap = shardc::heap::Heap;

fn main() -> std::process::ExitCode {
    shardc::cli::main()
}
