//! The check of a registry folder on its own (`check_folder`, what the CLI's
//! `check` runs): chain holes, missing upcasters, schema files edited by
//! hand (hash), stale `registry.json` / `asyncapi.json`, stray files; and
//! reading a folder (`load`) into the model. Checking never writes.

mod common;

use std::path::Path;

use outbox_codegen::{
    Finding, FindingKind, Report, Severity, UpcastEntry, UpcastKind, check_folder,
    strip_annotations, to_canonical_string,
};
use serde_json::Value;
use sha2::{Digest, Sha256};

use FindingKind::*;
use Severity::*;

/// Severity, kind, event type (or file), version, path, message.
type Row<'a> = (
    Severity,
    FindingKind,
    &'a str,
    Option<u32>,
    Option<&'a str>,
    &'a str,
);

const V2_NOTE: &str = "v1 → v2: forward (required field `carrier` added [forward]); allowed \
                       because an upcaster exists (typed from v1)";

fn check(case: &str) -> Report {
    let dir = common::fixture(&format!("registry/{case}"));
    let before = common::snapshot(&dir);
    let report = check_folder(&dir).unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(
        report.subject,
        format!("schema registry check of {}", dir.display())
    );
    assert_eq!(common::snapshot(&dir), before, "check wrote into {case}");
    report
}

fn assert_findings(case: &str, expected: &[Row<'_>]) -> Report {
    let report = check(case);
    let expected: Vec<Finding> = expected
        .iter()
        .map(
            |(severity, kind, event_type, version, path, message)| Finding {
                severity: *severity,
                kind: *kind,
                event_type: (*event_type).to_owned(),
                version: *version,
                path: path.map(str::to_owned),
                message: (*message).to_owned(),
            },
        )
        .collect();
    assert_eq!(report.findings, expected, "{case}");
    report
}

/// The contract hash as documented: SHA-256 of the canonical text of the
/// schema without annotations.
fn contract_hash(dir: &Path, file: &str) -> String {
    let schema: Value = serde_json::from_str(&common::read(dir, file)).unwrap();
    let text = to_canonical_string(&strip_annotations(&schema));
    hex::encode(Sha256::digest(text.as_bytes()))
}

#[test]
fn a_consistent_folder_passes_with_the_class_of_each_step() {
    let report = assert_findings(
        "parcel",
        &[(Note, Compatibility, "parcel.sent", Some(2), None, V2_NOTE)],
    );
    assert!(!report.has_errors());
    assert!(
        report
            .summary()
            .ends_with(": ok: 0 error(s), 0 warning(s), 1 note(s)")
    );
    assert_findings(
        "parcel_and_lost",
        &[(Note, Compatibility, "parcel.sent", Some(2), None, V2_NOTE)],
    );
}

#[test]
fn a_retired_version_fills_its_place_in_the_chain() {
    assert_findings("parcel_retired_v1", &[]);
    let folder = outbox_codegen::load(&common::fixture("registry/parcel_retired_v1")).unwrap();
    let entry = &folder.model.event_types["parcel.sent"];
    assert_eq!(entry.versions.keys().copied().collect::<Vec<_>>(), vec![2]);
    assert_eq!(
        entry.retired.get(&1).map(String::as_str),
        Some("drained on 2024-05-01: no v1 payload left in any outbox or stream")
    );
    assert_eq!(entry.current_version(), 2);
}

#[test]
fn a_hole_in_the_version_chain_is_an_error() {
    let report = assert_findings(
        "parcel_hole",
        &[(
            Error,
            ChainHole,
            "parcel.sent",
            Some(2),
            None,
            "the version chain has a hole: v2 is neither in the registry nor retired (versions \
             run 1..=3)",
        )],
    );
    assert!(report.has_errors());
}

#[test]
fn a_version_without_upcaster_from_its_predecessor_is_an_error() {
    assert_findings(
        "missing_upcaster",
        &[(
            Error,
            MissingUpcaster,
            "parcel.sent",
            Some(2),
            None,
            "v2 has no upcaster from v1: add `upcast_from = <v1 struct>` or `upcast(from = 1, \
             with = path::to::fn)` to the v2 contract",
        )],
    );
}

#[test]
fn a_schema_edited_by_hand_does_not_match_its_hash() {
    let dir = common::fixture("registry/hash_mismatch");
    let actual = contract_hash(&dir, "parcel.sent/v1.json");
    let published = contract_hash(&common::fixture("registry/parcel"), "parcel.sent/v1.json");
    let message = format!(
        "parcel.sent/v1.json does not match the hash in registry.json (file {actual}, manifest \
         {published}); was it edited by hand?"
    );
    assert_findings(
        "hash_mismatch",
        &[
            (Error, HashMismatch, "parcel.sent", Some(1), None, &message),
            (
                Error,
                ManifestStale,
                "registry.json",
                None,
                Some("/event_types/0/versions/0/sha256"),
                "registry.json is not what the schemas produce; regenerate it with \
                 OUTBOX_REGISTRY_WRITE=1",
            ),
            (
                Note,
                Compatibility,
                "parcel.sent",
                Some(2),
                None,
                "v1 → v2: breaking (required field `carrier` added [forward]; field \
                 `weight_grams`: numeric range widened (1..=4294967295 → 0..=4294967295) \
                 [backward]); allowed because an upcaster exists (typed from v1)",
            ),
        ],
    );
}

#[test]
fn a_documentation_edit_keeps_the_hash() {
    let dir = common::fixture("registry/docs_edited");
    assert_ne!(
        common::read(&dir, "parcel.sent/v1.json"),
        common::read(&common::fixture("registry/parcel"), "parcel.sent/v1.json")
    );
    assert_eq!(
        common::read(&dir, "registry.json"),
        common::read(&common::fixture("registry/parcel"), "registry.json")
    );
    assert!(!check("docs_edited").has_errors());
}

#[test]
fn a_hand_edited_manifest_is_stale_at_the_edited_key() {
    assert_findings(
        "manifest_edited",
        &[
            (
                Error,
                ManifestStale,
                "registry.json",
                None,
                Some("/event_types/0/versions/1/compatibility"),
                "registry.json is not what the schemas produce; regenerate it with \
                 OUTBOX_REGISTRY_WRITE=1",
            ),
            (Note, Compatibility, "parcel.sent", Some(2), None, V2_NOTE),
        ],
    );
}

#[test]
fn a_hand_edited_asyncapi_document_is_stale() {
    assert_findings(
        "asyncapi_edited",
        &[
            (
                Error,
                AsyncApiStale,
                "asyncapi.json",
                None,
                Some("/info/title"),
                "asyncapi.json is not what the schemas produce; regenerate it with \
                 OUTBOX_REGISTRY_WRITE=1",
            ),
            (Note, Compatibility, "parcel.sent", Some(2), None, V2_NOTE),
        ],
    );
}

#[test]
fn a_schema_file_no_version_lists_is_an_error() {
    assert_findings(
        "unlisted_file",
        &[
            (
                Error,
                UnlistedFile,
                "parcel.sent/v9.json",
                None,
                None,
                "this file is in the registry folder but belongs to no version in \
                 registry.json; remove it or register its contract",
            ),
            (Note, Compatibility, "parcel.sent", Some(2), None, V2_NOTE),
        ],
    );
}

#[test]
fn files_that_are_not_json_are_ignored() {
    let (_temp, dir) = common::copy_fixture("registry/parcel");
    std::fs::write(dir.join("README.md"), "# schemas\n").unwrap();
    std::fs::write(dir.join("parcel.sent/v1.json.tmp"), "{").unwrap();
    let report = check_folder(&dir).unwrap();
    assert!(!report.has_errors(), "{}", report.render_text());
}

#[test]
fn load_rebuilds_the_model_from_manifest_and_schema_files() {
    let dir = common::fixture("registry/parcel");
    let folder = outbox_codegen::load(&dir).unwrap();
    assert_eq!(folder.dir, dir);
    assert_eq!(
        folder.files.keys().map(String::as_str).collect::<Vec<_>>(),
        vec![
            "asyncapi.json",
            "parcel.sent/v1.json",
            "parcel.sent/v2.json",
            "registry.json"
        ]
    );
    let entry = &folder.model.event_types["parcel.sent"];
    assert_eq!(entry.aggregate_type, "parcel");
    assert_eq!(entry.current_version(), 2);
    assert_eq!(entry.versions[&1].upcast_from, None);
    assert_eq!(
        entry.versions[&2].upcast_from,
        Some(UpcastEntry {
            version: 1,
            kind: UpcastKind::Typed
        })
    );
    assert_eq!(entry.versions[&2].redacted_fields, vec!["recipient"]);
    // The manifest as read is the one the model describes, and the files are
    // exactly what the model writes: the fixture is what the crate generates.
    assert_eq!(folder.manifest, folder.model.manifest());
    assert_eq!(folder.model.files(), folder.files);
}

#[test]
fn the_manifest_hash_is_the_sha256_of_the_canonical_contract() {
    for case in [
        "parcel",
        "parcel_and_lost",
        "parcel_hole",
        "missing_upcaster",
    ] {
        let dir = common::fixture(&format!("registry/{case}"));
        let folder = outbox_codegen::load(&dir).unwrap();
        for entry in &folder.manifest.event_types {
            for version in &entry.versions {
                assert_eq!(
                    version.sha256,
                    contract_hash(&dir, &version.schema),
                    "{case} {}",
                    version.schema
                );
            }
        }
    }
}
