//! The SQLite store's tables, created by an explicit [`migrate`] call.
//!
//! The schema version lives in `PRAGMA user_version`; each migration runs
//! in one `BEGIN IMMEDIATE` transaction together with the version bump
//! (SQLite's DDL is transactional), so two processes migrating at once
//! apply it once, and a crash leaves the old version or the new one.
//! Times are integers (milliseconds since the Unix epoch), ids are UUID
//! text.

use sqlx::{Connection, SqlitePool};

/// The schema version this crate writes and reads.
pub const SCHEMA_VERSION: i64 = 3;

/// Migrating failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The file was migrated by a newer version of this crate.
    #[error(
        "the outbox tables are at schema version {found}, newer than this build of outbox-sqlite knows ({supported}); upgrade the binary instead of running an older one against them"
    )]
    NewerSchema {
        /// The version found in the file.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The database refused a statement.
    #[error("migrating the outbox tables failed: {0}")]
    Database(#[from] sqlx::Error),
}

/// Migration 1: the producer side (events, version counters, idempotency
/// keys) and the operators' audit log.
const MIGRATION_1: &str = "
CREATE TABLE outbox_events (
    seq               INTEGER PRIMARY KEY AUTOINCREMENT,
    id                TEXT    NOT NULL UNIQUE,
    aggregate_type    TEXT    NOT NULL,
    aggregate_id      TEXT    NOT NULL,
    aggregate_version INTEGER NOT NULL,
    event_type        TEXT    NOT NULL,
    schema_version    INTEGER NOT NULL,
    payload           TEXT    NOT NULL,
    traceparent       TEXT,
    created_at        INTEGER NOT NULL,
    status            TEXT    NOT NULL DEFAULT 'pending'
                      CHECK (status IN ('pending', 'published', 'failed', 'skipped')),
    published_at      INTEGER,
    attempt_count     INTEGER NOT NULL DEFAULT 0,
    next_attempt_at   INTEGER NOT NULL DEFAULT 0,
    last_error        TEXT,
    first_failed_at   INTEGER,
    failed_at         INTEGER,
    claim_token       TEXT,
    claimed_until     INTEGER
);
CREATE INDEX outbox_events_pending ON outbox_events (seq) WHERE status = 'pending';
CREATE UNIQUE INDEX outbox_events_unpublished_version
    ON outbox_events (aggregate_type, aggregate_id, aggregate_version)
    WHERE status <> 'published';
CREATE INDEX outbox_events_failed ON outbox_events (failed_at) WHERE status = 'failed';
CREATE INDEX outbox_events_published ON outbox_events (published_at) WHERE status = 'published';
CREATE INDEX outbox_events_claim ON outbox_events (claim_token) WHERE claim_token IS NOT NULL;

CREATE TABLE outbox_aggregate_versions (
    aggregate_type TEXT    NOT NULL,
    aggregate_id   TEXT    NOT NULL,
    version        INTEGER NOT NULL,
    PRIMARY KEY (aggregate_type, aggregate_id)
) WITHOUT ROWID;

-- Every insert moves its aggregate's counter (inside the emit's own
-- statement: one statement per emit); a carried version moves it too, so
-- a counted version never collides with a carried one.
CREATE TRIGGER outbox_events_count_version AFTER INSERT ON outbox_events
BEGIN
    INSERT INTO outbox_aggregate_versions (aggregate_type, aggregate_id, version)
    VALUES (NEW.aggregate_type, NEW.aggregate_id, NEW.aggregate_version)
    ON CONFLICT (aggregate_type, aggregate_id)
        DO UPDATE SET version = max(version, excluded.version);
END;

CREATE TABLE outbox_idempotency_keys (
    idempotency_key TEXT    PRIMARY KEY,
    event_id        TEXT    NOT NULL,
    created_at      INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX outbox_idempotency_keys_created ON outbox_idempotency_keys (created_at);

CREATE TABLE outbox_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    at       INTEGER NOT NULL,
    operator TEXT    NOT NULL,
    reason   TEXT    NOT NULL,
    action   TEXT    NOT NULL,
    target   TEXT    NOT NULL,
    ids      TEXT    NOT NULL,
    outcomes TEXT
);
";

/// Migration 2: skipped events through their own partial index, so an
/// operator's listings and backlog figures read only unpublished rows
/// (the status's row count still counts every row).
const MIGRATION_2: &str = "
CREATE INDEX outbox_events_skipped ON outbox_events (seq) WHERE status = 'skipped';
";

/// Migration 3: the consumer side (the inbox, handler starts, strict
/// positions and parked messages, quarantine and dead letters, counts), as
/// on PostgreSQL; times in milliseconds, ids as UUID text, JSON as text.
const MIGRATION_3: &str = "
CREATE TABLE outbox_processed_events (
    consumer_name TEXT    NOT NULL,
    event_id      TEXT    NOT NULL,
    processed_at  INTEGER NOT NULL,
    PRIMARY KEY (consumer_name, event_id)
) WITHOUT ROWID;

CREATE TABLE outbox_consumer_attempts (
    consumer_name     TEXT    NOT NULL,
    event_id          TEXT    NOT NULL,
    starts            INTEGER NOT NULL,
    aggregate_type    TEXT,
    aggregate_id      TEXT,
    aggregate_version INTEGER,
    retry_at          INTEGER,
    updated_at        INTEGER NOT NULL,
    PRIMARY KEY (consumer_name, event_id)
) WITHOUT ROWID;
CREATE INDEX outbox_consumer_attempts_aggregate
    ON outbox_consumer_attempts (consumer_name, aggregate_type, aggregate_id, aggregate_version)
    WHERE aggregate_type IS NOT NULL;

CREATE TABLE outbox_consumer_positions (
    consumer_name  TEXT    NOT NULL,
    aggregate_type TEXT    NOT NULL,
    aggregate_id   TEXT    NOT NULL,
    version        INTEGER NOT NULL,
    pinned         INTEGER NOT NULL DEFAULT 1,
    start_version  INTEGER,
    updated_at     INTEGER NOT NULL,
    PRIMARY KEY (consumer_name, aggregate_type, aggregate_id)
) WITHOUT ROWID;

CREATE TABLE outbox_consumer_parked (
    consumer_name     TEXT    NOT NULL,
    event_id          TEXT    NOT NULL,
    aggregate_type    TEXT    NOT NULL,
    aggregate_id      TEXT    NOT NULL,
    aggregate_version INTEGER NOT NULL,
    envelope          TEXT    NOT NULL,
    parked_at         INTEGER NOT NULL,
    attempts          INTEGER NOT NULL DEFAULT 0,
    last_error        TEXT,
    retry_at          INTEGER,
    PRIMARY KEY (consumer_name, event_id)
) WITHOUT ROWID;
CREATE INDEX outbox_consumer_parked_aggregate
    ON outbox_consumer_parked (consumer_name, aggregate_type, aggregate_id, aggregate_version);

CREATE TABLE outbox_dead_letters (
    id                  INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer_name       TEXT    NOT NULL,
    kind                TEXT    NOT NULL CHECK (kind IN ('quarantined', 'dead_lettered')),
    event_id            TEXT,
    event_type          TEXT,
    schema_version      INTEGER,
    aggregate_type      TEXT,
    aggregate_id        TEXT,
    aggregate_version   INTEGER,
    headers             TEXT    NOT NULL DEFAULT '{}',
    payload             BLOB    NOT NULL,
    reason              TEXT    NOT NULL,
    attempts            INTEGER NOT NULL DEFAULT 0,
    created_at          INTEGER NOT NULL,
    resolved_at         INTEGER,
    resolution          TEXT,
    replays             INTEGER NOT NULL DEFAULT 0,
    last_replay_error   TEXT,
    replay_requested_at INTEGER,
    replay_audit_id     INTEGER
);
CREATE UNIQUE INDEX outbox_dead_letters_open_event
    ON outbox_dead_letters (consumer_name, event_id)
    WHERE resolved_at IS NULL AND event_id IS NOT NULL;
CREATE INDEX outbox_dead_letters_open_aggregate
    ON outbox_dead_letters (consumer_name, aggregate_type, aggregate_id, aggregate_version)
    WHERE resolved_at IS NULL;
CREATE INDEX outbox_dead_letters_replay
    ON outbox_dead_letters (consumer_name, id)
    WHERE replay_requested_at IS NOT NULL AND resolved_at IS NULL;

CREATE TABLE outbox_consumer_stats (
    consumer_name   TEXT    PRIMARY KEY,
    applied         INTEGER NOT NULL DEFAULT 0,
    duplicates      INTEGER NOT NULL DEFAULT 0,
    last_applied_at INTEGER,
    lag_seconds     REAL,
    updated_at      INTEGER NOT NULL
) WITHOUT ROWID;
";

const MIGRATIONS: [&str; 3] = [MIGRATION_1, MIGRATION_2, MIGRATION_3];

/// Creates or upgrades the outbox tables in the database of `pool`. Safe to
/// call from several processes at once and on every start.
pub async fn migrate(pool: &SqlitePool) -> Result<(), MigrateError> {
    let mut conn = pool.acquire().await?;
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    let found: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut *tx)
        .await?;
    if found > SCHEMA_VERSION {
        return Err(MigrateError::NewerSchema {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for migration in MIGRATIONS.iter().skip(found.max(0) as usize) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(*migration))
            .execute(&mut *tx)
            .await?;
    }
    if found < SCHEMA_VERSION {
        // A pragma takes no parameters; the value is this crate's constant.
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "PRAGMA user_version = {SCHEMA_VERSION}"
        )))
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    Ok(())
}
