//! The outbox at a glance: the backlog and its age per event type, blocked
//! aggregates, dead tuples, each consumer's parked messages, quarantine and
//! dead letters, and the problems a health check should report.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

/// What counts as a problem for [`Status::problems`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusOptions {
    /// A pending event older than this is a problem (default 5 minutes).
    pub max_pending_age: Duration,
    /// Blocked aggregates listed (default 20).
    pub blocked_limit: i64,
    /// A consumer whose last applied event was older than this when it was
    /// applied is a problem (default 5 minutes).
    pub max_consumer_lag: Duration,
}

impl Default for StatusOptions {
    fn default() -> Self {
        StatusOptions {
            max_pending_age: Duration::from_secs(300),
            blocked_limit: 20,
            max_consumer_lag: Duration::from_secs(300),
        }
    }
}

/// The backlog of the whole outbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Backlog {
    /// Waiting for their first attempt.
    pub pending: i64,
    /// Pending after a failed attempt (in backoff).
    pub retrying: i64,
    /// Given up; blocking their aggregate unless skipped.
    pub failed: i64,
    /// Failed heads an operator skipped.
    pub skipped: i64,
    /// Age of the oldest pending (or retrying) event in seconds.
    pub oldest_pending_age_seconds: Option<f64>,
    /// Dead tuples of the outbox table (VACUUM pressure); 0 on SQLite,
    /// which keeps no dead tuples (deleted rows' pages go to its freelist).
    pub dead_tuples: i64,
    /// Live tuples of the outbox table (on SQLite: its rows).
    pub live_tuples: i64,
}

impl Backlog {
    /// The whole backlog as the sum of its event types' backlogs.
    pub fn of(
        event_types: &[EventTypeBacklog],
        oldest_pending_age_seconds: Option<f64>,
        dead_tuples: i64,
        live_tuples: i64,
    ) -> Backlog {
        Backlog {
            pending: event_types.iter().map(|t| t.pending).sum(),
            retrying: event_types.iter().map(|t| t.retrying).sum(),
            failed: event_types.iter().map(|t| t.failed).sum(),
            skipped: event_types.iter().map(|t| t.skipped).sum(),
            oldest_pending_age_seconds,
            dead_tuples,
            live_tuples,
        }
    }
}

/// The backlog of one event type.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventTypeBacklog {
    /// The event type.
    pub event_type: String,
    /// Waiting for their first attempt.
    pub pending: i64,
    /// In backoff.
    pub retrying: i64,
    /// Given up.
    pub failed: i64,
    /// Skipped by an operator.
    pub skipped: i64,
    /// Age of its oldest pending event in seconds.
    pub oldest_pending_age_seconds: Option<f64>,
}

/// An aggregate whose later events wait behind its head.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BlockedRecord {
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The head event.
    pub head_event_id: Uuid,
    /// `pending` (retrying) or `failed`.
    pub head_status: String,
    /// The head's last error.
    pub last_error: Option<String>,
    /// Since when.
    pub blocked_since: DateTime<Utc>,
}

/// One consumer as its tables show it: parked messages and open letters,
/// and the figures its task flushes to `outbox_consumer_stats` (the live
/// ones are the metrics `outbox_consumer_lag_seconds` and
/// `outbox_consumer_duplicates_total`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConsumerStatus {
    /// The consumer.
    pub consumer: String,
    /// Messages waiting for a predecessor (strict ordering).
    pub parked: i64,
    /// Age of the oldest parked message in seconds.
    pub oldest_parked_age_seconds: Option<f64>,
    /// Open quarantine rows.
    pub quarantined: i64,
    /// Open dead letters.
    pub dead_lettered: i64,
    /// Replays asked for and not yet run.
    pub replays_requested: i64,
    /// Events applied (summed over its instances, as of `stats_at`).
    pub applied: i64,
    /// Deliveries of events it had applied already (the inbox caught them).
    pub duplicates: i64,
    /// When it last applied an event.
    pub last_applied_at: Option<DateTime<Utc>>,
    /// How old that event was when it was applied: the consumer's lag then.
    pub lag_seconds: Option<f64>,
    /// When its task last wrote these figures (every `sweep_interval`
    /// while it runs and has done something).
    pub stats_at: Option<DateTime<Utc>>,
}

/// One relay worker as its membership row shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RelayWorkerStatus {
    /// The worker's id.
    pub worker: Uuid,
    /// Its last heartbeat.
    pub heartbeat_at: DateTime<Utc>,
    /// Whether it sleeps waiting for a NOTIFY.
    pub waiting: bool,
    /// The backend pid of its claiming connection (none before its first
    /// claim).
    pub backend_pid: Option<i32>,
    /// Whether that connection still exists: a worker whose session ended
    /// owns nothing (its row stays until its heartbeat is older than the lease).
    pub connected: bool,
    /// The partitions it owned at its last rebalance, ascending.
    pub partitions: Vec<i32>,
}

/// The outbox at a glance.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    /// The schema (PostgreSQL) or the database file (SQLite).
    pub schema: String,
    /// The whole backlog.
    pub backlog: Backlog,
    /// Per event type with anything unpublished.
    pub event_types: Vec<EventTypeBacklog>,
    /// Blocked aggregates, oldest first (up to the limit).
    pub blocked: Vec<BlockedRecord>,
    /// Every consumer with flushed stats, parked messages or open letters.
    pub consumers: Vec<ConsumerStatus>,
    /// The relay workers and the partitions each owns (PostgreSQL; empty on
    /// SQLite, whose relays hold leases on rows, not partitions).
    pub relay_workers: Vec<RelayWorkerStatus>,
    /// The partition count fixed at migration (0 on SQLite).
    pub partitions: i32,
    /// What needs an operator, one line each (empty: healthy).
    pub problems: Vec<String>,
}

/// What a health check should flag, one line each: the oldest pending
/// event older than `options.max_pending_age`, failed events, each blocked
/// aggregate, each consumer behind by more than `options.max_consumer_lag`
/// or with open quarantine rows or dead letters. Every store's status
/// lists its problems with this.
pub fn status_problems(
    backlog: &Backlog,
    blocked: &[BlockedRecord],
    consumers: &[ConsumerStatus],
    options: &StatusOptions,
) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(age) = backlog.oldest_pending_age_seconds
        && age > options.max_pending_age.as_secs_f64()
    {
        problems.push(format!(
            "the oldest pending event is {age:.0} s old (more than {} s): the relay is behind or stopped",
            options.max_pending_age.as_secs()
        ));
    }
    if backlog.failed > 0 {
        problems.push(format!(
            "{} event(s) failed: see `outbox failed list`",
            backlog.failed
        ));
    }
    for b in blocked {
        problems.push(format!(
            "aggregate {}/{} is blocked by {} ({}): {}",
            b.aggregate_type,
            b.aggregate_id,
            b.head_event_id,
            b.head_status,
            b.last_error.as_deref().unwrap_or("no error recorded")
        ));
    }
    for c in consumers {
        if let Some(lag) = c.lag_seconds
            && lag > options.max_consumer_lag.as_secs_f64()
        {
            problems.push(format!(
                "consumer {}: its last applied event was {lag:.0} s old (more than {} s): it is behind",
                c.consumer,
                options.max_consumer_lag.as_secs()
            ));
        }
        if c.quarantined > 0 {
            problems.push(format!(
                "consumer {}: {} message(s) in quarantine",
                c.consumer, c.quarantined
            ));
        }
        if c.dead_lettered > 0 {
            problems.push(format!(
                "consumer {}: {} dead letter(s)",
                c.consumer, c.dead_lettered
            ));
        }
    }
    problems
}
