//! A binary whose contracts are inconsistent: two types claim one (event
//! type, version), and one event type is announced for two aggregates. The
//! check reports both conflicts with both type names; writing refuses; the
//! CI assertion panics with the conflicts.

mod common;

use std::process::ExitCode;

use clap::Parser;
use outbox_codegen::cli::{Cli, run_with};
use outbox_codegen::{CodegenError, FindingKind, Severity, WriteMode};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One team's `parcel.sent` v1.
mod a {
    use super::*;

    /// `parcel.sent` v1.
    #[derive(Serialize, Deserialize, JsonSchema, outbox_core::OutboxEvent)]
    #[outbox(event_type = "parcel.sent", aggregate = "parcel", version = 1)]
    pub(crate) struct ParcelSent {
        #[outbox(aggregate_id)]
        pub(crate) parcel_id: String,
    }
}

/// Another team's `parcel.sent` v1.
mod b {
    use super::*;

    /// `parcel.sent` v1, again.
    #[derive(Serialize, Deserialize, JsonSchema, outbox_core::OutboxEvent)]
    #[outbox(event_type = "parcel.sent", aggregate = "parcel", version = 1)]
    pub(crate) struct ParcelSent {
        #[outbox(aggregate_id)]
        pub(crate) id: String,
    }
}

/// `parcel.sent` v2 announced for another aggregate.
mod c {
    use super::*;

    /// `parcel.sent` v2 of the shipment aggregate.
    #[derive(Serialize, Deserialize, JsonSchema, outbox_core::OutboxEvent)]
    #[outbox(event_type = "parcel.sent", aggregate = "shipment", version = 2)]
    pub(crate) struct ParcelSentV2 {
        #[outbox(aggregate_id)]
        pub(crate) id: String,
    }
}

const DUPLICATE: &str = "parcel.sent v1 is claimed by two types: \
                         test_check_duplicates::a::ParcelSent and \
                         test_check_duplicates::b::ParcelSent; give one of them another version \
                         or event type";
const CONFLICT: &str = "event type parcel.sent is announced for aggregate parcel by \
                        test_check_duplicates::a::ParcelSent and for aggregate shipment by \
                        test_check_duplicates::c::ParcelSentV2; an event type belongs to one \
                        aggregate type";

#[test]
fn the_check_names_both_types_of_each_conflict() {
    let (_temp, dir) = common::copy_fixture("registry/parcel");
    let before = common::snapshot(&dir);
    let report = outbox_codegen::check(&dir).unwrap();
    let found: Vec<_> = report
        .findings
        .iter()
        .map(|f| {
            (
                f.severity,
                f.kind,
                f.event_type.as_str(),
                f.version,
                f.message.as_str(),
            )
        })
        .collect();
    assert_eq!(
        found,
        vec![
            (
                Severity::Error,
                FindingKind::DuplicateContract,
                "parcel.sent",
                None,
                CONFLICT
            ),
            (
                Severity::Error,
                FindingKind::DuplicateContract,
                "parcel.sent",
                Some(1),
                DUPLICATE
            ),
        ]
    );
    assert_eq!(common::snapshot(&dir), before);
}

#[test]
fn writing_refuses_and_leaves_the_folder() {
    let (_temp, dir) = common::copy_fixture("registry/parcel");
    let before = common::snapshot(&dir);
    for mode in [WriteMode::Safe, WriteMode::Force] {
        let error = outbox_codegen::write(&dir, mode).unwrap_err();
        assert!(matches!(error, CodegenError::Registry(_)), "{error:?}");
        assert_eq!(
            error.to_string(),
            format!(
                "the contracts linked into this binary are inconsistent: 2 problem(s) in the \
                 contract registry\n  - {DUPLICATE}\n  - {CONFLICT}"
            )
        );
    }
    assert_eq!(common::snapshot(&dir), before);
}

#[test]
fn the_ci_assertion_panics_with_the_conflicts() {
    let (_temp, dir) = common::copy_fixture("registry/parcel");
    let panic = std::panic::catch_unwind(|| outbox_codegen::assert_up_to_date(&dir)).unwrap_err();
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains(DUPLICATE), "{message}");
    assert!(message.contains(CONFLICT), "{message}");
}

#[test]
fn the_cli_commands_that_need_contracts_exit_with_2() {
    let (_temp, dir) = common::copy_fixture("registry/parcel");
    let before = common::snapshot(&dir);
    for command in ["check-code", "write"] {
        let cli = Cli::try_parse_from(["outbox-codegen", command, dir.to_str().unwrap()]).unwrap();
        assert_eq!(run_with(cli), ExitCode::from(2), "{command}");
    }
    assert_eq!(common::snapshot(&dir), before);
}
