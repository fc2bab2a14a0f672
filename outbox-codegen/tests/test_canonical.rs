//! Canonical, reproducible output: canonical JSON text (sorted keys,
//! sorted `required`, two-space indentation, one final newline), the same
//! bytes from two generations, in any contract order, equal to the
//! committed fixture; a second write changes no file; the manifest and the
//! AsyncAPI document describe the contracts.

mod common;
#[path = "common/parcel.rs"]
mod parcel;

use std::collections::BTreeMap;

use outbox_codegen::{
    RegistryModel, WriteMode, default_address, generate, load, to_canonical_string, write_with,
};
use outbox_core::{ContractRegistry, EventContract, OutboxEvent};
use serde_json::{Value, json};

use common::{fixture, snapshot};
use parcel::{ParcelSent, ParcelSentV1};

fn registry(contracts: &[&'static EventContract]) -> ContractRegistry {
    ContractRegistry::from_contracts(contracts.iter().copied()).unwrap()
}

fn parcel_model() -> RegistryModel {
    generate(&registry(&[
        ParcelSentV1::contract(),
        ParcelSent::contract(),
    ]))
}

#[test]
fn canonical_text_sorts_keys_and_required_and_ends_with_a_newline() {
    let mut value = serde_json::Map::new();
    value.insert("zeta".into(), json!({"b": [], "a": {}}));
    value.insert("required".into(), json!(["z", "a", "m"]));
    value.insert("alpha".into(), json!(["z", "a"]));
    value.insert("text".into(), json!("é \"quoted\"\n"));
    assert_eq!(
        to_canonical_string(&Value::Object(value)),
        "{\n  \"alpha\": [\n    \"z\",\n    \"a\"\n  ],\n  \"required\": [\n    \"a\",\n    \
         \"m\",\n    \"z\"\n  ],\n  \"text\": \"é \\\"quoted\\\"\\n\",\n  \"zeta\": {\n    \
         \"a\": {},\n    \"b\": []\n  }\n}\n"
    );
    // Insertion order does not matter.
    let a = json!({"x": 1, "y": {"q": 1, "p": 2}});
    let b: Value = serde_json::from_str(r#"{"y": {"p": 2, "q": 1}, "x": 1}"#).unwrap();
    assert_eq!(to_canonical_string(&a), to_canonical_string(&b));
    assert_eq!(to_canonical_string(&json!(null)), "null\n");
}

#[test]
fn generation_is_byte_identical_and_matches_the_committed_fixture() {
    let first = parcel_model().files();
    let second = parcel_model().files();
    assert_eq!(first, second);
    let reversed = generate(&registry(&[
        ParcelSent::contract(),
        ParcelSentV1::contract(),
    ]))
    .files();
    assert_eq!(first, reversed);
    let committed: BTreeMap<String, String> = snapshot(&fixture("registry/parcel"))
        .into_iter()
        .map(|(path, bytes)| (path, String::from_utf8(bytes).unwrap()))
        .collect();
    assert_eq!(first, committed);
    for (path, text) in &first {
        assert!(text.ends_with("}\n") && !text.ends_with("\n\n"), "{path}");
        assert!(!text.contains('\r') && !text.contains('\t'), "{path}");
        assert!(
            text.lines().all(|line| line == line.trim_end()),
            "{path} has trailing spaces"
        );
        let value: Value = serde_json::from_str(text).unwrap();
        assert_eq!(
            &to_canonical_string(&value),
            text,
            "{path} is not canonical"
        );
    }
}

#[test]
fn two_writes_give_the_same_bytes_and_the_second_touches_nothing() {
    let contracts = registry(&[ParcelSentV1::contract(), ParcelSent::contract()]);
    let temp = tempfile::tempdir().unwrap();
    let one = temp.path().join("one");
    let two = temp.path().join("two");
    write_with(&contracts, &one, WriteMode::Safe).unwrap();
    write_with(&contracts, &two, WriteMode::Safe).unwrap();
    assert_eq!(snapshot(&one), snapshot(&two));

    let modified = |dir: &std::path::Path| -> Vec<std::time::SystemTime> {
        snapshot(dir)
            .keys()
            .map(|p| std::fs::metadata(dir.join(p)).unwrap().modified().unwrap())
            .collect()
    };
    let before = modified(&one);
    let summary = write_with(&contracts, &one, WriteMode::Force).unwrap();
    assert!(summary.written.is_empty() && summary.removed.is_empty());
    assert_eq!(modified(&one), before);
}

#[test]
fn the_loaded_fixture_is_the_generated_model() {
    let loaded = load(&fixture("registry/parcel")).unwrap();
    assert_eq!(loaded.model, parcel_model());
}

#[test]
fn the_manifest_describes_versions_links_and_classes() {
    let manifest = serde_json::to_value(parcel_model().manifest()).unwrap();
    let entry = &manifest["event_types"][0];
    assert_eq!(manifest["format"], "outbox-schema-registry/1");
    assert_eq!(entry["event_type"], "parcel.sent");
    assert_eq!(entry["aggregate_type"], "parcel");
    assert_eq!(entry["current_version"], 2);
    assert!(entry.get("retired").is_none());
    let v1 = &entry["versions"][0];
    assert_eq!(v1["schema"], "parcel.sent/v1.json");
    assert_eq!(v1["redacted_fields"], json!(["recipient"]));
    assert!(v1.get("compatibility").is_none() && v1.get("upcast_from").is_none());
    let v2 = &entry["versions"][1];
    assert_eq!(v2["compatibility"], "forward");
    assert_eq!(v2["upcast_from"], json!({"kind": "typed", "version": 1}));
    assert_eq!(v2["sha256"].as_str().unwrap().len(), 64);
}

#[test]
fn the_asyncapi_document_has_a_channel_per_event_type_and_a_message_per_version() {
    let files = parcel_model().files();
    let document: Value = serde_json::from_str(&files["asyncapi.json"]).unwrap();
    assert_eq!(document["asyncapi"], "3.0.0");
    assert_eq!(
        default_address("parcel", "parcel.sent"),
        "events.parcel.parcel.sent"
    );
    let channel = &document["channels"]["parcel.sent"];
    assert_eq!(channel["address"], "events.parcel.parcel.sent");
    assert_eq!(
        channel["messages"],
        json!({
            "parcel.sent.v1": {"$ref": "#/components/messages/parcel.sent.v1"},
            "parcel.sent.v2": {"$ref": "#/components/messages/parcel.sent.v2"}
        })
    );
    let message = &document["components"]["messages"]["parcel.sent.v2"];
    assert_eq!(
        message["payload"]["schema"]["$ref"],
        "./parcel.sent/v2.json"
    );
    assert_eq!(message["x-outbox-schema-version"], 2);
    assert_eq!(message["x-outbox-aggregate-type"], "parcel");
    assert_eq!(message["x-outbox-redacted-fields"], json!(["recipient"]));
    assert_eq!(
        document["operations"]["publish.parcel.sent"],
        json!({"action": "send", "channel": {"$ref": "#/channels/parcel.sent"}})
    );
}

#[test]
fn an_empty_registry_has_a_manifest_and_a_document_only() {
    let files = generate(&ContractRegistry::default()).files();
    assert_eq!(
        files.keys().map(String::as_str).collect::<Vec<_>>(),
        vec!["asyncapi.json", "registry.json"]
    );
    assert_eq!(
        files["registry.json"],
        "{\n  \"event_types\": [],\n  \"format\": \"outbox-schema-registry/1\"\n}\n"
    );
}
