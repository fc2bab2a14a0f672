//! The MySQL/MariaDB store (`outbox-mysql`) on MariaDB: emit commits with
//! the caller's transaction or not at all; versions from the counter are
//! gap-free in commit order, also with emitters racing on one aggregate;
//! carried versions are refused out of order or when taken; an idempotency
//! key makes a repeated command a no-op; cleanup counts before it deletes
//! and keeps keys for their own retention; migrations run again and
//! upgrade; a claim never takes versions another claim holds.

use std::time::Duration;

use outbox_core::audit::RepairRequest;
use outbox_core::ops::Cleanup;
use outbox_core::{EmitError, EmitOptions, EmitOutcome};
use outbox_mysql::{MySqlOps, MySqlOutbox};
use outbox_tests::events::{PieceMoved, Ticked};
use outbox_tests::mysql::MySqlTestDb;

#[tokio::test]
async fn an_event_commits_with_the_business_row_and_a_rollback_leaves_neither() {
    let db = MySqlTestDb::new().await;
    sqlx::query("CREATE TABLE counters (id VARCHAR(64) PRIMARY KEY)")
        .execute(&db.pool)
        .await
        .unwrap();
    let outbox = MySqlOutbox::new();
    for (id, commit) in [("kept", true), ("gone", false)] {
        let mut tx = db.pool.begin().await.unwrap();
        sqlx::query("INSERT INTO counters (id) VALUES (?)")
            .bind(id)
            .execute(&mut *tx)
            .await
            .unwrap();
        outbox.emit(&mut tx, &Ticked::new(id, 1)).await.unwrap();
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
    }
    let counters: Vec<String> = sqlx::query_scalar("SELECT id FROM counters")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(counters, ["kept"]);
    let events: Vec<(String, i64)> =
        sqlx::query_as("SELECT aggregate_id, aggregate_version FROM outbox_events")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(events, [("kept".to_owned(), 1)]);

    let mut conn = db.pool.acquire().await.unwrap();
    let error = outbox
        .emit(&mut conn, &Ticked::new("autocommit", 1))
        .await
        .unwrap_err();
    assert!(matches!(error, EmitError::NotInTransaction), "{error}");
    drop(conn);
    db.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_emitters_get_gap_free_versions_in_commit_order() {
    let db = MySqlTestDb::new().await;
    let mut tasks = Vec::new();
    for task in 0..4 {
        let pool = db.pool.clone();
        tasks.push(tokio::spawn(async move {
            let outbox = MySqlOutbox::new();
            for n in 0..25 {
                let mut tx = pool.begin().await.unwrap();
                outbox
                    .emit(&mut tx, &Ticked::new("hot", task * 100 + n))
                    .await
                    .unwrap();
                // Another aggregate in the same transaction never waits.
                outbox
                    .emit(&mut tx, &Ticked::new(format!("cold-{task}"), n))
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let hot: Vec<i64> = sqlx::query_scalar(
        "SELECT aggregate_version FROM outbox_events WHERE aggregate_id = 'hot' ORDER BY seq",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        hot,
        (1..=100).collect::<Vec<i64>>(),
        "gap-free, in insert (= commit) order"
    );
    let rolled_back = {
        let mut tx = db.pool.begin().await.unwrap();
        let emitted = MySqlOutbox::new()
            .emit(&mut tx, &Ticked::new("hot", 0))
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        emitted.aggregate_version
    };
    let mut tx = db.pool.begin().await.unwrap();
    let next = MySqlOutbox::new()
        .emit(&mut tx, &Ticked::new("hot", 0))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        (rolled_back, next.aggregate_version),
        (101, 101),
        "a rollback gives its version back"
    );
    db.drop_database().await;
}

#[tokio::test]
async fn carried_versions_are_written_in_order_and_refused_out_of_order_or_taken() {
    let db = MySqlTestDb::new().await;
    let outbox = MySqlOutbox::new();
    let moved = |version| PieceMoved::new("p", version);
    let mut tx = db.pool.begin().await.unwrap();
    outbox
        .emit_all(&mut tx, &[moved(3), moved(1), moved(2)])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let seq_order: Vec<i64> =
        sqlx::query_scalar("SELECT aggregate_version FROM outbox_events ORDER BY seq")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(seq_order, [1, 2, 3]);

    let mut tx = db.pool.begin().await.unwrap();
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
    tx.rollback().await.unwrap();
    let mut tx = db.pool.begin().await.unwrap();
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
    tx.rollback().await.unwrap();
    db.drop_database().await;
}

#[tokio::test]
async fn a_repeated_idempotency_key_writes_nothing_and_names_the_first_event() {
    let db = MySqlTestDb::new().await;
    let outbox = MySqlOutbox::new();
    let options = || EmitOptions {
        idempotency_key: Some("command-42".into()),
        ..EmitOptions::default()
    };
    let mut tx = db.pool.begin().await.unwrap();
    let first = outbox
        .emit_with(&mut tx, &Ticked::new("k", 1), options())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let EmitOutcome::Emitted(first) = first else {
        panic!("the first emit was a duplicate");
    };
    let mut tx = db.pool.begin().await.unwrap();
    let again = outbox
        .emit_with(&mut tx, &Ticked::new("k", 1), options())
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
    db.drop_database().await;
}

#[tokio::test]
async fn cleanup_counts_first_and_keeps_keys_younger_than_their_retention() {
    let db = MySqlTestDb::new().await;
    let outbox = MySqlOutbox::new();
    for key in ["old-command", "recent-command"] {
        let mut tx = db.pool.begin().await.unwrap();
        outbox
            .emit_with(
                &mut tx,
                &Ticked::new("k", 1),
                EmitOptions {
                    idempotency_key: Some(key.into()),
                    ..EmitOptions::default()
                },
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let hours_ago = |h: i64| chrono::Utc::now().timestamp_millis() - h * 3_600_000;
    sqlx::query("UPDATE outbox_events SET status = 'published', published_at = ?")
        .bind(hours_ago(2))
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE outbox_idempotency_keys
         SET created_at = CASE idempotency_key WHEN 'old-command' THEN ? ELSE ? END",
    )
    .bind(hours_ago(8 * 24))
    .bind(hours_ago(24))
    .execute(&db.pool)
    .await
    .unwrap();
    let ops = MySqlOps::new(db.pool.clone());
    let request = RepairRequest::new("alice", "retention").unwrap();
    let mut plan = Cleanup::older_than(Duration::from_secs(3600));
    let dry = ops.cleanup(&plan, &request, |_, _| {}).await.unwrap();
    assert_eq!(
        (dry.eligible, dry.keys_eligible, dry.executed),
        (2, 1, false)
    );
    assert_eq!(db.count("published").await, 2);
    plan.execute = true;
    let done = ops.cleanup(&plan, &request, |_, _| {}).await.unwrap();
    assert_eq!((done.deleted, done.keys_deleted), (2, 1));
    let keys: Vec<String> =
        sqlx::query_scalar("SELECT idempotency_key FROM outbox_idempotency_keys")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(keys, ["recent-command"]);
    let audit = ops.audit(None, Some(1)).await.unwrap().items.remove(0);
    assert_eq!(Some(audit.id), done.audit_id);
    assert_eq!(audit.action, "relay.cleanup");
    assert_eq!(audit.outcomes[0]["deleted"], 2);
    db.drop_database().await;
}

/// What schema versions 2 and 3 have: the emit procedure and the
/// head-test index, no index on the lease token.
async fn schema_shape(pool: &sqlx::MySqlPool) -> (i64, Vec<String>, i64) {
    let version: i64 = sqlx::query_scalar(
        "SELECT CAST(version AS SIGNED) FROM outbox_schema_version WHERE id = 1",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let indexes: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_events'
           AND INDEX_NAME IN ('outbox_events_unpublished', 'outbox_events_claim')
         ORDER BY INDEX_NAME",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let procedures: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.ROUTINES
         WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = 'outbox_emit_counted_v1'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    (version, indexes, procedures)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrations_run_again_at_once_and_bring_version_1_tables_up_to_date() {
    let db = MySqlTestDb::new().await;
    let expected = (3, vec!["outbox_events_unpublished".to_owned()], 1);
    assert_eq!(schema_shape(&db.pool).await, expected);
    // Two services starting at once.
    let (a, b) = tokio::join!(
        outbox_mysql::migrate(&db.pool),
        outbox_mysql::migrate(&db.pool)
    );
    a.unwrap();
    b.unwrap();
    assert_eq!(schema_shape(&db.pool).await, expected);

    // Tables as version 1 left them (no consumer tables), with an event
    // emitted then.
    for statement in [
        "DROP TABLE outbox_processed_events, outbox_consumer_attempts, outbox_consumer_positions,
                    outbox_consumer_parked, outbox_dead_letters, outbox_consumer_stats",
        "DROP PROCEDURE outbox_emit_counted_v1",
        "DROP INDEX outbox_events_unpublished ON outbox_events",
        "CREATE INDEX outbox_events_claim ON outbox_events (claim_token)",
        "UPDATE outbox_schema_version SET version = 1",
    ] {
        sqlx::query(statement).execute(&db.pool).await.unwrap();
    }
    sqlx::query(
        "INSERT INTO outbox_aggregate_versions (aggregate_type, aggregate_id, version)
         VALUES ('counter', 'old', 1)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    // A process that does not migrate is told what to do, before an emit
    // would fail on the missing procedure.
    let older = outbox_mysql::check_schema(&db.pool).await.unwrap_err();
    assert!(
        matches!(
            older,
            outbox_mysql::SchemaError::Older {
                found: 1,
                required: 3
            }
        ),
        "{older}"
    );
    assert!(
        older.to_string().contains("run outbox_mysql::migrate"),
        "{older}"
    );
    outbox_mysql::migrate(&db.pool).await.unwrap();
    assert_eq!(schema_shape(&db.pool).await, expected);
    assert_eq!(outbox_mysql::check_schema(&db.pool).await.unwrap(), 3);
    sqlx::query("UPDATE outbox_schema_version SET version = 4")
        .execute(&db.pool)
        .await
        .unwrap();
    assert!(matches!(
        outbox_mysql::check_schema(&db.pool).await,
        Err(outbox_mysql::SchemaError::Newer {
            found: 4,
            supported: 3
        })
    ));
    sqlx::query("UPDATE outbox_schema_version SET version = 3")
        .execute(&db.pool)
        .await
        .unwrap();
    // A table dropped by hand is named.
    sqlx::query("DROP TABLE outbox_audit")
        .execute(&db.pool)
        .await
        .unwrap();
    match outbox_mysql::check_schema(&db.pool).await {
        Err(outbox_mysql::SchemaError::NotMigrated { missing }) => {
            assert_eq!(missing, "outbox_audit")
        }
        other => panic!("{other:?}"),
    }
    outbox_mysql::migrate(&db.pool).await.unwrap();
    assert_eq!(outbox_mysql::check_schema(&db.pool).await.unwrap(), 3);
    // The counter carries on where version 1 left it.
    let mut tx = db.pool.begin().await.unwrap();
    let emitted = MySqlOutbox::new()
        .emit(&mut tx, &Ticked::new("old", 2))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(emitted.aggregate_version, 2);
    db.drop_database().await;
}

/// A republished old version becomes a head below a chain another relay
/// holds: the new claim takes that version only, never the holder's
/// leased versions (two relays would publish one aggregate at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_never_takes_versions_leased_by_another() {
    use outbox_core::relay::{BatchOutcome, ClaimedBatch, RelayConfig, RelayStore};
    use outbox_mysql::MySqlRelayStore;

    let db = MySqlTestDb::new().await;
    let outbox = MySqlOutbox::new();
    let mut tx = db.pool.begin().await.unwrap();
    for tick in 1..=3 {
        outbox.emit(&mut tx, &Ticked::new("c", tick)).await.unwrap();
    }
    tx.commit().await.unwrap();
    let store = MySqlRelayStore::new(db.pool.clone(), &RelayConfig::default());
    // Version 1 published alone.
    let first = store.claim(1).await.unwrap();
    let v1 = first.events()[0].envelope.id;
    first
        .complete(BatchOutcome {
            published: vec![v1],
            failed: Vec::new(),
        })
        .await
        .unwrap();
    // Relay A holds versions 2 and 3.
    let held = store.claim(100).await.unwrap();
    let versions = |batch: &outbox_mysql::MySqlClaim| -> Vec<i64> {
        batch
            .events()
            .iter()
            .map(|e| e.envelope.aggregate_version)
            .collect()
    };
    assert_eq!(versions(&held), [2, 3]);
    // An operator republishes version 1: it is the aggregate's head again.
    let republished = MySqlOps::new(db.pool.clone())
        .republish(
            &[v1],
            &RepairRequest::new("alice", "consumer lost it").unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(republished.count("republished"), 1, "{republished:?}");
    // Relay B takes version 1 and stops at A's lease.
    let other = store.claim(100).await.unwrap();
    assert_eq!(versions(&other), [1]);
    let tokens: Vec<Option<String>> =
        sqlx::query_scalar("SELECT claim_token FROM outbox_events ORDER BY aggregate_version")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_ne!(tokens[0], tokens[1], "version 1 is B's, 2 is A's");
    assert_eq!(tokens[1], tokens[2], "A still holds 2 and 3 together");
    other.release().await.unwrap();
    held.release().await.unwrap();
    db.drop_database().await;
}

/// `statement_timeout` bounds what a MySQL claim waits for a lock: with
/// the outbox table locked by another session (`LOCK TABLES … WRITE`, as
/// a migration's DDL holds its metadata lock), the claim fails after the
/// timeout, naming the lock wait, instead of waiting for the server's
/// default `lock_wait_timeout` of a year; once the table is free the next
/// claim goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_behind_a_table_lock_fails_after_the_statement_timeout() {
    use outbox_core::relay::{ClaimedBatch, RelayStore};

    let db = MySqlTestDb::new().await;
    let outbox = MySqlOutbox::new();
    let mut tx = db.pool.begin().await.unwrap();
    outbox.emit(&mut tx, &Ticked::new("c1", 1)).await.unwrap();
    tx.commit().await.unwrap();

    let mut locker = db.pool.acquire().await.unwrap();
    sqlx::query("LOCK TABLES outbox_events WRITE")
        .execute(&mut *locker)
        .await
        .unwrap();
    let store = outbox_mysql::MySqlRelayStore::new(
        db.pool.clone(),
        &outbox_core::relay::RelayConfig {
            statement_timeout: Duration::from_secs(1),
            ..outbox_core::relay::RelayConfig::default()
        },
    );
    let started = std::time::Instant::now();
    let claim = tokio::time::timeout(Duration::from_secs(30), store.claim(10))
        .await
        .expect("the claim waited for the table lock past 30 s: no lock wait bound");
    let error = claim.expect_err("a claim went through a table another session locked");
    assert!(
        error
            .to_string()
            .to_lowercase()
            .contains("lock wait timeout"),
        "{error}"
    );
    eprintln!(
        "claim behind a table lock failed after {:?}",
        started.elapsed()
    );

    sqlx::query("UNLOCK TABLES")
        .execute(&mut *locker)
        .await
        .unwrap();
    drop(locker);
    let batch = store.claim(10).await.unwrap();
    assert_eq!(batch.events().len(), 1);
    batch.release().await.unwrap();
    db.drop_database().await;
}
