//! # outbox-postgres
//!
//! The PostgreSQL store of [`outbox_core`]: everything that speaks
//! PostgreSQL, behind the engine's seams.
//!
//! - [`Outbox`]: emit in the caller's own transaction (`&mut PgConnection`;
//!   a `&mut Transaction` coerces to it), one round trip per emit, with
//!   idempotency keys and the guarded `NOTIFY` that wakes relays.
//! - [`PgRelayStore`]: the relay's claim (`FOR UPDATE SKIP LOCKED` heads,
//!   partitions owned through advisory locks on a session of their own,
//!   leases and fencing), outcomes, blocked aggregates, stats and retention
//!   ([`retention::run_once`], [`retention::Retention`]); started with
//!   [`Relay::start_postgres`](prelude::RelayPostgresExt::start_postgres).
//! - [`PgConsumerStore`]: a consumer's inbox, positions, parked messages,
//!   letters and replay requests; built with
//!   [`ConsumerBuilder::new`](prelude::ConsumerBuilderPostgresExt::new)`(..)
//!   … .build(pool, schema)`.
//! - [`Ops`]: the operations API (status, listings, audited repairs) the
//!   `outbox` CLI and the console use.
//! - [`migrate`]: the embedded migrations, applied explicitly.
//!
//! `use outbox_postgres::prelude::*;` brings the two extension traits into
//! scope, so the PostgreSQL entry points read as methods of the engine's
//! `Relay` and `ConsumerBuilder`.
//!
//! The examples below run against the PostgreSQL at `DATABASE_URL` (the
//! repository's `scripts/test.sh` starts it), each in a schema of its own.
//!
//! ## A contract and an emit
//!
//! ```
//! use outbox_core::OutboxEvent;
//! use outbox_postgres::{Outbox, SchemaName};
//!
//! #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, OutboxEvent)]
//! #[outbox(event_type = "doc.order_placed", aggregate = "doc_order", version = 1)]
//! struct OrderPlaced {
//!     #[outbox(aggregate_id)]
//!     order_id: String,
//!     #[outbox(redact)]
//!     email: String,
//!     total_cents: i64,
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
//! let pool = sqlx::PgPool::connect(&url).await?;
//! let outbox = Outbox::new(SchemaName::new(format!("doc_emit_{}", std::process::id()))?);
//! outbox.migrate(&pool).await?;
//!
//! let mut tx = pool.begin().await?;
//! // ... the business change, in the same transaction ...
//! let emitted = outbox
//!     .emit(&mut tx, &OrderPlaced { order_id: "o-1".into(), email: "ada@example.org".into(), total_cents: 4200 })
//!     .await?;
//! tx.commit().await?;
//! assert_eq!(emitted.aggregate_version, 1);
//! # sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {} CASCADE", outbox.schema().quoted()))).execute(&pool).await?;
//! # Ok(()) }
//! ```
//!
//! ## The relay
//!
//! The relay talks to a broker through the [`Transport`](outbox_core::transport::Transport) seam;
//! the broker crates implement it (`outbox_nats::NatsTransport`,
//! `outbox_kafka::KafkaTransport`, `outbox_rabbitmq::RabbitTransport`).
//! Here a transport that keeps what it is given:
//!
//! ```
//! # use outbox_core::OutboxEvent;
//! # use outbox_postgres::{Outbox, SchemaName};
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//! use outbox_core::Envelope;
//! use outbox_core::relay::{Relay, RelayConfig, RelayStore};
//! use outbox_postgres::PgRelayStore;
//! use outbox_postgres::prelude::*;
//! use outbox_core::transport::{PublishFailure, Transport};
//!
//! #[derive(Clone, Default)]
//! struct Kept(Arc<Mutex<Vec<Envelope>>>);
//!
//! impl Transport for Kept {
//!     async fn publish(&self, events: &[&Envelope]) -> Vec<Result<(), PublishFailure>> {
//!         let mut kept = self.0.lock().unwrap();
//!         events.iter().map(|e| { kept.push((*e).clone()); Ok(()) }).collect()
//!     }
//!     fn name(&self) -> &'static str { "kept" }
//! }
//! # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, OutboxEvent)]
//! # #[outbox(event_type = "doc.order_shipped", aggregate = "doc_shipment", version = 1)]
//! # struct OrderPlaced { #[outbox(aggregate_id)] order_id: String, total_cents: i64 }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
//! # let pool = sqlx::PgPool::connect(&url).await?;
//! # let schema = SchemaName::new(format!("doc_relay_{}", std::process::id()))?;
//! # let outbox = Outbox::new(schema.clone());
//! # outbox.migrate(&pool).await?;
//! # let mut tx = pool.begin().await?;
//! # outbox.emit(&mut tx, &OrderPlaced { order_id: "o-1".into(), total_cents: 1 }).await?;
//! # tx.commit().await?;
//! let kept = Kept::default();
//! let relay = Relay::start_postgres(pool.clone(), schema.clone(), kept.clone(), RelayConfig::default()).await?;
//!
//! // What an operator sees, without the relay handle.
//! let store = PgRelayStore::new(pool.clone(), schema.clone(), Default::default(), Duration::from_secs(120));
//! while store.stats().await?.pending > 0 {
//!     tokio::time::sleep(Duration::from_millis(20)).await;
//! }
//! assert!(relay.health().is_up());
//! relay.drain(Duration::from_secs(5)).await?;
//! assert_eq!(kept.0.lock().unwrap()[0].aggregate_id, "o-1");
//! # sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {} CASCADE", schema.quoted()))).execute(&pool).await?;
//! # Ok(()) }
//! ```
//!
//! ## A consumer
//!
//! ```
//! # use outbox_core::{Envelope, OutboxEvent};
//! # use outbox_postgres::{Outbox, SchemaName};
//! use outbox_core::consumer::{ConsumerBuilder, HandlerError, Outcome, Received};
//! use outbox_postgres::prelude::*;
//! # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, OutboxEvent)]
//! # #[outbox(event_type = "doc.order_billed", aggregate = "doc_bill", version = 1)]
//! # struct OrderPlaced { #[outbox(aggregate_id)] order_id: String, total_cents: i64 }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
//! # let pool = sqlx::PgPool::connect(&url).await?;
//! # let schema = SchemaName::new(format!("doc_consumer_{}", std::process::id()))?;
//! # Outbox::new(schema.clone()).migrate(&pool).await?;
//! # let s = schema.quoted();
//! # sqlx::query(sqlx::AssertSqlSafe(format!("CREATE TABLE {s}.invoices (order_id text PRIMARY KEY, cents bigint)"))).execute(&pool).await?;
//! let invoices = format!("INSERT INTO {s}.invoices (order_id, cents) VALUES ($1, $2)");
//! let consumer = ConsumerBuilder::new("billing")
//!     .on_fn(move |order: Received<OrderPlaced>, tx| {
//!         let invoices = invoices.clone();
//!         Box::pin(async move {
//!             sqlx::query(sqlx::AssertSqlSafe(invoices))
//!                 .bind(&order.event.order_id)
//!                 .bind(order.event.total_cents)
//!                 .execute(&mut *tx)
//!                 .await?;
//!             Ok::<(), HandlerError>(())
//!         })
//!     })
//!     .build(pool.clone(), schema.clone())?;
//!
//! // Usually fed by a broker crate's source (`consumer.spawn(source)`);
//! // any envelope works too.
//! let event = Envelope::for_event(&OrderPlaced { order_id: "o-1".into(), total_cents: 4200 }, 1)?;
//! assert_eq!(consumer.handle_envelope(&event).await?, Outcome::Applied);
//! assert_eq!(consumer.handle_envelope(&event).await?, Outcome::Duplicate);
//! # sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {s} CASCADE"))).execute(&pool).await?;
//! # Ok(()) }
//! ```

mod audit;
mod consumer;
mod emit;
mod migrate;
pub mod ops;
mod ops_sql;
mod relay;
pub mod retention;
mod session;
mod sql;
mod start;

pub use consumer::PgConsumerStore;
pub use emit::{Outbox, emit, emit_all};
pub use migrate::{MigrateError, migrate, migrations, migrator};
pub use ops::Ops;
pub use outbox_core::store::{ConfigError, SchemaName};
pub use relay::{
    ClaimPlan, ClaimVariant, DEFAULT_LEASE, DEFAULT_REBALANCE_INTERVAL, DEFAULT_STATEMENT_TIMEOUT,
    PgClaim, PgRelayStore, PgWakeups,
};
pub use start::{ConsumerBuilderPostgresExt, PgConsumer, PgConsumerBuilder, RelayPostgresExt};

/// The extension traits that put the PostgreSQL entry points on the
/// engine's types: `Relay::start_postgres(..)` and
/// `ConsumerBuilder::new(..) … .build(pool, schema)`.
pub mod prelude {
    pub use crate::start::{ConsumerBuilderPostgresExt, RelayPostgresExt};
}

use outbox_core::relay::StoreError;

/// Whether PostgreSQL answered `error` with the SQLSTATE `code` (e.g.
/// `57014`, a cancelled statement).
pub(crate) fn has_sqlstate(error: &sqlx::Error, code: &str) -> bool {
    error
        .as_database_error()
        .and_then(|error| error.code())
        .is_some_and(|found| found == code)
}

/// Whether PostgreSQL cancelled the statement (SQLSTATE 57014: its
/// statement timeout, or a cancel request).
pub(crate) fn is_statement_timeout(error: &StoreError) -> bool {
    has_sqlstate(&error.source, "57014")
}
