//! A relay as a separate process, for tests that kill it with SIGKILL at a
//! failure window. Settings from the environment:
//! `OUTBOX_TEST_SCHEMA` (the outbox schema in the test database),
//! `OUTBOX_NATS_URL`, `OUTBOX_MESSAGE_ID` (`off` to send no Nats-Msg-Id),
//! `OUTBOX_FAILPOINTS` (e.g. `relay::after_publish=hang`).

use outbox_postgres::prelude::*;
use std::time::Duration;

use outbox_core::relay::{Relay, RelayConfig};
use outbox_nats::{NatsConfig, NatsTransport};
use outbox_postgres::SchemaName;
use sqlx::postgres::PgPoolOptions;

#[tokio::main]
async fn main() {
    outbox_core::relay::failpoint::arm_from_env();
    let schema = SchemaName::new(std::env::var("OUTBOX_TEST_SCHEMA").expect("OUTBOX_TEST_SCHEMA"))
        .expect("valid schema");
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect_with(outbox_tests::db::test_database_options())
        .await
        .expect("test database");
    let transport = NatsTransport::connect(NatsConfig {
        url: std::env::var("OUTBOX_NATS_URL").expect("OUTBOX_NATS_URL"),
        message_id_header: std::env::var("OUTBOX_MESSAGE_ID").as_deref() != Ok("off"),
        ..NatsConfig::default()
    })
    .await
    .expect("NATS");
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    };
    let _relay = Relay::start_postgres(pool, schema, transport, config)
        .await
        .expect("relay");
    println!("relay started");
    std::future::pending::<()>().await;
}
