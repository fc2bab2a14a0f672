//! SQLite store for outbox: the transactional outbox on one file, with no
//! server.
//!
//! - [`SqliteOutbox::emit`] inserts an event in the caller's own SQLite
//!   transaction, so the business change and the event commit together or
//!   not at all (start the transaction with `BEGIN IMMEDIATE`:
//!   `pool.begin_with("BEGIN IMMEDIATE")`, see [`SqliteOutbox`]).
//! - [`SqliteRelayStore`] is the relay's store seam
//!   ([`outbox_core::relay::RelayStore`]): a claim is one
//!   `UPDATE … RETURNING` in `BEGIN IMMEDIATE` that leases the events to one
//!   relay worker (a lease token and an expiry column); a crashed worker's
//!   lease runs out and its events are claimed again. Per-aggregate order
//!   holds across any number of relays in any number of processes on one
//!   file. [`start_relay`] starts the relay loop of `outbox-core` over it,
//!   with backoff, the failed state, blocked aggregates and the wake-up.
//! - [`SqliteOps`] is the operations API over the file
//!   ([`outbox_core::ops::OperationsStore`]): the status and its problems,
//!   listings with filters and pages (payloads redacted), the audit log,
//!   retention, and repairs of what the relay could not publish (retry or
//!   skip a failed head, retry a blocked one now, publish again), by id,
//!   with a reason and an audit row; and the consumer's side
//!   ([`outbox_core::ops::LetterStore`]): letters, positions and replay
//!   requests. The `outbox` CLI and the console run on it with
//!   `--database-url sqlite://…`.
//! - [`connect`] opens a pool with the settings the guarantees rest on
//!   (WAL, `synchronous = FULL`, a busy timeout); [`migrate`] creates the
//!   tables.
//!
//! ```no_run
//! # use outbox_core::OutboxEvent;
//! # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, OutboxEvent)]
//! # #[outbox(event_type = "doc.note_added", version = 1, aggregate = "note")]
//! # struct NoteAdded { #[outbox(aggregate_id)] note_id: String }
//! # async fn example(transport: impl outbox_core::transport::Transport) -> Result<(), Box<dyn std::error::Error>> {
//! use sqlx::Connection;
//!
//! let pool = outbox_sqlite::connect("sqlite://app.db").await?;
//! outbox_sqlite::migrate(&pool).await?;
//! let outbox = outbox_sqlite::SqliteOutbox::new();
//!
//! let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
//! sqlx::query("CREATE TABLE IF NOT EXISTS notes (id TEXT PRIMARY KEY)").execute(&mut *tx).await?;
//! sqlx::query("INSERT INTO notes (id) VALUES ('n-1')").execute(&mut *tx).await?;
//! outbox.emit(&mut tx, &NoteAdded { note_id: "n-1".into() }).await?;
//! tx.commit().await?;
//!
//! let relay = outbox_sqlite::start_relay(pool, transport, Default::default()).await?;
//! # relay.drain(std::time::Duration::from_secs(5)).await?;
//! # Ok(()) }
//! ```
//!
//! - [`SqliteConsumerStore`] is the consumer's store seam
//!   ([`outbox_core::consumer::store::ConsumerStore`]): the inbox, the
//!   ordering policies' positions and parked messages, quarantine, dead
//!   letters, replays and counts, each consumer transaction in `BEGIN
//!   IMMEDIATE`. Handlers receive `&mut SqliteConnection`; build the
//!   consumer with `ConsumerBuilder::for_connection(name) …
//!   .build_on(SqliteConsumerStore::new(pool))`.

mod connect;
mod consumer;
mod emit;
mod migrate;
mod ops;
mod relay;
mod wakeup;

pub use connect::{DEFAULT_BUSY_TIMEOUT, connect, connect_options};
pub use consumer::SqliteConsumerStore;
pub use emit::SqliteOutbox;
pub use migrate::{MigrateError, SCHEMA_VERSION, migrate};
pub use ops::SqliteOps;
pub use relay::{SqliteClaim, SqliteRelayStore, SqliteWakeups, start_relay};

pub(crate) use outbox_core::store::columns::{
    millis, now_ms, optional_time_column, time_column, uuid_column,
};
