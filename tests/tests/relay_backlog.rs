//! Article test 8: a backlog of a million events drains completely, and the
//! claim stays cheap however much published history the table holds: its
//! plan walks the partial index of pending rows, and the buffers it touches
//! after a million published rows (vacuumed) stay within a small factor of
//! those it touched with an empty history. Timings are printed, not
//! asserted.

use std::time::{Duration, Instant};

use outbox_core::relay::{Relay, RelayConfig};
use outbox_postgres::PgRelayStore;
use outbox_tests::transports::DiscardTransport;
use outbox_tests::{TestDb, wait};
use serde_json::Value;

const AGGREGATES: i64 = 1_000;
const PER_AGGREGATE: i64 = 1_000;

/// Inserts versions `from..=to` of every aggregate with ids that sort like
/// UUID v7 ids of events emitted in that order.
async fn insert_backlog(db: &TestDb, from: i64, to: i64) {
    db.execute(&format!(
        "INSERT INTO {{s}}.outbox_events (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
         SELECT (lpad(to_hex(v * {AGGREGATES} + a), 12, '0') || '70008000000000000000')::uuid,
                'counter', 'c' || a, v, 'counter.ticked', 1,
                jsonb_build_object('counter', 'c' || a, 'tick', v, 'note', 'backlog')
         FROM generate_series({from}, {to}) AS v, generate_series(0, {AGGREGATES} - 1) AS a"
    ))
    .await;
}

/// (execution ms, shared buffers hit + read, uses the pending index)
fn summarize(plan: &Value) -> (f64, i64, bool) {
    let root = &plan[0];
    let text = root.to_string();
    fn buffers(node: &Value) -> i64 {
        node["Shared Hit Blocks"].as_i64().unwrap_or(0)
            + node["Shared Read Blocks"].as_i64().unwrap_or(0)
    }
    (
        root["Execution Time"].as_f64().unwrap_or(f64::NAN),
        buffers(&root["Plan"]),
        text.contains("outbox_events_pending_idx"),
    )
}

#[tokio::test]
async fn article_test_8_a_million_event_backlog_drains_and_the_claim_does_not_grow_with_history() {
    let db = TestDb::new().await;
    let started = Instant::now();
    insert_backlog(&db, 1, PER_AGGREGATE).await;
    db.execute("ANALYZE {s}.outbox_events").await;
    println!(
        "inserted {} rows in {:?}",
        AGGREGATES * PER_AGGREGATE,
        started.elapsed()
    );

    let config = RelayConfig {
        batch_size: 1000,
        poll_interval: Duration::from_millis(100),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    };
    let store = PgRelayStore::new(
        db.pool.clone(),
        db.schema.clone(),
        config.failed_head_policy,
        config.claim_timeout,
    );
    let (start_ms, start_buffers, start_index) =
        summarize(&store.explain_claim(1000).await.unwrap().plan);
    println!(
        "claim of 1000 with 1M pending, empty history: {start_ms:.2} ms, {start_buffers} buffers"
    );
    assert!(start_index, "the claim walks the pending index");

    let transport = DiscardTransport::default();
    let relay = Relay::start(store.clone(), transport.clone(), config, "backlog")
        .await
        .unwrap();
    let drain_started = Instant::now();
    // Watch the transport, not the table: a count over the pending index
    // every few milliseconds would compete with the relay.
    wait::until("the backlog drained", Duration::from_secs(900), || async {
        transport.count() as i64 >= AGGREGATES * PER_AGGREGATE
    })
    .await;
    let drained_in = drain_started.elapsed();
    relay.drain(Duration::from_secs(10)).await.unwrap();
    let published = db.published().await;
    assert_eq!(published, AGGREGATES * PER_AGGREGATE);
    assert_eq!(
        transport.count() as i64,
        AGGREGATES * PER_AGGREGATE,
        "each event published once"
    );
    println!(
        "drained {published} events in {drained_in:?} ({:.0} events/s, debug build)",
        published as f64 / drained_in.as_secs_f64()
    );

    // A fresh backlog on top of a million published rows, vacuumed.
    insert_backlog(&db, PER_AGGREGATE + 1, PER_AGGREGATE + 2).await;
    db.execute("VACUUM ANALYZE {s}.outbox_events").await;
    let (end_ms, end_buffers, end_index) =
        summarize(&store.explain_claim(1000).await.unwrap().plan);
    println!("claim of 1000 with 1M published history: {end_ms:.2} ms, {end_buffers} buffers");
    assert!(end_index, "the claim still walks the pending index");
    assert!(
        end_buffers <= start_buffers * 2 + 100,
        "claim buffers grew with history: {start_buffers} → {end_buffers}"
    );
    db.drop_schema().await;
}
