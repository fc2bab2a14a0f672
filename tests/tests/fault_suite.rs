//! The fault suite on NATS JetStream, CI length (the same run on Kafka and
//! RabbitMQ: `fault_suite_kafka.rs`, `fault_suite_rabbitmq.rs`; the run
//! itself is `outbox_tests::faults::suite`): relays and consumers as
//! separate processes (`fault-node`) against a private PostgreSQL cluster
//! and a private nats-server (each
//! reached through a TCP proxy the suite owns), with load from a
//! producer process, while faults are injected at random from a printed
//! seed (`outbox_tests::faults`): SIGKILL of a relay and of a consumer
//! (restarted), SIGSTOP of a relay past its claim timeout (then SIGCONT),
//! nats-server killed and restarted, PostgreSQL restarted (`pg_ctl restart
//! -m fast`), every database connection of the relays and consumers cut,
//! every byte to both servers delayed, the network to PostgreSQL or to
//! nats-server blackholed (silence, no reset; `tests/src/proxy.rs`),
//! the outbox table locked past the relays' statement timeout, messages
//! published to the stream a second time under new ids, and messages the
//! outbox never wrote (an undecodable event, a message without headers)
//! published to the stream. The consumers' sources also deliver 5% of
//! messages twice and shuffle every batch (`tests/src/chaos.rs`).
//!
//! At the end the invariants are checked from the databases, not from
//! logs (`outbox_tests::faults::invariants`): every committed event
//! published; each consumer applied each event at most once and settled
//! every event in its inbox; under Strict each aggregate's versions
//! applied gap-free and ascending; under RejectStale each aggregate ends at
//! its last version; the poison (outbox rows from a newer producer or with
//! a payload that does not decode, and the broker's poison) quarantined
//! once each with a reason; under Strict the poison aggregates' later
//! versions dead-lettered behind the quarantined version 1, naming it;
//! nothing else in the quarantine or dead letters; nothing left pending or
//! claimed; the producer's idempotency
//! keys gave one event each.
//!
//! `OUTBOX_FAULT_SEED=<n>` replays a schedule; `OUTBOX_FAULT_SECONDS`
//! (default 90) sets how long faults are injected, and the producer spreads
//! its load over that window; `OUTBOX_FAULT_LOGS=<dir>` keeps each
//! process's stderr.

use outbox_tests::faults::{BrokerKind, suite};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_at_random_lose_nothing_apply_nothing_twice_and_leave_nothing_stuck() {
    suite::run(BrokerKind::Nats, env!("CARGO_BIN_EXE_fault-node").into()).await;
}
