//! The PostgreSQL store: schema name validation, embedded migrations, and
//! the SQL text of every statement (`sql.rs`), built once per schema; and
//! [`columns`], the column conventions the other stores share.

pub(crate) mod audit;
pub mod columns;
mod consumer;
mod migrate;
pub(crate) mod ops;
mod relay;
mod schema;
mod session;
pub(crate) mod sql;

pub use consumer::PgConsumerStore;
pub use migrate::{MigrateError, migrate, migrations, migrator};
pub use relay::{
    ClaimPlan, ClaimVariant, DEFAULT_LEASE, DEFAULT_REBALANCE_INTERVAL, DEFAULT_STATEMENT_TIMEOUT,
    PgClaim, PgRelayStore, PgWakeups,
};
#[allow(unused_imports)]
pub(crate) use schema::validate_identifier;
pub use schema::{ConfigError, SchemaName};

/// Whether PostgreSQL answered `error` with the SQLSTATE `code` (e.g.
/// `57014`, a cancelled statement).
pub(crate) fn has_sqlstate(error: &sqlx::Error, code: &str) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.code())
        .is_some_and(|found| found == code)
}
