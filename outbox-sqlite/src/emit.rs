//! Emit on SQLite: insert an event in the caller's own transaction, so the
//! business change and the intent to publish commit together or not at
//! all. The same contract as `outbox_postgres::Outbox` on PostgreSQL: the same
//! [`EmitError`], [`Emitted`], [`EmitOutcome`] and [`EmitOptions`].
//!
//! SQLite runs one write transaction at a time, so an aggregate's versions
//! are gap-free in commit order without row locks: the counter and the
//! insert run under the caller's write lock. Start the transaction with
//! `BEGIN IMMEDIATE` (`pool.begin_with("BEGIN IMMEDIATE")`): a deferred
//! transaction that reads first and writes later fails with `database is
//! locked` when another connection wrote in between (SQLite cannot upgrade
//! its snapshot), where an immediate one waits for the lock at `BEGIN`.

use outbox_core::{EmitError, EmitOptions, EmitOutcome, Emitted, EventDraft, OutboxEvent};
use sqlx::error::ErrorKind;
use sqlx::{Connection, Row, SqliteConnection};

use crate::{now_ms, wakeup};

/// Emits events into the SQLite outbox of the connection's database; holds
/// no connection and costs nothing to create or clone.
#[derive(Debug, Clone, Default)]
pub struct SqliteOutbox {
    _private: (),
}

impl SqliteOutbox {
    /// The outbox of the tables [`crate::migrate`] created.
    pub fn new() -> SqliteOutbox {
        SqliteOutbox::default()
    }

    /// Inserts `event` in the caller's transaction.
    pub async fn emit<E: OutboxEvent>(
        &self,
        conn: &mut SqliteConnection,
        event: &E,
    ) -> Result<Emitted, EmitError> {
        let draft = EventDraft::new(event)?;
        require_transaction(conn)?;
        let emitted = write(conn, &draft).await?;
        wake_relays();
        Ok(emitted)
    }

    /// Inserts `event` with options (idempotency key, explicit trace
    /// context). A key used before writes nothing and returns
    /// [`EmitOutcome::Duplicate`].
    pub async fn emit_with<E: OutboxEvent>(
        &self,
        conn: &mut SqliteConnection,
        event: &E,
        options: EmitOptions,
    ) -> Result<EmitOutcome, EmitError> {
        let mut draft = EventDraft::new(event)?;
        if let Some(traceparent) = options.traceparent {
            draft = draft.with_traceparent(traceparent);
        }
        require_transaction(conn)?;
        let Some(key) = options.idempotency_key else {
            let emitted = write(conn, &draft).await?;
            wake_relays();
            return Ok(EmitOutcome::Emitted(emitted));
        };
        if key.len() > 512 {
            return Err(EmitError::KeyTooLong(key.len()));
        }
        let database = database_error(draft.event_type());
        let original: Option<String> = sqlx::query_scalar(
            "SELECT event_id FROM outbox_idempotency_keys WHERE idempotency_key = ?1",
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
        // No ON CONFLICT: a concurrent writer of the same key (possible
        // only in a transaction that did not begin IMMEDIATE) fails here
        // instead of emitting twice.
        sqlx::query(
            "INSERT INTO outbox_idempotency_keys (idempotency_key, event_id, created_at)
             VALUES (?1, ?2, ?3)",
        )
        .bind(&key)
        .bind(draft.event_id().to_string())
        .bind(now_ms())
        .execute(&mut *conn)
        .await
        .map_err(&database)?;
        wake_relays();
        Ok(EmitOutcome::Emitted(emitted))
    }

    /// Inserts several events of one type. Versions from the counter
    /// follow the order given; each aggregate's carried versions are
    /// written in version order, so they may come in any order within one
    /// call. Returns one [`Emitted`] per event, in the order given.
    pub async fn emit_all<'a, E: OutboxEvent>(
        &self,
        conn: &mut SqliteConnection,
        events: impl IntoIterator<Item = &'a E>,
    ) -> Result<Vec<Emitted>, EmitError> {
        let drafts = events
            .into_iter()
            .map(EventDraft::new)
            .collect::<Result<Vec<_>, _>>()?;
        self.emit_drafts(conn, drafts).await
    }

    /// Inserts prepared events (of any types); see
    /// [`SqliteOutbox::emit_all`] for the order rules.
    pub async fn emit_drafts(
        &self,
        conn: &mut SqliteConnection,
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
        wake_relays();
        Ok(emitted.into_iter().flatten().collect())
    }
}

fn require_transaction(conn: &SqliteConnection) -> Result<(), EmitError> {
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

/// Inserts one event with the next version from its aggregate's counter
/// (the insert trigger moves the counter). Binds: id, aggregate type,
/// aggregate id, event type, schema version, payload, traceparent, now.
const INSERT_COUNTED: &str = "
INSERT INTO outbox_events
    (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
     payload, traceparent, created_at)
VALUES (?1, ?2, ?3,
        coalesce((SELECT version FROM outbox_aggregate_versions
                  WHERE aggregate_type = ?2 AND aggregate_id = ?3), 0) + 1,
        ?4, ?5, ?6, ?7, ?8)
RETURNING aggregate_version";

/// Inserts one event with the version it carries, unless an unpublished
/// higher version of its aggregate exists. Binds: as [`INSERT_COUNTED`],
/// then the version.
const INSERT_CARRIED: &str = "
INSERT INTO outbox_events
    (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
     payload, traceparent, created_at)
SELECT ?1, ?2, ?3, ?9, ?4, ?5, ?6, ?7, ?8
WHERE NOT EXISTS (
    SELECT 1 FROM outbox_events
    WHERE aggregate_type = ?2 AND aggregate_id = ?3
      AND status IN ('pending', 'failed') AND aggregate_version > ?9)";

/// Writes one event in one statement: its version from the counter or the
/// one it carries (refused below an unpublished higher version, or when
/// taken).
async fn write(conn: &mut SqliteConnection, draft: &EventDraft) -> Result<Emitted, EmitError> {
    let database = database_error(draft.event_type());
    let statement = if draft.aggregate_version().is_some() {
        INSERT_CARRIED
    } else {
        INSERT_COUNTED
    };
    let mut query = sqlx::query(statement)
        .bind(draft.event_id().to_string())
        .bind(draft.aggregate_type())
        .bind(draft.aggregate_id())
        .bind(draft.event_type())
        .bind(i64::from(draft.schema_version()))
        .bind(draft.payload_json())
        .bind(draft.traceparent())
        .bind(now_ms());
    let refused = |error: sqlx::Error, version: Option<i64>| {
        let taken = error.as_database_error().is_some_and(|e| {
            e.kind() == ErrorKind::UniqueViolation && e.message().contains("aggregate_version")
        });
        match version {
            Some(aggregate_version) if taken => EmitError::VersionConflict {
                aggregate_type: draft.aggregate_type().to_owned(),
                aggregate_id: draft.aggregate_id().to_owned(),
                aggregate_version,
            },
            _ => database(error),
        }
    };
    let Some(version) = draft.aggregate_version() else {
        let row = query
            .fetch_one(&mut *conn)
            .await
            .map_err(|error| refused(error, None))?;
        return Ok(Emitted {
            event_id: draft.event_id(),
            aggregate_version: row.try_get(0).map_err(&database)?,
        });
    };
    query = query.bind(version);
    let written = query
        .execute(&mut *conn)
        .await
        .map_err(|error| refused(error, Some(version)))?;
    if written.rows_affected() == 0 {
        let newer_version: i64 = sqlx::query_scalar(
            "SELECT max(aggregate_version) FROM outbox_events
             WHERE aggregate_type = ?1 AND aggregate_id = ?2 AND status IN ('pending', 'failed')",
        )
        .bind(draft.aggregate_type())
        .bind(draft.aggregate_id())
        .fetch_one(&mut *conn)
        .await
        .map_err(&database)?;
        return Err(EmitError::VersionOutOfOrder {
            aggregate_type: draft.aggregate_type().to_owned(),
            aggregate_id: draft.aggregate_id().to_owned(),
            aggregate_version: version,
            newer_version,
        });
    }
    Ok(Emitted {
        event_id: draft.event_id(),
        aggregate_version: version,
    })
}

/// Wakes this process's relays (see [`crate::wakeup`]). Called after the
/// write, so the caller's transaction holds SQLite's write lock: a woken
/// relay's claim (`BEGIN IMMEDIATE`) waits for that transaction to end and
/// then sees the event, or nothing if it rolled back.
fn wake_relays() {
    wakeup::emitted();
}
