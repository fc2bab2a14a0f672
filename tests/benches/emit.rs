//! Emit overhead, measured side by side in one run against hand-written SQL.
//!
//! Variants, each one business transaction (BEGIN, insert an order, ...,
//! COMMIT) on a real PostgreSQL with fsync on:
//!   a  the order row alone;
//!   b  plus the outbox row inserted by hand-written SQL (explicit version);
//!   c  plus the outbox row through `Outbox::emit` (explicit version, the
//!      same row as b);
//!   d  as c, with the version assigned by the per-aggregate counter.
//! Rounds run a, b, c, d back to back (rotating the order) at 1 and 8
//! clients; each round gives one ratio per pair, and the report shows the
//! median ratio with min and max, plus p50 latencies.
//!
//! `cargo bench -p outbox-tests --bench emit` (full run, about 3 minutes);
//! under `cargo test` it runs one short round as a smoke test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_core::OutboxEvent;
use outbox_examples::contracts::{Money, OrderCreated, OrderLine};
use outbox_tests::TestDb;
use outbox_tests::stats::{median, summary};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

/// The same payload as `OrderCreated`, carrying its version as the order
/// row would (so emit and the hand-written SQL insert identical rows).
#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "bench.order_created", aggregate = "order", version = 1)]
struct VersionedOrderCreated {
    #[outbox(aggregate_id)]
    order_id: Uuid,
    #[outbox(aggregate_version)]
    version: i64,
    #[outbox(redact)]
    customer_email: String,
    lines: Vec<OrderLine>,
    total: Money,
}

fn lines() -> Vec<OrderLine> {
    vec![
        OrderLine {
            sku: "SKU-1".into(),
            quantity: 2,
            unit_price: Money {
                amount_minor: 1250,
                currency: "EUR".into(),
            },
        },
        OrderLine {
            sku: "SKU-2".into(),
            quantity: 1,
            unit_price: Money {
                amount_minor: 990,
                currency: "EUR".into(),
            },
        },
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Bare,
    HandSql,
    Emit,
    EmitCounter,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Bare => "a bare",
            Variant::HandSql => "b hand SQL",
            Variant::Emit => "c emit",
            Variant::EmitCounter => "d emit+counter",
        }
    }
}

struct Measured {
    tps: f64,
    p50_ms: f64,
}

async fn one_transaction(db: &TestDb, variant: Variant, hand_sql: &str, order_sql: &str) {
    let id = Uuid::now_v7();
    let mut tx = db.pool.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(order_sql))
        .bind(id)
        .bind("ada@example.org")
        .bind(3490_i64)
        .execute(&mut *tx)
        .await
        .unwrap();
    match variant {
        Variant::Bare => {}
        Variant::HandSql => {
            let event = VersionedOrderCreated {
                order_id: id,
                version: 1,
                customer_email: "ada@example.org".into(),
                lines: lines(),
                total: Money {
                    amount_minor: 3490,
                    currency: "EUR".into(),
                },
            };
            let payload = serde_json::to_string(&event).unwrap();
            sqlx::query(AssertSqlSafe(hand_sql))
                .bind(Uuid::now_v7())
                .bind("order")
                .bind(id.to_string())
                .bind(1_i64)
                .bind("bench.order_created")
                .bind(1_i32)
                .bind(payload)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        Variant::Emit => {
            let event = VersionedOrderCreated {
                order_id: id,
                version: 1,
                customer_email: "ada@example.org".into(),
                lines: lines(),
                total: Money {
                    amount_minor: 3490,
                    currency: "EUR".into(),
                },
            };
            db.outbox.emit(&mut tx, &event).await.unwrap();
        }
        Variant::EmitCounter => {
            let event = OrderCreated {
                order_id: id,
                customer_email: "ada@example.org".into(),
                lines: lines(),
                total: Money {
                    amount_minor: 3490,
                    currency: "EUR".into(),
                },
            };
            db.outbox.emit(&mut tx, &event).await.unwrap();
        }
    }
    tx.commit().await.unwrap();
}

async fn measure(
    db: &Arc<TestDb>,
    variant: Variant,
    clients: usize,
    duration: Duration,
) -> Measured {
    let hand_sql = Arc::new(format!(
        "INSERT INTO {} (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
         VALUES ($1, $2, $3, $4, $5, $6, $7::json)",
        db.table("outbox_events")
    ));
    let order_sql = Arc::new(format!(
        "INSERT INTO {} (id, customer, total_cents) VALUES ($1, $2, $3)",
        db.table("orders")
    ));
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let db = Arc::clone(db);
        let hand_sql = Arc::clone(&hand_sql);
        let order_sql = Arc::clone(&order_sql);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let start = Instant::now();
                one_transaction(&db, variant, &hand_sql, &order_sql).await;
                latencies.push(start.elapsed());
            }
            latencies
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort();
    Measured {
        tps: latencies.len() as f64 / elapsed,
        p50_ms: latencies[latencies.len() / 2].as_secs_f64() * 1000.0,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let (rounds, duration) = if full {
        (9, Duration::from_secs(3))
    } else {
        (1, Duration::from_millis(200))
    };
    let db = Arc::new(TestDb::with_pool_size(10).await);
    let fsync: String = db.scalar("SHOW fsync").await;
    let synchronous_commit: String = db.scalar("SHOW synchronous_commit").await;
    println!(
        "emit bench: fsync={fsync} synchronous_commit={synchronous_commit}, {rounds} rounds x {duration:?} per variant"
    );
    let variants = [
        Variant::Bare,
        Variant::HandSql,
        Variant::Emit,
        Variant::EmitCounter,
    ];
    for clients in [1usize, 8] {
        // Warm up the pool, caches and prepared statements.
        for variant in variants {
            measure(&db, variant, clients, Duration::from_millis(300)).await;
        }
        let mut results: Vec<Vec<Measured>> = (0..variants.len()).map(|_| Vec::new()).collect();
        for round in 0..rounds {
            for offset in 0..variants.len() {
                let index = (round + offset) % variants.len();
                results[index].push(measure(&db, variants[index], clients, duration).await);
            }
        }
        println!("\n{clients} client(s):");
        for (index, variant) in variants.iter().enumerate() {
            let mut tps: Vec<f64> = results[index].iter().map(|m| m.tps).collect();
            let mut p50: Vec<f64> = results[index].iter().map(|m| m.p50_ms).collect();
            println!(
                "  {:<16} {:>8.0} tx/s   p50 {:>6.3} ms",
                variant.label(),
                median(&mut tps),
                median(&mut p50)
            );
        }
        let ratio = |x: usize, y: usize| -> Vec<f64> {
            (0..rounds)
                .map(|r| results[x][r].tps / results[y][r].tps)
                .collect()
        };
        let p50_delta = |x: usize, y: usize| -> Vec<f64> {
            (0..rounds)
                .map(|r| results[x][r].p50_ms - results[y][r].p50_ms)
                .collect()
        };
        println!(
            "  {}",
            summary("throughput b/a (hand SQL vs bare)", &ratio(1, 0))
        );
        println!(
            "  {}",
            summary("throughput c/b (emit vs hand SQL)", &ratio(2, 1))
        );
        println!(
            "  {}",
            summary("throughput d/b (emit+counter vs hand SQL)", &ratio(3, 1))
        );
        println!(
            "  {}",
            summary("p50 c-b ms (emit vs hand SQL)", &p50_delta(2, 1))
        );
        println!(
            "  {}",
            summary("p50 d-b ms (emit+counter vs hand SQL)", &p50_delta(3, 1))
        );
    }
}
