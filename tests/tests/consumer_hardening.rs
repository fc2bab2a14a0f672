//! The consumer's edges where an event could be eaten, stranded or
//! leaked: quarantined messages replayed after an upgrade (applied once,
//! in order under strict ordering), strict consumers that start late or
//! read a trimmed stream, parked retries that back off, the window
//! between a parked start and its transaction, start counts that outlive a
//! dead letter, and a batch instance beside a single-message instance.
//! Real PostgreSQL; the in-memory source feeds the messages.

use outbox_postgres::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

use outbox_core::audit::RepairRequest;
use outbox_core::consumer::{
    ConsumerBuilder, ConsumerConfig, HandlerError, Incoming, Outcome, ReplayError, ReplayOutcome,
    RetryPolicy, StrictStart, channel,
};
use outbox_core::failpoint::{self, Action};
use outbox_core::relay::Backoff;
use outbox_core::{ContractRegistry, OutboxEvent, metrics as m};
use outbox_tests::consumers::{
    create_effects, effect_handler, effects, letters, parcel_v2, parcel_v3, record_effect,
    strict_config as strict, tick, tick_consumer,
};
use outbox_tests::events::{ParcelBooked, ParcelBookedV2, Ticked};
use outbox_tests::{TestDb, metrics, wait};

async fn audit_rows(db: &TestDb) -> Vec<(String, String, String, Vec<String>, serde_json::Value)> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT operator, reason, action, ids, outcomes FROM {} ORDER BY id",
        db.table("outbox_audit")
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_quarantined_v3_is_replayed_after_the_upgrade_and_applied_once_in_order() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let name = "parcels";
    // The consumer as deployed before producers moved to v3: the binary
    // knows parcel.booked up to v2.
    let old_contracts = ContractRegistry::from_contracts([ParcelBookedV2::contract()]).unwrap();
    let old = ConsumerBuilder::new(name)
        .config(strict(Duration::from_secs(60)))
        .registry(old_contracts)
        .on_fn::<ParcelBookedV2, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let first = parcel_v2("p1", 1);
    let second = parcel_v3("p1", 2);
    let third = parcel_v2("p1", 3);
    assert_eq!(old.handle_envelope(&first).await.unwrap(), Outcome::Applied);
    let quarantined = old.handle_envelope(&second).await.unwrap();
    assert!(
        matches!(&quarantined, Outcome::Quarantined { reason } if reason.contains("schema version 3 is newer")),
        "{quarantined:?}"
    );
    assert_eq!(
        old.handle_envelope(&third).await.unwrap(),
        Outcome::Parked { waiting_for: 2 },
        "strict: version 3 waits for the quarantined version 2"
    );
    // A redelivery of the quarantined message neither runs nor writes again.
    assert_eq!(
        old.handle(&Incoming::from_envelope(&second, 2))
            .await
            .unwrap(),
        Outcome::Duplicate
    );
    let letter_rows = letters(&db, name).await;
    assert_eq!(letter_rows.len(), 1);
    assert_eq!(
        db.scalar::<i64>(&format!(
            "SELECT count(*) FROM {{s}}.outbox_processed_events WHERE event_id = '{}'",
            second.id
        ))
        .await,
        0,
        "a quarantined event holds no inbox row"
    );

    // The consumer is upgraded: it reads v3 now (same name, same tables).
    let upgraded = ConsumerBuilder::new(name)
        .config(strict(Duration::from_secs(60)))
        .on_fn::<ParcelBooked, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let letter_id: i64 = db
        .scalar("SELECT id FROM {s}.outbox_dead_letters WHERE resolved_at IS NULL")
        .await;
    // No reason, no operator, no ids: refused, nothing changes.
    assert!(RepairRequest::new("ada", "").is_err());
    let request = RepairRequest::new("ada", "parcels upgraded to read parcel.booked v3").unwrap();
    assert!(matches!(
        upgraded.replay(&[], &request).await,
        Err(ReplayError::Refused(_))
    ));
    let report = upgraded.replay(&[letter_id], &request).await.unwrap();
    assert_eq!(report.letters, vec![(letter_id, ReplayOutcome::Applied)]);

    let applied: Vec<(String, i64)> = effects(&db, name)
        .await
        .into_iter()
        .map(|e| (e.aggregate_id, e.aggregate_version))
        .collect();
    assert_eq!(
        applied,
        vec![("p1".into(), 1), ("p1".into(), 2), ("p1".into(), 3)],
        "each version once, in order: the parked v3 followed the replayed v2"
    );
    // Replaying again finds no open letter; a redelivery is a duplicate.
    let again = upgraded.replay(&[letter_id], &request).await.unwrap();
    assert_eq!(again.letters, vec![(letter_id, ReplayOutcome::NotFound)]);
    assert_eq!(
        upgraded
            .handle(&Incoming::from_envelope(&second, 3))
            .await
            .unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(effects(&db, name).await.len(), 3);
    let resolution: String = db
        .scalar("SELECT resolution FROM {s}.outbox_dead_letters")
        .await;
    assert_eq!(resolution, "replayed: applied");
    let audit = audit_rows(&db).await;
    assert_eq!(audit.len(), 2, "one audit row per replay request");
    let (operator, reason, action, ids, outcomes) = &audit[0];
    assert_eq!(
        (operator.as_str(), action.as_str()),
        ("ada", "consumer.replay")
    );
    assert_eq!(reason, "parcels upgraded to read parcel.booked v3");
    assert_eq!(ids, &vec![letter_id.to_string()]);
    assert_eq!(outcomes[0]["outcome"], "applied");
    assert_eq!(outcomes[0]["id"], letter_id.to_string());
    db.drop_schema().await;
}

#[tokio::test]
async fn a_dead_letter_is_replayed_once_after_the_handler_is_fixed() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let name = "fixable";
    let config = ConsumerConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..ConsumerConfig::default()
    };
    let broken = tick_consumer(&db, name, config.clone(), Duration::ZERO, &["c1"]);
    let event = tick("c1", 1);
    assert!(matches!(
        broken.handle_envelope(&event).await.unwrap(),
        Outcome::DeadLettered { .. }
    ));
    let fixed = tick_consumer(&db, name, config, Duration::ZERO, &[]);
    let letter_id: i64 = db.scalar("SELECT id FROM {s}.outbox_dead_letters").await;
    let request = RepairRequest::new("bob", "downstream accepts c1 again").unwrap();
    let report = fixed.replay(&[letter_id, 999_999], &request).await.unwrap();
    assert_eq!(
        report.letters,
        vec![
            (letter_id, ReplayOutcome::Applied),
            (999_999, ReplayOutcome::NotFound)
        ]
    );
    assert_eq!(effects(&db, name).await.len(), 1);
    db.drop_schema().await;
}

#[tokio::test]
async fn a_late_strict_consumer_starts_at_the_lowest_version_it_sees() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    // Versions 1..=3 of c1 happened before this consumer existed.
    let late = tick_consumer(
        &db,
        "late",
        strict(Duration::from_millis(500)),
        Duration::ZERO,
        &[],
    );
    let (sender, source) = channel();
    let task = late.spawn(source);
    for version in [4, 5, 6] {
        sender.send(&tick("c1", version)).unwrap();
    }
    wait::until(
        "versions 4..=6 applied from the start the consumer saw",
        Duration::from_secs(20),
        || async { effects(&db, "late").await.len() == 3 },
    )
    .await;
    let applied: Vec<i64> = effects(&db, "late")
        .await
        .iter()
        .map(|e| e.aggregate_version)
        .collect();
    assert_eq!(applied, vec![4, 5, 6]);
    assert!(letters(&db, "late").await.is_empty());
    assert!(metrics::counter(m::CONSUMER_STRICT_STARTS, &[("consumer", "late")]) >= 1);
    // From now on the aggregate is strict as usual: a gap waits.
    sender.send(&tick("c1", 8)).unwrap();
    sender.send(&tick("c1", 7)).unwrap();
    wait::until("7 then 8", Duration::from_secs(20), || async {
        effects(&db, "late").await.len() == 5
    })
    .await;
    let applied: Vec<i64> = effects(&db, "late")
        .await
        .iter()
        .map(|e| e.aggregate_version)
        .collect();
    assert_eq!(applied, vec![4, 5, 6, 7, 8]);
    drop(sender);
    task.join().await.unwrap();

    // With StrictStart::VersionOne the same late start is a missing
    // version: the parked messages go to the dead letters, named.
    let strict_from_one = tick_consumer(
        &db,
        "from-one",
        ConsumerConfig {
            strict_start: StrictStart::VersionOne,
            ..strict(Duration::from_millis(300))
        },
        Duration::ZERO,
        &[],
    );
    for version in [4, 5] {
        strict_from_one
            .handle_envelope(&tick("c1", version))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let report = strict_from_one.sweep().await.unwrap();
    assert_eq!((report.started, report.dead_lettered), (0, 2));
    assert!(
        letters(&db, "from-one").await[0]
            .reason
            .contains("version 1 of counter/c1")
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn a_failing_first_version_pins_the_start_so_a_later_one_cannot_jump_ahead() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let fails = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&fails);
    let table = db.table("effects");
    let consumer = ConsumerBuilder::new("pinned")
        .config(strict(Duration::from_millis(300)))
        .on_fn::<Ticked, _>(move |received, tx| {
            let table = table.clone();
            let counter = Arc::clone(&counter);
            Box::pin(async move {
                if received.meta.aggregate_version == 1
                    && counter.fetch_add(1, AtomicOrdering::SeqCst) < 1
                {
                    return Err(HandlerError::retryable("not yet"));
                }
                record_effect(&table, &received, tx).await
            })
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    assert!(matches!(
        consumer.handle_envelope(&tick("c1", 1)).await.unwrap(),
        Outcome::Retry { .. }
    ));
    assert_eq!(
        consumer.handle_envelope(&tick("c1", 2)).await.unwrap(),
        Outcome::Parked { waiting_for: 1 }
    );
    // Past the park timeout the sweep must not make version 2 the start:
    // a handler was started on version 1.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let report = consumer.sweep().await.unwrap();
    assert_eq!(report.started, 0);
    assert_eq!(report.dead_lettered, 1, "version 2 waited for 1 too long");
    assert!(effects(&db, "pinned").await.is_empty());
    db.drop_schema().await;
}

#[tokio::test]
async fn parked_retries_back_off_like_redeliveries() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let started = Instant::now();
    let starts = Arc::new(AtomicU32::new(0));
    let counter = Arc::clone(&starts);
    let table = db.table("effects");
    let config = ConsumerConfig {
        retry: RetryPolicy {
            max_attempts: 6,
            backoff: Backoff {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(10),
                multiplier: 2.0,
                jitter: 0.0,
            },
            handler_timeout: Duration::from_secs(10),
        },
        sweep_interval: Duration::from_millis(100),
        ..strict(Duration::from_secs(60))
    };
    // Version 2's handler fails for its first 5 seconds.
    let consumer = ConsumerBuilder::new("backoff")
        .config(config)
        .on_fn::<Ticked, _>(move |received, tx| {
            let table = table.clone();
            let counter = Arc::clone(&counter);
            Box::pin(async move {
                if received.meta.aggregate_version == 2 {
                    counter.fetch_add(1, AtomicOrdering::SeqCst);
                    if started.elapsed() < Duration::from_secs(5) {
                        return Err(HandlerError::retryable("dependency still down"));
                    }
                }
                record_effect(&table, &received, tx).await
            })
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let (sender, source) = channel();
    let task = consumer.spawn(source);
    sender.send(&tick("c1", 2)).unwrap();
    sender.send(&tick("c1", 1)).unwrap();
    wait::until("both applied", Duration::from_secs(30), || async {
        effects(&db, "backoff").await.len() == 2
    })
    .await;
    // Starts at about 0, 0.5, 1.5, 3.5 and 7.5 s: applied on the fifth.
    // Retrying at every 100 ms sweep would have used up six attempts
    // within the first second and dead-lettered it.
    let runs = starts.load(AtomicOrdering::SeqCst);
    assert!(
        (4..=6).contains(&runs),
        "version 2 ran {runs} times in {:?}",
        started.elapsed()
    );
    assert!(letters(&db, "backoff").await.is_empty());
    drop(sender);
    task.join().await.unwrap();
    db.drop_schema().await;
}

#[tokio::test]
async fn a_parked_message_settled_elsewhere_during_its_drain_is_not_applied() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let consumer = tick_consumer(
        &db,
        "settled-elsewhere",
        strict(Duration::from_secs(60)),
        Duration::ZERO,
        &[],
    );
    let second = tick("c1", 2);
    assert_eq!(
        consumer.handle_envelope(&second).await.unwrap(),
        Outcome::Parked { waiting_for: 1 }
    );
    failpoint::arm(failpoint::CONSUMER_DRAIN_BETWEEN, Action::Pause, 1);
    let applying = {
        let consumer = consumer.clone();
        tokio::spawn(async move { consumer.handle_envelope(&tick("c1", 1)).await })
    };
    wait::until("the drain paused", Duration::from_secs(10), || async {
        failpoint::is_paused(failpoint::CONSUMER_DRAIN_BETWEEN)
    })
    .await;
    // Another instance settles version 2 inside the window.
    db.execute(&format!(
        "DELETE FROM {{s}}.outbox_consumer_parked WHERE event_id = '{}'",
        second.id
    ))
    .await;
    failpoint::release(failpoint::CONSUMER_DRAIN_BETWEEN);
    assert_eq!(applying.await.unwrap().unwrap(), Outcome::Applied);
    let applied: Vec<i64> = effects(&db, "settled-elsewhere")
        .await
        .iter()
        .map(|e| e.aggregate_version)
        .collect();
    assert_eq!(
        applied,
        vec![1],
        "version 2 was not run after it left the parked table"
    );
    failpoint::disarm(failpoint::CONSUMER_DRAIN_BETWEEN);
    db.drop_schema().await;
}

#[tokio::test]
async fn a_dead_letter_leaves_no_start_count_behind() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let consumer = tick_consumer(
        &db,
        "no-leftovers",
        ConsumerConfig {
            retry: RetryPolicy {
                max_attempts: 2,
                ..RetryPolicy::default()
            },
            ..ConsumerConfig::default()
        },
        Duration::ZERO,
        &["c1"],
    );
    let event = tick("c1", 1);
    assert!(matches!(
        consumer
            .handle(&Incoming::from_envelope(&event, 1))
            .await
            .unwrap(),
        Outcome::Retry { .. }
    ));
    assert!(matches!(
        consumer
            .handle(&Incoming::from_envelope(&event, 2))
            .await
            .unwrap(),
        Outcome::DeadLettered { .. }
    ));
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_consumer_attempts")
            .await,
        0
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn a_batch_instance_and_a_single_instance_on_the_same_events_do_not_deadlock() {
    metrics::install();
    let db = TestDb::with_pool_size(16).await;
    create_effects(&db).await;
    let name = "mixed-modes";
    let batched = tick_consumer(
        &db,
        name,
        ConsumerConfig {
            batch_size: 20,
            ..strict(Duration::from_secs(60))
        },
        Duration::from_millis(5),
        &[],
    );
    let single = tick_consumer(
        &db,
        name,
        strict(Duration::from_secs(60)),
        Duration::from_millis(5),
        &[],
    );
    // Both instances get every message (a redelivery race on a large
    // scale), in opposite aggregate orders.
    let mut forward = Vec::new();
    for version in 1..=10 {
        for counter in 0..8 {
            forward.push(Incoming::from_envelope(
                &tick(&format!("c{counter}"), version),
                1,
            ));
        }
    }
    let mut backward = forward.clone();
    backward.reverse();
    backward.sort_by_key(|i| {
        i.attribute("aggregateversion")
            .unwrap()
            .parse::<i64>()
            .unwrap()
    });
    let errors_before = metrics::counter(m::CONSUMER_ERRORS, &[("consumer", name)]);
    let batch_task = tokio::spawn(async move {
        let mut failures = Vec::new();
        for chunk in forward.chunks(20) {
            if let Err(error) = batched.handle_batch(chunk).await {
                failures.push(error.to_string());
            }
        }
        failures
    });
    let single_task = tokio::spawn(async move {
        let mut failures = Vec::new();
        for incoming in &backward {
            if let Err(error) = single.handle(incoming).await {
                failures.push(error.to_string());
            }
        }
        failures
    });
    let batch_failures = batch_task.await.unwrap();
    let single_failures = single_task.await.unwrap();
    assert!(
        batch_failures.is_empty() && single_failures.is_empty(),
        "batch: {batch_failures:?}\nsingle: {single_failures:?}"
    );
    assert_eq!(
        metrics::counter(m::CONSUMER_ERRORS, &[("consumer", name)]),
        errors_before
    );
    let applied = effects(&db, name).await;
    assert_eq!(applied.len(), 80, "every event applied exactly once");
    for counter in 0..8 {
        let versions: Vec<i64> = applied
            .iter()
            .filter(|e| e.aggregate_id == format!("c{counter}"))
            .map(|e| e.aggregate_version)
            .collect();
        assert_eq!(
            versions,
            (1..=10).collect::<Vec<_>>(),
            "order of c{counter}"
        );
    }
    db.drop_schema().await;
}
