//! # outbox-core
//!
//! Typed events and the transactional outbox for Rust services.
//!
//! - [`OutboxEvent`] (derive it with `#[derive(OutboxEvent)]`) turns a struct
//!   into a versioned event contract: event type, aggregate type, schema
//!   version, aggregate id, redacted fields, upcasting from older versions.
//! - [`Outbox::emit`] writes an event in the caller's own sqlx transaction.
//! - [`relay::Relay`] publishes committed events at least once, in order per
//!   aggregate, through a [`transport::Transport`] (the crates
//!   `outbox-nats`, `outbox-kafka` and `outbox-rabbitmq` implement it).
//! - [`consumer::ConsumerBuilder`] builds a consumer that applies each event
//!   once per consumer in its own transaction, with typed handlers, ordering
//!   policies, quarantine, dead letters and [`consumer::Consumer::replay`].
//! - [`ContractRegistry`] lists every contract linked into the binary (the
//!   `outbox-codegen` crate turns it into a schema registry that CI checks).
//!
//! The honest contract: the business change and the outbox row commit
//! together or not at all; the relay publishes at least once; consumers
//! apply their database effects once per (consumer, event id); ordering is
//! per aggregate, never global.
//!
//! ## Features
//!
//! - `derive` (default): `#[derive(OutboxEvent)]`.
//! - `runtime`: the engine on sqlx's database-neutral traits, with no
//!   driver: relay and consumer loops, ordering, replay, audit, the
//!   operations API's types and the store seams
//!   ([`relay::RelayStore`], [`consumer::ConsumerStore`],
//!   [`ops::OperationsStore`], [`ops::LetterStore`]), transports. Enough
//!   for `outbox-sqlite` and `outbox-mysql`; a service on one of them can
//!   leave out `postgres` and compiles no PostgreSQL driver.
//! - `postgres` (default; implies `runtime`): the PostgreSQL store
//!   ([`Outbox`], [`store::PgRelayStore`], [`store::PgConsumerStore`],
//!   [`ops::Ops`], migrations) and the default type parameters that name
//!   it (`Consumer<S = PgConsumerStore>`, `ConsumerBuilder<C =
//!   PgConnection>`, `Handler<E, C = PgConnection>`).
//! - `failpoints`: the failure windows forced in tests ([`failpoint`]).
//! - `opentelemetry`: trace context from and to OpenTelemetry spans.
//!
//! The examples below run against the PostgreSQL at `DATABASE_URL` (the
//! repository's `scripts/test.sh` starts it), each in a schema of its own.
//!
//! ## A contract and an emit
//!
//! ```
//! use outbox_core::{Outbox, OutboxEvent};
//! use outbox_core::store::SchemaName;
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
//! The relay talks to a broker through the [`transport::Transport`] seam;
//! the broker crates implement it (`outbox_nats::NatsTransport`,
//! `outbox_kafka::KafkaTransport`, `outbox_rabbitmq::RabbitTransport`).
//! Here a transport that keeps what it is given:
//!
//! ```
//! # use outbox_core::{Outbox, OutboxEvent};
//! # use outbox_core::store::SchemaName;
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//! use outbox_core::Envelope;
//! use outbox_core::relay::{Relay, RelayConfig, RelayStore};
//! use outbox_core::store::PgRelayStore;
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
//! # use outbox_core::{Envelope, Outbox, OutboxEvent};
//! # use outbox_core::store::SchemaName;
//! use outbox_core::consumer::{ConsumerBuilder, HandlerError, Outcome, Received};
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

#[cfg(feature = "runtime")]
pub mod audit;
#[cfg(feature = "runtime")]
pub mod consumer;
mod contract;
#[cfg(feature = "runtime")]
mod emit;
pub mod encoding;
mod envelope;
pub mod failpoint;
#[cfg(feature = "runtime")]
pub mod metrics;
#[cfg(feature = "runtime")]
pub mod ops;
mod redact;
mod registry;
#[cfg(feature = "runtime")]
pub mod relay;
#[cfg(feature = "runtime")]
pub mod store;
pub mod trace;
#[cfg(feature = "runtime")]
pub mod transport;
mod upcast;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use contract::{
    CompatibilityMode, ContractKey, EventContract, OutboxEvent, PayloadError, UpcastKind,
    UpcastLink,
};
#[cfg(feature = "runtime")]
pub use emit::{EmitError, EmitOptions, EmitOutcome, Emitted, EventDraft};
pub use envelope::{Envelope, EnvelopeError, ce, dataschema_uri, dataschema_uri_with_base};
pub use redact::{
    REDACTED, mask_all, mask_fields, redacted_payload, scrub_message, scrub_with_secrets,
    secret_values,
};
pub use registry::{ContractRegistry, RegistryError, RegistryErrors, submitted_contracts};
#[cfg(feature = "postgres")]
pub use store::{Outbox, emit, emit_all};
pub use upcast::{BoxError, DecodeError, PayloadMismatch, UpcastError, UpcastFailure};

/// Derives [`OutboxEvent`] for a struct with named fields; see the crate
/// README for every attribute.
#[cfg(feature = "derive")]
pub use outbox_derive::OutboxEvent;

pub use schemars;
pub use serde_json;
