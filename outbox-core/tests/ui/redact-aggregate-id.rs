use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "customer.registered", aggregate = "customer", version = 1)]
struct CustomerRegistered {
    #[outbox(aggregate_id, redact)]
    email: String,
}

fn main() {}
