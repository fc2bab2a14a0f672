//! A relay over a SQLite file or a MySQL/MariaDB database as a separate
//! process, publishing to NATS JetStream, for tests that run several of
//! them on one store and kill or stop them. Settings from the environment:
//! `OUTBOX_DATABASE_URL` (`sqlite://…` or `mysql://…`), `OUTBOX_NATS_URL`,
//! `OUTBOX_CLAIM_TIMEOUT_MS` (the lease, default 3000),
//! `OUTBOX_BATCH_SIZE` (default 100), `OUTBOX_FAILPOINTS` (e.g.
//! `relay::after_claim=hang`).
//! Sends no `Nats-Msg-Id`, so every republished duplicate reaches the
//! stream and a test sees exactly what the relays sent.

use std::time::Duration;

use outbox_core::relay::RelayConfig;
use outbox_nats::{NatsConfig, NatsTransport};

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name} is a number")))
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    outbox_core::relay::failpoint::arm_from_env();
    let url = std::env::var("OUTBOX_DATABASE_URL").expect("OUTBOX_DATABASE_URL");
    let lease_ms = setting("OUTBOX_CLAIM_TIMEOUT_MS", 3000);
    let transport = NatsTransport::connect(NatsConfig {
        url: std::env::var("OUTBOX_NATS_URL").expect("OUTBOX_NATS_URL"),
        message_id_header: false,
        ack_timeout: Duration::from_millis(500),
        ..NatsConfig::default()
    })
    .await
    .expect("NATS");
    let config = RelayConfig {
        batch_size: setting("OUTBOX_BATCH_SIZE", 100) as usize,
        workers: 2,
        poll_interval: Duration::from_millis(50),
        publish_timeout: Duration::from_millis(lease_ms / 2),
        claim_timeout: Duration::from_millis(lease_ms),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    };
    let _relay = if url.starts_with("sqlite:") {
        let pool = outbox_sqlite::connect(&url).await.expect("the SQLite file");
        outbox_sqlite::start_relay(pool, transport, config).await
    } else if url.starts_with("mysql:") {
        let pool = outbox_mysql::connect(&url)
            .await
            .expect("the MySQL database");
        outbox_mysql::start_relay(pool, transport, config).await
    } else {
        panic!("OUTBOX_DATABASE_URL {url:?}: sqlite:// or mysql://")
    }
    .expect("relay");
    println!("relay started");
    std::future::pending::<()>().await;
}
