use outbox_core::OutboxEvent;

#[derive(OutboxEvent)]
#[outbox(event_type = "order.created", aggregate = "order", version = 1)]
union OrderCreated {
    id: u64,
    other: f64,
}

fn main() {}
