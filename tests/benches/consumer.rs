//! Consumer dispatch throughput, measured side by side in one run against
//! a hand-written consumer doing the same work.
//!
//! Every variant takes a delivered message (CloudEvents attributes and a
//! JSON payload, as a JetStream message carries them), reads the envelope,
//! decodes the payload, and in one transaction records the event in the
//! inbox and writes one business row; fsync on, 8 clients:
//!   a  hand-written: BEGIN, inbox INSERT … ON CONFLICT DO NOTHING, the
//!      business INSERT when new, COMMIT;
//!   b  `Consumer::handle` (Unordered: the same two statements);
//!   c  a with 10% duplicates (redeliveries of already processed events);
//!   d  b with 10% duplicates;
//!   e  `Consumer::handle_batch`, 100 messages per transaction;
//!   f  `Consumer::handle` with RejectStale (adds the position upsert).
//! Rounds run the variants back to back (rotating the order); each round
//! gives one ratio per pair; the report shows median, min and max.
//!
//! `cargo bench -p outbox-tests --bench consumer` (about 4 minutes); under
//! `cargo test` one short round runs as a smoke test.

use outbox_postgres::PgConsumer;
use outbox_postgres::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use outbox_core::consumer::{ConsumerBuilder, HandlerError, Incoming, Ordering, Outcome};
use outbox_core::{Envelope, OutboxEvent};
use outbox_tests::TestDb;
use outbox_tests::events::Ticked;
use outbox_tests::stats::{median, summary};
use sqlx::AssertSqlSafe;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Hand,
    Single,
    HandDup,
    SingleDup,
    Batch,
    SingleStale,
}

impl Variant {
    const ALL: [Variant; 6] = [
        Variant::Hand,
        Variant::Single,
        Variant::HandDup,
        Variant::SingleDup,
        Variant::Batch,
        Variant::SingleStale,
    ];

    fn label(self) -> &'static str {
        match self {
            Variant::Hand => "a hand-written",
            Variant::Single => "b consumer",
            Variant::HandDup => "c hand, 10% dup",
            Variant::SingleDup => "d consumer, 10% dup",
            Variant::Batch => "e consumer batch 100",
            Variant::SingleStale => "f consumer RejectStale",
        }
    }

    fn duplicates(self) -> bool {
        matches!(self, Variant::HandDup | Variant::SingleDup)
    }
}

struct Bench {
    db: TestDb,
    unordered: PgConsumer,
    stale: PgConsumer,
    batch: PgConsumer,
    inbox_sql: String,
    effect_sql: String,
}

fn consumer(
    db: &TestDb,
    name: &str,
    ordering: Ordering,
    batch_size: usize,
    table: &str,
) -> PgConsumer {
    let effect_sql = format!("INSERT INTO {table} (event_id, counter, tick) VALUES ($1, $2, $3)");
    ConsumerBuilder::new(name)
        .ordering(ordering)
        .batch_size(batch_size)
        .on_fn::<Ticked, _>(move |received, tx| {
            let sql = effect_sql.clone();
            Box::pin(async move {
                sqlx::query(AssertSqlSafe(sql))
                    .bind(received.meta.event_id)
                    .bind(&received.event.counter)
                    .bind(received.event.tick as i64)
                    .execute(&mut *tx)
                    .await?;
                Ok::<(), HandlerError>(())
            })
        })
        .build(db.pool.clone(), db.schema.clone())
        .expect("consumer builds")
}

static NEXT: AtomicU64 = AtomicU64::new(0);

/// A fresh message as a broker would deliver it.
fn message(client: usize, n: u64) -> Incoming {
    let event = Ticked::new(format!("k{client}-{}", n % 500), n);
    let envelope = Envelope::for_event(&event, n as i64 + 1).expect("serializable");
    Incoming::from_envelope(&envelope, 1)
}

/// The hand-written consumer.
async fn hand(bench: &Bench, incoming: &Incoming) {
    let envelope = incoming.envelope().expect("valid message");
    let event = Ticked::decode(envelope.schema_version, &envelope.payload).expect("decodes");
    let mut tx = bench.db.pool.begin().await.unwrap();
    let new = sqlx::query(AssertSqlSafe(bench.inbox_sql.as_str()))
        .bind("hand")
        .bind(envelope.id)
        .execute(&mut *tx)
        .await
        .unwrap()
        .rows_affected()
        == 1;
    if new {
        sqlx::query(AssertSqlSafe(bench.effect_sql.as_str()))
            .bind(envelope.id)
            .bind(&event.counter)
            .bind(event.tick as i64)
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Runs `variant` with `clients` tasks for `duration`; returns events/s.
async fn measure(bench: &Arc<Bench>, variant: Variant, clients: usize, duration: Duration) -> f64 {
    let deadline = Instant::now() + duration;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for client in 0..clients {
        let bench = Arc::clone(bench);
        tasks.push(tokio::spawn(async move {
            let mut done = 0u64;
            let mut seen: Vec<Incoming> = Vec::new();
            // Versions grow across every measurement, so RejectStale
            // never sees a stale message.
            let mut n = NEXT.fetch_add(1_000_000_000, AtomicOrdering::Relaxed);
            while Instant::now() < deadline {
                if variant == Variant::Batch {
                    let batch: Vec<Incoming> = (0..100).map(|i| message(client, n + i)).collect();
                    n += 100;
                    let outcomes = bench.batch.handle_batch(&batch).await.unwrap();
                    debug_assert!(outcomes.iter().all(|o| *o == Outcome::Applied));
                    done += batch.len() as u64;
                    continue;
                }
                let incoming = if variant.duplicates() && !seen.is_empty() && done % 10 == 9 {
                    seen[(done as usize / 10) % seen.len()].clone()
                } else {
                    n += 1;
                    message(client, n)
                };
                match variant {
                    Variant::Hand | Variant::HandDup => hand(&bench, &incoming).await,
                    Variant::Single | Variant::SingleDup => {
                        bench.unordered.handle(&incoming).await.unwrap();
                    }
                    Variant::SingleStale => {
                        bench.stale.handle(&incoming).await.unwrap();
                    }
                    Variant::Batch => unreachable!(),
                }
                if variant.duplicates() && seen.len() < 1000 {
                    seen.push(incoming);
                }
                done += 1;
            }
            done
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    total as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let (rounds, duration) = if full {
        (7, Duration::from_secs(4))
    } else {
        (1, Duration::from_millis(200))
    };
    let clients = 8;
    let db = TestDb::with_pool_size(10).await;
    db.execute("CREATE TABLE {s}.effects (event_id uuid NOT NULL, counter text NOT NULL, tick bigint NOT NULL)")
        .await;
    let table = db.table("effects");
    let bench = Arc::new(Bench {
        unordered: consumer(&db, "bench-single", Ordering::Unordered, 1, &table),
        stale: consumer(&db, "bench-stale", Ordering::RejectStale, 1, &table),
        batch: consumer(&db, "bench-batch", Ordering::Unordered, 100, &table),
        inbox_sql: format!(
            "INSERT INTO {} (consumer_name, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            db.table("outbox_processed_events")
        ),
        effect_sql: format!("INSERT INTO {table} (event_id, counter, tick) VALUES ($1, $2, $3)"),
        db,
    });
    let fsync: String = bench.db.scalar("SHOW fsync").await;
    println!(
        "consumer dispatch bench: fsync={fsync}, {clients} clients, {rounds} rounds x {duration:?} per variant"
    );
    for variant in Variant::ALL {
        measure(&bench, variant, clients, Duration::from_millis(300)).await;
    }
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); Variant::ALL.len()];
    for round in 0..rounds {
        for offset in 0..Variant::ALL.len() {
            let index = (round + offset) % Variant::ALL.len();
            results[index].push(measure(&bench, Variant::ALL[index], clients, duration).await);
        }
    }
    for (index, variant) in Variant::ALL.iter().enumerate() {
        let mut rates = results[index].clone();
        println!(
            "  {:<24} {:>8.0} events/s",
            variant.label(),
            median(&mut rates)
        );
    }
    let ratio = |x: usize, y: usize| -> Vec<f64> {
        (0..rounds).map(|r| results[x][r] / results[y][r]).collect()
    };
    println!(
        "  {}",
        summary("b/a consumer vs hand-written", &ratio(1, 0))
    );
    println!(
        "  {}",
        summary("d/c consumer vs hand-written, 10% duplicates", &ratio(3, 2))
    );
    println!("  {}", summary("e/b batch 100 vs single", &ratio(4, 1)));
    println!(
        "  {}",
        summary("f/b RejectStale vs Unordered", &ratio(5, 1))
    );
    println!(
        "  {}",
        summary("f/a RejectStale vs hand-written", &ratio(5, 0))
    );
    let schema = bench.db.schema.clone();
    if let Ok(bench) = Arc::try_unwrap(bench) {
        bench.db.drop_schema().await;
    } else {
        eprintln!("schema {} left behind", schema.as_str());
    }
}
