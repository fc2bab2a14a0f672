//! The relay's edges where events could be reordered, stranded or never
//! woken: carried versions written out of order, schemas whose names make
//! the NOTIFY channel too long, blocked aggregates whose head was fixed by
//! hand or whose policy changed, the claim plan on a backlog built faster
//! than statistics, what `explain_claim` shows, and what the batch
//! duration measures. Real PostgreSQL; a recording transport.

use std::time::{Duration, Instant};

use outbox_core::relay::{
    Backoff, FailedHeadPolicy, OutboxStats, Relay, RelayConfig, RelayStore, StoreError,
};
use outbox_core::transport::PublishFailure;
use outbox_core::{EmitError, Envelope, EventDraft, metrics as m};
use outbox_postgres::{ClaimVariant, PgRelayStore};
use outbox_tests::events::{PieceMoved, Ticked, emit_ticks};
use outbox_tests::transports::{RecordingTransport, versions_by_aggregate};
use outbox_tests::{TestDb, metrics, wait};

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

/// Relays everything with `config` and returns what the transport got.
async fn relay_all(db: &TestDb, config: RelayConfig, total: i64) -> Vec<Envelope> {
    let transport = RecordingTransport::new();
    let relay = Relay::start(store(db, &config), transport.clone(), config, "test")
        .await
        .unwrap();
    wait::until("every event published", Duration::from_secs(60), || async {
        count(db, "published").await == total
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    transport.published()
}

#[tokio::test]
async fn carried_versions_emitted_in_descending_order_are_published_ascending() {
    for batch_size in [1, 2, 1000] {
        let db = TestDb::new().await;
        // One transaction emits versions 8, 7, ..., 1 of three pieces
        // (an unsorted emit_all), interleaved with counter events.
        let mut tx = db.pool.begin().await.unwrap();
        let mut drafts = Vec::new();
        for version in (1..=8).rev() {
            for piece in ["rook", "knight", "pawn"] {
                drafts.push(EventDraft::new(&PieceMoved::new(piece, version)).unwrap());
            }
            drafts.push(EventDraft::new(&Ticked::new("clock", 9 - version as u64)).unwrap());
        }
        let emitted = db.outbox.emit_drafts(&mut tx, drafts).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(emitted[0].aggregate_version, 8, "results in input order");

        let config = RelayConfig {
            batch_size,
            ..fast_config()
        };
        let published = relay_all(&db, config, 32).await;
        let by_aggregate = versions_by_aggregate(&published);
        for piece in ["rook", "knight", "pawn", "clock"] {
            assert_eq!(
                by_aggregate[piece],
                (1..=8).collect::<Vec<i64>>(),
                "order of {piece} at batch size {batch_size}"
            );
        }
        db.drop_schema().await;
    }
}

#[tokio::test]
async fn a_carried_version_below_an_unpublished_one_is_refused_and_writes_nothing() {
    let db = TestDb::new().await;
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox
        .emit(&mut tx, &PieceMoved::new("queen", 7))
        .await
        .unwrap();
    let error = db
        .outbox
        .emit(&mut tx, &PieceMoved::new("queen", 6))
        .await
        .unwrap_err();
    assert!(
        matches!(
            &error,
            EmitError::VersionOutOfOrder { aggregate_id, aggregate_version: 6, newer_version: 7, .. }
                if aggregate_id == "queen"
        ),
        "{error}"
    );
    assert!(error.to_string().contains("ascending order"), "{error}");
    // The transaction is still usable: the refused emit wrote nothing.
    db.outbox
        .emit(&mut tx, &PieceMoved::new("queen", 8))
        .await
        .unwrap();
    // A batch with one carried version behind an unpublished one writes
    // nothing at all, its counter events included.
    let error = db
        .outbox
        .emit_drafts(
            &mut tx,
            vec![
                EventDraft::new(&Ticked::new("clock", 1)).unwrap(),
                EventDraft::new(&PieceMoved::new("queen", 5)).unwrap(),
            ],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            &error,
            EmitError::VersionOutOfOrder {
                aggregate_version: 5,
                newer_version: 8,
                ..
            }
        ),
        "{error}"
    );
    // With an idempotency key, the key is not used up by the refusal.
    let options = || outbox_core::EmitOptions {
        idempotency_key: Some("move-queen-4".into()),
        ..Default::default()
    };
    let error = db
        .outbox
        .emit_with(&mut tx, &PieceMoved::new("queen", 4), options())
        .await
        .unwrap_err();
    assert!(
        matches!(error, EmitError::VersionOutOfOrder { .. }),
        "{error}"
    );
    tx.commit().await.unwrap();
    let versions: Vec<i64> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT aggregate_version FROM {} ORDER BY seq",
        db.table("outbox_events")
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(versions, vec![7, 8]);
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_aggregate_versions")
            .await,
        0,
        "the refused batch bumped no counter"
    );
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_idempotency_keys")
            .await,
        0
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn a_63_byte_schema_gets_a_channel_that_fits_and_wakes_a_waiting_relay() {
    let db = TestDb::with_schema_name_length(63).await;
    assert_eq!(db.schema.as_str().len(), 63);
    let channel = db.outbox.notify_channel().to_owned();
    assert!(channel.len() <= 63, "{channel}");
    let transport = RecordingTransport::new();
    let config = RelayConfig {
        poll_interval: Duration::from_secs(600),
        ..fast_config()
    };
    let relay = Relay::start(store(&db, &config), transport.clone(), config, "test")
        .await
        .unwrap();
    wait::until("relay waiting", Duration::from_secs(10), || async {
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_relay_listeners WHERE waiting")
            .await
            == 1
    })
    .await;
    // Emits while the relay waits: each sends a NOTIFY on the channel.
    for tick in 1..=3 {
        let mut tx = db.pool.begin().await.unwrap();
        db.outbox
            .emit(&mut tx, &Ticked::new("long", tick))
            .await
            .unwrap_or_else(|e| panic!("emit with a 63-byte schema while a relay waits: {e}"));
        tx.commit().await.unwrap();
    }
    wait::until(
        "the events published by a woken relay (poll interval 600 s)",
        Duration::from_secs(20),
        || async { transport.published_count() == 3 },
    )
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    db.drop_schema().await;
}

/// A head that fails for good under `Block`, then is set right by hand.
async fn failed_head(db: &TestDb) -> uuid::Uuid {
    emit_ticks(&db.pool, &db.outbox, 1, 3, 100).await;
    let transport = RecordingTransport::failing(|e: &Envelope| {
        (e.aggregate_version == 1).then(|| PublishFailure::permanent("refused for good"))
    });
    let config = fast_config();
    let relay = Relay::start(store(db, &config), transport.clone(), config, "test")
        .await
        .unwrap();
    wait::until("the head failed", Duration::from_secs(20), || async {
        count(db, "failed").await == 1
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    assert_eq!(transport.published_count(), 0, "the head blocks the rest");
    db.scalar("SELECT head_event_id FROM {s}.outbox_blocked_aggregates")
        .await
}

#[tokio::test]
async fn a_blocked_aggregate_whose_head_was_fixed_by_hand_continues() {
    let db = TestDb::new().await;
    let head = failed_head(&db).await;
    // An operator published the head by other means and marked it so.
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {} SET status = 'published', published_at = now() WHERE id = $1",
        db.table("outbox_events")
    )))
    .bind(head)
    .execute(&db.pool)
    .await
    .unwrap();
    let store = store(&db, &fast_config());
    assert_eq!(
        store.stats().await.unwrap().blocked_aggregates,
        0,
        "a fixed head blocks nothing"
    );
    let published = relay_all(&db, fast_config(), 3).await;
    assert_eq!(versions_by_aggregate(&published)["c0"], vec![2, 3]);
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_blocked_aggregates")
            .await,
        0,
        "the stale blocked row is gone"
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn switching_to_skip_releases_heads_that_already_failed() {
    let db = TestDb::new().await;
    failed_head(&db).await;
    let config = RelayConfig {
        failed_head_policy: FailedHeadPolicy::Skip,
        ..fast_config()
    };
    let skip_store = store(&db, &config);
    assert_eq!(skip_store.stats().await.unwrap().blocked_aggregates, 0);
    assert!(skip_store.blocked_aggregates(10).await.unwrap().is_empty());
    let transport = RecordingTransport::new();
    let relay = Relay::start(skip_store, transport.clone(), config, "test")
        .await
        .unwrap();
    wait::until(
        "the later versions published",
        Duration::from_secs(20),
        || async { transport.published_count() == 2 },
    )
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        versions_by_aggregate(&transport.published())["c0"],
        vec![2, 3]
    );
    assert_eq!(count(&db, "failed").await, 1, "the head stays inspectable");
    db.drop_schema().await;
}

#[tokio::test]
async fn the_claim_walks_the_pending_index_right_after_a_backlog_arrives() {
    let db = TestDb::new().await;
    // 200k rows inserted at once into a table PostgreSQL has never
    // analyzed: the statistics still say "empty".
    db.execute(
        "INSERT INTO {s}.outbox_events (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
         SELECT gen_random_uuid(), 'counter', 'c' || (g % 1000), g / 1000 + 1, 'counter.ticked', 1,
                json_build_object('counter', 'c' || (g % 1000), 'tick', g, 'note', 'backlog')
         FROM generate_series(0, 199999) AS g",
    )
    .await;
    let store = store(&db, &fast_config());
    for _ in 0..3 {
        let explained = store.explain_claim(500).await.unwrap();
        assert_eq!(explained.variant, ClaimVariant::Alone);
        let plan = explained.plan.to_string();
        assert!(
            !explained.scans_outbox_sequentially(),
            "the claim reads every pending row: {plan}"
        );
        assert!(
            plan.contains("outbox_events_pending_idx"),
            "the claim does not use the pending index: {plan}"
        );
        assert!(
            explained.pending_index_rows() <= 4 * 500,
            "the claim read {} rows of the pending index for a batch of 500: {plan}",
            explained.pending_index_rows()
        );
        println!(
            "claim of 500 over a fresh 200k backlog: {:.2} ms",
            explained.execution_ms().unwrap()
        );
    }
    db.drop_schema().await;
}

#[tokio::test]
async fn explain_claim_shows_the_claim_the_live_workers_run() {
    let db = TestDb::new().await;
    emit_ticks(&db.pool, &db.outbox, 3, 2, 100).await;
    let config = fast_config();
    let store = store(&db, &config);
    let explained = store.explain_claim(10).await.unwrap();
    assert_eq!(explained.variant, ClaimVariant::Alone, "no live worker");
    assert!(!explained.sql.contains("pg_try_advisory_xact_lock"));
    // Two workers heartbeating: the relay runs the shared claim.
    for worker in [uuid::Uuid::now_v7(), uuid::Uuid::now_v7()] {
        store.heartbeat(worker, true).await.unwrap();
    }
    let explained = store.explain_claim(10).await.unwrap();
    assert_eq!(explained.variant, ClaimVariant::Shared);
    assert!(explained.sql.contains("pg_try_advisory_xact_lock"));
    assert_eq!(count(&db, "pending").await, 6, "explaining claims nothing");
    db.drop_schema().await;
}

/// The PostgreSQL store with something done before each claim.
struct HookedClaims {
    inner: PgRelayStore,
    hook: ClaimHook,
}

/// What [`HookedClaims`] does before a claim.
enum ClaimHook {
    /// Waits this long: the claim takes at least as much.
    Delay(Duration),
    /// Records every size asked for; claims of more than `fits` events
    /// are cancelled by a (real) statement timeout, as a claim over a
    /// large backlog on a loaded server would be.
    TimeOutAbove {
        fits: usize,
        asked: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    },
}

impl RelayStore for HookedClaims {
    type Batch = <PgRelayStore as RelayStore>::Batch;
    type Listener = <PgRelayStore as RelayStore>::Listener;

    async fn claim(&self, limit: usize) -> Result<Self::Batch, StoreError> {
        match &self.hook {
            ClaimHook::Delay(delay) => tokio::time::sleep(*delay).await,
            ClaimHook::TimeOutAbove { fits, asked } => {
                asked.lock().unwrap().push(limit);
                if limit > *fits {
                    let mut tx = self.inner.pool().begin().await.unwrap();
                    sqlx::query("SET LOCAL statement_timeout = '10ms'")
                        .execute(&mut *tx)
                        .await
                        .unwrap();
                    let source = sqlx::query("SELECT pg_sleep(5)")
                        .execute(&mut *tx)
                        .await
                        .expect_err("pg_sleep(5) outlives a 10 ms statement timeout");
                    return Err(StoreError {
                        operation: "claim",
                        source,
                    });
                }
            }
        }
        self.inner.claim(limit).await
    }

    fn is_statement_timeout(&self, error: &StoreError) -> bool {
        self.inner.is_statement_timeout(error)
    }

    async fn heartbeat(&self, worker_id: uuid::Uuid, waiting: bool) -> Result<(), StoreError> {
        self.inner.heartbeat(worker_id, waiting).await
    }

    async fn deregister(&self, relay_id: uuid::Uuid) -> Result<(), StoreError> {
        self.inner.deregister(relay_id).await
    }

    async fn listener(&self) -> Result<Self::Listener, StoreError> {
        self.inner.listener().await
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        self.inner.stats().await
    }
}

#[tokio::test]
async fn the_batch_duration_includes_the_claim() {
    metrics::install();
    let db = TestDb::new().await;
    emit_ticks(&db.pool, &db.outbox, 1, 1, 100).await;
    let config = fast_config();
    let slow = HookedClaims {
        inner: store(&db, &config),
        hook: ClaimHook::Delay(Duration::from_millis(300)),
    };
    let label = db.schema.as_str().to_owned();
    let transport = RecordingTransport::new();
    let started = Instant::now();
    let relay = Relay::start(slow, transport.clone(), config, &label)
        .await
        .unwrap();
    wait::until("published", Duration::from_secs(10), || async {
        transport.published_count() == 1
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    let durations = metrics::histogram(m::BATCH_DURATION, &[("schema", &label)]);
    assert!(!durations.is_empty(), "a batch duration was recorded");
    assert!(
        durations.iter().all(|&d| d >= 0.3),
        "every batch took its 300 ms claim: {durations:?} (run took {:?})",
        started.elapsed()
    );
    db.drop_schema().await;
}

/// Fields in an order serde keeps and jsonb would not (jsonb sorts keys by
/// length, then bytes) and a number jsonb would re-render.
#[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, outbox_core::OutboxEvent)]
#[outbox(event_type = "text.kept", aggregate = "text", version = 1)]
struct TextKept {
    zebra: String,
    #[outbox(aggregate_id)]
    id: String,
    amount: f64,
    a: u8,
}

#[tokio::test]
async fn the_payload_reaches_the_transport_byte_for_byte_as_serde_wrote_it() {
    let db = TestDb::new().await;
    let event = TextKept {
        zebra: "first".into(),
        id: "t1".into(),
        amount: 1.50,
        a: 7,
    };
    let written = serde_json::to_string(&event).unwrap();
    assert_eq!(written, r#"{"zebra":"first","id":"t1","amount":1.5,"a":7}"#);
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox.emit(&mut tx, &event).await.unwrap();
    tx.commit().await.unwrap();
    let published = relay_all(&db, fast_config(), 1).await;
    assert_eq!(published[0].payload.get(), written);
    db.drop_schema().await;
}

#[tokio::test]
async fn a_claim_stuck_behind_a_table_lock_times_out_and_the_relay_goes_on_after_it() {
    let db = TestDb::new().await;
    emit_ticks(&db.pool, &db.outbox, 1, 20, 20).await;
    let config = RelayConfig {
        statement_timeout: Duration::from_millis(300),
        error_backoff: Duration::from_millis(100),
        ..fast_config()
    };
    // A migration (say) holds the outbox table.
    let mut locker = db.pool.begin().await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {} IN ACCESS EXCLUSIVE MODE",
        db.table("outbox_events")
    )))
    .execute(&mut *locker)
    .await
    .unwrap();

    // A claim fails with PostgreSQL's statement timeout instead of waiting.
    let lone = store(&db, &config).with_statement_timeout(config.statement_timeout);
    let error = match tokio::time::timeout(Duration::from_secs(20), lone.claim(100))
        .await
        .expect("the claim returns while the table is locked")
    {
        Ok(_) => panic!("a claim succeeded behind an exclusive lock"),
        Err(error) => error,
    };
    assert!(
        format!("{error:?}").contains("statement timeout"),
        "the error names the timeout: {error:?}"
    );

    // A relay started meanwhile retries after its backoff and publishes
    // everything, in order, once the lock is gone.
    metrics::install();
    let errors_before = metrics::counter(m::STORE_ERRORS, &[("schema", "locked-claim")]);
    let transport = RecordingTransport::new();
    let relay = Relay::start(
        store(&db, &config).with_statement_timeout(config.statement_timeout),
        transport.clone(),
        config,
        "locked-claim",
    )
    .await
    .unwrap();
    wait::until(
        "the relay's claims time out",
        Duration::from_secs(20),
        || async {
            metrics::counter(m::STORE_ERRORS, &[("schema", "locked-claim")]) >= errors_before + 2
        },
    )
    .await;
    assert!(
        transport.published().is_empty(),
        "nothing published behind the lock"
    );
    locker.rollback().await.unwrap();
    wait::until("every event published", Duration::from_secs(20), || async {
        count(&db, "published").await == 20
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    assert_eq!(
        versions_by_aggregate(&transport.published())["c0"],
        (1..=20).collect::<Vec<i64>>()
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn a_claim_cancelled_by_the_statement_timeout_is_retried_smaller_and_grows_back() {
    let db = TestDb::new().await;
    emit_ticks(&db.pool, &db.outbox, 4, 100, 100).await;
    let config = RelayConfig {
        batch_size: 100,
        error_backoff: Duration::from_millis(20),
        ..fast_config()
    };
    let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let store = HookedClaims {
        inner: store(&db, &config),
        hook: ClaimHook::TimeOutAbove {
            fits: 25,
            asked: std::sync::Arc::clone(&asked),
        },
    };
    let transport = RecordingTransport::new();
    let relay = Relay::start(store, transport.clone(), config, "shrinking-claims")
        .await
        .unwrap();
    wait::until("every event published", Duration::from_secs(30), || async {
        count(&db, "published").await == 400
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    let asked = asked.lock().unwrap().clone();
    // Full size, cancelled; half, cancelled; a quarter goes through.
    assert_eq!(&asked[..3], &[100, 50, 25], "sizes asked: {asked:?}");
    // After a run of good claims it tries twice as many again (and shrinks
    // again when that is cancelled): it never stays small for good.
    assert!(
        asked[3..].contains(&50),
        "the claim size never grew back: {asked:?}"
    );
    let by_aggregate = versions_by_aggregate(&transport.published());
    for versions in by_aggregate.values() {
        assert_eq!(versions, &(1..=100).collect::<Vec<i64>>());
    }
    db.drop_schema().await;
}
