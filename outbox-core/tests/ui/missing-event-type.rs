use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(aggregate = "order", version = 1)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: String,
}

fn main() {}
