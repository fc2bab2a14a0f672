//! A relay over a SQLite file as a separate process, publishing to NATS
//! JetStream, for tests that run several of them on one file and kill or
//! stop them. Settings from the environment: `OUTBOX_SQLITE_URL`,
//! `OUTBOX_NATS_URL`, `OUTBOX_CLAIM_TIMEOUT_MS` (the lease, default 3000),
//! `OUTBOX_BATCH_SIZE` (default 100), `OUTBOX_FAILPOINTS` (e.g.
//! `relay::after_claim=hang`).
//! Sends no `Nats-Msg-Id`, so every republished duplicate reaches the
//! stream and a test sees exactly what the relays sent.

use std::time::Duration;

use outbox_core::relay::RelayConfig;
use outbox_nats::{NatsConfig, NatsTransport};

#[tokio::main]
async fn main() {
    outbox_core::relay::failpoint::arm_from_env();
    let url = std::env::var("OUTBOX_SQLITE_URL").expect("OUTBOX_SQLITE_URL");
    let lease_ms: u64 = std::env::var("OUTBOX_CLAIM_TIMEOUT_MS")
        .ok()
        .map(|ms| ms.parse().expect("OUTBOX_CLAIM_TIMEOUT_MS is milliseconds"))
        .unwrap_or(3000);
    let batch_size: usize = std::env::var("OUTBOX_BATCH_SIZE")
        .ok()
        .map(|n| n.parse().expect("OUTBOX_BATCH_SIZE is a number"))
        .unwrap_or(100);
    let pool = outbox_sqlite::connect(&url).await.expect("the SQLite file");
    let transport = NatsTransport::connect(NatsConfig {
        url: std::env::var("OUTBOX_NATS_URL").expect("OUTBOX_NATS_URL"),
        message_id_header: false,
        ack_timeout: Duration::from_millis(500),
        ..NatsConfig::default()
    })
    .await
    .expect("NATS");
    let config = RelayConfig {
        batch_size,
        workers: 2,
        poll_interval: Duration::from_millis(50),
        publish_timeout: Duration::from_millis(lease_ms / 2),
        claim_timeout: Duration::from_millis(lease_ms),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    };
    let _relay = outbox_sqlite::start_relay(pool, transport, config)
        .await
        .expect("relay");
    println!("relay started");
    std::future::pending::<()>().await;
}
