/// A training step allocates and frees tensors of the same sizes over and
/// over; glibc's malloc returns large blocks to the system and page-faults
/// them in again each step, mimalloc keeps them.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    shardc::cli::main()
}
