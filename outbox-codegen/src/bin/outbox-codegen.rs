//! `outbox-codegen`: check, diff and retire schema registry folders.

fn main() -> std::process::ExitCode {
    outbox_codegen::cli::run()
}
