//! Article test 3, in process: a failpoint panics the relay worker between
//! the broker's acks and the marking. The claim transaction rolls back, the
//! supervisor restarts the worker, the events are published again, and
//! JetStream drops the duplicates by `Nats-Msg-Id`. (Failpoints are global
//! to the process: this file holds one test.)

use outbox_postgres::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_core::relay::failpoint::{self, AFTER_PUBLISH, Action};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_nats::{NatsConfig, NatsTransport};
use outbox_tests::events::emit_ticks;
use outbox_tests::jetstream::count;
use outbox_tests::transports::Counting;
use outbox_tests::{NatsServer, TestDb, wait};

#[tokio::test]
async fn a_panic_between_publish_and_mark_republishes_and_jetstream_dedups() {
    let server = NatsServer::start();
    let db = TestDb::new().await;
    let total = emit_ticks(&db.pool, &db.outbox, 5, 2, 100).await as u64;
    failpoint::arm(AFTER_PUBLISH, Action::Panic, 1);
    let attempts = Arc::new(AtomicU64::new(0));
    let transport = Counting::new(
        NatsTransport::connect(NatsConfig {
            url: server.url(),
            ..NatsConfig::default()
        })
        .await
        .unwrap(),
        Arc::clone(&attempts),
    );
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        transport,
        RelayConfig {
            poll_interval: Duration::from_millis(50),
            error_backoff: Duration::from_millis(50),
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    wait::until(
        "all events published after the worker restarted",
        Duration::from_secs(30),
        || async { db.published().await as u64 == total },
    )
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    failpoint::disarm(AFTER_PUBLISH);
    assert_eq!(
        attempts.load(Ordering::Relaxed),
        2 * total,
        "published twice"
    );
    assert_eq!(count(&server.url(), "OUTBOX").await, total, "stored once");
    db.drop_schema().await;
}
