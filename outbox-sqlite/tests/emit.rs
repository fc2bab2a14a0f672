//! Emit on SQLite: the event commits with the caller's transaction or not
//! at all, versions come from the counter or are carried (and refused out
//! of order or when taken), and an idempotency key makes a repeated command
//! a no-op. A real SQLite file per test.

mod common;

use common::{Moved, Noted, TestDb};
use outbox_core::{EmitError, EmitOptions, EmitOutcome};
use outbox_sqlite::SqliteOutbox;

async fn create_boards(db: &TestDb) {
    sqlx::query("CREATE TABLE boards (id TEXT PRIMARY KEY)")
        .execute(&db.pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_event_commits_with_the_business_row_and_a_rollback_leaves_neither() {
    let db = TestDb::new().await;
    create_boards(&db).await;
    let outbox = SqliteOutbox::new();

    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO boards (id) VALUES ('kept')")
        .execute(&mut *tx)
        .await
        .unwrap();
    let kept = outbox
        .emit(&mut tx, &Noted::new("kept", "hello"))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    sqlx::query("INSERT INTO boards (id) VALUES ('gone')")
        .execute(&mut *tx)
        .await
        .unwrap();
    outbox
        .emit(&mut tx, &Noted::new("gone", "never"))
        .await
        .unwrap();
    tx.rollback().await.unwrap();

    let boards: Vec<String> = sqlx::query_scalar("SELECT id FROM boards")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(boards, ["kept"]);
    let events: Vec<(String, String, i64, String)> =
        sqlx::query_as("SELECT id, aggregate_id, aggregate_version, payload FROM outbox_events")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(events.len(), 1, "only the committed event: {events:?}");
    assert_eq!(events[0].0, kept.event_id.to_string());
    assert_eq!(events[0].1, "kept");
    assert_eq!(events[0].2, 1);
    assert_eq!(events[0].3, r#"{"board":"kept","text":"hello"}"#);
}

#[tokio::test]
async fn emit_outside_a_transaction_is_refused_and_writes_nothing() {
    let db = TestDb::new().await;
    let mut conn = db.pool.acquire().await.unwrap();
    let error = SqliteOutbox::new()
        .emit(&mut conn, &Noted::new("b", "autocommit"))
        .await
        .unwrap_err();
    assert!(matches!(error, EmitError::NotInTransaction), "{error}");
    assert_eq!(db.count("pending").await, 0);
}

#[tokio::test]
async fn counted_versions_follow_commit_order_per_aggregate() {
    let db = TestDb::new().await;
    let outbox = SqliteOutbox::new();
    for round in 0..3 {
        let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        let emitted = outbox
            .emit_all(
                &mut tx,
                &[
                    Noted::new("a", format!("{round}")),
                    Noted::new("b", format!("{round}")),
                    Noted::new("a", format!("{round}+")),
                ],
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
        let versions: Vec<i64> = emitted.iter().map(|e| e.aggregate_version).collect();
        assert_eq!(versions, [2 * round + 1, round + 1, 2 * round + 2]);
    }
    // A rolled-back emit gives its version back.
    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    outbox.emit(&mut tx, &Noted::new("a", "x")).await.unwrap();
    tx.rollback().await.unwrap();
    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let next = outbox.emit(&mut tx, &Noted::new("a", "y")).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(next.aggregate_version, 7);
}

#[tokio::test]
async fn carried_versions_are_refused_when_taken_or_below_an_unpublished_one() {
    let db = TestDb::new().await;
    let outbox = SqliteOutbox::new();
    let moved = |version| Moved {
        piece: "p".into(),
        version,
    };
    // Any order within one call: written in version order.
    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let emitted = outbox
        .emit_all(&mut tx, &[moved(3), moved(1), moved(2)])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        emitted
            .iter()
            .map(|e| e.aggregate_version)
            .collect::<Vec<_>>(),
        [3, 1, 2]
    );
    let seq_order: Vec<i64> =
        sqlx::query_scalar("SELECT aggregate_version FROM outbox_events ORDER BY seq")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(seq_order, [1, 2, 3]);

    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let error = outbox.emit(&mut tx, &moved(3)).await.unwrap_err();
    assert!(
        matches!(
            error,
            EmitError::VersionConflict {
                aggregate_version: 3,
                ..
            }
        ),
        "{error}"
    );
    let error = outbox.emit(&mut tx, &moved(2)).await.unwrap_err();
    assert!(
        matches!(
            error,
            EmitError::VersionOutOfOrder {
                aggregate_version: 2,
                newer_version: 3,
                ..
            }
        ),
        "{error}"
    );
    // The refused statements wrote nothing; the transaction goes on.
    outbox.emit(&mut tx, &moved(4)).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(db.count("pending").await, 4);
}

#[tokio::test]
async fn a_repeated_idempotency_key_writes_nothing_and_names_the_first_event() {
    let db = TestDb::new().await;
    let outbox = SqliteOutbox::new();
    let options = || EmitOptions {
        idempotency_key: Some("command-42".into()),
        ..EmitOptions::default()
    };
    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let first = outbox
        .emit_with(&mut tx, &Noted::new("k", "once"), options())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let EmitOutcome::Emitted(first) = first else {
        panic!("the first emit writes: {first:?}");
    };
    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let again = outbox
        .emit_with(&mut tx, &Noted::new("k", "twice"), options())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        again,
        EmitOutcome::Duplicate {
            original_event_id: first.event_id
        }
    );
    assert_eq!(db.count("pending").await, 1);

    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let error = outbox
        .emit_with(
            &mut tx,
            &Noted::new("k", "long"),
            EmitOptions {
                idempotency_key: Some("x".repeat(513)),
                ..EmitOptions::default()
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(error, EmitError::KeyTooLong(513)), "{error}");
}

#[tokio::test]
async fn migrate_runs_again_without_harm_and_refuses_a_newer_schema() {
    let db = TestDb::new().await;
    outbox_sqlite::migrate(&db.pool).await.unwrap();
    sqlx::query("PRAGMA user_version = 99")
        .execute(&db.pool)
        .await
        .unwrap();
    let error = outbox_sqlite::migrate(&db.pool).await.unwrap_err();
    assert!(
        matches!(
            error,
            outbox_sqlite::MigrateError::NewerSchema { found: 99, .. }
        ),
        "{error}"
    );
}

#[tokio::test]
async fn the_pool_runs_in_wal_mode_with_full_sync() {
    let db = TestDb::new().await;
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(synchronous, 2, "FULL");
}
