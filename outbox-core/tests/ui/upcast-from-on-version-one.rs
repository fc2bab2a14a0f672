use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 1)]
struct OrderCreatedV0 {
    #[outbox(aggregate_id)]
    order_id: String,
}

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 1, upcast_from = OrderCreatedV0)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: String,
}

fn main() {}
