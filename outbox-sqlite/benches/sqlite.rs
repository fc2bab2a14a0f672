//! SQLite store against hand-written SQL, side by side in one run
//! (interleaved rounds, fresh files, the same connect settings):
//!
//! - emit: `SqliteOutbox::emit` against a hand-written `INSERT` of the
//!   same rows (versions counted in memory) in the same transactions;
//! - relay drain of a backlog with a transport that acknowledges at once:
//!   `start_relay` (one worker) against a hand-written claim loop that
//!   marks a batch published with one `UPDATE … RETURNING` in `BEGIN
//!   IMMEDIATE` and commits after the (no-op) publish: the cheapest relay
//!   that still publishes at least once, without per-aggregate order
//!   across relays and holding the write lock while it publishes.
//! - consumer: a consumer on `SqliteConsumerStore` (`RejectStale` and
//!   `Strict`, one message per transaction and batches of 100), each
//!   message writing one business row, against the hand-written consumer
//!   a competent engineer would write: per message `BEGIN IMMEDIATE`, an
//!   inbox `INSERT … ON CONFLICT DO NOTHING`, the row, `COMMIT` (and the
//!   batched variant: one transaction per 100 messages). Messages arrive in
//!   version order per aggregate (200 aggregates), handed over in memory.
//!   The hand-written loop runs twice: on one connection held for the whole
//!   run (the cheapest loop there is), and taking each transaction's
//!   connection from the pool (`pool.begin_with`, as a consumer inside a
//!   service does, and as ours does: sqlx pings a connection the pool gets
//!   back, one more call into SQLite's worker thread per transaction).
//!
//! `cargo bench -p outbox-sqlite --bench sqlite`; settings from the
//! environment: `OUTBOX_BENCH_ROUNDS` (3), `OUTBOX_BENCH_EMITS` (20000),
//! `OUTBOX_BENCH_BACKLOG` (100000), `OUTBOX_BENCH_MESSAGES` (10000). Prints
//! events/s per variant and the median of the per-round ratios. Under
//! `cargo test` (no `--bench` argument) it runs one smoke round of 500
//! emits, a 2,000-event backlog and 300 consumed messages.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use outbox_core::consumer::{ConsumerBuilder, Incoming, Ordering as ConsumerOrdering, Outcome};
use outbox_core::relay::RelayConfig;
use outbox_core::transport::{PublishFailure, Transport};
use outbox_core::{Envelope, EventDraft, OutboxEvent};
use outbox_sqlite::{SqliteConsumerStore, SqliteOutbox};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::{Connection, Row, SqliteConnection, SqlitePool};

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "bench.ticked", aggregate = "counter", version = 1)]
struct Ticked {
    #[outbox(aggregate_id)]
    counter: String,
    tick: u64,
    note: String,
}

fn tick(counter: usize, tick: u64) -> Ticked {
    Ticked {
        counter: format!("c{counter}"),
        tick,
        note: "a payload of about one hundred bytes, like a small domain event".into(),
    }
}

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn fresh(dir: &tempfile::TempDir, name: &str) -> SqlitePool {
    let path = dir.path().join(format!("{name}.db"));
    let _ = std::fs::remove_file(&path);
    let pool = outbox_sqlite::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    outbox_sqlite::migrate(&pool).await.unwrap();
    pool
}

const AGGREGATES: usize = 200;
const PER_TRANSACTION: usize = 10;

/// Emits `total` events through `SqliteOutbox::emit`, ten per transaction.
async fn emit_ours(pool: &SqlitePool, total: usize) -> Duration {
    let outbox = SqliteOutbox::new();
    let start = Instant::now();
    let mut n = 0;
    while n < total {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        for _ in 0..PER_TRANSACTION {
            outbox
                .emit(&mut tx, &tick(n % AGGREGATES, (n / AGGREGATES) as u64))
                .await
                .unwrap();
            n += 1;
        }
        tx.commit().await.unwrap();
    }
    start.elapsed()
}

/// The same rows with a hand-written INSERT (versions counted in memory).
async fn emit_by_hand(pool: &SqlitePool, total: usize) -> Duration {
    let mut versions: HashMap<String, i64> = HashMap::new();
    let start = Instant::now();
    let mut n = 0;
    while n < total {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        for _ in 0..PER_TRANSACTION {
            let event = tick(n % AGGREGATES, (n / AGGREGATES) as u64);
            let draft = EventDraft::new(&event).unwrap();
            let version = versions.entry(event.aggregate_id()).or_default();
            *version += 1;
            sqlx::query(
                "INSERT INTO outbox_events
                    (id, aggregate_type, aggregate_id, aggregate_version, event_type,
                     schema_version, payload, traceparent, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )
            .bind(draft.event_id().to_string())
            .bind(draft.aggregate_type())
            .bind(draft.aggregate_id())
            .bind(*version)
            .bind(draft.event_type())
            .bind(i64::from(draft.schema_version()))
            .bind(draft.payload_json())
            .bind(draft.traceparent())
            .bind(chrono::Utc::now().timestamp_millis())
            .execute(&mut *tx)
            .await
            .unwrap();
            n += 1;
        }
        tx.commit().await.unwrap();
    }
    start.elapsed()
}

/// Fills a backlog quickly (one transaction per 1,000 events).
async fn backlog(pool: &SqlitePool, total: usize) {
    let outbox = SqliteOutbox::new();
    let mut n = 0;
    while n < total {
        let drafts: Vec<EventDraft> = (n..(n + 1000).min(total))
            .map(|i| EventDraft::new(&tick(i % 400, (i / 400) as u64)).unwrap())
            .collect();
        n += drafts.len();
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        outbox.emit_drafts(&mut tx, drafts).await.unwrap();
        tx.commit().await.unwrap();
    }
}

/// Acknowledges everything at once and counts.
#[derive(Clone, Default)]
struct Noop(Arc<AtomicUsize>);

impl Transport for Noop {
    async fn publish(&self, events: &[&Envelope]) -> Vec<Result<(), PublishFailure>> {
        self.0.fetch_add(events.len(), Ordering::Relaxed);
        events.iter().map(|_| Ok(())).collect()
    }

    fn name(&self) -> &'static str {
        "noop"
    }
}

async fn drain_ours(pool: SqlitePool, total: usize, batch: usize) -> Duration {
    let transport = Noop::default();
    let count = Arc::clone(&transport.0);
    let start = Instant::now();
    let relay = outbox_sqlite::start_relay(
        pool,
        transport,
        RelayConfig {
            batch_size: batch,
            workers: 1,
            poll_interval: Duration::from_millis(5),
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    while count.load(Ordering::Relaxed) < total {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = start.elapsed();
    relay.drain(Duration::from_secs(5)).await.unwrap();
    elapsed
}

async fn drain_by_hand(pool: SqlitePool, total: usize, batch: usize) -> Duration {
    let transport = Noop::default();
    let start = Instant::now();
    let mut published = 0;
    while published < total {
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let rows = sqlx::query(
            "UPDATE outbox_events SET status = 'published', published_at = ?1
             WHERE id IN (SELECT id FROM outbox_events WHERE status = 'pending'
                          ORDER BY seq LIMIT ?2)
             RETURNING id, event_type, schema_version, aggregate_type, aggregate_id,
                       aggregate_version, created_at, traceparent, payload",
        )
        .bind(chrono::Utc::now().timestamp_millis())
        .bind(batch as i64)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        let envelopes: Vec<Envelope> = rows
            .iter()
            .map(|row| Envelope {
                id: row.get::<String, _>("id").parse().unwrap(),
                event_type: row.get("event_type"),
                schema_version: row.get::<i64, _>("schema_version") as u32,
                aggregate_type: row.get("aggregate_type"),
                aggregate_id: row.get("aggregate_id"),
                aggregate_version: row.get("aggregate_version"),
                occurred_at: chrono::DateTime::from_timestamp_millis(row.get("created_at"))
                    .unwrap(),
                traceparent: row.get("traceparent"),
                payload: serde_json::value::RawValue::from_string(row.get("payload")).unwrap(),
            })
            .collect();
        let refs: Vec<&Envelope> = envelopes.iter().collect();
        let acks = transport.publish(&refs).await;
        assert!(acks.iter().all(Result::is_ok));
        tx.commit().await.unwrap();
        published += envelopes.len();
    }
    start.elapsed()
}

/// Messages for the consumers: versions 1.. of 200 aggregates, each
/// aggregate's in order.
fn messages(total: usize) -> Vec<Envelope> {
    (0..total)
        .map(|n| {
            let event = tick(n % AGGREGATES, (n / AGGREGATES) as u64);
            Envelope::for_event(&event, (n / AGGREGATES) as i64 + 1).unwrap()
        })
        .collect()
}

async fn business_table(pool: &SqlitePool) {
    sqlx::query(
        "CREATE TABLE ticks (event_id TEXT PRIMARY KEY, counter TEXT NOT NULL, tick INTEGER NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// Our consumer, `batch` messages per transaction.
async fn consume_ours(
    pool: &SqlitePool,
    ordering: ConsumerOrdering,
    batch: usize,
    messages: &[Envelope],
) -> Duration {
    business_table(pool).await;
    let consumer = ConsumerBuilder::<SqliteConnection>::for_connection("bench")
        .ordering(ordering)
        .batch_size(batch)
        .on_fn::<Ticked, _>(|ticked, tx| {
            Box::pin(async move {
                sqlx::query("INSERT INTO ticks (event_id, counter, tick) VALUES (?1, ?2, ?3)")
                    .bind(ticked.meta.event_id.to_string())
                    .bind(&ticked.event.counter)
                    .bind(ticked.event.tick as i64)
                    .execute(&mut *tx)
                    .await?;
                Ok(())
            })
        })
        .build_on(SqliteConsumerStore::new(pool.clone()))
        .unwrap();
    let start = Instant::now();
    if batch == 1 {
        for message in messages {
            let outcome = consumer.handle_envelope(message).await.unwrap();
            assert_eq!(outcome, Outcome::Applied);
        }
    } else {
        for chunk in messages.chunks(batch) {
            let incoming: Vec<Incoming> = chunk
                .iter()
                .map(|m| Incoming::from_envelope(m, 1))
                .collect();
            let outcomes = consumer.handle_batch(&incoming).await.unwrap();
            assert!(outcomes.iter().all(|o| *o == Outcome::Applied));
        }
    }
    let elapsed = start.elapsed();
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM ticks")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(applied as usize, messages.len());
    elapsed
}

/// Where the hand-written consumer gets its transactions' connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HandConnection {
    /// One connection, held for the whole run.
    Held,
    /// From the pool, for each transaction.
    Pooled,
}

/// The hand-written consumer: inbox row and business row per message,
/// `batch` messages per transaction.
async fn consume_by_hand(
    pool: &SqlitePool,
    batch: usize,
    messages: &[Envelope],
    connection: HandConnection,
) -> Duration {
    business_table(pool).await;
    sqlx::query(
        "CREATE TABLE inbox (consumer TEXT NOT NULL, event_id TEXT NOT NULL,
                             PRIMARY KEY (consumer, event_id)) WITHOUT ROWID",
    )
    .execute(pool)
    .await
    .unwrap();
    let mut held = pool.acquire().await.unwrap();
    let start = Instant::now();
    for chunk in messages.chunks(batch) {
        let mut tx = match connection {
            HandConnection::Held => held.begin_with("BEGIN IMMEDIATE").await.unwrap(),
            HandConnection::Pooled => pool.begin_with("BEGIN IMMEDIATE").await.unwrap(),
        };
        for message in chunk {
            let id = message.id.to_string();
            let fresh = sqlx::query(
                "INSERT INTO inbox (consumer, event_id) VALUES ('bench', ?1) ON CONFLICT DO NOTHING",
            )
            .bind(&id)
            .execute(&mut *tx)
            .await
            .unwrap()
            .rows_affected();
            if fresh == 0 {
                continue;
            }
            let ticked: Ticked = serde_json::from_str(message.payload.get()).unwrap();
            sqlx::query("INSERT INTO ticks (event_id, counter, tick) VALUES (?1, ?2, ?3)")
                .bind(&id)
                .bind(&ticked.counter)
                .bind(ticked.tick as i64)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }
    start.elapsed()
}

fn rate(events: usize, elapsed: Duration) -> f64 {
    events as f64 / elapsed.as_secs_f64()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.partial_cmp(b).unwrap());
    values[values.len() / 2]
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs the
    // same code once at smoke size (in debug), so the drains are still
    // checked to complete without costing CI minutes.
    let full = std::env::args().any(|arg| arg == "--bench");
    let rounds = if full {
        setting("OUTBOX_BENCH_ROUNDS", 3)
    } else {
        1
    };
    let emits = if full {
        setting("OUTBOX_BENCH_EMITS", 20_000)
    } else {
        500
    };
    let total = if full {
        setting("OUTBOX_BENCH_BACKLOG", 100_000)
    } else {
        2_000
    };
    let consumed = if full {
        setting("OUTBOX_BENCH_MESSAGES", 10_000)
    } else {
        300
    };
    let messages = messages(consumed);
    let strict = ConsumerOrdering::Strict {
        park_timeout: Duration::from_secs(60),
    };
    let consumer_cases = [
        ("RejectStale", ConsumerOrdering::RejectStale, 1),
        ("Strict", strict, 1),
        ("RejectStale", ConsumerOrdering::RejectStale, 100),
        ("Strict", strict, 100),
    ];
    let mut consumer_ratios: HashMap<(&str, usize), Vec<f64>> = HashMap::new();
    let mut pooled_ratios: HashMap<(&str, usize), Vec<f64>> = HashMap::new();
    let dir = tempfile::tempdir().unwrap();
    let mut emit_ratios = Vec::new();
    let mut drain_ratios: HashMap<usize, Vec<f64>> = HashMap::new();
    for round in 1..=rounds {
        // The hand-written outbox has no version counter to keep.
        let pool = fresh(&dir, "emit-hand").await;
        sqlx::query("DROP TRIGGER outbox_events_count_version")
            .execute(&pool)
            .await
            .unwrap();
        let hand = emit_by_hand(&pool, emits).await;
        let ours = emit_ours(&fresh(&dir, "emit-ours").await, emits).await;
        let (hand, ours) = (rate(emits, hand), rate(emits, ours));
        println!(
            "round {round} emit ({PER_TRANSACTION} per transaction): hand-written {hand:.0}/s, emit {ours:.0}/s, ratio {:.3}",
            ours / hand
        );
        emit_ratios.push(ours / hand);
        for batch in [100, 1000] {
            let pool = fresh(&dir, "drain-hand").await;
            backlog(&pool, total).await;
            let hand = rate(total, drain_by_hand(pool, total, batch).await);
            let pool = fresh(&dir, "drain-ours").await;
            backlog(&pool, total).await;
            let ours = rate(total, drain_ours(pool, total, batch).await);
            println!(
                "round {round} drain {total} at batch {batch}: hand-written {hand:.0}/s, relay {ours:.0}/s, ratio {:.3}",
                ours / hand
            );
            drain_ratios.entry(batch).or_default().push(ours / hand);
        }
        for (name, ordering, batch) in consumer_cases {
            let pooled = rate(
                consumed,
                consume_by_hand(
                    &fresh(&dir, "consume-hand-pooled").await,
                    batch,
                    &messages,
                    HandConnection::Pooled,
                )
                .await,
            );
            let hand = rate(
                consumed,
                consume_by_hand(
                    &fresh(&dir, "consume-hand").await,
                    batch,
                    &messages,
                    HandConnection::Held,
                )
                .await,
            );
            let ours = rate(
                consumed,
                consume_ours(
                    &fresh(&dir, "consume-ours").await,
                    ordering,
                    batch,
                    &messages,
                )
                .await,
            );
            println!(
                "round {round} consumer {name} at batch {batch} ({consumed} messages): hand-written {hand:.0}/s (pooled {pooled:.0}/s), consumer {ours:.0}/s, ratio {:.3} (to pooled {:.3})",
                ours / hand,
                ours / pooled
            );
            consumer_ratios
                .entry((name, batch))
                .or_default()
                .push(ours / hand);
            pooled_ratios
                .entry((name, batch))
                .or_default()
                .push(ours / pooled);
        }
    }
    println!("median emit ratio: {:.3}", median(emit_ratios));
    for batch in [100, 1000] {
        println!(
            "median drain ratio at batch {batch}: {:.3}",
            median(drain_ratios.remove(&batch).unwrap())
        );
    }
    for (name, _, batch) in consumer_cases {
        println!(
            "median consumer ratio, {name} at batch {batch}: {:.3} (to the pooled loop {:.3})",
            median(consumer_ratios.remove(&(name, batch)).unwrap()),
            median(pooled_ratios.remove(&(name, batch)).unwrap())
        );
    }
}
