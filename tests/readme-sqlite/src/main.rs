//! The README's SQLite section as a user writes it, outside the
//! repository's workspace: a contract, an emit in the caller's `BEGIN
//! IMMEDIATE` transaction next to the business row, the SQLite relay, a
//! `Strict` consumer on `SqliteConsumerStore` fed by the in-process bus.
//! Exits 0 once the consumer applied the event exactly once; fails loudly
//! otherwise.

use std::time::Duration;

use outbox_core::OutboxEvent;
use outbox_core::consumer::{ConsumerBuilder, Ordering};
use outbox_core::relay::RelayConfig;
use outbox_core::transport::InProcessBus;
use sqlx::SqliteConnection;

/// The README's example event.
#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, OutboxEvent)]
#[outbox(event_type = "shop.order_created", aggregate = "order", version = 1)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("outbox-readme-sqlite-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let url = format!("sqlite://{}", dir.join("app.db").display());
    let pool = outbox_sqlite::connect(&url).await?;
    outbox_sqlite::migrate(&pool).await?;
    sqlx::query("CREATE TABLE orders (id TEXT PRIMARY KEY)")
        .execute(&pool)
        .await?;
    sqlx::query("CREATE TABLE invoices (order_id TEXT NOT NULL)")
        .execute(&pool)
        .await?;

    let outbox = outbox_sqlite::SqliteOutbox::new();
    let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query("INSERT INTO orders (id) VALUES ('o-1')")
        .execute(&mut *tx)
        .await?;
    outbox
        .emit(
            &mut tx,
            &OrderCreated {
                order_id: "o-1".into(),
            },
        )
        .await?;
    tx.commit().await?;

    let consumer = ConsumerBuilder::<SqliteConnection>::for_connection("billing")
        .ordering(Ordering::Strict {
            park_timeout: Duration::from_secs(60),
        })
        .on_fn::<OrderCreated, _>(|order, tx| {
            Box::pin(async move {
                sqlx::query("INSERT INTO invoices (order_id) VALUES (?1)")
                    .bind(&order.event.order_id)
                    .execute(&mut *tx)
                    .await?;
                Ok(())
            })
        })
        .build_on(outbox_sqlite::SqliteConsumerStore::new(pool.clone()))?;
    let bus = InProcessBus::new();
    let task = consumer.spawn(bus.subscribe("billing"));
    let relay =
        outbox_sqlite::start_relay(pool.clone(), bus.transport(), RelayConfig::default()).await?;

    let mut invoices = 0;
    for _ in 0..200 {
        invoices = sqlx::query_scalar("SELECT count(*) FROM invoices")
            .fetch_one(&pool)
            .await?;
        if invoices == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    relay.drain(Duration::from_secs(5)).await?;
    task.drain(Duration::from_secs(5)).await?;
    let _ = std::fs::remove_dir_all(&dir);
    if invoices != 1 {
        return Err(
            format!("the event was applied {invoices} times, not once, within 10 s").into(),
        );
    }
    println!(
        "readme-sqlite: the event was emitted, relayed and applied once, with no PostgreSQL driver"
    );
    Ok(())
}
