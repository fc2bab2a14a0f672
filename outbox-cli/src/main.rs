//! The generic `outbox` binary: no event contracts are linked into it, so
//! every payload value is masked (or only `--redact-keys`). A service builds
//! its own binary with its contracts linked in; see the crate docs.

fn main() -> std::process::ExitCode {
    outbox_cli::run()
}
