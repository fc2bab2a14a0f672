//! The CI hook: `assert_registry_up_to_date!` in a binary whose contracts
//! are `parcel.sent` v1 and v2, with `OUTBOX_REGISTRY_WRITE` unset (check
//! only), `1` (write new versions, refuse changed published ones) and
//! `force`; and the CLI's `check-code` and `write`, which need linked
//! contracts. The environment variable is set for a child run of this test
//! binary, never in this process.

mod common;
#[path = "common/parcel.rs"]
mod parcel;

use std::path::Path;
use std::process::{Command, ExitCode, Output};

use clap::Parser;
use outbox_codegen::cli::{Cli, run_with};
use outbox_codegen::{WRITE_ENV, WriteMode};
use outbox_core::{ContractRegistry, OutboxEvent};

use common::{copy_fixture, fixture, snapshot};

/// Set by the parent tests: the folder the child run checks.
const CHILD_DIR: &str = "OUTBOX_CODEGEN_TEST_REGISTRY";

/// The hook as a crate would write it, on the committed fixture; in a
/// child run, on the folder the parent gives.
#[test]
fn registry_is_up_to_date() {
    match std::env::var_os(CHILD_DIR) {
        Some(dir) => outbox_codegen::assert_up_to_date(Path::new(&dir)),
        None => outbox_codegen::assert_registry_up_to_date!("tests/fixtures/registry/parcel"),
    }
}

/// Runs `registry_is_up_to_date` in a child process on `dir`.
fn run_child(dir: &Path, write: Option<&str>) -> (bool, String) {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "registry_is_up_to_date",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DIR, dir)
        .env_remove(WRITE_ENV);
    if let Some(value) = write {
        command.env(WRITE_ENV, value);
    }
    let Output {
        status,
        stdout,
        stderr,
    } = command.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&stdout),
        String::from_utf8_lossy(&stderr)
    );
    (status.success(), text)
}

/// A registry folder holding `parcel.sent` v1 only.
fn v1_only() -> (tempfile::TempDir, std::path::PathBuf) {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("schemas");
    let registry = ContractRegistry::from_contracts([parcel::ParcelSentV1::contract()]).unwrap();
    outbox_codegen::write_with(&registry, &dir, WriteMode::Safe).unwrap();
    (temp, dir)
}

#[test]
fn an_up_to_date_folder_passes_and_prints_the_report() {
    let (_temp, dir) = copy_fixture("registry/parcel");
    let (ok, output) = run_child(&dir, None);
    assert!(ok, "{output}");
    assert!(
        output.contains(&format!(
            "schema registry check of {}: ok: 0 error(s), 0 warning(s), 1 note(s)",
            dir.display()
        )),
        "{output}"
    );
    assert_eq!(snapshot(&dir), snapshot(&fixture("registry/parcel")));
}

#[test]
fn a_new_version_fails_the_check_until_written() {
    let (_temp, dir) = v1_only();
    let before = snapshot(&dir);
    let (ok, output) = run_child(&dir, None);
    assert!(!ok, "{output}");
    for expected in [
        "error[missing-in-registry] parcel.sent v2: test_assert_up_to_date::parcel::ParcelSent is \
         in code but not in the registry folder",
        &format!(
            "The schema registry in {} does not match the event contracts. New versions: rerun \
             with OUTBOX_REGISTRY_WRITE=1 and commit the files.",
            dir.display()
        ),
    ] {
        assert!(output.contains(expected), "{expected}\n---\n{output}");
    }
    assert_eq!(
        snapshot(&dir),
        before,
        "nothing is written without the variable"
    );

    let (ok, output) = run_child(&dir, Some("1"));
    assert!(ok, "{output}");
    for file in ["asyncapi.json", "parcel.sent/v2.json", "registry.json"] {
        let line = format!("wrote {}", dir.join(file).display());
        assert!(output.contains(&line), "{line}\n---\n{output}");
    }
    assert_eq!(snapshot(&dir), snapshot(&fixture("registry/parcel")));
}

#[test]
fn a_changed_published_version_is_refused_unless_forced() {
    // `diff/frozen_changed/new` is a consistent folder whose v1 differs from
    // the v1 struct of this binary.
    let (_temp, dir) = copy_fixture("diff/frozen_changed/new");
    let before = snapshot(&dir);

    let (ok, output) = run_child(&dir, None);
    assert!(!ok, "{output}");
    assert!(
        output.contains(
            "error[frozen-changed] parcel.sent v1 at /properties/weight_grams: the published \
             schema changed (field `weight_grams`: type changed from string to integer \
             [breaking]; breaking); a published version is frozen: revert v1 and make the change \
             in a new version 3 with `upcast_from = ParcelSent` (v2)"
        ),
        "{output}"
    );
    assert!(
        output.contains(
            "A changed published version: revert it and add a new version with an upcaster."
        ),
        "{output}"
    );

    for value in ["1", "yes"] {
        let (ok, output) = run_child(&dir, Some(value));
        assert!(!ok, "{output}");
        assert!(
            output.contains("refusing to write the registry:"),
            "{output}"
        );
        assert_eq!(snapshot(&dir), before, "{WRITE_ENV}={value} wrote files");
    }

    let (ok, output) = run_child(&dir, Some("force"));
    assert!(ok, "{output}");
    assert!(
        output.contains(&format!(
            "wrote {}",
            dir.join("parcel.sent/v1.json").display()
        )),
        "{output}"
    );
    assert_eq!(snapshot(&dir), snapshot(&fixture("registry/parcel")));
}

#[test]
fn the_cli_checks_the_linked_contracts() {
    let parse = |args: &[&str]| Cli::try_parse_from(args).unwrap();
    let (_temp, dir) = copy_fixture("registry/parcel");
    let path = dir.to_str().unwrap();
    assert_eq!(
        run_with(parse(&["outbox-codegen", "check-code", path])),
        ExitCode::SUCCESS
    );
    let (_temp, changed) = copy_fixture("diff/frozen_changed/new");
    let changed_path = changed.to_str().unwrap();
    assert_eq!(
        run_with(parse(&[
            "outbox-codegen",
            "--format",
            "json",
            "check-code",
            changed_path
        ])),
        ExitCode::from(1)
    );
    let missing = dir.join("missing");
    assert_eq!(
        run_with(parse(&[
            "outbox-codegen",
            "check-code",
            missing.to_str().unwrap()
        ])),
        ExitCode::from(2)
    );
}

#[test]
fn the_cli_writes_from_the_linked_contracts() {
    let parse = |args: &[&str]| Cli::try_parse_from(args).unwrap();
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("schemas");
    assert_eq!(
        run_with(parse(&["outbox-codegen", "write", dir.to_str().unwrap()])),
        ExitCode::SUCCESS
    );
    assert_eq!(snapshot(&dir), snapshot(&fixture("registry/parcel")));

    let (_temp, changed) = copy_fixture("diff/frozen_changed/new");
    let before = snapshot(&changed);
    let path = changed.to_str().unwrap();
    assert_eq!(
        run_with(parse(&["outbox-codegen", "write", path])),
        ExitCode::from(1)
    );
    assert_eq!(snapshot(&changed), before);
    assert_eq!(
        run_with(parse(&["outbox-codegen", "write", path, "--force"])),
        ExitCode::SUCCESS
    );
    assert_eq!(snapshot(&changed), snapshot(&fixture("registry/parcel")));
}
