//! The transport conformance suite: the same cases, unchanged, for every
//! broker crate. A broker takes part by implementing [`Broker`] (how to
//! build its transport and a consumer's source, how to take it down and
//! bring it back); `tests/tests/conformance_<broker>.rs` runs each case.
//!
//! The cases: a batch with one message the broker refuses for good gets
//! per-message outcomes; awkward aggregate ids travel through headers,
//! keys and subjects and arrive unchanged; each aggregate's versions reach
//! the consumer in order; a consumer that "crashes" after its commit and
//! before its acks gets the messages again and applies them once; a broker
//! that goes down while the relay runs leaves events pending (no attempt
//! used up) and they are published, in order, when it is back; an event
//! the broker refuses for good fails alone while its aggregate waits and
//! other aggregates continue.

use outbox_postgres::PgConsumer;
use outbox_postgres::prelude::*;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_core::consumer::{ConsumerConfig, Delivery, Incoming, MessageSource, SourceError};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::transport::Transport;
use outbox_core::{Envelope, EventDraft};
use sqlx::AssertSqlSafe;

pub mod kafka;
pub mod nats;
pub mod rabbitmq;

use crate::consumers::{create_effects, effects, tick_consumer};
use crate::events::Ticked;
use crate::{TestDb, wait};

/// The aggregate ids every transport must carry unchanged.
pub fn awkward_ids() -> Vec<String> {
    vec![
        "a.b".into(),
        "a b".into(),
        "a%20b".into(),
        "Zoë 100%".into(),
        "*".into(),
        ">".into(),
        "line\nbreak".into(),
        "#".into(),
        "x".repeat(1024),
    ]
}

/// The payload size no broker under test accepts: every harness sets (or
/// has) a 1 MiB message limit.
pub const REFUSED_PAYLOAD_BYTES: usize = 2 * 1024 * 1024;

/// A broker under test.
#[allow(async_fn_in_trait)]
pub trait Broker {
    /// Its transport.
    type Transport: Transport;
    /// Its message source.
    type Source: MessageSource;

    /// A short name for messages (`nats`).
    fn name(&self) -> &'static str;
    /// A transport connected to this broker, with a 1 MiB message limit.
    async fn transport(&self) -> Self::Transport;
    /// A source for `consumer`, subscribed before this returns (so events
    /// published afterwards reach it), and whose unacknowledged messages
    /// come back to the next source of the same consumer once it is
    /// dropped (within a few seconds).
    async fn source(&self, consumer: &PgConsumer) -> Self::Source;
    /// Takes the broker down for the transport and the sources.
    async fn stop(&mut self);
    /// Brings it back.
    async fn start(&mut self);
}

/// A consumer name unique to this process and call.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, AtomicOrdering::Relaxed)
    )
}

fn relay_config() -> RelayConfig {
    RelayConfig {
        poll_interval: Duration::from_millis(50),
        stats_interval: Duration::ZERO,
        error_backoff: Duration::from_millis(200),
        ..RelayConfig::default()
    }
}

async fn start_relay<B: Broker>(db: &TestDb, broker: &B, config: RelayConfig) -> Relay {
    Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        broker.transport().await,
        config,
    )
    .await
    .expect("the relay starts")
}

async fn setup() -> TestDb {
    let db = TestDb::new().await;
    create_effects(&db).await;
    db
}

async fn emit(db: &TestDb, events: &[Ticked]) {
    let mut tx = db.pool.begin().await.expect("begin");
    let drafts = events
        .iter()
        .map(|e| EventDraft::new(e).expect("serializable"))
        .collect();
    db.outbox.emit_drafts(&mut tx, drafts).await.expect("emit");
    tx.commit().await.expect("commit");
}

fn huge(counter: &str, tick: u64) -> Ticked {
    Ticked {
        note: "x".repeat(REFUSED_PAYLOAD_BYTES),
        ..Ticked::new(counter, tick)
    }
}

/// Versions applied per aggregate, in commit order.
async fn applied(db: &TestDb, consumer: &str) -> BTreeMap<String, Vec<i64>> {
    let mut by_aggregate: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for effect in effects(db, consumer).await {
        by_aggregate
            .entry(effect.aggregate_id)
            .or_default()
            .push(effect.aggregate_version);
    }
    by_aggregate
}

/// `(status, attempts)` of every outbox row of `aggregate_id`, by version.
async fn rows(db: &TestDb, aggregate_id: &str) -> Vec<(i64, String, i32)> {
    sqlx::query_as(AssertSqlSafe(format!(
        "SELECT aggregate_version, status, attempt_count FROM {} WHERE aggregate_id = $1 ORDER BY aggregate_version",
        db.table("outbox_events")
    )))
    .bind(aggregate_id)
    .fetch_all(&db.pool)
    .await
    .expect("read outbox rows")
}

/// A batch of three with the middle one too large for the broker: one
/// outcome per message, the refusal permanent, the others delivered.
pub async fn batch_has_per_message_outcomes<B: Broker>(broker: &mut B) {
    let transport = broker.transport().await;
    let ok1 = Envelope::for_event(&Ticked::new("batch-a", 1), 1).unwrap();
    let refused = Envelope::for_event(&huge("batch-b", 1), 1).unwrap();
    let ok2 = Envelope::for_event(&Ticked::new("batch-c", 1), 1).unwrap();
    let outcomes = transport.publish(&[&ok1, &refused, &ok2]).await;
    assert_eq!(
        outcomes.len(),
        3,
        "{}: one outcome per message",
        broker.name()
    );
    assert!(outcomes[0].is_ok(), "{}: {:?}", broker.name(), outcomes[0]);
    assert!(outcomes[2].is_ok(), "{}: {:?}", broker.name(), outcomes[2]);
    let failure = outcomes[1]
        .as_ref()
        .expect_err("the large message is refused");
    assert!(
        !failure.retryable,
        "{}: a message over the limit is refused for good: {failure}",
        broker.name()
    );
}

/// Awkward aggregate ids reach the consumer's handler unchanged.
pub async fn awkward_ids_round_trip<B: Broker>(broker: &mut B) {
    let db = setup().await;
    let name = unique_name("ids");
    let consumer = tick_consumer(&db, &name, ConsumerConfig::default(), Duration::ZERO, &[]);
    let task = consumer.spawn(broker.source(&consumer).await);
    let relay = start_relay(&db, broker, relay_config()).await;
    let ids = awkward_ids();
    let events: Vec<Ticked> = ids.iter().map(|id| Ticked::new(id.clone(), 1)).collect();
    emit(&db, &events).await;
    wait::until(
        "every awkward id applied",
        Duration::from_secs(30),
        || async { effects(&db, &name).await.len() >= ids.len() },
    )
    .await;
    let mut seen: Vec<String> = effects(&db, &name)
        .await
        .into_iter()
        .map(|e| {
            assert_eq!(
                e.value["counter"].as_str(),
                Some(e.aggregate_id.as_str()),
                "header and payload agree"
            );
            e.aggregate_id
        })
        .collect();
    seen.sort();
    let mut expected = ids;
    expected.sort();
    assert_eq!(
        seen,
        expected,
        "{}: ids arrive unchanged, once",
        broker.name()
    );
    task.drain(Duration::from_secs(5)).await.unwrap();
    relay.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}

/// 20 aggregates × 10 versions, emitted interleaved: every version applied
/// once, in order (RejectStale would drop a version overtaken by a later
/// one, so a reorder shows as a missing version).
pub async fn order_per_aggregate_through_the_consumer<B: Broker>(broker: &mut B) {
    let db = setup().await;
    let name = unique_name("order");
    let consumer = tick_consumer(
        &db,
        &name,
        ConsumerConfig {
            batch_size: 16,
            ..ConsumerConfig::default()
        },
        Duration::ZERO,
        &[],
    );
    let task = consumer.spawn(broker.source(&consumer).await);
    let relay = start_relay(
        &db,
        broker,
        RelayConfig {
            batch_size: 37,
            ..relay_config()
        },
    )
    .await;
    for tick in 1..=10 {
        let events: Vec<Ticked> = (0..20)
            .map(|c| Ticked::new(format!("o{c}"), tick))
            .collect();
        emit(&db, &events).await;
    }
    wait::until("200 events applied", Duration::from_secs(60), || async {
        effects(&db, &name).await.len() >= 200
    })
    .await;
    let by_aggregate = applied(&db, &name).await;
    assert_eq!(by_aggregate.len(), 20);
    for (aggregate, versions) in &by_aggregate {
        assert_eq!(
            versions,
            &(1..=10).collect::<Vec<i64>>(),
            "{}: {aggregate} in order, each once",
            broker.name()
        );
    }
    task.drain(Duration::from_secs(5)).await.unwrap();
    relay.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}

/// A source whose deliveries are never acknowledged: the consumer commits
/// and then "crashes" before each ack. The unsettled deliveries are kept
/// until the source is dropped, as a dead process holds its connection
/// until the broker notices.
pub struct NoAckSource<S: MessageSource> {
    inner: S,
    held: Arc<Mutex<Vec<S::Delivery>>>,
}

/// A delivery of [`NoAckSource`].
pub struct NoAck<D> {
    delivery: D,
    held: Arc<Mutex<Vec<D>>>,
}

impl<D: Delivery> Delivery for NoAck<D> {
    fn incoming(&self) -> &Incoming {
        self.delivery.incoming()
    }

    async fn ack(self) -> Result<(), SourceError> {
        // The process died after the commit: the ack never left.
        self.held
            .lock()
            .expect("held deliveries")
            .push(self.delivery);
        Ok(())
    }

    async fn retry_later(self, delay: Duration) -> Result<(), SourceError> {
        self.delivery.retry_later(delay).await
    }
}

impl<S: MessageSource> MessageSource for NoAckSource<S> {
    type Delivery = NoAck<S::Delivery>;

    async fn next_batch(&mut self, max: usize) -> Result<Vec<Self::Delivery>, SourceError> {
        let batch = self.inner.next_batch(max).await?;
        Ok(batch
            .into_iter()
            .map(|delivery| NoAck {
                delivery,
                held: Arc::clone(&self.held),
            })
            .collect())
    }
}

/// Counts what a source delivered.
pub struct CountingSource<S> {
    inner: S,
    delivered: Arc<AtomicU64>,
}

impl<S: MessageSource> MessageSource for CountingSource<S> {
    type Delivery = S::Delivery;

    async fn next_batch(&mut self, max: usize) -> Result<Vec<Self::Delivery>, SourceError> {
        let batch = self.inner.next_batch(max).await?;
        self.delivered
            .fetch_add(batch.len() as u64, AtomicOrdering::SeqCst);
        Ok(batch)
    }
}

/// The first consumer instance commits 8 events and never acks; after it
/// is gone the broker delivers them again to the second, which applies
/// nothing twice.
pub async fn redelivery_after_a_crash_before_ack_applies_once<B: Broker>(broker: &mut B) {
    let db = setup().await;
    let name = unique_name("crash");
    let consumer = tick_consumer(&db, &name, ConsumerConfig::default(), Duration::ZERO, &[]);
    let held = Arc::new(Mutex::new(Vec::new()));
    let first = consumer.spawn(NoAckSource {
        inner: broker.source(&consumer).await,
        held: Arc::clone(&held),
    });
    let relay = start_relay(&db, broker, relay_config()).await;
    let events: Vec<Ticked> = (0..8).map(|c| Ticked::new(format!("k{c}"), 1)).collect();
    emit(&db, &events).await;
    wait::until(
        "8 events applied by the first instance",
        Duration::from_secs(30),
        || async { effects(&db, &name).await.len() >= 8 },
    )
    .await;
    // The crash: the task and its source, with every unacknowledged
    // delivery, are gone.
    first.drain(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        held.lock().unwrap().len(),
        8,
        "no ack left the first instance"
    );
    held.lock().unwrap().clear();

    let second_count = Arc::new(AtomicU64::new(0));
    let second = consumer.spawn(CountingSource {
        inner: broker.source(&consumer).await,
        delivered: Arc::clone(&second_count),
    });
    wait::until(
        "the 8 unacknowledged messages delivered again",
        Duration::from_secs(60),
        || async { second_count.load(AtomicOrdering::SeqCst) >= 8 },
    )
    .await;
    second.drain(Duration::from_secs(5)).await.unwrap();
    let seen = effects(&db, &name).await;
    assert_eq!(seen.len(), 8, "{}: each applied once", broker.name());
    consumer.flush_stats().await.unwrap();
    let duplicates: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT coalesce(sum(duplicates), 0)::bigint FROM {} WHERE consumer_name = $1",
        db.table("outbox_consumer_stats")
    )))
    .bind(&name)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        duplicates >= 8,
        "{}: the redeliveries were counted as duplicates ({duplicates})",
        broker.name()
    );
    relay.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}

/// The broker goes down while the relay runs: events emitted meanwhile
/// stay pending without using up attempts, and are published, in order,
/// once it is back.
pub async fn broker_down_and_back_keeps_events_pending_then_in_order<B: Broker>(broker: &mut B) {
    let db = setup().await;
    let name = unique_name("outage");
    let consumer = tick_consumer(&db, &name, ConsumerConfig::default(), Duration::ZERO, &[]);
    let task = consumer.spawn(broker.source(&consumer).await);
    let relay = start_relay(&db, broker, relay_config()).await;
    emit(&db, &[Ticked::new("down-0", 1)]).await;
    wait::until(
        "the first event applied",
        Duration::from_secs(30),
        || async { !effects(&db, &name).await.is_empty() },
    )
    .await;

    broker.stop().await;
    wait::until(
        "the relay sees the broker down",
        Duration::from_secs(30),
        || async { !relay.health().is_up() },
    )
    .await;
    for tick in 1..=5 {
        let events: Vec<Ticked> = (1..=4)
            .map(|c| Ticked::new(format!("down-{c}"), tick))
            .collect();
        emit(&db, &events).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for c in 1..=4 {
        for (version, status, attempts) in rows(&db, &format!("down-{c}")).await {
            assert_eq!(
                (status.as_str(), attempts),
                ("pending", 0),
                "{}: version {version} waits untouched while the broker is down",
                broker.name()
            );
        }
    }

    broker.start().await;
    wait::until(
        "every event applied after the outage",
        Duration::from_secs(60),
        || async { effects(&db, &name).await.len() >= 21 },
    )
    .await;
    let by_aggregate = applied(&db, &name).await;
    for c in 1..=4 {
        assert_eq!(
            by_aggregate[&format!("down-{c}")],
            (1..=5).collect::<Vec<i64>>(),
            "{}: in order after the outage",
            broker.name()
        );
    }
    task.drain(Duration::from_secs(5)).await.unwrap();
    relay.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}

/// An event the broker refuses for good goes to `failed` after one
/// attempt; its aggregate waits behind it, other aggregates continue.
pub async fn a_refused_event_fails_alone<B: Broker>(broker: &mut B) {
    let db = setup().await;
    let name = unique_name("refused");
    let consumer = tick_consumer(&db, &name, ConsumerConfig::default(), Duration::ZERO, &[]);
    let task = consumer.spawn(broker.source(&consumer).await);
    let relay = start_relay(&db, broker, relay_config()).await;
    emit(
        &db,
        &[
            Ticked::new("poisoned", 1),
            huge("poisoned", 2),
            Ticked::new("poisoned", 3),
            Ticked::new("healthy", 1),
            Ticked::new("healthy", 2),
        ],
    )
    .await;
    wait::until(
        "the healthy aggregate applied",
        Duration::from_secs(30),
        || async {
            applied(&db, &name)
                .await
                .get("healthy")
                .is_some_and(|v| v.len() == 2)
        },
    )
    .await;
    wait::until(
        "the refused event failed",
        Duration::from_secs(30),
        || async {
            rows(&db, "poisoned")
                .await
                .get(1)
                .is_some_and(|r| r.1 == "failed")
        },
    )
    .await;
    let poisoned = rows(&db, "poisoned").await;
    assert_eq!(
        poisoned,
        vec![
            (1, "published".to_owned(), 1),
            (2, "failed".to_owned(), 1),
            (3, "pending".to_owned(), 0)
        ],
        "{}: refused for good after one attempt, its successor waits",
        broker.name()
    );
    assert_eq!(applied(&db, &name).await["poisoned"], vec![1]);
    task.drain(Duration::from_secs(5)).await.unwrap();
    relay.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}
