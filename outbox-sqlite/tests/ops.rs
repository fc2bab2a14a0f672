//! The operations API on SQLite. Repairs: a failed head retried or
//! skipped, a retrying head tried now, a published event published again;
//! each by id, with a reason and one audit row naming what happened to
//! every id. Reads: the status with its problems, listings with filters
//! and keyset pages, payloads redacted, the audit log, and a cleanup that
//! counts before it deletes and keeps keys for their own retention.

mod common;

use std::time::Duration;

use common::{Noted, TestDb};
use outbox_core::audit::RepairRequest;
use outbox_core::ops::{Cleanup, EventFilter, EventStatus, OpsError, StatusOptions};
use outbox_core::relay::{BatchOutcome, ClaimedBatch, FailedAttempt, RelayConfig, RelayStore};
use outbox_core::{EmitOptions, OutboxEvent};
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

/// A charge whose card number is sensitive.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, schemars::JsonSchema, OutboxEvent)]
#[outbox(event_type = "card.charged", aggregate = "card", version = 1)]
struct Charged {
    #[outbox(aggregate_id)]
    card: String,
    #[outbox(redact)]
    number: String,
    cents: i64,
}

fn filter(status: EventStatus) -> EventFilter {
    EventFilter {
        status,
        ..EventFilter::default()
    }
}

/// Board `a`: a retrying head and two events behind it; board `b`: a
/// failed head and one event behind it. Returns (a's head, b's head).
async fn one_retrying_one_failed(db: &TestDb, store: &SqliteRelayStore) -> (Uuid, Uuid) {
    emit(db, "a", 3).await;
    let a = fail_head(store, false, Duration::from_secs(3600)).await;
    emit(db, "b", 2).await;
    let b = fail_head(store, true, Duration::ZERO).await;
    (a, b)
}

#[tokio::test]
async fn status_counts_the_backlog_names_blocked_aggregates_and_flags_problems() {
    let db = TestDb::new().await;
    let store = SqliteRelayStore::new(db.pool.clone(), &RelayConfig::default());
    let (a, b) = one_retrying_one_failed(&db, &store).await;
    let status = SqliteOps::new(db.pool.clone())
        .status(&StatusOptions::default())
        .await
        .unwrap();
    let backlog = &status.backlog;
    assert_eq!(
        (
            backlog.pending,
            backlog.retrying,
            backlog.failed,
            backlog.skipped
        ),
        (3, 1, 1, 0)
    );
    assert_eq!(backlog.live_tuples, 5);
    assert!(backlog.oldest_pending_age_seconds.is_some());
    assert_eq!(status.event_types.len(), 1);
    assert_eq!(status.event_types[0].event_type, "board.noted");
    assert!(status.schema.ends_with("outbox.db"), "{}", status.schema);
    let heads: Vec<(Uuid, &str)> = status
        .blocked
        .iter()
        .map(|blocked| (blocked.head_event_id, blocked.head_status.as_str()))
        .collect();
    assert!(heads.contains(&(a, "pending")), "{heads:?}");
    assert!(heads.contains(&(b, "failed")), "{heads:?}");
    assert!(
        status
            .problems
            .iter()
            .any(|p| p.contains("1 event(s) failed")),
        "{:?}",
        status.problems
    );
    assert!(
        status
            .problems
            .iter()
            .any(|p| p.contains(&format!("board/b is blocked by {b}"))),
        "{:?}",
        status.problems
    );
    // Skipping the failed head moves it from failed to skipped.
    let ops = SqliteOps::new(db.pool.clone());
    ops.skip_failed(&[b], &request()).await.unwrap();
    let status = ops.status(&StatusOptions::default()).await.unwrap();
    assert_eq!((status.backlog.failed, status.backlog.skipped), (0, 1));
}

#[tokio::test]
async fn listings_filter_and_page_like_the_postgres_store() {
    let db = TestDb::new().await;
    let store = SqliteRelayStore::new(db.pool.clone(), &RelayConfig::default());
    let (a, b) = one_retrying_one_failed(&db, &store).await;
    let ops = SqliteOps::new(db.pool.clone());

    let failed = ops.events(&filter(EventStatus::Failed)).await.unwrap();
    assert_eq!(failed.items.len(), 1);
    let head = &failed.items[0];
    assert_eq!((head.id, head.aggregate_id.as_str()), (b, "b"));
    assert_eq!(head.status, "failed");
    assert_eq!(head.attempts, 1);
    assert_eq!(head.last_error.as_deref(), Some("broker refused"));
    assert!(head.failed_at.is_some());
    assert_eq!(failed.next, None);

    // Keyset pages of a's three pending events (the retrying head first).
    let first = ops
        .events(&EventFilter {
            aggregate_id: Some("a".into()),
            limit: Some(2),
            ..filter(EventStatus::Pending)
        })
        .await
        .unwrap();
    assert_eq!(first.items.len(), 2);
    assert_eq!(first.items[0].id, a);
    assert_eq!(first.items[0].attempts, 1);
    let after = first.next.expect("a next page");
    let second = ops
        .events(&EventFilter {
            aggregate_id: Some("a".into()),
            limit: Some(2),
            after: Some(after),
            ..filter(EventStatus::Pending)
        })
        .await
        .unwrap();
    let versions: Vec<i64> = first
        .items
        .iter()
        .chain(&second.items)
        .map(|e| e.aggregate_version)
        .collect();
    assert_eq!(versions, [1, 2, 3]);
    assert_eq!(second.next, None);

    // Error text in any case; a time window after now finds nothing.
    let by_error = ops
        .events(&EventFilter {
            error_contains: Some("BROKER".into()),
            ..filter(EventStatus::Failed)
        })
        .await
        .unwrap();
    assert_eq!(by_error.items.len(), 1);
    let later = ops
        .events(&EventFilter {
            since: Some(chrono::Utc::now() + chrono::Duration::hours(1)),
            ..filter(EventStatus::Pending)
        })
        .await
        .unwrap();
    assert!(later.items.is_empty());
    assert_eq!(ops.event(b).await.unwrap().unwrap().id, b);
    assert!(ops.event(Uuid::new_v4()).await.unwrap().is_none());
}

#[tokio::test]
async fn a_shown_payload_never_carries_a_redacted_value() {
    let db = TestDb::new().await;
    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    let charged = SqliteOutbox::new()
        .emit(
            &mut tx,
            &Charged {
                card: "c-1".into(),
                number: "4111999988887777".into(),
                cents: 1250,
            },
        )
        .await
        .unwrap()
        .event_id;
    tx.commit().await.unwrap();
    // A type this binary has no contract for: every value is masked.
    let unknown = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, aggregate_version,
             event_type, schema_version, payload, created_at)
         VALUES (?1, 'vault', 'v-1', 1, 'vault.opened', 1, '{\"pin\":\"0042\"}', 0)",
    )
    .bind(unknown.to_string())
    .execute(&db.pool)
    .await
    .unwrap();
    let ops = SqliteOps::new(db.pool.clone());
    let shown = ops.event(charged).await.unwrap().unwrap().payload;
    assert_eq!(shown["cents"], 1250);
    assert_ne!(shown["number"], "4111999988887777");
    assert!(!shown.to_string().contains("4111999988887777"));
    let shown = ops.event(unknown).await.unwrap().unwrap().payload;
    assert!(!shown.to_string().contains("0042"), "{shown}");
    let listed = ops.events(&filter(EventStatus::Pending)).await.unwrap();
    assert!(
        listed
            .items
            .iter()
            .all(|e| !e.payload.to_string().contains("4111999988887777"))
    );
}

#[tokio::test]
async fn the_audit_lists_repairs_newest_first_in_pages() {
    let db = TestDb::new().await;
    let store = SqliteRelayStore::new(db.pool.clone(), &RelayConfig::default());
    let (_, b) = one_retrying_one_failed(&db, &store).await;
    let ops = SqliteOps::new(db.pool.clone());
    let first = ops.retry_failed(&[b], &request()).await.unwrap();
    let missing = Uuid::new_v4();
    let second = ops
        .republish(
            &[missing],
            &RepairRequest::new("bob", "INC-8 check").unwrap(),
        )
        .await
        .unwrap();
    let page = ops.audit(None, Some(1)).await.unwrap();
    assert_eq!(page.items.len(), 1);
    let newest = &page.items[0];
    assert_eq!(newest.id, second.audit_id);
    assert_eq!(
        (newest.operator.as_str(), newest.action.as_str()),
        ("bob", "relay.republish")
    );
    assert_eq!(newest.ids, [missing.to_string()]);
    assert_eq!(newest.outcomes[0]["outcome"], "not_found");
    let older = ops.audit(page.next, Some(1)).await.unwrap();
    assert_eq!(older.items[0].id, first.audit_id);
    assert_eq!(older.items[0].reason, "broker fixed in INC-7");
    assert_eq!(older.items[0].outcomes[0]["outcome"], "retried");
    let rest = ops.audit(older.next, Some(1)).await.unwrap();
    assert!(rest.items.is_empty());
    assert_eq!(rest.next, None);
}

#[tokio::test]
async fn cleanup_counts_first_and_keeps_keys_younger_than_their_retention() {
    let db = TestDb::new().await;
    let outbox = SqliteOutbox::new();
    for key in ["old-command", "recent-command"] {
        let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        outbox
            .emit_with(
                &mut tx,
                &Noted::new("k", key),
                EmitOptions {
                    idempotency_key: Some(key.into()),
                    ..EmitOptions::default()
                },
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    emit(&db, "k", 2).await;
    // Four published two hours ago, one still pending.
    let store = SqliteRelayStore::new(db.pool.clone(), &RelayConfig::default());
    let claim = store.claim(4).await.unwrap();
    let ids: Vec<Uuid> = claim.events().iter().map(|e| e.envelope.id).collect();
    claim
        .complete(BatchOutcome {
            published: ids,
            failed: vec![],
        })
        .await
        .unwrap();
    emit(&db, "k", 1).await;
    let hours_ago = |h: i64| chrono::Utc::now().timestamp_millis() - h * 3_600_000;
    sqlx::query("UPDATE outbox_events SET published_at = ?1 WHERE status = 'published'")
        .bind(hours_ago(2))
        .execute(&db.pool)
        .await
        .unwrap();
    // One key eight days old (past the 7-day retention), one a day old.
    sqlx::query(
        "UPDATE outbox_idempotency_keys SET created_at = CASE idempotency_key
             WHEN 'old-command' THEN ?1 ELSE ?2 END",
    )
    .bind(hours_ago(8 * 24))
    .bind(hours_ago(24))
    .execute(&db.pool)
    .await
    .unwrap();

    let ops = SqliteOps::new(db.pool.clone());
    let mut plan = Cleanup::older_than(Duration::from_secs(3600));
    plan.batch = 3;
    let dry = ops.cleanup(&plan, &request(), |_, _| {}).await.unwrap();
    assert_eq!((dry.eligible, dry.keys_eligible), (4, 1));
    assert_eq!((dry.deleted, dry.keys_deleted, dry.executed), (0, 0, false));
    assert_eq!(db.count("published").await, 4);

    plan.execute = true;
    let mut seen = Vec::new();
    let done = ops
        .cleanup(&plan, &request(), |deleted, eligible| {
            seen.push((deleted, eligible))
        })
        .await
        .unwrap();
    assert_eq!((done.deleted, done.keys_deleted), (4, 1));
    assert_eq!(seen, [(3, 4), (4, 4)]);
    assert_eq!(db.count("published").await, 0);
    assert_eq!(db.count("pending").await, 1);
    let keys: Vec<String> =
        sqlx::query_scalar("SELECT idempotency_key FROM outbox_idempotency_keys")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(keys, ["recent-command"]);
    let audit = ops.audit(None, Some(1)).await.unwrap().items.remove(0);
    assert_eq!(Some(audit.id), done.audit_id);
    assert_eq!(audit.action, "relay.cleanup");
    assert_eq!(audit.outcomes[0]["deleted"], 4);
    assert_eq!(audit.outcomes[0]["keys_deleted"], 1);
}
