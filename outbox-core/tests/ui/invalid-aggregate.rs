use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "Order Aggregate", version = 1)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: String,
}

fn main() {}
