//! The check of contracts in code against a committed registry folder
//! (`check_with`) and writing the folder from code (`write_with`, `retire`):
//! a published version is frozen (error naming event type, version, path and
//! the remedy; a documentation change is a warning), a contract in code must
//! be in the folder and a version in the folder must stay readable or be
//! retired, chains have no holes, versions N > 1 have an upcaster.

mod common;
#[path = "common/parcel.rs"]
mod parcel;

use outbox_codegen::{
    CodegenError, FindingKind, Report, Severity, WriteMode, check_with, retire, write_with,
};
use outbox_core::{ContractRegistry, EventContract, OutboxEvent, UpcastError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use common::{copy_fixture, read, snapshot};
use parcel::{ParcelSent, ParcelSentV1};

use FindingKind::*;
use Severity::*;

// The fixture folders under `tests/fixtures/registry` and `tests/fixtures/
// diff` were generated once from `common/parcel.rs` and the contracts below
// (through `generate(..).files()`), then committed. Editing a contract here
// changes its schema, and the tests comparing it with those folders fail.

/// Variants of `parcel.sent` v1 that differ from the published one.
mod changed {
    use super::*;

    /// `parcel.sent` v1 with `weight_grams` turned into a string.
    #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
    #[outbox(event_type = "parcel.sent", aggregate = "parcel", version = 1)]
    pub(crate) struct ParcelSentV1 {
        /// The parcel.
        #[outbox(aggregate_id)]
        pub(crate) parcel_id: String,
        /// Who receives it; personal data.
        #[outbox(redact)]
        pub(crate) recipient: String,
        /// Weight in grams.
        pub(crate) weight_grams: String,
    }
}

/// `parcel.sent` v1 with a reworded doc comment only.
mod docs {
    use super::*;

    /// `parcel.sent` v1.
    #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
    #[outbox(event_type = "parcel.sent", aggregate = "parcel", version = 1)]
    pub(crate) struct ParcelSentV1 {
        /// The parcel.
        #[outbox(aggregate_id)]
        pub(crate) parcel_id: String,
        /// Who receives it; personal data.
        #[outbox(redact)]
        pub(crate) recipient: String,
        /// Gross weight in grams, packaging included.
        pub(crate) weight_grams: u32,
    }
}

/// `parcel.sent` v2 as published, but without its upcaster.
mod no_upcast {
    use super::*;

    /// `parcel.sent` v2: the carrier is known.
    #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
    #[outbox(event_type = "parcel.sent", aggregate = "parcel", version = 2)]
    pub(crate) struct ParcelSent {
        /// The parcel.
        #[outbox(aggregate_id)]
        pub(crate) parcel_id: String,
        /// Who receives it; personal data.
        #[outbox(redact)]
        pub(crate) recipient: String,
        /// Weight in grams.
        pub(crate) weight_grams: u32,
        /// The carrier's name.
        pub(crate) carrier: String,
    }
}

/// `parcel.sent` v2 → v3: nothing to do, `note` is optional.
fn parcel_v2_to_v3(v2: Value) -> Result<Value, UpcastError> {
    Ok(v2)
}

/// `parcel.sent` v3, read from v2 by a JSON upcast.
#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "parcel.sent",
    aggregate = "parcel",
    version = 3,
    upcast(from = 2, with = parcel_v2_to_v3)
)]
struct ParcelSentV3 {
    /// The parcel.
    #[outbox(aggregate_id)]
    parcel_id: String,
    /// Who receives it; personal data.
    #[outbox(redact)]
    recipient: String,
    /// Weight in grams.
    weight_grams: u32,
    /// The carrier's name.
    carrier: String,
    /// A note for the recipient.
    note: Option<String>,
}

/// `parcel.lost` v1.
#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "parcel.lost", aggregate = "parcel", version = 1)]
struct ParcelLost {
    /// The parcel.
    #[outbox(aggregate_id)]
    parcel_id: String,
}

/// `parcel.sent` announced for another aggregate type.
mod moved {
    use super::*;

    /// `parcel.sent` v1 of the shipment aggregate.
    #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
    #[outbox(event_type = "parcel.sent", aggregate = "shipment", version = 1)]
    pub(crate) struct ParcelSentV1 {
        /// The parcel.
        #[outbox(aggregate_id)]
        pub(crate) parcel_id: String,
        /// Who receives it; personal data.
        #[outbox(redact)]
        pub(crate) recipient: String,
        /// Weight in grams.
        pub(crate) weight_grams: u32,
    }

    /// `parcel.sent` v2 of the shipment aggregate.
    #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
    #[outbox(
        event_type = "parcel.sent",
        aggregate = "shipment",
        version = 2,
        upcast_from = ParcelSentV1
    )]
    pub(crate) struct ParcelSent {
        /// The parcel.
        #[outbox(aggregate_id)]
        pub(crate) parcel_id: String,
        /// Who receives it; personal data.
        #[outbox(redact)]
        pub(crate) recipient: String,
        /// Weight in grams.
        pub(crate) weight_grams: u32,
        /// The carrier's name.
        pub(crate) carrier: String,
    }

    impl From<ParcelSentV1> for ParcelSent {
        fn from(v1: ParcelSentV1) -> Self {
            ParcelSent {
                parcel_id: v1.parcel_id,
                recipient: v1.recipient,
                weight_grams: v1.weight_grams,
                carrier: "unknown".to_owned(),
            }
        }
    }
}

fn registry(contracts: &[&'static EventContract]) -> ContractRegistry {
    ContractRegistry::from_contracts(contracts.iter().copied()).expect("consistent contracts")
}

const V1: fn() -> &'static EventContract = ParcelSentV1::contract;
const V2: fn() -> &'static EventContract = ParcelSent::contract;
const V3: fn() -> &'static EventContract = ParcelSentV3::contract;

const V2_NOTE: &str = "v1 → v2: forward (required field `carrier` added [forward]); allowed \
                       because an upcaster exists (typed from v1)";

/// Severity, kind, event type (or file), version, path, message.
type Row<'a> = (
    Severity,
    FindingKind,
    &'a str,
    Option<u32>,
    Option<&'a str>,
    &'a str,
);

fn rows(report: &Report) -> Vec<Row<'_>> {
    report
        .findings
        .iter()
        .map(|f| {
            (
                f.severity,
                f.kind,
                f.event_type.as_str(),
                f.version,
                f.path.as_deref(),
                f.message.as_str(),
            )
        })
        .collect()
}

/// Checks `contracts` against a copy of the fixture folder `case`; the
/// check must not write.
fn check(case: &str, contracts: &[&'static EventContract]) -> Report {
    let (_temp, dir) = copy_fixture(&format!("registry/{case}"));
    let before = snapshot(&dir);
    let report = check_with(&registry(contracts), &dir).unwrap();
    assert_eq!(
        report.subject,
        format!("schema registry check of {}", dir.display())
    );
    assert_eq!(snapshot(&dir), before, "the check wrote into the folder");
    report
}

// ---- (a) a published version is frozen ----

#[test]
fn code_matching_the_folder_passes() {
    let report = check("parcel", &[V1(), V2()]);
    assert_eq!(
        rows(&report),
        vec![(Note, Compatibility, "parcel.sent", Some(2), None, V2_NOTE)]
    );
    assert!(!report.has_errors());
}

#[test]
fn a_changed_published_schema_is_an_error_naming_version_path_and_remedy() {
    let report = check("parcel", &[changed::ParcelSentV1::contract(), V2()]);
    assert_eq!(
        rows(&report),
        vec![
            (
                Error,
                FrozenChanged,
                "parcel.sent",
                Some(1),
                Some("/properties/weight_grams"),
                "the published schema changed (field `weight_grams`: type changed from integer \
                 to string [breaking]; breaking); a published version is frozen: revert v1 and \
                 make the change in a new version 3 with `upcast_from = ParcelSent` (v2)",
            ),
            (
                Note,
                Compatibility,
                "parcel.sent",
                Some(2),
                None,
                "v1 → v2: breaking (required field `carrier` added [forward]; field \
                 `weight_grams`: type changed from string to integer [breaking]); allowed \
                 because an upcaster exists (typed from v1)",
            ),
        ]
    );
    assert_eq!(
        report.findings[0].to_string().lines().next().unwrap(),
        format!(
            "error[frozen-changed] parcel.sent v1 at /properties/weight_grams: {}",
            report.findings[0].message
        )
    );
}

#[test]
fn a_documentation_change_of_a_published_version_is_a_warning() {
    let report = check("parcel", &[docs::ParcelSentV1::contract(), V2()]);
    assert_eq!(
        rows(&report),
        vec![
            (
                Warning,
                DocsChanged,
                "parcel.sent",
                Some(1),
                Some("/properties/weight_grams/description"),
                "only documentation changed (descriptions, titles); not a contract change. \
                 Refresh the file with OUTBOX_REGISTRY_WRITE=1",
            ),
            (Note, Compatibility, "parcel.sent", Some(2), None, V2_NOTE),
        ]
    );
    assert!(!report.has_errors());
}

#[test]
fn a_changed_aggregate_type_is_an_error() {
    let report = check(
        "parcel",
        &[
            moved::ParcelSentV1::contract(),
            moved::ParcelSent::contract(),
        ],
    );
    let errors: Vec<_> = rows(&report).into_iter().filter(|r| r.0 == Error).collect();
    assert_eq!(
        errors,
        vec![(
            Error,
            FrozenChanged,
            "parcel.sent",
            None,
            None,
            "aggregate type changed from parcel to shipment (test_check_code::moved::ParcelSent); \
             an event type belongs to one aggregate for good: keep `aggregate = \"parcel\"` or \
             announce a new event type",
        )]
    );
}

#[test]
fn write_refuses_a_changed_aggregate_type_unless_forced() {
    let contracts = [
        moved::ParcelSentV1::contract(),
        moved::ParcelSent::contract(),
    ];
    let (_temp, dir) = copy_fixture("registry/parcel");
    let before = snapshot(&dir);
    let outcome = write_with(&registry(&contracts), &dir, WriteMode::Safe);
    assert_eq!(refused_kinds(outcome), vec![FrozenChanged]);
    assert_eq!(snapshot(&dir), before);
    let summary = write_with(&registry(&contracts), &dir, WriteMode::Force).unwrap();
    // The schema files differ in their descriptions only.
    assert_eq!(
        summary.written,
        vec![
            "asyncapi.json",
            "parcel.sent/v1.json",
            "parcel.sent/v2.json",
            "registry.json"
        ]
    );
    assert!(read(&dir, "asyncapi.json").contains("\"address\": \"events.shipment.parcel.sent\""));
    assert!(
        !check_with(&registry(&contracts), &dir)
            .unwrap()
            .has_errors()
    );
}

// ---- (b) code and folder list the same versions ----

#[test]
fn a_new_version_in_code_is_missing_in_the_registry() {
    let report = check("parcel", &[V1(), V2(), V3()]);
    assert_eq!(
        rows(&report),
        vec![
            (
                Error,
                MissingInRegistry,
                "parcel.sent",
                Some(3),
                None,
                "test_check_code::ParcelSentV3 is in code but not in the registry folder; add it \
                 by running the registry test with OUTBOX_REGISTRY_WRITE=1 (or `write` from a \
                 binary that links the contracts) and commit the files",
            ),
            (Note, Compatibility, "parcel.sent", Some(2), None, V2_NOTE),
            (
                Note,
                Compatibility,
                "parcel.sent",
                Some(3),
                None,
                "v2 → v3: full (optional field `note` added [full]); no upcaster needed, one exists",
            ),
        ]
    );
}

#[test]
fn a_new_event_type_in_code_is_missing_in_the_registry() {
    let report = check("parcel", &[V1(), V2(), ParcelLost::contract()]);
    assert_eq!(
        rows(&report)[0],
        (
            Error,
            MissingInRegistry,
            "parcel.lost",
            Some(1),
            None,
            "test_check_code::ParcelLost is in code but not in the registry folder; add it by \
             running the registry test with OUTBOX_REGISTRY_WRITE=1 (or `write` from a binary \
             that links the contracts) and commit the files",
        )
    );
    assert_eq!(report.count(Error), 1);
}

#[test]
fn an_event_type_gone_from_code_without_retirement_is_an_error() {
    let report = check("parcel_and_lost", &[V1(), V2()]);
    assert_eq!(
        rows(&report),
        vec![
            (
                Error,
                RemovedWithoutRetirement,
                "parcel.lost",
                Some(1),
                None,
                "v1 is in the registry but no contract or upcaster reads it; a published version \
                 may only go with a recorded retirement: `outbox-codegen retire <dir> parcel.lost \
                 1 --reason \"...\"`",
            ),
            (Note, Compatibility, "parcel.sent", Some(2), None, V2_NOTE),
        ]
    );
}

#[test]
fn the_newest_version_gone_from_code_is_an_error() {
    // Code went back to v1 only: nothing reads v2 any more.
    let report = check("parcel", &[V1()]);
    let errors: Vec<_> = rows(&report).into_iter().filter(|r| r.0 == Error).collect();
    assert_eq!(
        errors,
        vec![(
            Error,
            RemovedWithoutRetirement,
            "parcel.sent",
            Some(2),
            None,
            "v2 is in the registry but no contract or upcaster reads it; a published version may \
             only go with a recorded retirement: `outbox-codegen retire <dir> parcel.sent 2 \
             --reason \"...\"`",
        )]
    );
}

#[test]
fn an_old_version_whose_struct_is_gone_is_fine_while_an_upcaster_reads_it() {
    // Only v3 is left in code. It reads v2 by a JSON upcast, so v2 may stay
    // without its struct; nothing reads v1 any more.
    let report = check("parcel", &[V3()]);
    let errors: Vec<_> = rows(&report)
        .into_iter()
        .filter(|r| r.0 == Error)
        .map(|r| (r.1, r.3))
        .collect();
    assert_eq!(
        errors,
        vec![
            (RemovedWithoutRetirement, Some(1)),
            (MissingInRegistry, Some(3)),
        ]
    );
}

#[test]
fn a_version_gone_from_code_with_its_upcaster_is_an_error() {
    // v2 no longer reads v1 (no upcaster) and the v1 struct is gone.
    let report = check("parcel", &[no_upcast::ParcelSent::contract()]);
    assert_eq!(
        rows(&report),
        vec![
            (
                Error,
                RemovedWithoutRetirement,
                "parcel.sent",
                Some(1),
                None,
                "v1 is in the registry but no contract or upcaster reads it; a published version \
                 may only go with a recorded retirement: `outbox-codegen retire <dir> parcel.sent \
                 1 --reason \"...\"`",
            ),
            (
                Error,
                MissingUpcaster,
                "parcel.sent",
                Some(2),
                None,
                "v2 has no upcaster from v1: add `upcast_from = <v1 struct>` or `upcast(from = \
                 1, with = path::to::fn)` to the v2 contract",
            ),
        ]
    );
}

#[test]
fn a_retired_version_still_defined_in_code_is_an_error() {
    let report = check("parcel_retired_v1", &[V1(), V2()]);
    assert_eq!(
        rows(&report),
        vec![
            (
                Error,
                RemovedWithoutRetirement,
                "parcel.sent",
                Some(1),
                None,
                "v1 is retired in registry.json (\"drained on 2024-05-01: no v1 payload left in any \
             outbox or stream\") but test_check_code::parcel::ParcelSentV1 still defines it; \
             delete the struct or remove the retirement",
            ),
            (Note, Compatibility, "parcel.sent", Some(2), None, V2_NOTE),
        ]
    );
}

#[test]
fn a_retired_version_whose_struct_is_gone_passes() {
    let report = check("parcel_retired_v1", &[V2()]);
    assert_eq!(rows(&report), vec![]);
}

// ---- (c) chains ----

#[test]
fn a_hole_in_the_chain_is_an_error() {
    let report = check("parcel_hole", &[V1(), V3()]);
    assert_eq!(
        rows(&report),
        vec![(
            Error,
            ChainHole,
            "parcel.sent",
            Some(2),
            None,
            "the version chain has a hole: v2 is neither in the registry nor retired (versions \
             run 1..=3)",
        )]
    );
}

#[test]
fn a_version_without_upcaster_is_an_error() {
    let report = check("parcel", &[V1(), no_upcast::ParcelSent::contract()]);
    assert_eq!(
        rows(&report),
        vec![(
            Error,
            MissingUpcaster,
            "parcel.sent",
            Some(2),
            None,
            "v2 has no upcaster from v1: add `upcast_from = <v1 struct>` or `upcast(from = 1, \
             with = path::to::fn)` to the v2 contract",
        )]
    );
}

// ---- generated files ----

#[test]
fn stale_generated_files_are_reported_when_nothing_else_is_wrong() {
    let report = check("manifest_edited", &[V1(), V2()]);
    assert_eq!(
        rows(&report)[0],
        (
            Error,
            ManifestStale,
            "registry.json",
            None,
            Some("/event_types/0/versions/1/compatibility"),
            "registry.json is not what the schemas produce; regenerate it with \
             OUTBOX_REGISTRY_WRITE=1",
        )
    );
    let report = check("asyncapi_edited", &[V1(), V2()]);
    assert_eq!(rows(&report)[0].1, AsyncApiStale);
    let report = check("unlisted_file", &[V1(), V2()]);
    assert_eq!(rows(&report)[0].1, UnlistedFile);
    // With a real error, the stale manifest is not reported on top.
    let report = check(
        "manifest_edited",
        &[changed::ParcelSentV1::contract(), V2()],
    );
    assert_eq!(report.count(Error), 1);
    assert_eq!(report.findings[0].kind, FrozenChanged);
}

// ---- write ----

fn write(
    case: &str,
    contracts: &[&'static EventContract],
    mode: WriteMode,
) -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Result<outbox_codegen::WriteSummary, CodegenError>,
) {
    let (temp, dir) = copy_fixture(&format!("registry/{case}"));
    let outcome = write_with(&registry(contracts), &dir, mode);
    (temp, dir, outcome)
}

fn refused_kinds(outcome: Result<outbox_codegen::WriteSummary, CodegenError>) -> Vec<FindingKind> {
    match outcome {
        Err(CodegenError::Refused(report)) => {
            assert!(report.findings.iter().all(|f| f.severity == Error));
            report.findings.iter().map(|f| f.kind).collect()
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn write_refuses_a_changed_published_version_and_leaves_the_files() {
    let (_temp, dir) = copy_fixture("registry/parcel");
    let before = snapshot(&dir);
    let error = write_with(
        &registry(&[changed::ParcelSentV1::contract(), V2()]),
        &dir,
        WriteMode::Safe,
    )
    .unwrap_err();
    let text = error.to_string();
    assert!(
        text.starts_with("refusing to write the registry:\nschema registry check of "),
        "{text}"
    );
    assert!(
        text.contains("error[frozen-changed] parcel.sent v1 at /properties/weight_grams: "),
        "{text}"
    );
    assert_eq!(refused_kinds(Err(error)), vec![FrozenChanged]);
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn force_overwrites_a_changed_published_version() {
    let contracts = [changed::ParcelSentV1::contract(), V2()];
    let (_temp, dir, outcome) = write("parcel", &contracts, WriteMode::Force);
    let summary = outcome.unwrap();
    assert_eq!(
        summary.written,
        vec!["parcel.sent/v1.json", "registry.json"]
    );
    assert_eq!(summary.removed, Vec::<String>::new());
    assert!(read(&dir, "parcel.sent/v1.json").contains("\"type\": \"string\""));
    let manifest: Value = serde_json::from_str(&read(&dir, "registry.json")).unwrap();
    assert_eq!(
        manifest["event_types"][0]["versions"][1]["compatibility"],
        "breaking"
    );
    let report = check_with(&registry(&contracts), &dir).unwrap();
    assert!(!report.has_errors(), "{}", report.render_text());
}

#[test]
fn write_adds_a_new_version_and_the_check_then_passes() {
    let contracts = [V1(), V2(), V3()];
    let (_temp, dir, outcome) = write("parcel", &contracts, WriteMode::Safe);
    let summary = outcome.unwrap();
    assert_eq!(
        summary.written,
        vec!["asyncapi.json", "parcel.sent/v3.json", "registry.json"]
    );
    let manifest: Value = serde_json::from_str(&read(&dir, "registry.json")).unwrap();
    let v3 = &manifest["event_types"][0]["versions"][2];
    assert_eq!(v3["version"], 3);
    assert_eq!(v3["compatibility"], "full");
    assert_eq!(
        v3["upcast_from"],
        serde_json::json!({"kind": "json", "version": 2})
    );
    assert_eq!(manifest["event_types"][0]["current_version"], 3);
    let report = check_with(&registry(&contracts), &dir).unwrap();
    assert!(!report.has_errors(), "{}", report.render_text());
    // A second write changes nothing.
    let before = snapshot(&dir);
    let again = write_with(&registry(&contracts), &dir, WriteMode::Safe).unwrap();
    assert_eq!(again, outbox_codegen::WriteSummary::default());
    assert_eq!(snapshot(&dir), before);
}

#[test]
fn write_refreshes_documentation_only() {
    let contracts = [docs::ParcelSentV1::contract(), V2()];
    let (_temp, dir, outcome) = write("parcel", &contracts, WriteMode::Safe);
    assert_eq!(outcome.unwrap().written, vec!["parcel.sent/v1.json"]);
    assert!(read(&dir, "parcel.sent/v1.json").contains("Gross weight in grams"));
    let report = check_with(&registry(&contracts), &dir).unwrap();
    assert_eq!(
        rows(&report),
        vec![(Note, Compatibility, "parcel.sent", Some(2), None, V2_NOTE)]
    );
}

#[test]
fn write_repairs_stale_generated_files_and_removes_stray_schema_files() {
    let (_temp, dir, outcome) = write("manifest_edited", &[V1(), V2()], WriteMode::Safe);
    assert_eq!(outcome.unwrap().written, vec!["registry.json"]);
    assert_eq!(
        snapshot(&dir),
        snapshot(&common::fixture("registry/parcel"))
    );
    let (_temp, dir, outcome) = write("unlisted_file", &[V1(), V2()], WriteMode::Safe);
    let summary = outcome.unwrap();
    assert_eq!(summary.written, Vec::<String>::new());
    assert_eq!(summary.removed, vec!["parcel.sent/v9.json"]);
    assert!(!dir.join("parcel.sent/v9.json").exists());
}

#[test]
fn write_refuses_what_only_a_code_change_can_fix_even_with_force() {
    for mode in [WriteMode::Safe, WriteMode::Force] {
        let cases: [(&str, Vec<&'static EventContract>, Vec<FindingKind>); 5] = [
            ("parcel_hole", vec![V1(), V3()], vec![ChainHole]),
            (
                "parcel",
                vec![V1(), no_upcast::ParcelSent::contract()],
                vec![MissingUpcaster],
            ),
            (
                "parcel_and_lost",
                vec![V1(), V2()],
                vec![RemovedWithoutRetirement],
            ),
            (
                "parcel_retired_v1",
                vec![V1(), V2()],
                vec![RemovedWithoutRetirement],
            ),
            ("parcel", vec![V1()], vec![RemovedWithoutRetirement]),
        ];
        for (case, contracts, kinds) in cases {
            let (_temp, dir) = copy_fixture(&format!("registry/{case}"));
            let before = snapshot(&dir);
            let outcome = write_with(&registry(&contracts), &dir, mode);
            assert_eq!(refused_kinds(outcome), kinds, "{case} {mode:?}");
            assert_eq!(snapshot(&dir), before, "{case} {mode:?}");
        }
    }
}

#[test]
fn write_into_a_new_folder_checks_the_chain_first() {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("schemas");
    let outcome = write_with(
        &registry(&[V1(), no_upcast::ParcelSent::contract()]),
        &dir,
        WriteMode::Safe,
    );
    assert_eq!(refused_kinds(outcome), vec![MissingUpcaster]);
    assert!(!dir.exists(), "nothing may be written when refused");
    let summary = write_with(&registry(&[V1(), V2()]), &dir, WriteMode::Safe).unwrap();
    assert_eq!(
        summary.written,
        vec![
            "asyncapi.json",
            "parcel.sent/v1.json",
            "parcel.sent/v2.json",
            "registry.json"
        ]
    );
    assert_eq!(
        snapshot(&dir),
        snapshot(&common::fixture("registry/parcel"))
    );
}

// ---- retire ----

#[test]
fn retire_records_the_reason_and_removes_the_schema_file() {
    let (_temp, dir) = copy_fixture("registry/parcel_and_lost");
    let summary = retire(&dir, "parcel.lost", 1, "  never emitted in production  ").unwrap();
    assert_eq!(summary.written, vec!["asyncapi.json", "registry.json"]);
    assert_eq!(summary.removed, vec!["parcel.lost/v1.json"]);
    assert!(!dir.join("parcel.lost/v1.json").exists());
    let manifest: Value = serde_json::from_str(&read(&dir, "registry.json")).unwrap();
    assert_eq!(
        manifest["event_types"][0],
        serde_json::json!({
            "aggregate_type": "parcel",
            "current_version": 1,
            "event_type": "parcel.lost",
            "versions": [],
            "retired": [{"version": 1, "reason": "never emitted in production"}]
        })
    );
    // The code no longer has parcel.lost: the check passes now.
    let report = check_with(&registry(&[V1(), V2()]), &dir).unwrap();
    assert!(!report.has_errors(), "{}", report.render_text());
    assert!(!outbox_codegen::check_folder(&dir).unwrap().has_errors());
}

#[test]
fn retire_then_delete_the_struct() {
    let (_temp, dir) = copy_fixture("registry/parcel");
    retire(&dir, "parcel.sent", 1, "drained").unwrap();
    // While the v1 struct exists, the check says so.
    let report = check_with(&registry(&[V1(), V2()]), &dir).unwrap();
    assert_eq!(report.findings[0].kind, RemovedWithoutRetirement);
    // Without it, the folder and the code agree.
    let report = check_with(&registry(&[V2()]), &dir).unwrap();
    assert!(!report.has_errors(), "{}", report.render_text());
}

#[test]
fn retire_needs_a_reason_and_an_existing_version() {
    let (_temp, dir) = copy_fixture("registry/parcel");
    let before = snapshot(&dir);
    let cases = [
        (
            "parcel.sent",
            1,
            "   ",
            "a retirement needs a reason (--reason \"...\")".to_owned(),
        ),
        (
            "parcel.found",
            1,
            "gone",
            format!("no event type parcel.found in {}", dir.display()),
        ),
        (
            "parcel.sent",
            7,
            "gone",
            format!("parcel.sent has no v7 in {}", dir.display()),
        ),
    ];
    for (event_type, version, reason, message) in cases {
        let error = retire(&dir, event_type, version, reason).unwrap_err();
        assert!(matches!(error, CodegenError::NotFound(_)), "{error:?}");
        assert_eq!(error.to_string(), message);
    }
    assert_eq!(snapshot(&dir), before);
}
