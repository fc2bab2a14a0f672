//! Retention run by an operator on SQLite: published events older than
//! one age and idempotency keys older than the key retention (never a key
//! younger than that: a client may still retry its command), in small
//! batches, each its own transaction, so relays and writers wait for at
//! most one batch. Pending, failed and skipped events never go.

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{Cleanup, CleanupReport, OpsError};

use super::SqliteOps;
use super::audit_row::{complete_audit, open_audit};
use crate::{millis, now_ms};

/// Published events and idempotency keys older than their cut-offs.
/// Binds: events cut-off ms, keys cut-off ms.
const COUNT_OLD: &str = "
SELECT (SELECT count(*) FROM outbox_events WHERE status = 'published' AND published_at < ?1),
       (SELECT count(*) FROM outbox_idempotency_keys WHERE created_at < ?2)";

/// One batch of old published events. Binds: cut-off ms, batch.
const DELETE_EVENTS: &str = "
DELETE FROM outbox_events WHERE seq IN (
    SELECT seq FROM outbox_events
    WHERE status = 'published' AND published_at < ?1
    ORDER BY published_at LIMIT ?2)";

/// One batch of old idempotency keys. Binds: cut-off ms, batch.
const DELETE_KEYS: &str = "
DELETE FROM outbox_idempotency_keys WHERE idempotency_key IN (
    SELECT idempotency_key FROM outbox_idempotency_keys
    WHERE created_at < ?1 ORDER BY created_at LIMIT ?2)";

impl SqliteOps {
    /// Deletes published events older than `plan.events_older_than` and
    /// idempotency keys older than `plan.keys_older_than` in batches of
    /// `plan.batch` (1 to 100,000), calling `progress(events deleted so
    /// far, eligible)` after each; without `plan.execute` only counts. An
    /// executed cleanup writes its audit row before the first delete and
    /// completes it with the counts at the end.
    pub async fn cleanup(
        &self,
        plan: &Cleanup,
        request: &RepairRequest,
        mut progress: impl FnMut(u64, i64) + Send,
    ) -> Result<CleanupReport, OpsError> {
        let now = now_ms();
        let events_before = now - millis(plan.events_older_than);
        let keys_before = now - millis(plan.keys_older_than);
        let (eligible, keys_eligible): (i64, i64) = sqlx::query_as(COUNT_OLD)
            .bind(events_before)
            .bind(keys_before)
            .fetch_one(&self.pool)
            .await
            .map_err(OpsError::database("counting old published events and keys"))?;
        let mut report = CleanupReport {
            eligible,
            deleted: 0,
            keys_older_than_secs: plan.keys_older_than.as_secs(),
            keys_eligible,
            keys_deleted: 0,
            executed: false,
            audit_id: None,
        };
        if !plan.execute {
            return Ok(report);
        }
        // Written first, so a cleanup cut short is on record.
        let ids = serde_json::json!([
            format!(
                "published before now - {} s",
                plan.events_older_than.as_secs()
            ),
            format!(
                "idempotency keys before now - {} s",
                plan.keys_older_than.as_secs()
            ),
        ]);
        let audit_id = open_audit(&self.pool, request, "relay.cleanup", "relay", &ids).await?;
        let batch = outbox_core::relay::retention::delete_batch(plan.batch);
        loop {
            let gone = sqlx::query(DELETE_EVENTS)
                .bind(events_before)
                .bind(batch)
                .execute(&self.pool)
                .await
                .map_err(OpsError::database("deleting published events"))?
                .rows_affected();
            report.deleted += gone;
            progress(report.deleted, eligible);
            if gone < batch as u64 {
                break;
            }
        }
        loop {
            let gone = sqlx::query(DELETE_KEYS)
                .bind(keys_before)
                .bind(batch)
                .execute(&self.pool)
                .await
                .map_err(OpsError::database("deleting idempotency keys"))?
                .rows_affected();
            report.keys_deleted += gone;
            if gone < batch as u64 {
                break;
            }
        }
        let outcomes = serde_json::json!([
            {"deleted": report.deleted, "keys_deleted": report.keys_deleted}
        ]);
        complete_audit(&self.pool, audit_id, &outcomes).await?;
        report.executed = true;
        report.audit_id = Some(audit_id);
        Ok(report)
    }
}
