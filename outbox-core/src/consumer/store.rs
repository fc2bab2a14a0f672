//! The consumer's store seam: everything the consumer engine (the inbox,
//! the ordering policies, parking, letters, replays, stats) asks of a
//! database, as one trait.
//!
//! The engine in this module decides; a [`ConsumerStore`] only reads and
//! writes. Every method that takes a connection runs inside the consumer's
//! transaction (the one the handler receives) or, where it says so, on a
//! connection of its own, so a store keeps the engine's guarantee that an
//! event's inbox row, its position and its handler's effects commit
//! together. Handlers receive the store's connection type
//! ([`StoreConnection`]): `&mut PgConnection` on PostgreSQL.
//!
//! What a store must give each call is written on the method. Where the
//! PostgreSQL store locks a row (`FOR UPDATE`, `SKIP LOCKED`), another
//! store gives the same exclusion its own way (a single-writer database's
//! write transaction holds every row at once).

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Database;
use sqlx::pool::PoolConnection;
use uuid::Uuid;

use super::handler::HandlerError;
use super::incoming::Incoming;
use crate::audit::RepairRequest;
use crate::envelope::Envelope;

/// The connection type a store's transactions deref to, and handlers
/// receive.
pub type StoreConnection<S> = <<S as ConsumerStore>::Db as Database>::Connection;

/// What [`ConsumerStore::commit_checked`] did with a handler's transaction.
#[derive(Debug)]
pub enum CheckedCommit<DB: Database> {
    /// The transaction was intact and is committed.
    Committed,
    /// The handler left the transaction failed or ended it itself: not
    /// committed; the transaction comes back for the engine to roll back.
    HandlerFailed(sqlx::Transaction<'static, DB>, HandlerError),
}

/// What a letter records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LetterKind {
    /// The message could not be read (unknown type, newer version, bad payload).
    Quarantined,
    /// The handler kept failing.
    DeadLettered,
}

impl LetterKind {
    /// The stored name: `quarantined` or `dead_lettered`.
    pub fn as_str(self) -> &'static str {
        match self {
            LetterKind::Quarantined => "quarantined",
            LetterKind::DeadLettered => "dead_lettered",
        }
    }
}

/// A quarantine or dead-letter row to write.
#[derive(Debug, Clone)]
pub struct Letter<'a> {
    /// Quarantined or dead-lettered.
    pub kind: LetterKind,
    /// The envelope, when the message could be read as one.
    pub envelope: Option<&'a Envelope>,
    /// The message's attributes as a JSON object.
    pub headers: serde_json::Value,
    /// The raw payload.
    pub payload: &'a [u8],
    /// Why (already scrubbed of redacted values).
    pub reason: &'a str,
    /// Deliveries so far.
    pub attempts: u32,
}

/// A parked message (strict ordering), taken to run.
#[derive(Debug)]
pub struct ParkedMessage {
    /// The message.
    pub envelope: Envelope,
    /// Its handler starts, this one included (at least 1).
    pub attempts: u32,
}

/// A strict position as read under its lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    /// The last applied version (0: none).
    pub version: i64,
    /// Whether the aggregate's start is fixed (a handler was started on
    /// it, or a letter holds its first version).
    pub pinned: bool,
    /// The version the aggregate started at, when known.
    pub start_version: Option<i64>,
}

impl Position {
    /// A position created for an aggregate's first message: at 0, not pinned.
    pub const NEW: Position = Position {
        version: 0,
        pinned: false,
        start_version: None,
    };
}

/// What a strict claim of one message did with its aggregate's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrictClaim {
    /// The message is the next version: the position moved to it (with
    /// the handler's transaction), and whether its successor waits parked.
    Advanced {
        /// The next version waits parked.
        successor_parked: bool,
    },
    /// The position, locked, for the ordering decision (stale, a gap, or
    /// the aggregate's first message).
    Locked(Position),
}

/// A position a batch moved (or pinned): its new version, and the start to
/// keep when the aggregate was not started before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovedPosition {
    /// (aggregate type, aggregate id).
    pub aggregate: (String, String),
    /// The new position.
    pub version: i64,
    /// The start to record if the aggregate had none.
    pub start: i64,
}

/// An open letter read back for a replay.
#[derive(Debug, Clone)]
pub struct StoredLetter {
    /// The message's attributes as a JSON object (text).
    pub headers: String,
    /// The raw payload.
    pub payload: Vec<u8>,
}

/// An aggregate whose parked messages waited past the park timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpiredAggregate {
    /// Aggregate type.
    pub aggregate_type: String,
    /// Aggregate id.
    pub aggregate_id: String,
    /// Its position (0: never started).
    pub position: i64,
    /// The lowest parked version.
    pub first_parked: i64,
}

/// The parts of a letter for a parked message moved to the dead letters,
/// from the envelope JSON the store kept: its headers (the CloudEvents
/// attributes it arrived with), its payload bytes and the envelope. Text
/// that no longer reads as an envelope is kept whole as the payload, with
/// no headers.
pub fn parked_letter_parts(envelope_json: &str) -> (serde_json::Value, Vec<u8>, Option<Envelope>) {
    let Ok(envelope) = serde_json::from_str::<Envelope>(envelope_json) else {
        return (
            serde_json::json!({}),
            envelope_json.as_bytes().to_vec(),
            None,
        );
    };
    let mut headers = serde_json::Map::new();
    let mut put = |key: &str, value: String| {
        headers.insert(key.to_owned(), serde_json::Value::String(value));
    };
    put("specversion", "1.0".into());
    put("id", envelope.id.to_string());
    put("type", envelope.event_type.clone());
    put("schemaversion", envelope.schema_version.to_string());
    put("aggregatetype", envelope.aggregate_type.clone());
    put("aggregateid", envelope.aggregate_id.clone());
    put("aggregateversion", envelope.aggregate_version.to_string());
    put(
        "time",
        envelope
            .occurred_at
            .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
    );
    if let Some(traceparent) = &envelope.traceparent {
        put("traceparent", traceparent.clone());
    }
    let payload = envelope.payload.get().as_bytes().to_vec();
    (serde_json::Value::Object(headers), payload, Some(envelope))
}

/// The store a consumer keeps its inbox, positions, parked messages,
/// letters, replay requests and counts in.
///
/// `Send` futures throughout (the consumer runs in spawned tasks). Every
/// `consumer` argument is the consumer's validated name; stores bind it
/// as a parameter.
pub trait ConsumerStore: Send + Sync + 'static {
    /// The sqlx database; handlers receive `&mut` its connection type.
    type Db: Database;

    /// Why this store cannot keep the message `incoming`, read as
    /// `envelope`, in its tables (a column shorter than a value, a
    /// character a column type cannot hold), or `None`. The engine
    /// quarantines such a message with its envelope left off (its raw
    /// attributes and payload are kept) instead of failing on it at every
    /// delivery.
    fn refuses(&self, incoming: &Incoming, envelope: &Envelope) -> Option<String> {
        let _ = (incoming, envelope);
        None
    }

    /// Whether `error`, from a statement the engine ran after a handler
    /// returned `Ok`, says the handler left the transaction failed (it
    /// caught a statement's error and went on): a failed attempt, not a
    /// database error. PostgreSQL answers SQLSTATE 25P02; by default no
    /// error is such an answer (SQLite and MySQL let a transaction go on
    /// after a failed statement).
    fn is_failed_transaction(&self, error: &sqlx::Error) -> bool {
        let _ = error;
        false
    }

    /// Begins a transaction for one message. Statements in it should be
    /// cut off after `handler_timeout` where the database can do that
    /// (PostgreSQL: `SET LOCAL statement_timeout`), so a handler stopped by
    /// its timeout does not leave a statement running.
    fn begin(
        &self,
        handler_timeout: Duration,
    ) -> impl Future<Output = sqlx::Result<sqlx::Transaction<'static, Self::Db>>> + Send;

    /// Begins a transaction for a batch (as [`begin`](Self::begin); a
    /// store may prepare the batch's own statements differently until
    /// [`settle_batch`](Self::settle_batch)).
    fn begin_batch(
        &self,
        handler_timeout: Duration,
    ) -> impl Future<Output = sqlx::Result<sqlx::Transaction<'static, Self::Db>>> + Send;

    /// A connection outside any transaction (each statement commits on its own).
    fn acquire(&self) -> impl Future<Output = sqlx::Result<PoolConnection<Self::Db>>> + Send;

    /// Whether the transaction can still commit what the handler did: a
    /// handler that caught a statement error and returned `Ok` may have
    /// left it failed, and a commit would then drop its effects silently;
    /// a handler that ended the consumer's transaction itself (`ROLLBACK`
    /// or `COMMIT` on the connection it was given) has separated its
    /// effects from the inbox row and the position. Either is a failed
    /// attempt ([`HANDLER_ENDED_TRANSACTION`](super::HANDLER_ENDED_TRANSACTION)
    /// for the second).
    fn transaction_intact(
        &self,
        conn: &mut StoreConnection<Self>,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;

    /// Checks the transaction as [`transaction_intact`](Self::transaction_intact)
    /// does and, when it is intact, commits it. A failed check is a failed
    /// handler attempt, whatever the check's error (as with
    /// `transaction_intact`), and hands the transaction back
    /// ([`CheckedCommit::HandlerFailed`]) for the engine to roll back or
    /// record a retry in; an `Err` is a database error of the commit. The
    /// default runs the check, then `COMMIT`; a store whose database takes
    /// several statements in one round trip may send both at once
    /// (PostgreSQL's store does): a round trip the one-message path would
    /// pay per message.
    fn commit_checked(
        &self,
        mut tx: sqlx::Transaction<'static, Self::Db>,
    ) -> impl Future<Output = sqlx::Result<CheckedCommit<Self::Db>>> + Send {
        async move {
            if let Err(error) = self.transaction_intact(&mut tx).await {
                return Ok(CheckedCommit::HandlerFailed(tx, error));
            }
            tx.commit().await?;
            Ok(CheckedCommit::Committed)
        }
    }

    /// Counts a handler start of a redelivered message (its own
    /// connection, committed before the handler runs); returns the start
    /// number (2 for the first redelivery).
    fn count_start(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        event_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<u32>> + Send;

    /// Strict: ends a failed handler start that will be retried. Rolls
    /// `tx` back (the handler's effects, the inbox row, the position) and
    /// records, durably, that `envelope`'s message comes back after
    /// `retry_in`, so that a transaction that takes the aggregate's
    /// position next (another instance's sweep) finds the predecessor on
    /// its way and keeps the successors waiting for it. PostgreSQL commits
    /// the record on a connection of its own before the rollback lets go of
    /// the position lock; a single-writer store cannot write on a second
    /// connection while `tx` holds the write lock, so it rolls back to the
    /// start of the message and commits the record in `tx` instead.
    fn roll_back_for_retry(
        &self,
        tx: sqlx::Transaction<'static, Self::Db>,
        consumer: &str,
        envelope: &Envelope,
        retry_in: Duration,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Drops the start count of a settled message.
    fn forget_starts(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        event_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Removes the inbox row of an event that is not applied after all (a
    /// parked message that goes to the quarantine or the dead letters).
    fn forget_processed(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        event_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Records `event_id` in the inbox; false when it was there already,
    /// or an open letter holds the event.
    fn claim_one(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        event_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Records `event_id` for a replay of its open letter; false when the
    /// consumer applied it already.
    fn claim_replay(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        event_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Records many event ids (one round trip where the database allows);
    /// returns those that were new (not there, no open letter).
    fn claim_many(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        event_ids: &[Uuid],
    ) -> impl Future<Output = sqlx::Result<Vec<Uuid>>> + Send;

    /// Locks the positions of `aggregates` (sorted, distinct) until the
    /// transaction ends and returns them, creating missing ones as
    /// [`Position::NEW`].
    fn lock_positions(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        aggregates: &[(String, String)],
    ) -> impl Future<Output = sqlx::Result<Vec<((String, String), Position)>>> + Send;

    /// Strict, one message: records the event in the inbox and, when it is
    /// new, either moves its aggregate's position to it (it is the next
    /// version) or locks and returns the position for the ordering
    /// decision (created as [`Position::NEW`] for the aggregate's first
    /// message); `None` for a duplicate (or an event an open letter holds).
    fn claim_strict(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        envelope: &Envelope,
    ) -> impl Future<Output = sqlx::Result<Option<StrictClaim>>> + Send;

    /// RejectStale, one message: records the event in the inbox and, when
    /// it is new, moves the position if the message is newer; `None` for
    /// a duplicate, `Some(moved)` otherwise.
    fn claim_stale(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        envelope: &Envelope,
    ) -> impl Future<Output = sqlx::Result<Option<bool>>> + Send;

    /// Strict, after a handler: moves the locked position to the
    /// envelope's version; true when the next version waits parked.
    fn settle_strict(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        envelope: &Envelope,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Batch mode, before the handlers: writes the moved positions (with
    /// their start where none was kept) and the parked messages; returns
    /// the moved aggregates whose next version waits parked.
    fn settle_batch(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        moved: &[MovedPosition],
        parked: &[Envelope],
    ) -> impl Future<Output = sqlx::Result<Vec<(String, String)>>> + Send;

    /// Strict: fixes the start of the never-started ones among
    /// `aggregates` at version 1 (committed before a handler starts on a
    /// version 1, or with the letter for one).
    fn pin_first(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        aggregates: &[(&str, &str)],
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// The open letter (id, kind) that holds `version` of an aggregate.
    fn open_letter_at(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        aggregate: (&str, &str),
        version: i64,
    ) -> impl Future<Output = sqlx::Result<Option<(i64, String)>>> + Send;

    /// RejectStale: moves the position to the envelope's version when it
    /// is newer (creating it); false when the message is stale.
    fn advance_if_newer(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        envelope: &Envelope,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Strict: locks the aggregate's position (creating it as
    /// [`Position::NEW`]) and returns it.
    fn lock_position(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> impl Future<Output = sqlx::Result<Position>> + Send;

    /// Strict, the sweep: locks and returns the aggregate's position
    /// without waiting; `None` when another transaction holds it (or there
    /// is none).
    fn try_lock_position(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        aggregate_type: &str,
        aggregate_id: &str,
    ) -> impl Future<Output = sqlx::Result<Option<Position>>> + Send;

    /// Strict: starts a never-started aggregate just before its lowest
    /// version seen (parked or lettered); the new position and whether
    /// that version is parked, or `None` when it was pinned meanwhile or
    /// nothing is there.
    fn baseline(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        aggregate: (&str, &str),
    ) -> impl Future<Output = sqlx::Result<Option<(i64, bool)>>> + Send;

    /// Strict: sets the locked position to the envelope's version.
    fn set_position(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        envelope: &Envelope,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Strict: keeps a message that came ahead of a gap.
    fn park(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        envelope: &Envelope,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Strict: takes the parked message with `version` of an aggregate, if
    /// any and not waiting for its backoff or another instance's lease,
    /// counts its start and leases it to the caller for `lease`; an
    /// envelope that no longer decodes is the inner error.
    fn start_parked(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        aggregate: (&str, &str),
        version: i64,
        lease: Duration,
    ) -> impl Future<Output = sqlx::Result<Option<Result<ParkedMessage, serde_json::Error>>>> + Send;

    /// Strict: locks a parked message; false when it is gone.
    fn lock_parked(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        event_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Strict: removes the parked messages of an aggregate up to `version`.
    fn unpark_through(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        aggregate: (&str, &str),
        version: i64,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Strict: moves an aggregate's parked messages to the dead letters
    /// with `reason` if it still waits for `position + 1` past
    /// `timeout_secs`; returns how many.
    fn expire_parked(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        aggregate: (&str, &str),
        position: i64,
        timeout_secs: f64,
        reason: &str,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;

    /// Strict: removes a parked message once handled.
    fn unpark(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        event_id: Uuid,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Strict: records the last error of a parked message and when it may
    /// start again; false when the message is no longer parked.
    fn parked_failed(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        event_id: Uuid,
        error: &str,
        retry_in: Duration,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Strict: aggregates whose next version waits parked.
    fn ready_parked(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
    ) -> impl Future<Output = sqlx::Result<Vec<(String, String)>>> + Send;

    /// Strict: aggregates parked longer than `timeout_secs`.
    fn expired_parked(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        timeout_secs: f64,
    ) -> impl Future<Output = sqlx::Result<Vec<ExpiredAggregate>>> + Send;

    /// Strict: moves every parked message of an aggregate to the dead
    /// letters with `reason`; returns how many.
    fn dead_letter_parked(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        aggregate: (&str, &str),
        reason: &str,
    ) -> impl Future<Output = sqlx::Result<u64>> + Send;

    /// Writes a quarantine or dead-letter row; false when nothing was
    /// written because the consumer applied the event already or an open
    /// letter for it exists.
    fn letter(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        letter: &Letter<'_>,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Replay: locks an open letter of `consumer` and returns it; `None`
    /// when there is no such open letter.
    fn lock_letter(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        letter_id: i64,
    ) -> impl Future<Output = sqlx::Result<Option<StoredLetter>>> + Send;

    /// Open letters of `consumer` with a replay request.
    fn requested_replays(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
    ) -> impl Future<Output = sqlx::Result<Vec<i64>>> + Send;

    /// Takes a replay request (once, of all instances): the audit row it
    /// names (`Some(None)` for a request without one), or `None` when
    /// another instance took it or the letter was closed.
    fn take_replay_request(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        letter_id: i64,
    ) -> impl Future<Output = sqlx::Result<Option<Option<i64>>>> + Send;

    /// Replay: closes a letter with `resolution`; false when it was not
    /// open any more.
    fn resolve_letter(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        letter_id: i64,
        resolution: &str,
    ) -> impl Future<Output = sqlx::Result<bool>> + Send;

    /// Replay: counts a replay that did not settle the letter, with why.
    fn letter_replay_failed(
        &self,
        conn: &mut StoreConnection<Self>,
        consumer: &str,
        letter_id: i64,
        error: &str,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Adds a consumer's counts since its last flush (own connection).
    fn flush_stats(
        &self,
        consumer: &str,
        applied: i64,
        duplicates: i64,
        last_applied_at: Option<DateTime<Utc>>,
        lag_seconds: Option<f64>,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Writes the audit row of a repair before it runs; returns its id.
    fn audit_begin(
        &self,
        conn: &mut StoreConnection<Self>,
        request: &RepairRequest,
        action: &str,
        target: &str,
        ids: &[String],
    ) -> impl Future<Output = sqlx::Result<i64>> + Send;

    /// Adds outcomes (a JSON array) to an audit row.
    fn audit_append(
        &self,
        conn: &mut StoreConnection<Self>,
        audit_id: i64,
        outcomes: &serde_json::Value,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;

    /// Completes an audit row with the outcomes of every id.
    fn audit_finish(
        &self,
        conn: &mut StoreConnection<Self>,
        audit_id: i64,
        outcomes: &serde_json::Value,
    ) -> impl Future<Output = sqlx::Result<()>> + Send;
}
