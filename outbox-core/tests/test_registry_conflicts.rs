//! A binary that links two types claiming one (event type, version), and an
//! event type announced for two aggregates: the registry refuses it and
//! names both types of each conflict.

use outbox_core::{ContractKey, ContractRegistry, RegistryError};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod billing {
    use super::*;

    #[derive(Serialize, Deserialize, JsonSchema, outbox_core::OutboxEvent)]
    #[outbox(event_type = "order.paid", aggregate = "order", version = 1)]
    pub(crate) struct OrderPaid {
        #[outbox(aggregate_id)]
        pub(crate) order_id: String,
    }
}

mod shop {
    use super::*;

    #[derive(Serialize, Deserialize, JsonSchema, outbox_core::OutboxEvent)]
    #[outbox(event_type = "order.paid", aggregate = "order", version = 1)]
    pub(crate) struct OrderPaid {
        #[outbox(aggregate_id)]
        pub(crate) id: String,
    }

    #[derive(Serialize, Deserialize, JsonSchema, outbox_core::OutboxEvent)]
    #[outbox(event_type = "order.paid", aggregate = "payment", version = 2)]
    pub(crate) struct OrderPaidV2 {
        #[outbox(aggregate_id)]
        pub(crate) id: String,
    }
}

#[test]
fn duplicate_and_conflicting_contracts_are_reported_with_both_names() {
    let errors = ContractRegistry::global().unwrap_err();
    assert_eq!(
        errors.0,
        vec![
            RegistryError::DuplicateContract {
                key: ContractKey {
                    event_type: "order.paid",
                    schema_version: 1
                },
                first: "test_registry_conflicts::billing::OrderPaid",
                second: "test_registry_conflicts::shop::OrderPaid",
            },
            RegistryError::ConflictingAggregate {
                event_type: "order.paid",
                first: "test_registry_conflicts::billing::OrderPaid",
                first_aggregate: "order",
                second: "test_registry_conflicts::shop::OrderPaidV2",
                second_aggregate: "payment",
            },
        ]
    );
    let message = errors.to_string();
    assert!(message.contains("order.paid v1 is claimed by two types: test_registry_conflicts::billing::OrderPaid and test_registry_conflicts::shop::OrderPaid"), "{message}");
    let _ = (
        billing::OrderPaid {
            order_id: String::new(),
        }
        .order_id,
        shop::OrderPaid { id: String::new() }.id,
        shop::OrderPaidV2 { id: String::new() }.id,
    );
}
