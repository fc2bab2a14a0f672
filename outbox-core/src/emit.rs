//! Emit: what every store's emit takes and answers (an [`EventDraft`],
//! [`EmitOptions`], [`Emitted`] / [`EmitOutcome`], [`EmitError`]). Each
//! store writes an event into the outbox inside the caller's own
//! transaction, so the business change and the intent to publish commit
//! together or not at all: `outbox_postgres::Outbox`, `outbox_sqlite::SqliteOutbox`,
//! `outbox_mysql::MySqlOutbox`.

use serde_json::value::RawValue;
use uuid::Uuid;

use crate::contract::{OutboxEvent, PayloadError};
use crate::trace::{self, TraceParent};

/// What an emit wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emitted {
    /// The new event's id (UUID v7).
    pub event_id: Uuid,
    /// The aggregate version the event got (or carried).
    pub aggregate_version: i64,
}

/// The result of an emit with an idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmitOutcome {
    /// The event was written.
    Emitted(Emitted),
    /// The key was used before: nothing was written. Roll back (or do not
    /// apply) the business change of the repeated command.
    Duplicate {
        /// The event emitted the first time.
        original_event_id: Uuid,
    },
}

/// Options of one emit.
#[derive(Debug, Clone, Default)]
pub struct EmitOptions {
    /// Makes a repeated command a no-op: the first emit with a key writes,
    /// every later one returns [`EmitOutcome::Duplicate`].
    pub idempotency_key: Option<String>,
    /// Trace context to record instead of the ambient one.
    pub traceparent: Option<TraceParent>,
}

/// An emit failed; nothing was written by it.
#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    /// The connection is not inside a transaction.
    #[error(
        "emit needs the caller's open transaction: pass `&mut tx` from `pool.begin()` or `conn.begin()`; a connection in autocommit would publish the event without the business change"
    )]
    NotInTransaction,
    /// An earlier statement failed and PostgreSQL aborted the transaction.
    #[error(
        "the transaction was aborted by an earlier error; roll it back (nothing of it, and no event, will be committed)"
    )]
    TransactionAborted,
    /// The event could not be serialized.
    #[error(transparent)]
    Payload(#[from] PayloadError),
    /// The event carries an aggregate version that already exists.
    #[error(
        "aggregate {aggregate_type}/{aggregate_id} already has an event with version {aggregate_version}: two writers raced on one aggregate"
    )]
    VersionConflict {
        /// The aggregate type.
        aggregate_type: String,
        /// The aggregate id.
        aggregate_id: String,
        /// The contested version.
        aggregate_version: i64,
    },
    /// A carried aggregate version lies below a version of the same
    /// aggregate that is written but not yet published. The relay publishes
    /// an aggregate's events in the order they were written, so the lower
    /// version would reach consumers after the higher one.
    #[error(
        "aggregate {aggregate_type}/{aggregate_id}: version {aggregate_version} is emitted after version {newer_version}, which is not yet published; emit an aggregate's versions in ascending order (emit_all sorts a batch by version, separate emits keep their call order)"
    )]
    VersionOutOfOrder {
        /// The aggregate type.
        aggregate_type: String,
        /// The aggregate id.
        aggregate_id: String,
        /// The version being emitted.
        aggregate_version: i64,
        /// The higher version already written.
        newer_version: i64,
    },
    /// The idempotency key is longer than 512 bytes.
    #[error("an idempotency key is too long ({0} bytes, at most 512)")]
    KeyTooLong(usize),
    /// The database refused the statement or the connection broke.
    #[error("emitting {event_type} failed: {source}")]
    Database {
        /// The event type being emitted (`batch` for batches).
        event_type: String,
        /// What sqlx reported.
        #[source]
        source: sqlx::Error,
    },
}

/// One event ready to be written, type-erased: what `emit_all` and the
/// relay tests use to emit events of several types in one batch. Its
/// `Debug` shows the payload with redacted fields masked.
#[derive(Clone)]
pub struct EventDraft {
    pub(crate) id: Uuid,
    pub(crate) event_type: &'static str,
    pub(crate) schema_version: u32,
    pub(crate) aggregate_type: &'static str,
    pub(crate) aggregate_id: String,
    pub(crate) aggregate_version: Option<i64>,
    pub(crate) payload: Box<RawValue>,
    pub(crate) traceparent: Option<String>,
}

/// An [`EventDraft`] taken apart ([`EventDraft::into_parts`]): the
/// columns a store writes. Its `Debug` is not redacted: do not log it.
pub struct EventDraftParts {
    /// The event id.
    pub id: Uuid,
    /// The contract's event type.
    pub event_type: &'static str,
    /// The contract's schema version.
    pub schema_version: u32,
    /// The contract's aggregate type.
    pub aggregate_type: &'static str,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The version the event carries, or `None` for the store's counter.
    pub aggregate_version: Option<i64>,
    /// The payload JSON.
    pub payload: Box<RawValue>,
    /// The W3C trace context to record.
    pub traceparent: Option<String>,
}

impl std::fmt::Debug for EventDraft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventDraft")
            .field("id", &self.id)
            .field("event_type", &self.event_type)
            .field("schema_version", &self.schema_version)
            .field("aggregate_type", &self.aggregate_type)
            .field("aggregate_id", &self.aggregate_id)
            .field("aggregate_version", &self.aggregate_version)
            .field(
                "payload",
                &format_args!(
                    "{}",
                    crate::redact::redacted_payload(
                        self.event_type,
                        self.schema_version,
                        self.payload.get()
                    )
                ),
            )
            .field("traceparent", &self.traceparent)
            .finish()
    }
}

impl EventDraft {
    /// Prepares `event` with a new UUID v7 id and the ambient trace context.
    pub fn new<E: OutboxEvent>(event: &E) -> Result<EventDraft, PayloadError> {
        Ok(EventDraft {
            id: Uuid::now_v7(),
            event_type: E::EVENT_TYPE,
            schema_version: E::SCHEMA_VERSION,
            aggregate_type: E::AGGREGATE_TYPE,
            aggregate_id: event.aggregate_id(),
            aggregate_version: event.aggregate_version(),
            payload: event.to_payload()?,
            traceparent: trace::current().map(|tp| tp.to_string()),
        })
    }

    /// The id the event will have.
    pub fn event_id(&self) -> Uuid {
        self.id
    }

    /// The event type (`order.created`).
    pub fn event_type(&self) -> &'static str {
        self.event_type
    }

    /// The schema version the payload was written with.
    pub fn schema_version(&self) -> u32 {
        self.schema_version
    }

    /// The aggregate type.
    pub fn aggregate_type(&self) -> &'static str {
        self.aggregate_type
    }

    /// The aggregate id.
    pub fn aggregate_id(&self) -> &str {
        &self.aggregate_id
    }

    /// The aggregate version the event carries, if its contract carries
    /// one (otherwise the store's per-aggregate counter gives it one).
    pub fn aggregate_version(&self) -> Option<i64> {
        self.aggregate_version
    }

    /// The payload as JSON text, exactly as serde wrote it. It may hold
    /// values of redacted fields: store it, do not log it (`Debug` masks
    /// them).
    pub fn payload_json(&self) -> &str {
        self.payload.get()
    }

    /// The W3C trace context to record with the event.
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// Records `traceparent` instead of the ambient trace context.
    pub fn with_traceparent(mut self, traceparent: TraceParent) -> EventDraft {
        self.traceparent = Some(traceparent.to_string());
        self
    }

    /// Takes the draft apart for a store that binds its columns by value
    /// (a batch insert with one array per column).
    pub fn into_parts(self) -> EventDraftParts {
        EventDraftParts {
            id: self.id,
            event_type: self.event_type,
            schema_version: self.schema_version,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            aggregate_version: self.aggregate_version,
            payload: self.payload,
            traceparent: self.traceparent,
        }
    }

    /// The order in which a store writes `drafts` (indexes into it): as
    /// given, except that each aggregate's carried versions take the places
    /// of that aggregate's carried drafts in ascending version order, so a
    /// batch may carry an aggregate's versions in any order. Drafts with
    /// versions from the store's counter keep their places.
    pub fn write_order(drafts: &[EventDraft]) -> Vec<usize> {
        let mut order: Vec<usize> = (0..drafts.len()).collect();
        let mut carried: Vec<usize> = (0..drafts.len())
            .filter(|&i| drafts[i].aggregate_version.is_some())
            .collect();
        let aggregate = |i: usize| (drafts[i].aggregate_type, drafts[i].aggregate_id.as_str());
        // Group the carried drafts per aggregate, then hand each
        // aggregate's places to its drafts in version order.
        carried.sort_by(|&a, &b| aggregate(a).cmp(&aggregate(b)));
        for group in carried.chunk_by(|&a, &b| aggregate(a) == aggregate(b)) {
            let mut places: Vec<usize> = group.to_vec();
            places.sort_unstable();
            let mut by_version: Vec<usize> = group.to_vec();
            by_version.sort_by_key(|&i| drafts[i].aggregate_version);
            for (place, draft) in places.into_iter().zip(by_version) {
                order[place] = draft;
            }
        }
        order
    }
}
