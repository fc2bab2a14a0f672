//! Consumer test support: an effects table that records every handler run
//! (no unique key, so a double application shows as two rows), handlers
//! that write to it, and envelopes built by hand.

use outbox_postgres::PgConsumer;
use outbox_postgres::prelude::*;
use std::sync::Arc;
use std::time::Duration;

use outbox_core::consumer::{
    ConsumerBuilder, ConsumerConfig, HandlerError, Ordering, Received, RetryPolicy,
};
use outbox_core::relay::Backoff;
use outbox_core::{Envelope, OutboxEvent};
use sqlx::{AssertSqlSafe, PgConnection, Row};

use crate::TestDb;
use crate::events::{ParcelBooked, ParcelBookedV2, Ticked};

/// Creates `<schema>.effects (event_id, aggregate_id, aggregate_version,
/// value, idempotency_key, traceparent, seq, applied_at)`.
pub async fn create_effects(db: &TestDb) {
    db.execute(
        "CREATE TABLE {s}.effects (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            consumer text NOT NULL,
            event_id uuid NOT NULL,
            aggregate_id text NOT NULL,
            aggregate_version bigint NOT NULL,
            value jsonb NOT NULL,
            idempotency_key uuid NOT NULL,
            traceparent text,
            applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
        )",
    )
    .await;
}

/// Records one handler run in the effects table of `table` (`schema.effects`).
pub async fn record_effect<E: OutboxEvent>(
    table: &str,
    received: &Received<E>,
    tx: &mut PgConnection,
) -> Result<(), HandlerError> {
    let value = serde_json::to_value(&received.event).map_err(HandlerError::permanent)?;
    sqlx::query(AssertSqlSafe(format!(
        "INSERT INTO {table} (consumer, event_id, aggregate_id, aggregate_version, value, idempotency_key, traceparent)
         VALUES ($1, $2, $3, $4, $5, $6, $7)"
    )))
    .bind(&*received.meta.consumer)
    .bind(received.meta.event_id)
    .bind(&received.meta.aggregate_id)
    .bind(received.meta.aggregate_version)
    .bind(value)
    .bind(received.meta.idempotency_key())
    .bind(&received.meta.traceparent)
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// One row of the effects table.
#[derive(Debug, Clone, PartialEq)]
pub struct Effect {
    /// The event.
    pub event_id: uuid::Uuid,
    /// Its aggregate.
    pub aggregate_id: String,
    /// Its version.
    pub aggregate_version: i64,
    /// The value the handler saw.
    pub value: serde_json::Value,
    /// The idempotency key the handler saw.
    pub idempotency_key: uuid::Uuid,
    /// The trace context the handler saw.
    pub traceparent: Option<String>,
}

/// The effects of `consumer`, in the order they were committed.
pub async fn effects(db: &TestDb, consumer: &str) -> Vec<Effect> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT event_id, aggregate_id, aggregate_version, value, idempotency_key, traceparent
         FROM {} WHERE consumer = $1 ORDER BY seq",
        db.table("effects")
    )))
    .bind(consumer)
    .fetch_all(&db.pool)
    .await
    .expect("read effects");
    rows.into_iter()
        .map(|row| Effect {
            event_id: row.get("event_id"),
            aggregate_id: row.get("aggregate_id"),
            aggregate_version: row.get("aggregate_version"),
            value: row.get("value"),
            idempotency_key: row.get("idempotency_key"),
            traceparent: row.get("traceparent"),
        })
        .collect()
}

/// A dead-letter or quarantine row.
#[derive(Debug, Clone, PartialEq)]
pub struct Letter {
    /// `quarantined` or `dead_lettered`.
    pub kind: String,
    /// The event id, when the message had a readable one.
    pub event_id: Option<uuid::Uuid>,
    /// The event type, when readable.
    pub event_type: Option<String>,
    /// The aggregate id, when readable.
    pub aggregate_id: Option<String>,
    /// The version, when readable.
    pub aggregate_version: Option<i64>,
    /// The raw payload.
    pub payload: Vec<u8>,
    /// The headers.
    pub headers: serde_json::Value,
    /// Why.
    pub reason: String,
    /// Deliveries so far.
    pub attempts: i32,
}

/// The dead letters and quarantine rows of `consumer`, oldest first.
pub async fn letters(db: &TestDb, consumer: &str) -> Vec<Letter> {
    let rows = sqlx::query(AssertSqlSafe(format!(
        "SELECT kind, event_id, event_type, aggregate_id, aggregate_version, payload, headers, reason, attempts
         FROM {} WHERE consumer_name = $1 ORDER BY id",
        db.table("outbox_dead_letters")
    )))
    .bind(consumer)
    .fetch_all(&db.pool)
    .await
    .expect("read dead letters");
    rows.into_iter()
        .map(|row| Letter {
            kind: row.get("kind"),
            event_id: row.get("event_id"),
            event_type: row.get("event_type"),
            aggregate_id: row.get("aggregate_id"),
            aggregate_version: row.get("aggregate_version"),
            payload: row.get("payload"),
            headers: row.get("headers"),
            reason: row.get("reason"),
            attempts: row.get("attempts"),
        })
        .collect()
}

/// The envelope of tick `version` of counter `counter`, at aggregate
/// version `version`.
pub fn tick(counter: &str, version: i64) -> Envelope {
    Envelope::for_event(&Ticked::new(counter, version as u64), version).expect("serializable")
}

/// Strict ordering with `park_timeout`, a sweep every 100 ms and three
/// quick attempts (50 ms doubling to 200 ms, no jitter).
pub fn strict_config(park_timeout: Duration) -> ConsumerConfig {
    ConsumerConfig {
        ordering: Ordering::Strict { park_timeout },
        sweep_interval: Duration::from_millis(100),
        retry: RetryPolicy {
            max_attempts: 3,
            backoff: Backoff {
                initial: Duration::from_millis(50),
                max: Duration::from_millis(200),
                multiplier: 2.0,
                jitter: 0.0,
            },
            handler_timeout: Duration::from_secs(10),
        },
        ..ConsumerConfig::default()
    }
}

/// `parcel.booked` at schema version 2 (readable by a consumer that knows
/// v2), at aggregate version `version`.
pub fn parcel_v2(id: &str, version: i64) -> Envelope {
    Envelope::for_event(
        &ParcelBookedV2 {
            parcel_id: id.into(),
            weight_kg: version as f64,
        },
        version,
    )
    .expect("serializable")
}

/// `parcel.booked` at schema version 3 (quarantined by a consumer that
/// knows only v2), at aggregate version `version`.
pub fn parcel_v3(id: &str, version: i64) -> Envelope {
    Envelope::for_event(
        &ParcelBooked {
            parcel_id: id.into(),
            weight_kg: version as f64,
            carrier: "DHL".into(),
        },
        version,
    )
    .expect("serializable")
}

/// A handler closure for `Ticked` that records its effect, optionally
/// sleeping inside the transaction first (to widen race windows), and
/// failing for the counters in `failing`.
pub fn tick_handler(
    table: String,
    hold: Duration,
    failing: Arc<Vec<String>>,
) -> impl for<'a> Fn(
    Received<Ticked>,
    &'a mut PgConnection,
) -> futures_util::future::BoxFuture<'a, Result<(), HandlerError>>
+ Send
+ Sync
+ 'static {
    move |received, tx| {
        let table = table.clone();
        let failing = Arc::clone(&failing);
        Box::pin(async move {
            if failing.contains(&received.event.counter) {
                return Err(HandlerError::retryable(format!(
                    "downstream refuses counter {}",
                    received.event.counter
                )));
            }
            record_effect(&table, &received, tx).await?;
            if !hold.is_zero() {
                tokio::time::sleep(hold).await;
            }
            Ok(())
        })
    }
}

/// A consumer named `name` of `Ticked` events that records each in the
/// effects table (see [`tick_handler`]).
pub fn tick_consumer(
    db: &TestDb,
    name: &str,
    config: ConsumerConfig,
    hold: Duration,
    failing: &[&str],
) -> PgConsumer {
    let failing = Arc::new(failing.iter().map(|s| s.to_string()).collect());
    ConsumerBuilder::new(name)
        .config(config)
        .on_fn::<Ticked, _>(tick_handler(db.table("effects"), hold, failing))
        .build(db.pool.clone(), db.schema.clone())
        .expect("consumer builds")
}

/// A handler closure for any event that records its effect in `table`.
pub fn effect_handler<E: OutboxEvent>(
    table: String,
) -> impl for<'a> Fn(
    Received<E>,
    &'a mut PgConnection,
) -> futures_util::future::BoxFuture<'a, Result<(), HandlerError>>
+ Send
+ Sync
+ Clone
+ 'static {
    move |received, tx| {
        let table = table.clone();
        Box::pin(async move { record_effect(&table, &received, tx).await })
    }
}
