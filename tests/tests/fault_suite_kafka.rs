//! The fault suite on Kafka (`outbox_tests::faults::suite`, the same run,
//! schedule and invariants as `fault_suite.rs` on NATS): relays and
//! consumers as `fault-node` processes publishing to and reading from
//! librdkafka's mock cluster, which this test process hosts (the Kafka
//! protocol over TCP, consumer groups with rebalances when an instance is
//! killed).
//!
//! What the mock puts the clients through, and what it cannot: the broker
//! "restart" is the mock broker taken down (connections closed, new ones
//! refused) and brought up with its log kept, not a process restart (that
//! one is `kafka_broker_process.rs` on Tansu, whose memory-only storage
//! loses the log, so it cannot carry these invariants); silence and delay
//! are the mock's round-trip time (responses held back), because Kafka
//! clients connect to the addresses the cluster advertises and a proxy in
//! front of the bootstrap address would see only the first connection.
//! The PostgreSQL faults, process kills and stops, duplicates and poison
//! are the same as on NATS.

use outbox_tests::faults::{BrokerKind, suite};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_at_random_on_kafka_lose_nothing_apply_nothing_twice_and_leave_nothing_stuck() {
    suite::run(BrokerKind::Kafka, env!("CARGO_BIN_EXE_fault-node").into()).await;
}
