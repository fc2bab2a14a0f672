//! What the operations API lists and shows: events by status, letters
//! (quarantine and dead letters) of a consumer, audit rows; their filters
//! and keyset pages. Payloads are shown redacted.

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

/// A page of a listing and the cursor of the next one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Page<T> {
    /// The records, oldest first (audit: newest first).
    pub items: Vec<T>,
    /// Pass as `after` (events, letters) or `before` (audit) for the next
    /// page; `None` when this one is the last.
    pub next: Option<i64>,
}

impl<T> Page<T> {
    /// A page of a listing asked for `limit` rows: a full page has a next
    /// one, starting after (or before) its last item's `cursor`.
    pub fn of(items: Vec<T>, limit: i64, cursor: impl Fn(&T) -> i64) -> Page<T> {
        let next = if items.len() as i64 == limit {
            items.last().map(cursor)
        } else {
            None
        };
        Page { items, next }
    }
}

/// An outbox event's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventStatus {
    /// Waiting to be published (or retrying).
    Pending,
    /// Acknowledged by the broker.
    Published,
    /// Gave up after its attempts; blocks its aggregate unless skipped.
    #[default]
    Failed,
    /// A failed head an operator skipped; never published.
    Skipped,
}

impl EventStatus {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventStatus::Pending => "pending",
            EventStatus::Published => "published",
            EventStatus::Failed => "failed",
            EventStatus::Skipped => "skipped",
        }
    }

    /// The status with a stored name.
    pub fn from_name(name: &str) -> Option<EventStatus> {
        [
            EventStatus::Pending,
            EventStatus::Published,
            EventStatus::Failed,
            EventStatus::Skipped,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

/// Which events to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    /// Their status (default failed).
    pub status: EventStatus,
    /// Only this event type.
    pub event_type: Option<String>,
    /// Only this aggregate type.
    pub aggregate_type: Option<String>,
    /// Only this aggregate id.
    pub aggregate_id: Option<String>,
    /// Failed (or, for other statuses, emitted) at or after.
    pub since: Option<DateTime<Utc>>,
    /// Failed (or emitted) before.
    pub until: Option<DateTime<Utc>>,
    /// The last error contains this text (any case).
    pub error_contains: Option<String>,
    /// After this cursor (a page's `next`).
    pub after: Option<i64>,
    /// At most this many (default 50, at most 1,000).
    pub limit: Option<i64>,
}

/// One outbox event as an operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRecord {
    /// The event id.
    pub id: Uuid,
    /// Its insertion order (the listing cursor).
    pub seq: i64,
    /// The event type.
    pub event_type: String,
    /// The schema version.
    pub schema_version: i32,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The aggregate version.
    pub aggregate_version: i64,
    /// The payload, redacted.
    pub payload: serde_json::Value,
    /// The W3C trace context of the emitting command.
    pub traceparent: Option<String>,
    /// When it was emitted.
    pub created_at: DateTime<Utc>,
    /// Its state.
    pub status: String,
    /// When the broker acknowledged it.
    pub published_at: Option<DateTime<Utc>>,
    /// Publish attempts.
    pub attempts: i32,
    /// When it is tried again (pending).
    pub next_attempt_at: DateTime<Utc>,
    /// The last publish error (or, for a skipped event, who skipped it and why).
    pub last_error: Option<String>,
    /// When it moved to failed.
    pub failed_at: Option<DateTime<Utc>>,
}

/// Quarantine or dead letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LetterKind {
    /// Messages the consumer could not read.
    #[default]
    Quarantined,
    /// Messages whose handler failed for good.
    DeadLettered,
}

impl LetterKind {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            LetterKind::Quarantined => "quarantined",
            LetterKind::DeadLettered => "dead_lettered",
        }
    }
}

/// The last version a consumer applied (or passed) of one aggregate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PositionRecord {
    /// The consumer.
    pub consumer: String,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The version.
    pub version: i64,
    /// Whether a handler has started on this aggregate (strict ordering).
    pub pinned: bool,
    /// When it last moved.
    pub updated_at: DateTime<Utc>,
}

/// Which letters of a consumer to list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LetterFilter {
    /// The consumer (required).
    pub consumer: String,
    /// Quarantine or dead letters.
    pub kind: LetterKind,
    /// Only this event type.
    pub event_type: Option<String>,
    /// Only this aggregate type.
    pub aggregate_type: Option<String>,
    /// Only this aggregate id.
    pub aggregate_id: Option<String>,
    /// Written at or after.
    pub since: Option<DateTime<Utc>>,
    /// Written before.
    pub until: Option<DateTime<Utc>>,
    /// The reason contains this text (any case).
    pub reason_contains: Option<String>,
    /// Closed ones too (default: open only).
    pub include_resolved: bool,
    /// After this cursor (a page's `next`).
    pub after: Option<i64>,
    /// At most this many (default 50, at most 1,000).
    pub limit: Option<i64>,
}

/// One quarantine or dead-letter row as an operator sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LetterRecord {
    /// The letter's id (what replay and discard take).
    pub id: i64,
    /// The consumer.
    pub consumer: String,
    /// `quarantined` or `dead_lettered`.
    pub kind: String,
    /// The event id, when it could be read.
    pub event_id: Option<Uuid>,
    /// The event type, when it could be read.
    pub event_type: Option<String>,
    /// The schema version, when it could be read.
    pub schema_version: Option<i32>,
    /// The aggregate type, when it could be read.
    pub aggregate_type: Option<String>,
    /// The aggregate id, when it could be read.
    pub aggregate_id: Option<String>,
    /// The aggregate version, when it could be read.
    pub aggregate_version: Option<i64>,
    /// The message's CloudEvents attributes.
    pub headers: serde_json::Value,
    /// The payload, redacted.
    pub payload: serde_json::Value,
    /// Why it is here.
    pub reason: String,
    /// Deliveries or handler starts before it landed here.
    pub attempts: i32,
    /// When.
    pub created_at: DateTime<Utc>,
    /// When it was closed.
    pub resolved_at: Option<DateTime<Utc>>,
    /// How (`replayed: applied`, `discarded: …`).
    pub resolution: Option<String>,
    /// Replays tried.
    pub replays: i32,
    /// Why the last replay did not close it.
    pub last_replay_error: Option<String>,
    /// A replay an operator asked for, not yet run by the consumer.
    pub replay_requested_at: Option<DateTime<Utc>>,
}

/// One audit row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuditRecord {
    /// Its id.
    pub id: i64,
    /// When.
    pub at: DateTime<Utc>,
    /// Who.
    pub operator: String,
    /// Why.
    pub reason: String,
    /// What (`relay.retry`, `consumer.replay`, …).
    pub action: String,
    /// On what (the relay or a consumer).
    pub target: String,
    /// The ids named.
    pub ids: Vec<String>,
    /// What happened to each.
    pub outcomes: serde_json::Value,
}

/// The page size of a listing asked for `limit` rows: 50 by default, 1 to
/// 1,000.
pub fn page_limit(limit: Option<i64>) -> i64 {
    limit.unwrap_or(50).clamp(1, 1000)
}
