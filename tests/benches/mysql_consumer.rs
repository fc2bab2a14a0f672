//! The consumer on `MySqlConsumerStore` against the hand-written MySQL
//! consumer a competent engineer would write, side by side in one run
//! (interleaved rounds, a fresh database per variant, the same server):
//! per message `BEGIN`, an inbox `INSERT IGNORE`, one business row,
//! `COMMIT` (and the batched variant: one transaction per 100 messages).
//! Ours runs `RejectStale` and `Strict`, one message per transaction and
//! batches of 100. Messages arrive in version order per aggregate (200
//! aggregates), handed over in memory, so the figures are the store's and
//! the engine's, not a broker's.
//!
//! `cargo bench -p outbox-tests --bench mysql_consumer`; settings from the
//! environment: `OUTBOX_BENCH_ROUNDS` (3), `OUTBOX_BENCH_MESSAGES` (5000).
//! Prints messages/s per variant and the median of the per-round ratios.
//! Under `cargo test` (no `--bench` argument) it runs one smoke round of
//! 300 messages. Needs the MariaDB/MySQL server of `MYSQL_URL`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use outbox_core::Envelope;
use outbox_core::consumer::{ConsumerBuilder, Incoming, Ordering, Outcome};
use outbox_mysql::MySqlConsumerStore;
use outbox_tests::events::Ticked;
use outbox_tests::mysql::MySqlTestDb;
use outbox_tests::stats::median;
use sqlx::{MySqlConnection, MySqlPool};

const AGGREGATES: usize = 200;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn rate(messages: usize, elapsed: Duration) -> f64 {
    messages as f64 / elapsed.as_secs_f64()
}

/// Versions 1.. of 200 aggregates, each aggregate's in order.
fn messages(total: usize) -> Vec<Envelope> {
    (0..total)
        .map(|n| {
            let version = (n / AGGREGATES) as i64 + 1;
            let event = Ticked::new(format!("c{}", n % AGGREGATES), version as u64);
            Envelope::for_event(&event, version).unwrap()
        })
        .collect()
}

async fn business_table(pool: &MySqlPool) {
    sqlx::query(
        "CREATE TABLE ticks (event_id CHAR(36) NOT NULL PRIMARY KEY,
                             counter VARCHAR(50) NOT NULL, tick BIGINT NOT NULL)",
    )
    .execute(pool)
    .await
    .unwrap();
}

async fn applied(pool: &MySqlPool) -> usize {
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM ticks")
        .fetch_one(pool)
        .await
        .unwrap();
    n as usize
}

/// Our consumer, `batch` messages per transaction.
async fn consume_ours(
    pool: &MySqlPool,
    ordering: Ordering,
    batch: usize,
    messages: &[Envelope],
) -> Duration {
    business_table(pool).await;
    let consumer = ConsumerBuilder::<MySqlConnection>::for_connection("bench")
        .ordering(ordering)
        .batch_size(batch)
        .on_fn::<Ticked, _>(|ticked, tx| {
            Box::pin(async move {
                sqlx::query("INSERT INTO ticks (event_id, counter, tick) VALUES (?, ?, ?)")
                    .bind(ticked.meta.event_id.to_string())
                    .bind(&ticked.event.counter)
                    .bind(ticked.event.tick as i64)
                    .execute(&mut *tx)
                    .await?;
                Ok(())
            })
        })
        .build_on(MySqlConsumerStore::new(pool.clone()))
        .unwrap();
    let start = Instant::now();
    for chunk in messages.chunks(batch) {
        let incoming: Vec<Incoming> = chunk
            .iter()
            .map(|m| Incoming::from_envelope(m, 1))
            .collect();
        let outcomes = consumer.handle_batch(&incoming).await.unwrap();
        assert!(
            outcomes.iter().all(|o| *o == Outcome::Applied),
            "{outcomes:?}"
        );
    }
    let elapsed = start.elapsed();
    assert_eq!(applied(pool).await, messages.len());
    elapsed
}

/// The hand-written consumer: inbox row and business row per message,
/// `batch` messages per transaction, each transaction's connection from
/// the pool.
async fn consume_by_hand(pool: &MySqlPool, batch: usize, messages: &[Envelope]) -> Duration {
    business_table(pool).await;
    sqlx::query(
        "CREATE TABLE inbox (consumer VARCHAR(50) NOT NULL, event_id CHAR(36) NOT NULL,
                             PRIMARY KEY (consumer, event_id))",
    )
    .execute(pool)
    .await
    .unwrap();
    let start = Instant::now();
    for chunk in messages.chunks(batch) {
        let mut tx = pool.begin().await.unwrap();
        for message in chunk {
            let id = message.id.to_string();
            let fresh =
                sqlx::query("INSERT IGNORE INTO inbox (consumer, event_id) VALUES ('bench', ?)")
                    .bind(&id)
                    .execute(&mut *tx)
                    .await
                    .unwrap()
                    .rows_affected();
            if fresh == 0 {
                continue;
            }
            let ticked: Ticked = serde_json::from_str(message.payload.get()).unwrap();
            sqlx::query("INSERT INTO ticks (event_id, counter, tick) VALUES (?, ?, ?)")
                .bind(&id)
                .bind(&ticked.counter)
                .bind(ticked.tick as i64)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }
    let elapsed = start.elapsed();
    assert_eq!(applied(pool).await, messages.len());
    elapsed
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let rounds = if full {
        setting("OUTBOX_BENCH_ROUNDS", 3)
    } else {
        1
    };
    let total = if full {
        setting("OUTBOX_BENCH_MESSAGES", 5_000)
    } else {
        300
    };
    let messages = messages(total);
    let strict = Ordering::Strict {
        park_timeout: Duration::from_secs(600),
    };
    let cases = [
        ("RejectStale", Ordering::RejectStale, 1),
        ("Strict", strict, 1),
        ("RejectStale", Ordering::RejectStale, 100),
        ("Strict", strict, 100),
    ];
    let mut ratios: BTreeMap<(usize, &str), Vec<f64>> = BTreeMap::new();
    for round in 1..=rounds {
        for (name, ordering, batch) in cases {
            let db = MySqlTestDb::new().await;
            let hand = rate(total, consume_by_hand(&db.pool, batch, &messages).await);
            db.drop_database().await;
            let db = MySqlTestDb::new().await;
            let ours = rate(
                total,
                consume_ours(&db.pool, ordering, batch, &messages).await,
            );
            db.drop_database().await;
            println!(
                "round {round} consumer {name} at batch {batch} ({total} messages): hand-written {hand:.0}/s, consumer {ours:.0}/s, ratio {:.3}",
                ours / hand
            );
            ratios.entry((batch, name)).or_default().push(ours / hand);
        }
    }
    for ((batch, name), mut values) in ratios {
        println!(
            "median consumer ratio, {name} at batch {batch}: {:.3}",
            median(&mut values)
        );
    }
}
