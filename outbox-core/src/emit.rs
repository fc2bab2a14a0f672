//! Emit: insert an event into the outbox inside the caller's own
//! transaction, so the business change and the intent to publish commit
//! together or not at all.
//!
//! There is no variant that takes a pool or opens a connection: every emit
//! takes `&mut PgConnection` (a `&mut Transaction` coerces to it) and refuses
//! a connection that is not inside a transaction. One round trip per emit
//! (and per batch): version counter, insert, idempotency key and the guarded
//! NOTIFY are one statement.

use std::sync::{Arc, OnceLock};

use serde_json::value::RawValue;
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use uuid::Uuid;

use crate::contract::{OutboxEvent, PayloadError};
use crate::store::SchemaName;
use crate::store::sql::EmitSql;
use crate::trace::{self, TraceParent};

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

/// What an emit wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Emitted {
    /// The new event's id (UUID v7).
    pub event_id: Uuid,
    /// The aggregate version the event got (or carried).
    pub aggregate_version: i64,
}

/// The result of an emit with an idempotency key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmitOutcome {
    /// The event was written.
    Emitted(Emitted),
    /// The key was used before: nothing was written. Roll back (or do not
    /// apply) the business change of the repeated command.
    Duplicate {
        /// The event emitted the first time.
        original_event_id: Uuid,
    },
}

/// Options of one emit.
#[derive(Debug, Clone, Default)]
pub struct EmitOptions {
    /// Makes a repeated command a no-op: the first emit with a key writes,
    /// every later one returns [`EmitOutcome::Duplicate`].
    pub idempotency_key: Option<String>,
    /// Trace context to record instead of the ambient one.
    pub traceparent: Option<TraceParent>,
}

/// An emit failed; nothing was written by it.
#[derive(Debug, thiserror::Error)]
pub enum EmitError {
    /// The connection is not inside a transaction.
    #[error(
        "emit needs the caller's open transaction: pass `&mut tx` from `pool.begin()` or `conn.begin()`; a connection in autocommit would publish the event without the business change"
    )]
    NotInTransaction,
    /// An earlier statement failed and PostgreSQL aborted the transaction.
    #[error(
        "the transaction was aborted by an earlier error; roll it back (nothing of it, and no event, will be committed)"
    )]
    TransactionAborted,
    /// The event could not be serialized.
    #[error(transparent)]
    Payload(#[from] PayloadError),
    /// The event carries an aggregate version that already exists.
    #[error(
        "aggregate {aggregate_type}/{aggregate_id} already has an event with version {aggregate_version}: two writers raced on one aggregate"
    )]
    VersionConflict {
        /// The aggregate type.
        aggregate_type: String,
        /// The aggregate id.
        aggregate_id: String,
        /// The contested version.
        aggregate_version: i64,
    },
    /// A carried aggregate version lies below a version of the same
    /// aggregate that is written but not yet published. The relay publishes
    /// an aggregate's events in the order they were written, so the lower
    /// version would reach consumers after the higher one.
    #[error(
        "aggregate {aggregate_type}/{aggregate_id}: version {aggregate_version} is emitted after version {newer_version}, which is not yet published; emit an aggregate's versions in ascending order (emit_all sorts a batch by version, separate emits keep their call order)"
    )]
    VersionOutOfOrder {
        /// The aggregate type.
        aggregate_type: String,
        /// The aggregate id.
        aggregate_id: String,
        /// The version being emitted.
        aggregate_version: i64,
        /// The higher version already written.
        newer_version: i64,
    },
    /// The idempotency key is longer than 512 bytes.
    #[error("an idempotency key is too long ({0} bytes, at most 512)")]
    KeyTooLong(usize),
    /// The database refused the statement or the connection broke.
    #[error("emitting {event_type} failed: {source}")]
    Database {
        /// The event type being emitted (`batch` for batches).
        event_type: String,
        /// What sqlx reported.
        #[source]
        source: sqlx::Error,
    },
}

/// One event ready to be written, type-erased: what `emit_all` and the
/// relay tests use to emit events of several types in one batch. Its
/// `Debug` shows the payload with redacted fields masked.
#[derive(Clone)]
pub struct EventDraft {
    id: Uuid,
    event_type: &'static str,
    schema_version: u32,
    aggregate_type: &'static str,
    aggregate_id: String,
    aggregate_version: Option<i64>,
    payload: Box<RawValue>,
    traceparent: Option<String>,
}

impl std::fmt::Debug for EventDraft {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventDraft")
            .field("id", &self.id)
            .field("event_type", &self.event_type)
            .field("schema_version", &self.schema_version)
            .field("aggregate_type", &self.aggregate_type)
            .field("aggregate_id", &self.aggregate_id)
            .field("aggregate_version", &self.aggregate_version)
            .field(
                "payload",
                &format_args!(
                    "{}",
                    crate::redact::redacted_payload(
                        self.event_type,
                        self.schema_version,
                        self.payload.get()
                    )
                ),
            )
            .field("traceparent", &self.traceparent)
            .finish()
    }
}

impl EventDraft {
    /// Prepares `event` with a new UUID v7 id and the ambient trace context.
    pub fn new<E: OutboxEvent>(event: &E) -> Result<EventDraft, PayloadError> {
        Ok(EventDraft {
            id: Uuid::now_v7(),
            event_type: E::EVENT_TYPE,
            schema_version: E::SCHEMA_VERSION,
            aggregate_type: E::AGGREGATE_TYPE,
            aggregate_id: event.aggregate_id(),
            aggregate_version: event.aggregate_version(),
            payload: event.to_payload()?,
            traceparent: trace::current().map(|tp| tp.to_string()),
        })
    }

    /// The id the event will have.
    pub fn event_id(&self) -> Uuid {
        self.id
    }

    /// The event type (`order.created`).
    pub fn event_type(&self) -> &'static str {
        self.event_type
    }

    /// The schema version the payload was written with.
    pub fn schema_version(&self) -> u32 {
        self.schema_version
    }

    /// The aggregate type.
    pub fn aggregate_type(&self) -> &'static str {
        self.aggregate_type
    }

    /// The aggregate id.
    pub fn aggregate_id(&self) -> &str {
        &self.aggregate_id
    }

    /// The aggregate version the event carries, if its contract carries
    /// one (otherwise the store's per-aggregate counter gives it one).
    pub fn aggregate_version(&self) -> Option<i64> {
        self.aggregate_version
    }

    /// The payload as JSON text, exactly as serde wrote it. It may hold
    /// values of redacted fields: store it, do not log it (`Debug` masks
    /// them).
    pub fn payload_json(&self) -> &str {
        self.payload.get()
    }

    /// The W3C trace context to record with the event.
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// Records `traceparent` instead of the ambient trace context.
    pub fn with_traceparent(mut self, traceparent: TraceParent) -> EventDraft {
        self.traceparent = Some(traceparent.to_string());
        self
    }

    /// The order in which a store writes `drafts` (indexes into it): as
    /// given, except that each aggregate's carried versions take the places
    /// of that aggregate's carried drafts in ascending version order, so a
    /// batch may carry an aggregate's versions in any order. Drafts with
    /// versions from the store's counter keep their places.
    pub fn write_order(drafts: &[EventDraft]) -> Vec<usize> {
        let mut order: Vec<usize> = (0..drafts.len()).collect();
        let mut carried: Vec<usize> = (0..drafts.len())
            .filter(|&i| drafts[i].aggregate_version.is_some())
            .collect();
        let aggregate = |i: usize| (drafts[i].aggregate_type, drafts[i].aggregate_id.as_str());
        // Group the carried drafts per aggregate, then hand each
        // aggregate's places to its drafts in version order.
        carried.sort_by(|&a, &b| aggregate(a).cmp(&aggregate(b)));
        for group in carried.chunk_by(|&a, &b| aggregate(a) == aggregate(b)) {
            let mut places: Vec<usize> = group.to_vec();
            places.sort_unstable();
            let mut by_version: Vec<usize> = group.to_vec();
            by_version.sort_by_key(|&i| drafts[i].aggregate_version);
            for (place, draft) in places.into_iter().zip(by_version) {
                order[place] = draft;
            }
        }
        order
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
    pub async fn migrate(&self, pool: &sqlx::PgPool) -> Result<(), crate::store::MigrateError> {
        crate::store::migrate(pool, &self.inner.schema).await
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
            draft.traceparent = Some(traceparent.to_string());
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
        for draft in drafts {
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
/// outbox_core::emit(&mut tx, &OrderCreated { .. }).await?;
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
