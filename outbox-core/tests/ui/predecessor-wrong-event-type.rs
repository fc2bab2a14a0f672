use outbox_core::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.placed", aggregate = "order", version = 1)]
struct OrderPlacedV1 {
    #[outbox(aggregate_id)]
    order_id: String,
}

#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 2, upcast_from = OrderPlacedV1)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: String,
}

impl From<OrderPlacedV1> for OrderCreated {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderCreated { order_id: v1.order_id }
    }
}

fn main() {}
