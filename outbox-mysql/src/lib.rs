//! MySQL and MariaDB store for outbox: the transactional outbox on MySQL
//! ≥ 8.0.1 or MariaDB ≥ 10.6 (the first releases with `SKIP LOCKED`).
//!
//! - [`MySqlOutbox::emit`] inserts an event in the caller's own
//!   transaction (`&mut MySqlConnection`), with the next version from a
//!   per-aggregate counter row (locked until the caller commits, so
//!   versions follow commit order) or the version the contract carries.
//! - [`MySqlRelayStore`] is the relay's store seam
//!   ([`outbox_core::relay::RelayStore`]). A claim is a short READ
//!   COMMITTED transaction: it locks the heads of aggregates (an event with
//!   nothing unpublished before it) with `FOR UPDATE SKIP LOCKED`, extends
//!   each with the versions after it, and leases the rows with a token and
//!   an expiry; it commits before anything is published. A relay only ever
//!   starts an aggregate at its head, so two relays, in any processes,
//!   never publish one aggregate at once; the outcome is written only
//!   where the token still stands (a fence). READ COMMITTED takes no gap
//!   locks, so producers inserting during a claim do not wait for it.
//! - [`MySqlOps`] is the operations API over the tables
//!   ([`outbox_core::ops::OperationsStore`]: status, listings, the audit
//!   log, the relay's repairs and retention; and
//!   [`outbox_core::ops::LetterStore`]: a consumer's letters, positions,
//!   replay requests and discards).
//! - [`MySqlConsumerStore`] is the consumer's store seam
//!   ([`outbox_core::consumer::store::ConsumerStore`]): the inbox, the
//!   ordering policies' positions and parked messages, quarantine and dead
//!   letters, replays, in READ COMMITTED transactions the handlers write
//!   their effects in (`&mut MySqlConnection`).
//! - [`connect`] opens a pool and refuses a server without `SKIP LOCKED`;
//!   [`migrate`] creates the tables (safe to run again: MySQL has no
//!   transactional DDL, so every step is idempotent instead).
//!
//! The `outbox` CLI and the console take `mysql://` URLs for the relay's
//! and the consumer's commands alike.

mod aggregate_key;
mod connect;
mod consumer;
mod emit;
mod migrate;
mod ops;
mod relay;

pub use connect::{ConnectError, ServerVersion, check_server, connect};
pub use consumer::MySqlConsumerStore;
pub use emit::MySqlOutbox;
pub use migrate::{MigrateError, SCHEMA_VERSION, SchemaError, check_schema, migrate};
pub use ops::MySqlOps;
pub use relay::{MySqlClaim, MySqlRelayStore, MySqlWakeups, start_relay};

pub(crate) use outbox_core::store::columns::{
    millis, now_ms, optional_time_column, time_column, uuid_column,
};
