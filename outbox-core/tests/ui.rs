//! Compile-fail tests: one file per diagnostic of `#[derive(OutboxEvent)]`,
//! each with its committed `.stderr`. Regenerate after an intended change
//! with `TRYBUILD=overwrite cargo test -p outbox-core --test ui` and review
//! the diff.

#[test]
fn derive_diagnostics() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
