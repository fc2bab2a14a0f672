//! The outbox tables on MySQL/MariaDB, created by an explicit [`migrate`].
//!
//! MySQL commits every DDL statement on its own (no transactional DDL), so
//! a migration cannot be all or nothing; instead every statement is safe
//! to run again (`CREATE TABLE IF NOT EXISTS`), and a crash half-way is
//! repaired by the next run. The schema version is a row of
//! `outbox_schema_version`, written last. Text is `utf8mb4` with a binary
//! collation: ids compare byte for byte (`Zoë`, `a b` and `A B` are three
//! aggregates), as on PostgreSQL. Times are milliseconds since the Unix
//! epoch, ids UUID text.
//!
//! Limits that follow from InnoDB's 3,072-byte index keys: an aggregate
//! type of at most 255 characters, an aggregate id of at most 500, an
//! idempotency key of at most 512.

use sqlx::MySqlPool;

/// The schema version this crate writes and reads.
pub const SCHEMA_VERSION: i64 = 1;

/// Migrating failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// The tables were written by a newer release of this crate.
    #[error(
        "the outbox tables are at schema version {found}, newer than this release supports ({supported}); upgrade outbox-mysql"
    )]
    NewerSchema {
        /// The version found.
        found: i64,
        /// The newest this release knows.
        supported: i64,
    },
    /// The database failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

const TABLES: [&str; 5] = [
    "CREATE TABLE IF NOT EXISTS outbox_schema_version (
        id      TINYINT NOT NULL PRIMARY KEY,
        version INT     NOT NULL
    ) ENGINE = InnoDB",
    "CREATE TABLE IF NOT EXISTS outbox_events (
        seq               BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
        id                CHAR(36)     NOT NULL,
        aggregate_type    VARCHAR(255) NOT NULL,
        aggregate_id      VARCHAR(500) NOT NULL,
        aggregate_version BIGINT       NOT NULL,
        event_type        VARCHAR(255) NOT NULL,
        schema_version    INT          NOT NULL,
        payload           LONGTEXT     NOT NULL,
        traceparent       VARCHAR(255) NULL,
        created_at        BIGINT       NOT NULL,
        status            VARCHAR(16)  NOT NULL DEFAULT 'pending',
        published_at      BIGINT       NULL,
        attempt_count     INT          NOT NULL DEFAULT 0,
        next_attempt_at   BIGINT       NOT NULL DEFAULT 0,
        last_error        TEXT         NULL,
        first_failed_at   BIGINT       NULL,
        failed_at         BIGINT       NULL,
        claim_token       CHAR(36)     NULL,
        claimed_until     BIGINT       NULL,
        UNIQUE KEY outbox_events_id (id),
        UNIQUE KEY outbox_events_version (aggregate_type, aggregate_id, aggregate_version),
        KEY outbox_events_status (status, seq),
        KEY outbox_events_claim (claim_token),
        KEY outbox_events_published (status, published_at)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS outbox_aggregate_versions (
        aggregate_type VARCHAR(255) NOT NULL,
        aggregate_id   VARCHAR(500) NOT NULL,
        version        BIGINT       NOT NULL,
        PRIMARY KEY (aggregate_type, aggregate_id)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS outbox_idempotency_keys (
        idempotency_key VARCHAR(512) NOT NULL PRIMARY KEY,
        event_id        CHAR(36)     NOT NULL,
        created_at      BIGINT       NOT NULL,
        KEY outbox_idempotency_keys_created (created_at)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS outbox_audit (
        id       BIGINT      NOT NULL AUTO_INCREMENT PRIMARY KEY,
        at       BIGINT      NOT NULL,
        operator TEXT        NOT NULL,
        reason   TEXT        NOT NULL,
        action   VARCHAR(64) NOT NULL,
        target   VARCHAR(255) NOT NULL,
        ids      LONGTEXT    NOT NULL,
        outcomes LONGTEXT    NULL
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
];

/// Creates the outbox tables in the database of `pool` (or completes a
/// migration a crash cut short). Safe on every start and from several
/// processes at once; refuses tables of a newer release.
pub async fn migrate(pool: &MySqlPool) -> Result<(), MigrateError> {
    sqlx::query(TABLES[0]).execute(pool).await?;
    let found: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(version AS SIGNED) FROM outbox_schema_version WHERE id = 1",
    )
    .fetch_optional(pool)
    .await?;
    if let Some(found) = found
        && found > SCHEMA_VERSION
    {
        return Err(MigrateError::NewerSchema {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    for statement in &TABLES[1..] {
        sqlx::query(*statement).execute(pool).await?;
    }
    sqlx::query(
        "INSERT INTO outbox_schema_version (id, version) VALUES (1, ?)
         ON DUPLICATE KEY UPDATE version = GREATEST(version, VALUES(version))",
    )
    .bind(SCHEMA_VERSION)
    .execute(pool)
    .await?;
    Ok(())
}
