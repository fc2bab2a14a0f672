//! Article test 3, with a killed process: the relay publishes, JetStream
//! acknowledges, and the process dies (SIGKILL) before it marks the rows.
//! Its claim transaction dies with its connection, the rows are pending
//! again at once, and the next relay publishes them again. With
//! `Nats-Msg-Id` JetStream drops the republished duplicates; without it the
//! stream (and any consumer) sees every event twice.

use outbox_postgres::prelude::*;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_core::relay::{Relay, RelayConfig};
use outbox_nats::{NatsConfig, NatsTransport};
use outbox_tests::events::emit_ticks;
use outbox_tests::jetstream::{count, read_all};
use outbox_tests::transports::Counting;
use outbox_tests::{NatsServer, TestDb, wait};

async fn crash_after_publish_then_recover(message_id: bool) -> (u64, Vec<String>, u64) {
    let server = NatsServer::start();
    let db = TestDb::new().await;
    let total = emit_ticks(&db.pool, &db.outbox, 4, 5, 100).await as u64;

    let mut child = Command::new(env!("CARGO_BIN_EXE_relay-process"))
        .env("OUTBOX_TEST_SCHEMA", db.schema.as_str())
        .env("OUTBOX_NATS_URL", server.url())
        .env("OUTBOX_MESSAGE_ID", if message_id { "on" } else { "off" })
        .env("OUTBOX_FAILPOINTS", "relay::after_publish=hang")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the relay process");

    // The process published everything and hangs before marking.
    wait::until(
        "the killed relay's publishes at the broker",
        Duration::from_secs(60),
        || async { count(&server.url(), "OUTBOX").await == total },
    )
    .await;
    let pending: i64 = db
        .scalar("SELECT count(*) FROM {s}.outbox_events WHERE status = 'pending'")
        .await;
    assert_eq!(pending as u64, total, "nothing is marked before the crash");
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");

    // Its claim died with it: the rows can be claimed again right away.
    let republished = Arc::new(AtomicU64::new(0));
    let transport = Counting::new(
        NatsTransport::connect(NatsConfig {
            url: server.url(),
            message_id_header: message_id,
            ..NatsConfig::default()
        })
        .await
        .unwrap(),
        Arc::clone(&republished),
    );
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        transport,
        RelayConfig {
            poll_interval: Duration::from_millis(50),
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    wait::until(
        "every event marked published after the restart",
        Duration::from_secs(60),
        || async { db.published().await as u64 == total },
    )
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();

    let ids: Vec<String> = read_all(&server.url(), "OUTBOX")
        .await
        .iter()
        .map(|m| m.header("ce-id").unwrap().to_owned())
        .collect();
    let attempts: i64 = db
        .scalar("SELECT sum(attempt_count) FROM {s}.outbox_events")
        .await;
    assert_eq!(
        attempts as u64, total,
        "the crashed attempt left no trace in the rows"
    );
    db.drop_schema().await;
    (total, ids, republished.load(Ordering::Relaxed))
}

#[tokio::test]
async fn article_test_3_killed_after_publish_jetstream_drops_the_republished_duplicates() {
    let (total, ids, republished) = crash_after_publish_then_recover(true).await;
    assert_eq!(
        republished, total,
        "every event was published a second time"
    );
    assert_eq!(ids.len() as u64, total, "JetStream kept one copy of each");
    let distinct: std::collections::HashSet<&String> = ids.iter().collect();
    assert_eq!(distinct.len() as u64, total);
}

#[tokio::test]
async fn article_test_3_killed_after_publish_without_dedup_the_consumer_side_sees_duplicates() {
    let (total, ids, republished) = crash_after_publish_then_recover(false).await;
    assert_eq!(republished, total);
    assert_eq!(
        ids.len() as u64,
        2 * total,
        "every event is in the stream twice"
    );
    let mut seen: std::collections::HashMap<&String, u32> = std::collections::HashMap::new();
    for id in &ids {
        *seen.entry(id).or_default() += 1;
    }
    assert!(seen.values().all(|&n| n == 2));
}
