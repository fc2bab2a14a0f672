//! `diff OLD NEW` between two registry folders (`tests/fixtures/diff/<case>/
//! {old,new}`): a changed published version is an error naming event type,
//! version and path with the remedy, a docs-only change a warning, a version
//! or event type gone without a recorded retirement an error, a recorded
//! retirement a note, new versions classified against their predecessor (an
//! error only when not backward compatible and without upcaster), a changed
//! aggregate type an error. Diff never writes.

mod common;

use outbox_codegen::{Finding, FindingKind, Report, Severity, diff};

use FindingKind::*;
use Severity::*;

/// A finding without its subject: severity, kind, event type, version, path, message.
type Row = (
    Severity,
    FindingKind,
    &'static str,
    Option<u32>,
    Option<&'static str>,
    &'static str,
);

fn run(case: &str) -> Report {
    let old = common::fixture(&format!("diff/{case}/old"));
    let new = common::fixture(&format!("diff/{case}/new"));
    let before = (common::snapshot(&old), common::snapshot(&new));
    let report = diff(&old, &new).unwrap_or_else(|e| panic!("{case}: {e}"));
    assert_eq!(
        report.subject,
        format!("schema registry diff {} → {}", old.display(), new.display())
    );
    assert_eq!(
        (common::snapshot(&old), common::snapshot(&new)),
        before,
        "diff wrote into a folder"
    );
    report
}

fn assert_findings(case: &str, expected: &[Row]) -> Report {
    let report = run(case);
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

#[test]
fn identical_folders_have_no_finding() {
    let report = assert_findings("identical", &[]);
    assert!(!report.has_errors());
    assert!(
        report
            .summary()
            .ends_with(": ok: 0 error(s), 0 warning(s), 0 note(s)")
    );
}

#[test]
fn a_changed_published_version_is_an_error_with_path_and_remedy() {
    let report = assert_findings(
        "frozen_changed",
        &[(
            Error,
            FrozenChanged,
            "parcel.sent",
            Some(1),
            Some("/properties/weight_grams"),
            "the published schema changed (field `weight_grams`: type changed from integer to \
             string [breaking]; breaking); a published version is frozen: add version 3 with an \
             upcaster instead",
        )],
    );
    assert!(report.has_errors());
    assert_eq!(
        report.findings[0].to_string(),
        format!(
            "error[frozen-changed] parcel.sent v1 at /properties/weight_grams: {}",
            report.findings[0].message
        )
    );
}

#[test]
fn a_documentation_change_is_a_warning_only() {
    let report = assert_findings(
        "docs_changed",
        &[(
            Warning,
            DocsChanged,
            "parcel.sent",
            Some(1),
            Some("/properties/weight_grams/description"),
            "only documentation changed (descriptions, titles); not a contract change. \
             Refresh the file with OUTBOX_REGISTRY_WRITE=1",
        )],
    );
    assert!(!report.has_errors());
}

#[test]
fn a_new_version_with_an_upcaster_is_a_note_with_its_class() {
    assert_findings(
        "version_added_upcast",
        &[(
            Note,
            VersionAdded,
            "parcel.sent",
            Some(3),
            None,
            "v3 added: full against v2 (optional field `note` added [full]); upcaster from v2 present",
        )],
    );
}

#[test]
fn a_new_backward_compatible_version_without_upcaster_is_still_an_error() {
    // The same rule as the check: every version N > 1 needs an upcaster.
    let report = assert_findings(
        "version_added_backward",
        &[(
            Error,
            VersionAdded,
            "parcel.sent",
            Some(3),
            None,
            "v3 added: full against v2 (optional field `note` added [full]); no upcaster from v2 \
             (backward compatible, but consumers still need the link); every version N > 1 needs \
             one, as the check demands",
        )],
    );
    assert!(report.has_errors());
}

#[test]
fn a_new_version_that_breaks_old_data_without_upcaster_is_an_error() {
    let report = assert_findings(
        "version_added_breaking",
        &[(
            Error,
            VersionAdded,
            "parcel.sent",
            Some(3),
            None,
            "v3 added: forward against v2 (required field `signature` added [forward]); no \
             upcaster from v2 (not backward compatible); every version N > 1 needs one, as the \
             check demands",
        )],
    );
    assert!(report.has_errors());
}

#[test]
fn a_version_removed_without_retirement_is_an_error() {
    assert_findings(
        "version_removed",
        &[(
            Error,
            RemovedWithoutRetirement,
            "parcel.sent",
            Some(1),
            None,
            "v1 was removed without a recorded retirement",
        )],
    );
}

#[test]
fn a_recorded_retirement_is_a_note_with_its_reason() {
    let report = assert_findings(
        "version_retired",
        &[(
            Note,
            VersionRetired,
            "parcel.sent",
            Some(1),
            None,
            "v1 retired: drained on 2024-05-01: no v1 payload left in any outbox or stream",
        )],
    );
    assert!(!report.has_errors());
}

#[test]
fn an_event_type_removed_from_the_folder_is_an_error_per_version() {
    assert_findings(
        "event_type_removed",
        &[(
            Error,
            RemovedWithoutRetirement,
            "parcel.lost",
            Some(1),
            None,
            "v1 disappeared with its event type; record a retirement instead of deleting it",
        )],
    );
}

#[test]
fn a_new_event_type_is_two_notes() {
    assert_findings(
        "event_type_added",
        &[
            (
                Note,
                EventTypeAdded,
                "parcel.lost",
                None,
                None,
                "new event type (aggregate parcel)",
            ),
            (Note, VersionAdded, "parcel.lost", Some(1), None, "v1 added"),
        ],
    );
}

#[test]
fn a_changed_aggregate_type_is_an_error() {
    assert_findings(
        "aggregate_changed",
        &[(
            Error,
            FrozenChanged,
            "parcel.sent",
            None,
            None,
            "aggregate type changed from parcel to shipment; an event type belongs to one \
             aggregate for good",
        )],
    );
}

#[test]
fn the_reverse_diff_of_an_added_version_reports_its_removal() {
    let old = common::fixture("diff/version_added_upcast/new");
    let new = common::fixture("diff/version_added_upcast/old");
    let report = diff(&old, &new).unwrap();
    let kinds: Vec<_> = report
        .findings
        .iter()
        .map(|f| (f.severity, f.kind, f.version))
        .collect();
    assert_eq!(kinds, vec![(Error, RemovedWithoutRetirement, Some(3))]);
}

#[test]
fn findings_are_sorted_errors_first() {
    // Old: parcel.sent v1, v2 and parcel.lost v1; new: parcel.sent with a
    // changed v1 and no parcel.lost.
    let old = common::fixture("diff/event_type_removed/old");
    let new = common::fixture("diff/frozen_changed/new");
    let report = diff(&old, &new).unwrap();
    let order: Vec<_> = report
        .findings
        .iter()
        .map(|f| (f.severity, f.event_type.as_str(), f.version, f.kind))
        .collect();
    assert_eq!(
        order,
        vec![
            (Error, "parcel.lost", Some(1), RemovedWithoutRetirement),
            (Error, "parcel.sent", Some(1), FrozenChanged),
        ]
    );
}

#[test]
fn a_keyword_the_classifier_does_not_know_is_a_change_for_a_human() {
    // `dependentRequired` is not classified: named with its path, treated
    // as breaking, and the changed published version is an error.
    let old = common::fixture("diff/identical/old");
    let (_temp, new) = common::copy_fixture("diff/identical/new");
    let file = new.join("parcel.sent/v1.json");
    let mut schema: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    schema["dependentRequired"] = serde_json::json!({"parcel_id": ["weight_grams"]});
    std::fs::write(&file, outbox_codegen::to_canonical_string(&schema)).unwrap();
    let report = diff(&old, &new).unwrap();
    assert_eq!(
        report.findings,
        vec![Finding {
            severity: Error,
            kind: FrozenChanged,
            event_type: "parcel.sent".into(),
            version: Some(1),
            path: Some("/dependentRequired".into()),
            message: "the published schema changed (the payload: keyword `dependentRequired` \
                      changed; this checker does not classify it, so a human must decide \
                      (treated as breaking) [breaking]; breaking); a published version is \
                      frozen: add version 3 with an upcaster instead"
                .into(),
        }]
    );
}
