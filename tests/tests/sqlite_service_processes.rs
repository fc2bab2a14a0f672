//! The embedded shape (relay, in-process bus and consumers in one process
//! on one SQLite file) killed with SIGKILL again and again while a
//! producer emits, wherever it is (inside a handler's transaction, between
//! a consumer's commit and the relay's mark, in a claim): after the last
//! restart every event is published and each consumer applied each event
//! exactly once, every aggregate in version order.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use outbox_sqlite::SqliteOutbox;
use outbox_tests::events::Ticked;
use outbox_tests::wait;
use sqlx::{Connection, SqlitePool};

const COUNTERS: usize = 20;
const VERSIONS: usize = 30;

fn start(url: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sqlite-service-process"))
        .env("OUTBOX_DATABASE_URL", url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the service process")
}

fn kill(child: &mut Child) {
    child.kill().expect("SIGKILL the service process");
    child.wait().expect("reap it");
}

async fn emit_round(pool: &SqlitePool, outbox: &SqliteOutbox, round: usize) {
    let mut conn = pool.acquire().await.unwrap();
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
    for counter in 0..COUNTERS {
        outbox
            .emit(
                &mut tx,
                &Ticked {
                    counter: format!("c{counter}"),
                    tick: round as u64,
                    note: "a payload of realistic size for a small domain event".into(),
                },
            )
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

async fn effects(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_service_killed_again_and_again_applies_every_event_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("service.db").display());
    let pool = outbox_sqlite::connect(&url).await.unwrap();
    outbox_sqlite::migrate(&pool).await.unwrap();
    sqlx::query(
        "CREATE TABLE effects (consumer TEXT NOT NULL, event_id TEXT NOT NULL,
                               counter TEXT NOT NULL, version INTEGER NOT NULL,
                               seq INTEGER PRIMARY KEY AUTOINCREMENT)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let outbox = SqliteOutbox::new();
    let total = (COUNTERS * VERSIONS) as i64;
    for round in 0..VERSIONS / 2 {
        emit_round(&pool, &outbox, round).await;
    }
    let mut service = start(&url);
    // Killed five times, each time after more effects were committed,
    // while the producer goes on.
    for kill_number in 1..=5i64 {
        let reached = kill_number * total / 8;
        wait::until(
            "the service applies more events",
            Duration::from_secs(60),
            || async { effects(&pool).await >= reached },
        )
        .await;
        kill(&mut service);
        emit_round(&pool, &outbox, VERSIONS / 2 + kill_number as usize - 1).await;
        service = start(&url);
    }
    for round in VERSIONS / 2 + 5..VERSIONS {
        emit_round(&pool, &outbox, round).await;
    }
    wait::until(
        "every event published and applied by both consumers",
        Duration::from_secs(90),
        || async {
            let published: i64 =
                sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE status = 'published'")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            published == total && effects(&pool).await >= 2 * total
        },
    )
    .await;
    kill(&mut service);
    let rows: Vec<(String, String, String, i64)> =
        sqlx::query_as("SELECT consumer, event_id, counter, version FROM effects ORDER BY seq")
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut once: HashMap<(String, String), usize> = HashMap::new();
    let mut order: HashMap<(String, String), Vec<i64>> = HashMap::new();
    for (consumer, event_id, counter, version) in rows {
        *once.entry((consumer.clone(), event_id)).or_default() += 1;
        order.entry((consumer, counter)).or_default().push(version);
    }
    assert_eq!(once.len() as i64, 2 * total, "every event applied by both");
    assert!(
        once.values().all(|n| *n == 1),
        "an event applied twice: {:?}",
        once.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
    let all: Vec<i64> = (1..=VERSIONS as i64).collect();
    for ((consumer, counter), versions) in &order {
        assert_eq!(versions, &all, "{consumer} {counter}");
    }
    let letters: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_dead_letters")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(letters, 0);
}
