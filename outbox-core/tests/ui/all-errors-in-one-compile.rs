use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "Order-Created", aggregate = "order", version = 0, colour = "red")]
struct OrderCreated {
    order_id: String,
    #[outbox(redact, redact)]
    email: String,
}

// The fallback impl keeps code that uses the contract free of follow-up errors.
#[allow(dead_code)]
fn event_type() -> &'static str {
    <OrderCreated as OutboxEvent>::EVENT_TYPE
}

fn main() {}
