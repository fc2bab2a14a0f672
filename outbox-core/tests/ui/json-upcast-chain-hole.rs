use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

fn v1_to_v2(value: serde_json::Value) -> Result<serde_json::Value, outbox_core::UpcastError> {
    Ok(value)
}

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 3, upcast(from = 1, with = v1_to_v2))]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: String,
}

fn main() {}
