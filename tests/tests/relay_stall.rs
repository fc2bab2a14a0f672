//! A relay worker stalled right after its claim, before it published
//! anything, past the claim timeout: PostgreSQL ends its session, another
//! relay takes its partitions and publishes the events, and the stalled
//! worker, when it goes on, publishes nothing of its old claim (it would
//! be an old version arriving after newer ones). A failpoint pauses the
//! worker at that window. (Failpoints are global to the process: this file
//! holds one test.)

use std::time::Duration;

use outbox_core::relay::failpoint::{self, AFTER_CLAIM, Action};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_postgres::PgRelayStore;
use outbox_tests::events::emit_ticks;
use outbox_tests::transports::{RecordingTransport, versions_by_aggregate};
use outbox_tests::{TestDb, wait};

fn relay_config() -> RelayConfig {
    RelayConfig {
        batch_size: 10,
        poll_interval: Duration::from_millis(50),
        error_backoff: Duration::from_millis(100),
        publish_timeout: Duration::from_millis(800),
        claim_timeout: Duration::from_millis(1_500),
        lease: Duration::from_secs(2),
        rebalance_interval: Duration::from_millis(100),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    }
}

async fn start(db: &TestDb, transport: RecordingTransport, label: &str) -> Relay {
    let config = relay_config();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect_with(db.pool.connect_options().as_ref().clone())
        .await
        .unwrap();
    let store = PgRelayStore::new(
        pool,
        db.schema.clone(),
        config.failed_head_policy,
        config.claim_timeout,
    )
    .with_partitioning(config.lease, config.rebalance_interval)
    .with_label(label);
    Relay::start(store, transport, config, label).await.unwrap()
}

#[tokio::test]
async fn a_worker_stalled_after_its_claim_past_the_claim_timeout_publishes_nothing_of_it() {
    let db = TestDb::with_pool_size(4).await;
    emit_ticks(&db.pool, &db.outbox, 3, 10, 100).await;
    failpoint::arm(AFTER_CLAIM, Action::Pause, 1);
    let stalled = RecordingTransport::new();
    let first = start(&db, stalled.clone(), "stalled").await;
    wait::until(
        "the first relay stalls with a claim",
        Duration::from_secs(20),
        || async { failpoint::is_paused(AFTER_CLAIM) },
    )
    .await;

    // The second relay gets the partitions once PostgreSQL has ended the
    // stalled claim (its claim timeout), and publishes everything.
    let taking_over = RecordingTransport::new();
    let second = start(&db, taking_over.clone(), "taking-over").await;
    wait::until(
        "the second relay published every event",
        Duration::from_secs(30),
        || async { db.published().await == 30 },
    )
    .await;
    assert_eq!(taking_over.published_count(), 30);

    // The stalled worker goes on: its claim is gone, and it sends nothing.
    failpoint::release(AFTER_CLAIM);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        stalled.attempts(),
        0,
        "the stalled worker published from a claim PostgreSQL had ended: {:?}",
        stalled
            .published()
            .iter()
            .map(|e| (e.aggregate_id.clone(), e.aggregate_version))
            .collect::<Vec<_>>()
    );
    let versions = versions_by_aggregate(&taking_over.published());
    assert_eq!(versions.len(), 3);
    for (aggregate, seen) in &versions {
        assert_eq!(seen, &(1..=10).collect::<Vec<i64>>(), "{aggregate}");
    }
    second.drain(Duration::from_secs(10)).await.unwrap();
    first.drain(Duration::from_secs(10)).await.unwrap();
    failpoint::disarm(AFTER_CLAIM);
    db.drop_schema().await;
}
