//! Upcast chains v1 → v2 → v3 through typed (`upcast_from`) and JSON
//! (`upcast(from = N, with = fn)`) steps, in both orders, and the errors a
//! consumer sees for versions it cannot read.

use outbox_core::{DecodeError, OutboxEvent, UpcastError, UpcastKind};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::value::{RawValue, to_raw_value};
use serde_json::{Value, json};

fn raw(value: Value) -> Box<RawValue> {
    to_raw_value(&value).unwrap()
}

// Chain A: v1 → v2 by JSON (the v1 struct is gone), v2 → v3 typed.

fn shipment_v1_to_v2(mut value: Value) -> Result<Value, UpcastError> {
    let object = value
        .as_object_mut()
        .ok_or_else(|| UpcastError::new("not an object"))?;
    let weight = object
        .remove("weight_grams")
        .ok_or_else(|| UpcastError::new("v1 payload has no weight_grams"))?;
    object.insert(
        "weight_kg".into(),
        json!(weight.as_f64().unwrap_or(0.0) / 1000.0),
    );
    Ok(value)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "shipment.booked",
    aggregate = "shipment",
    version = 2,
    upcast(from = 1, with = shipment_v1_to_v2)
)]
struct ShipmentBookedV2 {
    #[outbox(aggregate_id)]
    shipment_id: String,
    weight_kg: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "shipment.booked",
    aggregate = "shipment",
    version = 3,
    upcast_from = ShipmentBookedV2
)]
struct ShipmentBooked {
    #[outbox(aggregate_id)]
    shipment_id: String,
    weight_kg: f64,
    carrier: String,
}

impl From<ShipmentBookedV2> for ShipmentBooked {
    fn from(v2: ShipmentBookedV2) -> Self {
        ShipmentBooked {
            shipment_id: v2.shipment_id,
            weight_kg: v2.weight_kg,
            carrier: "unassigned".into(),
        }
    }
}

#[test]
fn json_then_typed_chain_reads_every_version() {
    let v1 = raw(json!({"shipment_id": "S-1", "weight_grams": 2500}));
    let v2 = raw(json!({"shipment_id": "S-1", "weight_kg": 2.5}));
    let v3 = raw(json!({"shipment_id": "S-1", "weight_kg": 2.5, "carrier": "DHL"}));
    let expected_from_old = ShipmentBooked {
        shipment_id: "S-1".into(),
        weight_kg: 2.5,
        carrier: "unassigned".into(),
    };
    assert_eq!(ShipmentBooked::decode(1, &v1).unwrap(), expected_from_old);
    assert_eq!(ShipmentBooked::decode(2, &v2).unwrap(), expected_from_old);
    assert_eq!(ShipmentBooked::decode(3, &v3).unwrap().carrier, "DHL");
    assert_eq!(ShipmentBooked::READABLE_FROM, 1);
    assert_eq!(ShipmentBookedV2::READABLE_FROM, 1);
}

#[test]
fn contracts_describe_their_own_links() {
    let v3 = ShipmentBooked::contract();
    assert_eq!(v3.upcasts.len(), 1);
    assert_eq!(v3.upcasts[0].from, 2);
    assert_eq!(
        v3.upcasts[0].kind,
        UpcastKind::Typed {
            predecessor: "test_upcast_chain::ShipmentBookedV2"
        }
    );
    let v2 = ShipmentBookedV2::contract();
    assert_eq!(v2.upcasts.len(), 1);
    assert_eq!(v2.upcasts[0].from, 1);
    assert_eq!(
        v2.upcasts[0].kind,
        UpcastKind::Json {
            function: "shipment_v1_to_v2"
        }
    );
}

#[test]
fn a_failing_json_step_names_the_step_and_the_reason() {
    let broken = raw(json!({"shipment_id": "S-1"}));
    let error = ShipmentBooked::decode(1, &broken).unwrap_err();
    assert!(
        matches!(error, DecodeError::Upcast { from: 1, .. }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "shipment.booked: upcast from v1 to v2 failed: v1 payload has no weight_grams"
    );
}

#[test]
fn versions_outside_the_chain_are_typed_errors() {
    let payload = raw(json!({}));
    let too_new = ShipmentBooked::decode(4, &payload).unwrap_err();
    assert!(matches!(
        too_new,
        DecodeError::VersionTooNew {
            version: 4,
            newest: 3,
            ..
        }
    ));
    let zero = ShipmentBooked::decode(0, &payload).unwrap_err();
    assert!(matches!(
        zero,
        DecodeError::VersionUnreadable { version: 0, .. }
    ));
}

#[test]
fn a_payload_that_does_not_match_its_version_names_the_field() {
    let wrong = raw(json!({"shipment_id": "S-1", "weight_kg": "heavy", "carrier": "DHL"}));
    let error = ShipmentBooked::decode(3, &wrong).unwrap_err();
    assert!(matches!(error, DecodeError::Payload { version: 3, .. }));
    // The kind of mismatch and the position, never the value: the field
    // could be one the contract redacts.
    assert!(
        error
            .to_string()
            .contains("invalid type: string \"…\", expected f64"),
        "{error}"
    );
    assert!(!format!("{error} {error:?}").contains("heavy"), "{error:?}");
}

// Chain B: v1 → v2 typed with a fallible TryFrom, v2 → v3 typed.

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "account.opened", aggregate = "account", version = 1)]
struct AccountOpenedV1 {
    #[outbox(aggregate_id)]
    account: String,
    currency: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "account.opened",
    aggregate = "account",
    version = 2,
    upcast_from = AccountOpenedV1
)]
struct AccountOpenedV2 {
    #[outbox(aggregate_id)]
    account: String,
    currency: [u8; 3],
}

impl TryFrom<AccountOpenedV1> for AccountOpenedV2 {
    type Error = UpcastError;

    fn try_from(v1: AccountOpenedV1) -> Result<Self, Self::Error> {
        let bytes: [u8; 3] = v1.currency.as_bytes().try_into().map_err(|_| {
            UpcastError::new(format!("currency {:?} is not 3 letters", v1.currency))
        })?;
        Ok(AccountOpenedV2 {
            account: v1.account,
            currency: bytes,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "account.opened",
    aggregate = "account",
    version = 3,
    upcast_from = AccountOpenedV2
)]
struct AccountOpened {
    #[outbox(aggregate_id)]
    account: String,
    currency: String,
    overdraft_allowed: bool,
}

impl From<AccountOpenedV2> for AccountOpened {
    fn from(v2: AccountOpenedV2) -> Self {
        AccountOpened {
            account: v2.account,
            currency: String::from_utf8_lossy(&v2.currency).into_owned(),
            overdraft_allowed: false,
        }
    }
}

#[test]
fn typed_chain_of_two_steps_reads_v1_as_v3() {
    let v1 = raw(json!({"account": "A-1", "currency": "EUR"}));
    assert_eq!(
        AccountOpened::decode(1, &v1).unwrap(),
        AccountOpened {
            account: "A-1".into(),
            currency: "EUR".into(),
            overdraft_allowed: false
        }
    );
}

#[test]
fn a_failing_try_from_surfaces_its_error() {
    let v1 = raw(json!({"account": "A-1", "currency": "EURO"}));
    let error = AccountOpened::decode(1, &v1).unwrap_err();
    assert!(
        matches!(error, DecodeError::Upcast { from: 1, .. }),
        "{error:?}"
    );
    assert!(
        error
            .to_string()
            .contains("currency \"…\" is not 3 letters"),
        "{error}"
    );
    // The step's own error is still there for code that inspects it.
    let DecodeError::Upcast { source, .. } = &error else {
        unreachable!()
    };
    assert!(source.inner().to_string().contains("\"EURO\""));
}

// Chain C: v1 → v2 → v3 all by JSON on the newest struct.

fn ticket_v1_to_v2(mut value: Value) -> Result<Value, UpcastError> {
    value["priority"] = json!("normal");
    Ok(value)
}

fn ticket_v2_to_v3(mut value: Value) -> Result<Value, String> {
    let title = value["title"].take();
    value["summary"] = title;
    value.as_object_mut().unwrap().remove("title");
    Ok(value)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(
    event_type = "ticket.opened",
    aggregate = "ticket",
    version = 3,
    upcast(from = 2, with = ticket_v2_to_v3),
    upcast(from = 1, with = ticket_v1_to_v2)
)]
struct TicketOpened {
    #[outbox(aggregate_id)]
    ticket: u64,
    summary: String,
    priority: String,
}

#[test]
fn json_chain_applies_steps_in_version_order() {
    let v1 = raw(json!({"ticket": 9, "title": "printer on fire"}));
    assert_eq!(
        TicketOpened::decode(1, &v1).unwrap(),
        TicketOpened {
            ticket: 9,
            summary: "printer on fire".into(),
            priority: "normal".into()
        }
    );
    let v2 = raw(json!({"ticket": 9, "title": "printer on fire", "priority": "high"}));
    assert_eq!(TicketOpened::decode(2, &v2).unwrap().priority, "high");
    let links: Vec<u32> = TicketOpened::contract()
        .upcasts
        .iter()
        .map(|l| l.from)
        .collect();
    assert_eq!(links, vec![1, 2]);
}
