//! The store seam of the relay: what the loop needs from a database, and
//! nothing about which one. `outbox_postgres::PgRelayStore` implements it,
//! and so do the SQLite and MySQL stores; another store can implement it
//! without touching the loop.

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::envelope::Envelope;

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
#[error("outbox store: {operation} failed: {source}")]
pub struct StoreError {
    /// What was being done (`claim`, `complete`, ...).
    pub operation: &'static str,
    /// What the database driver reported.
    #[source]
    pub source: sqlx::Error,
}

impl StoreError {
    /// Maps a driver error to a [`StoreError`] naming what was being done,
    /// for `map_err` in every store.
    pub fn new(operation: &'static str) -> impl FnOnce(sqlx::Error) -> StoreError {
        move |source| StoreError { operation, source }
    }
}

/// One claimed event with its delivery history.
#[derive(Debug, Clone)]
pub struct ClaimedEvent {
    /// The event.
    pub envelope: Envelope,
    /// Publish attempts before this one.
    pub attempts: u32,
    /// Why the stored row cannot be published as it is (a payload that is
    /// not JSON, written by hand or by another program into a store whose
    /// payload column takes any text: SQLite, MySQL), or `None`. A store hands such a row
    /// over with `null` as its payload instead of failing the whole claim
    /// (which would stop every worker at the same row); the worker moves
    /// it to the failed state with this reason, without publishing it, and
    /// publishes nothing after it in its aggregate.
    pub unreadable: Option<String>,
}

impl ClaimedEvent {
    /// `payload`, the stored text of the event's payload, as the raw JSON
    /// the envelope carries; a text that does not parse gives `null` and
    /// the reason, for [`unreadable`](Self::unreadable).
    pub fn read_payload(payload: String) -> (Box<RawValue>, Option<String>) {
        match RawValue::from_string(payload) {
            Ok(payload) => (payload, None),
            Err(error) => (
                RawValue::NULL.to_owned(),
                Some(format!(
                    "the stored payload cannot be read as JSON: {error}"
                )),
            ),
        }
    }

    /// As [`read_payload`](Self::read_payload), for a store whose payload
    /// column may hold bytes that are not UTF-8 (SQLite keeps a BLOB in a
    /// `TEXT` column).
    pub fn read_payload_bytes(payload: Vec<u8>) -> (Box<RawValue>, Option<String>) {
        match String::from_utf8(payload) {
            Ok(text) => Self::read_payload(text),
            Err(error) => (
                RawValue::NULL.to_owned(),
                Some(format!("the stored payload is not UTF-8 text: {error}")),
            ),
        }
    }
}

/// A failed publish to record.
#[derive(Debug, Clone)]
pub struct FailedAttempt {
    /// The event.
    pub event_id: Uuid,
    /// The aggregate type of the event.
    pub aggregate_type: String,
    /// The aggregate id of the event.
    pub aggregate_id: String,
    /// What went wrong (stored as `last_error`).
    pub error: String,
    /// When to try again.
    pub retry_in: Duration,
    /// Move the event to the failed state instead of retrying.
    pub give_up: bool,
}

/// What happened to a claimed batch. Events in neither list were not
/// attempted (a previous version of their aggregate failed) and stay
/// pending, unchanged.
#[derive(Debug, Clone, Default)]
pub struct BatchOutcome {
    /// Events the broker acknowledged.
    pub published: Vec<Uuid>,
    /// Events whose publish failed.
    pub failed: Vec<FailedAttempt>,
}

/// Events claimed by one relay worker; other workers skip them until the
/// batch is completed or released (or its holder dies).
pub trait ClaimedBatch: Send {
    /// The claimed events, each aggregate's in version order.
    fn events(&self) -> &[ClaimedEvent];

    /// Records the outcome and ends the claim.
    fn complete(self, outcome: BatchOutcome)
    -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Ends the claim without recording anything (the events stay pending).
    fn release(self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The owner's fencing token this claim was made under, if the store
    /// has one (see [`fencing_token`](crate::relay::fencing_token)).
    fn fencing_token(&self) -> Option<u64> {
        None
    }
}

/// Wakes a sleeping relay when events were committed.
pub trait WakeupListener: Send + 'static {
    /// Resolves at the next notification. An error means notifications may
    /// have been missed; the relay keeps polling and calls again.
    fn wait(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send;
}

/// The backlog as an operator sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutboxStats {
    /// Events waiting to be published (including ones in backoff).
    pub pending: i64,
    /// Events in the failed state.
    pub failed: i64,
    /// When the oldest pending event was emitted.
    pub oldest_pending_at: Option<DateTime<Utc>>,
    /// Aggregates whose head event is retrying or failed.
    pub blocked_aggregates: i64,
    /// Dead tuples in the outbox table (VACUUM pressure).
    pub dead_tuples: i64,
    /// Live tuples in the outbox table.
    pub live_tuples: i64,
    /// The pending and failed figures per event type (types with neither
    /// are absent).
    pub event_types: Vec<EventTypeStats>,
}

/// The backlog of one event type.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct EventTypeStats {
    /// The event type.
    pub event_type: String,
    /// Its events waiting to be published.
    pub pending: i64,
    /// Its events in the failed state.
    pub failed: i64,
    /// When its oldest pending event was emitted.
    pub oldest_pending_at: Option<DateTime<Utc>>,
}

impl EventTypeStats {
    /// Age of its oldest pending event, zero when none.
    pub fn oldest_pending_age(&self) -> Duration {
        self.oldest_pending_at
            .map(|at| (Utc::now() - at).to_std().unwrap_or_default())
            .unwrap_or_default()
    }
}

impl OutboxStats {
    /// Age of the oldest pending event (the alert signal), zero when none.
    pub fn oldest_pending_age(&self) -> Duration {
        self.oldest_pending_at
            .map(|at| (Utc::now() - at).to_std().unwrap_or_default())
            .unwrap_or_default()
    }
}

/// An aggregate whose later events wait behind its head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockedAggregate {
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The event that blocks it.
    pub head_event_id: Uuid,
    /// The head's state: `pending` (retrying) or `failed`.
    pub head_status: String,
    /// The head's last error.
    pub last_error: Option<String>,
    /// Since when.
    pub blocked_since: DateTime<Utc>,
}

/// What the relay loop needs from a store.
pub trait RelayStore: Send + Sync + 'static {
    /// The claim type.
    type Batch: ClaimedBatch;
    /// The wake-up listener type.
    type Listener: WakeupListener;

    /// Claims up to `limit` due events: for each aggregate only a prefix in
    /// version order starting at its oldest unpublished event, and no
    /// aggregate another worker holds.
    fn claim(&self, limit: usize) -> impl Future<Output = Result<Self::Batch, StoreError>> + Send;

    /// Claims for the worker `worker_id` (the id it heartbeats with). A
    /// store that divides the work among workers (the PostgreSQL store:
    /// partitions owned per worker) overrides it; by default it claims
    /// like [`RelayStore::claim`]. The relay's workers call this one.
    fn claim_for(
        &self,
        worker_id: Uuid,
        limit: usize,
    ) -> impl Future<Output = Result<Self::Batch, StoreError>> + Send {
        let _ = worker_id;
        self.claim(limit)
    }

    /// Whether `error` is the database cutting a claim off by its statement
    /// timeout (the relay then claims fewer events until claims go through
    /// again). By default no error is: a store without a statement timeout
    /// never cuts a claim off. A store that wraps another forwards this
    /// with its claims, or the relay cannot tell a timed-out claim from
    /// any other failure and keeps asking for as many events.
    fn is_statement_timeout(&self, error: &StoreError) -> bool {
        let _ = error;
        false
    }

    /// The worker `worker_id` will not claim for a while (its transport is
    /// down): let go of whatever was held open for its next claim. The
    /// PostgreSQL store ends the transaction a full batch opened ahead;
    /// by default there is nothing to do.
    fn pause(&self, worker_id: Uuid) -> impl Future<Output = Result<(), StoreError>> + Send {
        let _ = worker_id;
        async { Ok(()) }
    }

    /// Records that this worker is alive and whether it sleeps waiting for
    /// a NOTIFY (emitters notify only while someone waits). Called at start,
    /// on every change, and about every 10 seconds while the worker claims
    /// (after a batch or an empty claim).
    fn heartbeat(
        &self,
        worker_id: Uuid,
        waiting: bool,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Forgets the worker `worker_id`, which stops.
    fn deregister(&self, worker_id: Uuid) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Starts listening for notifications.
    fn listener(&self) -> impl Future<Output = Result<Self::Listener, StoreError>> + Send;

    /// Reads the backlog figures.
    fn stats(&self) -> impl Future<Output = Result<OutboxStats, StoreError>> + Send;
}
