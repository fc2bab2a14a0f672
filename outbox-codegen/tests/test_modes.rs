//! Compatibility modes: declared in code (`#[outbox(compatibility = "…")]`)
//! or in `registry.json`, enforced by the check (code against folder, and
//! the folder alone) and by `diff`, naming the mode, the versions and each
//! offending change with its rule; backward by default, where an upcaster
//! makes any change acceptable; transitive modes against every earlier
//! version; and the settings (`$id` under a schema base) kept on writes.

mod common;

use outbox_codegen::{
    FindingKind, Report, Severity, WriteMode, check_folder, check_with, diff, write_with,
};
use outbox_core::{ContractRegistry, EventContract, OutboxEvent};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `stock.counted`: v1, a v2 that adds an optional field (full), and a v3
/// that adds a required one (forward only) or one that changes a type
/// (breaking), in forward-mode and default-mode flavours.
mod stock {
    use super::*;

    #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
    #[outbox(event_type = "stock.counted", aggregate = "stock", version = 1)]
    pub(crate) struct V1 {
        #[outbox(aggregate_id)]
        pub(crate) sku: String,
        pub(crate) count: u32,
    }

    #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
    #[outbox(event_type = "stock.counted", aggregate = "stock", version = 2, upcast_from = V1)]
    pub(crate) struct V2 {
        #[outbox(aggregate_id)]
        pub(crate) sku: String,
        pub(crate) count: u32,
        pub(crate) location: Option<String>,
    }

    impl From<V1> for V2 {
        fn from(v1: V1) -> V2 {
            V2 {
                sku: v1.sku,
                count: v1.count,
                location: None,
            }
        }
    }

    /// v3 adds a required field: forward compatible only.
    #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
    #[outbox(event_type = "stock.counted", aggregate = "stock", version = 3, upcast_from = V2, compatibility = "forward")]
    pub(crate) struct V3Forward {
        #[outbox(aggregate_id)]
        pub(crate) sku: String,
        pub(crate) count: u32,
        pub(crate) location: Option<String>,
        pub(crate) counted_by: String,
    }

    impl From<V2> for V3Forward {
        fn from(v2: V2) -> V3Forward {
            V3Forward {
                sku: v2.sku,
                count: v2.count,
                location: v2.location,
                counted_by: "unknown".into(),
            }
        }
    }

    /// v3 turns `count` into a string, under `forward`.
    #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
    #[outbox(event_type = "stock.counted", aggregate = "stock", version = 3, upcast_from = V2, compatibility = "forward")]
    pub(crate) struct V3Broken {
        #[outbox(aggregate_id)]
        pub(crate) sku: String,
        pub(crate) count: String,
        pub(crate) location: Option<String>,
    }

    impl From<V2> for V3Broken {
        fn from(v2: V2) -> V3Broken {
            V3Broken {
                sku: v2.sku,
                count: v2.count.to_string(),
                location: v2.location,
            }
        }
    }

    /// The same breaking v3 without a declared mode: backward, and the
    /// upcaster covers it.
    #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
    #[outbox(event_type = "stock.counted", aggregate = "stock", version = 3, upcast_from = V2)]
    pub(crate) struct V3Default {
        #[outbox(aggregate_id)]
        pub(crate) sku: String,
        pub(crate) count: String,
        pub(crate) location: Option<String>,
    }

    impl From<V2> for V3Default {
        fn from(v2: V2) -> V3Default {
            V3Default {
                sku: v2.sku,
                count: v2.count.to_string(),
                location: v2.location,
            }
        }
    }

    /// v3 removes `location`, which v2 added: forward against v2 (optional
    /// field removed), but under full_transitive also against v1.
    #[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
    #[outbox(event_type = "stock.counted", aggregate = "stock", version = 3, upcast_from = V2, compatibility = "full_transitive")]
    pub(crate) struct V3Transitive {
        #[outbox(aggregate_id)]
        pub(crate) sku: String,
        pub(crate) count: u64,
        pub(crate) location: Option<String>,
    }

    impl From<V2> for V3Transitive {
        fn from(v2: V2) -> V3Transitive {
            V3Transitive {
                sku: v2.sku,
                count: v2.count.into(),
                location: v2.location,
            }
        }
    }
}

fn registry(v3: &'static EventContract) -> ContractRegistry {
    ContractRegistry::from_contracts([stock::V1::contract(), stock::V2::contract(), v3]).unwrap()
}

fn mode_errors(report: &Report) -> Vec<String> {
    report
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::CompatibilityMode && f.severity == Severity::Error)
        .map(|f| f.message.clone())
        .collect()
}

/// Writes v1 and v2 into a new folder, then adds `v3` with Force so the
/// folder holds it, and returns the folder.
fn folder_with(v3: &'static EventContract) -> (tempfile::TempDir, std::path::PathBuf) {
    let temp = tempfile::tempdir().unwrap();
    let dir = temp.path().join("registry");
    let base =
        ContractRegistry::from_contracts([stock::V1::contract(), stock::V2::contract()]).unwrap();
    write_with(&base, &dir, WriteMode::Safe).unwrap();
    let _ = write_with(&registry(v3), &dir, WriteMode::Force);
    (temp, dir)
}

#[test]
fn a_forward_mode_accepts_a_forward_change_and_names_a_breaking_one() {
    let (_temp, dir) = folder_with(stock::V3Forward::contract());
    let report = check_with(&registry(stock::V3Forward::contract()), &dir).unwrap();
    assert!(mode_errors(&report).is_empty(), "{}", report.render_text());
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("registry.json")).unwrap()).unwrap();
    assert_eq!(
        manifest["event_types"][0]["compatibility_mode"], "forward",
        "the declared mode is written into registry.json"
    );

    let contracts = registry(stock::V3Broken::contract());
    let (_temp, dir) = folder_with(stock::V3Broken::contract());
    let report = check_with(&contracts, &dir).unwrap();
    let errors = mode_errors(&report);
    assert_eq!(errors.len(), 1, "{}", report.render_text());
    assert!(
        errors[0].contains("compatibility mode forward")
            && errors[0].contains("readers of v2 cannot read v3")
            && errors[0].contains("[type-changed]"),
        "{}",
        errors[0]
    );
    // Writing does not hide it.
    assert!(write_with(&contracts, &dir, WriteMode::Safe).is_err());
}

#[test]
fn the_default_backward_mode_is_met_by_the_upcaster() {
    let (_temp, dir) = folder_with(stock::V3Default::contract());
    let report = check_with(&registry(stock::V3Default::contract()), &dir).unwrap();
    assert!(mode_errors(&report).is_empty(), "{}", report.render_text());
    assert!(!report.has_errors(), "{}", report.render_text());
}

#[test]
fn a_transitive_mode_checks_every_earlier_version() {
    let (_temp, dir) = folder_with(stock::V3Transitive::contract());
    let report = check_with(&registry(stock::V3Transitive::contract()), &dir).unwrap();
    let errors = mode_errors(&report);
    // u32 → u64 widens: not forward against v2, nor against v1.
    assert_eq!(errors.len(), 2, "{}", report.render_text());
    assert!(
        errors
            .iter()
            .any(|e| e.contains("readers of v1 cannot read v3"))
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("readers of v2 cannot read v3"))
    );
    assert!(errors.iter().all(|e| e.contains("[range-widened]")));
}

#[test]
fn a_mode_written_in_registry_json_is_enforced_by_the_folder_check_and_diff() {
    let (_temp, old) = folder_with(stock::V3Default::contract());
    let report = check_folder(&old).unwrap();
    assert!(!report.has_errors(), "{}", report.render_text());
    // Someone declares forward_transitive in registry.json.
    let (_temp2, new) = common::copy_fixture_dir(&old);
    let path = new.join("registry.json");
    let mut manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    manifest["event_types"][0]["compatibility_mode"] = "forward_transitive".into();
    std::fs::write(&path, outbox_codegen::to_canonical_string(&manifest)).unwrap();
    let report = check_folder(&new).unwrap();
    let errors = mode_errors(&report);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("forward_transitive") && e.contains("readers of v1 cannot read v3")),
        "{}",
        report.render_text()
    );
    // diff reports the changed mode.
    let report = diff(&old, &new).unwrap();
    assert!(
        report
            .findings
            .iter()
            .any(|f| f.kind == FindingKind::CompatibilityMode
                && f.severity == Severity::Warning
                && f.message.contains("from backward to forward_transitive")),
        "{}",
        report.render_text()
    );
    // A mode that does not exist is bad input, named.
    manifest["event_types"][0]["compatibility_mode"] = "sideways".into();
    std::fs::write(&path, outbox_codegen::to_canonical_string(&manifest)).unwrap();
    let error = check_folder(&new).unwrap_err().to_string();
    assert!(
        error.contains("\"sideways\"") && error.contains("backward_transitive"),
        "{error}"
    );
}

#[test]
fn a_schema_base_gives_every_file_its_url_and_survives_writes() {
    let (_temp, dir) = folder_with(stock::V3Default::contract());
    let path = dir.join("registry.json");
    let mut manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    manifest["settings"] = serde_json::json!({"schema_base": "https://schemas.example.com/stock/"});
    std::fs::write(&path, outbox_codegen::to_canonical_string(&manifest)).unwrap();
    // The files still carry the urn: the check names each.
    let contracts = registry(stock::V3Default::contract());
    let report = check_with(&contracts, &dir).unwrap();
    let mismatches = report
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::SchemaIdMismatch)
        .count();
    assert_eq!(mismatches, 3, "{}", report.render_text());
    write_with(&contracts, &dir, WriteMode::Safe).unwrap();
    let report = check_with(&contracts, &dir).unwrap();
    assert!(!report.has_errors(), "{}", report.render_text());
    let v2: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("stock.counted/v2.json")).unwrap())
            .unwrap();
    assert_eq!(
        v2["$id"],
        "https://schemas.example.com/stock/stock.counted/v2.json"
    );
    assert_eq!(
        v2["$id"].as_str().unwrap(),
        outbox_core::dataschema_uri_with_base(
            Some("https://schemas.example.com/stock/"),
            "stock.counted",
            2
        )
    );
    let manifest: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        manifest["settings"]["schema_base"], "https://schemas.example.com/stock/",
        "settings are kept on writes"
    );
    // A base that is not a folder URL is refused, named.
    let mut bad = manifest.clone();
    bad["settings"]["schema_base"] = "schemas".into();
    std::fs::write(&path, outbox_codegen::to_canonical_string(&bad)).unwrap();
    let error = check_folder(&dir).unwrap_err().to_string();
    assert!(error.contains("settings.schema_base"), "{error}");
}
