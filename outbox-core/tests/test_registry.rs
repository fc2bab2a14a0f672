//! The process-wide contract registry: every derive in the binary is listed,
//! sorted, with its current version.

use outbox_core::{ContractRegistry, OutboxEvent};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 1)]
struct OrderCreatedV1 {
    #[outbox(aggregate_id)]
    order_id: String,
}

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 2, upcast_from = OrderCreatedV1)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: String,
    note: Option<String>,
}

impl From<OrderCreatedV1> for OrderCreated {
    fn from(v1: OrderCreatedV1) -> Self {
        OrderCreated {
            order_id: v1.order_id,
            note: None,
        }
    }
}

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "invoice.sent", aggregate = "invoice", version = 1)]
struct InvoiceSent {
    #[outbox(aggregate_id)]
    invoice: String,
}

#[test]
fn lists_every_contract_linked_into_the_binary_sorted() {
    let registry = ContractRegistry::global().expect("consistent registry");
    let listed: Vec<(String, u32, String)> = registry
        .contracts()
        .map(|c| {
            (
                c.event_type.to_owned(),
                c.schema_version,
                c.rust_type.to_owned(),
            )
        })
        .collect();
    assert_eq!(
        listed,
        vec![
            (
                "invoice.sent".into(),
                1,
                "test_registry::InvoiceSent".into()
            ),
            (
                "order.created".into(),
                1,
                "test_registry::OrderCreatedV1".into()
            ),
            (
                "order.created".into(),
                2,
                "test_registry::OrderCreated".into()
            ),
        ]
    );
    let event_types: Vec<&str> = registry.event_types().collect();
    assert_eq!(event_types, vec!["invoice.sent", "order.created"]);
}

#[test]
fn answers_lookups_by_type_and_version() {
    let registry = ContractRegistry::global().unwrap();
    assert_eq!(registry.current("order.created").unwrap().schema_version, 2);
    assert_eq!(
        registry.get("order.created", 1).unwrap().rust_type,
        "test_registry::OrderCreatedV1"
    );
    assert!(registry.get("order.created", 3).is_none());
    assert!(registry.current("order.deleted").is_none());
    assert_eq!(registry.versions("order.created").count(), 2);
    assert!(std::ptr::eq(
        registry.get("invoice.sent", 1).unwrap(),
        InvoiceSent::contract()
    ));
}
