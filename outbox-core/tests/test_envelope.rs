//! The envelope: built from a contract, mapped onto CloudEvents attributes
//! and back, shown redacted, and rejected with a named attribute when
//! malformed.

use outbox_core::{Envelope, EnvelopeError, OutboxEvent, ce, trace};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

#[derive(Debug, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "user.signed_up", aggregate = "user", version = 2)]
struct UserSignedUp {
    #[outbox(aggregate_id)]
    user_id: String,
    #[outbox(redact)]
    email: String,
    plan: String,
}

fn signed_up() -> UserSignedUp {
    UserSignedUp {
        user_id: "u-1".into(),
        email: "grace@example.org".into(),
        plan: "pro".into(),
    }
}

#[tokio::test]
async fn envelope_carries_contract_metadata_and_the_ambient_trace() {
    let parent: trace::TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        .parse()
        .unwrap();
    let envelope = trace::scope(Some(parent), async { Envelope::for_event(&signed_up(), 3) })
        .await
        .unwrap();
    assert_eq!(envelope.id.get_version_num(), 7);
    assert_eq!(envelope.event_type, "user.signed_up");
    assert_eq!(envelope.schema_version, 2);
    assert_eq!(envelope.aggregate_type, "user");
    assert_eq!(envelope.aggregate_id, "u-1");
    assert_eq!(envelope.aggregate_version, 3);
    let traceparent: trace::TraceParent = envelope.traceparent.as_deref().unwrap().parse().unwrap();
    assert_eq!(traceparent.trace_id, parent.trace_id);
    assert_ne!(traceparent.span_id, parent.span_id);
}

#[test]
fn cloudevents_attributes_round_trip() {
    let envelope = Envelope::for_event(&signed_up(), 1).unwrap();
    let attributes: HashMap<&str, String> = envelope
        .cloudevents_attributes("/user-service")
        .into_iter()
        .collect();
    assert_eq!(attributes["specversion"], "1.0");
    assert_eq!(attributes["type"], "user.signed_up");
    assert_eq!(attributes["source"], "/user-service");
    assert_eq!(attributes["subject"], "u-1");
    assert_eq!(
        attributes["dataschema"],
        "urn:outbox:schema:user.signed_up:v2"
    );
    assert_eq!(attributes["schemaversion"], "2");
    assert_eq!(attributes["aggregateversion"], "1");
    assert!(!attributes.contains_key("traceparent"));
    let back = Envelope::from_cloudevents(
        |name| attributes.get(name).map(String::as_str),
        envelope.payload.get().as_bytes(),
    )
    .unwrap();
    assert_eq!(back.id, envelope.id);
    assert_eq!(back.event_type, envelope.event_type);
    assert_eq!(back.aggregate_version, 1);
    assert_eq!(back.occurred_at, envelope.occurred_at);
    assert_eq!(back.payload.get(), envelope.payload.get());
    let decoded = UserSignedUp::decode(back.schema_version, &back.payload).unwrap();
    assert_eq!(decoded.email, "grace@example.org");
}

#[test]
fn malformed_attributes_are_named() {
    let envelope = Envelope::for_event(&signed_up(), 1).unwrap();
    let mut attributes: HashMap<&str, String> = envelope
        .cloudevents_attributes("/user-service")
        .into_iter()
        .collect();
    attributes.remove(ce::AGGREGATEID);
    let error =
        Envelope::from_cloudevents(|n| attributes.get(n).map(String::as_str), b"{}").unwrap_err();
    assert_eq!(
        error,
        EnvelopeError::MissingAttribute {
            name: "aggregateid"
        }
    );

    attributes.insert(ce::AGGREGATEID, "u-1".into());
    attributes.insert(ce::SCHEMAVERSION, "two".into());
    let error =
        Envelope::from_cloudevents(|n| attributes.get(n).map(String::as_str), b"{}").unwrap_err();
    assert!(
        matches!(
            error,
            EnvelopeError::InvalidAttribute {
                name: "schemaversion",
                ..
            }
        ),
        "{error}"
    );

    attributes.insert(ce::SCHEMAVERSION, "2".into());
    let error = Envelope::from_cloudevents(|n| attributes.get(n).map(String::as_str), b"{not json")
        .unwrap_err();
    assert!(matches!(error, EnvelopeError::Payload { .. }), "{error}");
}

#[test]
fn display_and_redacted_payload_mask_sensitive_fields() {
    let envelope = Envelope::for_event(&signed_up(), 1).unwrap();
    let shown = envelope.to_string();
    assert!(shown.contains("user.signed_up v2"), "{shown}");
    assert!(shown.contains("[REDACTED]"), "{shown}");
    assert!(!shown.contains("grace@example.org"), "{shown}");
    assert_eq!(envelope.redacted_payload()["plan"], "pro");
}

#[test]
fn unknown_event_types_are_shown_fully_masked() {
    let mut envelope = Envelope::for_event(&signed_up(), 1).unwrap();
    envelope.event_type = "user.unknown".into();
    let shown = envelope.redacted_payload();
    assert_eq!(shown["plan"], "[REDACTED]");
    assert_eq!(shown["user_id"], "[REDACTED]");
}
