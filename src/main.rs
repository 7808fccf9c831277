/// A training step allocates and frees tensors of the same sizes over and
/// over; glibc's malloc returns large blocks to the system and page-faults
/// them in again each step, mimalloc keeps them. Built without transparent
/// huge pages (`no_thp` in Cargo.toml): with them, every 2 MiB a thread's heap
/// touched stayed resident, 20–70 MiB more per process on the benchmark's
/// models (bench/jax), for at most a few percent of speed on the largest.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    shardc::cli::main()
}
