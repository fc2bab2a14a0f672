//! The embedded migrations and the explicit call that applies them.
//!
//! Migrations run on a dedicated connection (never a pooled one, so an
//! error cannot hand a connection with a changed `search_path` or a held
//! advisory lock back to the pool) with `search_path` set to the configured
//! schema. sqlx's migrator takes a session advisory lock before it creates
//! the schema and its bookkeeping table (`<schema>.outbox_migrations`), so
//! several processes may migrate at once.

use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection, PgPool, SqlStr};

use outbox_core::store::SchemaName;

/// The migrations shipped with this version of outbox-postgres.
pub fn migrations() -> Vec<Migration> {
    vec![
        Migration::new(
            1,
            "outbox tables".into(),
            MigrationType::Simple,
            SqlStr::from_static(include_str!("../migrations/0001_outbox.sql")),
            false,
        ),
        Migration::new(
            2,
            "hardening: exact payloads, replayable letters, audit".into(),
            MigrationType::Simple,
            SqlStr::from_static(include_str!("../migrations/0002_hardening.sql")),
            false,
        ),
        Migration::new(
            3,
            "operations: skipped events, replay requests".into(),
            MigrationType::Simple,
            SqlStr::from_static(include_str!("../migrations/0003_operations.sql")),
            false,
        ),
        Migration::new(
            4,
            "partitions: relay workers divide the aggregates".into(),
            MigrationType::Simple,
            SqlStr::from_static(include_str!("../migrations/0004_partitions.sql")),
            false,
        ),
        Migration::new(
            5,
            "strict starts: the start version of an aggregate, open letters by aggregate".into(),
            MigrationType::Simple,
            SqlStr::from_static(include_str!("../migrations/0005_strict_starts.sql")),
            false,
        ),
    ]
}

/// The migrator for `schema`: creates the schema, keeps its bookkeeping in
/// `<schema>.outbox_migrations`, locks against concurrent runs.
pub fn migrator(schema: &SchemaName) -> Migrator {
    let mut migrator = Migrator::with_migrations(migrations());
    migrator.create_schema(schema.quoted());
    migrator.dangerous_set_table_name(format!("{}.outbox_migrations", schema.quoted()));
    migrator.set_locking(true);
    migrator
}

/// A migration failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    /// Connecting or setting up the migration connection failed.
    #[error("cannot open the migration connection: {0}")]
    Connect(#[source] sqlx::Error),
    /// The migrator failed (a checksum mismatch names the migration version).
    #[error("migrating schema {schema} failed: {source}")]
    Migrate {
        /// The schema being migrated.
        schema: String,
        /// What sqlx reported.
        #[source]
        source: sqlx::migrate::MigrateError,
    },
}

/// Applies the outbox migrations to `schema` of the database behind `pool`.
/// Idempotent; safe to call from several processes at once.
pub async fn migrate(pool: &PgPool, schema: &SchemaName) -> Result<(), MigrateError> {
    let options = pool.connect_options();
    let mut conn = PgConnection::connect_with(&options)
        .await
        .map_err(MigrateError::Connect)?;
    conn.execute(AssertSqlSafe(format!(
        "SET search_path TO {}",
        schema.quoted()
    )))
    .await
    .map_err(MigrateError::Connect)?;
    let result = migrator(schema).run_direct(None, &mut conn, false).await;
    // Closing the connection releases the advisory lock even on error.
    let _ = conn.close().await;
    result.map_err(|source| MigrateError::Migrate {
        schema: schema.to_string(),
        source,
    })
}
