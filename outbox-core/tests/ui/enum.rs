use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.changed", aggregate = "order", version = 1)]
enum OrderEvent {
    Created { order_id: String },
    Cancelled { order_id: String },
}

fn main() {}
