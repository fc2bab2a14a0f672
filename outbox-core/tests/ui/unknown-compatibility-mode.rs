use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 1, compatibility = "sideways")]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: String,
}

fn main() {}
