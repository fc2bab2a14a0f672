//! Operator repairs of the relay's failure states on SQLite, by id and with
//! a reason, each in one transaction with its audit row (`outbox_audit`:
//! who, when, why, which ids, what happened to each): the same requests,
//! reports and outcomes as the PostgreSQL operations API
//! (`outbox_postgres::Ops`).

use std::collections::{HashMap, HashSet};

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{IdOutcome, OpsError, RepairReport, check_repair_ids};
use sqlx::{Row, SqliteConnection};
use uuid::Uuid;

use super::SqliteOps;
use super::audit_row::{begin_repair, close_audit, open_audit};

/// Failed events back to pending, from the first attempt. Binds: ids.
const RETRY_FAILED: &str = "
UPDATE outbox_events SET status = 'pending', attempt_count = 0, next_attempt_at = 0, failed_at = NULL
WHERE status = 'failed' AND id IN (SELECT value FROM json_each(?1))
RETURNING id";

/// Failed events to skipped (never published, kept for inspection). Binds:
/// ids, note.
const SKIP_FAILED: &str = "
UPDATE outbox_events
SET status = 'skipped', last_error = ?2 || coalesce(' (last error: ' || last_error || ')', '')
WHERE status = 'failed' AND id IN (SELECT value FROM json_each(?1))
RETURNING id";

/// Published events published again. Binds: ids.
const REPUBLISH: &str = "
UPDATE outbox_events
SET status = 'pending', published_at = NULL, attempt_count = 0, next_attempt_at = 0,
    last_error = NULL, first_failed_at = NULL
WHERE status = 'published' AND id IN (SELECT value FROM json_each(?1))
RETURNING id";

/// Retrying heads of their aggregates tried now, from the first attempt;
/// `$blocking` are the states of an earlier version that keep an event
/// from being its aggregate's head. Binds: ids.
macro_rules! retry_blocked {
    ($blocking:literal) => {
        concat!(
            "
UPDATE outbox_events SET next_attempt_at = 0, attempt_count = 0
WHERE status = 'pending' AND attempt_count > 0 AND id IN (SELECT value FROM json_each(?1))
  AND NOT EXISTS (
      SELECT 1 FROM outbox_events o
      WHERE o.aggregate_type = outbox_events.aggregate_type
        AND o.aggregate_id = outbox_events.aggregate_id
        AND o.status IN (",
            $blocking,
            ")
        AND o.aggregate_version < outbox_events.aggregate_version)
RETURNING id"
        )
    };
}

/// Under `FailedHeadPolicy::Block`: a failed version blocks too.
const RETRY_BLOCKED: &str = retry_blocked!("'pending', 'failed'");
/// Under `FailedHeadPolicy::Skip`: only a pending one does.
const RETRY_BLOCKED_SKIPPING_FAILED: &str = retry_blocked!("'pending'");

impl SqliteOps {
    /// Retries failed events from their first attempt. Under
    /// `FailedHeadPolicy::Block` a failed event is its aggregate's head, and
    /// the aggregate goes on in order once it is published.
    pub async fn retry_failed(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        self.repair(
            ids,
            request,
            "relay.retry",
            RETRY_FAILED,
            None,
            "retried",
            "not_failed",
        )
        .await
    }

    /// Skips failed heads: the event becomes `skipped` (never published,
    /// kept for inspection; its `last_error` becomes `skipped by
    /// <operator>: <reason> (last error: <the publish error>)`) and its
    /// aggregate's later events go on.
    pub async fn skip_failed(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        let note = format!("skipped by {}: {}", request.operator(), request.reason());
        self.repair(
            ids,
            request,
            "relay.skip",
            SKIP_FAILED,
            Some(note),
            "skipped",
            "not_failed",
        )
        .await
    }

    /// Publishes published events again, with their own event ids
    /// (consumers that applied them find them in their inbox). Rows removed
    /// by retention cannot be republished.
    pub async fn republish(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        self.repair(
            ids,
            request,
            "relay.republish",
            REPUBLISH,
            None,
            "republished",
            "not_published",
        )
        .await
    }

    /// Retries retrying heads of blocked aggregates now, from the first
    /// attempt, instead of after their backoff. An id that is not a
    /// retrying head is `not_blocked_head`.
    pub async fn retry_blocked(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        self.repair(
            ids,
            request,
            "relay.retry_blocked",
            if self.skip_failed_heads {
                RETRY_BLOCKED_SKIPPING_FAILED
            } else {
                RETRY_BLOCKED
            },
            None,
            "retried",
            "not_blocked_head",
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn repair(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
        action: &str,
        statement: &'static str,
        note: Option<String>,
        done: &str,
        not_eligible: &str,
    ) -> Result<RepairReport, OpsError> {
        check_repair_ids(ids)?;
        let texts: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let ids_json = serde_json::Value::from(texts.clone()).to_string();
        let mut tx = begin_repair(&self.pool).await?;
        let audit_id = open_audit(
            &mut *tx,
            request,
            action,
            "relay",
            &serde_json::Value::from(texts.clone()),
        )
        .await?;
        let mut query = sqlx::query_scalar::<_, String>(statement).bind(&ids_json);
        if let Some(note) = &note {
            query = query.bind(note);
        }
        let changed: HashSet<String> = query
            .fetch_all(&mut *tx)
            .await
            .map_err(OpsError::database("repairing events"))?
            .into_iter()
            .collect();
        let statuses = statuses(&mut tx, &ids_json)
            .await
            .map_err(OpsError::database("reading event states"))?;
        let outcomes: Vec<IdOutcome> = texts
            .into_iter()
            .map(|id| {
                let changed = changed.contains(&id);
                let status = statuses.get(&id).cloned();
                IdOutcome::for_event(id, changed, status.as_deref(), done, not_eligible)
            })
            .collect();
        close_audit(tx, audit_id, outcomes).await
    }
}

async fn statuses(
    conn: &mut SqliteConnection,
    ids_json: &str,
) -> Result<HashMap<String, String>, sqlx::Error> {
    sqlx::query(
        "SELECT id, status FROM outbox_events WHERE id IN (SELECT value FROM json_each(?1))",
    )
    .bind(ids_json)
    .fetch_all(conn)
    .await?
    .iter()
    .map(|row| Ok((row.try_get("id")?, row.try_get("status")?)))
    .collect()
}
