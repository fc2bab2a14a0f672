//! The PostgreSQL status: the backlog and its age per event type, blocked
//! aggregates, dead tuples, each consumer's parked messages and letters.

use chrono::{DateTime, Utc};
use outbox_core::ops::*;
use sqlx::{AssertSqlSafe, Row};
use std::time::Duration;

use super::Ops;

fn age(at: Option<DateTime<Utc>>) -> Option<f64> {
    at.map(|at| (Utc::now() - at).to_std().unwrap_or_default().as_secs_f64())
}

impl Ops {
    /// Reads the status; `problems` lists what a health check should flag.
    pub async fn status(&self, options: &StatusOptions) -> Result<Status, OpsError> {
        let table = format!("{}.outbox_events", self.schema.quoted());
        let (dead_tuples, live_tuples): (i64, i64) =
            sqlx::query_as(AssertSqlSafe(self.sql.tuples.as_str()))
                .bind(table)
                .fetch_one(&self.pool)
                .await
                .map_err(OpsError::database("reading table statistics"))?;
        let mut oldest_pending: Option<DateTime<Utc>> = None;
        let event_types = sqlx::query(AssertSqlSafe(self.sql.per_event_type.as_str()))
            .fetch_all(&self.pool)
            .await
            .map_err(OpsError::database("counting per event type"))?
            .iter()
            .map(|row| {
                let oldest: Option<DateTime<Utc>> = row.try_get("oldest_pending")?;
                oldest_pending = match (oldest_pending, oldest) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                Ok(EventTypeBacklog {
                    event_type: row.try_get("event_type")?,
                    pending: row.try_get("pending")?,
                    retrying: row.try_get("retrying")?,
                    failed: row.try_get("failed")?,
                    skipped: row.try_get("skipped")?,
                    oldest_pending_age_seconds: age(oldest),
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(OpsError::database("reading counts per event type"))?;
        let backlog = Backlog::of(&event_types, age(oldest_pending), dead_tuples, live_tuples);
        let blocked = self.blocked(options.blocked_limit).await?;
        let consumers = sqlx::query(AssertSqlSafe(self.sql.consumers.as_str()))
            .fetch_all(&self.pool)
            .await
            .map_err(OpsError::database("reading consumers"))?
            .iter()
            .map(|row| {
                Ok(ConsumerStatus {
                    consumer: row.try_get("consumer_name")?,
                    parked: row.try_get("parked")?,
                    oldest_parked_age_seconds: age(row.try_get("oldest_parked")?),
                    quarantined: row.try_get("quarantined")?,
                    dead_lettered: row.try_get("dead_lettered")?,
                    replays_requested: row.try_get("replays_requested")?,
                    applied: row.try_get::<Option<i64>, _>("applied")?.unwrap_or(0),
                    duplicates: row.try_get::<Option<i64>, _>("duplicates")?.unwrap_or(0),
                    last_applied_at: row.try_get("last_applied_at")?,
                    lag_seconds: row.try_get("lag_seconds")?,
                    stats_at: row.try_get("stats_at")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(OpsError::database("reading consumers"))?;
        let rows = sqlx::query(AssertSqlSafe(self.sql.relay_workers.as_str()))
            .fetch_all(&self.pool)
            .await
            .map_err(OpsError::database("reading relay workers"))?;
        let partitions = match rows.first() {
            Some(row) => row
                .try_get("partition_count")
                .map_err(OpsError::database("reading relay workers"))?,
            None => 256,
        };
        let relay_workers = rows
            .iter()
            .map(|row| {
                Ok(RelayWorkerStatus {
                    worker: row.try_get("relay_id")?,
                    heartbeat_at: row.try_get("heartbeat_at")?,
                    waiting: row.try_get("waiting")?,
                    backend_pid: row.try_get("backend_pid")?,
                    connected: row.try_get("connected")?,
                    partitions: row.try_get("partitions")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(OpsError::database("reading relay workers"))?;
        let problems = status_problems(&backlog, &blocked, &consumers, options);
        Ok(Status {
            schema: self.schema.to_string(),
            backlog,
            event_types,
            blocked,
            consumers,
            relay_workers,
            partitions,
            problems,
        })
    }

    /// Aggregates whose head still blocks them, oldest first, under the
    /// failed-head policy of [`Ops::with_failed_head_policy`].
    pub async fn blocked(&self, limit: i64) -> Result<Vec<BlockedRecord>, OpsError> {
        let store = crate::PgRelayStore::new(
            self.pool.clone(),
            self.schema.clone(),
            self.failed_heads,
            Duration::from_secs(120),
        );
        let blocked = store
            .blocked_aggregates(limit.clamp(1, 1000))
            .await
            .map_err(|e| OpsError::Database {
                doing: "listing blocked aggregates",
                source: e.source,
            })?;
        Ok(blocked
            .into_iter()
            .map(|b| BlockedRecord {
                aggregate_type: b.aggregate_type,
                aggregate_id: b.aggregate_id,
                head_event_id: b.head_event_id,
                head_status: b.head_status,
                last_error: b.last_error,
                blocked_since: b.blocked_since,
            })
            .collect())
    }
}
