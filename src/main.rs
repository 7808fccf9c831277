fn main() -> std::process::ExitCode {
    shardc::cli::main()
}
