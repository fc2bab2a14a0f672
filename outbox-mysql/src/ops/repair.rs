//! Operator repairs of the relay's failure states on MySQL/MariaDB, by id
//! and with a reason, each in one transaction with its audit row, and
//! retention run by an operator: the same requests, reports and outcomes
//! as the PostgreSQL operations API (`outbox_postgres::Ops`).
//!
//! MySQL has no `UPDATE … RETURNING` and refuses a subquery on the table
//! an `UPDATE` changes, so a repair locks the named rows first (`SELECT …
//! FOR UPDATE`), decides which are eligible, and changes exactly those.

use std::collections::HashMap;

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{
    Cleanup, CleanupReport, IdOutcome, OpsError, RepairReport, check_repair_ids,
};
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row};
use uuid::Uuid;

use super::MySqlOps;
use crate::{millis, now_ms};

/// A repair: what it may change and how.
struct Repair {
    action: &'static str,
    /// The `SET` clause.
    set: &'static str,
    /// A note that replaces `last_error` (with the old error appended).
    note: Option<String>,
    done: &'static str,
    not_eligible: &'static str,
    eligible: fn(&Locked) -> bool,
    /// Only a head (nothing unpublished before it) is eligible.
    head_only: bool,
}

/// A named event as the repair locked it.
struct Locked {
    status: String,
    attempts: i32,
    aggregate_type: String,
    aggregate_id: String,
    version: i64,
}

impl MySqlOps {
    /// Retries failed events from their first attempt; under
    /// `FailedHeadPolicy::Block` the failed event is its aggregate's head
    /// and goes first, so order holds.
    pub async fn retry_failed(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        self.repair(
            ids,
            request,
            Repair {
                action: "relay.retry",
                set: "status = 'pending', attempt_count = 0, next_attempt_at = 0, failed_at = NULL",
                note: None,
                done: "retried",
                not_eligible: "not_failed",
                eligible: |e| e.status == "failed",
                head_only: false,
            },
        )
        .await
    }

    /// Skips failed heads: never published, kept for inspection, with
    /// `skipped by <operator>: <reason> (last error: …)` as their error;
    /// their aggregates go on.
    pub async fn skip_failed(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        let note = format!("skipped by {}: {}", request.operator(), request.reason());
        self.repair(
            ids,
            request,
            Repair {
                action: "relay.skip",
                set: "status = 'skipped'",
                note: Some(note),
                done: "skipped",
                not_eligible: "not_failed",
                eligible: |e| e.status == "failed",
                head_only: false,
            },
        )
        .await
    }

    /// Publishes published events again, with their own ids.
    pub async fn republish(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        self.repair(
            ids,
            request,
            Repair {
                action: "relay.republish",
                set: "status = 'pending', published_at = NULL, attempt_count = 0, next_attempt_at = 0,
                      last_error = NULL, first_failed_at = NULL",
                note: None,
                done: "republished",
                not_eligible: "not_published",
                eligible: |e| e.status == "published",
                head_only: false,
            },
        )
        .await
    }

    /// Retries retrying heads of blocked aggregates now, from the first
    /// attempt; an id that is not a retrying head is `not_blocked_head`.
    pub async fn retry_blocked(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        self.repair(
            ids,
            request,
            Repair {
                action: "relay.retry_blocked",
                set: "next_attempt_at = 0, attempt_count = 0",
                note: None,
                done: "retried",
                not_eligible: "not_blocked_head",
                eligible: |e| e.status == "pending" && e.attempts > 0,
                head_only: true,
            },
        )
        .await
    }

    async fn repair(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
        repair: Repair,
    ) -> Result<RepairReport, OpsError> {
        check_repair_ids(ids)?;
        let texts: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(OpsError::database("beginning a repair"))?;
        let audit_id = sqlx::query(
            "INSERT INTO outbox_audit (at, operator, reason, action, target, ids)
             VALUES (?, ?, ?, ?, 'relay', ?)",
        )
        .bind(now_ms())
        .bind(request.operator())
        .bind(request.reason())
        .bind(repair.action)
        .bind(serde_json::Value::from(texts.clone()).to_string())
        .execute(&mut *tx)
        .await
        .map_err(OpsError::database("writing the audit row"))?
        .last_insert_id() as i64;
        let locked = lock(&mut tx, &texts)
            .await
            .map_err(OpsError::database("reading event states"))?;
        let mut changed = Vec::new();
        for (id, event) in &locked {
            if !(repair.eligible)(event) {
                continue;
            }
            if repair.head_only
                && !is_head(&mut tx, event, self.skip_failed_heads)
                    .await
                    .map_err(OpsError::database("reading event states"))?
            {
                continue;
            }
            changed.push(id.clone());
        }
        if !changed.is_empty() {
            let mut update = QueryBuilder::<MySql>::new("UPDATE outbox_events SET ");
            update.push(repair.set);
            if let Some(note) = &repair.note {
                update
                    .push(", last_error = CONCAT(")
                    .push_bind(note.clone())
                    .push(", COALESCE(CONCAT(' (last error: ', last_error, ')'), ''))");
            }
            update.push(" WHERE id IN (");
            let mut list = update.separated(", ");
            for id in &changed {
                list.push_bind(id.clone());
            }
            update.push(")");
            update
                .build()
                .execute(&mut *tx)
                .await
                .map_err(OpsError::database("repairing events"))?;
        }
        let outcomes: Vec<IdOutcome> = texts
            .into_iter()
            .map(|id| {
                let status = locked.get(&id).map(|event| event.status.clone());
                let changed = changed.contains(&id);
                IdOutcome::for_event(
                    id,
                    changed,
                    status.as_deref(),
                    repair.done,
                    repair.not_eligible,
                )
            })
            .collect();
        let outcomes_json = serde_json::to_string(&outcomes).map_err(|e| OpsError::Database {
            doing: "completing the audit row",
            source: sqlx::Error::Encode(e.into()),
        })?;
        sqlx::query("UPDATE outbox_audit SET outcomes = ? WHERE id = ?")
            .bind(outcomes_json)
            .bind(audit_id)
            .execute(&mut *tx)
            .await
            .map_err(OpsError::database("completing the audit row"))?;
        tx.commit()
            .await
            .map_err(OpsError::database("committing a repair"))?;
        Ok(RepairReport { audit_id, outcomes })
    }

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
        let (eligible, keys_eligible): (i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM outbox_events WHERE status = 'published' AND published_at < ?),
                    (SELECT COUNT(*) FROM outbox_idempotency_keys WHERE created_at < ?)",
        )
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
        let audit_id = sqlx::query(
            "INSERT INTO outbox_audit (at, operator, reason, action, target, ids)
             VALUES (?, ?, ?, 'relay.cleanup', 'relay', ?)",
        )
        .bind(now)
        .bind(request.operator())
        .bind(request.reason())
        .bind(ids.to_string())
        .execute(&self.pool)
        .await
        .map_err(OpsError::database("writing the audit row"))?
        .last_insert_id() as i64;
        let batch = outbox_core::relay::retention::delete_batch(plan.batch);
        loop {
            let gone = sqlx::query(
                "DELETE FROM outbox_events WHERE status = 'published' AND published_at < ?
                 ORDER BY published_at LIMIT ?",
            )
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
            let gone = sqlx::query(
                "DELETE FROM outbox_idempotency_keys WHERE created_at < ? ORDER BY created_at LIMIT ?",
            )
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
        sqlx::query("UPDATE outbox_audit SET outcomes = ? WHERE id = ?")
            .bind(outcomes.to_string())
            .bind(audit_id)
            .execute(&self.pool)
            .await
            .map_err(OpsError::database("completing the audit row"))?;
        report.executed = true;
        report.audit_id = Some(audit_id);
        Ok(report)
    }
}

/// Locks the named events and reads their states.
async fn lock(
    conn: &mut MySqlConnection,
    ids: &[String],
) -> Result<HashMap<String, Locked>, sqlx::Error> {
    let mut query = QueryBuilder::<MySql>::new(
        "SELECT id, status, attempt_count, aggregate_type, aggregate_id, aggregate_version
         FROM outbox_events WHERE id IN (",
    );
    let mut list = query.separated(", ");
    for id in ids {
        list.push_bind(id.clone());
    }
    query.push(") FOR UPDATE");
    query
        .build()
        .fetch_all(conn)
        .await?
        .iter()
        .map(|row| {
            Ok((
                row.try_get("id")?,
                Locked {
                    status: row.try_get("status")?,
                    attempts: row.try_get("attempt_count")?,
                    aggregate_type: row.try_get("aggregate_type")?,
                    aggregate_id: row.try_get("aggregate_id")?,
                    version: row.try_get("aggregate_version")?,
                },
            ))
        })
        .collect()
}

/// Whether nothing unpublished precedes the event in its aggregate (a
/// failed version does not count when relays skip failed heads).
async fn is_head(
    conn: &mut MySqlConnection,
    event: &Locked,
    skip_failed_heads: bool,
) -> Result<bool, sqlx::Error> {
    let before: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM outbox_events
         WHERE aggregate_type = ? AND aggregate_id = ?
           AND (status = 'pending' OR (status = 'failed' AND NOT ?))
           AND aggregate_version < ?",
    )
    .bind(&event.aggregate_type)
    .bind(&event.aggregate_id)
    .bind(skip_failed_heads)
    .bind(event.version)
    .fetch_one(conn)
    .await?;
    Ok(before == 0)
}
