//! The consumer's store on SQLite ([`SqliteConsumerStore`]): the inbox,
//! handler starts, strict positions and parked messages, quarantine and
//! dead letters, replay requests and counts, behind `outbox-core`'s
//! [`ConsumerStore`] seam, so the consumer engine (ordering, parking, the
//! sweep, retries, replays) runs unchanged on one file.
//!
//! **Exclusion.** Every consumer transaction starts with `BEGIN
//! IMMEDIATE`: it holds SQLite's write lock from its first statement to
//! its end, which gives what the PostgreSQL store gets from row locks
//! (`FOR UPDATE`, `SKIP LOCKED`) for every row at once. Transactions of
//! one file run one at a time (across processes too); a handler's
//! transaction is as long as the handler, so keep handlers short. A
//! savepoint taken right after `BEGIN` marks the start of the message: a
//! failed start that will be retried rolls back to it and commits the
//! retry record in the same transaction (a second connection could not
//! write while the first holds the lock), and the same savepoint finds a
//! transaction SQLite rolled back under a handler that swallowed the
//! error.
//!
//! **Round trips** are calls into SQLite's worker thread, not network hops:
//! where PostgreSQL needs one CTE, this store may run two short
//! statements in the same transaction. Batches bind their rows as one JSON
//! array (`json_each`), one statement per batch.
//!
//! SQLite cannot cut off a running statement by time: the handler timeout
//! stops waiting for the handler, and the rollback follows when its
//! statement returns.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_core::Envelope;
use outbox_core::audit::RepairRequest;
use outbox_core::consumer::HandlerError;
use outbox_core::consumer::store::{
    ConsumerStore, ExpiredAggregate, Letter, MovedPosition, ParkedMessage, Position, StoredLetter,
    StrictClaim, parked_letter_parts,
};
use sqlx::error::BoxDynError;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{SqliteArguments, SqliteRow};
use sqlx::{Arguments, Row, Sqlite, SqliteConnection, SqlitePool, Transaction};
use uuid::Uuid;

use crate::{millis, now_ms};

/// The statements that begin a consumer transaction: the write lock at
/// once, and the savepoint that marks the start of the message.
const BEGIN: &str = "BEGIN IMMEDIATE; SAVEPOINT outbox_message";

/// Moves a strict position to version `?4` and pins it (an unpinned one
/// starts at `?4`), then `$tail`. Binds: consumer, aggregate type,
/// aggregate id, version, now.
macro_rules! move_position {
    ($($tail:expr),*) => {
        concat!(
            "UPDATE outbox_consumer_positions
             SET version = ?4, pinned = 1, updated_at = ?5,
                 start_version = CASE WHEN pinned THEN start_version
                                      ELSE coalesce(start_version, ?4) END
             WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3"
            $(, $tail)*
        )
    };
}

/// Whether the version after `$version` of the aggregate `$type`/`$id`
/// waits parked and due (`$now`) for consumer `?1`.
macro_rules! successor_parked {
    ($type:literal, $id:literal, $version:literal, $now:literal) => {
        concat!(
            "EXISTS (
                SELECT 1 FROM outbox_consumer_parked k
                WHERE k.consumer_name = ?1 AND k.aggregate_type = ",
            $type,
            " AND k.aggregate_id = ",
            $id,
            " AND k.aggregate_version = ",
            $version,
            " + 1
                  AND (k.retry_at IS NULL OR k.retry_at <= ",
            $now,
            "))"
        )
    };
}

/// The inbox key `?6` of consumer `?1`, unless an open letter holds the
/// event, returning a row (`0`) when it is new. The statement that follows
/// it in one call runs only then: it asks `changes()`, which is this
/// insert's count until it completes itself.
macro_rules! claim_inbox {
    () => {
        "INSERT INTO outbox_processed_events (consumer_name, event_id, processed_at)
         SELECT ?1, ?6, ?5 WHERE NOT EXISTS (
             SELECT 1 FROM outbox_dead_letters
             WHERE consumer_name = ?1 AND event_id = ?6 AND resolved_at IS NULL)
         ON CONFLICT DO NOTHING
         RETURNING 0;
        "
    };
}

/// Strict, in one call: the inbox key, then the position moved only from
/// the version before (this is the next version), saying whether its
/// successor waits parked. Rows: none for a duplicate, `0` for a new key,
/// then the successor flag when the position moved. Binds: consumer,
/// aggregate type, aggregate id, version, now, event id.
const CLAIM_STRICT: &str = concat!(
    claim_inbox!(),
    move_position!(
        " AND version = ?4 - 1 AND changes() = 1 RETURNING ",
        successor_parked!("?2", "?3", "?4", "?5")
    )
);

/// RejectStale, in one call: the inbox key, then the position moved to this
/// version when it is newer (created at it for a first message). Rows:
/// none for a duplicate, `0` for a new key, then `1` when the position
/// moved. Binds as [`CLAIM_STRICT`].
const CLAIM_STALE: &str = concat!(
    claim_inbox!(),
    "INSERT INTO outbox_consumer_positions AS p
        (consumer_name, aggregate_type, aggregate_id, version, pinned, updated_at)
     SELECT ?1, ?2, ?3, ?4, 1, ?5 WHERE changes() = 1
     ON CONFLICT (consumer_name, aggregate_type, aggregate_id)
     DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at
     WHERE p.version < excluded.version
     RETURNING 1"
);

/// The position moved to this version, saying whether its successor waits
/// parked.
const SETTLE_AT: &str = move_position!(" RETURNING ", successor_parked!("?2", "?3", "?4", "?5"));

/// The position moved to this version.
const SET_POSITION: &str = move_position!();

/// Why a handler's `Ok` is not taken when SQLite ended its transaction.
const ROLLED_BACK: &str = "the handler returned Ok, but the consumer's transaction had ended under it (SQLite rolled it back after a statement error the handler went on from, or the handler sent ROLLBACK or COMMIT on the connection it was given); the inbox row and the position did not commit with its effects, so the message is retried";

/// The consumer's store on a SQLite file: the [`ConsumerStore`] a consumer
/// built with `ConsumerBuilder::for_connection(name) … .build_on(store)`
/// runs on. Handlers receive `&mut SqliteConnection`. The tables come
/// from [`crate::migrate`].
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
/// use outbox_core::relay::RelayConfig;
/// use outbox_core::transport::InProcessBus;
/// use sqlx::SqliteConnection;
///
/// let pool = outbox_sqlite::connect("sqlite://app.db").await?;
/// outbox_sqlite::migrate(&pool).await?;
/// sqlx::query("CREATE TABLE IF NOT EXISTS invoices (order_id TEXT PRIMARY KEY)")
///     .execute(&pool)
///     .await?;
/// let consumer = ConsumerBuilder::<SqliteConnection>::for_connection("billing")
///     .ordering(Ordering::Strict { park_timeout: Duration::from_secs(60) })
///     .on_fn::<OrderCreated, _>(|order, tx| {
///         Box::pin(async move {
///             sqlx::query("INSERT INTO invoices (order_id) VALUES (?1)")
///                 .bind(&order.event.order_id)
///                 .execute(&mut *tx)
///                 .await?;
///             Ok(())
///         })
///     })
///     .build_on(outbox_sqlite::SqliteConsumerStore::new(pool.clone()))?;
/// let bus = InProcessBus::new();
/// let task = consumer.spawn(bus.subscribe("billing"));
/// let relay = outbox_sqlite::start_relay(pool, bus.transport(), RelayConfig::default()).await?;
/// # relay.drain(Duration::from_secs(5)).await?;
/// # task.drain(Duration::from_secs(5)).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteConsumerStore {
    pool: SqlitePool,
}

impl SqliteConsumerStore {
    /// The consumer store of the file behind `pool` (opened with
    /// [`crate::connect`], migrated with [`crate::migrate`]).
    pub fn new(pool: SqlitePool) -> SqliteConsumerStore {
        SqliteConsumerStore { pool }
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

fn position_from_row(row: &SqliteRow) -> sqlx::Result<Position> {
    Ok(Position {
        version: row.try_get("version")?,
        pinned: row.try_get("pinned")?,
        start_version: row.try_get("start_version")?,
    })
}

/// `[[type, id], …]` as JSON text, for `json_each`.
fn pairs_json<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    serde_json::Value::Array(
        pairs
            .into_iter()
            .map(|(t, i)| serde_json::json!([t, i]))
            .collect(),
    )
    .to_string()
}

fn encode_error(error: serde_json::Error) -> sqlx::Error {
    sqlx::Error::Encode(error.into())
}

fn uuid_text(text: &str) -> sqlx::Result<Uuid> {
    text.parse()
        .map_err(|error: uuid::Error| sqlx::Error::Decode(error.into()))
}

impl SqliteConsumerStore {
    /// Moves the given parked messages of an aggregate to the dead letters
    /// with `reason`: their inbox rows go (they were never applied, so a
    /// replay can apply them once). Returns how many letters were written.
    async fn letter_parked_rows(
        conn: &mut SqliteConnection,
        consumer: &str,
        aggregate: (&str, &str),
        reason: &str,
    ) -> sqlx::Result<u64> {
        let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "DELETE FROM outbox_consumer_parked
             WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3
             RETURNING event_id, envelope, aggregate_version, attempts",
        )
        .bind(consumer)
        .bind(aggregate.0)
        .bind(aggregate.1)
        .fetch_all(&mut *conn)
        .await?;
        let mut rows = rows;
        rows.sort_by_key(|row| row.2);
        let mut written = 0;
        for (event_id, envelope_json, version, attempts) in rows {
            sqlx::query(
                "DELETE FROM outbox_processed_events WHERE consumer_name = ?1 AND event_id = ?2",
            )
            .bind(consumer)
            .bind(&event_id)
            .execute(&mut *conn)
            .await?;
            let (headers, payload, envelope) = parked_letter_parts(&envelope_json);
            let done = sqlx::query(
                "INSERT INTO outbox_dead_letters
                    (consumer_name, kind, event_id, event_type, schema_version, aggregate_type,
                     aggregate_id, aggregate_version, headers, payload, reason, attempts, created_at)
                 VALUES (?1, 'dead_lettered', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
                 ON CONFLICT DO NOTHING",
            )
            .bind(consumer)
            .bind(&event_id)
            .bind(envelope.as_ref().map(|e| e.event_type.as_str()))
            .bind(envelope.as_ref().map(|e| i64::from(e.schema_version)))
            .bind(aggregate.0)
            .bind(aggregate.1)
            .bind(version)
            .bind(headers.to_string())
            .bind(payload)
            .bind(reason)
            .bind(attempts)
            .bind(now_ms())
            .execute(&mut *conn)
            .await?;
            written += done.rows_affected();
        }
        Ok(written)
    }
}

/// Runs one of the claim-and-move calls ([`CLAIM_STRICT`], [`CLAIM_STALE`])
/// for `envelope`; returns its rows in statement order.
async fn claim_and_move(
    conn: &mut SqliteConnection,
    statements: &'static str,
    consumer: &str,
    envelope: &Envelope,
) -> sqlx::Result<Vec<i64>> {
    let mut arguments = position_arguments(consumer, envelope)?;
    arguments
        .add(envelope.id.to_string())
        .map_err(sqlx::Error::Encode)?;
    sqlx::query_scalar_with(statements, arguments)
        .fetch_all(conn)
        .await
}

/// The binds every statement on `envelope`'s position starts with:
/// consumer, aggregate type, aggregate id, version, now.
fn position_arguments(consumer: &str, envelope: &Envelope) -> sqlx::Result<SqliteArguments> {
    let mut arguments = SqliteArguments::default();
    let encoded = |added: Result<(), BoxDynError>| added.map_err(sqlx::Error::Encode);
    encoded(arguments.add(consumer))?;
    encoded(arguments.add(envelope.aggregate_type.as_str()))?;
    encoded(arguments.add(envelope.aggregate_id.as_str()))?;
    encoded(arguments.add(envelope.aggregate_version))?;
    encoded(arguments.add(now_ms()))?;
    Ok(arguments)
}

impl ConsumerStore for SqliteConsumerStore {
    type Db = Sqlite;

    /// `BEGIN IMMEDIATE` and the message's savepoint. The handler timeout
    /// cannot cut off a SQLite statement (see the module notes).
    async fn begin(
        &self,
        _handler_timeout: Duration,
    ) -> sqlx::Result<Transaction<'static, Sqlite>> {
        self.pool.begin_with(BEGIN).await
    }

    async fn begin_batch(
        &self,
        _handler_timeout: Duration,
    ) -> sqlx::Result<Transaction<'static, Sqlite>> {
        self.pool.begin_with(BEGIN).await
    }

    async fn acquire(&self) -> sqlx::Result<PoolConnection<Sqlite>> {
        self.pool.acquire().await
    }

    /// The message's savepoint is still there only if SQLite did not roll
    /// the transaction back under the handler; it is taken anew for the
    /// next handler of a batch. When the transaction is gone, an empty one
    /// is opened in its place: sqlx still counts the connection as inside
    /// a transaction, and its rollback (or a retry record written after
    /// the savepoint) needs one, or the connection would go back to the
    /// pool unable to begin again.
    async fn transaction_intact(&self, conn: &mut SqliteConnection) -> Result<(), HandlerError> {
        match sqlx::raw_sql("RELEASE outbox_message; SAVEPOINT outbox_message")
            .execute(&mut *conn)
            .await
        {
            Ok(_) => Ok(()),
            Err(error) if error.to_string().contains("no such savepoint") => {
                if let Err(error) = sqlx::raw_sql(BEGIN).execute(&mut *conn).await {
                    tracing::warn!(%error, "cannot reopen a transaction SQLite ended under a handler");
                }
                Err(HandlerError::retryable(ROLLED_BACK))
            }
            Err(error) => Err(HandlerError::retryable(error)),
        }
    }

    async fn count_start(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<u32> {
        let starts: i64 = sqlx::query_scalar(
            "INSERT INTO outbox_consumer_attempts (consumer_name, event_id, starts, updated_at)
             VALUES (?1, ?2, 2, ?3)
             ON CONFLICT (consumer_name, event_id)
             DO UPDATE SET starts = starts + 1, updated_at = excluded.updated_at
             RETURNING starts",
        )
        .bind(consumer)
        .bind(event_id.to_string())
        .bind(now_ms())
        .fetch_one(conn)
        .await?;
        Ok(starts.clamp(1, i64::from(u32::MAX)) as u32)
    }

    /// Rolls back to the message's savepoint (the inbox row, the position
    /// and the handler's effects go) and commits the retry record in the
    /// same transaction, which never let go of the write lock. When SQLite
    /// had already ended the transaction, the record is written on its own.
    async fn roll_back_for_retry(
        &self,
        mut tx: Transaction<'static, Sqlite>,
        consumer: &str,
        envelope: &Envelope,
        retry_in: Duration,
    ) -> sqlx::Result<()> {
        const NOTE: &str = "INSERT INTO outbox_consumer_attempts
                (consumer_name, event_id, starts, aggregate_type, aggregate_id, aggregate_version,
                 retry_at, updated_at)
             VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT (consumer_name, event_id) DO UPDATE SET
                aggregate_type = excluded.aggregate_type, aggregate_id = excluded.aggregate_id,
                aggregate_version = excluded.aggregate_version, retry_at = excluded.retry_at,
                updated_at = excluded.updated_at";
        let now = now_ms();
        let note = || {
            sqlx::query(NOTE)
                .bind(consumer)
                .bind(envelope.id.to_string())
                .bind(&envelope.aggregate_type)
                .bind(&envelope.aggregate_id)
                .bind(envelope.aggregate_version)
                .bind(now.saturating_add(millis(retry_in)))
                .bind(now)
        };
        if sqlx::raw_sql("ROLLBACK TO outbox_message")
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
        conn: &mut SqliteConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "DELETE FROM outbox_consumer_attempts WHERE consumer_name = ?1 AND event_id = ?2",
        )
        .bind(consumer)
        .bind(event_id.to_string())
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn forget_processed(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "DELETE FROM outbox_processed_events WHERE consumer_name = ?1 AND event_id = ?2",
        )
        .bind(consumer)
        .bind(event_id.to_string())
        .execute(conn)
        .await?;
        Ok(())
    }

    /// The inbox key, unless an open letter holds the event (a redelivery
    /// of a lettered message is a duplicate until the letter is replayed
    /// or discarded).
    async fn claim_one(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "INSERT INTO outbox_processed_events (consumer_name, event_id, processed_at)
             SELECT ?1, ?2, ?3 WHERE NOT EXISTS (
                 SELECT 1 FROM outbox_dead_letters
                 WHERE consumer_name = ?1 AND event_id = ?2 AND resolved_at IS NULL)
             ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(event_id.to_string())
        .bind(now_ms())
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn claim_replay(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "INSERT INTO outbox_processed_events (consumer_name, event_id, processed_at)
             VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(event_id.to_string())
        .bind(now_ms())
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// One statement for the batch: the ids as a JSON array.
    async fn claim_many(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        event_ids: &[Uuid],
    ) -> sqlx::Result<Vec<Uuid>> {
        let ids = serde_json::Value::Array(
            event_ids
                .iter()
                .map(|id| serde_json::Value::String(id.to_string()))
                .collect(),
        )
        .to_string();
        let fresh: Vec<String> = sqlx::query_scalar(
            "INSERT INTO outbox_processed_events (consumer_name, event_id, processed_at)
             SELECT ?1, j.value, ?3 FROM json_each(?2) AS j
             WHERE NOT EXISTS (
                 SELECT 1 FROM outbox_dead_letters d
                 WHERE d.consumer_name = ?1 AND d.event_id = j.value AND d.resolved_at IS NULL)
             ORDER BY j.value
             ON CONFLICT DO NOTHING
             RETURNING event_id",
        )
        .bind(consumer)
        .bind(ids)
        .bind(now_ms())
        .fetch_all(conn)
        .await?;
        fresh.iter().map(|id| uuid_text(id)).collect()
    }

    /// Creates the missing positions (at 0, not pinned) and reads them
    /// all; the write lock the transaction holds keeps them.
    async fn lock_positions(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        aggregates: &[(String, String)],
    ) -> sqlx::Result<Vec<((String, String), Position)>> {
        let pairs = pairs_json(aggregates.iter().map(|(t, i)| (t.as_str(), i.as_str())));
        sqlx::query(
            "INSERT INTO outbox_consumer_positions
                (consumer_name, aggregate_type, aggregate_id, version, pinned, updated_at)
             SELECT ?1, j.value ->> 0, j.value ->> 1, 0, 0, ?3 FROM json_each(?2) AS j WHERE true
             ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(&pairs)
        .bind(now_ms())
        .execute(&mut *conn)
        .await?;
        let rows = sqlx::query(
            "WITH u (t, i) AS MATERIALIZED (SELECT value ->> 0, value ->> 1 FROM json_each(?2))
             SELECT p.aggregate_type, p.aggregate_id, p.version, p.pinned, p.start_version
             FROM u CROSS JOIN outbox_consumer_positions p
             WHERE p.consumer_name = ?1 AND p.aggregate_type = u.t AND p.aggregate_id = u.i",
        )
        .bind(consumer)
        .bind(&pairs)
        .fetch_all(conn)
        .await?;
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
    /// the next one (one call into SQLite), else the position (created for
    /// a first message) for the ordering decision.
    async fn claim_strict(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<Option<StrictClaim>> {
        let rows = claim_and_move(conn, CLAIM_STRICT, consumer, envelope).await?;
        match rows.as_slice() {
            [] => return Ok(None),
            [_, successor_parked] => {
                return Ok(Some(StrictClaim::Advanced {
                    successor_parked: *successor_parked != 0,
                }));
            }
            _ => {}
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
        conn: &mut SqliteConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<Option<bool>> {
        let rows = claim_and_move(conn, CLAIM_STALE, consumer, envelope).await?;
        Ok(match rows.as_slice() {
            [] => None,
            [_] => Some(false),
            _ => Some(true),
        })
    }

    async fn settle_strict(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<bool> {
        let ready: Option<bool> =
            sqlx::query_scalar_with(SETTLE_AT, position_arguments(consumer, envelope)?)
                .fetch_optional(conn)
                .await?;
        Ok(ready.unwrap_or(false))
    }

    /// The moved positions in one statement, the parked messages in
    /// another, and the moved aggregates whose next version waits parked
    /// in a third (each binds its rows as one JSON array).
    async fn settle_batch(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        moved: &[MovedPosition],
        parked: &[Envelope],
    ) -> sqlx::Result<Vec<(String, String)>> {
        let now = now_ms();
        let moved_json = serde_json::Value::Array(
            moved
                .iter()
                .map(|m| serde_json::json!([m.aggregate.0, m.aggregate.1, m.version, m.start]))
                .collect(),
        )
        .to_string();
        sqlx::query(
            "WITH u (t, i, v, first) AS MATERIALIZED (
                SELECT value ->> 0, value ->> 1, value ->> 2, value ->> 3 FROM json_each(?2))
             UPDATE outbox_consumer_positions AS p
             SET version = u.v, pinned = 1, updated_at = ?3,
                 start_version = CASE WHEN p.pinned THEN p.start_version
                                      ELSE coalesce(p.start_version, u.first) END
             FROM u
             WHERE p.consumer_name = ?1 AND p.aggregate_type = u.t AND p.aggregate_id = u.i",
        )
        .bind(consumer)
        .bind(&moved_json)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        if !parked.is_empty() {
            let parked_json = serde_json::Value::Array(
                parked
                    .iter()
                    .map(|e| {
                        Ok(serde_json::json!([
                            e.id.to_string(),
                            e.aggregate_type,
                            e.aggregate_id,
                            e.aggregate_version,
                            serde_json::to_string(e)?,
                        ]))
                    })
                    .collect::<Result<Vec<_>, serde_json::Error>>()
                    .map_err(encode_error)?,
            )
            .to_string();
            sqlx::query(
                "INSERT INTO outbox_consumer_parked
                    (consumer_name, event_id, aggregate_type, aggregate_id, aggregate_version,
                     envelope, parked_at)
                 SELECT ?1, value ->> 0, value ->> 1, value ->> 2, value ->> 3, value ->> 4, ?3
                 FROM json_each(?2) WHERE true
                 ON CONFLICT DO NOTHING",
            )
            .bind(consumer)
            .bind(&parked_json)
            .bind(now)
            .execute(&mut *conn)
            .await?;
        }
        sqlx::query_as(concat!(
            "WITH u (t, i, v) AS MATERIALIZED (
                SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(?2))
             SELECT u.t, u.i FROM u
             WHERE ",
            successor_parked!("u.t", "u.i", "u.v", "?3")
        ))
        .bind(consumer)
        .bind(&moved_json)
        .bind(now)
        .fetch_all(conn)
        .await
    }

    /// One statement, on the caller's connection (committed on its own
    /// outside a transaction).
    async fn pin_first(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        aggregates: &[(&str, &str)],
    ) -> sqlx::Result<()> {
        let mut sorted = aggregates.to_vec();
        sorted.sort_unstable();
        sqlx::query(
            "INSERT INTO outbox_consumer_positions AS p
                (consumer_name, aggregate_type, aggregate_id, version, pinned, start_version, updated_at)
             SELECT ?1, value ->> 0, value ->> 1, 0, 1, 1, ?3 FROM json_each(?2) WHERE true
             ON CONFLICT (consumer_name, aggregate_type, aggregate_id)
             DO UPDATE SET pinned = 1, start_version = 1, updated_at = excluded.updated_at
             WHERE NOT p.pinned",
        )
        .bind(consumer)
        .bind(pairs_json(sorted))
        .bind(now_ms())
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn open_letter_at(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        aggregate: (&str, &str),
        version: i64,
    ) -> sqlx::Result<Option<(i64, String)>> {
        sqlx::query_as(
            "SELECT id, kind FROM outbox_dead_letters
             WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3
               AND aggregate_version = ?4 AND resolved_at IS NULL
             ORDER BY id LIMIT 1",
        )
        .bind(consumer)
        .bind(aggregate.0)
        .bind(aggregate.1)
        .bind(version)
        .fetch_optional(conn)
        .await
    }

    async fn advance_if_newer(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<bool> {
        let moved: Option<i64> = sqlx::query_scalar_with(
            "INSERT INTO outbox_consumer_positions AS p
                (consumer_name, aggregate_type, aggregate_id, version, pinned, updated_at)
             VALUES (?1, ?2, ?3, ?4, 1, ?5)
             ON CONFLICT (consumer_name, aggregate_type, aggregate_id)
             DO UPDATE SET version = excluded.version, updated_at = excluded.updated_at
             WHERE p.version < excluded.version
             RETURNING version",
            position_arguments(consumer, envelope)?,
        )
        .fetch_optional(conn)
        .await?;
        Ok(moved.is_some())
    }

    async fn lock_position(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> sqlx::Result<Position> {
        sqlx::query(
            "INSERT INTO outbox_consumer_positions
                (consumer_name, aggregate_type, aggregate_id, version, pinned, updated_at)
             VALUES (?1, ?2, ?3, 0, 0, ?4)
             ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(aggregate_type)
        .bind(aggregate_id)
        .bind(now_ms())
        .execute(&mut *conn)
        .await?;
        let row = sqlx::query(
            "SELECT version, pinned, start_version FROM outbox_consumer_positions
             WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3",
        )
        .bind(consumer)
        .bind(aggregate_type)
        .bind(aggregate_id)
        .fetch_one(conn)
        .await?;
        position_from_row(&row)
    }

    /// Inside `BEGIN IMMEDIATE` nobody else holds the position: read it.
    async fn try_lock_position(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> sqlx::Result<Option<Position>> {
        let row = sqlx::query(
            "SELECT version, pinned, start_version FROM outbox_consumer_positions
             WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3",
        )
        .bind(consumer)
        .bind(aggregate_type)
        .bind(aggregate_id)
        .fetch_optional(conn)
        .await?;
        row.as_ref().map(position_from_row).transpose()
    }

    async fn baseline(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        aggregate: (&str, &str),
    ) -> sqlx::Result<Option<(i64, bool)>> {
        let lowest: Option<i64> = sqlx::query_scalar(
            "SELECT min(v) FROM (
                SELECT aggregate_version AS v FROM outbox_consumer_parked
                WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3
                UNION ALL
                SELECT aggregate_version FROM outbox_dead_letters
                WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3
                  AND resolved_at IS NULL AND aggregate_version IS NOT NULL)",
        )
        .bind(consumer)
        .bind(aggregate.0)
        .bind(aggregate.1)
        .fetch_one(&mut *conn)
        .await?;
        let Some(lowest) = lowest else {
            return Ok(None);
        };
        let started = sqlx::query(
            "UPDATE outbox_consumer_positions
             SET version = ?4 - 1, pinned = 1, start_version = ?4, updated_at = ?5
             WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3 AND NOT pinned",
        )
        .bind(consumer)
        .bind(aggregate.0)
        .bind(aggregate.1)
        .bind(lowest)
        .bind(now_ms())
        .execute(&mut *conn)
        .await?;
        if started.rows_affected() == 0 {
            return Ok(None);
        }
        let parked: bool = sqlx::query_scalar(
            "SELECT EXISTS (
                SELECT 1 FROM outbox_consumer_parked
                WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3
                  AND aggregate_version = ?4)",
        )
        .bind(consumer)
        .bind(aggregate.0)
        .bind(aggregate.1)
        .bind(lowest)
        .fetch_one(conn)
        .await?;
        Ok(Some((lowest - 1, parked)))
    }

    async fn set_position(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<()> {
        sqlx::query_with(SET_POSITION, position_arguments(consumer, envelope)?)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn park(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        envelope: &Envelope,
    ) -> sqlx::Result<()> {
        let json = serde_json::to_string(envelope).map_err(encode_error)?;
        sqlx::query(
            "INSERT INTO outbox_consumer_parked
                (consumer_name, event_id, aggregate_type, aggregate_id, aggregate_version, envelope,
                 parked_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(envelope.id.to_string())
        .bind(&envelope.aggregate_type)
        .bind(&envelope.aggregate_id)
        .bind(envelope.aggregate_version)
        .bind(json)
        .bind(now_ms())
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn start_parked(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        aggregate: (&str, &str),
        version: i64,
        lease: Duration,
    ) -> sqlx::Result<Option<Result<ParkedMessage, serde_json::Error>>> {
        let now = now_ms();
        let row: Option<(String, i64)> = sqlx::query_as(
            "UPDATE outbox_consumer_parked
             SET attempts = attempts + 1, retry_at = ?5
             WHERE consumer_name = ?1 AND event_id = (
                 SELECT event_id FROM outbox_consumer_parked
                 WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3
                   AND aggregate_version = ?4 AND (retry_at IS NULL OR retry_at <= ?6)
                 ORDER BY parked_at LIMIT 1)
             RETURNING envelope, attempts",
        )
        .bind(consumer)
        .bind(aggregate.0)
        .bind(aggregate.1)
        .bind(version)
        .bind(now.saturating_add(millis(lease)))
        .bind(now)
        .fetch_optional(conn)
        .await?;
        Ok(row.map(|(json, attempts)| {
            serde_json::from_str(&json).map(|envelope| ParkedMessage {
                envelope,
                attempts: attempts.clamp(1, i64::from(u32::MAX)) as u32,
            })
        }))
    }

    async fn lock_parked(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<bool> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM outbox_consumer_parked
                            WHERE consumer_name = ?1 AND event_id = ?2)",
        )
        .bind(consumer)
        .bind(event_id.to_string())
        .fetch_one(conn)
        .await
    }

    async fn unpark_through(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        aggregate: (&str, &str),
        version: i64,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "DELETE FROM outbox_consumer_parked
             WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3
               AND aggregate_version <= ?4",
        )
        .bind(consumer)
        .bind(aggregate.0)
        .bind(aggregate.1)
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
        conn: &mut SqliteConnection,
        consumer: &str,
        aggregate: (&str, &str),
        position: i64,
        timeout_secs: f64,
        reason: &str,
    ) -> sqlx::Result<u64> {
        let now = now_ms();
        let cutoff = now.saturating_sub((timeout_secs * 1000.0) as i64);
        let due: bool = sqlx::query_scalar(
            "SELECT count(*) > 0 AND min(parked_at) < ?5
                    AND NOT max(aggregate_version = ?4 + 1)
                    AND NOT EXISTS (
                        SELECT 1 FROM outbox_consumer_attempts a
                        WHERE a.consumer_name = ?1 AND a.aggregate_type = ?2 AND a.aggregate_id = ?3
                          AND a.aggregate_version = ?4 + 1 AND a.retry_at > ?5)
             FROM outbox_consumer_parked
             WHERE consumer_name = ?1 AND aggregate_type = ?2 AND aggregate_id = ?3",
        )
        .bind(consumer)
        .bind(aggregate.0)
        .bind(aggregate.1)
        .bind(position)
        .bind(cutoff)
        .fetch_one(&mut *conn)
        .await?;
        if !due {
            return Ok(0);
        }
        Self::letter_parked_rows(conn, consumer, aggregate, reason).await
    }

    async fn unpark(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        event_id: Uuid,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "DELETE FROM outbox_consumer_parked WHERE consumer_name = ?1 AND event_id = ?2",
        )
        .bind(consumer)
        .bind(event_id.to_string())
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn parked_failed(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        event_id: Uuid,
        error: &str,
        retry_in: Duration,
    ) -> sqlx::Result<bool> {
        let attempts: Option<i64> = sqlx::query_scalar(
            "UPDATE outbox_consumer_parked SET last_error = ?3, retry_at = ?4
             WHERE consumer_name = ?1 AND event_id = ?2 RETURNING attempts",
        )
        .bind(consumer)
        .bind(event_id.to_string())
        .bind(error)
        .bind(now_ms().saturating_add(millis(retry_in)))
        .fetch_optional(conn)
        .await?;
        Ok(attempts.is_some())
    }

    async fn ready_parked(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
    ) -> sqlx::Result<Vec<(String, String)>> {
        sqlx::query_as(
            "SELECT DISTINCT k.aggregate_type, k.aggregate_id
             FROM outbox_consumer_parked k
             LEFT JOIN outbox_consumer_positions p
               ON p.consumer_name = k.consumer_name AND p.aggregate_type = k.aggregate_type
              AND p.aggregate_id = k.aggregate_id
             WHERE k.consumer_name = ?1 AND k.aggregate_version = coalesce(p.version, 0) + 1
               AND (k.retry_at IS NULL OR k.retry_at <= ?2)
             LIMIT 1000",
        )
        .bind(consumer)
        .bind(now_ms())
        .fetch_all(conn)
        .await
    }

    async fn expired_parked(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        timeout_secs: f64,
    ) -> sqlx::Result<Vec<ExpiredAggregate>> {
        let cutoff = now_ms().saturating_sub((timeout_secs * 1000.0) as i64);
        let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(
            "SELECT k.aggregate_type, k.aggregate_id, coalesce(max(p.version), 0),
                    min(k.aggregate_version)
             FROM outbox_consumer_parked k
             LEFT JOIN outbox_consumer_positions p
               ON p.consumer_name = k.consumer_name AND p.aggregate_type = k.aggregate_type
              AND p.aggregate_id = k.aggregate_id
             WHERE k.consumer_name = ?1
             GROUP BY k.aggregate_type, k.aggregate_id
             HAVING min(k.parked_at) < ?2
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
        conn: &mut SqliteConnection,
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
        conn: &mut SqliteConnection,
        consumer: &str,
        letter: &Letter<'_>,
    ) -> sqlx::Result<bool> {
        let envelope = letter.envelope;
        let done = sqlx::query(
            "INSERT INTO outbox_dead_letters
                (consumer_name, kind, event_id, event_type, schema_version, aggregate_type,
                 aggregate_id, aggregate_version, headers, payload, reason, attempts, created_at)
             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13
             WHERE ?3 IS NULL OR NOT EXISTS (
                 SELECT 1 FROM outbox_processed_events WHERE consumer_name = ?1 AND event_id = ?3)
             ON CONFLICT DO NOTHING",
        )
        .bind(consumer)
        .bind(letter.kind.as_str())
        .bind(envelope.map(|e| e.id.to_string()))
        .bind(envelope.map(|e| e.event_type.as_str()))
        .bind(envelope.map(|e| i64::from(e.schema_version)))
        .bind(envelope.map(|e| e.aggregate_type.as_str()))
        .bind(envelope.map(|e| e.aggregate_id.as_str()))
        .bind(envelope.map(|e| e.aggregate_version))
        .bind(letter.headers.to_string())
        .bind(letter.payload)
        .bind(letter.reason)
        .bind(i64::from(letter.attempts))
        .bind(now_ms())
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn lock_letter(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        letter_id: i64,
    ) -> sqlx::Result<Option<StoredLetter>> {
        let row: Option<(String, Vec<u8>)> = sqlx::query_as(
            "SELECT headers, payload FROM outbox_dead_letters
             WHERE id = ?1 AND consumer_name = ?2 AND resolved_at IS NULL",
        )
        .bind(letter_id)
        .bind(consumer)
        .fetch_optional(conn)
        .await?;
        Ok(row.map(|(headers, payload)| StoredLetter { headers, payload }))
    }

    async fn requested_replays(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
    ) -> sqlx::Result<Vec<i64>> {
        sqlx::query_scalar(
            "SELECT id FROM outbox_dead_letters
             WHERE consumer_name = ?1 AND replay_requested_at IS NOT NULL AND resolved_at IS NULL
             ORDER BY id LIMIT 100",
        )
        .bind(consumer)
        .fetch_all(conn)
        .await
    }

    async fn take_replay_request(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        letter_id: i64,
    ) -> sqlx::Result<Option<Option<i64>>> {
        sqlx::query_scalar(
            "UPDATE outbox_dead_letters SET replay_requested_at = NULL
             WHERE id = ?1 AND consumer_name = ?2
               AND replay_requested_at IS NOT NULL AND resolved_at IS NULL
             RETURNING replay_audit_id",
        )
        .bind(letter_id)
        .bind(consumer)
        .fetch_optional(conn)
        .await
    }

    async fn resolve_letter(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        letter_id: i64,
        resolution: &str,
    ) -> sqlx::Result<bool> {
        let done = sqlx::query(
            "UPDATE outbox_dead_letters
             SET resolved_at = ?4, resolution = ?3, replays = replays + 1
             WHERE id = ?1 AND consumer_name = ?2 AND resolved_at IS NULL",
        )
        .bind(letter_id)
        .bind(consumer)
        .bind(resolution)
        .bind(now_ms())
        .execute(conn)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    async fn letter_replay_failed(
        &self,
        conn: &mut SqliteConnection,
        consumer: &str,
        letter_id: i64,
        error: &str,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "UPDATE outbox_dead_letters SET replays = replays + 1, last_replay_error = ?3
             WHERE id = ?1 AND consumer_name = ?2 AND resolved_at IS NULL",
        )
        .bind(letter_id)
        .bind(consumer)
        .bind(error)
        .execute(conn)
        .await?;
        Ok(())
    }

    /// Added up across the instances; the lag is the one of the most
    /// recently applied event.
    async fn flush_stats(
        &self,
        consumer: &str,
        applied: i64,
        duplicates: i64,
        last_applied_at: Option<DateTime<Utc>>,
        lag_seconds: Option<f64>,
    ) -> sqlx::Result<()> {
        sqlx::query(
            "INSERT INTO outbox_consumer_stats AS t
                (consumer_name, applied, duplicates, last_applied_at, lag_seconds, updated_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (consumer_name) DO UPDATE SET
                applied = t.applied + excluded.applied,
                duplicates = t.duplicates + excluded.duplicates,
                lag_seconds = CASE
                    WHEN excluded.last_applied_at >= coalesce(t.last_applied_at, excluded.last_applied_at)
                    THEN excluded.lag_seconds ELSE t.lag_seconds END,
                last_applied_at = max(coalesce(t.last_applied_at, excluded.last_applied_at),
                                      coalesce(excluded.last_applied_at, t.last_applied_at)),
                updated_at = excluded.updated_at",
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
        conn: &mut SqliteConnection,
        request: &RepairRequest,
        action: &str,
        target: &str,
        ids: &[String],
    ) -> sqlx::Result<i64> {
        let ids = serde_json::to_string(ids).map_err(encode_error)?;
        crate::ops::audit_row::insert_audit(conn, request, action, target, &ids).await
    }

    /// Appends to the row's outcomes array (an empty one when it has none).
    async fn audit_append(
        &self,
        conn: &mut SqliteConnection,
        audit_id: i64,
        outcomes: &serde_json::Value,
    ) -> sqlx::Result<()> {
        let stored: Option<Option<String>> =
            sqlx::query_scalar("SELECT outcomes FROM outbox_audit WHERE id = ?1")
                .bind(audit_id)
                .fetch_optional(&mut *conn)
                .await?;
        let Some(stored) = stored else {
            return Ok(());
        };
        let all = outbox_core::audit::appended_outcomes(stored.as_deref(), outcomes)
            .map_err(|error| sqlx::Error::Decode(error.into()))?;
        sqlx::query("UPDATE outbox_audit SET outcomes = ?2 WHERE id = ?1")
            .bind(audit_id)
            .bind(all)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn audit_finish(
        &self,
        conn: &mut SqliteConnection,
        audit_id: i64,
        outcomes: &serde_json::Value,
    ) -> sqlx::Result<()> {
        sqlx::query("UPDATE outbox_audit SET outcomes = ?2 WHERE id = ?1")
            .bind(audit_id)
            .bind(outcomes.to_string())
            .execute(conn)
            .await?;
        Ok(())
    }
}
