use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 1)]
struct OrderCreated(String, u64);

fn main() {}
