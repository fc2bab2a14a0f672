use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema)]
struct OrderRef {
    region: String,
    number: u64,
}

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 1)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order: OrderRef,
}

fn main() {}
