//! Operator repairs on SQLite: a failed head retried or skipped, a
//! retrying head tried now, a published event published again; each by
//! id, with a reason and one audit row naming what happened to every id.

mod common;

use std::time::Duration;

use common::{Noted, TestDb};
use outbox_core::audit::RepairRequest;
use outbox_core::ops::OpsError;
use outbox_core::relay::{BatchOutcome, ClaimedBatch, FailedAttempt, RelayConfig, RelayStore};
use outbox_sqlite::{SqliteOps, SqliteOutbox, SqliteRelayStore};
use uuid::Uuid;

async fn emit(db: &TestDb, board: &str, n: usize) -> Vec<Uuid> {
    let mut ids = Vec::new();
    for _ in 0..n {
        let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        ids.push(
            SqliteOutbox::new()
                .emit(&mut tx, &Noted::new(board, "x"))
                .await
                .unwrap()
                .event_id,
        );
        tx.commit().await.unwrap();
    }
    ids
}

/// Claims the head of `board` and records a failed attempt.
async fn fail_head(store: &SqliteRelayStore, give_up: bool, retry_in: Duration) -> Uuid {
    let claim = store.claim(1).await.unwrap();
    let head = claim.events()[0].envelope.clone();
    claim
        .complete(BatchOutcome {
            published: vec![],
            failed: vec![FailedAttempt {
                event_id: head.id,
                aggregate_type: head.aggregate_type,
                aggregate_id: head.aggregate_id,
                error: "broker refused".into(),
                retry_in,
                give_up,
            }],
        })
        .await
        .unwrap();
    head.id
}

fn request() -> RepairRequest {
    RepairRequest::new("alice", "broker fixed in INC-7").unwrap()
}

async fn claimed_versions(store: &SqliteRelayStore) -> Vec<i64> {
    let claim = store.claim(100).await.unwrap();
    let versions = claim
        .events()
        .iter()
        .map(|e| e.envelope.aggregate_version)
        .collect();
    claim.release().await.unwrap();
    versions
}

#[tokio::test]
async fn a_failed_head_is_retried_from_its_first_attempt_with_an_audit_row() {
    let db = TestDb::new().await;
    let ids = emit(&db, "b", 2).await;
    let store = SqliteRelayStore::new(db.pool.clone(), &RelayConfig::default());
    let head = fail_head(&store, true, Duration::from_secs(60)).await;
    assert_eq!(head, ids[0]);
    assert!(claimed_versions(&store).await.is_empty(), "blocked");

    let unknown = Uuid::now_v7();
    let report = SqliteOps::new(db.pool.clone())
        .retry_failed(&[head, ids[1], unknown], &request())
        .await
        .unwrap();
    let outcomes: Vec<&str> = report.outcomes.iter().map(|o| o.outcome.as_str()).collect();
    assert_eq!(outcomes, ["retried", "not_failed", "not_found"]);
    assert_eq!(db.state("b", 1).await, ("pending".to_owned(), 0));
    assert_eq!(claimed_versions(&store).await, [1, 2]);

    let (operator, reason, action, audited_ids, audited_outcomes): (
        String,
        String,
        String,
        String,
        String,
    ) = sqlx::query_as(
        "SELECT operator, reason, action, ids, outcomes FROM outbox_audit WHERE id = ?1",
    )
    .bind(report.audit_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (operator.as_str(), reason.as_str(), action.as_str()),
        ("alice", "broker fixed in INC-7", "relay.retry")
    );
    assert!(audited_ids.contains(&head.to_string()));
    assert!(audited_outcomes.contains("not_found"), "{audited_outcomes}");
}

#[tokio::test]
async fn a_skipped_failed_head_lets_its_aggregate_go_on_and_says_who_skipped_it() {
    let db = TestDb::new().await;
    emit(&db, "b", 3).await;
    let store = SqliteRelayStore::new(db.pool.clone(), &RelayConfig::default());
    let head = fail_head(&store, true, Duration::from_secs(60)).await;
    let report = SqliteOps::new(db.pool.clone())
        .skip_failed(&[head], &request())
        .await
        .unwrap();
    assert_eq!(report.count("skipped"), 1);
    let last_error: String =
        sqlx::query_scalar("SELECT last_error FROM outbox_events WHERE id = ?1")
            .bind(head.to_string())
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(
        last_error.starts_with("skipped by alice: broker fixed in INC-7 (last error:"),
        "{last_error}"
    );
    assert_eq!(claimed_versions(&store).await, [2, 3]);
}

#[tokio::test]
async fn a_retrying_head_is_tried_now_and_a_published_event_again() {
    let db = TestDb::new().await;
    let ids = emit(&db, "b", 2).await;
    let store = SqliteRelayStore::new(db.pool.clone(), &RelayConfig::default());
    let head = fail_head(&store, false, Duration::from_secs(3600)).await;
    assert!(claimed_versions(&store).await.is_empty(), "in backoff");
    let ops = SqliteOps::new(db.pool.clone());
    let report = ops
        .retry_blocked(&[ids[1], head], &request())
        .await
        .unwrap();
    let outcomes: Vec<&str> = report.outcomes.iter().map(|o| o.outcome.as_str()).collect();
    assert_eq!(outcomes, ["not_blocked_head", "retried"]);

    let claim = store.claim(100).await.unwrap();
    let all = claim.events().iter().map(|e| e.envelope.id).collect();
    claim
        .complete(BatchOutcome {
            published: all,
            failed: vec![],
        })
        .await
        .unwrap();
    assert_eq!(db.count("published").await, 2);
    let report = ops.republish(&[ids[0]], &request()).await.unwrap();
    assert_eq!(report.count("republished"), 1);
    assert_eq!(claimed_versions(&store).await, [1]);
}

#[tokio::test]
async fn a_repair_without_ids_or_reason_is_refused_and_changes_nothing() {
    let db = TestDb::new().await;
    let error = SqliteOps::new(db.pool.clone())
        .retry_failed(&[], &request())
        .await
        .unwrap_err();
    assert!(matches!(error, OpsError::Refused(_)), "{error}");
    assert!(RepairRequest::new("alice", "  ").is_err());
    let audits: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_audit")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(audits, 0);
}
