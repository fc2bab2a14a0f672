//! The relay's database side against a real PostgreSQL: claims, per-aggregate
//! order across workers, retries with backoff, the failed state and what it
//! blocks (article test 7), NOTIFY wake-ups, backlog figures, retention,
//! and configuration errors. The broker side is a recording transport here;
//! `relay_nats.rs` runs the same paths against JetStream.

use std::time::Duration;

use outbox_core::Envelope;
use outbox_core::relay::retention::RetentionConfig;
use outbox_core::relay::{Backoff, FailedHeadPolicy, Relay, RelayConfig, RelayStore};
use outbox_core::transport::PublishFailure;
use outbox_postgres::PgRelayStore;
use outbox_tests::events::{Ticked, emit_ticks};
use outbox_tests::transports::{RecordingTransport, versions_by_aggregate};
use outbox_tests::{TestDb, wait};

fn fast_config() -> RelayConfig {
    RelayConfig {
        batch_size: 100,
        poll_interval: Duration::from_millis(50),
        backoff: Backoff {
            initial: Duration::from_millis(30),
            max: Duration::from_millis(200),
            multiplier: 2.0,
            jitter: 0.1,
        },
        publish_timeout: Duration::from_secs(5),
        claim_timeout: Duration::from_secs(30),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    }
}

fn store(db: &TestDb, config: &RelayConfig) -> PgRelayStore {
    PgRelayStore::new(
        db.pool.clone(),
        db.schema.clone(),
        config.failed_head_policy,
        config.claim_timeout,
    )
}

async fn count(db: &TestDb, status: &str) -> i64 {
    db.scalar(&format!(
        "SELECT count(*) FROM {{s}}.outbox_events WHERE status = '{status}'"
    ))
    .await
}

#[tokio::test]
async fn publishes_everything_once_in_version_order_with_several_workers() {
    let db = TestDb::with_pool_size(16).await;
    let total = emit_ticks(&db.pool, &db.outbox, 50, 20, 250).await;
    let transport = RecordingTransport::new();
    let config = RelayConfig {
        workers: 4,
        batch_size: 37,
        ..fast_config()
    };
    let relay = Relay::start(store(&db, &config), transport.clone(), config, "test")
        .await
        .unwrap();
    wait::until("every event published", Duration::from_secs(60), || async {
        count(&db, "published").await == total as i64
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();

    let published = transport.published();
    assert_eq!(published.len(), total, "each event exactly once");
    for (aggregate, versions) in versions_by_aggregate(&published) {
        assert_eq!(
            versions,
            (1..=20).collect::<Vec<_>>(),
            "order of {aggregate}"
        );
    }
    let attempts: i64 = db
        .scalar("SELECT sum(attempt_count) FROM {s}.outbox_events")
        .await;
    assert_eq!(attempts, total as i64);
    let unpublished_at: i64 = db
        .scalar("SELECT count(*) FROM {s}.outbox_events WHERE published_at IS NULL")
        .await;
    assert_eq!(unpublished_at, 0);
    db.drop_schema().await;
}

#[tokio::test]
async fn article_test_7_a_poison_event_retries_then_fails_and_blocks_only_its_aggregate() {
    let db = TestDb::new().await;
    emit_ticks(&db.pool, &db.outbox, 5, 4, 100).await;
    // Counter c2's second tick can never be published.
    let poison = |e: &Envelope| {
        (e.aggregate_id == "c2" && e.aggregate_version == 2)
            .then(|| PublishFailure::retryable("broker refuses c2 v2"))
    };
    let transport = RecordingTransport::failing(poison);
    let config = RelayConfig {
        max_attempts: 4,
        ..fast_config()
    };
    let relay = Relay::start(
        store(&db, &config),
        transport.clone(),
        config.clone(),
        "test",
    )
    .await
    .unwrap();

    // Other aggregates flow while c2's head retries.
    wait::until(
        "other aggregates published",
        Duration::from_secs(30),
        || async { count(&db, "published").await == 4 * 4 + 1 },
    )
    .await;
    wait::until(
        "the poison event failed",
        Duration::from_secs(30),
        || async { count(&db, "failed").await == 1 },
    )
    .await;
    // Later events of its own aggregate wait, untouched.
    let waiting: Vec<(i64, i32, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT aggregate_version, attempt_count, status FROM {} WHERE aggregate_id = 'c2' ORDER BY aggregate_version",
        db.table("outbox_events")
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        waiting,
        vec![
            (1, 1, "published".to_owned()),
            (2, 4, "failed".to_owned()),
            (3, 0, "pending".to_owned()),
            (4, 0, "pending".to_owned())
        ]
    );
    let last_error: String = db
        .scalar("SELECT last_error FROM {s}.outbox_events WHERE status = 'failed'")
        .await;
    assert!(last_error.contains("broker refuses c2 v2"), "{last_error}");
    assert_eq!(
        transport.attempts() as usize,
        4 * 4 + 1 + 4,
        "four attempts for the poison event, one for each other"
    );

    // The backlog signal shows the blocked aggregate and the failed event.
    let relay_store = store(&db, &config);
    let blocked = relay_store.blocked_aggregates(10).await.unwrap();
    assert_eq!(blocked.len(), 1);
    assert_eq!(blocked[0].aggregate_id, "c2");
    assert_eq!(blocked[0].head_status, "failed");
    let stats = relay_store.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.failed, stats.blocked_aggregates),
        (2, 1, 1)
    );
    assert!(stats.oldest_pending_at.is_some());
    relay.drain(Duration::from_secs(10)).await.unwrap();
    db.drop_schema().await;
}

#[tokio::test]
async fn skip_policy_lets_later_events_pass_a_failed_head() {
    let db = TestDb::new().await;
    emit_ticks(&db.pool, &db.outbox, 2, 3, 100).await;
    let transport = RecordingTransport::failing(|e: &Envelope| {
        (e.aggregate_id == "c0" && e.aggregate_version == 1)
            .then(|| PublishFailure::permanent("too large"))
    });
    let config = RelayConfig {
        failed_head_policy: FailedHeadPolicy::Skip,
        ..fast_config()
    };
    let relay = Relay::start(store(&db, &config), transport.clone(), config, "test")
        .await
        .unwrap();
    wait::until(
        "all but the failed head published",
        Duration::from_secs(30),
        || async { count(&db, "published").await == 5 },
    )
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    assert_eq!(count(&db, "failed").await, 1);
    let attempts: i32 = db
        .scalar("SELECT attempt_count FROM {s}.outbox_events WHERE status = 'failed'")
        .await;
    assert_eq!(attempts, 1, "a permanent failure is not retried");
    let c0: Vec<i64> = versions_by_aggregate(&transport.published())["c0"].clone();
    assert_eq!(c0, vec![2, 3]);
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_blocked_aggregates")
            .await,
        0
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn a_retrying_head_recovers_and_its_aggregate_continues_in_order() {
    let db = TestDb::new().await;
    emit_ticks(&db.pool, &db.outbox, 1, 3, 100).await;
    let refusals = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let counter = std::sync::Arc::clone(&refusals);
    let transport = RecordingTransport::failing(move |e: &Envelope| {
        (e.aggregate_version == 1 && counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2)
            .then(|| PublishFailure::retryable("timeout"))
    });
    let config = fast_config();
    let relay = Relay::start(store(&db, &config), transport.clone(), config, "test")
        .await
        .unwrap();
    wait::until("all published", Duration::from_secs(30), || async {
        count(&db, "published").await == 3
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        versions_by_aggregate(&transport.published())["c0"],
        vec![1, 2, 3]
    );
    let head_attempts: i32 = db
        .scalar("SELECT attempt_count FROM {s}.outbox_events WHERE aggregate_version = 1")
        .await;
    assert_eq!(head_attempts, 3);
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_blocked_aggregates")
            .await,
        0
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn claims_skip_aggregates_another_worker_holds_and_only_take_heads() {
    let db = TestDb::new().await;
    emit_ticks(&db.pool, &db.outbox, 3, 3, 100).await;
    let config = fast_config();
    let store = store(&db, &config);
    use outbox_core::relay::ClaimedBatch;
    // Worker A holds two events of c0 (a prefix), and nothing else.
    let first = store.claim(2).await.unwrap();
    let held: Vec<(String, i64)> = first
        .events()
        .iter()
        .map(|e| {
            (
                e.envelope.aggregate_id.clone(),
                e.envelope.aggregate_version,
            )
        })
        .collect();
    assert_eq!(held, vec![("c0".to_owned(), 1), ("c1".to_owned(), 1)]);
    // Worker B skips c0 and c1 entirely, even their later versions.
    let second = store.claim(100).await.unwrap();
    let taken: Vec<(String, i64)> = second
        .events()
        .iter()
        .map(|e| {
            (
                e.envelope.aggregate_id.clone(),
                e.envelope.aggregate_version,
            )
        })
        .collect();
    assert_eq!(
        taken,
        vec![
            ("c2".to_owned(), 1),
            ("c2".to_owned(), 2),
            ("c2".to_owned(), 3)
        ]
    );
    second.release().await.unwrap();
    first.release().await.unwrap();
    // Released claims are claimable again at once.
    let third = store.claim(100).await.unwrap();
    assert_eq!(third.events().len(), 9);
    third.release().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test]
async fn insertion_order_wins_over_producer_clocks() {
    // Two producers with skewed clocks: version 1 got a UUID v7 from a
    // clock that runs ahead, version 2 one from a clock that lags, so the
    // ids sort backwards. The relay follows insertion (commit) order.
    let db = TestDb::new().await;
    let payload = serde_json::json!({"counter": "skewed", "tick": 1, "note": ""});
    for (version, id) in [
        (1, "01ffffff-ffff-7fff-bfff-ffffffffffff"),
        (2, "01000000-0000-7000-8000-000000000000"),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
             VALUES ($1::uuid, 'counter', 'skewed', $2, 'counter.ticked', 1, $3)",
            db.table("outbox_events")
        )))
        .bind(id)
        .bind(version as i64)
        .bind(&payload)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    let config = RelayConfig {
        batch_size: 1,
        ..fast_config()
    };
    let transport = RecordingTransport::new();
    let relay = Relay::start(store(&db, &config), transport.clone(), config, "test")
        .await
        .unwrap();
    wait::until("both published", Duration::from_secs(20), || async {
        transport.published_count() == 2
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        versions_by_aggregate(&transport.published())["skewed"],
        vec![1, 2]
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn notify_wakes_a_sleeping_relay_long_before_its_poll_interval() {
    let db = TestDb::new().await;
    let transport = RecordingTransport::new();
    let config = RelayConfig {
        poll_interval: Duration::from_secs(600),
        ..fast_config()
    };
    let relay = Relay::start(store(&db, &config), transport.clone(), config, "test")
        .await
        .unwrap();
    // Let it go to sleep (announce itself as waiting).
    wait::until("relay waiting", Duration::from_secs(10), || async {
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_relay_listeners WHERE waiting")
            .await
            == 1
    })
    .await;
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox
        .emit(&mut tx, &Ticked::new("woken", 1))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    wait::until(
        "the event published by a woken relay",
        Duration::from_secs(10),
        || async { transport.published_count() == 1 },
    )
    .await;
    // Busy relays clear the flag; after the work it sleeps again.
    relay.drain(Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_relay_listeners")
            .await,
        0,
        "a stopped relay deregisters"
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn retention_deletes_old_published_rows_in_batches_and_nothing_else() {
    let db = TestDb::new().await;
    emit_ticks(&db.pool, &db.outbox, 10, 30, 300).await;
    // 250 published long ago, 30 published just now, 10 failed, 10 pending.
    db.execute(
        "UPDATE {s}.outbox_events SET status = 'published', published_at = now() - interval '10 days'
         WHERE aggregate_version <= 25",
    )
    .await;
    db.execute(
        "UPDATE {s}.outbox_events SET status = 'published', published_at = now() WHERE aggregate_version IN (26, 27, 28)",
    )
    .await;
    db.execute("UPDATE {s}.outbox_events SET status = 'failed', failed_at = now() - interval '30 days' WHERE aggregate_version = 29")
        .await;
    let config = fast_config();
    let store = store(&db, &config);
    let report = outbox_postgres::retention::run_once(
        &store,
        &RetentionConfig {
            keep_published: Duration::from_secs(7 * 24 * 3600),
            batch_size: 40,
            pause: Duration::from_millis(1),
            ..RetentionConfig::default()
        },
        "test",
    )
    .await
    .unwrap();
    assert_eq!(report.events, 250);
    assert!(report.batches >= 7, "250 rows in batches of 40: {report:?}");
    assert_eq!(count(&db, "published").await, 30);
    assert_eq!(count(&db, "failed").await, 10);
    assert_eq!(count(&db, "pending").await, 10);
    db.drop_schema().await;
}

#[tokio::test]
async fn retention_run_by_hand_with_a_batch_size_of_zero_ends_and_deletes_what_is_due() {
    let db = TestDb::new().await;
    emit_ticks(&db.pool, &db.outbox, 2, 3, 6).await;
    db.execute(
        "UPDATE {s}.outbox_events SET status = 'published', published_at = now() - interval '10 days'",
    )
    .await;
    let config = fast_config();
    let store = store(&db, &config);
    // validate() refuses 0; run_once is called without it and must still
    // end (a LIMIT 0 batch is never "short" of 0) rather than loop.
    let report = tokio::time::timeout(
        Duration::from_secs(30),
        outbox_postgres::retention::run_once(
            &store,
            &RetentionConfig {
                batch_size: 0,
                pause: Duration::from_millis(1),
                ..RetentionConfig::default()
            },
            "test",
        ),
    )
    .await
    .expect("run_once with batch_size 0 did not end")
    .unwrap();
    assert_eq!(report.events, 6);
    assert_eq!(count(&db, "published").await, 0);
    db.drop_schema().await;
}

#[tokio::test]
async fn bad_relay_settings_are_refused_at_start() {
    let db = TestDb::new().await;
    let config = RelayConfig {
        batch_size: 0,
        ..fast_config()
    };
    let error = Relay::start(
        store(&db, &config),
        RecordingTransport::new(),
        config,
        "test",
    )
    .await
    .err()
    .expect("batch size 0 is refused");
    assert!(error.to_string().contains("batch_size"), "{error}");
    db.drop_schema().await;
}
