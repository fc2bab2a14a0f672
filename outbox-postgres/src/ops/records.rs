//! The PostgreSQL listings: events by status, letters of a consumer, audit
//! rows, with their filters and keyset pages.

use outbox_core::ops::*;
use sqlx::{AssertSqlSafe, Row};
use uuid::Uuid;

use super::Ops;

impl Ops {
    /// Events with a status, filtered, oldest first.
    pub async fn events(&self, filter: &EventFilter) -> Result<Page<EventRecord>, OpsError> {
        let limit = page_limit(filter.limit);
        let rows = sqlx::query(AssertSqlSafe(self.sql.events.as_str()))
            .bind(filter.status.as_str())
            .bind(&filter.event_type)
            .bind(&filter.aggregate_type)
            .bind(&filter.aggregate_id)
            .bind(filter.since)
            .bind(filter.until)
            .bind(&filter.error_contains)
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
        let row = sqlx::query(AssertSqlSafe(self.sql.event.as_str()))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(OpsError::database("reading an event"))?;
        row.map(|row| self.event_record(&row))
            .transpose()
            .map_err(OpsError::database("reading an event"))
    }

    fn event_record(&self, row: &sqlx::postgres::PgRow) -> Result<EventRecord, sqlx::Error> {
        let event_type: String = row.try_get("event_type")?;
        let schema_version: i32 = row.try_get("schema_version")?;
        let payload: String = row.try_get("payload")?;
        Ok(EventRecord {
            id: row.try_get("id")?,
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
            created_at: row.try_get("created_at")?,
            status: row.try_get("status")?,
            published_at: row.try_get("published_at")?,
            attempts: row.try_get("attempt_count")?,
            next_attempt_at: row.try_get("next_attempt_at")?,
            last_error: row.try_get("last_error")?,
            failed_at: row.try_get("failed_at")?,
        })
    }

    /// Letters of a consumer, filtered, oldest first.
    pub async fn letters(&self, filter: &LetterFilter) -> Result<Page<LetterRecord>, OpsError> {
        let limit = page_limit(filter.limit);
        let rows = sqlx::query(AssertSqlSafe(self.sql.letters.as_str()))
            .bind(&filter.consumer)
            .bind(filter.kind.as_str())
            .bind(&filter.event_type)
            .bind(&filter.aggregate_type)
            .bind(&filter.aggregate_id)
            .bind(filter.since)
            .bind(filter.until)
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
        let row = sqlx::query(AssertSqlSafe(self.sql.letter.as_str()))
            .bind(consumer)
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(OpsError::database("reading a letter"))?;
        row.map(|row| self.letter_record(&row))
            .transpose()
            .map_err(OpsError::database("reading a letter"))
    }

    fn letter_record(&self, row: &sqlx::postgres::PgRow) -> Result<LetterRecord, sqlx::Error> {
        let event_type: Option<String> = row.try_get("event_type")?;
        let schema_version: Option<i32> = row.try_get("schema_version")?;
        let payload: Vec<u8> = row.try_get("payload")?;
        let headers: String = row.try_get("headers")?;
        Ok(LetterRecord {
            id: row.try_get("id")?,
            consumer: row.try_get("consumer_name")?,
            kind: row.try_get("kind")?,
            event_id: row.try_get("event_id")?,
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
            created_at: row.try_get("created_at")?,
            resolved_at: row.try_get("resolved_at")?,
            resolution: row.try_get("resolution")?,
            replays: row.try_get("replays")?,
            last_replay_error: row.try_get("last_replay_error")?,
            replay_requested_at: row.try_get("replay_requested_at")?,
        })
    }

    /// Audit rows, newest first; `before` is a page's `next`.
    pub async fn audit(
        &self,
        before: Option<i64>,
        limit: Option<i64>,
    ) -> Result<Page<AuditRecord>, OpsError> {
        let limit = page_limit(limit);
        let rows = sqlx::query(AssertSqlSafe(self.sql.audit.as_str()))
            .bind(before)
            .bind(limit)
            .fetch_all(&self.pool)
            .await
            .map_err(OpsError::database("listing the audit"))?;
        let items = rows
            .iter()
            .map(audit_record)
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(OpsError::database("reading the audit"))?;
        Ok(Page::of(items, limit, |a| a.id))
    }

    /// One audit row.
    pub async fn audit_entry(&self, id: i64) -> Result<Option<AuditRecord>, OpsError> {
        sqlx::query(AssertSqlSafe(self.sql.audit_entry.as_str()))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(OpsError::database("reading an audit row"))?
            .as_ref()
            .map(audit_record)
            .transpose()
            .map_err(OpsError::database("reading an audit row"))
    }

    /// A consumer's position for one aggregate (RejectStale and Strict).
    pub async fn position(
        &self,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> Result<Option<PositionRecord>, OpsError> {
        let row = sqlx::query(AssertSqlSafe(self.sql.position.as_str()))
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
                updated_at: row.try_get("updated_at")?,
            })
        })
        .transpose()
        .map_err(OpsError::database("reading a position"))
    }
}

fn audit_record(row: &sqlx::postgres::PgRow) -> Result<AuditRecord, sqlx::Error> {
    Ok(AuditRecord {
        id: row.try_get("id")?,
        at: row.try_get("at")?,
        operator: row.try_get("operator")?,
        reason: row.try_get("reason")?,
        action: row.try_get("action")?,
        target: row.try_get("target")?,
        ids: row.try_get("ids")?,
        outcomes: row.try_get("outcomes")?,
    })
}
