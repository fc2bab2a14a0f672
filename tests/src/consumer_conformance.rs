//! One consumer suite for every store that keeps a consumer's tables: the
//! cases are generic over a [`ConsumerUnderTest`] (a fresh database, a
//! consumer on it whose handler writes one effect row per applied event,
//! the rows read back), so the consumer engine is held to the same
//! promises on PostgreSQL and SQLite: the inbox (a redelivery and a
//! duplicate take effect once), versions out of order under each policy,
//! a strict gap that never closes ends in dead letters naming the missing
//! version, a quarantined version 1 holds its successors, a failed strict
//! start is redelivered and applied in order, a dead letter is replayed
//! once after the fix with an audit row, a handler that ends the
//! consumer's transaction itself is a failed attempt, strict batches
//! decide each message as it would be decided alone, several instances
//! of one consumer share an aggregate's versions without skipping or
//! repeating one, and a NUL character in a payload is kept or refused as
//! the store's columns can hold it.
//!
//! While the failure switch is on, a store's handler fails (retryable) for
//! counters whose name starts with `poison`, and writes its effect and then
//! ends the consumer's transaction itself for counters starting with
//! `rollback` (`ROLLBACK`) or `commit` (`COMMIT`): see [`ending_statement`].

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use outbox_core::Envelope;
use outbox_core::audit::RepairRequest;
use outbox_core::consumer::{
    Consumer, ConsumerConfig, ConsumerStore, HandlerError, Incoming, Ordering, Outcome, Received,
    ReplayOutcome, channel,
};

use crate::consumers::{strict_config, tick};
use crate::events::Ticked;

/// A letter as the cases read it: id, kind, aggregate version, reason,
/// resolution, headers (JSON text), payload.
pub type LetterRow = (
    i64,
    String,
    Option<i64>,
    String,
    Option<String>,
    String,
    Vec<u8>,
);

/// A store under test, with a consumer whose handler records effects.
pub trait ConsumerUnderTest: Sized {
    /// The consumer's store.
    type Store: ConsumerStore;

    /// A fresh database with the outbox tables and an effects table.
    fn fresh() -> impl Future<Output = Self>;

    /// Whether the store's columns hold a NUL character (`\u0000` in a
    /// payload's string): SQLite and MySQL do; PostgreSQL's text and jsonb
    /// do not, so its store refuses such a message.
    const KEEPS_NUL: bool;

    /// A consumer `name` with `config`; its handler fails for `poison…`
    /// counters while `failing` is set.
    fn consumer(
        &self,
        name: &str,
        config: ConsumerConfig,
        failing: Arc<AtomicBool>,
    ) -> Consumer<Self::Store>;

    /// Versions of `counter` the consumer applied, in commit order.
    fn applied(&self, consumer: &str, counter: &str) -> impl Future<Output = Vec<i64>>;

    /// The consumer's letters, oldest first.
    fn letters(&self, consumer: &str) -> impl Future<Output = Vec<LetterRow>>;

    /// Inbox rows of the consumer.
    fn inbox_rows(&self, consumer: &str) -> impl Future<Output = i64>;

    /// Removes what `fresh` created.
    fn finish(self) -> impl Future<Output = ()>;
}

/// The stores' handlers fail (retryable) for `poison…` counters while
/// `failing` is set, and on the first try of about one in thirteen
/// versions of `flaky…` counters (a timeout that the retry gets past).
pub fn poisoned(failing: &AtomicBool, tick: &Received<Ticked>) -> Result<(), HandlerError> {
    let counter = &tick.event.counter;
    if failing.load(AtomicOrdering::SeqCst) && counter.starts_with("poison") {
        return Err(HandlerError::retryable("the ledger is closed"));
    }
    let seed = counter.len() as i64 * 31 + tick.meta.aggregate_version * 7;
    if counter.starts_with("flaky") && tick.meta.attempt == 1 && seed % 13 == 0 {
        return Err(HandlerError::retryable("the first try times out"));
    }
    Ok(())
}

/// The statement the stores' handlers send on the consumer's connection
/// after writing their effect, while `failing` is set, for counters that
/// ask to end the consumer's transaction from inside the handler.
pub fn ending_statement(failing: &AtomicBool, counter: &str) -> Option<&'static str> {
    if !failing.load(AtomicOrdering::SeqCst) {
        return None;
    }
    if counter.starts_with("rollback") {
        Some("ROLLBACK")
    } else if counter.starts_with("commit") {
        Some("COMMIT")
    } else {
        None
    }
}

/// Three quick attempts, a sweep every 100 ms, and `ordering`.
fn config(ordering: Ordering) -> ConsumerConfig {
    ConsumerConfig {
        ordering,
        ..strict_config(Duration::from_secs(60))
    }
}

const STRICT: Ordering = Ordering::Strict {
    park_timeout: Duration::from_secs(60),
};

/// Runs every case on a fresh database of `T` each.
pub async fn run<T: ConsumerUnderTest>() {
    duplicates_take_effect_once::<T>().await;
    versions_out_of_order_under_each_policy::<T>().await;
    a_strict_gap_ends_in_dead_letters_naming_the_missing_version::<T>().await;
    a_quarantined_first_version_holds_its_successors::<T>().await;
    a_failed_strict_start_is_redelivered_and_applied_in_order::<T>().await;
    a_dead_letter_is_replayed_once_with_an_audit_row::<T>().await;
    a_handler_that_ends_the_transaction_itself_is_a_failed_attempt::<T>().await;
    strict_batches_apply_each_aggregate_in_version_order::<T>().await;
    several_instances_apply_every_version_once_in_order::<T>().await;
    a_nul_character_is_applied_or_refused_as_the_store_can_keep_it::<T>().await;
}

/// A NUL character in a payload's string (`\u0000`, valid JSON) is kept
/// where the store's columns can hold it: the message is parked behind its
/// gap and applied in order (SQLite, MySQL). Where they cannot
/// (PostgreSQL), the message is quarantined at once with a reason naming
/// the NUL, not retried at every delivery.
async fn a_nul_character_is_applied_or_refused_as_the_store_can_keep_it<T: ConsumerUnderTest>() {
    let db = T::fresh().await;
    let name = "nul";
    let consumer = db.consumer(name, config(STRICT), Arc::default());
    let mut third = tick("nul-1", 3);
    third.payload = serde_json::value::to_raw_value(&serde_json::json!({
        "counter": "nul-1", "tick": 3, "note": "before\u{0}after"
    }))
    .unwrap();
    assert!(
        std::str::from_utf8(Incoming::from_envelope(&third, 1).payload())
            .unwrap()
            .contains("\\u0000"),
        "the payload carries the NUL as JSON's escape"
    );
    let first = consumer.handle_envelope(&tick("nul-1", 1)).await.unwrap();
    let held = consumer.handle_envelope(&third).await.unwrap();
    let second = consumer.handle_envelope(&tick("nul-1", 2)).await.unwrap();
    assert_eq!((first, &second), (Outcome::Applied, &Outcome::Applied));
    if T::KEEPS_NUL {
        assert_eq!(held, Outcome::Parked { waiting_for: 2 });
        assert_eq!(db.applied(name, "nul-1").await, vec![1, 2, 3]);
        assert!(db.letters(name).await.is_empty());
    } else {
        match held {
            Outcome::Quarantined { reason } => {
                assert!(reason.contains("NUL character"), "{reason}")
            }
            other => panic!("expected a quarantine naming the NUL, got {other:?}"),
        }
        assert_eq!(db.applied(name, "nul-1").await, vec![1, 2]);
        assert_eq!(db.letters(name).await.len(), 1);
    }
    db.finish().await;
}

/// Four instances of one strict consumer (two taking batches of 16, two
/// one message at a time) share 30 aggregates × 12 versions, shuffled, one
/// in ten sent twice, each to any instance; some first tries fail. Every
/// version of every aggregate is applied once, in order, and nothing needs
/// a letter: instances that race on one aggregate (its first version, a
/// sweep, a retry) wait for each other instead of skipping or repeating.
async fn several_instances_apply_every_version_once_in_order<T: ConsumerUnderTest>() {
    let db = T::fresh().await;
    let name = "many";
    let instance = |batch_size: usize| {
        db.consumer(
            name,
            ConsumerConfig {
                batch_size,
                sweep_interval: Duration::from_millis(50),
                ..config(Ordering::Strict {
                    park_timeout: Duration::from_secs(120),
                })
            },
            Arc::default(),
        )
    };
    let instances = [instance(16), instance(16), instance(1), instance(1)];
    let (aggregates, versions) = (30, 12);
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move |below: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % below
    };
    let mut messages: Vec<Envelope> = (0..aggregates)
        .flat_map(|a| (1..=versions).map(move |v| tick(&format!("flaky-{a}"), v)))
        .collect();
    for i in (1..messages.len()).rev() {
        messages.swap(i, next(i as u64 + 1) as usize);
    }
    let mut senders = Vec::new();
    let mut tasks = Vec::new();
    for consumer in &instances {
        let (sender, source) = channel();
        senders.push(sender);
        tasks.push(consumer.spawn(source));
    }
    for message in &messages {
        let copies = if next(10) == 0 { 2 } else { 1 };
        for _ in 0..copies {
            senders[next(senders.len() as u64) as usize]
                .send(message)
                .unwrap();
        }
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    for a in 0..aggregates {
        let counter = format!("flaky-{a}");
        while db.applied(name, &counter).await.len() < versions as usize {
            assert!(
                std::time::Instant::now() < deadline,
                "{counter}: only {:?} applied after 120 s",
                db.applied(name, &counter).await
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(senders);
    for task in tasks {
        task.drain(Duration::from_secs(10)).await.unwrap();
    }
    for a in 0..aggregates {
        assert_eq!(
            db.applied(name, &format!("flaky-{a}")).await,
            (1..=versions).collect::<Vec<i64>>(),
            "aggregate {a}: each version once, in order"
        );
    }
    assert_eq!(
        db.letters(name).await,
        Vec::new(),
        "nothing needed a letter"
    );
    db.finish().await;
}

/// A batch of messages decides each message as it would have been decided
/// alone, in delivery order: an aggregate's versions that arrive out of
/// order in one batch are applied in order, a version past a gap parks,
/// a redelivery in the same batch is a duplicate, and another event at an
/// applied version is stale.
async fn strict_batches_apply_each_aggregate_in_version_order<T: ConsumerUnderTest>() {
    let db = T::fresh().await;
    let consumer = db.consumer(
        "batch",
        ConsumerConfig {
            batch_size: 10,
            ..config(STRICT)
        },
        Arc::default(),
    );
    let deliver = |versions: &[(&str, i64)]| -> Vec<Incoming> {
        versions
            .iter()
            .map(|(counter, v)| Incoming::from_envelope(&tick(counter, *v), 1))
            .collect()
    };
    let outcomes = consumer
        .handle_batch(&deliver(&[
            ("s", 3),
            ("t", 2),
            ("s", 1),
            ("s", 2),
            ("t", 4),
        ]))
        .await
        .unwrap();
    assert_eq!(
        outcomes,
        vec![
            Outcome::Applied,
            Outcome::Parked { waiting_for: 1 },
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Parked { waiting_for: 1 },
        ]
    );
    let s4 = tick("s", 4);
    let mut batch = deliver(&[("t", 1)]);
    batch.push(Incoming::from_envelope(&s4, 1));
    batch.push(Incoming::from_envelope(&s4, 2));
    batch.extend(deliver(&[("s", 4)]));
    let outcomes = consumer.handle_batch(&batch).await.unwrap();
    assert_eq!(
        outcomes,
        vec![
            Outcome::Applied,
            Outcome::Applied,
            Outcome::Duplicate,
            Outcome::Stale { position: Some(4) }
        ],
        "s's 4 twice (a redelivery in the same batch), then another event at s's version 4"
    );
    assert_eq!(db.applied("batch", "s").await, vec![1, 2, 3, 4]);
    assert_eq!(
        db.applied("batch", "t").await,
        vec![1, 2],
        "t's 4 waits for 3"
    );
    db.finish().await;
}

/// What every store says when a handler returned `Ok` without its
/// transaction.
const NOT_COMMITTED: &str = "the inbox row and the position did not commit with its effects";

fn assert_retry_not_committed(outcome: Outcome, what: &str) {
    match outcome {
        Outcome::Retry { error, .. } => assert!(error.contains(NOT_COMMITTED), "{what}: {error}"),
        other => panic!("{what}: expected a retry, got {other:?}"),
    }
}

/// A handler that sends `ROLLBACK` on the consumer's connection and
/// returns `Ok` threw the inbox row and the position away with its
/// effects: acknowledging it would lose the event for this consumer
/// (later statements would even commit one by one). It is a failed
/// attempt under every policy, for a later version and for an aggregate's
/// first (whose strict start is pinned in a transaction of its own before
/// the handler), and the redelivery applies it.
/// With `COMMIT` the handler committed the inbox row with its effects, so
/// the redelivery is a duplicate and the effect is there once.
async fn a_handler_that_ends_the_transaction_itself_is_a_failed_attempt<T: ConsumerUnderTest>() {
    let db = T::fresh().await;
    for (name, ordering) in [
        ("ends-unordered", Ordering::Unordered),
        ("ends-stale", Ordering::RejectStale),
        ("ends-strict", STRICT),
    ] {
        let ending = Arc::new(AtomicBool::new(false));
        let consumer = db.consumer(name, config(ordering), Arc::clone(&ending));
        assert_eq!(
            consumer
                .handle_envelope(&tick("rollback-later", 1))
                .await
                .unwrap(),
            Outcome::Applied
        );
        ending.store(true, AtomicOrdering::SeqCst);
        let later = tick("rollback-later", 2);
        assert_retry_not_committed(
            consumer.handle_envelope(&later).await.unwrap(),
            &format!("{name}, a later version"),
        );
        assert_eq!(db.applied(name, "rollback-later").await, vec![1], "{name}");
        assert_eq!(db.inbox_rows(name).await, 1, "{name}: no inbox row for it");
        let first = tick("rollback-first", 1);
        assert_retry_not_committed(
            consumer.handle_envelope(&first).await.unwrap(),
            &format!("{name}, a first version"),
        );
        assert_eq!(db.applied(name, "rollback-first").await, Vec::<i64>::new());
        ending.store(false, AtomicOrdering::SeqCst);
        for (redelivered, counter, versions) in [
            (&later, "rollback-later", vec![1, 2]),
            (&first, "rollback-first", vec![1]),
        ] {
            assert_eq!(
                consumer
                    .handle(&Incoming::from_envelope(redelivered, 2))
                    .await
                    .unwrap(),
                Outcome::Applied,
                "{name}: the redelivery of {counter}"
            );
            assert_eq!(db.applied(name, counter).await, versions, "{name}");
        }
        assert_eq!(
            consumer
                .handle_envelope(&tick("rollback-later", 3))
                .await
                .unwrap(),
            Outcome::Applied,
            "{name}: the aggregate goes on in order"
        );
    }
    let ending = Arc::new(AtomicBool::new(true));
    let consumer = db.consumer(
        "ends-commit",
        config(Ordering::Unordered),
        Arc::clone(&ending),
    );
    let committed = tick("commit-1", 1);
    assert_retry_not_committed(
        consumer.handle_envelope(&committed).await.unwrap(),
        "a handler's own COMMIT",
    );
    ending.store(false, AtomicOrdering::SeqCst);
    assert_eq!(
        consumer
            .handle(&Incoming::from_envelope(&committed, 2))
            .await
            .unwrap(),
        Outcome::Duplicate,
        "the handler's COMMIT took the inbox row with its effect"
    );
    assert_eq!(db.applied("ends-commit", "commit-1").await, vec![1]);
    db.finish().await;
}

async fn duplicates_take_effect_once<T: ConsumerUnderTest>() {
    let db = T::fresh().await;
    let consumer = db.consumer("inbox", config(Ordering::Unordered), Arc::default());
    let event = tick("c1", 1);
    assert_eq!(
        consumer.handle_envelope(&event).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        consumer.handle_envelope(&event).await.unwrap(),
        Outcome::Duplicate
    );
    assert_eq!(
        consumer
            .handle(&Incoming::from_envelope(&event, 2))
            .await
            .unwrap(),
        Outcome::Duplicate,
        "a redelivery"
    );
    assert_eq!(db.applied("inbox", "c1").await, vec![1]);
    assert_eq!(db.inbox_rows("inbox").await, 1);
    db.finish().await;
}

async fn versions_out_of_order_under_each_policy<T: ConsumerUnderTest>() {
    let db = T::fresh().await;
    for (name, ordering, expected, effects) in [
        (
            "unordered",
            Ordering::Unordered,
            vec![Outcome::Applied; 3],
            vec![1, 3, 2],
        ),
        (
            "stale",
            Ordering::RejectStale,
            vec![
                Outcome::Applied,
                Outcome::Applied,
                Outcome::Stale { position: None },
            ],
            vec![1, 3],
        ),
        (
            "strict",
            STRICT,
            vec![
                Outcome::Applied,
                Outcome::Parked { waiting_for: 2 },
                Outcome::Applied,
            ],
            vec![1, 2, 3],
        ),
    ] {
        let consumer = db.consumer(name, config(ordering), Arc::default());
        let mut outcomes = Vec::new();
        for version in [1, 3, 2] {
            outcomes.push(
                consumer
                    .handle_envelope(&tick("c1", version))
                    .await
                    .unwrap(),
            );
        }
        assert_eq!(outcomes, expected, "{name}");
        assert_eq!(db.applied(name, "c1").await, effects, "{name}");
    }
    db.finish().await;
}

async fn a_strict_gap_ends_in_dead_letters_naming_the_missing_version<T: ConsumerUnderTest>() {
    let db = T::fresh().await;
    let consumer = db.consumer(
        "gap",
        config(Ordering::Strict {
            park_timeout: Duration::from_millis(600),
        }),
        Arc::default(),
    );
    consumer.handle_envelope(&tick("c1", 1)).await.unwrap();
    for version in [3, 4] {
        assert_eq!(
            consumer
                .handle_envelope(&tick("c1", version))
                .await
                .unwrap(),
            Outcome::Parked { waiting_for: 2 }
        );
    }
    assert_eq!(
        consumer.handle_envelope(&tick("c2", 1)).await.unwrap(),
        Outcome::Applied,
        "another aggregate is not held up"
    );
    assert_eq!(consumer.sweep().await.unwrap().dead_lettered, 0);
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(consumer.sweep().await.unwrap().dead_lettered, 2);
    let letters = db.letters("gap").await;
    assert_eq!(
        letters.iter().map(|l| l.2).collect::<Vec<_>>(),
        vec![Some(3), Some(4)]
    );
    for letter in &letters {
        assert_eq!(letter.1, "dead_lettered");
        assert!(
            letter.3.contains("version 2 of counter/c1 did not arrive"),
            "{}",
            letter.3
        );
    }
    // The letters keep the message: its payload and its attributes.
    let payload: serde_json::Value = serde_json::from_slice(&letters[0].6).unwrap();
    assert_eq!(payload["tick"], 3);
    let headers: serde_json::Value = serde_json::from_str(&letters[0].5).unwrap();
    assert_eq!(headers["type"], "counter.ticked");
    assert_eq!(headers["aggregateversion"], "3");
    assert_eq!(db.applied("gap", "c1").await, vec![1]);
    assert_eq!(
        db.inbox_rows("gap").await,
        2,
        "lettered messages hold no inbox row"
    );
    db.finish().await;
}

async fn a_quarantined_first_version_holds_its_successors<T: ConsumerUnderTest>() {
    let db = T::fresh().await;
    let consumer = db.consumer("reader", config(STRICT), Arc::default());
    let first = tick("c1", 1);
    let attributes: Vec<(String, String)> = Incoming::from_envelope(&first, 1)
        .attributes()
        .iter()
        .map(|(k, v)| {
            let v = if k == "schemaversion" {
                "9".to_owned()
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect();
    let unreadable = Incoming::new(attributes, first.payload.get().as_bytes().to_vec(), 1);
    let outcome = consumer.handle(&unreadable).await.unwrap();
    assert!(
        matches!(outcome, Outcome::Quarantined { .. }),
        "{outcome:?}"
    );
    assert_eq!(
        consumer.handle(&unreadable).await.unwrap(),
        Outcome::Duplicate,
        "one quarantine row per message"
    );
    assert_eq!(
        consumer.handle_envelope(&tick("c1", 2)).await.unwrap(),
        Outcome::Parked { waiting_for: 1 },
        "version 2 waits behind the quarantined version 1"
    );
    let letters = db.letters("reader").await;
    assert_eq!(letters.len(), 1);
    assert_eq!(
        (letters[0].1.as_str(), letters[0].2),
        ("quarantined", Some(1))
    );
    db.finish().await;
}

async fn a_failed_strict_start_is_redelivered_and_applied_in_order<T: ConsumerUnderTest>() {
    let db = T::fresh().await;
    let failing = Arc::new(AtomicBool::new(false));
    let consumer = db.consumer("retry", config(STRICT), Arc::clone(&failing));
    assert_eq!(
        consumer
            .handle_envelope(&tick("poison-2", 1))
            .await
            .unwrap(),
        Outcome::Applied
    );
    failing.store(true, AtomicOrdering::SeqCst);
    let second: Envelope = tick("poison-2", 2);
    let outcome = consumer.handle_envelope(&second).await.unwrap();
    assert!(matches!(outcome, Outcome::Retry { .. }), "{outcome:?}");
    assert_eq!(
        consumer
            .handle_envelope(&tick("poison-2", 3))
            .await
            .unwrap(),
        Outcome::Parked { waiting_for: 2 },
        "version 3 waits for the retrying version 2"
    );
    failing.store(false, AtomicOrdering::SeqCst);
    assert_eq!(
        consumer
            .handle(&Incoming::from_envelope(&second, 2))
            .await
            .unwrap(),
        Outcome::Applied
    );
    assert_eq!(db.applied("retry", "poison-2").await, vec![1, 2, 3]);
    db.finish().await;
}

async fn a_dead_letter_is_replayed_once_with_an_audit_row<T: ConsumerUnderTest>() {
    let db = T::fresh().await;
    let failing = Arc::new(AtomicBool::new(true));
    let consumer = db.consumer(
        "ledger",
        config(Ordering::RejectStale),
        Arc::clone(&failing),
    );
    let poison = tick("poison-9", 1);
    let mut last = None;
    for attempt in 1..=3 {
        last = Some(
            consumer
                .handle(&Incoming::from_envelope(&poison, attempt))
                .await
                .unwrap(),
        );
    }
    assert!(
        matches!(last, Some(Outcome::DeadLettered { .. })),
        "{last:?}"
    );
    assert_eq!(
        consumer.handle_envelope(&tick("c1", 1)).await.unwrap(),
        Outcome::Applied,
        "other aggregates go on"
    );
    assert_eq!(
        consumer
            .handle(&Incoming::from_envelope(&poison, 4))
            .await
            .unwrap(),
        Outcome::Duplicate,
        "a redelivery while the letter is open"
    );
    let letter_id = db.letters("ledger").await[0].0;
    failing.store(false, AtomicOrdering::SeqCst);
    let request = RepairRequest::new("ops", "the ledger is open again").unwrap();
    let report = consumer.replay(&[letter_id], &request).await.unwrap();
    assert_eq!(report.letters, vec![(letter_id, ReplayOutcome::Applied)]);
    let again = consumer.replay(&[letter_id], &request).await.unwrap();
    assert_ne!(again.letters[0].1, ReplayOutcome::Applied);
    assert_eq!(db.applied("ledger", "poison-9").await, vec![1]);
    assert_eq!(
        db.letters("ledger").await[0].4.as_deref(),
        Some("replayed: applied")
    );
    db.finish().await;
}
