use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 1)]
struct OrderCreatedV1 {
    #[outbox(aggregate_id)]
    order_id: String,
}

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 3, upcast_from = OrderCreatedV1)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: String,
}

impl From<OrderCreatedV1> for OrderCreated {
    fn from(v1: OrderCreatedV1) -> Self {
        OrderCreated { order_id: v1.order_id }
    }
}

fn main() {}
