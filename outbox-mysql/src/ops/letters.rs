//! The consumer's side of the operations API on MySQL/MariaDB
//! ([`outbox_core::ops::LetterStore`]): a consumer's quarantine and dead
//! letters (filters, keyset pages, payloads redacted), one letter, a
//! position, and the audited repairs — asking the running consumer to
//! replay letters, discarding them, passing a version the producer
//! skipped — with the PostgreSQL store's records and outcomes.
//!
//! A repair locks the named letters (`SELECT … FOR UPDATE`), changes the
//! eligible ones by id and reads them back in the same transaction as its
//! audit row (MySQL has no `RETURNING`).

use std::collections::HashMap;

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{
    IdOutcome, LetterFilter, LetterKind, LetterRecord, LetterRepairState, OpsError, Page,
    PositionRecord, RepairReport, check_repair_ids, page_limit,
};
use sqlx::mysql::MySqlRow;
use sqlx::{MySql, MySqlConnection, QueryBuilder, Row, Transaction};

use super::MySqlOps;
use crate::aggregate_key::aggregate_key;
use crate::{now_ms, optional_time_column, time_column};

const LETTER_COLUMNS: &str = "id, consumer_name, kind, event_id, event_type, schema_version,
    aggregate_type, aggregate_id, aggregate_version, headers, payload, reason, attempts,
    created_at, resolved_at, resolution, replays, last_replay_error, replay_requested_at";

/// Letters of a consumer. Binds: consumer, kind, then each filter twice
/// (event type, aggregate type, aggregate id, since, until, reason text,
/// after id), include resolved, limit.
const LETTERS: &str = "
WHERE consumer_name = ? AND kind = ?
  AND (? IS NULL OR event_type = ?)
  AND (? IS NULL OR aggregate_type = ?)
  AND (? IS NULL OR aggregate_id = ?)
  AND (? IS NULL OR created_at >= ?)
  AND (? IS NULL OR created_at < ?)
  AND (? IS NULL OR LOCATE(LOWER(?), LOWER(reason)) > 0)
  AND (? IS NULL OR id > ?)
  AND (? OR resolved_at IS NULL)
ORDER BY id LIMIT ?";

/// What a repair reads of a letter it names.
struct LockedLetter {
    kind: String,
    resolved: bool,
    resolution: Option<String>,
    requested: bool,
}

impl MySqlOps {
    /// A consumer's letters of one kind, filtered, oldest first.
    pub async fn letters(&self, filter: &LetterFilter) -> Result<Page<LetterRecord>, OpsError> {
        let limit = page_limit(filter.limit);
        let sql = format!("SELECT {LETTER_COLUMNS} FROM outbox_dead_letters {LETTERS}");
        let since = filter.since.map(|t| t.timestamp_millis());
        let until = filter.until.map(|t| t.timestamp_millis());
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&filter.consumer)
            .bind(filter.kind.as_str())
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
            .bind(&filter.reason_contains)
            .bind(&filter.reason_contains)
            .bind(filter.after)
            .bind(filter.after)
            .bind(filter.include_resolved)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(OpsError::database("listing letters"))?;
        let items = rows
            .iter()
            .map(|row| self.letter_record(row))
            .collect::<Result<Vec<_>, _>>()
            .map_err(OpsError::database("reading letters"))?;
        Ok(Page::of(items, limit, |l| l.id))
    }

    /// One letter of a consumer by id.
    pub async fn letter(&self, consumer: &str, id: i64) -> Result<Option<LetterRecord>, OpsError> {
        let sql = format!(
            "SELECT {LETTER_COLUMNS} FROM outbox_dead_letters WHERE consumer_name = ? AND id = ?"
        );
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(consumer)
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(OpsError::database("reading a letter"))?;
        row.map(|row| self.letter_record(&row))
            .transpose()
            .map_err(OpsError::database("reading a letter"))
    }

    fn letter_record(&self, row: &MySqlRow) -> Result<LetterRecord, sqlx::Error> {
        let event_type: Option<String> = row.try_get("event_type")?;
        let schema_version: Option<i32> = row.try_get("schema_version")?;
        let payload: Vec<u8> = row.try_get("payload")?;
        let headers: String = row.try_get("headers")?;
        let event_id: Option<String> = row.try_get("event_id")?;
        Ok(LetterRecord {
            id: row.try_get("id")?,
            consumer: row.try_get("consumer_name")?,
            kind: row.try_get("kind")?,
            event_id: event_id
                .map(|id| id.parse())
                .transpose()
                .map_err(|e: uuid::Error| sqlx::Error::Decode(e.into()))?,
            payload: self.redaction.show_bytes(
                event_type.as_deref(),
                schema_version.and_then(|v| u32::try_from(v).ok()),
                &payload,
            ),
            event_type,
            schema_version,
            aggregate_type: row.try_get("aggregate_type")?,
            aggregate_id: row.try_get("aggregate_id")?,
            aggregate_version: row.try_get("aggregate_version")?,
            headers: serde_json::from_str(&headers).unwrap_or(serde_json::Value::Null),
            reason: row.try_get("reason")?,
            attempts: row.try_get("attempts")?,
            created_at: time_column(row, "created_at")?,
            resolved_at: optional_time_column(row, "resolved_at")?,
            resolution: row.try_get("resolution")?,
            replays: row.try_get("replays")?,
            last_replay_error: row.try_get("last_replay_error")?,
            replay_requested_at: optional_time_column(row, "replay_requested_at")?,
        })
    }

    /// A consumer's position on one aggregate.
    pub async fn position(
        &self,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<Option<PositionRecord>, OpsError> {
        let row = sqlx::query(
            "SELECT version, pinned, updated_at FROM outbox_consumer_positions
             WHERE consumer_name = ? AND aggregate_key = ?",
        )
        .bind(consumer)
        .bind(aggregate_key(aggregate_type, aggregate_id))
        .fetch_optional(&self.pool)
        .await
        .map_err(OpsError::database("reading a position"))?;
        row.map(|row| {
            Ok(PositionRecord {
                consumer: consumer.to_owned(),
                aggregate_type: aggregate_type.to_owned(),
                aggregate_id: aggregate_id.to_owned(),
                version: row.try_get("version")?,
                pinned: row.try_get::<i8, _>("pinned")? != 0,
                updated_at: time_column(&row, "updated_at")?,
            })
        })
        .transpose()
        .map_err(OpsError::database("reading a position"))
    }

    /// Asks the running consumer to replay open letters of `kind` (it
    /// takes each request at its next sweep and appends the outcome to this
    /// repair's audit row); a letter already requested is left to that
    /// request (`already_requested`).
    pub async fn request_replay(
        &self,
        consumer: &str,
        kind: LetterKind,
        letter_ids: &[i64],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        self.letter_repair(consumer, kind, letter_ids, request, None)
            .await
    }

    /// Closes open letters of `kind` without running them, as `discarded
    /// by <operator>: <reason>` (a pending replay request goes with it).
    pub async fn discard(
        &self,
        consumer: &str,
        kind: LetterKind,
        letter_ids: &[i64],
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        let resolution = format!("discarded by {}: {}", request.operator(), request.reason());
        self.letter_repair(consumer, kind, letter_ids, request, Some(resolution))
            .await
    }

    async fn letter_repair(
        &self,
        consumer: &str,
        kind: LetterKind,
        ids: &[i64],
        request: &RepairRequest,
        discard: Option<String>,
    ) -> Result<RepairReport, OpsError> {
        check_repair_ids(ids)?;
        let action = if discard.is_some() {
            "consumer.discard"
        } else {
            "consumer.replay"
        };
        let texts: Vec<String> = ids.iter().map(i64::to_string).collect();
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(OpsError::database("beginning a repair"))?;
        let audit_id = open_audit(&mut tx, request, action, consumer, &texts).await?;
        let before = lock_letters(&mut tx, consumer, ids)
            .await
            .map_err(OpsError::database("reading letters"))?;
        let eligible: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| {
                before.get(id).is_some_and(|letter| {
                    letter.kind == kind.as_str()
                        && !letter.resolved
                        && (discard.is_some() || !letter.requested)
                })
            })
            .collect();
        if !eligible.is_empty() {
            let mut update = QueryBuilder::<MySql>::new("UPDATE outbox_dead_letters SET ");
            match &discard {
                Some(resolution) => update
                    .push("resolved_at = ")
                    .push_bind(now_ms())
                    .push(", resolution = ")
                    .push_bind(resolution.as_str())
                    .push(", replay_requested_at = NULL"),
                None => update
                    .push("replay_requested_at = ")
                    .push_bind(now_ms())
                    .push(", replay_audit_id = ")
                    .push_bind(audit_id),
            };
            update.push(" WHERE consumer_name = ").push_bind(consumer);
            update.push(" AND id IN (");
            let mut list = update.separated(", ");
            for id in &eligible {
                list.push_bind(*id);
            }
            update.push(")");
            update
                .build()
                .execute(&mut *tx)
                .await
                .map_err(OpsError::database("repairing letters"))?;
        }
        let after = lock_letters(&mut tx, consumer, ids)
            .await
            .map_err(OpsError::database("reading letters"))?;
        let done = if discard.is_some() {
            "discarded"
        } else {
            "replay_requested"
        };
        let outcomes = ids
            .iter()
            .map(|id| {
                let state = after.get(id).map(|letter| LetterRepairState {
                    kind: letter.kind.clone(),
                    resolution: letter.resolution.clone(),
                    requested: letter.requested,
                });
                IdOutcome::for_letter(
                    *id,
                    eligible.contains(id),
                    state.as_ref(),
                    kind,
                    consumer,
                    done,
                )
            })
            .collect();
        close_audit(tx, audit_id, outcomes).await
    }

    /// Moves a strict consumer's position past `version` (one the producer
    /// skipped), only from the version before, so nothing applied is ever
    /// passed over.
    pub async fn pass_version(
        &self,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
        version: i64,
        request: &RepairRequest,
    ) -> Result<RepairReport, OpsError> {
        let target = format!("{aggregate_type}/{aggregate_id}@{version}");
        let key = aggregate_key(aggregate_type, aggregate_id);
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(OpsError::database("beginning a repair"))?;
        let audit_id = open_audit(
            &mut tx,
            request,
            "consumer.pass_version",
            consumer,
            std::slice::from_ref(&target),
        )
        .await?;
        let position: Option<i64> = sqlx::query_scalar(
            "SELECT version FROM outbox_consumer_positions
             WHERE consumer_name = ? AND aggregate_key = ? FOR UPDATE",
        )
        .bind(consumer)
        .bind(&key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(OpsError::database("reading a position"))?;
        let outcome = if position.is_some() && position == version.checked_sub(1) {
            sqlx::query(
                "UPDATE outbox_consumer_positions SET version = ?, pinned = 1, updated_at = ?
                 WHERE consumer_name = ? AND aggregate_key = ?",
            )
            .bind(version)
            .bind(now_ms())
            .bind(consumer)
            .bind(&key)
            .execute(&mut *tx)
            .await
            .map_err(OpsError::database("moving a position"))?;
            IdOutcome {
                id: target,
                outcome: "passed".to_owned(),
                detail: None,
            }
        } else {
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
        };
        close_audit(tx, audit_id, vec![outcome]).await
    }
}

/// Locks the named letters of `consumer` and reads what a repair decides
/// on.
async fn lock_letters(
    conn: &mut MySqlConnection,
    consumer: &str,
    ids: &[i64],
) -> sqlx::Result<HashMap<i64, LockedLetter>> {
    let mut select = QueryBuilder::<MySql>::new(
        "SELECT id, kind, resolved_at IS NOT NULL AS resolved, resolution,
                replay_requested_at IS NOT NULL AS requested
         FROM outbox_dead_letters WHERE consumer_name = ",
    );
    select.push_bind(consumer).push(" AND id IN (");
    let mut list = select.separated(", ");
    for id in ids {
        list.push_bind(*id);
    }
    select.push(") FOR UPDATE");
    select
        .build()
        .fetch_all(conn)
        .await?
        .iter()
        .map(|row| {
            Ok((
                row.try_get("id")?,
                LockedLetter {
                    kind: row.try_get("kind")?,
                    resolved: row.try_get::<i64, _>("resolved")? != 0,
                    resolution: row.try_get("resolution")?,
                    requested: row.try_get::<i64, _>("requested")? != 0,
                },
            ))
        })
        .collect()
}

/// Writes a repair's audit row before it changes anything; returns its id.
async fn open_audit(
    tx: &mut Transaction<'static, MySql>,
    request: &RepairRequest,
    action: &str,
    target: &str,
    ids: &[String],
) -> Result<i64, OpsError> {
    let done = sqlx::query(
        "INSERT INTO outbox_audit (at, operator, reason, action, target, ids)
         VALUES (?, ?, ?, ?, ?, ?)",
    )
    .bind(now_ms())
    .bind(request.operator())
    .bind(request.reason())
    .bind(action)
    .bind(target)
    .bind(serde_json::Value::from(ids.to_vec()).to_string())
    .execute(&mut **tx)
    .await
    .map_err(OpsError::database("writing the audit row"))?;
    Ok(done.last_insert_id() as i64)
}

/// Completes the audit row with the outcomes and commits the repair.
async fn close_audit(
    mut tx: Transaction<'static, MySql>,
    audit_id: i64,
    outcomes: Vec<IdOutcome>,
) -> Result<RepairReport, OpsError> {
    let json = serde_json::to_string(&outcomes).map_err(|e| OpsError::Database {
        doing: "completing the audit row",
        source: sqlx::Error::Encode(e.into()),
    })?;
    sqlx::query("UPDATE outbox_audit SET outcomes = ? WHERE id = ?")
        .bind(json)
        .bind(audit_id)
        .execute(&mut *tx)
        .await
        .map_err(OpsError::database("completing the audit row"))?;
    tx.commit()
        .await
        .map_err(OpsError::database("committing a repair"))?;
    Ok(RepairReport { audit_id, outcomes })
}

outbox_core::letter_store_by_inherent_methods!(MySqlOps);
