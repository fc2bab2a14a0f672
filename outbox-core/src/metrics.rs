//! Metric names (Prometheus style, through the `metrics` facade) and the
//! helpers that record them. The alert signal is the age of the oldest
//! pending event, not the queue depth.

use crate::relay::store::OutboxStats;

/// Events waiting to be published (gauge, label `schema`).
pub const PENDING_EVENTS: &str = "outbox_pending_events";
/// Age of the oldest pending event in seconds (gauge, label `schema`).
pub const OLDEST_PENDING_AGE: &str = "outbox_oldest_pending_age_seconds";
/// Events in the failed state (gauge, label `schema`).
pub const FAILED_EVENTS: &str = "outbox_failed_events";
/// Aggregates blocked behind a retrying or failed head (gauge, label `schema`).
pub const BLOCKED_AGGREGATES: &str = "outbox_blocked_aggregates";
/// Dead tuples in the outbox table (gauge, label `schema`).
pub const DEAD_TUPLES: &str = "outbox_table_dead_tuples";
/// Live tuples in the outbox table (gauge, label `schema`).
pub const LIVE_TUPLES: &str = "outbox_table_live_tuples";
/// Publish attempts (counter, labels `schema`, `transport`).
pub const PUBLISH_ATTEMPTS: &str = "outbox_relay_publish_attempts_total";
/// Events acknowledged by the broker (counter, labels `schema`, `transport`).
pub const PUBLISHED: &str = "outbox_relay_published_total";
/// Failed publish attempts (counter, labels `schema`, `transport`, `kind` = retryable|permanent).
pub const PUBLISH_FAILURES: &str = "outbox_relay_publish_failures_total";
/// Events moved to the failed state (counter, label `schema`).
pub const MOVED_TO_FAILED: &str = "outbox_relay_failed_total";
/// Time from claim to recorded outcome of one batch (histogram, label `schema`).
pub const BATCH_DURATION: &str = "outbox_relay_batch_duration_seconds";
/// Events per claimed batch (histogram, label `schema`).
pub const BATCH_EVENTS: &str = "outbox_relay_batch_events";
/// Whether the relay's transport can publish: 1 up, 0 down (gauge, labels
/// `schema`, `transport`). While it is 0 the relay claims nothing.
pub const TRANSPORT_UP: &str = "outbox_relay_transport_up";
/// Claims or completions that failed on the database (counter, label `schema`).
pub const STORE_ERRORS: &str = "outbox_relay_store_errors_total";
/// Published rows deleted by retention (counter, label `schema`).
pub const RETENTION_DELETED: &str = "outbox_retention_deleted_total";
/// Idempotency keys deleted by retention (counter, label `schema`).
pub const RETENTION_KEYS_DELETED: &str = "outbox_retention_keys_deleted_total";

/// Records the backlog gauges of one schema.
pub fn record_stats(schema: &str, stats: &OutboxStats) {
    let schema = schema.to_owned();
    metrics::gauge!(PENDING_EVENTS, "schema" => schema.clone()).set(stats.pending as f64);
    metrics::gauge!(OLDEST_PENDING_AGE, "schema" => schema.clone())
        .set(stats.oldest_pending_age().as_secs_f64());
    metrics::gauge!(FAILED_EVENTS, "schema" => schema.clone()).set(stats.failed as f64);
    metrics::gauge!(BLOCKED_AGGREGATES, "schema" => schema.clone())
        .set(stats.blocked_aggregates as f64);
    metrics::gauge!(DEAD_TUPLES, "schema" => schema.clone()).set(stats.dead_tuples as f64);
    metrics::gauge!(LIVE_TUPLES, "schema" => schema).set(stats.live_tuples as f64);
}

/// Messages a consumer settled (counter, labels `consumer`, `outcome` =
/// applied|duplicate|stale|parked|quarantined|ignored|foreign|retry|dead_lettered).
pub const CONSUMER_MESSAGES: &str = "outbox_consumer_messages_total";
/// Duplicates a consumer's inbox rejected (counter, label `consumer`).
pub const CONSUMER_DUPLICATES: &str = "outbox_consumer_duplicates_total";
/// Messages a consumer quarantined (counter, label `consumer`).
pub const CONSUMER_QUARANTINED: &str = "outbox_consumer_quarantined_total";
/// Messages a consumer moved to its dead letters (counter, label `consumer`).
pub const CONSUMER_DEAD_LETTERED: &str = "outbox_consumer_dead_lettered_total";
/// Seconds from an event's emit to its handler's commit, for the latest
/// applied event (gauge, label `consumer`): the consumer lag in time.
pub const CONSUMER_LAG: &str = "outbox_consumer_lag_seconds";
/// Messages the broker holds for the consumer, not yet delivered (gauge,
/// label `consumer`; JetStream reports it with each message).
pub const CONSUMER_PENDING: &str = "outbox_consumer_pending_messages";
/// Time a handler ran, including its failures (histogram, label `consumer`).
pub const CONSUMER_HANDLER_DURATION: &str = "outbox_consumer_handler_duration_seconds";
/// Aggregates a strict consumer started at the lowest version that arrived,
/// because it had never seen them before (counter, label `consumer`).
pub const CONSUMER_STRICT_STARTS: &str = "outbox_consumer_strict_starts_total";
/// Letters replayed into a consumer (counter, labels `consumer`, `outcome`
/// = applied|already_applied|stale|parked|ignored|failed|still_unreadable|not_found).
pub const CONSUMER_REPLAYS: &str = "outbox_consumer_replays_total";
/// Database or source errors of a consumer loop (counter, labels
/// `consumer`, `kind` = database|source).
pub const CONSUMER_ERRORS: &str = "outbox_consumer_errors_total";
