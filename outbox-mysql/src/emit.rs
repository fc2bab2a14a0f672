//! Emit on MySQL/MariaDB: insert an event in the caller's own transaction,
//! so the business change and the intent to publish commit together or not
//! at all. The same contract as `outbox_postgres::Outbox` on PostgreSQL: the
//! same [`EmitError`], [`Emitted`], [`EmitOutcome`] and [`EmitOptions`].
//!
//! Every emit first moves (or creates) its aggregate's counter row, which
//! locks that row until the caller's transaction ends: emits of one
//! aggregate queue behind each other, so versions are gap-free in commit
//! order, and emits of different aggregates never wait for each other. An
//! emit with a counted version is one round trip, a call of the procedure
//! `outbox_emit_counted_v1` that [`crate::migrate`] creates: it moves the
//! counter (`LAST_INSERT_ID(expr)` hands the new value to this session
//! only), inserts the event with it and returns it. A carried version
//! takes three statements (the counter raised to it, a look for a newer
//! unpublished version, the insert).

use outbox_core::{EmitError, EmitOptions, EmitOutcome, Emitted, EventDraft, OutboxEvent};
use sqlx::error::ErrorKind;
use sqlx::{Connection, MySqlConnection};

use crate::now_ms;

/// Emits events into the outbox tables of the connection's database; holds
/// no connection and costs nothing to create or clone.
#[derive(Debug, Clone, Default)]
pub struct MySqlOutbox {
    _private: (),
}

/// Counts the aggregate's next version; the reply's last insert id is the
/// new version. Binds: aggregate type, aggregate id.
/// The counted emit, one round trip (see [`crate::migrate`]).
const EMIT_COUNTED: &str = "CALL outbox_emit_counted_v1(?, ?, ?, ?, ?, ?, ?, ?)";

/// Moves the counter up to a carried version (locking the counter row).
/// Binds: aggregate type, aggregate id, version.
const CARRY_VERSION: &str = "
INSERT INTO outbox_aggregate_versions (aggregate_type, aggregate_id, version)
VALUES (?, ?, ?)
ON DUPLICATE KEY UPDATE version = GREATEST(version, VALUES(version))";

/// Binds: id, aggregate type, aggregate id, version, event type, schema
/// version, payload, traceparent, now.
const INSERT_EVENT: &str = "
INSERT INTO outbox_events
    (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
     payload, traceparent, created_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)";

impl MySqlOutbox {
    /// The outbox of the tables [`crate::migrate`] created.
    pub fn new() -> MySqlOutbox {
        MySqlOutbox::default()
    }

    /// Inserts `event` in the caller's transaction.
    pub async fn emit<E: OutboxEvent>(
        &self,
        conn: &mut MySqlConnection,
        event: &E,
    ) -> Result<Emitted, EmitError> {
        let draft = EventDraft::new(event)?;
        require_transaction(conn)?;
        write(conn, &draft).await
    }

    /// Inserts `event` with options (idempotency key, explicit trace
    /// context). A key used before writes nothing and returns
    /// [`EmitOutcome::Duplicate`]; two transactions with one key at once:
    /// the second waits for the first and fails if it committed.
    pub async fn emit_with<E: OutboxEvent>(
        &self,
        conn: &mut MySqlConnection,
        event: &E,
        options: EmitOptions,
    ) -> Result<EmitOutcome, EmitError> {
        let mut draft = EventDraft::new(event)?;
        if let Some(traceparent) = options.traceparent {
            draft = draft.with_traceparent(traceparent);
        }
        require_transaction(conn)?;
        let Some(key) = options.idempotency_key else {
            return Ok(EmitOutcome::Emitted(write(conn, &draft).await?));
        };
        if key.len() > 512 {
            return Err(EmitError::KeyTooLong(key.len()));
        }
        let database = database_error(draft.event_type());
        let original: Option<String> = sqlx::query_scalar(
            "SELECT event_id FROM outbox_idempotency_keys WHERE idempotency_key = ?",
        )
        .bind(&key)
        .fetch_optional(&mut *conn)
        .await
        .map_err(&database)?;
        if let Some(original) = original {
            let original_event_id = original
                .parse()
                .map_err(|error: uuid::Error| database(sqlx::Error::Decode(error.into())))?;
            return Ok(EmitOutcome::Duplicate { original_event_id });
        }
        let emitted = write(conn, &draft).await?;
        sqlx::query(
            "INSERT INTO outbox_idempotency_keys (idempotency_key, event_id, created_at)
             VALUES (?, ?, ?)",
        )
        .bind(&key)
        .bind(draft.event_id().to_string())
        .bind(now_ms())
        .execute(&mut *conn)
        .await
        .map_err(&database)?;
        Ok(EmitOutcome::Emitted(emitted))
    }

    /// Inserts several events of one type; see
    /// [`EventDraft::write_order`] for the order.
    pub async fn emit_all<'a, E: OutboxEvent>(
        &self,
        conn: &mut MySqlConnection,
        events: impl IntoIterator<Item = &'a E>,
    ) -> Result<Vec<Emitted>, EmitError> {
        let drafts = events
            .into_iter()
            .map(EventDraft::new)
            .collect::<Result<Vec<_>, _>>()?;
        self.emit_drafts(conn, drafts).await
    }

    /// Inserts prepared events (of any types), in
    /// [`EventDraft::write_order`]. Returns one [`Emitted`] per event, in
    /// the order given.
    pub async fn emit_drafts(
        &self,
        conn: &mut MySqlConnection,
        drafts: Vec<EventDraft>,
    ) -> Result<Vec<Emitted>, EmitError> {
        if drafts.is_empty() {
            return Ok(Vec::new());
        }
        require_transaction(conn)?;
        let mut emitted = vec![None; drafts.len()];
        for index in EventDraft::write_order(&drafts) {
            emitted[index] = Some(write(conn, &drafts[index]).await?);
        }
        Ok(emitted.into_iter().flatten().collect())
    }
}

fn require_transaction(conn: &MySqlConnection) -> Result<(), EmitError> {
    if conn.is_in_transaction() {
        Ok(())
    } else {
        Err(EmitError::NotInTransaction)
    }
}

fn database_error(event_type: &str) -> impl Fn(sqlx::Error) -> EmitError + '_ {
    move |source| EmitError::Database {
        event_type: event_type.to_owned(),
        source,
    }
}

/// Writes an event whose version is counted: the counter row moves and
/// stays locked until the caller's transaction ends, so versions follow
/// commit order; one call of the emit procedure.
async fn write_counted(
    conn: &mut MySqlConnection,
    draft: &EventDraft,
) -> Result<Emitted, EmitError> {
    let database = database_error(draft.event_type());
    let aggregate_version: i64 = sqlx::query_scalar(EMIT_COUNTED)
        .bind(draft.event_id().to_string())
        .bind(draft.aggregate_type())
        .bind(draft.aggregate_id())
        .bind(draft.event_type())
        .bind(i64::from(draft.schema_version()))
        .bind(draft.payload_json())
        .bind(draft.traceparent())
        .bind(now_ms())
        .fetch_one(&mut *conn)
        .await
        .map_err(&database)?;
    Ok(Emitted {
        event_id: draft.event_id(),
        aggregate_version,
    })
}

/// Writes one event: its version from the counter, or the one it carries
/// (refused below an unpublished higher version, or when taken).
async fn write(conn: &mut MySqlConnection, draft: &EventDraft) -> Result<Emitted, EmitError> {
    let database = database_error(draft.event_type());
    let version = match draft.aggregate_version() {
        None => return write_counted(conn, draft).await,
        Some(version) => {
            sqlx::query(CARRY_VERSION)
                .bind(draft.aggregate_type())
                .bind(draft.aggregate_id())
                .bind(version)
                .execute(&mut *conn)
                .await
                .map_err(&database)?;
            // The counter row is locked now: no other emit of this
            // aggregate commits in between.
            let newer: Option<i64> = sqlx::query_scalar(
                "SELECT MAX(aggregate_version) FROM outbox_events
                 WHERE aggregate_type = ? AND aggregate_id = ? AND status IN ('pending', 'failed')
                   AND aggregate_version > ?",
            )
            .bind(draft.aggregate_type())
            .bind(draft.aggregate_id())
            .bind(version)
            .fetch_one(&mut *conn)
            .await
            .map_err(&database)?;
            if let Some(newer_version) = newer {
                return Err(EmitError::VersionOutOfOrder {
                    aggregate_type: draft.aggregate_type().to_owned(),
                    aggregate_id: draft.aggregate_id().to_owned(),
                    aggregate_version: version,
                    newer_version,
                });
            }
            version
        }
    };
    sqlx::query(INSERT_EVENT)
        .bind(draft.event_id().to_string())
        .bind(draft.aggregate_type())
        .bind(draft.aggregate_id())
        .bind(version)
        .bind(draft.event_type())
        .bind(i64::from(draft.schema_version()))
        .bind(draft.payload_json())
        .bind(draft.traceparent())
        .bind(now_ms())
        .execute(&mut *conn)
        .await
        .map_err(|error| {
            let taken = error.as_database_error().is_some_and(|e| {
                e.kind() == ErrorKind::UniqueViolation
                    && e.message().contains("outbox_events_version")
            });
            if taken && draft.aggregate_version().is_some() {
                EmitError::VersionConflict {
                    aggregate_type: draft.aggregate_type().to_owned(),
                    aggregate_id: draft.aggregate_id().to_owned(),
                    aggregate_version: version,
                }
            } else {
                database(error)
            }
        })?;
    Ok(Emitted {
        event_id: draft.event_id(),
        aggregate_version: version,
    })
}
