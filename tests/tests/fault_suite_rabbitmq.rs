//! The fault suite on RabbitMQ (`outbox_tests::faults::suite`, the same
//! run, schedule and invariants as `fault_suite.rs` on NATS): relays and
//! consumers as `fault-node` processes against a private RabbitMQ node
//! (`outbox_tests::rabbitnode`: its own node name, ports and store),
//! reached through the rig's TCP proxy for cuts, delays and silence; the
//! broker restart kills the node with SIGKILL and boots it again on its
//! store (durable queues, persistent messages: confirmed messages must
//! survive). Each consumer's queue has a single active consumer, so of the
//! two instances one consumes and the other takes over when it is killed.

use outbox_tests::faults::{BrokerKind, suite};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_at_random_on_rabbitmq_lose_nothing_apply_nothing_twice_and_leave_nothing_stuck() {
    suite::run(
        BrokerKind::RabbitMq,
        env!("CARGO_BIN_EXE_fault-node").into(),
    )
    .await;
}
