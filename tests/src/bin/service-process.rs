//! A whole embedded service as a separate process, for tests that kill it:
//! on the database at `OUTBOX_DATABASE_URL` (a SQLite file, `sqlite://…`,
//! or a MySQL/MariaDB database, `mysql://…`), the store's relay hands
//! events to two consumers (`strict`: `Ordering::Strict`, `stale`:
//! `Ordering::RejectStale`) on the same store through the in-process bus;
//! each handler writes one row per applied event into `effects` (created
//! by the test) in the consumer's transaction. Runs until killed.

use std::time::Duration;

use outbox_core::consumer::{ConsumerBuilder, ConsumerTask, Ordering};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::transport::InProcessBus;
use outbox_mysql::MySqlConsumerStore;
use outbox_sqlite::SqliteConsumerStore;
use outbox_tests::events::Ticked;
use sqlx::{MySqlConnection, SqliteConnection};

const CONSUMERS: [(&str, Ordering); 2] = [
    (
        "strict",
        Ordering::Strict {
            park_timeout: Duration::from_secs(120),
        },
    ),
    ("stale", Ordering::RejectStale),
];

/// Short timeouts, so a restarted process takes over quickly from the
/// claims of the one killed.
fn relay_config() -> RelayConfig {
    RelayConfig {
        batch_size: 20,
        poll_interval: Duration::from_millis(50),
        publish_timeout: Duration::from_millis(500),
        claim_timeout: Duration::from_millis(1000),
        error_backoff: Duration::from_millis(100),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    }
}

/// The SQLite service: the consumers' effects use `?N` placeholders.
async fn sqlite(url: &str, bus: &InProcessBus) -> (Vec<ConsumerTask>, Relay) {
    let pool = outbox_sqlite::connect(url).await.expect("open the file");
    let mut tasks = Vec::new();
    for (name, ordering) in CONSUMERS {
        let consumer = ConsumerBuilder::<SqliteConnection>::for_connection(name)
            .ordering(ordering)
            .on_fn::<Ticked, _>(|ticked, tx| {
                Box::pin(async move {
                    sqlx::query(
                        "INSERT INTO effects (consumer, event_id, counter, version) VALUES (?1, ?2, ?3, ?4)",
                    )
                    .bind(ticked.meta.consumer.to_string())
                    .bind(ticked.meta.event_id.to_string())
                    .bind(&ticked.event.counter)
                    .bind(ticked.meta.aggregate_version)
                    .execute(&mut *tx)
                    .await?;
                    Ok(())
                })
            })
            .build_on(SqliteConsumerStore::new(pool.clone()))
            .expect("a consumer");
        tasks.push(consumer.spawn(bus.subscribe(name)));
    }
    let relay = outbox_sqlite::start_relay(pool, bus.transport(), relay_config())
        .await
        .expect("the relay");
    (tasks, relay)
}

/// The MySQL service: the same, on `MySqlConsumerStore` and the MySQL
/// relay.
async fn mysql(url: &str, bus: &InProcessBus) -> (Vec<ConsumerTask>, Relay) {
    let pool = outbox_mysql::connect(url).await.expect("connect to MySQL");
    let mut tasks = Vec::new();
    for (name, ordering) in CONSUMERS {
        let consumer = ConsumerBuilder::<MySqlConnection>::for_connection(name)
            .ordering(ordering)
            .on_fn::<Ticked, _>(|ticked, tx| {
                Box::pin(async move {
                    sqlx::query(
                        "INSERT INTO effects (consumer, event_id, counter, version) VALUES (?, ?, ?, ?)",
                    )
                    .bind(ticked.meta.consumer.to_string())
                    .bind(ticked.meta.event_id.to_string())
                    .bind(&ticked.event.counter)
                    .bind(ticked.meta.aggregate_version)
                    .execute(&mut *tx)
                    .await?;
                    Ok(())
                })
            })
            .build_on(MySqlConsumerStore::new(pool.clone()))
            .expect("a consumer");
        tasks.push(consumer.spawn(bus.subscribe(name)));
    }
    let relay = outbox_mysql::start_relay(pool, bus.transport(), relay_config())
        .await
        .expect("the relay");
    (tasks, relay)
}

#[tokio::main]
async fn main() {
    let url = std::env::var("OUTBOX_DATABASE_URL").expect("OUTBOX_DATABASE_URL");
    let bus = InProcessBus::new();
    let _service = if url.starts_with("sqlite:") {
        sqlite(&url, &bus).await
    } else if url.starts_with("mysql:") || url.starts_with("mariadb:") {
        mysql(&url, &bus).await
    } else {
        panic!("OUTBOX_DATABASE_URL: a sqlite:// or mysql:// URL, not {url:?}");
    };
    std::future::pending::<()>().await;
}
