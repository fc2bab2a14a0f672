//! Consumers against real PostgreSQL, fed directly or through the
//! in-memory source: the inbox under a real race (article test 4), each
//! ordering policy with versions out of order (article test 5), unreadable
//! messages quarantined with a reason and a metric (article test 6, in
//! process; `consumer_nats.rs` does it over JetStream), retries and dead
//! letters for a failing aggregate while others go on, batch mode, the
//! build-time checks and the idempotency key.

use outbox_postgres::prelude::*;
use outbox_postgres::{PgConsumer, PgConsumerBuilder};
use std::sync::Arc;
use std::time::Duration;

use outbox_core::consumer::{
    BuildError, ConsumerBuilder, ConsumerConfig, HandlerError, Incoming, Ordering, Outcome,
    RetryPolicy, channel, idempotency_key,
};
use outbox_core::metrics as m;
use outbox_core::relay::Backoff;
use outbox_core::{Envelope, OutboxEvent, ce};
use outbox_tests::consumers::{
    create_effects, effects, letters, strict_config, tick, tick_consumer,
};
use outbox_tests::events::Ticked;
use outbox_tests::{TestDb, metrics, wait};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

async fn setup() -> TestDb {
    metrics::install();
    let db = TestDb::new().await;
    create_effects(&db).await;
    db
}

fn fast_retry(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        backoff: Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
            multiplier: 2.0,
            jitter: 0.0,
        },
        handler_timeout: Duration::from_secs(10),
    }
}

fn versions(effects: &[outbox_tests::consumers::Effect]) -> Vec<i64> {
    effects.iter().map(|e| e.aggregate_version).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn article_4_the_same_event_at_two_instances_at_once_takes_effect_once() {
    let db = setup().await;
    let name = "article4";
    // Two instances: separate consumers (own handler state) on the same
    // pool, so two connections. The handler holds its transaction open for
    // a while, so the second instance's inbox insert meets an uncommitted
    // row and must wait for the first to commit.
    let first = tick_consumer(
        &db,
        name,
        ConsumerConfig::default(),
        Duration::from_millis(300),
        &[],
    );
    let second = tick_consumer(
        &db,
        name,
        ConsumerConfig::default(),
        Duration::from_millis(300),
        &[],
    );
    let event = tick("c1", 1);
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let run = |consumer: PgConsumer, barrier: Arc<tokio::sync::Barrier>, event: Envelope| {
        tokio::spawn(async move {
            barrier.wait().await;
            consumer
                .handle_envelope(&event)
                .await
                .expect("database reachable")
        })
    };
    let a = run(first, Arc::clone(&barrier), event.clone());
    let b = run(second, Arc::clone(&barrier), event.clone());
    let mut outcomes = vec![a.await.unwrap(), b.await.unwrap()];
    outcomes.sort_by_key(|o| o.label());
    assert_eq!(outcomes, vec![Outcome::Applied, Outcome::Duplicate]);
    assert_eq!(
        effects(&db, name).await.len(),
        1,
        "the business effect happened once"
    );
    assert_eq!(
        metrics::counter(m::CONSUMER_DUPLICATES, &[("consumer", name)]),
        1,
        "the duplicate was counted"
    );
    let inbox: i64 = db
        .scalar("SELECT count(*) FROM {s}.outbox_processed_events WHERE consumer_name = 'article4'")
        .await;
    assert_eq!(inbox, 1);
    db.drop_schema().await;
}

/// Feeds `versions` of counter `c1` (each a distinct event) to a consumer
/// with `ordering` and returns the outcomes and the applied versions.
async fn feed(
    db: &TestDb,
    name: &str,
    ordering: Ordering,
    versions_in: &[i64],
) -> (Vec<Outcome>, Vec<i64>) {
    let consumer = tick_consumer(
        db,
        name,
        ConsumerConfig {
            ordering,
            ..ConsumerConfig::default()
        },
        Duration::ZERO,
        &[],
    );
    let mut outcomes = Vec::new();
    for version in versions_in {
        outcomes.push(
            consumer
                .handle_envelope(&tick("c1", *version))
                .await
                .unwrap(),
        );
    }
    (outcomes, versions(&effects(db, name).await))
}

const STRICT: Ordering = Ordering::Strict {
    park_timeout: Duration::from_secs(60),
};

#[tokio::test]
async fn article_5_versions_1_3_2_under_each_policy() {
    let db = setup().await;
    let (outcomes, applied) = feed(&db, "v132-unordered", Ordering::Unordered, &[1, 3, 2]).await;
    assert_eq!(outcomes, vec![Outcome::Applied; 3]);
    assert_eq!(applied, vec![1, 3, 2], "unordered applies in arrival order");

    let (outcomes, applied) = feed(&db, "v132-stale", Ordering::RejectStale, &[1, 3, 2]).await;
    assert_eq!(
        outcomes,
        vec![
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Stale { position: None }
        ]
    );
    assert_eq!(applied, vec![1, 3], "2 arrived after 3: rejected as stale");
    assert_eq!(
        metrics::counter(
            m::CONSUMER_MESSAGES,
            &[("consumer", "v132-stale"), ("outcome", "stale")]
        ),
        1
    );

    let (outcomes, applied) = feed(&db, "v132-strict", STRICT, &[1, 3, 2]).await;
    assert_eq!(
        outcomes,
        vec![
            Outcome::Applied,
            Outcome::Parked { waiting_for: 2 },
            Outcome::Applied
        ]
    );
    assert_eq!(
        applied,
        vec![1, 2, 3],
        "3 waited for 2, then both applied in order"
    );
    let parked: i64 = db
        .scalar("SELECT count(*) FROM {s}.outbox_consumer_parked")
        .await;
    assert_eq!(parked, 0, "the parked message was drained");
    db.drop_schema().await;
}

#[tokio::test]
async fn article_5_versions_1_2_2_1_under_each_policy() {
    let db = setup().await;
    // Each is a distinct event (new id): a producer that emitted versions
    // twice, or a replay. (The same event id twice is a duplicate for the
    // inbox under every policy: see article test 4.)
    let (outcomes, applied) =
        feed(&db, "v1221-unordered", Ordering::Unordered, &[1, 2, 2, 1]).await;
    assert_eq!(outcomes, vec![Outcome::Applied; 4]);
    assert_eq!(applied, vec![1, 2, 2, 1]);

    let (outcomes, applied) = feed(&db, "v1221-stale", Ordering::RejectStale, &[1, 2, 2, 1]).await;
    let stale = Outcome::Stale { position: None };
    assert_eq!(
        outcomes,
        vec![Outcome::Applied, Outcome::Applied, stale.clone(), stale]
    );
    assert_eq!(applied, vec![1, 2]);

    let (outcomes, applied) = feed(&db, "v1221-strict", STRICT, &[1, 2, 2, 1]).await;
    assert_eq!(
        outcomes,
        vec![
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Stale { position: Some(2) },
            Outcome::Stale { position: Some(2) }
        ]
    );
    assert_eq!(applied, vec![1, 2]);
    db.drop_schema().await;
}

#[tokio::test]
async fn strict_gap_that_never_closes_ends_in_dead_letters_with_the_missing_version() {
    let db = setup().await;
    let name = "strict-timeout";
    let consumer = tick_consumer(
        &db,
        name,
        ConsumerConfig {
            ordering: Ordering::Strict {
                park_timeout: Duration::from_millis(1500),
            },
            ..ConsumerConfig::default()
        },
        Duration::ZERO,
        &[],
    );
    assert_eq!(
        consumer.handle_envelope(&tick("c1", 1)).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        consumer.handle_envelope(&tick("c1", 3)).await.unwrap(),
        Outcome::Parked { waiting_for: 2 }
    );
    assert_eq!(
        consumer.handle_envelope(&tick("c1", 4)).await.unwrap(),
        Outcome::Parked { waiting_for: 2 }
    );
    // Another aggregate is not held up.
    assert_eq!(
        consumer.handle_envelope(&tick("c2", 1)).await.unwrap(),
        Outcome::Applied
    );
    let early = consumer.sweep().await.unwrap();
    assert_eq!(early.dead_lettered, 0, "nothing expires before the timeout");
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let report = consumer.sweep().await.unwrap();
    assert_eq!(report.dead_lettered, 2);
    let letters = letters(&db, name).await;
    assert_eq!(letters.len(), 2);
    for letter in &letters {
        assert_eq!(letter.kind, "dead_lettered");
        assert!(
            letter
                .reason
                .contains("version 2 of counter/c1 did not arrive"),
            "{}",
            letter.reason
        );
    }
    assert_eq!(
        letters
            .iter()
            .map(|l| l.aggregate_version.unwrap())
            .collect::<Vec<_>>(),
        vec![3, 4]
    );
    let payload: serde_json::Value = serde_json::from_slice(&letters[0].payload).unwrap();
    assert_eq!(payload["tick"], 3, "the dead letter keeps the payload");
    assert_eq!(versions(&effects(&db, name).await), vec![1, 1]);
    db.drop_schema().await;
}

fn raw(attributes: &[(&str, &str)], payload: &str) -> Incoming {
    Incoming::new(
        attributes
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        payload.as_bytes().to_vec(),
        1,
    )
}

/// The attributes of a valid tick message, with `overrides` applied.
fn tick_attributes(overrides: &[(&'static str, &'static str)]) -> Vec<(&'static str, String)> {
    let envelope = tick("c9", 1);
    envelope
        .cloudevents_attributes("/test")
        .into_iter()
        .map(|(name, value)| {
            let value = overrides
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
                .unwrap_or(value);
            (name, value)
        })
        .collect()
}

/// Input that used to fail the consumer's own statements at every
/// delivery, so the message was redelivered forever instead of
/// quarantined: an id header with a NUL in it (the UUID parser's error
/// quotes the character, and PostgreSQL's `text` refuses NUL in the
/// reason), and versions at the ends of i64 under `Strict` (the version
/// before `i64::MIN` does not exist). Each is quarantined with a printable
/// reason, and the next message is applied.
#[tokio::test]
async fn a_nul_in_an_id_or_a_version_at_the_end_of_i64_is_quarantined_not_redelivered_forever() {
    let db = setup().await;
    let name = "poison-attributes";
    let consumer = tick_consumer(
        &db,
        name,
        strict_config(Duration::from_secs(60)),
        Duration::ZERO,
        &[],
    );
    let payload = tick("p1", 1).payload.get().to_owned();
    let nul_id = "\u{0}0000000-0000-0000-0000-000000000000";
    let cases: Vec<(Vec<(&'static str, String)>, &str)> = vec![
        (tick_attributes(&[(ce::ID, nul_id)]), "\\u{0}"),
        (
            tick_attributes(&[(ce::AGGREGATEVERSION, "-9223372036854775808")]),
            "out of range",
        ),
        (
            tick_attributes(&[(ce::AGGREGATEVERSION, "9223372036854775807")]),
            "out of range",
        ),
    ];
    for (attributes, expected) in &cases {
        let attributes: Vec<(&str, &str)> =
            attributes.iter().map(|(k, v)| (*k, v.as_str())).collect();
        match consumer.handle(&raw(&attributes, &payload)).await {
            Ok(Outcome::Quarantined { reason }) => {
                assert!(reason.contains(expected), "{reason} lacks {expected}");
                assert!(!reason.contains('\0'), "{reason:?}");
            }
            other => panic!("expected quarantine ({expected}), got {other:?}"),
        }
    }
    let letters = letters(&db, name).await;
    assert_eq!(letters.len(), cases.len());
    assert!(
        letters[0].reason.contains("\\u{0}"),
        "{}",
        letters[0].reason
    );
    assert_eq!(
        consumer.handle_envelope(&tick("p1", 1)).await.unwrap(),
        Outcome::Applied
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn article_6_unreadable_messages_are_quarantined_with_a_reason_and_the_next_is_processed() {
    let db = setup().await;
    let name = "article6";
    let consumer = tick_consumer(&db, name, ConsumerConfig::default(), Duration::ZERO, &[]);
    let valid_payload = tick("c9", 1).payload.get().to_owned();
    // (attributes, payload, what the reason must say)
    type Case = (Vec<(&'static str, String)>, String, &'static str);
    let cases: Vec<Case> = vec![
        (
            tick_attributes(&[(ce::SCHEMAVERSION, "9")]),
            valid_payload.clone(),
            "schema version 9 is newer",
        ),
        (
            tick_attributes(&[(ce::SCHEMAVERSION, "two")]),
            valid_payload.clone(),
            "invalid CloudEvents attribute `schemaversion`",
        ),
        (
            tick_attributes(&[(ce::TYPE, "counter.exploded")]),
            valid_payload.clone(),
            "unknown event type \"counter.exploded\"",
        ),
        (
            tick_attributes(&[]),
            r#"{"counter": "c9", "tick": "many"}"#.to_owned(),
            "payload does not match",
        ),
        (tick_attributes(&[]), "not json".to_owned(), "not JSON"),
    ];
    for (attributes, payload, expected) in &cases {
        let attributes: Vec<(&str, &str)> =
            attributes.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let outcome = consumer.handle(&raw(&attributes, payload)).await.unwrap();
        match outcome {
            Outcome::Quarantined { reason } => {
                assert!(reason.contains(expected), "{reason} lacks {expected}")
            }
            other => panic!("expected quarantine ({expected}), got {other:?}"),
        }
    }
    // The next valid message is processed.
    assert_eq!(
        consumer.handle_envelope(&tick("c9", 1)).await.unwrap(),
        Outcome::Applied
    );
    let letters = letters(&db, name).await;
    assert_eq!(letters.len(), cases.len());
    assert!(letters.iter().all(|l| l.kind == "quarantined"));
    assert_eq!(letters[0].headers["schemaversion"], "9", "headers are kept");
    assert_eq!(letters[4].payload, b"not json", "the raw bytes are kept");
    assert_eq!(
        metrics::counter(m::CONSUMER_QUARANTINED, &[("consumer", name)]),
        cases.len() as u64
    );
    assert_eq!(versions(&effects(&db, name).await), vec![1]);
    db.drop_schema().await;
}

#[tokio::test]
async fn a_failing_aggregate_ends_in_dead_letters_while_the_others_go_on() {
    let db = setup().await;
    let name = "poison";
    let consumer = tick_consumer(
        &db,
        name,
        ConsumerConfig {
            retry: fast_retry(3),
            ..ConsumerConfig::default()
        },
        Duration::ZERO,
        &["bad"],
    );
    let (sender, source) = channel();
    let stats = source.stats();
    let task = consumer.spawn(source);
    let bad = tick("bad", 1);
    sender.send(&bad).unwrap();
    for counter in 0..20 {
        sender.send(&tick(&format!("good{counter}"), 1)).unwrap();
    }
    wait::until(
        "20 good events applied and 1 dead letter",
        Duration::from_secs(20),
        || async { effects(&db, name).await.len() == 20 && letters(&db, name).await.len() == 1 },
    )
    .await;
    let letter = &letters(&db, name).await[0];
    assert_eq!(letter.kind, "dead_lettered");
    assert_eq!(letter.aggregate_id.as_deref(), Some("bad"));
    assert_eq!(letter.attempts, 3);
    assert!(
        letter.reason.contains("handler failed on 3 deliveries")
            && letter.reason.contains("downstream refuses counter bad"),
        "{}",
        letter.reason
    );
    assert_eq!(stats.retried(), 2, "two redeliveries, then the dead letter");
    assert_eq!(stats.acked(), 21);
    assert_eq!(
        metrics::counter(m::CONSUMER_DEAD_LETTERED, &[("consumer", name)]),
        1
    );
    // A redelivery of the dead-lettered message is a duplicate now.
    assert_eq!(
        consumer
            .handle(&Incoming::from_envelope(&bad, 4))
            .await
            .unwrap(),
        Outcome::Duplicate
    );
    task.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}

#[tokio::test]
async fn a_panicking_or_hanging_handler_is_a_failed_attempt_not_a_dead_consumer() {
    let db = setup().await;
    let consumer = ConsumerBuilder::new("panics")
        .retry(RetryPolicy {
            handler_timeout: Duration::from_millis(200),
            ..fast_retry(2)
        })
        .on_fn::<Ticked, _>(|received, _tx| {
            Box::pin(async move {
                if received.event.counter == "hang" {
                    std::future::pending::<()>().await;
                }
                panic!("handler bug on {}", received.event.counter)
            })
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let boom = tick("boom", 1);
    match consumer
        .handle(&Incoming::from_envelope(&boom, 1))
        .await
        .unwrap()
    {
        Outcome::Retry { error, .. } => assert!(
            error.contains("handler panicked: handler bug on boom"),
            "{error}"
        ),
        other => panic!("expected a retry, got {other:?}"),
    }
    match consumer
        .handle(&Incoming::from_envelope(&boom, 2))
        .await
        .unwrap()
    {
        Outcome::DeadLettered { reason } => {
            assert!(reason.contains("failed on 2 deliveries"), "{reason}")
        }
        other => panic!("expected a dead letter, got {other:?}"),
    }
    match consumer.handle_envelope(&tick("hang", 1)).await.unwrap() {
        Outcome::Retry { error, .. } => assert!(error.contains("timed out after 200ms"), "{error}"),
        other => panic!("expected a retry, got {other:?}"),
    }
    db.drop_schema().await;
}

#[tokio::test]
async fn batch_mode_gives_each_message_the_outcome_it_would_have_alone() {
    let db = setup().await;
    let name = "batch";
    let consumer = tick_consumer(
        &db,
        name,
        ConsumerConfig {
            batch_size: 10,
            ordering: Ordering::RejectStale,
            retry: fast_retry(5),
            ..ConsumerConfig::default()
        },
        Duration::ZERO,
        &["bad"],
    );
    let a1 = tick("a", 1);
    let a2 = tick("a", 2);
    let b1 = tick("b", 1);
    let already = tick("c", 1);
    assert_eq!(
        consumer.handle_envelope(&already).await.unwrap(),
        Outcome::Applied
    );
    let clean = [
        Incoming::from_envelope(&a1, 1),
        Incoming::from_envelope(&b1, 1),
        Incoming::from_envelope(&a1, 1),
        Incoming::from_envelope(&already, 2),
        Incoming::from_envelope(&a2, 1),
        Incoming::from_envelope(&tick("a", 1), 1),
        raw(&[("id", "x")], "{}"),
    ];
    let outcomes = consumer.handle_batch(&clean).await.unwrap();
    assert_eq!(
        &outcomes[..6],
        &[
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Duplicate,
            Outcome::Duplicate,
            Outcome::Applied,
            Outcome::Stale { position: None },
        ]
    );
    assert!(matches!(outcomes[6], Outcome::Quarantined { .. }));
    // A failing handler in a batch: the batch rolls back and every message
    // gets its own transaction.
    let d1 = tick("d", 1);
    let failing = [
        Incoming::from_envelope(&d1, 1),
        Incoming::from_envelope(&tick("bad", 1), 1),
        Incoming::from_envelope(&tick("e", 1), 1),
    ];
    let outcomes = consumer.handle_batch(&failing).await.unwrap();
    assert_eq!(outcomes[0], Outcome::Applied);
    assert!(
        matches!(outcomes[1], Outcome::Retry { .. }),
        "{:?}",
        outcomes[1]
    );
    assert_eq!(outcomes[2], Outcome::Applied);
    let applied: Vec<(String, i64)> = effects(&db, name)
        .await
        .into_iter()
        .map(|e| (e.aggregate_id, e.aggregate_version))
        .collect();
    let expected: Vec<(String, i64)> = [("c", 1), ("a", 1), ("b", 1), ("a", 2), ("d", 1), ("e", 1)]
        .into_iter()
        .map(|(a, v)| (a.to_owned(), v))
        .collect();
    assert_eq!(
        applied, expected,
        "each effect once, none from the rolled-back batch"
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn handlers_get_a_stable_idempotency_key_per_consumer_and_event() {
    let db = setup().await;
    let event = tick("k", 1);
    for name in ["keys-a", "keys-b"] {
        let consumer = tick_consumer(&db, name, ConsumerConfig::default(), Duration::ZERO, &[]);
        consumer.handle_envelope(&event).await.unwrap();
        let seen = effects(&db, name).await;
        assert_eq!(seen[0].idempotency_key, idempotency_key(name, event.id));
    }
    let a = effects(&db, "keys-a").await[0].idempotency_key;
    let b = effects(&db, "keys-b").await[0].idempotency_key;
    assert_ne!(a, b, "each consumer has its own key for one event");
    db.drop_schema().await;
}

/// An old version whose successor cannot read it (no upcaster).
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "legacy.noted", aggregate = "legacy", version = 1)]
struct LegacyNotedV1 {
    #[outbox(aggregate_id)]
    id: String,
}

/// v2 without an upcaster from v1.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "legacy.noted", aggregate = "legacy", version = 2)]
struct LegacyNoted {
    #[outbox(aggregate_id)]
    id: String,
    note: String,
}

#[tokio::test]
async fn build_reports_every_registration_problem_at_once() {
    let db = setup().await;
    let errors = ConsumerBuilder::new("bad name")
        .on_fn::<LegacyNoted, _>(|_, _| Box::pin(async { Ok(()) }))
        .on_fn::<LegacyNotedV1, _>(|_, _| Box::pin(async { Ok(()) }))
        .batch_size(0)
        .build(db.pool.clone(), db.schema.clone())
        .unwrap_err();
    let text = errors.to_string();
    assert_eq!(errors.0.len(), 5, "{text}");
    assert!(
        matches!(errors.0[0], BuildError::Config(_)) && text.contains("consumer name"),
        "{text}"
    );
    assert!(text.contains("batch_size"), "{text}");
    assert!(
        errors
            .0
            .iter()
            .any(|e| matches!(e, BuildError::Unreachable { version: 1, .. })),
        "{text}"
    );
    assert!(
        errors.0.iter().any(|e| matches!(
            e,
            BuildError::NotNewest {
                handler_version: 1,
                newest: 2,
                ..
            }
        )),
        "{text}"
    );
    assert!(
        errors.0.iter().any(|e| matches!(
            e,
            BuildError::DuplicateHandler {
                event_type: "legacy.noted",
                ..
            }
        )),
        "{text}"
    );
    let empty = ConsumerBuilder::new("empty")
        .build(db.pool.clone(), db.schema.clone())
        .unwrap_err();
    assert!(matches!(empty.0[0], BuildError::NoHandlers { .. }));
    db.drop_schema().await;
}

#[tokio::test]
async fn a_message_that_kills_its_handler_every_time_ends_in_dead_letters_after_max_attempts_starts()
 {
    let db = setup().await;
    let name = "crash-loop";
    // The handler of counter "crash" never finishes; dropping `handle`
    // mid-handler is what a process crash does to it (the transaction
    // rolls back, nothing is acknowledged).
    let consumer = tick_consumer(
        &db,
        name,
        ConsumerConfig {
            retry: fast_retry(3),
            ..ConsumerConfig::default()
        },
        Duration::from_secs(3600),
        &[],
    );
    let event = tick("crash", 1);
    for delivery in 1..=3 {
        let crashed = tokio::time::timeout(
            Duration::from_millis(300),
            consumer.handle(&Incoming::from_envelope(&event, delivery)),
        )
        .await;
        assert!(
            crashed.is_err(),
            "delivery {delivery} ran the handler (and 'crashed')"
        );
    }
    // Fourth delivery: three starts without an outcome are enough.
    match consumer
        .handle(&Incoming::from_envelope(&event, 4))
        .await
        .unwrap()
    {
        Outcome::DeadLettered { reason } => {
            assert!(
                reason.contains("started 3 times without an outcome"),
                "{reason}"
            )
        }
        other => panic!("expected a dead letter, got {other:?}"),
    }
    let letters = letters(&db, name).await;
    assert_eq!(letters.len(), 1);
    assert_eq!(letters[0].event_id, Some(event.id));
    // The effects of the crashed runs rolled back.
    assert!(effects(&db, name).await.is_empty());
    let counters: i64 = db
        .scalar("SELECT count(*) FROM {s}.outbox_consumer_attempts")
        .await;
    assert_eq!(counters, 0, "the start count goes with the settled message");

    // A redelivery that succeeds clears its count too, and one that could
    // not start (here: a first delivery that crashed) is not held against it.
    let other = tick("recovers", 1);
    let quick = tick_consumer(
        &db,
        "crash-loop-recovers",
        ConsumerConfig {
            retry: fast_retry(3),
            ..ConsumerConfig::default()
        },
        Duration::ZERO,
        &[],
    );
    assert_eq!(
        quick
            .handle(&Incoming::from_envelope(&other, 7))
            .await
            .unwrap(),
        Outcome::Applied,
        "a high broker delivery count alone does not dead-letter"
    );
    let counters: i64 = db
        .scalar("SELECT count(*) FROM {s}.outbox_consumer_attempts")
        .await;
    assert_eq!(counters, 0);
    db.drop_schema().await;
}

/// Under each policy, for an aggregate's first version and for a later
/// one (whose strict position the claim moves at once, so that the
/// transaction is checked in the commit's own round trip).
#[tokio::test]
async fn a_handler_that_swallows_a_statement_error_does_not_get_its_message_acknowledged() {
    let db = setup().await;
    for (name, ordering) in [
        ("swallows", Ordering::Unordered),
        ("swallows-stale", Ordering::RejectStale),
        ("swallows-strict", STRICT),
    ] {
        let consumer = ConsumerBuilder::new(name)
            .ordering(ordering)
            .retry(fast_retry(3))
            .on_fn::<Ticked, _>(|tick, tx| {
                Box::pin(async move {
                    // "first" swallows at version 1, "later" at version 2.
                    let swallow = match tick.event.counter.as_str() {
                        "first" => tick.meta.aggregate_version == 1,
                        _ => tick.meta.aggregate_version == 2,
                    };
                    if swallow {
                        // The error is caught and ignored; the transaction is now failed.
                        let _ = sqlx::query("SELECT 1 / 0").execute(&mut *tx).await;
                    }
                    Ok(())
                })
            })
            .build(db.pool.clone(), db.schema.clone())
            .unwrap();
        assert_eq!(
            consumer.handle_envelope(&tick("later", 1)).await.unwrap(),
            Outcome::Applied,
            "{name}"
        );
        for (counter, version) in [("first", 1), ("later", 2)] {
            match consumer
                .handle_envelope(&tick(counter, version))
                .await
                .unwrap()
            {
                Outcome::Retry { error, .. } => {
                    assert!(error.contains("error was swallowed"), "{name}: {error}")
                }
                other => panic!("{name}, {counter} v{version}: expected a retry, got {other:?}"),
            }
        }
        let inbox: i64 = db
            .scalar(&format!(
                "SELECT count(*) FROM {{s}}.outbox_processed_events WHERE consumer_name = '{name}'"
            ))
            .await;
        assert_eq!(inbox, 1, "{name}: only later v1 was recorded as processed");
        let position: Option<i64> = db
            .scalar(&format!(
                "SELECT max(version) FROM {{s}}.outbox_consumer_positions
                 WHERE consumer_name = '{name}' AND aggregate_id = 'later'"
            ))
            .await;
        if name != "swallows" {
            assert_eq!(position, Some(1), "{name}: the position stays at version 1");
        }
    }
    db.drop_schema().await;
}

/// A COMMIT that fails (a deferred constraint the handler's row breaks) is
/// a database error, not an applied message, on the path where the check
/// after the handler rides on the commit: nothing of the transaction
/// commits (no inbox row, no position, no effect), and the redelivery,
/// once the row it refers to exists, applies it once.
#[tokio::test]
async fn a_commit_that_fails_settles_nothing_and_the_redelivery_applies_it() {
    let db = setup().await;
    db.execute("CREATE TABLE {s}.parents (id text PRIMARY KEY)")
        .await;
    db.execute(
        "CREATE TABLE {s}.children (parent text NOT NULL
             REFERENCES {s}.parents (id) DEFERRABLE INITIALLY DEFERRED)",
    )
    .await;
    let insert = format!(
        "INSERT INTO {}.children (parent) VALUES ($1)",
        db.schema.quoted()
    );
    let consumer = ConsumerBuilder::new("deferred")
        .ordering(Ordering::RejectStale)
        .retry(fast_retry(3))
        .on_fn::<Ticked, _>(move |tick, tx| {
            let insert = insert.clone();
            Box::pin(async move {
                sqlx::query(sqlx::AssertSqlSafe(insert))
                    .bind(&tick.event.counter)
                    .execute(&mut *tx)
                    .await
                    .map_err(HandlerError::retryable)?;
                Ok(())
            })
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let event = tick("orphan", 1);
    let error = consumer.handle_envelope(&event).await.unwrap_err();
    assert_eq!(
        error.doing, "committing the handler's transaction",
        "{error}"
    );
    assert!(error.to_string().contains("foreign key"), "{error}");
    let settled: i64 = db
        .scalar(
            "SELECT (SELECT count(*) FROM {s}.outbox_processed_events)
                  + (SELECT count(*) FROM {s}.outbox_consumer_positions)
                  + (SELECT count(*) FROM {s}.children)",
        )
        .await;
    assert_eq!(settled, 0, "no inbox row, position or effect committed");
    db.execute("INSERT INTO {s}.parents (id) VALUES ('orphan')")
        .await;
    assert_eq!(
        consumer
            .handle(&Incoming::from_envelope(&event, 2))
            .await
            .unwrap(),
        Outcome::Applied
    );
    let children: i64 = db.scalar("SELECT count(*) FROM {s}.children").await;
    assert_eq!(children, 1);
    db.drop_schema().await;
}

#[tokio::test]
async fn strict_ordering_counts_the_versions_of_skipped_event_types() {
    use outbox_examples::contracts::{CancelReason, OrderCancelled, OrderCreated, OrderShipped};
    let db = setup().await;
    let created = outbox_tests::consumers::effect_handler::<OrderCreated>(db.table("effects"));
    // Without a word about the other order events, strict ordering would
    // wait forever for their versions: refused at build time.
    let errors = ConsumerBuilder::new("orders-strict")
        .ordering(STRICT)
        .on_fn::<OrderCreated, _>(created.clone())
        .build(db.pool.clone(), db.schema.clone())
        .unwrap_err();
    let text = errors.to_string();
    assert!(
        text.contains("order.shipped") && text.contains("order.cancelled"),
        "{text}"
    );
    assert!(
        errors
            .0
            .iter()
            .all(|e| matches!(e, BuildError::StrictUnhandled { .. })),
        "{text}"
    );

    let consumer = ConsumerBuilder::new("orders-strict")
        .ordering(STRICT)
        .on_fn::<OrderCreated, _>(created)
        .ignore("order.shipped")
        .ignore("order.cancelled")
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    assert_eq!(
        consumer.subscribed_types(),
        vec![
            ("order", "order.cancelled"),
            ("order", "order.created"),
            ("order", "order.shipped")
        ]
    );
    let order_id = uuid::Uuid::now_v7();
    let v1 = Envelope::for_event(
        &OrderCreated {
            order_id,
            customer_email: "a@example.org".into(),
            lines: Vec::new(),
            total: outbox_examples::contracts::Money {
                amount_minor: 1,
                currency: "EUR".into(),
            },
        },
        1,
    )
    .unwrap();
    let v2 = Envelope::for_event(
        &OrderShipped {
            order_id,
            carrier: "DHL".into(),
            tracking_number: None,
            shipped_at: chrono::Utc::now(),
        },
        2,
    )
    .unwrap();
    let v3 = Envelope::for_event(
        &OrderCancelled {
            order_id,
            reason: CancelReason::Other,
            note: None,
        },
        3,
    )
    .unwrap();
    assert_eq!(
        consumer.handle_envelope(&v1).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        consumer.handle_envelope(&v3).await.unwrap(),
        Outcome::Parked { waiting_for: 2 }
    );
    assert_eq!(
        consumer.handle_envelope(&v2).await.unwrap(),
        Outcome::Ignored
    );
    let position: i64 = db
        .scalar("SELECT version FROM {s}.outbox_consumer_positions WHERE consumer_name = 'orders-strict'")
        .await;
    assert_eq!(
        position, 3,
        "the skipped versions moved the position, the parked one too"
    );
    assert_eq!(effects(&db, "orders-strict").await.len(), 1);
    db.drop_schema().await;
}

fn explode_v1(_: serde_json::Value) -> Result<serde_json::Value, outbox_core::UpcastError> {
    panic!("upcaster bug")
}

/// A contract whose upcaster panics.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "fragile.noted", aggregate = "fragile", version = 2, upcast(from = 1, with = explode_v1))]
struct FragileNoted {
    #[outbox(aggregate_id)]
    id: String,
}

#[tokio::test]
async fn a_panicking_upcaster_or_a_nul_character_quarantines_the_message() {
    let db = setup().await;
    let name = "fragile";
    let consumer = ConsumerBuilder::new(name)
        .on_fn::<FragileNoted, _>(|_, _| Box::pin(async { Ok(()) }))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let mut old = Envelope::for_event(&FragileNoted { id: "f1".into() }, 1).unwrap();
    old.schema_version = 1;
    match consumer.handle_envelope(&old).await.unwrap() {
        Outcome::Quarantined { reason } => {
            assert!(reason.contains("panicked: upcaster bug"), "{reason}")
        }
        other => panic!("expected quarantine, got {other:?}"),
    }
    let mut nul = Envelope::for_event(&FragileNoted { id: "f2".into() }, 1).unwrap();
    nul.payload = serde_json::value::to_raw_value(&serde_json::json!({"id": "f\u{0}2"})).unwrap();
    match consumer.handle_envelope(&nul).await.unwrap() {
        Outcome::Quarantined { reason } => assert!(reason.contains("NUL character"), "{reason}"),
        other => panic!("expected quarantine, got {other:?}"),
    }
    let mut attributes: Vec<(String, String)> =
        Incoming::from_envelope(&nul, 1).attributes().to_vec();
    attributes.push(("subject".into(), "a\u{0}b".into()));
    let outcome = consumer
        .handle(&Incoming::new(attributes, b"{}".to_vec(), 1))
        .await
        .unwrap();
    assert!(
        matches!(outcome, Outcome::Quarantined { .. }),
        "{outcome:?}"
    );
    assert_eq!(letters(&db, name).await.len(), 3);
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_batches_on_two_instances_wait_for_each_other_instead_of_deadlocking() {
    let db = setup().await;
    let name = "batch-overlap";
    let config = ConsumerConfig {
        batch_size: 10,
        ordering: Ordering::RejectStale,
        ..ConsumerConfig::default()
    };
    // Handlers hold their transaction, so the two batches overlap.
    let first = tick_consumer(&db, name, config.clone(), Duration::from_millis(200), &[]);
    let second = tick_consumer(&db, name, config, Duration::from_millis(200), &[]);
    let forward = vec![
        Incoming::from_envelope(&tick("x", 1), 1),
        Incoming::from_envelope(&tick("y", 1), 1),
    ];
    let backward = vec![
        Incoming::from_envelope(&tick("y", 2), 1),
        Incoming::from_envelope(&tick("x", 2), 1),
    ];
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let run = |consumer: PgConsumer, batch: Vec<Incoming>, barrier: Arc<tokio::sync::Barrier>| {
        tokio::spawn(async move {
            barrier.wait().await;
            consumer.handle_batch(&batch).await
        })
    };
    let a = run(first, forward, Arc::clone(&barrier));
    let b = run(second, backward, Arc::clone(&barrier));
    let (a, b) = (a.await.unwrap(), b.await.unwrap());
    let a = a.expect("no deadlock for the first batch");
    let b = b.expect("no deadlock for the second batch");
    assert!(
        a.iter()
            .chain(&b)
            .all(|o| matches!(o, Outcome::Applied | Outcome::Stale { .. }))
    );
    assert_eq!(
        effects(&db, name).await.len() as usize,
        a.iter()
            .chain(&b)
            .filter(|o| **o == Outcome::Applied)
            .count()
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn builder_settings_compose_in_any_order() {
    let db = TestDb::new().await;
    let strict = Ordering::Strict {
        park_timeout: Duration::from_secs(30),
    };
    let base = ConsumerConfig {
        batch_size: 50,
        sweep_interval: Duration::from_millis(250),
        ..ConsumerConfig::default()
    };
    let build = |builder: PgConsumerBuilder| {
        builder
            .on_fn::<Ticked, _>(|_, _| Box::pin(async { Ok(()) }))
            .build(db.pool.clone(), db.schema.clone())
            .unwrap()
    };
    // The ordering set before the config is not reset by it.
    let before = build(
        ConsumerBuilder::new("before")
            .ordering(strict)
            .batch_size(7)
            .config(base.clone()),
    );
    let after = build(
        ConsumerBuilder::new("after")
            .config(base.clone())
            .ordering(strict)
            .batch_size(7),
    );
    for consumer in [&before, &after] {
        assert_eq!(consumer.config().ordering, strict, "{}", consumer.name());
        assert_eq!(consumer.config().batch_size, 7, "{}", consumer.name());
        assert_eq!(
            consumer.config().sweep_interval,
            Duration::from_millis(250),
            "the config's other settings hold: {}",
            consumer.name()
        );
    }
    db.drop_schema().await;
}

#[tokio::test]
async fn batch_handlers_run_with_the_sessions_planner_settings() {
    let db = setup().await;
    // The batch's own statements use generic plans; the handlers' must be
    // planned as the session plans them.
    let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let record = Arc::clone(&seen);
    let consumer = ConsumerBuilder::new("planner")
        .batch_size(10)
        .on_fn::<Ticked, _>(move |_, tx| {
            let record = Arc::clone(&record);
            Box::pin(async move {
                let mode: String = sqlx::query_scalar("SELECT current_setting('plan_cache_mode')")
                    .fetch_one(&mut *tx)
                    .await?;
                record.lock().unwrap().push(mode);
                Ok(())
            })
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let batch: Vec<Incoming> = (1..=4)
        .map(|v| Incoming::from_envelope(&tick("p", v), 1))
        .collect();
    let outcomes = consumer.handle_batch(&batch).await.unwrap();
    assert!(
        outcomes.iter().all(|o| *o == Outcome::Applied),
        "{outcomes:?}"
    );
    assert_eq!(*seen.lock().unwrap(), vec!["auto"; 4]);
    db.drop_schema().await;
}
