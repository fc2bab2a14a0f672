//! A whole embedded service as a separate process, for tests that kill it:
//! on the SQLite file at `OUTBOX_DATABASE_URL`, the relay hands events to
//! two consumers (`strict`: `Ordering::Strict`, `stale`:
//! `Ordering::RejectStale`) through the in-process bus; each handler
//! writes one row per applied event into `effects` (created by the test)
//! in the consumer's transaction. Runs until killed.

use std::time::Duration;

use outbox_core::consumer::{ConsumerBuilder, Ordering};
use outbox_core::relay::RelayConfig;
use outbox_core::transport::InProcessBus;
use outbox_sqlite::SqliteConsumerStore;
use outbox_tests::events::Ticked;
use sqlx::SqliteConnection;

#[tokio::main]
async fn main() {
    let url = std::env::var("OUTBOX_DATABASE_URL").expect("OUTBOX_DATABASE_URL");
    let pool = outbox_sqlite::connect(&url).await.expect("open the file");
    let bus = InProcessBus::new();
    let mut tasks = Vec::new();
    for (name, ordering) in [
        (
            "strict",
            Ordering::Strict {
                park_timeout: Duration::from_secs(120),
            },
        ),
        ("stale", Ordering::RejectStale),
    ] {
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
    let _relay = outbox_sqlite::start_relay(
        pool,
        bus.transport(),
        RelayConfig {
            batch_size: 20,
            poll_interval: Duration::from_millis(50),
            publish_timeout: Duration::from_millis(500),
            claim_timeout: Duration::from_millis(1000),
            error_backoff: Duration::from_millis(100),
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .expect("the relay");
    std::future::pending::<()>().await;
}
