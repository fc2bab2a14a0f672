//! Opening a SQLite database with the settings the outbox's guarantees rest
//! on.
//!
//! - `journal_mode = WAL`: readers do not block the writer and the writer
//!   does not block readers; the relay's claims and the service's reads run
//!   side by side.
//! - `synchronous = FULL`: every commit syncs the WAL before it returns. With
//!   `NORMAL` (the usual WAL setting) a committed transaction survives a
//!   crash of the process but not a power loss; the relay could then have
//!   published an event whose emitting transaction the power loss undid,
//!   which is the one thing an outbox must never do.
//! - a busy timeout ([`DEFAULT_BUSY_TIMEOUT`]): SQLite has one writer at a
//!   time; a writer that finds the lock taken waits for it instead of
//!   failing at once.
//! - `foreign_keys = ON` and `create_if_missing`.

use std::str::FromStr;
use std::time::Duration;

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};

/// How long a writer waits for another writer's lock before it fails with
/// `database is locked` (10 s).
pub const DEFAULT_BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Connect options for `url` (`sqlite://path/to/file.db`, `sqlite:file.db`
/// or a plain path) with the outbox's settings: WAL, `synchronous = FULL`,
/// [`DEFAULT_BUSY_TIMEOUT`], foreign keys on, the file created if missing.
/// Change what you must on the returned options; keep WAL and `FULL` unless
/// you have argued why an event may be published whose transaction a power
/// loss undoes.
pub fn connect_options(url: &str) -> Result<SqliteConnectOptions, sqlx::Error> {
    let options = if url.starts_with("sqlite:") {
        SqliteConnectOptions::from_str(url)?
    } else {
        SqliteConnectOptions::new().filename(url)
    };
    Ok(options
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(DEFAULT_BUSY_TIMEOUT)
        .foreign_keys(true)
        .create_if_missing(true))
}

/// A pool over `url` with [`connect_options`]; eight connections at most
/// (SQLite writes one transaction at a time, whatever the pool size), and
/// no ping before each acquire: a SQLite connection is a file handle in
/// this process, not a socket that can go stale, and sqlx's ping is a
/// round trip to the connection's worker thread on every transaction.
pub async fn connect(url: &str) -> Result<SqlitePool, sqlx::Error> {
    SqlitePoolOptions::new()
        .max_connections(8)
        .test_before_acquire(false)
        .connect_with(connect_options(url)?)
        .await
}
