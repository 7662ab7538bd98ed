//! `spinwire-stat`: see `spinwire-stat --help` and the `spinwire_stat` library docs.

fn main() -> std::process::ExitCode {
    spinwire_stat::main_with_args(std::env::args_os())
}
