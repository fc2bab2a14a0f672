//! One store conformance suite, run unchanged against every store
//! (`tests/tests/store_conformance_postgres.rs`, `…_sqlite.rs`): the
//! article's fault tests of the producer half and the operator's repairs,
//! written against the seams only (emit in the store's transaction, a
//! relay over the store, [`OperationsStore`]), so a store passes exactly
//! when it keeps the promises the README makes for all stores.
//!
//! The cases, in the article's numbering where it has one:
//! 1. a rolled-back transaction's events are never published;
//! 2. a broker that is down: nothing is lost, every event is published once
//!    it is back, each aggregate in version order;
//! 3. the relay dies between the broker's ack and the mark (a failpoint
//!    panics the worker there): the events are published again, none lost;
//! 7. one event in retry does not hold up other aggregates, only its own;
//! 8. a large backlog drains in order per aggregate, each event once;
//!
//! and the repairs: a failed head retried (its aggregate goes on in order,
//! the audit names the operator) and another skipped (its later versions
//! go on, it is never published).
//!
//! The consumer's cases (two instances, versions out of order, a bad
//! schema version) need the consumer's store seam, which only PostgreSQL
//! has so far; they run in the consumer and fault suites.
//!
//! The suite arms a process-wide failpoint: a test binary runs it from one
//! test, case after case, on a fresh database per case.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{
    Cleanup, DEFAULT_KEY_RETENTION, EventFilter, EventStatus, OperationsStore, StatusOptions,
};
use outbox_core::relay::failpoint::{self, AFTER_PUBLISH, Action};
use outbox_core::relay::{Backoff, FailedHeadPolicy, Relay, RelayConfig};
use outbox_core::transport::{PublishFailure, Transport};

use crate::events::Ticked;
use crate::transports::RecordingTransport;
use crate::wait;

/// A store under the suite: a fresh, migrated database per value.
pub trait StoreUnderTest: Sized + Send + Sync {
    /// The store's operations API.
    type Ops: OperationsStore;

    /// A fresh database with the outbox tables.
    fn fresh() -> impl Future<Output = Self> + Send;

    /// Emits `ticks` in one transaction of the store, then commits it or
    /// rolls it back.
    fn emit(&self, ticks: &[Ticked], commit: bool) -> impl Future<Output = ()> + Send;

    /// Starts a relay over the store.
    fn start_relay<T: Transport>(
        &self,
        transport: T,
        config: RelayConfig,
    ) -> impl Future<Output = Relay> + Send;

    /// The operations API over the store (contracts' redaction), reading
    /// blocked aggregates as relays with `failed_heads` do.
    fn ops(&self, failed_heads: FailedHeadPolicy) -> Self::Ops;

    /// Events in the published state.
    fn published(&self) -> impl Future<Output = i64> + Send;

    /// Removes what [`fresh`](StoreUnderTest::fresh) made.
    fn clean_up(self) -> impl Future<Output = ()> + Send;
}

/// A store whose payload column takes any text (SQLite, MySQL; PostgreSQL's
/// `json` refuses what is not JSON, and everything it keeps, the relay
/// reads).
pub trait PayloadAsText: StoreUnderTest {
    /// Writes `payload` over the stored payload of one event by hand, as
    /// another program or an operator's `UPDATE` could.
    fn overwrite_payload(
        &self,
        aggregate_id: &str,
        version: i64,
        payload: &str,
    ) -> impl Future<Output = ()> + Send;
}

/// Runs every case against fresh databases of `S`, naming each as it
/// starts (a failure's panic follows its name).
pub async fn run<S: StoreUnderTest>() {
    eprintln!("case 1: a rollback publishes nothing");
    rollback_publishes_nothing::<S>().await;
    eprintln!("case 2: a broker that is down loses nothing");
    broker_down_loses_nothing::<S>().await;
    eprintln!("case 3: a relay that dies between ack and mark publishes again");
    death_between_ack_and_mark_publishes_again::<S>().await;
    eprintln!("case 7: one event in retry holds up only its aggregate");
    a_retrying_event_holds_up_only_its_aggregate::<S>().await;
    eprintln!("case 8: a large backlog drains in order");
    a_large_backlog_drains_in_order::<S>().await;
    eprintln!("repairs: retry and skip of failed heads");
    failed_heads_are_retried_and_skipped_with_an_audit::<S>().await;
    eprintln!("repairs: a published event published again");
    a_published_event_is_republished_with_an_audit::<S>().await;
    eprintln!("repairs: cleanup of old published events");
    cleanup_counts_then_deletes_only_old_published_events::<S>().await;
}

/// A relay that polls, retries and gives up quickly.
pub fn quick_config() -> RelayConfig {
    RelayConfig {
        poll_interval: Duration::from_millis(50),
        error_backoff: Duration::from_millis(50),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
            multiplier: 2.0,
            jitter: 0.0,
        },
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    }
}

/// `versions` ticks of each of `counters`, interleaved (v1 of every
/// counter, then v2, …).
fn ticks(counters: &[&str], versions: u64) -> Vec<Ticked> {
    (1..=versions)
        .flat_map(|tick| counters.iter().map(move |c| Ticked::new(*c, tick)))
        .collect()
}

/// Per aggregate, the versions `transport` acknowledged, in order.
fn versions(transport: &RecordingTransport) -> HashMap<String, Vec<i64>> {
    let mut by_aggregate: HashMap<String, Vec<i64>> = HashMap::new();
    for envelope in transport.published() {
        by_aggregate
            .entry(envelope.aggregate_id.clone())
            .or_default()
            .push(envelope.aggregate_version);
    }
    by_aggregate
}

fn request(reason: &str) -> RepairRequest {
    RepairRequest::new("conformance", reason).expect("a valid request")
}

async fn published_count(transport: &RecordingTransport, n: usize, what: &str) {
    let transport = transport.clone();
    wait::until(what, Duration::from_secs(30), move || {
        let transport = transport.clone();
        async move { transport.published_count() >= n }
    })
    .await;
}

/// A row whose stored payload is not JSON (written by hand or by another
/// program) used to fail every claim that reached it: each worker claimed
/// the same head again after its error backoff, and nothing of any
/// aggregate was published any more. It now fails alone, with a reason
/// naming the problem; its aggregate waits behind it (Block), the others
/// go on.
pub async fn an_unreadable_stored_payload_fails_its_event_not_the_relay<S: PayloadAsText>() {
    let store = S::fresh().await;
    store.emit(&ticks(&["poisoned", "healthy"], 3), true).await;
    store
        .overwrite_payload("poisoned", 1, "{\"counter\": \"poisoned\", tick: 1")
        .await;
    let transport = RecordingTransport::new();
    let relay = store.start_relay(transport.clone(), quick_config()).await;
    published_count(&transport, 3, "the healthy aggregate's events").await;
    let ops = store.ops(FailedHeadPolicy::Block);
    wait::until(
        "the unreadable event in the failed state",
        Duration::from_secs(30),
        || async {
            ops.status(&StatusOptions::default())
                .await
                .map(|s| s.backlog.failed == 1)
                .unwrap_or(false)
        },
    )
    .await;
    relay.drain(Duration::from_secs(10)).await.expect("drained");
    let seen = versions(&transport);
    assert_eq!(seen.get("healthy"), Some(&vec![1, 2, 3]));
    assert!(
        !seen.contains_key("poisoned"),
        "published despite an unreadable head: {:?}",
        seen.get("poisoned")
    );
    let status = ops.status(&StatusOptions::default()).await.unwrap();
    assert_eq!(status.backlog.failed, 1);
    assert_eq!(status.backlog.pending, 2, "versions 2 and 3 wait behind it");
    let blocked: Vec<_> = status
        .blocked
        .iter()
        .filter(|b| b.aggregate_id == "poisoned")
        .collect();
    assert_eq!(blocked.len(), 1, "{:?}", status.blocked);
    let reason = blocked[0].last_error.as_deref().unwrap_or_default();
    assert!(
        reason.contains("stored payload cannot be read as JSON") && reason.contains("line 1"),
        "{reason}"
    );
    store.clean_up().await;
}

async fn rollback_publishes_nothing<S: StoreUnderTest>() {
    let store = S::fresh().await;
    store.emit(&ticks(&["kept"], 3), true).await;
    store.emit(&ticks(&["undone"], 2), false).await;
    let transport = RecordingTransport::new();
    let relay = store.start_relay(transport.clone(), quick_config()).await;
    published_count(&transport, 3, "the committed events").await;
    relay.drain(Duration::from_secs(10)).await.expect("drained");
    let seen = versions(&transport);
    assert_eq!(seen.get("kept"), Some(&vec![1, 2, 3]));
    assert!(
        !seen.contains_key("undone"),
        "a rolled-back event was published"
    );
    assert_eq!(store.published().await, 3);
    let status = store
        .ops(FailedHeadPolicy::Block)
        .status(&StatusOptions::default())
        .await
        .unwrap();
    assert_eq!(status.backlog.pending, 0, "a rolled-back event was stored");
    store.clean_up().await;
}

async fn broker_down_loses_nothing<S: StoreUnderTest>() {
    let store = S::fresh().await;
    let counters = ["a", "b", "c", "d"];
    store.emit(&ticks(&counters, 5), true).await;
    let down = Arc::new(AtomicBool::new(true));
    let broker = Arc::clone(&down);
    let transport = RecordingTransport::failing(move |_| {
        broker
            .load(Ordering::SeqCst)
            .then(|| PublishFailure::retryable("connection refused"))
    });
    let relay = store
        .start_relay(
            transport.clone(),
            RelayConfig {
                max_attempts: 1000,
                ..quick_config()
            },
        )
        .await;
    let ops = store.ops(FailedHeadPolicy::Block);
    wait::until(
        "attempts against the down broker",
        Duration::from_secs(30),
        || {
            let transport = transport.clone();
            async move { transport.attempts() >= 8 }
        },
    )
    .await;
    let status = ops.status(&StatusOptions::default()).await.unwrap();
    assert_eq!(status.backlog.failed, 0);
    assert_eq!(
        status.backlog.pending + status.backlog.retrying,
        20,
        "every event waits while the broker is down"
    );
    assert!(status.backlog.retrying > 0, "no attempt was recorded");
    down.store(false, Ordering::SeqCst);
    published_count(&transport, 20, "every event after the broker came back").await;
    relay.drain(Duration::from_secs(10)).await.expect("drained");
    for (aggregate, seen) in versions(&transport) {
        assert_eq!(seen, [1, 2, 3, 4, 5], "aggregate {aggregate}");
    }
    assert_eq!(store.published().await, 20);
    store.clean_up().await;
}

async fn death_between_ack_and_mark_publishes_again<S: StoreUnderTest>() {
    let store = S::fresh().await;
    store.emit(&ticks(&["p", "q"], 4), true).await;
    let transport = RecordingTransport::new();
    failpoint::arm(AFTER_PUBLISH, Action::Panic, 1);
    // The worker panics after the broker acknowledged its first batch and
    // before the outcome is recorded; the supervisor restarts it. A store
    // that leases rows gives them back when the dropped claim releases
    // them, or at the latest after `claim_timeout`.
    let relay = store
        .start_relay(
            transport.clone(),
            RelayConfig {
                publish_timeout: Duration::from_secs(1),
                claim_timeout: Duration::from_secs(2),
                ..quick_config()
            },
        )
        .await;
    let done = store.ops(FailedHeadPolicy::Block);
    wait::until(
        "every event marked published after the worker's death",
        Duration::from_secs(30),
        || async {
            done.status(&StatusOptions::default())
                .await
                .map(|s| s.backlog.pending + s.backlog.retrying == 0)
                .unwrap_or(false)
        },
    )
    .await;
    relay.drain(Duration::from_secs(10)).await.expect("drained");
    failpoint::disarm(AFTER_PUBLISH);
    assert_eq!(store.published().await, 8);
    let seen = versions(&transport);
    for aggregate in ["p", "q"] {
        let versions = &seen[aggregate];
        assert!(
            versions.len() > 4,
            "aggregate {aggregate}: nothing was published again ({versions:?})"
        );
        // At least once: every version, some of them twice.
        let mut distinct = versions.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct, [1, 2, 3, 4], "aggregate {aggregate}");
    }
    store.clean_up().await;
}

async fn a_retrying_event_holds_up_only_its_aggregate<S: StoreUnderTest>() {
    let store = S::fresh().await;
    let counters = ["stuck", "free-1", "free-2", "free-3"];
    store.emit(&ticks(&counters, 3), true).await;
    let transport = RecordingTransport::failing(|envelope| {
        (envelope.aggregate_id == "stuck" && envelope.aggregate_version == 1)
            .then(|| PublishFailure::retryable("message rejected"))
    });
    let relay = store
        .start_relay(
            transport.clone(),
            RelayConfig {
                max_attempts: 1000,
                ..quick_config()
            },
        )
        .await;
    published_count(&transport, 9, "the free aggregates").await;
    let ops = store.ops(FailedHeadPolicy::Block);
    wait::until(
        "the stuck head retried",
        Duration::from_secs(30),
        || async { transport.attempts() >= 12 },
    )
    .await;
    let seen = versions(&transport);
    for free in &counters[1..] {
        assert_eq!(seen[*free], [1, 2, 3], "aggregate {free}");
    }
    assert!(
        !seen.contains_key("stuck"),
        "a version behind a retrying head was published"
    );
    let blocked = ops.blocked(10).await.unwrap();
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!(blocked[0].aggregate_id, "stuck");
    assert_eq!(blocked[0].head_status, "pending");
    assert!(
        blocked[0]
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("message rejected")),
        "{blocked:?}"
    );
    relay.drain(Duration::from_secs(10)).await.expect("drained");
    store.clean_up().await;
}

async fn a_large_backlog_drains_in_order<S: StoreUnderTest>() {
    let store = S::fresh().await;
    let names: Vec<String> = (0..50).map(|i| format!("big-{i}")).collect();
    let counters: Vec<&str> = names.iter().map(String::as_str).collect();
    let all = ticks(&counters, 40);
    for chunk in all.chunks(100) {
        store.emit(chunk, true).await;
    }
    let transport = RecordingTransport::new();
    let relay = store
        .start_relay(
            transport.clone(),
            RelayConfig {
                workers: 2,
                batch_size: 100,
                ..quick_config()
            },
        )
        .await;
    published_count(&transport, 2000, "the backlog").await;
    relay.drain(Duration::from_secs(10)).await.expect("drained");
    let expected: Vec<i64> = (1..=40).collect();
    let seen = versions(&transport);
    assert_eq!(seen.len(), 50);
    for (aggregate, versions) in seen {
        assert_eq!(versions, expected, "aggregate {aggregate}");
    }
    assert_eq!(
        transport.published_count(),
        2000,
        "an event was published twice"
    );
    assert_eq!(store.published().await, 2000);
    store.clean_up().await;
}

async fn failed_heads_are_retried_and_skipped_with_an_audit<S: StoreUnderTest>() {
    let store = S::fresh().await;
    store.emit(&ticks(&["to-retry", "to-skip"], 3), true).await;
    let fixed = Arc::new(AtomicBool::new(false));
    let broker = Arc::clone(&fixed);
    let transport = RecordingTransport::failing(move |envelope| {
        (envelope.aggregate_version == 1 && !broker.load(Ordering::SeqCst))
            .then(|| PublishFailure::permanent("message too large"))
    });
    let relay = store
        .start_relay(
            transport.clone(),
            RelayConfig {
                max_attempts: 1,
                ..quick_config()
            },
        )
        .await;
    let ops = store.ops(FailedHeadPolicy::Block);
    let failed_filter = EventFilter {
        status: EventStatus::Failed,
        ..EventFilter::default()
    };
    wait::until("both heads failed", Duration::from_secs(30), || async {
        ops.events(&failed_filter)
            .await
            .map(|page| page.items.len() == 2)
            .unwrap_or(false)
    })
    .await;
    let failed = ops.events(&failed_filter).await.unwrap().items;
    let head = |aggregate: &str| {
        failed
            .iter()
            .find(|e| e.aggregate_id == aggregate)
            .map(|e| e.id)
            .expect("a failed head")
    };
    let (retry, skip) = (head("to-retry"), head("to-skip"));
    let status = ops.status(&StatusOptions::default()).await.unwrap();
    assert_eq!(status.backlog.failed, 2);
    assert_eq!(status.blocked.len(), 2, "{:?}", status.blocked);
    assert!(!status.problems.is_empty());
    // Relays that skip failed heads are not held up by them.
    let skipping = store.ops(FailedHeadPolicy::Skip);
    let blocked = skipping.blocked(10).await.unwrap();
    assert!(blocked.is_empty(), "under Skip: {blocked:?}");

    fixed.store(true, Ordering::SeqCst);
    let skipped = ops
        .skip_failed(&[skip], &request("duplicate of an earlier charge"))
        .await
        .unwrap();
    assert_eq!(skipped.count("skipped"), 1);
    let retried = ops
        .retry_failed(&[retry], &request("broker limit raised"))
        .await
        .unwrap();
    assert_eq!(retried.count("retried"), 1);
    published_count(&transport, 5, "both aggregates after the repairs").await;
    relay.drain(Duration::from_secs(10)).await.expect("drained");
    let seen = versions(&transport);
    assert_eq!(seen["to-retry"], [1, 2, 3]);
    assert_eq!(seen["to-skip"], [2, 3], "the skipped head was published");
    let status = ops.status(&StatusOptions::default()).await.unwrap();
    assert_eq!((status.backlog.failed, status.backlog.skipped), (0, 1));
    assert!(status.problems.is_empty(), "{:?}", status.problems);
    let audit = ops.audit(None, Some(10)).await.unwrap().items;
    let actions: Vec<(&str, &str, &str)> = audit
        .iter()
        .map(|a| (a.action.as_str(), a.operator.as_str(), a.reason.as_str()))
        .collect();
    assert_eq!(
        actions,
        [
            ("relay.retry", "conformance", "broker limit raised"),
            (
                "relay.skip",
                "conformance",
                "duplicate of an earlier charge"
            ),
        ]
    );
    store.clean_up().await;
}

/// A published event republished through the operations seam is
/// published again under its own id and version (a consumer's inbox
/// recognises it), once, with an audit row; an unknown id is reported
/// `not_found`.
async fn a_published_event_is_republished_with_an_audit<S: StoreUnderTest>() {
    let store = S::fresh().await;
    store.emit(&ticks(&["again"], 2), true).await;
    let transport = RecordingTransport::new();
    let relay = store.start_relay(transport.clone(), quick_config()).await;
    published_count(&transport, 2, "both versions published").await;
    let ops = store.ops(FailedHeadPolicy::Block);
    let published = ops
        .events(&EventFilter {
            status: EventStatus::Published,
            ..EventFilter::default()
        })
        .await
        .unwrap()
        .items;
    let first = published
        .iter()
        .find(|e| e.aggregate_version == 1)
        .map(|e| e.id)
        .expect("version 1 is listed as published");

    let report = ops
        .republish(&[first], &request("the billing consumer lost it"))
        .await
        .unwrap();
    assert_eq!(report.count("republished"), 1, "{report:?}");
    published_count(&transport, 3, "the republished event").await;
    let again = transport.published()[2].clone();
    assert_eq!(
        (
            again.id,
            again.aggregate_id.as_str(),
            again.aggregate_version
        ),
        (first, "again", 1),
        "published again under its own id and version"
    );
    // Published again, it is marked published, and an id that names no
    // event is reported as such and changes nothing.
    wait::until(
        "the republished event marked",
        Duration::from_secs(30),
        || async {
            ops.event(first)
                .await
                .ok()
                .flatten()
                .is_some_and(|e| e.status == "published")
        },
    )
    .await;
    let unknown = uuid::Uuid::now_v7();
    let refused = ops.republish(&[unknown], &request("a typo")).await.unwrap();
    assert_eq!(refused.count("not_found"), 1, "{refused:?}");
    relay.drain(Duration::from_secs(10)).await.expect("drained");
    assert_eq!(
        transport.published_count(),
        3,
        "published once more, not twice"
    );
    let audit = ops.audit(None, Some(10)).await.unwrap().items;
    assert!(
        audit.iter().any(|a| a.action == "relay.republish"
            && a.reason == "the billing consumer lost it"
            && a.operator == "conformance"),
        "{audit:?}"
    );
    store.clean_up().await;
}

/// A cleanup's dry run counts and deletes nothing; executed, it deletes
/// the published events older than its age and never a pending one,
/// keeps idempotency keys for their own retention unless told otherwise,
/// and writes an audit row.
async fn cleanup_counts_then_deletes_only_old_published_events<S: StoreUnderTest>() {
    let store = S::fresh().await;
    store.emit(&ticks(&["history"], 3), true).await;
    let transport = RecordingTransport::new();
    let relay = store.start_relay(transport.clone(), quick_config()).await;
    published_count(&transport, 3, "the history published").await;
    relay.drain(Duration::from_secs(10)).await.expect("drained");
    store.emit(&ticks(&["still-pending"], 1), true).await;
    // Older than the cleanup's age of one second on every store's clock
    // resolution.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let ops = store.ops(FailedHeadPolicy::Block);
    let age = Duration::from_secs(1);

    let dry = ops
        .cleanup(
            &Cleanup::older_than(age),
            &request("how much would go"),
            &mut |_, _| {},
        )
        .await
        .unwrap();
    assert_eq!(
        (dry.eligible, dry.deleted, dry.executed, dry.audit_id),
        (3, 0, false, None),
        "{dry:?}"
    );
    assert_eq!(dry.keys_older_than_secs, DEFAULT_KEY_RETENTION.as_secs());
    assert_eq!(store.published().await, 3, "a dry run deletes nothing");

    let plan = Cleanup {
        execute: true,
        ..Cleanup::older_than(age)
    };
    let done = ops
        .cleanup(&plan, &request("disk space"), &mut |_, _| {})
        .await
        .unwrap();
    assert_eq!(
        (done.eligible, done.deleted, done.executed),
        (3, 3, true),
        "{done:?}"
    );
    assert!(done.audit_id.is_some(), "{done:?}");
    assert_eq!(store.published().await, 0, "the old published events went");
    let pending = ops
        .events(&EventFilter {
            status: EventStatus::Pending,
            ..EventFilter::default()
        })
        .await
        .unwrap()
        .items;
    assert_eq!(
        pending
            .iter()
            .map(|e| e.aggregate_id.as_str())
            .collect::<Vec<_>>(),
        ["still-pending"],
        "a pending event is never cleaned up"
    );
    let audit = ops.audit(None, Some(10)).await.unwrap().items;
    assert!(
        audit
            .iter()
            .any(|a| a.action == "relay.cleanup" && a.reason == "disk space"),
        "{audit:?}"
    );
    store.clean_up().await;
}
