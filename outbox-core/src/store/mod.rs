//! The PostgreSQL store (feature `postgres`): embedded migrations and the
//! SQL text of every statement (`sql.rs`), built once per schema; and,
//! with the engine alone (feature `runtime`), what every store shares:
//! schema and identifier validation ([`SchemaName`], [`ConfigError`]) and
//! [`columns`], the column conventions of the SQLite and MySQL stores.

#[cfg(feature = "postgres")]
pub(crate) mod audit;
pub mod columns;
#[cfg(feature = "postgres")]
mod consumer;
#[cfg(feature = "postgres")]
mod emit;
#[cfg(feature = "postgres")]
mod migrate;
#[cfg(feature = "postgres")]
pub(crate) mod ops;
#[cfg(feature = "postgres")]
mod relay;
mod schema;
#[cfg(feature = "postgres")]
mod session;
#[cfg(feature = "postgres")]
pub(crate) mod sql;

#[cfg(feature = "postgres")]
pub use consumer::PgConsumerStore;
#[cfg(feature = "postgres")]
pub use emit::{Outbox, emit, emit_all};
#[cfg(feature = "postgres")]
pub use migrate::{MigrateError, migrate, migrations, migrator};
#[cfg(feature = "postgres")]
pub use relay::{
    ClaimPlan, ClaimVariant, DEFAULT_LEASE, DEFAULT_REBALANCE_INTERVAL, DEFAULT_STATEMENT_TIMEOUT,
    PgClaim, PgRelayStore, PgWakeups,
};
#[allow(unused_imports)]
pub(crate) use schema::validate_identifier;
pub use schema::{ConfigError, SchemaName};

#[cfg(feature = "postgres")]
/// Whether PostgreSQL answered `error` with the SQLSTATE `code` (e.g.
/// `57014`, a cancelled statement).
pub(crate) fn has_sqlstate(error: &sqlx::Error, code: &str) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.code())
        .is_some_and(|found| found == code)
}
