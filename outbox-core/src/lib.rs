//! # outbox-core
//!
//! Typed events and the transactional outbox for Rust services.
//!
//! - [`OutboxEvent`] (derive it with `#[derive(OutboxEvent)]`) turns a struct
//!   into a versioned event contract: event type, aggregate type, schema
//!   version, aggregate id, redacted fields, upcasting from older versions.
//! - [`ContractRegistry`] lists every contract linked into the binary.
//! - [`Envelope`] carries an event with its metadata and maps onto
//!   CloudEvents attributes on the wire.
//!
//! The honest contract: the business change and the outbox row commit
//! together or not at all; the relay publishes at least once; consumers
//! apply their database effects once per (consumer, event id); ordering is
//! per aggregate, never global.

#[cfg(feature = "postgres")]
pub mod audit;
#[cfg(feature = "postgres")]
pub mod consumer;
mod contract;
#[cfg(feature = "postgres")]
mod emit;
mod envelope;
pub mod failpoint;
#[cfg(feature = "postgres")]
pub mod metrics;
mod redact;
mod registry;
#[cfg(feature = "postgres")]
pub mod relay;
#[cfg(feature = "postgres")]
pub mod store;
pub mod trace;
#[cfg(feature = "postgres")]
pub mod transport;
mod upcast;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use contract::{ContractKey, EventContract, OutboxEvent, PayloadError, UpcastKind, UpcastLink};
#[cfg(feature = "postgres")]
pub use emit::{EmitError, EmitOptions, EmitOutcome, Emitted, EventDraft, Outbox, emit, emit_all};
pub use envelope::{Envelope, EnvelopeError, ce, dataschema_uri};
pub use redact::{REDACTED, mask_all, mask_fields, redacted_payload, scrub_message};
pub use registry::{ContractRegistry, RegistryError, RegistryErrors, submitted_contracts};
pub use upcast::{BoxError, DecodeError, PayloadMismatch, UpcastError, UpcastFailure};

/// Derives [`OutboxEvent`] for a struct with named fields; see the crate
/// README for every attribute.
#[cfg(feature = "derive")]
pub use outbox_derive::OutboxEvent;

pub use schemars;
pub use serde_json;
