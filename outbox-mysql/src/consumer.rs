//! The consumer's store on MySQL/MariaDB ([`MySqlConsumerStore`]): the
//! inbox, handler starts, strict positions and parked messages, quarantine
//! and dead letters, replay requests and counts, behind `outbox-core`'s
//! [`ConsumerStore`] seam, so the consumer engine (ordering, parking, the
//! sweep, retries, replays) runs unchanged on InnoDB.
//!
//! **Isolation and locks.** Every consumer transaction is READ COMMITTED:
//! no gap locks, so an instance claiming a new event does not block
//! another one inserting the next (or a producer writing beside it). Row
//! locks give what the PostgreSQL store gets from its own: a strict
//! position is locked by an upsert that changes nothing
//! (`ON DUPLICATE KEY UPDATE version = version` takes the row's exclusive
//! lock without a shared one first, so two instances on one new aggregate
//! wait for each other instead of deadlocking), the sweep skips positions
//! another transaction holds (`FOR UPDATE SKIP LOCKED`), and a batch
//! locks its aggregates in key order.
//!
//! **The message's savepoint.** `SAVEPOINT outbox_message` is taken with
//! `START TRANSACTION` in one round trip. A failed strict start that will
//! be retried rolls back to it (InnoDB keeps the row locks taken after it
//! until the transaction ends) and commits the retry record in the same
//! transaction, so the aggregate's position is never free between the
//! rollback and the record. Releasing and taking it again after the
//! handler finds a transaction that ended under the handler: a `ROLLBACK`
//! or `COMMIT` it sent, a statement with an implicit commit (DDL), or a
//! deadlock InnoDB resolved by rolling the whole transaction back while
//! the handler went on. MySQL rolls back only the failed statement on
//! other errors, so a handler that catches one and returns `Ok` commits
//! the rest of its work, as it chose. What a handler writes after its
//! transaction ended (its own `ROLLBACK`, or InnoDB's rollback for a
//! deadlock or, with `innodb_rollback_on_timeout`, a lock wait it caught)
//! runs in autocommit and stays when the message is retried: let such
//! errors end the handler (`?`). With `batch_size > 1` the check runs once
//! per batch, so the batch's later handlers write in autocommit too before
//! the batch runs again one message at a time.
//!
//! **No `RETURNING`** (MySQL has none): where PostgreSQL needs one CTE,
//! this store runs two or three short statements in the same transaction.
//! Batches write their rows in one multi-row statement.
//!
//! The handler timeout cannot cut off a running statement here
//! (`max_execution_time` covers only `SELECT` on MySQL): it stops waiting
//! for the handler, and the rollback follows when the statement returns.
//! `innodb_lock_wait_timeout` bounds a statement waiting for a lock.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_core::Envelope;
use outbox_core::audit::RepairRequest;
use outbox_core::consumer::store::{
    ConsumerStore, ExpiredAggregate, Letter, MovedPosition, ParkedMessage, Position, StoredLetter,
    StrictClaim, parked_letter_parts,
};
use outbox_core::consumer::{HANDLER_ENDED_TRANSACTION, HandlerError, Incoming};
use sqlx::mysql::MySqlRow;
use sqlx::pool::PoolConnection;
use sqlx::{MySql, MySqlConnection, MySqlPool, QueryBuilder, Row, Transaction};
use uuid::Uuid;

use crate::aggregate_key::aggregate_key;
use crate::migrate::is_server_error;
use crate::{millis, now_ms};

/// The statements that begin a consumer transaction.
const BEGIN: &str =
    "SET TRANSACTION ISOLATION LEVEL READ COMMITTED; START TRANSACTION; SAVEPOINT outbox_message";

/// MySQL's and MariaDB's error number for a savepoint that does not exist.
const NO_SUCH_SAVEPOINT: u16 = 1305;

/// MySQL's and MariaDB's error number for a duplicate key.
const DUPLICATE_KEY: u16 = 1062;

/// Moves a position to a version and pins it (an unpinned one starts
/// there), then `$tail`. MySQL assigns left to right, each assignment
/// seeing the ones before, so the start is computed before `pinned`
/// changes. Binds: version, version, now, consumer, aggregate key.
macro_rules! move_position {
    ($($tail:literal)?) => {
        concat!(
            "UPDATE outbox_consumer_positions
             SET start_version = IF(pinned, start_version, COALESCE(start_version, ?)),
                 pinned = 1, version = ?, updated_at = ?
             WHERE consumer_name = ? AND aggregate_key = ?"
            $(, $tail)?
        )
    };
}

/// Moves the locked position to a version (see `move_position!`).
const SET_POSITION: &str = move_position!();

/// Moves the position only from the version before (this is the next
/// version); binds as [`SET_POSITION`], then the version once more.
const ADVANCE_POSITION: &str = move_position!(" AND version = ? - 1");

/// Whether the version after one waits parked and due. Binds: consumer,
/// aggregate key, version, now.
const SUCCESSOR_PARKED: &str = "SELECT EXISTS (
        SELECT 1 FROM outbox_consumer_parked
        WHERE consumer_name = ? AND aggregate_key = ? AND aggregate_version = ? + 1
          AND (retry_at IS NULL OR retry_at <= ?))";

/// The inbox key, unless an open letter holds the event. Binds: consumer,
/// event id, now, consumer, event id.
const CLAIM_INBOX: &str = "INSERT IGNORE INTO outbox_processed_events
        (consumer_name, event_id, processed_at)
     SELECT ?, ?, ? FROM DUAL WHERE NOT EXISTS (
        SELECT 1 FROM outbox_dead_letters WHERE consumer_name = ? AND open_event_id = ?)";

/// Creates a strict position at 0, not pinned, or takes the existing
/// one's exclusive lock (an update that changes nothing). Binds: consumer,
/// aggregate key, type, id, now.
const LOCK_POSITION: &str = "INSERT INTO outbox_consumer_positions
        (consumer_name, aggregate_key, aggregate_type, aggregate_id, version, pinned, updated_at)
     VALUES (?, ?, ?, ?, 0, 0, ?)
     ON DUPLICATE KEY UPDATE version = version";

/// Reads a position. Binds: consumer, aggregate key.
const READ_POSITION: &str = "SELECT version, pinned, start_version FROM outbox_consumer_positions
     WHERE consumer_name = ? AND aggregate_key = ?";

/// Why a handler's `Ok` is not taken when its transaction ended under it.
const ENDED: &str = "the handler returned Ok, but the consumer's transaction had ended under it (the handler sent ROLLBACK or COMMIT, ran a statement with an implicit commit, or went on after InnoDB rolled the transaction back to resolve a deadlock); the inbox row and the position did not commit with its effects, so the message is retried";

/// The consumer's store on MySQL/MariaDB: the [`ConsumerStore`] a
/// consumer built with `ConsumerBuilder::for_connection(name) …
/// .build_on(store)` runs on. Handlers receive `&mut MySqlConnection`.
/// The tables come from [`crate::migrate`] (schema version 3).
///
/// ```no_run
/// # use outbox_core::OutboxEvent;
/// # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, OutboxEvent)]
/// # #[outbox(event_type = "order.created", version = 1, aggregate = "order")]
/// # struct OrderCreated { #[outbox(aggregate_id)] order_id: String }
/// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
///
/// use outbox_core::consumer::{ConsumerBuilder, Ordering};
/// use sqlx::MySqlConnection;
///
/// let pool = outbox_mysql::connect("mysql://app@127.0.0.1:3306/app").await?;
/// outbox_mysql::migrate(&pool).await?;
/// let consumer = ConsumerBuilder::<MySqlConnection>::for_connection("billing")
///     .ordering(Ordering::Strict { park_timeout: Duration::from_secs(60) })
///     .on_fn::<OrderCreated, _>(|order, tx| {
///         Box::pin(async move {
///             sqlx::query("INSERT INTO invoices (order_id) VALUES (?)")
///                 .bind(&order.event.order_id)
///                 .execute(&mut *tx)
///                 .await?;
///             Ok(())
///         })
///     })
///     .build_on(outbox_mysql::MySqlConsumerStore::new(pool))?;
/// # let _ = consumer;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct MySqlConsumerStore {
    pool: MySqlPool,
}

impl MySqlConsumerStore {
    /// The consumer store of the database behind `pool` (opened with
    /// [`crate::connect`], migrated with [`crate::migrate`]). The
    /// handlers' effects are written through the same pool, in the
    /// consumer's transactions.
    pub fn new(pool: MySqlPool) -> MySqlConsumerStore {
        MySqlConsumerStore { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }
}

fn position_from_row(row: &MySqlRow) -> sqlx::Result<Position> {
    Ok(Position {
        version: row.try_get("version")?,
        pinned: row.try_get::<i8, _>("pinned")? != 0,
        start_version: row.try_get("start_version")?,
    })
}

fn encode_error(error: serde_json::Error) -> sqlx::Error {
    sqlx::Error::Encode(error.into())
}

/// Whether a statement's `EXISTS (…)` (or other truth value) was true.
fn truth(value: Option<i64>) -> bool {
    value.unwrap_or(0) != 0
}

/// Inserts a letter row; false when an open letter for the event exists
/// (the unique key on `open_event_id`) or, with `unless_applied`, when the
/// consumer applied the event already.
#[allow(clippy::too_many_arguments)]
async fn insert_letter(
    conn: &mut MySqlConnection,
    consumer: &str,
    kind: &str,
    event_id: Option<String>,
    event_type: Option<&str>,
    schema_version: Option<i64>,
    aggregate: Option<(&str, &str)>,
    aggregate_version: Option<i64>,
    headers: String,
    payload: &[u8],
    reason: &str,
    attempts: i64,
) -> sqlx::Result<bool> {
    let done = sqlx::query(
        "INSERT INTO outbox_dead_letters
            (consumer_name, kind, event_id, event_type, schema_version, aggregate_type,
             aggregate_id, aggregate_key, aggregate_version, headers, payload, reason, attempts,
             created_at)
         SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? FROM DUAL
         WHERE ? IS NULL OR NOT EXISTS (
             SELECT 1 FROM outbox_processed_events WHERE consumer_name = ? AND event_id = ?)",
    )
    .bind(consumer)
    .bind(kind)
    .bind(event_id.as_deref())
    .bind(event_type)
    .bind(schema_version)
    .bind(aggregate.map(|a| a.0))
    .bind(aggregate.map(|a| a.1))
    .bind(aggregate.map(|a| aggregate_key(a.0, a.1)))
    .bind(aggregate_version)
    .bind(headers)
    .bind(payload)
    .bind(reason)
    .bind(attempts)
    .bind(now_ms())
    .bind(event_id.as_deref())
    .bind(consumer)
    .bind(event_id.as_deref())
    .execute(conn)
    .await;
    match done {
        Ok(done) => Ok(done.rows_affected() == 1),
        Err(error) if is_server_error(&error, DUPLICATE_KEY) => Ok(false),
        Err(error) => Err(error),
    }
}

impl MySqlConsumerStore {
    /// Moves an aggregate's parked messages to the dead letters with
    /// `reason`: their inbox rows go (they were never applied, so a replay
    /// can apply them once). Returns how many letters were written.
    async fn letter_parked_rows(
        conn: &mut MySqlConnection,
        consumer: &str,
        aggregate: (&str, &str),
        reason: &str,
    ) -> sqlx::Result<u64> {
        let key = aggregate_key(aggregate.0, aggregate.1);
        let rows: Vec<(String, String, i64, i32)> = sqlx::query_as(
            "SELECT event_id, envelope, aggregate_version, attempts FROM outbox_consumer_parked
             WHERE consumer_name = ? AND aggregate_key = ?
             ORDER BY aggregate_version FOR UPDATE",
        )
        .bind(consumer)
        .bind(&key)
        .fetch_all(&mut *conn)
        .await?;
        if rows.is_empty() {
            return Ok(0);
        }
        sqlx::query(
            "DELETE FROM outbox_consumer_parked WHERE consumer_name = ? AND aggregate_key = ?",
        )
        .bind(consumer)
        .bind(&key)
        .execute(&mut *conn)
        .await?;
        let mut written = 0;
        for (event_id, envelope_json, version, attempts) in rows {
            sqlx::query(
                "DELETE FROM outbox_processed_events WHERE consumer_name = ? AND event_id = ?",
            )
            .bind(consumer)
            .bind(&event_id)
            .execute(&mut *conn)
            .await?;
            let (headers, payload, envelope) = parked_letter_parts(&envelope_json);
            let inserted = insert_letter(
                conn,
                consumer,
                "dead_lettered",
                Some(event_id),
                envelope.as_ref().map(|e| e.event_type.as_str()),
                envelope.as_ref().map(|e| i64::from(e.schema_version)),
                Some(aggregate),
                Some(version),
                headers.to_string(),
                &payload,
                reason,
                i64::from(attempts),
            )
            .await?;
            written += u64::from(inserted);
        }
        Ok(written)
    }

    /// Whether the version after `version` of the aggregate waits parked.
    async fn successor_parked(
        conn: &mut MySqlConnection,
        consumer: &str,
        key: &[u8],
        version: i64,
    ) -> sqlx::Result<bool> {
        let parked: Option<i64> = sqlx::query_scalar(SUCCESSOR_PARKED)
            .bind(consumer)
            .bind(key)
            .bind(version)
            .bind(now_ms())
            .fetch_one(conn)
            .await?;
        Ok(truth(parked))
    }

    /// Moves the position to `envelope`'s version (see [`SET_POSITION`]);
    /// whether a row matched.
    async fn move_position(
        conn: &mut MySqlConnection,
        consumer: &str,
        key: &[u8],
        version: i64,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(SET_POSITION)
            .bind(version)
            .bind(version)
            .bind(now_ms())
            .bind(consumer)
            .bind(key)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }
}

impl ConsumerStore for MySqlConsumerStore {
    type Db = MySql;

    /// Event types and aggregate types of more than 255 characters and
    /// aggregate ids of more than 500 do not fit the consumer's columns
    /// (InnoDB's key limits; PostgreSQL has none, so another store's
    /// producer may send them).
    fn refuses(&self, _incoming: &Incoming, envelope: &Envelope) -> Option<String> {
        [
            ("event type", envelope.event_type.as_str(), 255),
            ("aggregate type", envelope.aggregate_type.as_str(), 255),
            ("aggregate id", envelope.aggregate_id.as_str(), 500),
        ]
        .into_iter()
        .map(|(what, value, limit)| (what, value.chars().count(), limit))
        .find(|(_, length, limit)| length > limit)
        .map(|(what, length, limit)| {
            format!(
                "the {what} has {length} characters; the MySQL consumer store keeps at most {limit}"
            )
        })
    }

    /// READ COMMITTED, `START TRANSACTION` and the message's savepoint, in
    /// one round trip. The handler timeout cannot cut off a statement (see
    /// the module notes).
    async fn begin(&self, _handler_timeout: Duration) -> sqlx::Result<Transaction<'static, MySql>> {
        self.pool.begin_with(BEGIN).await
    }

    async fn begin_batch(
        &self,
        _handler_timeout: Duration,
    ) -> sqlx::Result<Transaction<'static, MySql>> {
        self.pool.begin_with(BEGIN).await
    }

    async fn acquire(&self) -> sqlx::Result<PoolConnection<MySql>> {
        self.pool.acquire().await
    }

    /// The message's savepoint is there only if the transaction did not
    /// end under the handler; it is taken anew for the next handler of a
    /// batch.
    async fn transaction_intact(&self, conn: &mut MySqlConnection) -> Result<(), HandlerError> {
        match sqlx::raw_sql("RELEASE SAVEPOINT outbox_message; SAVEPOINT outbox_message")
            .execute(&mut *conn)
            .await
        {
            Ok(_) => Ok(()),
            Err(error) if is_server_error(&error, NO_SUCH_SAVEPOINT) => {
                tracing::debug!(%error, "{HANDLER_ENDED_TRANSACTION}");
                Err(HandlerError::retryable(ENDED))
            }
            Err(error) => Err(HandlerError::retryable(error)),
        }
    }

    /// One statement: the counter's new value comes back as the
    /// statement's insert id (`LAST_INSERT_ID(expr)`).
    async fn count_start(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<u32> {
        let done = sqlx::query(
            "INSERT INTO outbox_consumer_attempts (consumer_name, event_id, starts, updated_at)
             VALUES (?, ?, LAST_INSERT_ID(2), ?)
             ON DUPLICATE KEY UPDATE starts = LAST_INSERT_ID(starts + 1),
                                     updated_at = VALUES(updated_at)",
        )
        .bind(consumer)
        .bind(event_id.to_string())
        .bind(now_ms())
        .execute(conn)
        .await?;
        Ok(done.last_insert_id().clamp(1, u64::from(u32::MAX)) as u32)
    }

    /// Rolls back to the message's savepoint (the inbox row, the position
    /// and the handler's effects go; the row locks stay) and commits the
    /// retry record in the same transaction. When the transaction had
    /// already ended, the record is written on its own.
    async fn roll_back_for_retry(
        &self,
        mut tx: Transaction<'static, MySql>,
        consumer: &str,
        envelope: &Envelope,
        retry_in: Duration,
    ) -> sqlx::Result<()> {
        const NOTE: &str = "INSERT INTO outbox_consumer_attempts
                (consumer_name, event_id, starts, aggregate_type, aggregate_id, aggregate_key,
                 aggregate_version, retry_at, updated_at)
             VALUES (?, ?, 1, ?, ?, ?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE
                aggregate_type = VALUES(aggregate_type), aggregate_id = VALUES(aggregate_id),
                aggregate_key = VALUES(aggregate_key), aggregate_version = VALUES(aggregate_version),
                retry_at = VALUES(retry_at), updated_at = VALUES(updated_at)";
        let now = now_ms();
        let key = aggregate_key(&envelope.aggregate_type, &envelope.aggregate_id);
        let note = || {
            sqlx::query(NOTE)
                .bind(consumer)
                .bind(envelope.id.to_string())
                .bind(&envelope.aggregate_type)
                .bind(&envelope.aggregate_id)
                .bind(&key)
                .bind(envelope.aggregate_version)
                .bind(now.saturating_add(millis(retry_in)))
                .bind(now)
        };
        if sqlx::raw_sql("ROLLBACK TO SAVEPOINT outbox_message")
            .execute(&mut *tx)
            .await
            .is_ok()
        {
            note().execute(&mut *tx).await?;
            return tx.commit().await;
        }
        let _ = tx.rollback().await;
        let mut conn = self.pool.acquire().await?;
        note().execute(&mut *conn).await?;
        Ok(())
    }

    async fn forget_starts(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "DELETE FROM outbox_consumer_attempts WHERE consumer_name = ? AND event_id = ?",
        )
        .bind(consumer)
        .bind(event_id.to_string())
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn forget_processed(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<()> {
        sqlx::query("DELETE FROM outbox_processed_events WHERE consumer_name = ? AND event_id = ?")
            .bind(consumer)
            .bind(event_id.to_string())
            .execute(conn)
            .await?;
        Ok(())
    }

    /// The inbox key, unless an open letter holds the event (a redelivery
    /// of a lettered message is a duplicate until the letter is replayed
    /// or discarded). `INSERT IGNORE` ignores only the duplicate key here:
    /// nothing bound can be too long for its column.
    async fn claim_one(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<bool> {
        let id = event_id.to_string();
        let done = sqlx::query(CLAIM_INBOX)
            .bind(consumer)
            .bind(&id)
            .bind(now_ms())
            .bind(consumer)
            .bind(&id)
            .execute(conn)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn claim_replay(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "INSERT IGNORE INTO outbox_processed_events (consumer_name, event_id, processed_at)
             VALUES (?, ?, ?)",
        )
        .bind(consumer)
        .bind(event_id.to_string())
        .bind(now_ms())
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// The ids already in the inbox or held by an open letter are left out
    /// (one read); the others are inserted in one statement, each row marked with a number drawn for
    /// this call, so the rows this transaction wrote are told from those
    /// another instance wrote meanwhile (MySQL returns no rows from an
    /// insert). When every candidate was new, the marks are not read.
    async fn claim_many(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        event_ids: &[Uuid],
    ) -> sqlx::Result<Vec<Uuid>> {
        if event_ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut ids: Vec<String> = event_ids.iter().map(Uuid::to_string).collect();
        ids.sort_unstable();
        ids.dedup();
        // A plain read, no locks: an insert that met an existing row would
        // hold a shared lock on it for the batch, and a batch waiting for a
        // position while another instance deletes that inbox row (a parked
        // message going to the dead letters) would close a deadlock.
        let mut known = QueryBuilder::<MySql>::new(
            "SELECT event_id FROM outbox_processed_events WHERE consumer_name = ",
        );
        known.push_bind(consumer).push(" AND event_id IN (");
        let mut list = known.separated(", ");
        for id in &ids {
            list.push_bind(id.as_str());
        }
        known.push(
            ") UNION ALL SELECT open_event_id FROM outbox_dead_letters WHERE consumer_name = ",
        );
        known.push_bind(consumer).push(" AND open_event_id IN (");
        let mut list = known.separated(", ");
        for id in &ids {
            list.push_bind(id.as_str());
        }
        known.push(")");
        let known: Vec<String> = known.build_query_scalar().fetch_all(&mut *conn).await?;
        ids.retain(|id| !known.contains(id));
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let mark = (Uuid::new_v4().as_u128() >> 65) as i64;
        let now = now_ms();
        let mut insert = QueryBuilder::<MySql>::new(
            "INSERT IGNORE INTO outbox_processed_events
                (consumer_name, event_id, processed_at, claim_mark) ",
        );
        insert.push_values(&ids, |mut row, id| {
            row.push_bind(consumer)
                .push_bind(id.as_str())
                .push_bind(now)
                .push_bind(mark);
        });
        let inserted = insert.build().execute(&mut *conn).await?.rows_affected();
        let fresh = if inserted as usize == ids.len() {
            ids
        } else {
            let mut ours = QueryBuilder::<MySql>::new(
                "SELECT event_id FROM outbox_processed_events WHERE consumer_name = ",
            );
            ours.push_bind(consumer)
                .push(" AND claim_mark = ")
                .push_bind(mark)
                .push(" AND event_id IN (");
            let mut list = ours.separated(", ");
            for id in &ids {
                list.push_bind(id.as_str());
            }
            ours.push(")");
            ours.build_query_scalar().fetch_all(&mut *conn).await?
        };
        fresh
            .iter()
            .map(|id| {
                id.parse()
                    .map_err(|error: uuid::Error| sqlx::Error::Decode(error.into()))
            })
            .collect()
    }

    /// Creates the missing positions (at 0, not pinned) and locks the
    /// others in one statement, in key order, then reads them all.
    async fn lock_positions(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        aggregates: &[(String, String)],
    ) -> sqlx::Result<Vec<((String, String), Position)>> {
        if aggregates.is_empty() {
            return Ok(Vec::new());
        }
        let mut keyed: Vec<(Vec<u8>, &(String, String))> = aggregates
            .iter()
            .map(|aggregate| (aggregate_key(&aggregate.0, &aggregate.1), aggregate))
            .collect();
        keyed.sort();
        let now = now_ms();
        let mut lock = QueryBuilder::<MySql>::new(
            "INSERT INTO outbox_consumer_positions
                (consumer_name, aggregate_key, aggregate_type, aggregate_id, version, pinned,
                 updated_at) ",
        );
        lock.push_values(&keyed, |mut row, (key, (aggregate_type, aggregate_id))| {
            row.push_bind(consumer)
                .push_bind(key.as_slice())
                .push_bind(aggregate_type.as_str())
                .push_bind(aggregate_id.as_str())
                .push_bind(0_i64)
                .push_bind(0_i8)
                .push_bind(now);
        });
        lock.push(" ON DUPLICATE KEY UPDATE version = version");
        lock.build().execute(&mut *conn).await?;
        let mut read = QueryBuilder::<MySql>::new(
            "SELECT aggregate_type, aggregate_id, version, pinned, start_version
             FROM outbox_consumer_positions WHERE consumer_name = ",
        );
        read.push_bind(consumer).push(" AND aggregate_key IN (");
        let mut list = read.separated(", ");
        for (key, _) in &keyed {
            list.push_bind(key.as_slice());
        }
        read.push(")");
        let rows = read.build().fetch_all(conn).await?;
        rows.iter()
            .map(|row| {
                Ok((
                    (row.try_get("aggregate_type")?, row.try_get("aggregate_id")?),
                    position_from_row(row)?,
                ))
            })
            .collect()
    }

    /// The inbox key, then the position moved to this version when it is
    /// the next one, else the position (created for a first message)
    /// locked for the ordering decision.
    async fn claim_strict(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<Option<StrictClaim>> {
        if !self.claim_one(conn, consumer, envelope.id).await? {
            return Ok(None);
        }
        let key = aggregate_key(&envelope.aggregate_type, &envelope.aggregate_id);
        let version = envelope.aggregate_version;
        let moved = sqlx::query(ADVANCE_POSITION)
            .bind(version)
            .bind(version)
            .bind(now_ms())
            .bind(consumer)
            .bind(&key)
            .bind(version)
            .execute(&mut *conn)
            .await?;
        if moved.rows_affected() == 1 {
            let successor_parked = Self::successor_parked(conn, consumer, &key, version).await?;
            return Ok(Some(StrictClaim::Advanced { successor_parked }));
        }
        let position = self
            .lock_position(
                conn,
                consumer,
                &envelope.aggregate_type,
                &envelope.aggregate_id,
            )
            .await?;
        Ok(Some(StrictClaim::Locked(position)))
    }

    async fn claim_stale(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<Option<bool>> {
        if !self.claim_one(conn, consumer, envelope.id).await? {
            return Ok(None);
        }
        Ok(Some(self.advance_if_newer(conn, consumer, envelope).await?))
    }

    async fn settle_strict(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<bool> {
        let key = aggregate_key(&envelope.aggregate_type, &envelope.aggregate_id);
        if !Self::move_position(conn, consumer, &key, envelope.aggregate_version).await? {
            return Ok(false);
        }
        Self::successor_parked(conn, consumer, &key, envelope.aggregate_version).await
    }

    /// The moved positions in one statement (rows the batch locked), the
    /// parked messages in another, and the moved aggregates whose next
    /// version waits parked in a third.
    async fn settle_batch(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        moved: &[MovedPosition],
        parked: &[Envelope],
    ) -> sqlx::Result<Vec<(String, String)>> {
        let now = now_ms();
        let mut keyed: Vec<(Vec<u8>, &MovedPosition)> = moved
            .iter()
            .map(|m| (aggregate_key(&m.aggregate.0, &m.aggregate.1), m))
            .collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        if !keyed.is_empty() {
            let mut write = QueryBuilder::<MySql>::new(
                "INSERT INTO outbox_consumer_positions
                    (consumer_name, aggregate_key, aggregate_type, aggregate_id, version, pinned,
                     start_version, updated_at) ",
            );
            write.push_values(&keyed, |mut row, (key, m)| {
                row.push_bind(consumer)
                    .push_bind(key.as_slice())
                    .push_bind(m.aggregate.0.as_str())
                    .push_bind(m.aggregate.1.as_str())
                    .push_bind(m.version)
                    .push_bind(1_i8)
                    .push_bind(m.start)
                    .push_bind(now);
            });
            write.push(
                " ON DUPLICATE KEY UPDATE
                    start_version = IF(pinned, start_version,
                                       COALESCE(start_version, VALUES(start_version))),
                    pinned = 1, version = VALUES(version), updated_at = VALUES(updated_at)",
            );
            write.build().execute(&mut *conn).await?;
        }
        if !parked.is_empty() {
            let rows = parked
                .iter()
                .map(|e| {
                    Ok((
                        e,
                        aggregate_key(&e.aggregate_type, &e.aggregate_id),
                        serde_json::to_string(e)?,
                    ))
                })
                .collect::<Result<Vec<_>, serde_json::Error>>()
                .map_err(encode_error)?;
            let mut park = QueryBuilder::<MySql>::new(
                "INSERT IGNORE INTO outbox_consumer_parked
                    (consumer_name, event_id, aggregate_type, aggregate_id, aggregate_key,
                     aggregate_version, envelope, parked_at) ",
            );
            park.push_values(&rows, |mut row, (e, key, json)| {
                row.push_bind(consumer)
                    .push_bind(e.id.to_string())
                    .push_bind(e.aggregate_type.as_str())
                    .push_bind(e.aggregate_id.as_str())
                    .push_bind(key.as_slice())
                    .push_bind(e.aggregate_version)
                    .push_bind(json.as_str())
                    .push_bind(now);
            });
            park.build().execute(&mut *conn).await?;
        }
        if keyed.is_empty() {
            return Ok(Vec::new());
        }
        let mut ready = QueryBuilder::<MySql>::new(
            "SELECT DISTINCT aggregate_type, aggregate_id FROM outbox_consumer_parked
             WHERE consumer_name = ",
        );
        ready
            .push_bind(consumer)
            .push(" AND (retry_at IS NULL OR retry_at <= ")
            .push_bind(now)
            .push(") AND (");
        for (n, (key, m)) in keyed.iter().enumerate() {
            if n > 0 {
                ready.push(" OR ");
            }
            ready
                .push("(aggregate_key = ")
                .push_bind(key.as_slice())
                .push(" AND aggregate_version = ")
                .push_bind(m.version.saturating_add(1))
                .push(")");
        }
        ready.push(")");
        ready.build_query_as().fetch_all(conn).await
    }

    /// One statement, on the caller's connection (committed on its own
    /// outside a transaction).
    async fn pin_first(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        aggregates: &[(&str, &str)],
    ) -> sqlx::Result<()> {
        if aggregates.is_empty() {
            return Ok(());
        }
        let mut keyed: Vec<(Vec<u8>, (&str, &str))> = aggregates
            .iter()
            .map(|&(t, i)| (aggregate_key(t, i), (t, i)))
            .collect();
        keyed.sort();
        keyed.dedup();
        let now = now_ms();
        let mut pin = QueryBuilder::<MySql>::new(
            "INSERT INTO outbox_consumer_positions
                (consumer_name, aggregate_key, aggregate_type, aggregate_id, version, pinned,
                 start_version, updated_at) ",
        );
        pin.push_values(&keyed, |mut row, (key, (t, i))| {
            row.push_bind(consumer)
                .push_bind(key.as_slice())
                .push_bind(*t)
                .push_bind(*i)
                .push_bind(0_i64)
                .push_bind(1_i8)
                .push_bind(1_i64)
                .push_bind(now);
        });
        pin.push(
            " ON DUPLICATE KEY UPDATE
                start_version = IF(pinned, start_version, 1),
                updated_at = IF(pinned, updated_at, VALUES(updated_at)),
                pinned = 1",
        );
        pin.build().execute(conn).await?;
        Ok(())
    }

    async fn open_letter_at(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        aggregate: (&str, &str),
        version: i64,
    ) -> sqlx::Result<Option<(i64, String)>> {
        sqlx::query_as(
            "SELECT id, kind FROM outbox_dead_letters
             WHERE consumer_name = ? AND aggregate_key = ? AND aggregate_version = ?
               AND resolved_at IS NULL
             ORDER BY id LIMIT 1",
        )
        .bind(consumer)
        .bind(aggregate_key(aggregate.0, aggregate.1))
        .bind(version)
        .fetch_optional(conn)
        .await
    }

    /// Moves an existing position forward when the message is newer (the
    /// common case, one statement). Otherwise the row is created at 0 or,
    /// when it exists, locked by an upsert that changes nothing (exclusive
    /// at once: a shared lock first, as `INSERT IGNORE` takes on an
    /// existing row, would deadlock two instances upgrading it), and the
    /// move is tried once more on the locked row.
    async fn advance_if_newer(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<bool> {
        let key = aggregate_key(&envelope.aggregate_type, &envelope.aggregate_id);
        let version = envelope.aggregate_version;
        let now = now_ms();
        let forward = || {
            sqlx::query(
                "UPDATE outbox_consumer_positions SET version = ?, updated_at = ?
                 WHERE consumer_name = ? AND aggregate_key = ? AND version < ?",
            )
            .bind(version)
            .bind(now)
            .bind(consumer)
            .bind(&key)
            .bind(version)
        };
        if forward().execute(&mut *conn).await?.rows_affected() == 1 {
            return Ok(true);
        }
        sqlx::query(
            "INSERT INTO outbox_consumer_positions
                (consumer_name, aggregate_key, aggregate_type, aggregate_id, version, pinned,
                 updated_at)
             VALUES (?, ?, ?, ?, 0, 1, ?)
             ON DUPLICATE KEY UPDATE version = version",
        )
        .bind(consumer)
        .bind(&key)
        .bind(&envelope.aggregate_type)
        .bind(&envelope.aggregate_id)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        Ok(forward().execute(conn).await?.rows_affected() == 1)
    }

    async fn lock_position(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> sqlx::Result<Position> {
        let key = aggregate_key(aggregate_type, aggregate_id);
        sqlx::query(LOCK_POSITION)
            .bind(consumer)
            .bind(&key)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(now_ms())
            .execute(&mut *conn)
            .await?;
        let row = sqlx::query(READ_POSITION)
            .bind(consumer)
            .bind(&key)
            .fetch_one(conn)
            .await?;
        position_from_row(&row)
    }

    async fn try_lock_position(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> sqlx::Result<Option<Position>> {
        let row = sqlx::query(
            "SELECT version, pinned, start_version FROM outbox_consumer_positions
             WHERE consumer_name = ? AND aggregate_key = ?
             FOR UPDATE SKIP LOCKED",
        )
        .bind(consumer)
        .bind(aggregate_key(aggregate_type, aggregate_id))
        .fetch_optional(conn)
        .await?;
        row.as_ref().map(position_from_row).transpose()
    }

    async fn baseline(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        aggregate: (&str, &str),
    ) -> sqlx::Result<Option<(i64, bool)>> {
        let key = aggregate_key(aggregate.0, aggregate.1);
        let lowest: Option<i64> = sqlx::query_scalar(
            "SELECT MIN(v) FROM (
                SELECT aggregate_version AS v FROM outbox_consumer_parked
                WHERE consumer_name = ? AND aggregate_key = ?
                UNION ALL
                SELECT aggregate_version FROM outbox_dead_letters
                WHERE consumer_name = ? AND aggregate_key = ?
                  AND resolved_at IS NULL AND aggregate_version IS NOT NULL) AS seen",
        )
        .bind(consumer)
        .bind(&key)
        .bind(consumer)
        .bind(&key)
        .fetch_one(&mut *conn)
        .await?;
        let Some(lowest) = lowest else {
            return Ok(None);
        };
        let started = sqlx::query(
            "UPDATE outbox_consumer_positions
             SET version = ? - 1, start_version = ?, pinned = 1, updated_at = ?
             WHERE consumer_name = ? AND aggregate_key = ? AND NOT pinned",
        )
        .bind(lowest)
        .bind(lowest)
        .bind(now_ms())
        .bind(consumer)
        .bind(&key)
        .execute(&mut *conn)
        .await?;
        if started.rows_affected() == 0 {
            return Ok(None);
        }
        let parked: Option<i64> = sqlx::query_scalar(
            "SELECT EXISTS (
                SELECT 1 FROM outbox_consumer_parked
                WHERE consumer_name = ? AND aggregate_key = ? AND aggregate_version = ?)",
        )
        .bind(consumer)
        .bind(&key)
        .bind(lowest)
        .fetch_one(conn)
        .await?;
        Ok(Some((lowest - 1, truth(parked))))
    }

    async fn set_position(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<()> {
        let key = aggregate_key(&envelope.aggregate_type, &envelope.aggregate_id);
        Self::move_position(conn, consumer, &key, envelope.aggregate_version).await?;
        Ok(())
    }

    async fn park(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<()> {
        let json = serde_json::to_string(envelope).map_err(encode_error)?;
        sqlx::query(
            "INSERT IGNORE INTO outbox_consumer_parked
                (consumer_name, event_id, aggregate_type, aggregate_id, aggregate_key,
                 aggregate_version, envelope, parked_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(consumer)
        .bind(envelope.id.to_string())
        .bind(&envelope.aggregate_type)
        .bind(&envelope.aggregate_id)
        .bind(aggregate_key(
            &envelope.aggregate_type,
            &envelope.aggregate_id,
        ))
        .bind(envelope.aggregate_version)
        .bind(json)
        .bind(now_ms())
        .execute(conn)
        .await?;
        Ok(())
    }

    /// Locks the due parked message (waiting for another transaction that
    /// holds it, then reading it as it committed), counts its start and
    /// leases it.
    async fn start_parked(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        aggregate: (&str, &str),
        version: i64,
        lease: Duration,
    ) -> sqlx::Result<Option<Result<ParkedMessage, serde_json::Error>>> {
        let now = now_ms();
        let row: Option<(String, String, i32)> = sqlx::query_as(
            "SELECT event_id, envelope, attempts FROM outbox_consumer_parked
             WHERE consumer_name = ? AND aggregate_key = ? AND aggregate_version = ?
               AND (retry_at IS NULL OR retry_at <= ?)
             ORDER BY parked_at LIMIT 1 FOR UPDATE",
        )
        .bind(consumer)
        .bind(aggregate_key(aggregate.0, aggregate.1))
        .bind(version)
        .bind(now)
        .fetch_optional(&mut *conn)
        .await?;
        let Some((event_id, json, attempts)) = row else {
            return Ok(None);
        };
        sqlx::query(
            "UPDATE outbox_consumer_parked SET attempts = attempts + 1, retry_at = ?
             WHERE consumer_name = ? AND event_id = ?",
        )
        .bind(now.saturating_add(millis(lease)))
        .bind(consumer)
        .bind(&event_id)
        .execute(conn)
        .await?;
        let attempts = i64::from(attempts) + 1;
        Ok(Some(serde_json::from_str(&json).map(|envelope| {
            ParkedMessage {
                envelope,
                attempts: attempts.clamp(1, i64::from(u32::MAX)) as u32,
            }
        })))
    }

    async fn lock_parked(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<bool> {
        let found: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM outbox_consumer_parked WHERE consumer_name = ? AND event_id = ?
             FOR UPDATE",
        )
        .bind(consumer)
        .bind(event_id.to_string())
        .fetch_optional(conn)
        .await?;
        Ok(found.is_some())
    }

    async fn unpark_through(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        aggregate: (&str, &str),
        version: i64,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "DELETE FROM outbox_consumer_parked
             WHERE consumer_name = ? AND aggregate_key = ? AND aggregate_version <= ?",
        )
        .bind(consumer)
        .bind(aggregate_key(aggregate.0, aggregate.1))
        .bind(version)
        .execute(conn)
        .await?;
        Ok(())
    }

    /// Dead-letters the aggregate's parked messages only if the next
    /// version is still not parked, is not retrying (a failed handler's
    /// message due back less than the timeout ago) and the oldest parked
    /// message waited past the timeout.
    async fn expire_parked(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        aggregate: (&str, &str),
        position: i64,
        timeout_secs: f64,
        reason: &str,
    ) -> sqlx::Result<u64> {
        let key = aggregate_key(aggregate.0, aggregate.1);
        let cutoff = now_ms().saturating_sub((timeout_secs * 1000.0) as i64);
        let due: Option<i64> = sqlx::query_scalar(
            "SELECT COUNT(*) > 0 AND MIN(parked_at) < ?
                    AND NOT MAX(aggregate_version = ? + 1)
                    AND NOT EXISTS (
                        SELECT 1 FROM outbox_consumer_attempts a
                        WHERE a.consumer_name = ? AND a.aggregate_key = ?
                          AND a.aggregate_version = ? + 1 AND a.retry_at > ?)
             FROM outbox_consumer_parked
             WHERE consumer_name = ? AND aggregate_key = ?",
        )
        .bind(cutoff)
        .bind(position)
        .bind(consumer)
        .bind(&key)
        .bind(position)
        .bind(cutoff)
        .bind(consumer)
        .bind(&key)
        .fetch_one(&mut *conn)
        .await?;
        if !truth(due) {
            return Ok(0);
        }
        Self::letter_parked_rows(conn, consumer, aggregate, reason).await
    }

    async fn unpark(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<()> {
        sqlx::query("DELETE FROM outbox_consumer_parked WHERE consumer_name = ? AND event_id = ?")
            .bind(consumer)
            .bind(event_id.to_string())
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn parked_failed(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        event_id: Uuid,
        error: &str,
        retry_in: Duration,
    ) -> sqlx::Result<bool> {
        // Rows matched, not changed: the connection reports found rows.
        let done = sqlx::query(
            "UPDATE outbox_consumer_parked SET last_error = ?, retry_at = ?
             WHERE consumer_name = ? AND event_id = ?",
        )
        .bind(error)
        .bind(now_ms().saturating_add(millis(retry_in)))
        .bind(consumer)
        .bind(event_id.to_string())
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn ready_parked(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
    ) -> sqlx::Result<Vec<(String, String)>> {
        sqlx::query_as(
            "SELECT DISTINCT k.aggregate_type, k.aggregate_id
             FROM outbox_consumer_parked k
             LEFT JOIN outbox_consumer_positions p
               ON p.consumer_name = k.consumer_name AND p.aggregate_key = k.aggregate_key
             WHERE k.consumer_name = ? AND k.aggregate_version = COALESCE(p.version, 0) + 1
               AND (k.retry_at IS NULL OR k.retry_at <= ?)
             LIMIT 1000",
        )
        .bind(consumer)
        .bind(now_ms())
        .fetch_all(conn)
        .await
    }

    async fn expired_parked(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        timeout_secs: f64,
    ) -> sqlx::Result<Vec<ExpiredAggregate>> {
        let cutoff = now_ms().saturating_sub((timeout_secs * 1000.0) as i64);
        let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT MIN(k.aggregate_type), MIN(k.aggregate_id),
                    CAST(COALESCE(MAX(p.version), 0) AS SIGNED), MIN(k.aggregate_version)
             FROM outbox_consumer_parked k
             LEFT JOIN outbox_consumer_positions p
               ON p.consumer_name = k.consumer_name AND p.aggregate_key = k.aggregate_key
             WHERE k.consumer_name = ?
             GROUP BY k.aggregate_key
             HAVING MIN(k.parked_at) < ?
             LIMIT 1000",
        )
        .bind(consumer)
        .bind(cutoff)
        .fetch_all(conn)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(aggregate_type, aggregate_id, position, first_parked)| ExpiredAggregate {
                    aggregate_type,
                    aggregate_id,
                    position,
                    first_parked,
                },
            )
            .collect())
    }

    async fn dead_letter_parked(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        aggregate: (&str, &str),
        reason: &str,
    ) -> sqlx::Result<u64> {
        Self::letter_parked_rows(conn, consumer, aggregate, reason).await
    }

    /// Written only for an event this consumer has not applied, and at
    /// most once while it is open.
    async fn letter(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        letter: &Letter<'_>,
    ) -> sqlx::Result<bool> {
        let envelope = letter.envelope;
        insert_letter(
            conn,
            consumer,
            letter.kind.as_str(),
            envelope.map(|e| e.id.to_string()),
            envelope.map(|e| e.event_type.as_str()),
            envelope.map(|e| i64::from(e.schema_version)),
            envelope.map(|e| (e.aggregate_type.as_str(), e.aggregate_id.as_str())),
            envelope.map(|e| e.aggregate_version),
            letter.headers.to_string(),
            letter.payload,
            letter.reason,
            i64::from(letter.attempts),
        )
        .await
    }

    async fn lock_letter(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        letter_id: i64,
    ) -> sqlx::Result<Option<StoredLetter>> {
        let row: Option<(String, Vec<u8>)> = sqlx::query_as(
            "SELECT headers, payload FROM outbox_dead_letters
             WHERE id = ? AND consumer_name = ? AND resolved_at IS NULL FOR UPDATE",
        )
        .bind(letter_id)
        .bind(consumer)
        .fetch_optional(conn)
        .await?;
        Ok(row.map(|(headers, payload)| StoredLetter { headers, payload }))
    }

    async fn requested_replays(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
    ) -> sqlx::Result<Vec<i64>> {
        sqlx::query_scalar(
            "SELECT id FROM outbox_dead_letters
             WHERE consumer_name = ? AND replay_requested_at IS NOT NULL AND resolved_at IS NULL
             ORDER BY id LIMIT 100",
        )
        .bind(consumer)
        .fetch_all(conn)
        .await
    }

    /// Clears the request where it still stands (one guarded statement:
    /// another instance's waits for the row and then matches nothing, also
    /// on a connection outside a transaction), then reads the audit row it
    /// named, which nothing changes.
    async fn take_replay_request(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        letter_id: i64,
    ) -> sqlx::Result<Option<Option<i64>>> {
        let taken = sqlx::query(
            "UPDATE outbox_dead_letters SET replay_requested_at = NULL
             WHERE id = ? AND consumer_name = ?
               AND replay_requested_at IS NOT NULL AND resolved_at IS NULL",
        )
        .bind(letter_id)
        .bind(consumer)
        .execute(&mut *conn)
        .await?;
        if taken.rows_affected() != 1 {
            return Ok(None);
        }
        let audit: Option<Option<i64>> =
            sqlx::query_scalar("SELECT replay_audit_id FROM outbox_dead_letters WHERE id = ?")
                .bind(letter_id)
                .fetch_optional(conn)
                .await?;
        Ok(Some(audit.flatten()))
    }

    async fn resolve_letter(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        letter_id: i64,
        resolution: &str,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "UPDATE outbox_dead_letters
             SET resolved_at = ?, resolution = ?, replays = replays + 1
             WHERE id = ? AND consumer_name = ? AND resolved_at IS NULL",
        )
        .bind(now_ms())
        .bind(resolution)
        .bind(letter_id)
        .bind(consumer)
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn letter_replay_failed(
        &self,
        conn: &mut MySqlConnection,
        consumer: &str,
        letter_id: i64,
        error: &str,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "UPDATE outbox_dead_letters SET replays = replays + 1, last_replay_error = ?
             WHERE id = ? AND consumer_name = ? AND resolved_at IS NULL",
        )
        .bind(error)
        .bind(letter_id)
        .bind(consumer)
        .execute(conn)
        .await?;
        Ok(())
    }

    /// Added up across the instances; the lag is the one of the most
    /// recently applied event. The lag is assigned before the time it
    /// compares with (MySQL assigns left to right).
    async fn flush_stats(
        &self,
        consumer: &str,
        applied: i64,
        duplicates: i64,
        last_applied_at: Option<DateTime<Utc>>,
        lag_seconds: Option<f64>,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "INSERT INTO outbox_consumer_stats
                (consumer_name, applied, duplicates, last_applied_at, lag_seconds, updated_at)
             VALUES (?, ?, ?, ?, ?, ?)
             ON DUPLICATE KEY UPDATE
                applied = applied + VALUES(applied),
                duplicates = duplicates + VALUES(duplicates),
                lag_seconds = IF(VALUES(last_applied_at)
                                   >= COALESCE(last_applied_at, VALUES(last_applied_at)),
                                 VALUES(lag_seconds), lag_seconds),
                last_applied_at = GREATEST(COALESCE(last_applied_at, VALUES(last_applied_at)),
                                           COALESCE(VALUES(last_applied_at), last_applied_at)),
                updated_at = VALUES(updated_at)",
        )
        .bind(consumer)
        .bind(applied)
        .bind(duplicates)
        .bind(last_applied_at.map(|at| at.timestamp_millis()))
        .bind(lag_seconds)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    async fn audit_begin(
        &self,
        conn: &mut MySqlConnection,
        request: &RepairRequest,
        action: &str,
        target: &str,
        ids: &[String],
    ) -> sqlx::Result<i64> {
        let ids = serde_json::to_string(ids).map_err(encode_error)?;
        let done = sqlx::query(
            "INSERT INTO outbox_audit (at, operator, reason, action, target, ids)
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(now_ms())
        .bind(request.operator())
        .bind(request.reason())
        .bind(action)
        .bind(target)
        .bind(ids)
        .execute(conn)
        .await?;
        Ok(done.last_insert_id() as i64)
    }

    /// Appends to the row's outcomes array (an empty one when it has none).
    async fn audit_append(
        &self,
        conn: &mut MySqlConnection,
        audit_id: i64,
        outcomes: &serde_json::Value,
    ) -> sqlx::Result<()> {
        let stored: Option<Option<String>> =
            sqlx::query_scalar("SELECT outcomes FROM outbox_audit WHERE id = ? FOR UPDATE")
                .bind(audit_id)
                .fetch_optional(&mut *conn)
                .await?;
        let Some(stored) = stored else {
            return Ok(());
        };
        let all = outbox_core::audit::appended_outcomes(stored.as_deref(), outcomes)
            .map_err(|error| sqlx::Error::Decode(error.into()))?;
        sqlx::query("UPDATE outbox_audit SET outcomes = ? WHERE id = ?")
            .bind(all)
            .bind(audit_id)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn audit_finish(
        &self,
        conn: &mut MySqlConnection,
        audit_id: i64,
        outcomes: &serde_json::Value,
    ) -> sqlx::Result<()> {
        sqlx::query("UPDATE outbox_audit SET outcomes = ? WHERE id = ?")
            .bind(outcomes.to_string())
            .bind(audit_id)
            .execute(conn)
            .await?;
        Ok(())
    }
}
