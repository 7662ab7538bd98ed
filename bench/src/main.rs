//! The `bench` binary: see `bench --help` and the `spinwire_bench` library docs.

fn main() -> std::process::ExitCode {
    spinwire_bench::main_with_args(std::env::args_os())
}
