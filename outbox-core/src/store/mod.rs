//! What every store shares: schema and identifier validation
//! ([`SchemaName`], [`ConfigError`]) and [`columns`], the column
//! conventions of the SQLite and MySQL stores. The stores themselves live in
//! their own crates (`outbox-postgres`, `outbox-sqlite`, `outbox-mysql`).

pub mod columns;
mod schema;

pub use schema::{ConfigError, SchemaName};
