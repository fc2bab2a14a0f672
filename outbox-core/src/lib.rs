//! # outbox-core
//!
//! Typed events and the transactional outbox for Rust services.
//!
//! - [`OutboxEvent`] (derive it with `#[derive(OutboxEvent)]`) turns a struct
//!   into a versioned event contract: event type, aggregate type, schema
//!   version, aggregate id, redacted fields, upcasting from older versions.
//! - A store crate writes an event in the caller's own sqlx transaction and
//!   keeps the relay's and consumers' tables: `outbox-postgres`
//!   (`outbox_postgres::Outbox::emit`), `outbox-sqlite` (no server at all)
//!   and `outbox-mysql` (MySQL 8 and MariaDB), on the seams this crate
//!   defines.
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
//!   for every store crate (`outbox-postgres`, `outbox-sqlite`,
//!   `outbox-mysql`); this crate names no database and compiles no
//!   database driver.
//! - `failpoints`: the failure windows forced in tests ([`failpoint`]).
//! - `opentelemetry`: trace context from and to OpenTelemetry spans.
//!
//! Every runnable example of a store (emit, relay, consumer) is in its
//! crate's documentation: `outbox-postgres`, `outbox-sqlite`,
//! `outbox-mysql`.
//!
//! ## A contract
//!
//! ```
//! use outbox_core::{Envelope, OutboxEvent};
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
//! let event = OrderPlaced { order_id: "o-1".into(), email: "ada@example.org".into(), total_cents: 4200 };
//! let envelope = Envelope::for_event(&event, 1)?;
//! assert_eq!(envelope.event_type, "doc.order_placed");
//! assert_eq!(envelope.aggregate_id, "o-1");
//! # Ok::<(), Box<dyn std::error::Error>>(())
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
pub use emit::{EmitError, EmitOptions, EmitOutcome, Emitted, EventDraft, EventDraftParts};
pub use envelope::{Envelope, EnvelopeError, ce, dataschema_uri, dataschema_uri_with_base};
pub use redact::{
    REDACTED, mask_all, mask_fields, redacted_payload, scrub_message, scrub_with_secrets,
    secret_values,
};
pub use registry::{ContractRegistry, RegistryError, RegistryErrors, submitted_contracts};
pub use upcast::{BoxError, DecodeError, PayloadMismatch, UpcastError, UpcastFailure};

/// Derives [`OutboxEvent`] for a struct with named fields; see the crate
/// README for every attribute.
#[cfg(feature = "derive")]
pub use outbox_derive::OutboxEvent;

pub use schemars;
pub use serde_json;
