//! What an operator reads of the MySQL/MariaDB outbox: the status (backlog per
//! event type, blocked aggregates, problems), events by status with the
//! filters and keyset pages of the PostgreSQL store, one event, the audit
//! log. Payloads are shown through the [`Redaction`](outbox_core::ops::Redaction).
//!
//! Each listing reads one status through the `(status, seq)` index; times
//! are stored as milliseconds and shown as UTC times.

use outbox_core::ops::{
    AuditRecord, Backlog, BlockedRecord, ConsumerStatus, EventFilter, EventRecord, EventStatus,
    EventTypeBacklog, OpsError, Page, Status, StatusOptions, page_limit, status_problems,
};
use outbox_core::store::columns::age_seconds;
use sqlx::Row;
use sqlx::mysql::MySqlRow;
use uuid::Uuid;

use super::MySqlOps;
use crate::relay::BLOCKED;
use crate::{optional_time_column, time_column, uuid_column};

/// The columns of an event record; `next_attempt_at` 0 (due at once) is
/// shown as the emit time.
macro_rules! event_columns {
    () => {
        "id, seq, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version,
         payload, traceparent, created_at, status, published_at, attempt_count,
         GREATEST(next_attempt_at, created_at) AS next_attempt_at, last_error, failed_at"
    };
}

/// Events of one status (a literal, so the status's partial index serves
/// it) with optional filters. Binds (each filter twice): event type,
/// aggregate type, aggregate id, since ms, until ms, error text, after
/// seq; then the limit.
macro_rules! events_with_status {
    ($status:literal) => {
        concat!(
            "SELECT ",
            event_columns!(),
            " FROM outbox_events WHERE status = '",
            $status,
            "'
               AND (? IS NULL OR event_type = ?)
               AND (? IS NULL OR aggregate_type = ?)
               AND (? IS NULL OR aggregate_id = ?)
               AND (? IS NULL OR COALESCE(failed_at, created_at) >= ?)
               AND (? IS NULL OR COALESCE(failed_at, created_at) < ?)
               AND (? IS NULL OR LOCATE(LOWER(?), LOWER(COALESCE(last_error, ''))) > 0)
               AND (? IS NULL OR seq > ?)
             ORDER BY seq LIMIT ?"
        )
    };
}

const EVENT: &str = concat!(
    "SELECT ",
    event_columns!(),
    " FROM outbox_events WHERE id = ?"
);

/// Per event type with anything unpublished: each arm reads one status
/// through its partial index.
const PER_EVENT_TYPE: &str = "
SELECT event_type,
       COUNT(CASE WHEN status = 'pending' AND attempt_count = 0 THEN 1 END) AS pending,
       COUNT(CASE WHEN status = 'pending' AND attempt_count > 0 THEN 1 END) AS retrying,
       COUNT(CASE WHEN status = 'failed' THEN 1 END) AS failed,
       COUNT(CASE WHEN status = 'skipped' THEN 1 END) AS skipped,
       MIN(CASE WHEN status = 'pending' THEN created_at END) AS oldest_pending
FROM (
    SELECT event_type, status, attempt_count, created_at FROM outbox_events WHERE status = 'pending'
    UNION ALL
    SELECT event_type, status, attempt_count, created_at FROM outbox_events WHERE status = 'failed'
    UNION ALL
    SELECT event_type, status, attempt_count, created_at FROM outbox_events WHERE status = 'skipped'
) AS unpublished
GROUP BY event_type ORDER BY event_type";

/// Every consumer with counts, parked messages or open letters, and
/// those figures.
const CONSUMERS: &str = "
WITH names AS (
    SELECT consumer_name FROM outbox_consumer_stats
    UNION SELECT consumer_name FROM outbox_consumer_parked
    UNION SELECT consumer_name FROM outbox_dead_letters WHERE resolved_at IS NULL
)
SELECT n.consumer_name,
       (SELECT COUNT(*) FROM outbox_consumer_parked k WHERE k.consumer_name = n.consumer_name) AS parked,
       (SELECT MIN(parked_at) FROM outbox_consumer_parked k WHERE k.consumer_name = n.consumer_name) AS oldest_parked,
       (SELECT COUNT(*) FROM outbox_dead_letters d
        WHERE d.consumer_name = n.consumer_name AND d.resolved_at IS NULL AND d.kind = 'quarantined') AS quarantined,
       (SELECT COUNT(*) FROM outbox_dead_letters d
        WHERE d.consumer_name = n.consumer_name AND d.resolved_at IS NULL AND d.kind = 'dead_lettered') AS dead_lettered,
       (SELECT COUNT(*) FROM outbox_dead_letters d
        WHERE d.consumer_name = n.consumer_name AND d.resolved_at IS NULL
          AND d.replay_requested_at IS NOT NULL) AS replays_requested,
       t.applied, t.duplicates, t.last_applied_at, t.lag_seconds, t.updated_at AS stats_at
FROM names n LEFT JOIN outbox_consumer_stats t ON t.consumer_name = n.consumer_name
ORDER BY n.consumer_name";

/// Audit rows, newest first. Binds: before id, limit.
const AUDIT: &str = "
SELECT id, at, operator, reason, action, target, ids, outcomes FROM outbox_audit
WHERE (? IS NULL OR id < ?) ORDER BY id DESC LIMIT ?";

impl MySqlOps {
    /// The outbox at a glance. `schema` is the database; the figures only
    /// PostgreSQL has are empty (dead tuples 0, no relay workers or
    /// partitions: MySQL relays lease rows).
    pub async fn status(&self, options: &StatusOptions) -> Result<Status, OpsError> {
        let live: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_events")
            .fetch_one(&self.pool)
            .await
            .map_err(OpsError::database("counting events"))?;
        let mut oldest: Option<i64> = None;
        let event_types = sqlx::query(PER_EVENT_TYPE)
            .fetch_all(&self.pool)
            .await
            .map_err(OpsError::database("counting per event type"))?
            .iter()
            .map(|row| {
                let oldest_here: Option<i64> = row.try_get("oldest_pending")?;
                oldest = match (oldest, oldest_here) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                Ok(EventTypeBacklog {
                    event_type: row.try_get("event_type")?,
                    pending: row.try_get("pending")?,
                    retrying: row.try_get("retrying")?,
                    failed: row.try_get("failed")?,
                    skipped: row.try_get("skipped")?,
                    oldest_pending_age_seconds: age_seconds(oldest_here),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(OpsError::database("reading counts per event type"))?;
        let backlog = Backlog::of(&event_types, age_seconds(oldest), 0, live);
        let blocked = self.blocked(options.blocked_limit).await?;
        let consumers = sqlx::query(CONSUMERS)
            .fetch_all(&self.pool)
            .await
            .map_err(OpsError::database("reading consumers"))?
            .iter()
            .map(consumer_status)
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(OpsError::database("reading consumers"))?;
        let problems = status_problems(&backlog, &blocked, &consumers, options);
        Ok(Status {
            schema: self
                .pool
                .connect_options()
                .get_database()
                .unwrap_or_default()
                .to_owned(),
            backlog,
            event_types,
            blocked,
            consumers,
            relay_workers: Vec::new(),
            partitions: 0,
            problems,
        })
    }

    /// Events with a status, filtered, oldest first.
    pub async fn events(&self, filter: &EventFilter) -> Result<Page<EventRecord>, OpsError> {
        let limit = page_limit(filter.limit);
        let statement = match filter.status {
            EventStatus::Pending => events_with_status!("pending"),
            EventStatus::Published => events_with_status!("published"),
            EventStatus::Failed => events_with_status!("failed"),
            EventStatus::Skipped => events_with_status!("skipped"),
        };
        let since = filter.since.map(|t| t.timestamp_millis());
        let until = filter.until.map(|t| t.timestamp_millis());
        let rows = sqlx::query(statement)
            .bind(&filter.event_type)
            .bind(&filter.event_type)
            .bind(&filter.aggregate_type)
            .bind(&filter.aggregate_type)
            .bind(&filter.aggregate_id)
            .bind(&filter.aggregate_id)
            .bind(since)
            .bind(since)
            .bind(until)
            .bind(until)
            .bind(&filter.error_contains)
            .bind(&filter.error_contains)
            .bind(filter.after)
            .bind(filter.after)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(OpsError::database("listing events"))?;
        let items = rows
            .iter()
            .map(|row| self.event_record(row))
            .collect::<Result<Vec<_>, _>>()
            .map_err(OpsError::database("reading events"))?;
        Ok(Page::of(items, limit, |e| e.seq))
    }

    /// One event by id.
    pub async fn event(&self, id: Uuid) -> Result<Option<EventRecord>, OpsError> {
        sqlx::query(EVENT)
            .bind(id.to_string())
            .fetch_optional(&self.pool)
            .await
            .map_err(OpsError::database("reading an event"))?
            .map(|row| self.event_record(&row))
            .transpose()
            .map_err(OpsError::database("reading an event"))
    }

    /// Aggregates whose head still blocks them (a retrying head, or a
    /// failed one unless [`MySqlOps::with_failed_head_policy`] says
    /// `Skip`), oldest first.
    pub async fn blocked(&self, limit: i64) -> Result<Vec<BlockedRecord>, OpsError> {
        sqlx::query(BLOCKED)
            .bind(self.skip_failed_heads)
            .bind(self.skip_failed_heads)
            .bind(limit.clamp(1, 1000))
            .fetch_all(&self.pool)
            .await
            .map_err(OpsError::database("listing blocked aggregates"))?
            .iter()
            .map(|row| {
                Ok(BlockedRecord {
                    aggregate_type: row.try_get("aggregate_type")?,
                    aggregate_id: row.try_get("aggregate_id")?,
                    head_event_id: uuid_column(row, "id")?,
                    head_status: row.try_get("status")?,
                    last_error: row.try_get("last_error")?,
                    blocked_since: time_column(row, "since")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(OpsError::database("reading blocked aggregates"))
    }

    /// One audit row (a replay request's, with the outcomes the consumer
    /// appended when it ran them).
    pub async fn audit_entry(&self, id: i64) -> Result<Option<AuditRecord>, OpsError> {
        sqlx::query(
            "SELECT id, at, operator, reason, action, target, ids, outcomes FROM outbox_audit
             WHERE id = ?",
        )
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(OpsError::database("reading an audit row"))?
        .as_ref()
        .map(audit_record)
        .transpose()
        .map_err(OpsError::database("reading an audit row"))
    }

    /// Audit rows, newest first; `before` is a page's `next`.
    pub async fn audit(
        &self,
        before: Option<i64>,
        limit: Option<i64>,
    ) -> Result<Page<AuditRecord>, OpsError> {
        let limit = page_limit(limit);
        let items = sqlx::query(AUDIT)
            .bind(before)
            .bind(before)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(OpsError::database("listing the audit"))?
            .iter()
            .map(audit_record)
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(OpsError::database("reading the audit"))?;
        Ok(Page::of(items, limit, |a| a.id))
    }

    fn event_record(&self, row: &MySqlRow) -> Result<EventRecord, sqlx::Error> {
        let event_type: String = row.try_get("event_type")?;
        let schema_version: i32 = row.try_get("schema_version")?;
        let payload: String = row.try_get("payload")?;
        let attempts: i32 = row.try_get("attempt_count")?;
        Ok(EventRecord {
            id: uuid_column(row, "id")?,
            seq: row.try_get("seq")?,
            payload: self.redaction.show(
                Some(&event_type),
                u32::try_from(schema_version).ok(),
                &payload,
            ),
            event_type,
            schema_version,
            aggregate_type: row.try_get("aggregate_type")?,
            aggregate_id: row.try_get("aggregate_id")?,
            aggregate_version: row.try_get("aggregate_version")?,
            traceparent: row.try_get("traceparent")?,
            created_at: time_column(row, "created_at")?,
            status: row.try_get("status")?,
            published_at: optional_time_column(row, "published_at")?,
            attempts,
            next_attempt_at: time_column(row, "next_attempt_at")?,
            last_error: row.try_get("last_error")?,
            failed_at: optional_time_column(row, "failed_at")?,
        })
    }
}

fn audit_record(row: &MySqlRow) -> Result<AuditRecord, sqlx::Error> {
    let ids: String = row.try_get("ids")?;
    let outcomes: Option<String> = row.try_get("outcomes")?;
    let decode = |e: serde_json::Error| sqlx::Error::Decode(e.into());
    Ok(AuditRecord {
        id: row.try_get("id")?,
        at: time_column(row, "at")?,
        operator: row.try_get("operator")?,
        reason: row.try_get("reason")?,
        action: row.try_get("action")?,
        target: row.try_get("target")?,
        ids: serde_json::from_str(&ids).map_err(decode)?,
        outcomes: match outcomes {
            Some(text) => serde_json::from_str(&text).map_err(decode)?,
            None => serde_json::Value::Null,
        },
    })
}

fn consumer_status(row: &MySqlRow) -> Result<ConsumerStatus, sqlx::Error> {
    Ok(ConsumerStatus {
        consumer: row.try_get("consumer_name")?,
        parked: row.try_get("parked")?,
        oldest_parked_age_seconds: age_seconds(row.try_get("oldest_parked")?),
        quarantined: row.try_get("quarantined")?,
        dead_lettered: row.try_get("dead_lettered")?,
        replays_requested: row.try_get("replays_requested")?,
        applied: row.try_get::<Option<i64>, _>("applied")?.unwrap_or(0),
        duplicates: row.try_get::<Option<i64>, _>("duplicates")?.unwrap_or(0),
        last_applied_at: optional_time_column(row, "last_applied_at")?,
        lag_seconds: row.try_get("lag_seconds")?,
        stats_at: optional_time_column(row, "stats_at")?,
    })
}
