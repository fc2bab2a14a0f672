//! The consumer engine of `outbox-core` on `SqliteConsumerStore`, where
//! SQLite differs from PostgreSQL: two instances on two pools racing one
//! event, a failed `Strict` start rolled
//! back to the message's savepoint with its retry record, a transaction
//! SQLite ended under a handler, an operator's replay request, batches, and
//! the whole path from emit through the SQLite relay and the in-process bus
//! to consumers on the same file. The cases every store shares are in
//! `tests/src/consumer_conformance.rs`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use common::{Noted, TestDb, wait_for};
use outbox_core::Envelope;
use outbox_core::audit::RepairRequest;
use outbox_core::consumer::{
    Consumer, ConsumerBuilder, ConsumerConfig, HandlerError, Incoming, Ordering, Outcome,
    RetryPolicy,
};
use outbox_core::ops::{LetterKind, Status, StatusOptions};
use outbox_core::relay::{Backoff, RelayConfig};
use outbox_core::transport::InProcessBus;
use outbox_sqlite::{SqliteConsumerStore, SqliteOps, SqliteOutbox};
use sqlx::{Connection, SqliteConnection, SqlitePool};

type SqliteConsumer = Consumer<SqliteConsumerStore>;

/// Creates the handlers' table: one row per applied event.
async fn create_effects(pool: &SqlitePool) {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS effects (
            consumer TEXT NOT NULL, event_id TEXT NOT NULL, board TEXT NOT NULL,
            version INTEGER NOT NULL, seq INTEGER PRIMARY KEY AUTOINCREMENT)",
    )
    .execute(pool)
    .await
    .unwrap();
}

/// Versions of `board` the consumer applied, in commit order.
async fn applied(pool: &SqlitePool, consumer: &str, board: &str) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT version FROM effects WHERE consumer = ?1 AND board = ?2 ORDER BY seq",
    )
    .bind(consumer)
    .bind(board)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A consumer of `Noted` that writes an effect row in its transaction; while
/// `broken` is set it fails (retryable) for a note whose text is "poison",
/// and for "swallow" it ends the transaction under the engine (as SQLite
/// does on some errors) and returns `Ok`.
fn consumer(
    pool: &SqlitePool,
    name: &str,
    config: ConsumerConfig,
    broken: Arc<AtomicBool>,
) -> SqliteConsumer {
    ConsumerBuilder::<SqliteConnection>::for_connection(name)
        .config(config)
        .on_fn::<Noted, _>(move |noted, tx| {
            let broken = broken.clone();
            Box::pin(async move {
                let broken = broken.load(AtomicOrdering::SeqCst);
                if noted.event.text == "poison" && broken {
                    return Err(HandlerError::retryable("the ledger is closed"));
                }
                if noted.event.text == "swallow" && broken {
                    let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *tx).await;
                    return Ok(());
                }
                sqlx::query(
                    "INSERT INTO effects (consumer, event_id, board, version) VALUES (?1, ?2, ?3, ?4)",
                )
                .bind(noted.meta.consumer.to_string())
                .bind(noted.meta.event_id.to_string())
                .bind(&noted.event.board)
                .bind(noted.meta.aggregate_version)
                .execute(&mut *tx)
                .await?;
                Ok(())
            })
        })
        .build_on(SqliteConsumerStore::new(pool.clone()))
        .unwrap()
}

fn note(board: &str, version: i64) -> Envelope {
    Envelope::for_event(&Noted::new(board, format!("v{version}")), version).unwrap()
}

fn config(ordering: Ordering) -> ConsumerConfig {
    ConsumerConfig {
        ordering,
        retry: RetryPolicy {
            max_attempts: 3,
            backoff: Backoff {
                initial: Duration::from_millis(10),
                max: Duration::from_millis(20),
                multiplier: 2.0,
                jitter: 0.0,
            },
            handler_timeout: Duration::from_secs(10),
        },
        ..ConsumerConfig::default()
    }
}

const STRICT: Ordering = Ordering::Strict {
    park_timeout: Duration::from_secs(60),
};

async fn status(pool: &SqlitePool) -> Status {
    SqliteOps::new(pool.clone())
        .status(&StatusOptions::default())
        .await
        .unwrap()
}

async fn setup() -> TestDb {
    let db = TestDb::new().await;
    create_effects(&db.pool).await;
    db
}

async fn scalar(pool: &SqlitePool, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.unwrap()
}

#[tokio::test]
async fn a_redelivery_and_two_instances_racing_one_event_take_effect_once() {
    let db = setup().await;
    let one = consumer(
        &db.pool,
        "inbox",
        config(Ordering::Unordered),
        Arc::default(),
    );
    let two = consumer(
        &db.another_pool().await,
        "inbox",
        config(Ordering::Unordered),
        Arc::default(),
    );
    let event = note("b1", 1);
    let (a, b) = tokio::join!(one.handle_envelope(&event), two.handle_envelope(&event));
    let mut outcomes = vec![a.unwrap(), b.unwrap()];
    outcomes.sort_by_key(|o| o.label());
    assert_eq!(outcomes, vec![Outcome::Applied, Outcome::Duplicate]);
    assert_eq!(
        one.handle(&Incoming::from_envelope(&event, 2))
            .await
            .unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(applied(&db.pool, "inbox", "b1").await, vec![1]);
    assert_eq!(
        scalar(&db.pool, "SELECT count(*) FROM outbox_processed_events").await,
        1
    );
}

#[tokio::test]
async fn a_failed_strict_start_rolls_back_records_its_retry_and_applies_on_redelivery() {
    let db = setup().await;
    let broken = Arc::new(AtomicBool::new(true));
    let consumer = consumer(&db.pool, "retry", config(STRICT), broken.clone());
    assert_eq!(
        consumer.handle_envelope(&note("b1", 1)).await.unwrap(),
        Outcome::Applied
    );
    let poison = Envelope::for_event(&Noted::new("b1", "poison"), 2).unwrap();
    let outcome = consumer.handle_envelope(&poison).await.unwrap();
    assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
    // The start was undone (no inbox row, position still 1), and its retry
    // is on record for the sweep.
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT count(*) FROM outbox_processed_events WHERE consumer_name = 'retry'"
        )
        .await,
        1
    );
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT version FROM outbox_consumer_positions WHERE aggregate_id = 'b1'"
        )
        .await,
        1
    );
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT count(*) FROM outbox_consumer_attempts WHERE aggregate_version = 2 AND retry_at IS NOT NULL"
        )
        .await,
        1
    );
    // Version 3 waits behind it; the redelivery applies both in order.
    assert_eq!(
        consumer.handle_envelope(&note("b1", 3)).await.unwrap(),
        Outcome::Parked { waiting_for: 2 }
    );
    broken.store(false, AtomicOrdering::SeqCst);
    assert_eq!(
        consumer
            .handle(&Incoming::from_envelope(&poison, 2))
            .await
            .unwrap(),
        Outcome::Applied
    );
    assert_eq!(applied(&db.pool, "retry", "b1").await, vec![1, 2, 3]);
    assert_eq!(
        scalar(&db.pool, "SELECT count(*) FROM outbox_consumer_attempts").await,
        0,
        "a settled message leaves no start count"
    );
}

#[tokio::test]
async fn a_handler_ok_after_sqlite_ended_its_transaction_is_a_failed_attempt() {
    let db = setup().await;
    let broken = Arc::new(AtomicBool::new(true));
    let consumer = consumer(&db.pool, "swallow", config(STRICT), broken.clone());
    let event = Envelope::for_event(&Noted::new("b1", "swallow"), 1).unwrap();
    let outcome = consumer.handle_envelope(&event).await.unwrap();
    match &outcome {
        Outcome::Retry { error, .. } => {
            assert!(error.contains("SQLite rolled it back"), "{error}")
        }
        other => panic!("expected a retry, got {other:?}"),
    }
    assert_eq!(
        scalar(&db.pool, "SELECT count(*) FROM outbox_processed_events").await,
        0,
        "no inbox row for an event whose effects were not committed"
    );
    assert_eq!(
        scalar(
            &db.pool,
            "SELECT count(*) FROM outbox_consumer_attempts WHERE aggregate_version = 1"
        )
        .await,
        1,
        "its retry is on record"
    );
    broken.store(false, AtomicOrdering::SeqCst);
    assert_eq!(
        consumer
            .handle(&Incoming::from_envelope(&event, 2))
            .await
            .unwrap(),
        Outcome::Applied
    );
    assert_eq!(applied(&db.pool, "swallow", "b1").await, vec![1]);
}

/// Every connection the consumer used goes back to the pool able to begin
/// again (sqlx refuses a `BEGIN` on a connection it counts as inside a
/// transaction), whether the message committed or SQLite ended its
/// transaction under the handler (the store then opens an empty one for
/// sqlx's rollback to end).
#[tokio::test]
async fn committed_and_failed_checks_leave_every_pooled_connection_able_to_begin() {
    let db = setup().await;
    let broken = Arc::new(AtomicBool::new(true));
    let strict = consumer(&db.pool, "reuse-strict", config(STRICT), broken.clone());
    let stale = consumer(
        &db.pool,
        "reuse-stale",
        config(Ordering::RejectStale),
        broken.clone(),
    );
    for version in 1..=12 {
        let event = note("reuse", version);
        assert_eq!(
            strict.handle_envelope(&event).await.unwrap(),
            Outcome::Applied
        );
        assert_eq!(
            stale.handle_envelope(&event).await.unwrap(),
            Outcome::Applied
        );
        let swallowed =
            Envelope::for_event(&Noted::new("reuse-swallow", "swallow"), version).unwrap();
        assert!(
            matches!(
                stale.handle_envelope(&swallowed).await.unwrap(),
                Outcome::Retry { .. }
            ),
            "a transaction SQLite ended under the handler is a failed attempt"
        );
    }
    assert_eq!(
        applied(&db.pool, "reuse-strict", "reuse").await,
        (1..=12).collect::<Vec<_>>()
    );
    assert_eq!(
        applied(&db.pool, "reuse-stale", "reuse").await,
        (1..=12).collect::<Vec<_>>()
    );
    let mut held = Vec::new();
    for _ in 0..db.pool.size() {
        let mut conn = db.pool.acquire().await.unwrap();
        let tx = conn
            .begin_with("BEGIN")
            .await
            .expect("a pooled connection the consumer used begins again");
        tx.rollback().await.unwrap();
        held.push(conn);
    }
    assert!(
        held.len() > 1,
        "the consumer used {} connections",
        held.len()
    );
}

#[tokio::test]
async fn an_operators_replay_request_is_run_by_the_consumer_and_audited() {
    let db = setup().await;
    let broken = Arc::new(AtomicBool::new(true));
    let consumer = consumer(
        &db.pool,
        "ledger",
        ConsumerConfig {
            sweep_interval: Duration::from_millis(100),
            ..config(STRICT)
        },
        broken.clone(),
    );
    let poison = Envelope::for_event(&Noted::new("b9", "poison"), 1).unwrap();
    for attempt in 1..=3 {
        consumer
            .handle(&Incoming::from_envelope(&poison, attempt))
            .await
            .unwrap();
    }
    let letter_id = scalar(&db.pool, "SELECT id FROM outbox_dead_letters").await;
    broken.store(false, AtomicOrdering::SeqCst);
    let ops = SqliteOps::new(db.pool.clone());
    let request = RepairRequest::new("ops", "ledger reopened").unwrap();
    let asked = ops
        .request_replay("ledger", LetterKind::DeadLettered, &[letter_id], &request)
        .await
        .unwrap();
    assert_eq!(asked.outcomes[0].outcome, "replay_requested");
    let (sender, source) = outbox_core::consumer::channel();
    let task = consumer.spawn(source);
    wait_for(
        "the running consumer takes the request",
        Duration::from_secs(10),
        || async {
            scalar(
                &db.pool,
                "SELECT count(*) FROM outbox_dead_letters WHERE resolved_at IS NOT NULL",
            )
            .await
                == 1
        },
    )
    .await;
    drop(sender);
    task.drain(Duration::from_secs(5)).await.unwrap();
    assert_eq!(applied(&db.pool, "ledger", "b9").await, vec![1]);
    let letter = ops.letter("ledger", letter_id).await.unwrap().unwrap();
    assert_eq!(letter.resolution.as_deref(), Some("replayed: applied"));
    let audit = ops.audit_entry(asked.audit_id).await.unwrap().unwrap();
    let outcomes = serde_json::to_string(&audit.outcomes).unwrap();
    assert!(
        outcomes.contains("replay_requested") && outcomes.contains("applied"),
        "{outcomes}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emitted_events_reach_consumers_on_the_same_file_once_and_in_order_without_a_broker() {
    let db = setup().await;
    let outbox = SqliteOutbox::new();
    let mut conn = db.pool.acquire().await.unwrap();
    for round in 0..10 {
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
        for board in 0..4 {
            outbox
                .emit(
                    &mut tx,
                    &Noted::new(format!("b{board}"), format!("r{round}")),
                )
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
    }
    drop(conn);
    let bus = InProcessBus::new();
    let strict = consumer(&db.pool, "strict", config(STRICT), Arc::default());
    let stale = consumer(
        &db.pool,
        "stale",
        config(Ordering::RejectStale),
        Arc::default(),
    );
    let tasks = [
        strict.spawn(bus.subscribe("strict")),
        strict.spawn(bus.subscribe("strict")),
        stale.spawn(bus.subscribe("stale")),
    ];
    let relay = outbox_sqlite::start_relay(
        db.pool.clone(),
        bus.transport(),
        RelayConfig {
            poll_interval: Duration::from_millis(50),
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    wait_for("every event published", Duration::from_secs(30), || async {
        db.count("published").await == 40
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    for task in tasks {
        task.drain(Duration::from_secs(10)).await.unwrap();
    }
    for name in ["strict", "stale"] {
        for board in 0..4 {
            assert_eq!(
                applied(&db.pool, name, &format!("b{board}")).await,
                (1..=10).collect::<Vec<i64>>(),
                "{name} b{board}"
            );
        }
    }
    assert_eq!(
        scalar(&db.pool, "SELECT count(*) FROM outbox_dead_letters").await,
        0
    );
    // Each consumer's task flushed its counts when it stopped (two
    // instances of `strict`, added up).
    let status = status(&db.pool).await;
    let applied_by = |name: &str| {
        status
            .consumers
            .iter()
            .find(|c| c.consumer == name)
            .map(|c| (c.applied, c.dead_lettered, c.last_applied_at.is_some()))
    };
    assert_eq!(applied_by("strict"), Some((40, 0, true)));
    assert_eq!(applied_by("stale"), Some((40, 0, true)));
    assert!(status.problems.is_empty(), "{:?}", status.problems);
}
