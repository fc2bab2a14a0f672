//! The relay over the SQLite store: every event published in aggregate
//! order by several relays on one file, a commit wakes the relay without
//! its poll, a dead worker's lease runs out and its events come back, a
//! late outcome is fenced off, and a failing head backs off, fails and
//! blocks only its own aggregate (or not, under `FailedHeadPolicy::Skip`).
//! A real SQLite file per test; the transport records what it is given.

mod common;

use std::time::{Duration, Instant};

use common::{Noted, Recording, TestDb, wait_for};
use outbox_core::EventDraft;
use outbox_core::relay::{
    Backoff, BatchOutcome, ClaimedBatch, FailedHeadPolicy, RelayConfig, RelayStore,
};
use outbox_sqlite::{SqliteOutbox, SqliteRelayStore};

fn config() -> RelayConfig {
    RelayConfig {
        batch_size: 50,
        workers: 2,
        poll_interval: Duration::from_millis(50),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
            multiplier: 2.0,
            jitter: 0.1,
        },
        publish_timeout: Duration::from_secs(5),
        claim_timeout: Duration::from_secs(30),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    }
}

/// Emits `versions` notes on each of `boards` boards (`b0`, `b1`, ...),
/// interleaved, ten per transaction.
async fn emit_notes(db: &TestDb, boards: usize, versions: usize) {
    let outbox = SqliteOutbox::new();
    let mut drafts = Vec::new();
    for version in 1..=versions {
        for board in 0..boards {
            drafts.push(
                EventDraft::new(&Noted::new(format!("b{board}"), format!("{version}"))).unwrap(),
            );
        }
    }
    let mut rest = drafts.into_iter().peekable();
    while rest.peek().is_some() {
        let chunk: Vec<EventDraft> = rest.by_ref().take(10).collect();
        let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
        outbox.emit_drafts(&mut tx, chunk).await.unwrap();
        tx.commit().await.unwrap();
    }
}

/// Claims up to `limit` events and records them all as published.
async fn publish_claimed(store: &SqliteRelayStore, limit: usize) {
    let claim = store.claim(limit).await.unwrap();
    let ids = claim.events().iter().map(|e| e.envelope.id).collect();
    claim
        .complete(BatchOutcome {
            published: ids,
            failed: vec![],
        })
        .await
        .unwrap();
}

async fn emit_one(db: &TestDb, board: &str) {
    let mut tx = db.pool.begin_with("BEGIN IMMEDIATE").await.unwrap();
    SqliteOutbox::new()
        .emit(&mut tx, &Noted::new(board, "x"))
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_on_one_file_publish_every_event_once_in_aggregate_order() {
    let db = TestDb::new().await;
    let transport = Recording::slow(Duration::from_millis(5));
    let first = outbox_sqlite::start_relay(db.pool.clone(), transport.clone(), config())
        .await
        .unwrap();
    let second = outbox_sqlite::start_relay(db.another_pool().await, transport.clone(), config())
        .await
        .unwrap();
    // Emitted while both relays claim.
    emit_notes(&db, 40, 25).await;
    wait_for(
        "1,000 events published",
        Duration::from_secs(60),
        || async { db.count("published").await == 1000 },
    )
    .await;
    first.drain(Duration::from_secs(5)).await.unwrap();
    second.drain(Duration::from_secs(5)).await.unwrap();
    assert_eq!(transport.len(), 1000, "each event once");
    for board in 0..40 {
        assert_eq!(
            transport.versions_of(&format!("b{board}")),
            (1..=25).collect::<Vec<i64>>(),
            "board b{board} in version order"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_wakes_the_relay_long_before_its_poll() {
    let db = TestDb::new().await;
    let transport = Recording::new();
    let relay = outbox_sqlite::start_relay(
        db.pool.clone(),
        transport.clone(),
        RelayConfig {
            poll_interval: Duration::from_secs(120),
            ..config()
        },
    )
    .await
    .unwrap();
    // Let the workers find nothing and go to sleep.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = Instant::now();
    emit_one(&db, "wake").await;
    wait_for("the event published", Duration::from_secs(10), || async {
        transport.len() == 1
    })
    .await;
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "woken by the commit, not by the 120 s poll"
    );
    relay.drain(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test]
async fn a_dead_workers_lease_runs_out_and_its_events_are_claimed_again_in_order() {
    let db = TestDb::new().await;
    for _ in 0..3 {
        emit_one(&db, "leased").await;
    }
    emit_one(&db, "free").await;
    let lease = RelayConfig {
        claim_timeout: Duration::from_secs(1),
        ..config()
    };
    let dead = SqliteRelayStore::new(db.pool.clone(), &lease);
    let other = SqliteRelayStore::new(db.another_pool().await, &lease);

    let claim = dead.claim(3).await.unwrap();
    let claimed: Vec<i64> = claim
        .events()
        .iter()
        .map(|e| e.envelope.aggregate_version)
        .collect();
    assert_eq!(claimed, [1, 2, 3]);
    // The holder's process dies: no destructor, no outcome, no release.
    std::mem::forget(claim);
    // A version emitted meanwhile waits behind the leased ones.
    emit_one(&db, "leased").await;

    let meanwhile = other.claim(100).await.unwrap();
    let taken: Vec<(String, i64)> = meanwhile
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
        [("free".to_owned(), 1)],
        "nothing of the leased aggregate"
    );
    meanwhile.release().await.unwrap();

    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = other.claim(100).await.unwrap();
    let taken: Vec<(String, i64)> = again
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
        [
            ("free".to_owned(), 1),
            ("leased".to_owned(), 1),
            ("leased".to_owned(), 2),
            ("leased".to_owned(), 3),
            ("leased".to_owned(), 4),
        ]
    );
    assert!(again.events().iter().all(|e| e.attempts == 0));
}

#[tokio::test]
async fn an_outcome_recorded_after_the_lease_ran_out_changes_nothing() {
    let db = TestDb::new().await;
    emit_one(&db, "fenced").await;
    let lease = RelayConfig {
        claim_timeout: Duration::from_millis(300),
        ..config()
    };
    let late = SqliteRelayStore::new(db.pool.clone(), &lease);
    let holder = SqliteRelayStore::new(db.another_pool().await, &lease);

    let stale = late.claim(10).await.unwrap();
    let id = stale.events()[0].envelope.id;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let current = holder.claim(10).await.unwrap();
    assert_eq!(current.events().len(), 1, "claimed again after the lease");

    // The late worker reports a failure: fenced off, nothing recorded.
    stale
        .complete(BatchOutcome {
            published: vec![],
            failed: vec![outbox_core::relay::FailedAttempt {
                event_id: id,
                aggregate_type: "board".into(),
                aggregate_id: "fenced".into(),
                error: "late".into(),
                retry_in: Duration::from_secs(60),
                give_up: true,
            }],
        })
        .await
        .unwrap();
    assert_eq!(db.state("fenced", 1).await, ("pending".to_owned(), 0));
    // And the new holder's lease still stands: nobody else claims it.
    assert!(late.claim(10).await.unwrap().events().is_empty());

    current
        .complete(BatchOutcome {
            published: vec![id],
            failed: vec![],
        })
        .await
        .unwrap();
    assert_eq!(db.state("fenced", 1).await, ("published".to_owned(), 0));
}

async fn run_with_a_failing_head(policy: FailedHeadPolicy) -> (TestDb, Recording) {
    let db = TestDb::new().await;
    // Version 1 of board "bad" never gets through.
    let transport = Recording::failing(|e| e.aggregate_id == "bad" && e.aggregate_version == 1);
    for _ in 0..3 {
        emit_one(&db, "bad").await;
        emit_one(&db, "good").await;
    }
    let relay = outbox_sqlite::start_relay(
        db.pool.clone(),
        transport.clone(),
        RelayConfig {
            max_attempts: 3,
            failed_head_policy: policy,
            ..config()
        },
    )
    .await
    .unwrap();
    wait_for("bad v1 failed", Duration::from_secs(20), || async {
        db.state("bad", 1).await.0 == "failed"
    })
    .await;
    wait_for("good published", Duration::from_secs(20), || async {
        transport.versions_of("good") == [1, 2, 3]
    })
    .await;
    // Give a wrongly unblocked aggregate time to show itself.
    tokio::time::sleep(Duration::from_millis(300)).await;
    relay.drain(Duration::from_secs(5)).await.unwrap();
    (db, transport)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_head_backs_off_fails_and_blocks_only_its_aggregate() {
    let (db, transport) = run_with_a_failing_head(FailedHeadPolicy::Block).await;
    assert_eq!(db.state("bad", 1).await, ("failed".to_owned(), 3));
    assert_eq!(db.state("bad", 2).await, ("pending".to_owned(), 0));
    assert_eq!(db.state("bad", 3).await, ("pending".to_owned(), 0));
    assert!(transport.versions_of("bad").is_empty());

    let store = SqliteRelayStore::new(db.pool.clone(), &config());
    let blocked = store.blocked_aggregates(10).await.unwrap();
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    // A limit below 1 lists nothing (SQLite alone would read -1 as "all").
    assert!(store.blocked_aggregates(-1).await.unwrap().is_empty());
    assert!(store.blocked_aggregates(0).await.unwrap().is_empty());
    assert_eq!(blocked[0].aggregate_id, "bad");
    assert_eq!(blocked[0].head_status, "failed");
    let last_error = blocked[0].last_error.as_deref().unwrap_or_default();
    assert!(last_error.contains("the broker refused it"), "{last_error}");
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (stats.pending, stats.failed, stats.blocked_aggregates),
        (2, 1, 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_skip_the_versions_after_a_failed_head_go_on() {
    let (db, transport) = run_with_a_failing_head(FailedHeadPolicy::Skip).await;
    assert_eq!(db.state("bad", 1).await, ("failed".to_owned(), 3));
    assert_eq!(transport.versions_of("bad"), [2, 3]);
    let store = SqliteRelayStore::new(
        db.pool.clone(),
        &RelayConfig {
            failed_head_policy: FailedHeadPolicy::Skip,
            ..config()
        },
    );
    assert!(store.blocked_aggregates(10).await.unwrap().is_empty());
}

#[tokio::test]
async fn retention_purges_old_published_events_and_keeps_pending_ones() {
    let db = TestDb::new().await;
    for _ in 0..3 {
        emit_one(&db, "old").await;
    }
    let store = SqliteRelayStore::new(db.pool.clone(), &config());
    publish_claimed(&store, 2).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let purged = store
        .purge_published(Duration::from_millis(10), Duration::from_secs(3600), 100)
        .await
        .unwrap();
    assert_eq!(purged, 2);
    assert_eq!(db.count("published").await, 0);
    assert_eq!(db.count("pending").await, 1);
}

/// SQLite keeps whatever is written into its `TEXT` payload column, a
/// BLOB of bytes that are not UTF-8 included: the claim hands such a row
/// over as unreadable, with the reason, instead of failing on it (which
/// stopped every claim at that row).
#[tokio::test]
async fn a_payload_that_is_not_text_is_claimed_as_unreadable_not_a_failed_claim() {
    let db = TestDb::new().await;
    emit_one(&db, "broken").await;
    emit_one(&db, "sound").await;
    sqlx::query("UPDATE outbox_events SET payload = X'FF00' WHERE aggregate_id = 'broken'")
        .execute(&db.pool)
        .await
        .unwrap();
    let store = SqliteRelayStore::new(db.pool.clone(), &config());
    let claim = store.claim(10).await.unwrap();
    let unreadable: Vec<(&str, Option<&str>)> = claim
        .events()
        .iter()
        .map(|e| (e.envelope.aggregate_id.as_str(), e.unreadable.as_deref()))
        .collect();
    assert_eq!(unreadable.len(), 2, "{unreadable:?}");
    let broken = unreadable.iter().find(|(id, _)| *id == "broken").unwrap().1;
    assert!(
        broken.is_some_and(|reason| reason.contains("not UTF-8")),
        "{broken:?}"
    );
    let sound = unreadable.iter().find(|(id, _)| *id == "sound").unwrap().1;
    assert_eq!(sound, None);
    claim.release().await.unwrap();
}

/// SQLite reads a negative `LIMIT` as "no limit" and a zero one as
/// "nothing": a purge asked for a batch of 0 or -1 deletes one row at a
/// time, not nothing and not everything.
#[tokio::test]
async fn a_purge_batch_below_one_deletes_one_row_at_a_time() {
    let db = TestDb::new().await;
    for _ in 0..3 {
        emit_one(&db, "old").await;
    }
    let store = SqliteRelayStore::new(db.pool.clone(), &config());
    publish_claimed(&store, 3).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let age = Duration::from_millis(10);
    let keys = Duration::from_secs(3600);
    assert_eq!(store.purge_published(age, keys, -1).await.unwrap(), 1);
    assert_eq!(store.purge_published(age, keys, 0).await.unwrap(), 1);
    assert_eq!(db.count("published").await, 1);
}

#[tokio::test]
async fn aggregates_held_by_another_worker_do_not_starve_the_free_ones() {
    let db = TestDb::new().await;
    // Five versions of 100 boards, in seq order by version.
    emit_notes(&db, 100, 5).await;
    let holder = SqliteRelayStore::new(db.pool.clone(), &config());
    let other = SqliteRelayStore::new(db.another_pool().await, &config());
    // One worker holds version 1 of b0..b59 (and so all of their versions).
    let held = holder.claim(60).await.unwrap();
    assert_eq!(held.events().len(), 60);

    // The other drains the 40 free boards, 100 rows per claim at most;
    // the held boards' 240 later versions do not fill its window.
    let mut published = Vec::new();
    for _ in 0..10 {
        let claim = other.claim(100).await.unwrap();
        let ids = claim.events().iter().map(|e| e.envelope.id).collect();
        published.extend(claim.events().iter().map(|e| {
            (
                e.envelope.aggregate_id.clone(),
                e.envelope.aggregate_version,
            )
        }));
        claim
            .complete(BatchOutcome {
                published: ids,
                failed: vec![],
            })
            .await
            .unwrap();
    }
    assert_eq!(published.len(), 200, "every version of the 40 free boards");
    for (board, _) in &published {
        let n: usize = board[1..].parse().unwrap();
        assert!(n >= 60, "{board} is held by the other worker");
    }
    drop(held);
}

#[tokio::test]
async fn a_claim_dropped_unsettled_gives_its_lease_back_at_once() {
    let db = TestDb::new().await;
    for _ in 0..3 {
        emit_one(&db, "abandoned").await;
    }
    let long_lease = RelayConfig {
        claim_timeout: Duration::from_secs(600),
        ..config()
    };
    let panicked = SqliteRelayStore::new(db.pool.clone(), &long_lease);
    let other = SqliteRelayStore::new(db.another_pool().await, &long_lease);
    let claim = panicked.claim(10).await.unwrap();
    assert_eq!(claim.events().len(), 3);
    // A worker task that panics or is aborted mid-batch drops its claim.
    drop(claim);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let versions = loop {
        let again = other.claim(10).await.unwrap();
        let versions: Vec<i64> = again
            .events()
            .iter()
            .map(|e| e.envelope.aggregate_version)
            .collect();
        if !versions.is_empty() || std::time::Instant::now() > deadline {
            again.release().await.unwrap();
            break versions;
        }
        again.release().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(versions, [1, 2, 3], "the 600 s lease was not given back");
}

#[tokio::test]
async fn the_relay_writes_through_its_own_connections_without_syncing_each_commit() {
    let db = TestDb::new().await;
    let store = SqliteRelayStore::new(db.pool.clone(), &config());
    let synchronous: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(synchronous, 1, "NORMAL: a lost lease or mark republishes");
    let emitting: i64 = sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(emitting, 2, "FULL on the emitting side, untouched");
}
