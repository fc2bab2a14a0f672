//! The consumer's side of the operations API on SQLite
//! ([`outbox_core::ops::LetterStore`]): a consumer's quarantine and dead
//! letters (filters, keyset pages, payloads redacted), one letter, a
//! position, and the audited repairs — asking the running consumer to
//! replay letters, discarding them, passing a version the producer
//! skipped — with the PostgreSQL store's records and outcomes.

use std::collections::{HashMap, HashSet};

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{
    IdOutcome, LetterFilter, LetterKind, LetterRecord, LetterRepairState, OpsError, Page,
    PositionRecord, RepairReport, check_repair_ids, page_limit,
};
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use super::SqliteOps;
use super::audit_row::{begin_repair, close_audit, open_audit};
use crate::{now_ms, optional_time_column, time_column};

const LETTER_COLUMNS: &str = "id, consumer_name, kind, event_id, event_type, schema_version,
    aggregate_type, aggregate_id, aggregate_version, headers, payload, reason, attempts,
    created_at, resolved_at, resolution, replays, last_replay_error, replay_requested_at";

/// Letters of a consumer. Binds: consumer, kind, event type, aggregate
/// type, aggregate id, since, until, reason text, after id, limit,
/// include resolved.
const LETTERS: &str = "
WHERE consumer_name = ?1 AND kind = ?2
  AND (?3 IS NULL OR event_type = ?3)
  AND (?4 IS NULL OR aggregate_type = ?4)
  AND (?5 IS NULL OR aggregate_id = ?5)
  AND (?6 IS NULL OR created_at >= ?6)
  AND (?7 IS NULL OR created_at < ?7)
  AND (?8 IS NULL OR instr(lower(reason), lower(?8)) > 0)
  AND (?9 IS NULL OR id > ?9)
  AND (?11 OR resolved_at IS NULL)
ORDER BY id LIMIT ?10";

/// Open letters of a consumer marked for replay. Binds: consumer, ids
/// (JSON), audit id, kind, now.
const REQUEST_REPLAY: &str = "
UPDATE outbox_dead_letters SET replay_requested_at = ?5, replay_audit_id = ?3
WHERE consumer_name = ?1 AND id IN (SELECT value FROM json_each(?2)) AND kind = ?4
  AND resolved_at IS NULL AND replay_requested_at IS NULL
RETURNING id";

/// Open letters of a consumer closed as discarded. Binds: consumer, ids
/// (JSON), resolution, kind, now.
const DISCARD: &str = "
UPDATE outbox_dead_letters SET resolved_at = ?5, resolution = ?3, replay_requested_at = NULL
WHERE consumer_name = ?1 AND id IN (SELECT value FROM json_each(?2)) AND kind = ?4
  AND resolved_at IS NULL
RETURNING id";

/// What a letter is now. Binds: consumer, ids (JSON).
const LETTER_STATES: &str = "
SELECT id, kind, resolution, replay_requested_at IS NOT NULL AS requested
FROM outbox_dead_letters WHERE consumer_name = ?1 AND id IN (SELECT value FROM json_each(?2))";

const POSITION: &str = "
SELECT version, pinned, updated_at FROM outbox_consumer_positions
WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3";

/// Moves a position one version on, only from the version before. Binds:
/// consumer, aggregate type, aggregate id, version passed, now.
const PASS_VERSION: &str = "
UPDATE outbox_consumer_positions SET version = ?4, pinned = 1, updated_at = ?5
WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3 AND version = ?4 - 1
RETURNING version";

impl SqliteOps {
    /// A consumer's letters of one kind, filtered, oldest first.
    pub async fn letters(&self, filter: &LetterFilter) -> Result<Page<LetterRecord>, OpsError> {
        let limit = page_limit(filter.limit);
        let sql = format!("SELECT {LETTER_COLUMNS} FROM outbox_dead_letters {LETTERS}");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&filter.consumer)
            .bind(filter.kind.as_str())
            .bind(&filter.event_type)
            .bind(&filter.aggregate_type)
            .bind(&filter.aggregate_id)
            .bind(filter.since.map(|t| t.timestamp_millis()))
            .bind(filter.until.map(|t| t.timestamp_millis()))
            .bind(&filter.reason_contains)
            .bind(filter.after)
            .bind(limit)
            .bind(filter.include_resolved)
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
            "SELECT {LETTER_COLUMNS} FROM outbox_dead_letters WHERE consumer_name = ?1 AND id = ?2"
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

    fn letter_record(&self, row: &SqliteRow) -> Result<LetterRecord, sqlx::Error> {
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
        let row = sqlx::query(POSITION)
            .bind(consumer)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(OpsError::database("reading a position"))?;
        row.map(|row| {
            Ok(PositionRecord {
                consumer: consumer.to_owned(),
                aggregate_type: aggregate_type.to_owned(),
                aggregate_id: aggregate_id.to_owned(),
                version: row.try_get("version")?,
                pinned: row.try_get("pinned")?,
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
        let ids_json = serde_json::Value::from(ids.to_vec()).to_string();
        let mut tx = begin_repair(&self.pool).await?;
        let audit_id = open_audit(
            &mut *tx,
            request,
            action,
            consumer,
            &serde_json::Value::from(texts),
        )
        .await?;
        let changed: HashSet<i64> = match &discard {
            Some(resolution) => {
                sqlx::query_scalar::<_, i64>(DISCARD)
                    .bind(consumer)
                    .bind(&ids_json)
                    .bind(resolution)
                    .bind(kind.as_str())
                    .bind(now_ms())
                    .fetch_all(&mut *tx)
                    .await
            }
            None => {
                sqlx::query_scalar::<_, i64>(REQUEST_REPLAY)
                    .bind(consumer)
                    .bind(&ids_json)
                    .bind(audit_id)
                    .bind(kind.as_str())
                    .bind(now_ms())
                    .fetch_all(&mut *tx)
                    .await
            }
        }
        .map_err(OpsError::database("repairing letters"))?
        .into_iter()
        .collect();
        let states: HashMap<i64, LetterRepairState> = sqlx::query(LETTER_STATES)
            .bind(consumer)
            .bind(&ids_json)
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
        let outcomes = ids
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
        let mut tx = begin_repair(&self.pool).await?;
        let audit_id = open_audit(
            &mut *tx,
            request,
            "consumer.pass_version",
            consumer,
            &serde_json::json!([target]),
        )
        .await?;
        let passed: Option<i64> = sqlx::query_scalar(PASS_VERSION)
            .bind(consumer)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(version)
            .bind(now_ms())
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
                let position: Option<i64> = sqlx::query_scalar(
                    "SELECT version FROM outbox_consumer_positions
                     WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3",
                )
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
        close_audit(tx, audit_id, vec![outcome]).await
    }
}

outbox_core::letter_store_by_inherent_methods!(SqliteOps);
