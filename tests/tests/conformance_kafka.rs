//! The transport conformance suite (kafka): every case of
//! `outbox_tests::conformance`, unchanged.

use outbox_tests::conformance::{self as suite, kafka::KafkaBroker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_has_per_message_outcomes() {
    let mut broker = KafkaBroker::start();
    suite::batch_has_per_message_outcomes(&mut broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn awkward_ids_round_trip() {
    let mut broker = KafkaBroker::start();
    suite::awkward_ids_round_trip(&mut broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_per_aggregate_through_the_consumer() {
    let mut broker = KafkaBroker::start();
    suite::order_per_aggregate_through_the_consumer(&mut broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_after_a_crash_before_ack_applies_once() {
    let mut broker = KafkaBroker::start();
    suite::redelivery_after_a_crash_before_ack_applies_once(&mut broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_down_and_back_keeps_events_pending_then_in_order() {
    let mut broker = KafkaBroker::start();
    suite::broker_down_and_back_keeps_events_pending_then_in_order(&mut broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_event_fails_alone() {
    let mut broker = KafkaBroker::start();
    suite::a_refused_event_fails_alone(&mut broker).await;
}
