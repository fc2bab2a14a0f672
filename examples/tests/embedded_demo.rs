//! The main job's default path (`scripts/demo.sh` with no settings): the
//! embedded order service runs with an empty environment — no
//! `DATABASE_URL`, no broker URL, no service — and leaves a SQLite file in
//! which every event was published and applied once by each consumer.

use std::process::Command;

use sqlx::SqlitePool;

#[tokio::test]
async fn the_embedded_demo_needs_no_server_and_applies_every_event_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("demo.db");
    let output = Command::new(env!("CARGO_BIN_EXE_order-service-embedded"))
        .env_clear()
        .env("OUTBOX_SQLITE_PATH", &path)
        .output()
        .expect("run the embedded order service");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");

    let pool = SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let count = |sql: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let events = count("SELECT count(*) FROM outbox_events").await;
    assert_eq!(events, 480, "300 created, 150 shipped, 30 cancelled");
    assert_eq!(
        count("SELECT count(*) FROM outbox_events WHERE status <> 'published'").await,
        0
    );
    // Once per consumer: one inbox row per (consumer, event), one invoice
    // per order, and the projection at each order's last version.
    assert_eq!(
        count("SELECT count(*) FROM outbox_processed_events WHERE consumer_name = 'billing'").await,
        300
    );
    assert_eq!(
        count("SELECT count(*) FROM outbox_processed_events WHERE consumer_name = 'order-status'")
            .await,
        events
    );
    assert_eq!(count("SELECT count(*) FROM invoices").await, 300);
    assert_eq!(
        count(
            "SELECT count(*) FROM order_status s
             WHERE s.version = (SELECT max(aggregate_version) FROM outbox_events e
                                WHERE e.aggregate_id = s.order_id)"
        )
        .await,
        300
    );
    assert_eq!(count("SELECT count(*) FROM outbox_dead_letters").await, 0);
    assert_eq!(
        count("SELECT count(*) FROM outbox_consumer_parked").await,
        0
    );
}
