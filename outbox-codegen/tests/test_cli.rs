//! The `outbox-codegen` binary: `check`, `diff` and `retire` on folders, a
//! summary line then one line per finding, `--format json`, and the exit
//! codes (0 clean, 1 findings with errors, 2 bad input or arguments);
//! `write` and `check-code` need linked contracts and refuse in the bare
//! binary. Nothing is written except by `retire`.

mod common;

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use common::{copy_fixture, fixture, snapshot};

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(args: &[&str]) -> Run {
    let output = Command::new(env!("CARGO_BIN_EXE_outbox-codegen"))
        .args(args)
        .output()
        .unwrap();
    Run {
        code: output.status.code().expect("exit code"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

fn path(dir: &Path) -> &str {
    dir.to_str().unwrap()
}

const V2_NOTE: &str = "note[compatibility] parcel.sent v2: v1 → v2: forward (required field \
                       `carrier` added [forward]); allowed because an upcaster exists (typed \
                       from v1)";

#[test]
fn check_of_a_clean_folder_exits_0_with_a_summary_line() {
    let dir = fixture("registry/parcel");
    let before = snapshot(&dir);
    let out = run(&["check", path(&dir)]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        format!(
            "schema registry check of {}: ok: 0 error(s), 0 warning(s), 1 note(s)\n{V2_NOTE}\n",
            dir.display()
        )
    );
    assert_eq!(out.stderr, "");
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn check_with_errors_exits_1_with_one_line_per_finding() {
    let dir = fixture("registry/hash_mismatch");
    let out = run(&["check", path(&dir)]);
    assert_eq!(out.code, 1);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{}", out.stdout);
    assert_eq!(
        lines[0],
        format!(
            "schema registry check of {}: FAILED: 2 error(s), 0 warning(s), 1 note(s)",
            dir.display()
        )
    );
    assert!(
        lines[1].starts_with(
            "error[hash-mismatch] parcel.sent v1: parcel.sent/v1.json does not match the hash in \
             registry.json"
        ),
        "{}",
        lines[1]
    );
    assert_eq!(
        lines[2],
        "error[manifest-stale] registry.json at /event_types/0/versions/0/sha256: registry.json \
         is not what the schemas produce; regenerate it with OUTBOX_REGISTRY_WRITE=1"
    );
    assert!(lines[3].starts_with("note[compatibility] parcel.sent v2: "));
}

#[test]
fn check_as_json() {
    let dir = fixture("registry/parcel_hole");
    for args in [
        vec!["--format", "json", "check", path(&dir)],
        vec!["check", path(&dir), "--format", "json"],
    ] {
        let out = run(&args);
        assert_eq!(out.code, 1);
        let report: Value = serde_json::from_str(&out.stdout).unwrap();
        assert_eq!(
            report,
            json!({
                "subject": format!("schema registry check of {}", dir.display()),
                "ok": false,
                "errors": 1,
                "warnings": 0,
                "notes": 0,
                "findings": [{
                    "severity": "error",
                    "kind": "chain-hole",
                    "event_type": "parcel.sent",
                    "version": 2,
                    "message": "the version chain has a hole: v2 is neither in the registry nor \
                                retired (versions run 1..=3)"
                }]
            })
        );
    }
    let out = run(&[
        "--format",
        "json",
        "check",
        path(&fixture("registry/parcel")),
    ]);
    assert_eq!(out.code, 0);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["ok"], true);
    assert_eq!(report["findings"][0]["kind"], "compatibility");
}

#[test]
fn diff_exit_codes_and_lines() {
    let case = |name: &str| {
        (
            fixture(&format!("diff/{name}/old")),
            fixture(&format!("diff/{name}/new")),
        )
    };
    let (old, new) = case("identical");
    let out = run(&["diff", path(&old), path(&new)]);
    assert_eq!(out.code, 0);
    assert_eq!(
        out.stdout,
        format!(
            "schema registry diff {} → {}: ok: 0 error(s), 0 warning(s), 0 note(s)\n",
            old.display(),
            new.display()
        )
    );

    let (old, new) = case("docs_changed");
    let out = run(&["diff", path(&old), path(&new)]);
    assert_eq!(out.code, 0);
    assert_eq!(
        out.stdout.lines().nth(1),
        Some(
            "warning[docs-changed] parcel.sent v1 at /properties/weight_grams/description: only \
             documentation changed (descriptions, titles); not a contract change. Refresh the \
             file with OUTBOX_REGISTRY_WRITE=1"
        )
    );

    let (old, new) = case("frozen_changed");
    let (before_old, before_new) = (snapshot(&old), snapshot(&new));
    let out = run(&["diff", path(&old), path(&new)]);
    assert_eq!(out.code, 1);
    assert_eq!(
        out.stdout.lines().nth(1),
        Some(
            "error[frozen-changed] parcel.sent v1 at /properties/weight_grams: the published \
             schema changed (field `weight_grams`: type changed from integer to string \
             [breaking]; breaking); a published version is frozen: add version 3 with an \
             upcaster instead"
        )
    );
    assert_eq!((snapshot(&old), snapshot(&new)), (before_old, before_new));

    let out = run(&["diff", path(&old), path(&new), "--format", "json"]);
    assert_eq!(out.code, 1);
    let report: Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(report["errors"], 1);
    assert_eq!(report["findings"][0]["kind"], "frozen-changed");
    assert_eq!(report["findings"][0]["version"], 1);
    assert_eq!(report["findings"][0]["path"], "/properties/weight_grams");

    let (old, new) = case("version_added_breaking");
    assert_eq!(run(&["diff", path(&old), path(&new)]).code, 1);
    let (old, new) = case("version_retired");
    assert_eq!(run(&["diff", path(&old), path(&new)]).code, 0);
}

#[test]
fn bad_input_exits_2_naming_the_file() {
    let good = fixture("registry/parcel");
    let bad = fixture("bad/manifest_not_json");
    let message = format!(
        "error: {} is not valid JSON: EOF while parsing a value at line 12 column 1\n",
        bad.join("registry.json").display()
    );
    for args in [
        vec!["check", path(&bad)],
        vec!["--format", "json", "check", path(&bad)],
        vec!["diff", path(&good), path(&bad)],
        vec!["diff", path(&bad), path(&good)],
    ] {
        let out = run(&args);
        assert_eq!(out.code, 2, "{args:?}");
        assert_eq!(out.stdout, "", "{args:?}");
        assert_eq!(out.stderr, message, "{args:?}");
    }
    let schema = fixture("bad/schema_bad_ref");
    let out = run(&["check", path(&schema)]);
    assert_eq!(out.code, 2);
    assert_eq!(
        out.stderr,
        format!(
            "error: {} is not a valid JSON Schema at /properties/weight_grams/$ref: `$ref` \
             \"#/$defs/Grams\" does not resolve inside the file\n",
            schema.join("parcel.sent/v1.json").display()
        )
    );
    let missing = fixture("no/such/folder");
    let out = run(&["check", path(&missing)]);
    assert_eq!(out.code, 2);
    assert_eq!(
        out.stderr,
        format!(
            "error: registry folder {} does not exist (generate it by running the registry test \
             with OUTBOX_REGISTRY_WRITE=1)\n",
            missing.display()
        )
    );
}

#[test]
fn bad_arguments_exit_2_and_help_exits_0() {
    let dir = fixture("registry/parcel");
    for args in [
        vec![],
        vec!["frobnicate"],
        vec!["check"],
        vec!["diff", path(&dir)],
        vec!["--format", "yaml", "check", path(&dir)],
        vec!["retire", path(&dir), "parcel.sent", "1"],
        vec!["retire", path(&dir), "parcel.sent", "one", "--reason", "x"],
    ] {
        let out = run(&args);
        assert_eq!(out.code, 2, "{args:?}: {}", out.stderr);
        assert!(!out.stderr.is_empty(), "{args:?}");
    }
    let out = run(&["--help"]);
    assert_eq!(out.code, 0);
    for command in ["check", "diff", "retire", "check-code", "write"] {
        assert!(out.stdout.contains(command), "{command}: {}", out.stdout);
    }
}

#[test]
fn retire_records_the_reason_and_the_folder_checks_clean() {
    let (_temp, dir) = copy_fixture("registry/parcel_and_lost");
    let out = run(&[
        "retire",
        path(&dir),
        "parcel.lost",
        "1",
        "--reason",
        "never emitted in production",
    ]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout,
        format!("retired parcel.lost v1 in {}\n", dir.display())
    );
    assert!(!dir.join("parcel.lost/v1.json").exists());
    assert!(
        common::read(&dir, "registry.json").contains("\"reason\": \"never emitted in production\"")
    );
    let out = run(&["check", path(&dir)]);
    assert_eq!(out.code, 0, "{}", out.stdout);
}

#[test]
fn retire_refusals_exit_2_and_change_nothing() {
    let (_temp, dir) = copy_fixture("registry/parcel");
    let before = snapshot(&dir);
    for (args, message) in [
        (
            vec!["retire", path(&dir), "parcel.sent", "1", "--reason", " "],
            "error: a retirement needs a reason (--reason \"...\")\n".to_owned(),
        ),
        (
            vec!["retire", path(&dir), "parcel.found", "1", "--reason", "x"],
            format!("error: no event type parcel.found in {}\n", dir.display()),
        ),
        (
            vec!["retire", path(&dir), "parcel.sent", "3", "--reason", "x"],
            format!("error: parcel.sent has no v3 in {}\n", dir.display()),
        ),
    ] {
        let out = run(&args);
        assert_eq!(out.code, 2, "{args:?}");
        assert_eq!(out.stderr, message);
    }
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn commands_that_need_contracts_exit_2_in_the_bare_binary() {
    let (_temp, dir) = copy_fixture("registry/parcel");
    let before = snapshot(&dir);
    for args in [
        vec!["write", path(&dir)],
        vec!["write", path(&dir), "--force"],
        vec!["check-code", path(&dir)],
    ] {
        let out = run(&args);
        assert_eq!(out.code, 2, "{args:?}");
        assert!(
            out.stderr.starts_with(
                "error: no event contracts are linked into this binary; run this command from a \
                 binary of your crate that calls outbox_codegen::cli::run()"
            ),
            "{}",
            out.stderr
        );
    }
    assert_eq!(snapshot(&dir), before);
}
