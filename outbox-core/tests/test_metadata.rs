//! The generated metadata and payload for several contract shapes: serde
//! renames, nested types, Option, Uuid, enums as field types, flatten,
//! skip_serializing_if, and ids of several types.

use std::fmt;

use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum Tier {
    Basic,
    Gold,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Address {
    street: String,
    city: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Audit {
    actor: String,
    reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[serde(rename_all = "camelCase")]
#[outbox(
    event_type = "customer.registered",
    aggregate = "customer",
    version = 1
)]
struct CustomerRegistered {
    #[outbox(aggregate_id)]
    customer_id: Uuid,
    #[outbox(redact)]
    email_address: String,
    #[outbox(redact)]
    #[serde(rename = "dob")]
    date_of_birth: String,
    tier: Tier,
    shipping_address: Option<Address>,
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    tags: Vec<String>,
    #[serde(flatten)]
    audit: Audit,
}

fn customer() -> CustomerRegistered {
    CustomerRegistered {
        customer_id: Uuid::parse_str("0190f5a2-7c1e-7d3a-9b1e-2f4c6a8d0e11").unwrap(),
        email_address: "ada@example.org".into(),
        date_of_birth: "1815-12-10".into(),
        tier: Tier::Gold,
        shipping_address: Some(Address {
            street: "1 Analytical Way".into(),
            city: "London".into(),
        }),
        tags: vec![],
        audit: Audit {
            actor: "signup-form".into(),
            reason: None,
        },
    }
}

#[test]
fn constants_describe_the_contract_and_work_in_const_context() {
    const EVENT_TYPE: &str = CustomerRegistered::EVENT_TYPE;
    const VERSION: u32 = <CustomerRegistered as OutboxEvent>::SCHEMA_VERSION;
    const _: () = assert!(VERSION == 1);
    assert_eq!(EVENT_TYPE, "customer.registered");
    assert_eq!(CustomerRegistered::AGGREGATE_TYPE, "customer");
    assert_eq!(CustomerRegistered::READABLE_FROM, 1);
    let contract = CustomerRegistered::contract();
    assert_eq!(contract.event_type, "customer.registered");
    assert_eq!(contract.aggregate_type, "customer");
    assert_eq!(contract.schema_version, 1);
    assert_eq!(contract.rust_type, "test_metadata::CustomerRegistered");
    assert!(contract.upcasts.is_empty());
    assert!(
        contract
            .defined_at
            .starts_with("outbox-core/tests/test_metadata.rs:")
    );
}

#[test]
fn aggregate_id_is_the_marked_field_rendered_as_a_string() {
    assert_eq!(
        customer().aggregate_id(),
        "0190f5a2-7c1e-7d3a-9b1e-2f4c6a8d0e11"
    );
    assert_eq!(customer().aggregate_version(), None);
}

#[test]
fn payload_follows_serde_renames_flatten_and_skip() {
    let payload: serde_json::Value =
        serde_json::from_str(customer().to_payload().unwrap().get()).unwrap();
    assert_eq!(
        payload,
        json!({
            "customerId": "0190f5a2-7c1e-7d3a-9b1e-2f4c6a8d0e11",
            "emailAddress": "ada@example.org",
            "dob": "1815-12-10",
            "tier": "GOLD",
            "shippingAddress": {"street": "1 Analytical Way", "city": "London"},
            "actor": "signup-form",
            "reason": null
        })
    );
}

#[test]
fn redaction_masks_the_serialized_keys_of_marked_fields() {
    assert_eq!(
        CustomerRegistered::REDACTED_FIELDS,
        &["emailAddress", "dob"]
    );
    let redacted = customer().redacted_payload().unwrap();
    assert_eq!(redacted["emailAddress"], "[REDACTED]");
    assert_eq!(redacted["dob"], "[REDACTED]");
    assert_eq!(redacted["tier"], "GOLD");
    assert_eq!(redacted["shippingAddress"]["city"], "London");
    let text = redacted.to_string();
    assert!(!text.contains("ada@example.org"), "{text}");
    assert!(!text.contains("1815"), "{text}");
}

#[test]
fn schema_is_draft_2020_12_with_serde_names_and_nested_definitions() {
    let schema = serde_json::to_value(CustomerRegistered::contract_schema()).unwrap();
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    let properties = schema["properties"].as_object().unwrap();
    for key in [
        "customerId",
        "emailAddress",
        "dob",
        "tier",
        "shippingAddress",
        "tags",
        "actor",
        "reason",
    ] {
        assert!(properties.contains_key(key), "missing {key} in {schema}");
    }
    assert_eq!(properties["customerId"]["format"], "uuid");
    assert!(schema["$defs"]["Address"].is_object(), "{schema}");
    assert!(schema["$defs"]["Tier"].is_object(), "{schema}");
    let required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(required.contains(&"customerId"));
    assert!(
        !required.contains(&"tags"),
        "a field with a default is optional"
    );
}

#[test]
fn decoding_the_current_version_round_trips() {
    let original = customer();
    let payload = original.to_payload().unwrap();
    let decoded = CustomerRegistered::decode(1, &payload).unwrap();
    assert_eq!(decoded, original);
}

/// A newtype id with its own Display.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
struct Sku(String);

impl fmt::Display for Sku {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sku-{}", self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "stock.adjusted", aggregate = "stock", version = 1)]
struct StockAdjusted {
    #[outbox(aggregate_id)]
    sku: Sku,
    #[outbox(aggregate_version)]
    revision: u32,
    delta: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "ledger.posted", aggregate = "ledger", version = 1)]
struct LedgerPosted {
    #[outbox(aggregate_id)]
    ledger: i64,
    r#type: String,
}

#[test]
fn ids_of_other_types_and_a_carried_aggregate_version() {
    let stock = StockAdjusted {
        sku: Sku("A-1".into()),
        revision: 7,
        delta: -2,
    };
    assert_eq!(stock.aggregate_id(), "sku-A-1");
    assert_eq!(stock.aggregate_version(), Some(7));
    assert!(StockAdjusted::contract().upcasts.is_empty());
    let ledger = LedgerPosted {
        ledger: -42,
        r#type: "credit".into(),
    };
    assert_eq!(ledger.aggregate_id(), "-42");
    assert_eq!(ledger.aggregate_version(), None);
}

mod renamed {
    // A module that imports the runtime crate under another name and tells
    // the derive so with `crate = "..."`.
    use outbox_core as events_runtime;
    use schemars::JsonSchema;
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize, JsonSchema, events_runtime::OutboxEvent)]
    #[outbox(
        crate = "events_runtime",
        event_type = "invoice.issued",
        aggregate = "invoice",
        version = 1
    )]
    pub(crate) struct InvoiceIssued {
        #[outbox(aggregate_id)]
        pub(crate) invoice_no: String,
    }
}

#[test]
fn crate_attribute_points_generated_code_at_a_renamed_path() {
    let invoice = renamed::InvoiceIssued {
        invoice_no: "INV-9".into(),
    };
    assert_eq!(invoice.aggregate_id(), "INV-9");
    assert_eq!(renamed::InvoiceIssued::EVENT_TYPE, "invoice.issued");
}

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "customer.renamed",
    aggregate = "customer",
    version = 1,
    compatibility = "full_transitive"
)]
struct CustomerRenamed {
    #[outbox(aggregate_id)]
    customer_id: String,
    name: String,
}

#[test]
fn the_declared_compatibility_mode_is_in_the_contract() {
    assert_eq!(
        CustomerRenamed::contract().compatibility,
        Some(outbox_core::CompatibilityMode::FullTransitive)
    );
    assert_eq!(CustomerRegistered::contract().compatibility, None);
    for mode in outbox_core::CompatibilityMode::ALL {
        assert_eq!(
            outbox_core::CompatibilityMode::from_name(mode.name()),
            Some(mode)
        );
    }
}
