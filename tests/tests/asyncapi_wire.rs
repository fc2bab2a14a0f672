//! The generated AsyncAPI document describes the wire exactly: messages
//! the NATS transport really publishes (read back from JetStream) match the
//! document's channel address for the configured subject template, its
//! message header schema (every header the transport writes, encoded as
//! the CloudEvents binding says) and the payload schema file; and the
//! `ce-dataschema` each event carries is the `$id` of that file, under the
//! registry's schema base. Real nats-server; a JSON Schema validator.

use std::path::Path;
use std::time::Duration;

use outbox_codegen::{WriteMode, check_with, write_with};
use outbox_core::transport::Transport;
use outbox_core::{ContractRegistry, Envelope, OutboxEvent};
use outbox_examples::contracts::{
    CancelReason, Money, OrderCancelled, OrderCreated, OrderCreatedV1, OrderLine, OrderShipped,
    PaymentCaptured,
};
use outbox_nats::{NatsConfig, NatsTransport};
use outbox_tests::{NatsServer, jetstream};
use serde_json::{Value, json};
use uuid::Uuid;

const BASE: &str = "https://schemas.example.com/shop/";
const TEMPLATE: &str = "shop.{aggregate_type}.{aggregate_id}.{event_type}";

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

/// `#/…` references of the document replaced by what they point at.
fn inline_refs(root: &Value, node: &Value) -> Value {
    match node {
        Value::Object(map) => {
            if let Some(target) = map.get("$ref").and_then(Value::as_str)
                && let Some(pointer) = target.strip_prefix('#')
            {
                return inline_refs(root, root.pointer(pointer).expect("reference resolves"));
            }
            Value::Object(
                map.iter()
                    .map(|(k, v)| (k.clone(), inline_refs(root, v)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| inline_refs(root, v)).collect()),
        other => other.clone(),
    }
}

fn validate(schema: &Value, instance: &Value, what: &str) {
    let validator = jsonschema::validator_for(schema)
        .unwrap_or_else(|e| panic!("{what}: the schema does not compile: {e}"));
    let errors: Vec<String> = validator
        .iter_errors(instance)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{what}: {errors:?}\ninstance: {instance}"
    );
}

/// A channel address with `{aggregate_id}` matches one subject token.
fn address_matches(address: &str, subject: &str) -> bool {
    let pattern: Vec<&str> = address.split('.').collect();
    let tokens: Vec<&str> = subject.split('.').collect();
    pattern.len() == tokens.len()
        && pattern
            .iter()
            .zip(&tokens)
            .all(|(p, t)| *p == *t || (p.starts_with('{') && p.ends_with('}') && !t.is_empty()))
}

#[tokio::test]
async fn messages_the_transport_publishes_match_the_asyncapi_document() {
    let server = NatsServer::start();
    // The examples' registry, with settings as a service would write them
    // into registry.json: where the folder is served, the subject template,
    // the server.
    let folder = tempfile::tempdir().unwrap();
    let dir = folder.path().join("schemas");
    copy_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../schemas"),
        &dir,
    );
    let manifest_path = dir.join("registry.json");
    let mut manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest_path).unwrap()).unwrap();
    manifest["settings"] = json!({
        "schema_base": BASE,
        "subject_template": TEMPLATE,
        "servers": {"local": {"host": server.url().trim_start_matches("nats://"), "protocol": "nats"}}
    });
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let contracts = ContractRegistry::from_contracts([
        OrderCreatedV1::contract(),
        OrderCreated::contract(),
        OrderShipped::contract(),
        OrderCancelled::contract(),
        PaymentCaptured::contract(),
    ])
    .unwrap();
    write_with(&contracts, &dir, WriteMode::Safe).unwrap();
    let report = check_with(&contracts, &dir).unwrap();
    assert!(!report.has_errors(), "{}", report.render_text());
    let document: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("asyncapi.json")).unwrap()).unwrap();
    assert_eq!(
        document["servers"]["local"]["protocol"], "nats",
        "servers come from the settings"
    );

    // The transport configured the same way publishes real events.
    let transport = NatsTransport::connect(NatsConfig {
        url: server.url(),
        stream: "SHOP".into(),
        subject_template: TEMPLATE.into(),
        dataschema_base: Some(BASE.into()),
        source: "/shop".into(),
        ..NatsConfig::default()
    })
    .await
    .unwrap();
    let order_id = Uuid::now_v7();
    let money = Money {
        amount_minor: 1250,
        currency: "EUR".into(),
    };
    let mut envelopes = [
        Envelope::for_event(
            &OrderCreated {
                order_id,
                customer_email: "ada@example.org".into(),
                lines: vec![OrderLine {
                    sku: "SKU-1".into(),
                    quantity: 1,
                    unit_price: money.clone(),
                }],
                total: money.clone(),
            },
            1,
        )
        .unwrap(),
        Envelope::for_event(
            &OrderShipped {
                order_id,
                carrier: "DHL".into(),
                tracking_number: None,
                shipped_at: chrono::Utc::now(),
            },
            2,
        )
        .unwrap(),
        Envelope::for_event(
            &OrderCancelled {
                order_id,
                reason: CancelReason::Other,
                note: Some("changed my mind".into()),
            },
            3,
        )
        .unwrap(),
        Envelope::for_event(
            &PaymentCaptured {
                payment_id: Uuid::now_v7(),
                payment_version: 1,
                order_id,
                amount: money,
                card_last4: "4242".into(),
            },
            1,
        )
        .unwrap(),
    ];
    envelopes[0].traceparent =
        Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
    let refs: Vec<&Envelope> = envelopes.iter().collect();
    assert!(transport.publish(&refs).await.iter().all(Result::is_ok));
    tokio::time::sleep(Duration::from_millis(100)).await;

    let stored = jetstream::read_all(&server.url(), "SHOP").await;
    assert_eq!(stored.len(), envelopes.len());
    for message in &stored {
        let event_type = message.header("ce-type").expect("ce-type");
        let version = message
            .header("ce-schemaversion")
            .expect("ce-schemaversion");
        let message_id = format!("{event_type}.v{version}");
        // The channel of the event type, and its message.
        let channel = &document["channels"][event_type];
        let address = channel["address"].as_str().expect("channel address");
        assert!(
            address_matches(address, &message.subject),
            "{} does not match the channel address {address}",
            message.subject
        );
        assert!(
            channel["messages"][&message_id].is_object(),
            "{message_id} is a message of channel {event_type}"
        );
        let described = &document["components"]["messages"][&message_id];
        // Headers: every header as a string, against the message's schema.
        let headers: Value = Value::Object(
            message
                .headers
                .iter()
                .map(|(name, value)| (name.clone(), Value::String(value.clone())))
                .collect(),
        );
        let header_schema = inline_refs(&document, &described["headers"]);
        validate(
            &header_schema,
            &headers,
            &format!("headers of {message_id}"),
        );
        // Payload: against the schema file the message points at.
        let file = described["payload"]["schema"]["$ref"]
            .as_str()
            .unwrap()
            .trim_start_matches("./");
        let schema: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join(file)).unwrap()).unwrap();
        let payload: Value = serde_json::from_slice(&message.payload).unwrap();
        validate(&schema, &payload, &format!("payload of {message_id}"));
        // dataschema resolves: it is the schema file's $id.
        assert_eq!(
            message.header("ce-dataschema"),
            schema["$id"].as_str(),
            "{message_id}"
        );
        assert_eq!(
            schema["$id"].as_str().unwrap(),
            format!("{BASE}{event_type}/v{version}.json")
        );
    }
    // A header the transport does not write right would fail: the schema
    // is not vacuous.
    let first = &stored[0];
    let message_id = format!(
        "{}.v{}",
        first.header("ce-type").unwrap(),
        first.header("ce-schemaversion").unwrap()
    );
    let header_schema = inline_refs(
        &document,
        &document["components"]["messages"][&message_id]["headers"],
    );
    let mut wrong: serde_json::Map<String, Value> = first
        .headers
        .iter()
        .map(|(n, v)| (n.clone(), Value::String(v.clone())))
        .collect();
    wrong.insert("ce-aggregateid".into(), json!("a b"));
    wrong.remove("ce-datacontenttype");
    let validator = jsonschema::validator_for(&header_schema).unwrap();
    assert!(validator.iter_errors(&Value::Object(wrong)).count() >= 2);
}
