//! PostgreSQL's emit: [`Outbox`] inserts an event into the outbox inside
//! the caller's own transaction.
//!
//! There is no variant that takes a pool or opens a connection: every emit
//! takes `&mut PgConnection` (a `&mut Transaction` coerces to it) and refuses
//! a connection that is not inside a transaction. One round trip per emit
//! (and per batch): version counter, insert, idempotency key and the guarded
//! NOTIFY are one statement.

use std::sync::{Arc, OnceLock};

use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use uuid::Uuid;

use crate::sql::EmitSql;
use outbox_core::OutboxEvent;
use outbox_core::store::SchemaName;
use outbox_core::{EmitError, EmitOptions, EmitOutcome, Emitted, EventDraft};

/// Where the outbox lives; cheap to clone, holds no connection.
#[derive(Debug, Clone)]
pub struct Outbox {
    inner: Arc<OutboxInner>,
}

#[derive(Debug)]
struct OutboxInner {
    schema: SchemaName,
    channel: String,
    sql: EmitSql,
}

impl Default for Outbox {
    fn default() -> Self {
        Outbox::new(SchemaName::default())
    }
}

impl Outbox {
    /// An outbox in `schema` (see [`SchemaName::new`] for the rules).
    pub fn new(schema: SchemaName) -> Outbox {
        Outbox {
            inner: Arc::new(OutboxInner {
                channel: schema.notify_channel(),
                sql: EmitSql::new(&schema),
                schema,
            }),
        }
    }

    /// The schema this outbox writes to.
    pub fn schema(&self) -> &SchemaName {
        &self.inner.schema
    }

    /// The NOTIFY channel relays of this outbox listen on.
    pub fn notify_channel(&self) -> &str {
        &self.inner.channel
    }

    /// Applies the migrations of this outbox's schema.
    pub async fn migrate(&self, pool: &sqlx::PgPool) -> Result<(), crate::MigrateError> {
        crate::migrate(pool, &self.inner.schema).await
    }

    /// Inserts `event` in the caller's transaction.
    pub async fn emit<E: OutboxEvent>(
        &self,
        conn: &mut PgConnection,
        event: &E,
    ) -> Result<Emitted, EmitError> {
        let draft = EventDraft::new(event)?;
        match self.emit_draft(conn, draft, None).await? {
            EmitOutcome::Emitted(emitted) => Ok(emitted),
            EmitOutcome::Duplicate { .. } => unreachable!("no key, no duplicate"),
        }
    }

    /// Inserts `event` with options (idempotency key, explicit trace context).
    pub async fn emit_with<E: OutboxEvent>(
        &self,
        conn: &mut PgConnection,
        event: &E,
        options: EmitOptions,
    ) -> Result<EmitOutcome, EmitError> {
        let mut draft = EventDraft::new(event)?;
        if let Some(traceparent) = options.traceparent {
            draft = draft.with_traceparent(traceparent);
        }
        if let Some(key) = &options.idempotency_key
            && key.len() > 512
        {
            return Err(EmitError::KeyTooLong(key.len()));
        }
        self.emit_draft(conn, draft, options.idempotency_key.as_deref())
            .await
    }

    /// Inserts several events of one type in one statement. Versions from
    /// the counter follow the order given; the rows of each aggregate are
    /// written in version order, so carried versions may come in any order
    /// within one call.
    pub async fn emit_all<'a, E: OutboxEvent>(
        &self,
        conn: &mut PgConnection,
        events: impl IntoIterator<Item = &'a E>,
    ) -> Result<Vec<Emitted>, EmitError> {
        let drafts = events
            .into_iter()
            .map(EventDraft::new)
            .collect::<Result<Vec<_>, _>>()?;
        self.emit_drafts(conn, drafts).await
    }

    /// Inserts prepared events (of any types) in one statement; see
    /// [`Outbox::emit_all`] for the order rules.
    pub async fn emit_drafts(
        &self,
        conn: &mut PgConnection,
        drafts: Vec<EventDraft>,
    ) -> Result<Vec<Emitted>, EmitError> {
        if drafts.is_empty() {
            return Ok(Vec::new());
        }
        require_transaction(conn)?;
        let mut ids = Vec::with_capacity(drafts.len());
        let mut aggregate_types = Vec::with_capacity(drafts.len());
        let mut aggregate_ids = Vec::with_capacity(drafts.len());
        let mut versions = Vec::with_capacity(drafts.len());
        let mut event_types = Vec::with_capacity(drafts.len());
        let mut schema_versions = Vec::with_capacity(drafts.len());
        let mut payloads = Vec::with_capacity(drafts.len());
        let mut traceparents = Vec::with_capacity(drafts.len());
        for draft in drafts.into_iter().map(EventDraft::into_parts) {
            ids.push(draft.id);
            aggregate_types.push(draft.aggregate_type);
            aggregate_ids.push(draft.aggregate_id);
            versions.push(draft.aggregate_version);
            event_types.push(draft.event_type);
            schema_versions.push(draft.schema_version as i32);
            payloads.push(draft.payload);
            traceparents.push(draft.traceparent);
        }
        let payload_texts: Vec<&str> = payloads.iter().map(|p| p.get()).collect();
        let rows = sqlx::query(AssertSqlSafe(self.inner.sql.batch.as_str()))
            .bind(&ids)
            .bind(&aggregate_types)
            .bind(&aggregate_ids)
            .bind(&versions)
            .bind(&event_types)
            .bind(&schema_versions)
            .bind(&payload_texts)
            .bind(&traceparents)
            .bind(&self.inner.channel)
            .fetch_all(&mut *conn)
            .await
            .map_err(|error| map_error(error, "batch", None))?;
        let database = |source| EmitError::Database {
            event_type: "batch".into(),
            source,
        };
        if let Some(first) = rows.first()
            && first
                .try_get::<Option<Uuid>, _>(0)
                .map_err(database)?
                .is_none()
        {
            return Err(EmitError::VersionOutOfOrder {
                aggregate_version: first.try_get(1).map_err(database)?,
                aggregate_type: first.try_get(2).map_err(database)?,
                aggregate_id: first.try_get(3).map_err(database)?,
                newer_version: first.try_get(4).map_err(database)?,
            });
        }
        rows.iter()
            .map(|row| {
                Ok(Emitted {
                    event_id: row.try_get(0)?,
                    aggregate_version: row.try_get(1)?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(database)
    }

    async fn emit_draft(
        &self,
        conn: &mut PgConnection,
        draft: EventDraft,
        key: Option<&str>,
    ) -> Result<EmitOutcome, EmitError> {
        require_transaction(conn)?;
        let draft = draft.into_parts();
        let sql = &self.inner.sql;
        let statement = match (draft.aggregate_version.is_some(), key.is_some()) {
            (false, false) => &sql.counter,
            (true, false) => &sql.explicit,
            (false, true) => &sql.counter_with_key,
            (true, true) => &sql.explicit_with_key,
        };
        let mut query = sqlx::query(AssertSqlSafe(statement.as_str()))
            .bind(draft.id)
            .bind(draft.aggregate_type)
            .bind(&draft.aggregate_id)
            .bind(draft.event_type)
            .bind(draft.schema_version as i32)
            .bind(draft.payload.get())
            .bind(&draft.traceparent)
            .bind(&self.inner.channel);
        if let Some(version) = draft.aggregate_version {
            query = query.bind(version);
        }
        if let Some(key) = key {
            query = query.bind(key);
        }
        let conflict = draft
            .aggregate_version
            .map(|version| (draft.aggregate_type, draft.aggregate_id.as_str(), version));
        let fail = |error| map_error(error, draft.event_type, conflict);
        // A carried version needs nothing back; a counted one comes back.
        let written = match draft.aggregate_version {
            Some(version) => {
                let result = query.execute(&mut *conn).await.map_err(fail)?;
                (result.rows_affected() == 1).then_some(version)
            }
            None => match query.fetch_optional(&mut *conn).await.map_err(fail)? {
                Some(row) => Some(row.try_get(0).map_err(|source| EmitError::Database {
                    event_type: draft.event_type.into(),
                    source,
                })?),
                None => None,
            },
        };
        match written {
            Some(aggregate_version) => Ok(EmitOutcome::Emitted(Emitted {
                event_id: draft.id,
                aggregate_version,
            })),
            None => {
                if let Some(key) = key {
                    let original: Option<Uuid> =
                        sqlx::query_scalar(AssertSqlSafe(sql.existing_key.as_str()))
                            .bind(key)
                            .fetch_optional(&mut *conn)
                            .await
                            .map_err(|error| map_error(error, draft.event_type, None))?;
                    if let Some(original_event_id) = original {
                        return Ok(EmitOutcome::Duplicate { original_event_id });
                    }
                }
                // Nothing written and no key stood in the way: a carried
                // version behind an unpublished one.
                let version = draft.aggregate_version.unwrap_or_default();
                let newer: Option<i64> =
                    sqlx::query_scalar(AssertSqlSafe(sql.newer_version.as_str()))
                        .bind(draft.aggregate_type)
                        .bind(&draft.aggregate_id)
                        .bind(version)
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(|error| map_error(error, draft.event_type, None))?;
                Err(EmitError::VersionOutOfOrder {
                    aggregate_type: draft.aggregate_type.to_owned(),
                    aggregate_id: draft.aggregate_id,
                    aggregate_version: version,
                    newer_version: newer.unwrap_or(version),
                })
            }
        }
    }
}

fn require_transaction(conn: &PgConnection) -> Result<(), EmitError> {
    if conn.is_in_transaction() {
        Ok(())
    } else {
        Err(EmitError::NotInTransaction)
    }
}

fn map_error(
    error: sqlx::Error,
    event_type: &str,
    explicit: Option<(&str, &str, i64)>,
) -> EmitError {
    if let Some(database) = error.as_database_error() {
        match database.code().as_deref() {
            Some("25P02") => return EmitError::TransactionAborted,
            Some("23505")
                if database.constraint() == Some("outbox_events_unpublished_version_key") =>
            {
                if let Some((aggregate_type, aggregate_id, aggregate_version)) = explicit {
                    return EmitError::VersionConflict {
                        aggregate_type: aggregate_type.to_owned(),
                        aggregate_id: aggregate_id.to_owned(),
                        aggregate_version,
                    };
                }
            }
            _ => {}
        }
    }
    EmitError::Database {
        event_type: event_type.to_owned(),
        source: error,
    }
}

fn default_outbox() -> &'static Outbox {
    static DEFAULT: OnceLock<Outbox> = OnceLock::new();
    DEFAULT.get_or_init(Outbox::default)
}

/// Inserts `event` into the outbox of the default schema (`outbox`) in the
/// caller's transaction. Use [`Outbox::emit`] for another schema.
///
/// ```ignore
/// let mut tx = pool.begin().await?;
/// sqlx::query("INSERT INTO orders ...").execute(&mut *tx).await?;
/// outbox_postgres::emit(&mut tx, &OrderCreated { .. }).await?;
/// tx.commit().await?;
/// ```
pub async fn emit<E: OutboxEvent>(
    conn: &mut PgConnection,
    event: &E,
) -> Result<Emitted, EmitError> {
    default_outbox().emit(conn, event).await
}

/// Inserts several events of one type into the default schema's outbox.
pub async fn emit_all<'a, E: OutboxEvent>(
    conn: &mut PgConnection,
    events: impl IntoIterator<Item = &'a E>,
) -> Result<Vec<Emitted>, EmitError> {
    default_outbox().emit_all(conn, events).await
}
