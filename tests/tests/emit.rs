//! Transactional emit against a real PostgreSQL: the business change and the
//! outbox row commit together or not at all (article test 1), versions per
//! aggregate are gap-free and follow commit order under concurrency, bad
//! input is a typed error with nothing written, idempotency keys turn a
//! retried command into a no-op, and NOTIFY is sent once per committing
//! transaction while a relay waits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::trace::{self, TraceParent};
use outbox_core::{EmitError, EmitOptions, EmitOutcome, EventDraft, OutboxEvent};
use outbox_examples::contracts::{Money, OrderCreated, OrderShipped, PaymentCaptured};
use outbox_postgres::{ConfigError, SchemaName};
use outbox_tests::TestDb;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgListener;
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

fn order(order_id: Uuid) -> OrderCreated {
    OrderCreated {
        order_id,
        customer_email: "ada@example.org".into(),
        lines: vec![],
        total: Money {
            amount_minor: 4200,
            currency: "EUR".into(),
        },
    }
}

async fn insert_order(db: &TestDb, conn: &mut sqlx::PgConnection, id: Uuid) {
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {} (id, customer, total_cents) VALUES ($1, 'ada', 4200)",
        db.table("orders")
    )))
    .bind(id)
    .execute(conn)
    .await
    .unwrap();
}

#[tokio::test]
async fn article_test_1_rollback_writes_neither_row_and_commit_writes_both() {
    let db = TestDb::new().await;
    let id = Uuid::now_v7();

    let mut tx = db.pool.begin().await.unwrap();
    insert_order(&db, &mut tx, id).await;
    db.outbox.emit(&mut tx, &order(id)).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(db.scalar::<i64>("SELECT count(*) FROM {s}.orders").await, 0);
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events")
            .await,
        0
    );
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_aggregate_versions")
            .await,
        0,
        "the rolled back version counter must not leave a gap"
    );

    let parent: TraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        .parse()
        .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    insert_order(&db, &mut tx, id).await;
    let emitted = trace::scope(Some(parent), db.outbox.emit(&mut tx, &order(id)))
        .await
        .unwrap();
    tx.commit().await.unwrap();

    assert_eq!(db.scalar::<i64>("SELECT count(*) FROM {s}.orders").await, 1);
    let row = sqlx::query(AssertSqlSafe(format!(
        "SELECT id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
                payload::text AS payload, traceparent, trace_id, created_at, status, published_at,
                attempt_count, next_attempt_at <= now() AS due, last_error
         FROM {}",
        db.table("outbox_events")
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let event_id: Uuid = row.get("id");
    assert_eq!(event_id, emitted.event_id);
    assert_eq!(event_id.get_version_num(), 7, "event ids are UUID v7");
    assert_eq!(row.get::<String, _>("aggregate_type"), "order");
    assert_eq!(row.get::<String, _>("aggregate_id"), id.to_string());
    assert_eq!(row.get::<i64, _>("aggregate_version"), 1);
    assert_eq!(emitted.aggregate_version, 1);
    assert_eq!(row.get::<String, _>("event_type"), "order.created");
    assert_eq!(row.get::<i32, _>("schema_version"), 2);
    let payload: serde_json::Value =
        serde_json::from_str(&row.get::<String, _>("payload")).unwrap();
    assert_eq!(payload, serde_json::to_value(order(id)).unwrap());
    let traceparent: TraceParent = row.get::<String, _>("traceparent").parse().unwrap();
    assert_eq!(traceparent.trace_id, parent.trace_id);
    assert_eq!(row.get::<String, _>("trace_id"), parent.trace_id_hex());
    assert_eq!(row.get::<String, _>("status"), "pending");
    assert!(
        row.get::<Option<chrono::DateTime<chrono::Utc>>, _>("published_at")
            .is_none()
    );
    assert_eq!(row.get::<i32, _>("attempt_count"), 0);
    assert!(row.get::<bool, _>("due"));
    assert!(row.get::<Option<String>, _>("last_error").is_none());
    let created_at: chrono::DateTime<chrono::Utc> = row.get("created_at");
    assert!((chrono::Utc::now() - created_at).num_seconds() < 30);
    db.drop_schema().await;
}

#[tokio::test]
async fn concurrent_emits_on_one_aggregate_get_gap_free_versions_in_commit_order() {
    let db = Arc::new(TestDb::with_pool_size(24).await);
    let order_id = Uuid::now_v7();
    let writers = 20;
    let per_writer = 5;
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let db = Arc::clone(&db);
        tasks.push(tokio::spawn(async move {
            let mut committed = 0;
            for attempt in 0..per_writer {
                let mut tx = db.pool.begin().await.unwrap();
                let emitted = db.outbox.emit(&mut tx, &order(order_id)).await.unwrap();
                // Every lower version must already be committed and visible
                // when this one is assigned: that is commit order.
                let visible: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
                    "SELECT count(*) FROM {} WHERE aggregate_id = $1",
                    db.table("outbox_events")
                )))
                .bind(order_id.to_string())
                .fetch_one(&mut *tx)
                .await
                .unwrap();
                assert_eq!(
                    visible, emitted.aggregate_version,
                    "version {} saw {visible} rows",
                    emitted.aggregate_version
                );
                tokio::time::sleep(Duration::from_micros((writer * 97 + attempt * 31) % 3000))
                    .await;
                if (writer + attempt) % 7 == 3 {
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                    committed += 1;
                }
            }
            committed
        }));
    }
    let mut committed = 0;
    for task in tasks {
        committed += task.await.unwrap();
    }
    let versions: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT aggregate_version FROM {} ORDER BY aggregate_version",
        db.table("outbox_events")
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(versions, (1..=committed as i64).collect::<Vec<_>>());
    assert!(committed < writers * per_writer, "some writers rolled back");
}

/// A payload serde cannot turn into JSON (map keys must be strings).
#[derive(Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "grid.painted", aggregate = "grid", version = 1)]
struct GridPainted {
    #[outbox(aggregate_id)]
    grid: String,
    cells: HashMap<Vec<u8>, String>,
}

#[tokio::test]
async fn bad_input_is_a_typed_error_and_writes_nothing() {
    let db = TestDb::new().await;

    // A payload that cannot serialize.
    let mut tx = db.pool.begin().await.unwrap();
    let grid = GridPainted {
        grid: "g".into(),
        cells: HashMap::from([(vec![1u8], "red".to_owned())]),
    };
    let error = db.outbox.emit(&mut tx, &grid).await.unwrap_err();
    assert!(matches!(error, EmitError::Payload(_)), "{error}");
    assert!(error.to_string().contains("grid.painted"), "{error}");
    tx.commit().await.unwrap();

    // A connection outside any transaction.
    let mut conn = db.pool.acquire().await.unwrap();
    let error = db
        .outbox
        .emit(&mut conn, &order(Uuid::now_v7()))
        .await
        .unwrap_err();
    assert!(matches!(error, EmitError::NotInTransaction), "{error}");
    drop(conn);

    // A transaction aborted by an earlier error.
    let mut tx = db.pool.begin().await.unwrap();
    let _ = sqlx::query("SELECT 1/0")
        .execute(&mut *tx)
        .await
        .unwrap_err();
    let error = db
        .outbox
        .emit(&mut tx, &order(Uuid::now_v7()))
        .await
        .unwrap_err();
    assert!(matches!(error, EmitError::TransactionAborted), "{error}");
    tx.rollback().await.unwrap();

    // A transaction whose connection was killed.
    let mut tx = db.pool.begin().await.unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&db.pool)
        .await
        .unwrap();
    let error = db
        .outbox
        .emit(&mut tx, &order(Uuid::now_v7()))
        .await
        .unwrap_err();
    assert!(matches!(error, EmitError::Database { .. }), "{error}");
    drop(tx);

    // A bad schema name never reaches SQL.
    let error = SchemaName::new("orders; DROP TABLE x").unwrap_err();
    assert!(
        matches!(
            error,
            ConfigError::InvalidIdentifier {
                what: "schema name",
                ..
            }
        ),
        "{error}"
    );

    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events")
            .await,
        0
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn explicit_versions_are_stored_and_a_duplicate_version_is_a_conflict() {
    let db = TestDb::new().await;
    let payment = PaymentCaptured {
        payment_id: Uuid::now_v7(),
        payment_version: 7,
        order_id: Uuid::now_v7(),
        amount: Money {
            amount_minor: 100,
            currency: "EUR".into(),
        },
        card_last4: "4242".into(),
    };
    let mut tx = db.pool.begin().await.unwrap();
    let emitted = db.outbox.emit(&mut tx, &payment).await.unwrap();
    assert_eq!(emitted.aggregate_version, 7);
    tx.commit().await.unwrap();

    let mut tx = db.pool.begin().await.unwrap();
    let error = db.outbox.emit(&mut tx, &payment).await.unwrap_err();
    assert!(
        matches!(&error, EmitError::VersionConflict { aggregate_type, aggregate_version: 7, .. } if aggregate_type == "payment"),
        "{error}"
    );
    tx.rollback().await.unwrap();
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_aggregate_versions")
            .await,
        0,
        "explicit versions do not touch the counters"
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn emit_all_writes_a_batch_in_order_with_per_aggregate_versions() {
    let db = TestDb::new().await;
    let a = Uuid::now_v7();
    let b = Uuid::now_v7();
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox.emit(&mut tx, &order(a)).await.unwrap();
    let shipped = |order_id| OrderShipped {
        order_id,
        carrier: "DHL".into(),
        tracking_number: None,
        shipped_at: chrono::Utc::now(),
    };
    let drafts = vec![
        EventDraft::new(&shipped(a)).unwrap(),
        EventDraft::new(&order(b)).unwrap(),
        EventDraft::new(&shipped(b)).unwrap(),
        EventDraft::new(&shipped(a)).unwrap(),
    ];
    let ids: Vec<Uuid> = drafts.iter().map(EventDraft::event_id).collect();
    let emitted = db.outbox.emit_drafts(&mut tx, drafts).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(emitted.iter().map(|e| e.event_id).collect::<Vec<_>>(), ids);
    assert_eq!(
        emitted
            .iter()
            .map(|e| e.aggregate_version)
            .collect::<Vec<_>>(),
        vec![2, 1, 2, 3]
    );
    let mut tx = db.pool.begin().await.unwrap();
    let more = db
        .outbox
        .emit_all(&mut tx, &[order(a), order(b)])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        more.iter().map(|e| e.aggregate_version).collect::<Vec<_>>(),
        vec![4, 3]
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn idempotency_key_turns_a_retried_command_into_a_no_op() {
    let db = Arc::new(TestDb::new().await);
    let id = Uuid::now_v7();
    let options = || EmitOptions {
        idempotency_key: Some(format!("create-order:{id}")),
        ..EmitOptions::default()
    };
    let mut tx = db.pool.begin().await.unwrap();
    let first = db
        .outbox
        .emit_with(&mut tx, &order(id), options())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let EmitOutcome::Emitted(first) = first else {
        panic!("first emit must write");
    };

    let mut tx = db.pool.begin().await.unwrap();
    let again = db
        .outbox
        .emit_with(&mut tx, &order(id), options())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        again,
        EmitOutcome::Duplicate {
            original_event_id: first.event_id
        }
    );
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events")
            .await,
        1
    );
    assert_eq!(
        db.scalar::<i64>("SELECT max(version) FROM {s}.outbox_aggregate_versions")
            .await,
        1
    );

    // Two retries racing with a new key: exactly one writes.
    let racing_key = format!("create-order:{}", Uuid::now_v7());
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let db = Arc::clone(&db);
        let key = racing_key.clone();
        tasks.push(tokio::spawn(async move {
            let mut tx = db.pool.begin().await.unwrap();
            let outcome = db
                .outbox
                .emit_with(
                    &mut tx,
                    &order(Uuid::now_v7()),
                    EmitOptions {
                        idempotency_key: Some(key),
                        ..EmitOptions::default()
                    },
                )
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
            tx.commit().await.unwrap();
            outcome
        }));
    }
    let mut written = 0;
    for task in tasks {
        if matches!(task.await.unwrap(), EmitOutcome::Emitted(_)) {
            written += 1;
        }
    }
    assert_eq!(written, 1);
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events")
            .await,
        2
    );
}

#[tokio::test]
async fn notify_is_sent_once_per_committed_transaction_while_a_relay_waits() {
    let db = TestDb::new().await;
    let mut listener = PgListener::connect_with(&db.pool).await.unwrap();
    listener.listen(db.outbox.notify_channel()).await.unwrap();

    // Nobody waits: no notification at all.
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox
        .emit(&mut tx, &order(Uuid::now_v7()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let silent = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(silent.is_err(), "no relay waits, so no NOTIFY");

    db.execute("INSERT INTO {s}.outbox_relay_listeners (relay_id, waiting) VALUES (gen_random_uuid(), true)")
        .await;
    // A transaction with many events: one notification.
    let mut tx = db.pool.begin().await.unwrap();
    let orders: Vec<OrderCreated> = (0..10).map(|_| order(Uuid::now_v7())).collect();
    db.outbox.emit_all(&mut tx, &orders).await.unwrap();
    db.outbox
        .emit(&mut tx, &order(Uuid::now_v7()))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .expect("a notification")
        .unwrap();
    assert_eq!(first.channel(), db.outbox.notify_channel());
    assert!(
        tokio::time::timeout(Duration::from_millis(300), listener.recv())
            .await
            .is_err(),
        "one notification per transaction"
    );

    // A rolled back transaction notifies nobody.
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox
        .emit(&mut tx, &order(Uuid::now_v7()))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), listener.recv())
            .await
            .is_err()
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn migrations_run_twice_and_concurrently() {
    let db = TestDb::new().await;
    db.outbox
        .migrate(&db.pool)
        .await
        .expect("second run is a no-op");

    let schema = SchemaName::new(format!("{}_c", db.schema)).unwrap();
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let pool = db.pool.clone();
        let schema = schema.clone();
        tasks.push(tokio::spawn(async move {
            outbox_postgres::migrate(&pool, &schema).await
        }));
    }
    for task in tasks {
        task.await.unwrap().expect("concurrent migration");
    }
    let tables: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name LIKE 'outbox_%'",
    )
    .bind(schema.as_str())
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(tables, 14, "the 13 outbox tables plus outbox_migrations");
    let applied: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(*) FROM {}.outbox_migrations",
        schema.quoted()
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(applied, outbox_postgres::migrations().len() as i64);
    sqlx::query(AssertSqlSafe(format!(
        "DROP SCHEMA {} CASCADE",
        schema.quoted()
    )))
    .execute(&db.pool)
    .await
    .unwrap();
    db.drop_schema().await;
}
