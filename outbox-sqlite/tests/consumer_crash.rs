//! On one SQLite file, through the in-process bus, the relay's worker dies
//! between the consumers' commits and its mark (a failpoint panics it
//! there): its lease runs out, the events are published again, both
//! consumers receive them a second time, and their inboxes drop the
//! duplicates, so each effect happens once and in order. (Failpoints are
//! global to the process: this file holds one test.)

mod common;

use std::time::Duration;

use common::{Noted, TestDb, wait_for};
use outbox_core::consumer::{ConsumerBuilder, ConsumerConfig, Ordering};
use outbox_core::failpoint::{self, AFTER_PUBLISH, Action};
use outbox_core::ops::StatusOptions;
use outbox_core::relay::RelayConfig;
use outbox_core::transport::InProcessBus;
use outbox_sqlite::{SqliteConsumerStore, SqliteOps, SqliteOutbox};
use sqlx::{Connection, SqliteConnection, SqlitePool};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_dying_after_the_consumers_committed_publishes_again_and_the_inboxes_drop_it() {
    let db = TestDb::new().await;
    sqlx::query(
        "CREATE TABLE effects (consumer TEXT NOT NULL, event_id TEXT NOT NULL, board TEXT NOT NULL,
                               version INTEGER NOT NULL, seq INTEGER PRIMARY KEY AUTOINCREMENT)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let bus = InProcessBus::new();
    let mut tasks = Vec::new();
    for (name, ordering) in [
        (
            "strict",
            Ordering::Strict {
                park_timeout: Duration::from_secs(60),
            },
        ),
        ("stale", Ordering::RejectStale),
    ] {
        let consumer = ConsumerBuilder::<SqliteConnection>::for_connection(name)
            .config(ConsumerConfig {
                ordering,
                ..ConsumerConfig::default()
            })
            .on_fn::<Noted, _>(|noted, tx| {
                Box::pin(async move {
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
            .build_on(SqliteConsumerStore::new(db.pool.clone()))
            .unwrap();
        tasks.push(consumer.spawn(bus.subscribe(name)));
    }
    let outbox = SqliteOutbox::new();
    let mut conn = db.pool.acquire().await.unwrap();
    for round in 0..4 {
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
        for board in 0..3 {
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
    failpoint::arm(AFTER_PUBLISH, Action::Panic, 1);
    let relay = outbox_sqlite::start_relay(
        db.pool.clone(),
        bus.transport(),
        RelayConfig {
            poll_interval: Duration::from_millis(50),
            error_backoff: Duration::from_millis(50),
            publish_timeout: Duration::from_millis(500),
            claim_timeout: Duration::from_secs(1),
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    wait_for(
        "every event published after the worker's lease ran out",
        Duration::from_secs(30),
        || async { db.count("published").await == 12 },
    )
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    failpoint::disarm(AFTER_PUBLISH);
    for task in tasks {
        task.drain(Duration::from_secs(10)).await.unwrap();
    }
    let status = SqliteOps::new(db.pool.clone())
        .status(&StatusOptions::default())
        .await
        .unwrap();
    for name in ["strict", "stale"] {
        for board in 0..3 {
            assert_eq!(
                applied(&db.pool, name, &format!("b{board}")).await,
                vec![1, 2, 3, 4],
                "{name} b{board}: each version once, in order"
            );
        }
        let consumer = status
            .consumers
            .iter()
            .find(|c| c.consumer == name)
            .unwrap();
        assert_eq!(consumer.applied, 12, "{name}");
        assert!(
            consumer.duplicates >= 1,
            "{name}: the batch the worker died on came again and its inbox dropped it ({consumer:?})"
        );
    }
}
