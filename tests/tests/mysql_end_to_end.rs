//! The production shape on MariaDB, end to end over a real broker: events
//! emitted in the service's MySQL transactions, published by the MySQL
//! relay to JetStream, applied by a strict consumer on
//! `MySqlConsumerStore` in the same database. The consumer dies between
//! its commit and its ack (failpoint `consumer::after_commit`); a new
//! instance gets the unacknowledged message again after the ack wait, its
//! inbox turns it into a counted duplicate, and the rest of the aggregate
//! is applied once each, in order. Its own test binary: failpoints are
//! process-wide.

use std::time::Duration;

use outbox_core::consumer::{ConsumerBuilder, ConsumerConfig, Ordering};
use outbox_core::failpoint::{self, Action, CONSUMER_AFTER_COMMIT};
use outbox_core::metrics as m;
use outbox_core::relay::RelayConfig;
use outbox_mysql::{MySqlConsumerStore, MySqlOutbox};
use outbox_nats::{JetStreamSource, JetStreamSourceConfig, NatsConfig, NatsTransport};
use outbox_tests::events::Ticked;
use outbox_tests::mysql::MySqlTestDb;
use outbox_tests::{NatsServer, metrics, wait};
use sqlx::MySqlConnection;

const NAME: &str = "ledger-mysql";

async fn applied(db: &MySqlTestDb) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM effects WHERE counter = 'm1' ORDER BY seq")
        .fetch_all(&db.pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_consumer_dying_between_commit_and_ack_applies_each_version_once_in_order() {
    metrics::install();
    let server = NatsServer::start();
    let db = MySqlTestDb::new().await;
    sqlx::query(
        "CREATE TABLE effects (seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                               counter VARCHAR(100) NOT NULL, version BIGINT NOT NULL)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let nats = NatsConfig {
        url: server.url(),
        ack_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..NatsConfig::default()
    };
    // Creates the stream, as a relay does at start-up.
    let transport = NatsTransport::connect(nats.clone()).await.unwrap();
    let consumer = ConsumerBuilder::<MySqlConnection>::for_connection(NAME)
        .config(ConsumerConfig {
            ordering: Ordering::Strict {
                park_timeout: Duration::from_secs(60),
            },
            sweep_interval: Duration::from_millis(100),
            ..ConsumerConfig::default()
        })
        .on_fn::<Ticked, _>(|tick, tx| {
            Box::pin(async move {
                sqlx::query("INSERT INTO effects (counter, version) VALUES (?, ?)")
                    .bind(&tick.event.counter)
                    .bind(tick.meta.aggregate_version)
                    .execute(&mut *tx)
                    .await?;
                Ok(())
            })
        })
        .build_on(MySqlConsumerStore::new(db.pool.clone()))
        .unwrap();
    let mut source = JetStreamSourceConfig::for_consumer(&consumer, nats).unwrap();
    source.ack_wait = Duration::from_secs(2);

    failpoint::arm(CONSUMER_AFTER_COMMIT, Action::Panic, 1);
    let crashed = consumer.spawn(JetStreamSource::connect(source.clone()).await.unwrap());
    let relay = outbox_mysql::start_relay(
        db.pool.clone(),
        transport,
        RelayConfig {
            poll_interval: Duration::from_millis(50),
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    let outbox = MySqlOutbox::new();
    let mut tx = db.pool.begin().await.unwrap();
    outbox.emit(&mut tx, &Ticked::new("m1", 1)).await.unwrap();
    tx.commit().await.unwrap();

    wait::until(
        "the consumer task died at the failpoint",
        Duration::from_secs(15),
        || async { crashed.is_finished() },
    )
    .await;
    assert!(
        crashed.join().await.unwrap_err().is_panic(),
        "it died at the failpoint"
    );
    assert_eq!(
        applied(&db).await,
        [1],
        "version 1 committed before the crash"
    );

    // The next versions, each in a transaction of its own, while no
    // instance runs; then the restarted process.
    for version in 2..=5 {
        let mut tx = db.pool.begin().await.unwrap();
        outbox
            .emit(&mut tx, &Ticked::new("m1", version))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let restarted = consumer.spawn(JetStreamSource::connect(source).await.unwrap());
    wait::until(
        "every version applied and the redelivery counted as a duplicate",
        Duration::from_secs(30),
        || async {
            applied(&db).await.len() == 5
                && metrics::counter(m::CONSUMER_DUPLICATES, &[("consumer", NAME)]) == 1
        },
    )
    .await;
    assert_eq!(
        applied(&db).await,
        [1, 2, 3, 4, 5],
        "each version once, in order; the redelivered version 1 had no effect"
    );
    failpoint::disarm(CONSUMER_AFTER_COMMIT);
    restarted.drain(Duration::from_secs(5)).await.unwrap();
    relay.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_database().await;
}
