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
//! Besides the tables there is one stored procedure, the emit of a counted
//! version in one round trip (`outbox_emit_counted_v1`): the migrating user
//! needs `CREATE ROUTINE`, the service's user `EXECUTE`. A procedure, not a
//! trigger or a function, so that binary logging needs neither `SUPER` nor
//! `log_bin_trust_function_creators`.
//!
//! Limits that follow from InnoDB's 3,072-byte index keys: an aggregate
//! type of at most 255 characters, an aggregate id of at most 500, an
//! idempotency key of at most 512.

use sqlx::MySqlPool;

/// The schema version this crate writes and reads (2: the emit procedure,
/// the head-test index, no index on the lease token; 3: the consumer's
/// tables).
pub const SCHEMA_VERSION: i64 = 3;

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

/// The tables [`TABLES`] creates, in its order.
const TABLE_NAMES: [&str; 11] = [
    "outbox_schema_version",
    "outbox_events",
    "outbox_aggregate_versions",
    "outbox_idempotency_keys",
    "outbox_audit",
    "outbox_processed_events",
    "outbox_consumer_attempts",
    "outbox_consumer_positions",
    "outbox_consumer_parked",
    "outbox_dead_letters",
    "outbox_consumer_stats",
];

/// The consumer's tables (schema version 3), as on PostgreSQL and SQLite,
/// with what InnoDB's 3,072-byte keys and missing partial indexes ask for:
///
/// - consumer names are ASCII (the consumer validates them so), event ids
///   UUID text;
/// - an aggregate is keyed by `aggregate_key`, the SHA-256 of its type's
///   length, its type and its id (written by the store): a 255-character type and
///   a 500-character id in `utf8mb4` do not fit one key with the consumer's
///   name;
/// - an open letter's event id is repeated in `open_event_id`, a stored
///   generated column that is NULL once the letter is resolved: a unique
///   key on it allows one open letter per event, as PostgreSQL's partial
///   unique index does (`VARCHAR`, not `CHAR`: MariaDB refuses a generated
///   column over a `CHAR`, whose value depends on the SQL mode's padding);
/// - parked messages are clustered by aggregate (the primary key starts
///   with the consumer and `aggregate_key`): a `DELETE` of an aggregate's
///   parked rows then reads only them. Through a secondary index on a
///   small table InnoDB chose a scan of the whole table, and a `DELETE`
///   (which, unlike an `UPDATE`, waits for every locked row it reads)
///   waited for other aggregates' rows: two instances deadlocked.
const CONSUMER_TABLES: [&str; 6] = [
    "CREATE TABLE IF NOT EXISTS outbox_processed_events (
        consumer_name VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        event_id      CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        processed_at  BIGINT       NOT NULL,
        claim_mark    BIGINT       NULL,
        PRIMARY KEY (consumer_name, event_id)
    ) ENGINE = InnoDB",
    "CREATE TABLE IF NOT EXISTS outbox_consumer_attempts (
        consumer_name     VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        event_id          CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        starts            INT          NOT NULL,
        aggregate_type    VARCHAR(255) NULL,
        aggregate_id      VARCHAR(500) NULL,
        aggregate_key     BINARY(32)   NULL,
        aggregate_version BIGINT       NULL,
        retry_at          BIGINT       NULL,
        updated_at        BIGINT       NOT NULL,
        PRIMARY KEY (consumer_name, event_id),
        KEY outbox_consumer_attempts_aggregate (consumer_name, aggregate_key, aggregate_version)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS outbox_consumer_positions (
        consumer_name  VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        aggregate_key  BINARY(32)   NOT NULL,
        aggregate_type VARCHAR(255) NOT NULL,
        aggregate_id   VARCHAR(500) NOT NULL,
        version        BIGINT       NOT NULL,
        pinned         TINYINT(1)   NOT NULL DEFAULT 1,
        start_version  BIGINT       NULL,
        updated_at     BIGINT       NOT NULL,
        PRIMARY KEY (consumer_name, aggregate_key)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS outbox_consumer_parked (
        consumer_name     VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        event_id          CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        aggregate_type    VARCHAR(255) NOT NULL,
        aggregate_id      VARCHAR(500) NOT NULL,
        aggregate_key     BINARY(32)   NOT NULL,
        aggregate_version BIGINT       NOT NULL,
        envelope          LONGTEXT     NOT NULL,
        parked_at         BIGINT       NOT NULL,
        attempts          INT          NOT NULL DEFAULT 0,
        last_error        MEDIUMTEXT   NULL,
        retry_at          BIGINT       NULL,
        PRIMARY KEY (consumer_name, aggregate_key, aggregate_version, event_id),
        UNIQUE KEY outbox_consumer_parked_event (consumer_name, event_id)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS outbox_dead_letters (
        id                  BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
        consumer_name       VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
        kind                VARCHAR(16)  NOT NULL,
        event_id            VARCHAR(36)  CHARACTER SET ascii COLLATE ascii_bin NULL,
        event_type          VARCHAR(255) NULL,
        schema_version      INT          NULL,
        aggregate_type      VARCHAR(255) NULL,
        aggregate_id        VARCHAR(500) NULL,
        aggregate_key       BINARY(32)   NULL,
        aggregate_version   BIGINT       NULL,
        headers             LONGTEXT     NOT NULL,
        payload             LONGBLOB     NOT NULL,
        reason              MEDIUMTEXT   NOT NULL,
        attempts            INT          NOT NULL DEFAULT 0,
        created_at          BIGINT       NOT NULL,
        resolved_at         BIGINT       NULL,
        resolution          MEDIUMTEXT   NULL,
        replays             INT          NOT NULL DEFAULT 0,
        last_replay_error   MEDIUMTEXT   NULL,
        replay_requested_at BIGINT       NULL,
        replay_audit_id     BIGINT       NULL,
        open_event_id       VARCHAR(36) CHARACTER SET ascii COLLATE ascii_bin
            AS (IF(resolved_at IS NULL, event_id, NULL)) STORED,
        CONSTRAINT outbox_dead_letters_kind CHECK (kind IN ('quarantined', 'dead_lettered')),
        UNIQUE KEY outbox_dead_letters_open_event (consumer_name, open_event_id),
        KEY outbox_dead_letters_aggregate (consumer_name, aggregate_key, aggregate_version),
        KEY outbox_dead_letters_replay (consumer_name, replay_requested_at)
    ) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS outbox_consumer_stats (
        consumer_name   VARCHAR(200) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
        applied         BIGINT       NOT NULL DEFAULT 0,
        duplicates      BIGINT       NOT NULL DEFAULT 0,
        last_applied_at BIGINT       NULL,
        lag_seconds     DOUBLE       NULL,
        updated_at      BIGINT       NOT NULL
    ) ENGINE = InnoDB",
];

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

/// The emit of an event whose version is counted, as one round trip: the
/// counter row moves (`LAST_INSERT_ID(expr)` hands its new value to this
/// session only) and stays locked until the caller's transaction ends, the
/// event is inserted with that version, and the version comes back. The
/// name carries its revision: a changed body is a new procedure, never a
/// replaced one under running emitters. String parameters are `TEXT` so
/// nothing is cut on the way in (the table's columns refuse what is too
/// long, as a plain `INSERT` would); `SQL SECURITY INVOKER`: the caller's
/// own privileges apply.
pub(crate) const EMIT_PROCEDURE: &str = "outbox_emit_counted_v1";

const CREATE_EMIT_PROCEDURE: &str = "
CREATE PROCEDURE outbox_emit_counted_v1(
    IN p_id TEXT CHARSET utf8mb4 COLLATE utf8mb4_bin,
    IN p_aggregate_type TEXT CHARSET utf8mb4 COLLATE utf8mb4_bin,
    IN p_aggregate_id TEXT CHARSET utf8mb4 COLLATE utf8mb4_bin,
    IN p_event_type TEXT CHARSET utf8mb4 COLLATE utf8mb4_bin,
    IN p_schema_version INT,
    IN p_payload LONGTEXT CHARSET utf8mb4 COLLATE utf8mb4_bin,
    IN p_traceparent TEXT CHARSET utf8mb4 COLLATE utf8mb4_bin,
    IN p_created_at BIGINT)
MODIFIES SQL DATA SQL SECURITY INVOKER
BEGIN
    DECLARE counted BIGINT;
    INSERT INTO outbox_aggregate_versions (aggregate_type, aggregate_id, version)
    VALUES (p_aggregate_type, p_aggregate_id, LAST_INSERT_ID(1))
    ON DUPLICATE KEY UPDATE version = LAST_INSERT_ID(version + 1);
    SET counted = LAST_INSERT_ID();
    INSERT INTO outbox_events
        (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version,
         payload, traceparent, created_at)
    VALUES (p_id, p_aggregate_type, p_aggregate_id, counted, p_event_type, p_schema_version,
            p_payload, p_traceparent, p_created_at);
    SELECT counted AS aggregate_version;
END";

/// MySQL's and MariaDB's error number for a routine that exists already.
const ROUTINE_EXISTS: u16 = 1304;

/// The index the relay's head test probes: "is there a pending (or failed)
/// version of this aggregate below this one?" is one seek, however many
/// published versions the aggregate has. Key prefixes keep it within
/// InnoDB's 3,072 bytes; a prefix match is checked against the row.
const UNPUBLISHED_INDEX: &str = "outbox_events_unpublished";

const CREATE_UNPUBLISHED_INDEX: &str = "CREATE INDEX outbox_events_unpublished
    ON outbox_events (aggregate_type(64), aggregate_id(191), status, aggregate_version)";

/// MySQL's and MariaDB's error number for an index name in use.
const DUPLICATE_KEY_NAME: u16 = 1061;

/// Whether the error is the server's error `number`.
pub(crate) fn is_server_error(error: &sqlx::Error, number: u16) -> bool {
    match error {
        sqlx::Error::Database(error) => error
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|e| e.number() == number),
        _ => false,
    }
}

/// Creates the head-test index unless it is there (MySQL has no `CREATE
/// INDEX IF NOT EXISTS`; a concurrent migration's index is fine).
async fn create_unpublished_index(pool: &MySqlPool) -> Result<(), sqlx::Error> {
    let present: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.STATISTICS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_events' AND INDEX_NAME = ?",
    )
    .bind(UNPUBLISHED_INDEX)
    .fetch_one(pool)
    .await?;
    if present > 0 {
        return Ok(());
    }
    match sqlx::query(CREATE_UNPUBLISHED_INDEX).execute(pool).await {
        Err(error) if is_server_error(&error, DUPLICATE_KEY_NAME) => Ok(()),
        other => other.map(|_| ()),
    }
}

/// Drops the index on `claim_token` that schema version 1 had: leases are
/// found by primary key, and the index cost a write on every lease and
/// mark.
async fn drop_claim_index(pool: &MySqlPool) -> Result<(), sqlx::Error> {
    let present: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.STATISTICS
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'outbox_events'
           AND INDEX_NAME = 'outbox_events_claim'",
    )
    .fetch_one(pool)
    .await?;
    if present == 0 {
        return Ok(());
    }
    match sqlx::query("DROP INDEX outbox_events_claim ON outbox_events")
        .execute(pool)
        .await
    {
        // A concurrent migration dropped it first.
        Err(error) if is_server_error(&error, CANT_DROP_KEY) => Ok(()),
        other => other.map(|_| ()),
    }
}

/// MySQL's and MariaDB's error number for dropping an index that is gone.
const CANT_DROP_KEY: u16 = 1091;

/// Creates the emit procedure unless it is there (two migrations at once:
/// the second one's `CREATE` finds it and that is fine).
async fn create_emit_procedure(pool: &MySqlPool) -> Result<(), sqlx::Error> {
    let present: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.ROUTINES
         WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = ?",
    )
    .bind(EMIT_PROCEDURE)
    .fetch_one(pool)
    .await?;
    if present > 0 {
        return Ok(());
    }
    // A procedure keeps the sql_mode it was created under: strict, so an
    // argument too long for its column is refused, never cut, whatever
    // the migrating session's mode. On a connection of its own, closed
    // after, so the pool never hands out the changed session.
    let mut conn = pool.acquire().await?.detach();
    sqlx::raw_sql(
        "SET SESSION sql_mode = CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'STRICT_ALL_TABLES')",
    )
    .execute(&mut conn)
    .await?;
    // Not a prepared statement: the binary protocol refuses CREATE PROCEDURE.
    let created = match sqlx::raw_sql(CREATE_EMIT_PROCEDURE)
        .execute(&mut conn)
        .await
    {
        Err(error) if is_server_error(&error, ROUTINE_EXISTS) => Ok(()),
        other => other.map(|_| ()),
    };
    let _ = sqlx::Connection::close(conn).await;
    created
}

/// Why the outbox tables cannot be used as they are.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// No outbox tables, or not all of them (a migration that never
    /// finished, a table dropped by hand), or no schema version row.
    #[error(
        "the database has no outbox tables, or not all of them (missing: {missing}): run outbox_mysql::migrate (or `outbox --database-url … migrate`) first"
    )]
    NotMigrated {
        /// The tables not there, comma-separated.
        missing: String,
    },
    /// The tables are of an older release.
    #[error(
        "the outbox tables are at schema version {found}, older than this release needs ({required}): run outbox_mysql::migrate (or `outbox --database-url … migrate`), which upgrades them in place"
    )]
    Older {
        /// The version found.
        found: i64,
        /// The version this release needs.
        required: i64,
    },
    /// The tables are of a newer release.
    #[error(
        "the outbox tables are at schema version {found}, newer than this release supports ({supported}); upgrade outbox-mysql"
    )]
    Newer {
        /// The version found.
        found: i64,
        /// The newest this release knows.
        supported: i64,
    },
    /// The database failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// Checks that the outbox tables are at this release's
/// [`SCHEMA_VERSION`], for a process that does not migrate itself (the
/// migrations run elsewhere): tables of an older release would fail later
/// and less clearly (an emit on version 1 tables: "PROCEDURE
/// outbox_emit_counted_v1 does not exist"). Returns the version.
pub async fn check_schema(pool: &MySqlPool) -> Result<i64, SchemaError> {
    let mut query = sqlx::query_scalar::<_, String>(
        "SELECT CAST(table_name AS CHAR) FROM information_schema.tables
         WHERE table_schema = DATABASE() AND table_name IN (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    );
    for name in TABLE_NAMES {
        query = query.bind(name);
    }
    let present: Vec<String> = query.fetch_all(pool).await?;
    let missing: Vec<&str> = TABLE_NAMES
        .iter()
        .copied()
        .filter(|name| !present.iter().any(|p| p == name))
        .collect();
    // Tables an older release did not have are not "missing" there: the
    // version row says which release wrote them, and `migrate` adds them.
    if missing.contains(&"outbox_schema_version") {
        return Err(SchemaError::NotMigrated {
            missing: missing.join(", "),
        });
    }
    let found: Option<i64> = sqlx::query_scalar(
        "SELECT CAST(version AS SIGNED) FROM outbox_schema_version WHERE id = 1",
    )
    .fetch_optional(pool)
    .await?;
    match found {
        None => Err(SchemaError::NotMigrated {
            missing: "the row of outbox_schema_version".to_owned(),
        }),
        Some(found) if found < SCHEMA_VERSION => Err(SchemaError::Older {
            found,
            required: SCHEMA_VERSION,
        }),
        Some(found) if found > SCHEMA_VERSION => Err(SchemaError::Newer {
            found,
            supported: SCHEMA_VERSION,
        }),
        Some(_) if !missing.is_empty() => Err(SchemaError::NotMigrated {
            missing: missing.join(", "),
        }),
        Some(found) => Ok(found),
    }
}

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
    for statement in TABLES[1..].iter().chain(&CONSUMER_TABLES) {
        sqlx::query(*statement).execute(pool).await?;
    }
    // What this release uses first, what only the last one used at the
    // end: a migration cut short leaves both releases working.
    create_unpublished_index(pool).await?;
    create_emit_procedure(pool).await?;
    drop_claim_index(pool).await?;
    sqlx::query(
        "INSERT INTO outbox_schema_version (id, version) VALUES (1, ?)
         ON DUPLICATE KEY UPDATE version = GREATEST(version, VALUES(version))",
    )
    .bind(SCHEMA_VERSION)
    .execute(pool)
    .await?;
    Ok(())
}

#[cfg(test)]
mod table_name_tests {
    #[test]
    fn the_checked_names_are_the_created_tables() {
        let statements = super::TABLES.iter().chain(&super::CONSUMER_TABLES);
        assert_eq!(super::TABLE_NAMES.len(), statements.clone().count());
        for (name, statement) in super::TABLE_NAMES.iter().zip(statements) {
            assert!(
                statement.contains(&format!("CREATE TABLE IF NOT EXISTS {name} (")),
                "{name}"
            );
        }
    }
}
