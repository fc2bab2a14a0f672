//! The README's MySQL section as a user writes it, outside the
//! repository's workspace: `connect`, `migrate`, a contract, an emit in
//! the caller's transaction next to the business row, the MySQL relay, a
//! `Strict` consumer on `MySqlConsumerStore` fed by the in-process bus.
//! Runs in a database of its own on the server of `MYSQL_URL` (default
//! `mysql://root@127.0.0.1:3306/test`) and drops it at the end. Exits 0
//! once the consumer applied the event exactly once; fails loudly
//! otherwise, also when the server is not there.

use std::time::Duration;

use outbox_core::OutboxEvent;
use outbox_core::consumer::{ConsumerBuilder, Ordering};
use outbox_core::relay::RelayConfig;
use outbox_core::transport::InProcessBus;
use sqlx::{Connection, MySqlConnection};

/// The README's example event.
#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, OutboxEvent)]
#[outbox(event_type = "shop.order_created", aggregate = "order", version = 1)]
struct OrderCreated {
    #[outbox(aggregate_id)]
    order_id: String,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = std::env::var("MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    // The server's URL with this run's database in place of its own.
    let (address, query) = server.split_once('?').unwrap_or((&server, ""));
    let (base, _) = address
        .rsplit_once('/')
        .filter(|(base, _)| base.contains("://"))
        .ok_or_else(|| format!("MYSQL_URL {server:?} names no database"))?;
    let query = if query.is_empty() {
        String::new()
    } else {
        format!("?{query}")
    };
    let database = format!("outbox_readme_{}", std::process::id());
    let mut admin = MySqlConnection::connect(&server)
        .await
        .map_err(|e| format!("readme-mysql needs the MariaDB of MYSQL_URL ({server}): {e}"))?;
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{database}`")))
        .execute(&mut admin)
        .await?;
    let result = run(&format!("{base}/{database}{query}")).await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE `{database}`")))
        .execute(&mut admin)
        .await?;
    let invoices = result?;
    if invoices != 1 {
        return Err(
            format!("the event was applied {invoices} times, not once, within 10 s").into(),
        );
    }
    println!(
        "readme-mysql: the event was emitted, relayed and applied once, with no PostgreSQL or SQLite driver"
    );
    Ok(())
}

/// The README's steps on the database at `url`; returns how many invoices
/// the consumer wrote.
async fn run(url: &str) -> Result<i64, Box<dyn std::error::Error>> {
    let pool = outbox_mysql::connect(url).await?;
    outbox_mysql::migrate(&pool).await?;
    outbox_mysql::check_schema(&pool).await?;
    sqlx::query("CREATE TABLE orders (id VARCHAR(64) PRIMARY KEY)")
        .execute(&pool)
        .await?;
    sqlx::query("CREATE TABLE invoices (order_id VARCHAR(64) NOT NULL)")
        .execute(&pool)
        .await?;

    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO orders (id) VALUES ('o-1')")
        .execute(&mut *tx)
        .await?;
    outbox_mysql::MySqlOutbox::new()
        .emit(
            &mut tx,
            &OrderCreated {
                order_id: "o-1".into(),
            },
        )
        .await?;
    tx.commit().await?;

    let consumer = ConsumerBuilder::<sqlx::MySqlConnection>::for_connection("billing")
        .ordering(Ordering::Strict {
            park_timeout: Duration::from_secs(60),
        })
        .on_fn::<OrderCreated, _>(|order, tx| {
            Box::pin(async move {
                sqlx::query("INSERT INTO invoices (order_id) VALUES (?)")
                    .bind(&order.event.order_id)
                    .execute(&mut *tx)
                    .await?;
                Ok(())
            })
        })
        .build_on(outbox_mysql::MySqlConsumerStore::new(pool.clone()))?;
    let bus = InProcessBus::new();
    let task = consumer.spawn(bus.subscribe("billing"));
    let relay =
        outbox_mysql::start_relay(pool.clone(), bus.transport(), RelayConfig::default()).await?;

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
    pool.close().await;
    Ok(invoices)
}
