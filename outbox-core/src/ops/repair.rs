//! Repairs, always by id and with a reason: failed events retried or
//! skipped, published events published again, letters of a consumer
//! replayed (by the running consumer, which has the handlers) or discarded,
//! published rows cleaned up. Each repair is one transaction that also
//! writes its audit row: who, when, why, which ids, what happened to each.

use std::time::Duration;

use serde::Serialize;

/// What a repair did to one id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IdOutcome {
    /// The id as given.
    pub id: String,
    /// `retried`, `skipped`, `republished`, `replay_requested`, `discarded`,
    /// `passed`, `not_failed`, `not_published`, `not_blocked_head`, `already_resolved`,
    /// `already_requested`, `wrong_kind`, `not_at_gap`, `not_found`.
    pub outcome: String,
    /// More words, when there are any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// What a repair did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RepairReport {
    /// The audit row.
    pub audit_id: i64,
    /// One outcome per id, in the order given.
    pub outcomes: Vec<IdOutcome>,
}

impl RepairReport {
    /// How many ids got `outcome`.
    pub fn count(&self, outcome: &str) -> usize {
        self.outcomes
            .iter()
            .filter(|o| o.outcome == outcome)
            .count()
    }
}

/// What a cleanup deletes: published events older than one age, and
/// idempotency keys older than another, the key retention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cleanup {
    /// Published events older than this go (pending, failed and skipped
    /// events never do).
    pub events_older_than: Duration,
    /// Idempotency keys older than this go. Default
    /// [`DEFAULT_KEY_RETENTION`] (7 days, the relay's retention default):
    /// the longest a client may retry a command. A key deleted earlier
    /// lets a late retry emit the command's event a second time, under a
    /// new event id that no inbox recognises; shorten it only when the
    /// clients' retries are known to end sooner.
    pub keys_older_than: Duration,
    /// Rows per delete statement, each its own transaction (1 to 100,000).
    pub batch: i64,
    /// Delete; when false only count (a dry run).
    pub execute: bool,
}

/// How long a cleanup keeps idempotency keys unless told otherwise (the
/// relay's retention keeps them as long:
/// [`RetentionConfig::keep_idempotency_keys`](crate::relay::retention::RetentionConfig)).
pub const DEFAULT_KEY_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

impl Cleanup {
    /// A dry run for published events older than `events_older_than`,
    /// keys kept for [`DEFAULT_KEY_RETENTION`], batches of 1,000.
    pub fn older_than(events_older_than: Duration) -> Cleanup {
        Cleanup {
            events_older_than,
            keys_older_than: DEFAULT_KEY_RETENTION,
            batch: 1000,
            execute: false,
        }
    }
}

/// What a cleanup did (or would do).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CleanupReport {
    /// Published rows older than the age (before the cleanup).
    pub eligible: i64,
    /// Published rows deleted (0 on a dry run).
    pub deleted: u64,
    /// The key retention applied, in seconds.
    pub keys_older_than_secs: u64,
    /// Idempotency keys older than the key retention (before the cleanup).
    pub keys_eligible: i64,
    /// Idempotency keys deleted (0 on a dry run).
    pub keys_deleted: u64,
    /// Whether rows were deleted.
    pub executed: bool,
    /// The audit row, when executed.
    pub audit_id: Option<i64>,
}
