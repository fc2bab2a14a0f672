//! The PostgreSQL repairs: each one transaction that also writes its audit
//! row.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use outbox_core::audit::RepairRequest;
use outbox_core::ops::*;
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::Ops;

fn outcomes_json(outcomes: &[IdOutcome]) -> serde_json::Value {
    serde_json::to_value(outcomes).unwrap_or(serde_json::Value::Null)
}

impl Ops {
    /// Sets failed events back to pending with their attempts reset. Under
    /// `FailedHeadPolicy::Block` a failed event is its aggregate's head: the
    /// claim takes it before the aggregate's later events, so order holds.
    pub async fn retry_failed(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        self.relay_repair(
            ids,
            request,
            "relay.retry",
            &self.sql.retry_failed,
            None,
            "retried",
            "not_failed",
        )
        .await
    }

    /// Skips failed heads: the event becomes `skipped` (never published,
    /// kept for inspection; its `last_error` becomes `skipped by <operator>:
    /// <reason> (last error: <the publish error>)`) and its aggregate's
    /// later events go on.
    pub async fn skip_failed(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        let note = format!("skipped by {}: {}", request.operator(), request.reason());
        self.relay_repair(
            ids,
            request,
            "relay.skip",
            &self.sql.skip_failed,
            Some(note),
            "skipped",
            "not_failed",
        )
        .await
    }

    /// Publishes published events again, with their own event ids:
    /// consumers that applied them find them in their inbox (a duplicate,
    /// nothing applied again); consumers that never saw them (a new one, a
    /// purged stream) apply them. JetStream drops a message whose
    /// `Nats-Msg-Id` it saw within the stream's duplicate window (2 minutes
    /// by default), so a republish shortly after the first publish reaches
    /// no one. Rows removed by retention cannot be republished.
    pub async fn republish(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        self.relay_repair(
            ids,
            request,
            "relay.republish",
            &self.sql.republish,
            None,
            "republished",
            "not_published",
        )
        .await
    }

    /// Retries pending heads of blocked aggregates now: the head's next
    /// attempt becomes now and its attempts start again from the first
    /// (as `retry_failed` does for a failed head). For a head whose
    /// backoff would wait longer than the operator wants, after the cause
    /// is fixed. An id that is not the pending head of a blocked aggregate
    /// is `not_blocked_head` (a failed head: use [`Ops::retry_failed`]).
    pub async fn retry_blocked(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        self.relay_repair(
            ids,
            request,
            "relay.retry_blocked",
            &self.sql.retry_blocked,
            None,
            "retried",
            "not_blocked_head",
        )
        .await
    }

    #[allow(clippy::too_many_arguments)]
    async fn relay_repair(
        &self,
        ids: &[Uuid],
        request: &RepairRequest,
        action: &str,
        statement: &str,
        note: Option<String>,
        done: &str,
        not_eligible: &str,
    ) -> Result<RepairReport, OpsError> {
        check_repair_ids(ids)?;
        let texts: Vec<String> = ids.iter().map(Uuid::to_string).collect();
        let (mut tx, audit_id) = self.open_repair(request, action, "relay", &texts).await?;
        let mut query = sqlx::query_scalar::<_, Uuid>(AssertSqlSafe(statement)).bind(ids);
        if let Some(note) = &note {
            query = query.bind(note);
        }
        let changed: HashSet<Uuid> = query
            .fetch_all(&mut *tx)
            .await
            .map_err(OpsError::database("repairing events"))?
            .into_iter()
            .collect();
        let statuses: HashMap<Uuid, String> =
            sqlx::query(AssertSqlSafe(self.sql.statuses.as_str()))
                .bind(ids)
                .fetch_all(&mut *tx)
                .await
                .map_err(OpsError::database("reading event states"))?
                .iter()
                .map(|row| Ok((row.try_get("id")?, row.try_get("status")?)))
                .collect::<Result<_, sqlx::Error>>()
                .map_err(OpsError::database("reading event states"))?;
        let outcomes: Vec<IdOutcome> = ids
            .iter()
            .map(|id| {
                IdOutcome::for_event(
                    id.to_string(),
                    changed.contains(id),
                    statuses.get(id).map(String::as_str),
                    done,
                    not_eligible,
                )
            })
            .collect();
        self.close_repair(tx, audit_id, outcomes).await
    }

    /// Asks the running consumer to replay open letters of `kind`: they
    /// are marked, and the consumer (which has the handlers) takes each
    /// request at its next sweep, runs it through `Consumer::replay`'s path
    /// and appends the outcome (with `ran_at`) to this repair's audit row.
    /// The letter shows `replay_requested_at` until the consumer takes it.
    /// A letter already requested is left to that request
    /// (`already_requested`).
    pub async fn request_replay(
        &self,
        consumer: &str,
        kind: LetterKind,
        letter_ids: &[i64],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        self.letter_repair(consumer, kind, letter_ids, request, "consumer.replay", None)
            .await
    }

    /// Closes open letters of `kind` without running them, as `discarded
    /// by <operator>: <reason>` (a pending replay request goes with it);
    /// they stay listed with `include_resolved`.
    pub async fn discard(
        &self,
        consumer: &str,
        kind: LetterKind,
        letter_ids: &[i64],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        let resolution = format!("discarded by {}: {}", request.operator(), request.reason());
        self.letter_repair(
            consumer,
            kind,
            letter_ids,
            request,
            "consumer.discard",
            Some(resolution),
        )
        .await
    }

    async fn letter_repair(
        &self,
        consumer: &str,
        kind: LetterKind,
        ids: &[i64],
        request: &RepairRequest,
        action: &str,
        discard: Option<String>,
    ) -> Result<RepairReport, OpsError> {
        check_repair_ids(ids)?;
        let texts: Vec<String> = ids.iter().map(i64::to_string).collect();
        let (mut tx, audit_id) = self.open_repair(request, action, consumer, &texts).await?;
        let changed: HashSet<i64> = match &discard {
            Some(resolution) => {
                sqlx::query_scalar::<_, i64>(AssertSqlSafe(self.sql.discard.as_str()))
                    .bind(consumer)
                    .bind(ids)
                    .bind(resolution)
                    .bind(kind.as_str())
                    .fetch_all(&mut *tx)
                    .await
            }
            None => {
                sqlx::query_scalar::<_, i64>(AssertSqlSafe(self.sql.request_replay.as_str()))
                    .bind(consumer)
                    .bind(ids)
                    .bind(audit_id)
                    .bind(kind.as_str())
                    .fetch_all(&mut *tx)
                    .await
            }
        }
        .map_err(OpsError::database("repairing letters"))?
        .into_iter()
        .collect();
        let states: HashMap<i64, LetterRepairState> =
            sqlx::query(AssertSqlSafe(self.sql.letter_states.as_str()))
                .bind(consumer)
                .bind(ids)
                .fetch_all(&mut *tx)
                .await
                .map_err(OpsError::database("reading letters"))?
                .iter()
                .map(|row| {
                    Ok((
                        row.try_get("id")?,
                        LetterRepairState {
                            kind: row.try_get("kind")?,
                            resolution: row.try_get("resolution")?,
                            requested: row.try_get("requested")?,
                        },
                    ))
                })
                .collect::<Result<_, sqlx::Error>>()
                .map_err(OpsError::database("reading letters"))?;
        let done = if discard.is_some() {
            "discarded"
        } else {
            "replay_requested"
        };
        let outcomes: Vec<IdOutcome> = ids
            .iter()
            .map(|id| {
                IdOutcome::for_letter(
                    *id,
                    changed.contains(id),
                    states.get(id),
                    kind,
                    consumer,
                    done,
                )
            })
            .collect();
        self.close_repair(tx, audit_id, outcomes).await
    }

    /// Deletes published events older than `plan.events_older_than` and
    /// idempotency keys older than `plan.keys_older_than` in batches of
    /// `plan.batch`, each batch its own transaction, calling
    /// `progress(events deleted so far, eligible)` after each; without
    /// `plan.execute` only counts what would go. Never touches pending,
    /// failed or skipped events. An executed cleanup writes its audit row
    /// before the first delete and completes it with the counts at the end.
    pub async fn cleanup(
        &self,
        plan: &Cleanup,
        request: &RepairRequest,
        mut progress: impl FnMut(u64, i64),
    ) -> Result<CleanupReport, OpsError> {
        let (eligible, keys_eligible): (i64, i64) =
            sqlx::query_as(AssertSqlSafe(self.sql.count_old_published.as_str()))
                .bind(plan.events_older_than.as_secs_f64())
                .bind(plan.keys_older_than.as_secs_f64())
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
        // The audit row is written first, so a cleanup cut short (a crash,
        // ^C) is on record; its outcome is completed at the end.
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(OpsError::database("acquiring a connection"))?;
        let audit_id = self
            .audit
            .begin(
                &mut conn,
                request,
                "relay.cleanup",
                "relay",
                &[
                    format!(
                        "published before now - {} s",
                        plan.events_older_than.as_secs()
                    ),
                    format!(
                        "idempotency keys before now - {} s",
                        plan.keys_older_than.as_secs()
                    ),
                ],
            )
            .await
            .map_err(OpsError::database("writing the audit row"))?;
        drop(conn);
        let store = crate::PgRelayStore::new(
            self.pool.clone(),
            self.schema.clone(),
            outbox_core::relay::FailedHeadPolicy::Block,
            Duration::from_secs(120),
        );
        let batch = outbox_core::relay::retention::delete_batch(plan.batch);
        loop {
            let gone = store
                .purge_published(plan.events_older_than, batch)
                .await
                .map_err(|e| OpsError::Database {
                    doing: "deleting published events",
                    source: e.source,
                })?;
            report.deleted += gone;
            progress(report.deleted, eligible);
            if gone < batch as u64 {
                break;
            }
        }
        loop {
            let gone = store
                .purge_idempotency_keys(plan.keys_older_than, batch)
                .await
                .map_err(|e| OpsError::Database {
                    doing: "deleting idempotency keys",
                    source: e.source,
                })?;
            report.keys_deleted += gone;
            if gone < batch as u64 {
                break;
            }
        }
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(OpsError::database("acquiring a connection"))?;
        self.audit
            .finish(
                &mut conn,
                audit_id,
                &serde_json::json!([{"deleted": report.deleted, "keys_deleted": report.keys_deleted}]),
            )
            .await
            .map_err(OpsError::database("completing the audit row"))?;
        report.executed = true;
        report.audit_id = Some(audit_id);
        Ok(report)
    }

    /// Moves a consumer's position for one aggregate past `version`, a
    /// version it will never receive (the producer skipped it with
    /// [`Ops::skip_failed`]): only when the position is exactly the
    /// version before, so nothing applied is ever passed over. Under strict
    /// ordering the aggregate's next version then applies: a parked one at
    /// the consumer's next sweep, a dead-lettered one when replayed.
    pub async fn pass_version(
        &self,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
        version: i64,
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        let target = format!("{aggregate_type}/{aggregate_id}@{version}");
        let (mut tx, audit_id) = self
            .open_repair(
                request,
                "consumer.pass_version",
                consumer,
                std::slice::from_ref(&target),
            )
            .await?;
        let passed: Option<i64> = sqlx::query_scalar(AssertSqlSafe(self.sql.pass_version.as_str()))
            .bind(consumer)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(version)
            .fetch_optional(&mut *tx)
            .await
            .map_err(OpsError::database("moving a position"))?;
        let outcome = match passed {
            Some(_) => IdOutcome {
                id: target,
                outcome: "passed".to_owned(),
                detail: None,
            },
            None => {
                let position: Option<i64> =
                    sqlx::query_scalar(AssertSqlSafe(self.sql.position.as_str()))
                        .bind(consumer)
                        .bind(aggregate_type)
                        .bind(aggregate_id)
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(OpsError::database("reading a position"))?;
                IdOutcome {
                    id: target,
                    outcome: "not_at_gap".to_owned(),
                    detail: Some(match position {
                        Some(at) => format!(
                            "the position is {at}; only a position at {} can pass version {version}",
                            version.saturating_sub(1)
                        ),
                        None => "the consumer has no position for this aggregate".to_owned(),
                    }),
                }
            }
        };
        let outcomes = vec![outcome];
        self.close_repair(tx, audit_id, outcomes).await
    }

    /// Opens a repair: its transaction, with the audit row written first.
    async fn open_repair(
        &self,
        request: &RepairRequest,
        action: &str,
        target: &str,
        ids: &[String],
    ) -> Result<(sqlx::Transaction<'static, sqlx::Postgres>, i64), OpsError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(OpsError::database("beginning a repair"))?;
        let audit_id = self
            .audit
            .begin(&mut tx, request, action, target, ids)
            .await
            .map_err(OpsError::database("writing the audit row"))?;
        Ok((tx, audit_id))
    }

    /// Completes the audit row with what happened to each id and commits
    /// the repair with it.
    async fn close_repair(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
        audit_id: i64,
        outcomes: Vec<IdOutcome>,
    ) -> Result<RepairReport, OpsError> {
        self.audit
            .finish(&mut tx, audit_id, &outcomes_json(&outcomes))
            .await
            .map_err(OpsError::database("completing the audit row"))?;
        tx.commit()
            .await
            .map_err(OpsError::database("committing a repair"))?;
        Ok(RepairReport { audit_id, outcomes })
    }
}
