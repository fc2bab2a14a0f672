//! The `outbox` operator tool as a service builds it: its event contracts
//! (here the test and example contracts) linked in, so payloads are shown
//! with their `redact` fields masked.

#[allow(unused_extern_crates)]
extern crate outbox_examples;
#[allow(unused_extern_crates)]
extern crate outbox_tests;

fn main() -> std::process::ExitCode {
    outbox_cli::run()
}
