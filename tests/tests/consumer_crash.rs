//! A crash between the consumer's commit and its ack (failpoint
//! `consumer::after_commit`): JetStream redelivers after the ack wait and
//! the inbox turns the redelivery into a counted duplicate with no effect.
//! Its own test binary: failpoints are process-wide.

use std::time::Duration;

use outbox_core::consumer::ConsumerConfig;
use outbox_core::failpoint::{self, Action, CONSUMER_AFTER_COMMIT};
use outbox_core::metrics as m;
use outbox_core::transport::Transport;
use outbox_nats::{JetStreamSource, JetStreamSourceConfig, NatsConfig, NatsTransport};
use outbox_tests::consumers::{create_effects, effects, tick, tick_consumer};
use outbox_tests::{NatsServer, TestDb, metrics, wait};

#[tokio::test]
async fn a_crash_between_commit_and_ack_is_redelivered_and_has_no_effect() {
    metrics::install();
    let server = NatsServer::start();
    let db = TestDb::new().await;
    create_effects(&db).await;
    let nats = NatsConfig {
        url: server.url(),
        ..NatsConfig::default()
    };
    let transport = NatsTransport::connect(nats.clone()).await.unwrap();
    let name = "crash-after-commit";
    let consumer = tick_consumer(&db, name, ConsumerConfig::default(), Duration::ZERO, &[]);
    let mut config = JetStreamSourceConfig::for_consumer(&consumer, nats).unwrap();
    config.ack_wait = Duration::from_secs(2);

    failpoint::arm(CONSUMER_AFTER_COMMIT, Action::Panic, 1);
    let crashed = consumer.spawn(JetStreamSource::connect(config.clone()).await.unwrap());
    let event = tick("c1", 1);
    assert!(transport.publish(&[&event]).await[0].is_ok());
    wait::until(
        "the consumer task died at the failpoint",
        Duration::from_secs(10),
        || async { crashed.is_finished() },
    )
    .await;
    assert!(
        crashed.join().await.unwrap_err().is_panic(),
        "it died at the failpoint"
    );
    assert_eq!(
        effects(&db, name).await.len(),
        1,
        "the effect committed before the crash"
    );

    // A new instance (the restarted process) gets the unacknowledged
    // message again once the ack wait has passed.
    let restarted = consumer.spawn(JetStreamSource::connect(config).await.unwrap());
    wait::until(
        "the redelivery was counted as a duplicate",
        Duration::from_secs(15),
        || async { metrics::counter(m::CONSUMER_DUPLICATES, &[("consumer", name)]) == 1 },
    )
    .await;
    assert_eq!(
        effects(&db, name).await.len(),
        1,
        "the redelivery had no effect"
    );
    failpoint::disarm(CONSUMER_AFTER_COMMIT);
    restarted.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}
