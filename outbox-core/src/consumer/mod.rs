//! Consumers: typed handlers that apply each event once per consumer,
//! inside the consumer's own database transaction.
//!
//! Per message: `BEGIN`; insert (consumer, event id) into the inbox (a
//! conflict means a duplicate: count it, change nothing, acknowledge);
//! apply the [`Ordering`] policy with the aggregate's position; decode and
//! upcast the payload to the handler's version; run the handler with the
//! transaction; `COMMIT`; only then acknowledge the broker message. A crash
//! before the commit redelivers and starts over; a crash after the commit
//! meets the inbox key and changes nothing.
//!
//! ```no_run
//! # use outbox_core::consumer::{ConsumerBuilder, HandlerError, Received};
//! # use outbox_core::OutboxEvent;
//! use outbox_postgres::prelude::*; // on PostgreSQL: ConsumerBuilder::new, .build(pool, schema)
//! # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, OutboxEvent)]
//! # #[outbox(event_type = "order.created", aggregate = "order", version = 1)]
//! # struct OrderCreated { #[outbox(aggregate_id)] order_id: String, total_cents: i64 }
//! # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! let consumer = ConsumerBuilder::new("billing")
//!     .on_fn(|order: Received<OrderCreated>, tx| {
//!         Box::pin(async move {
//!             sqlx::query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
//!                 .bind(&order.event.order_id)
//!                 .bind(order.event.total_cents)
//!                 .execute(&mut *tx)
//!                 .await?;
//!             Ok::<(), HandlerError>(())
//!         })
//!     })
//!     .build(pool, outbox_core::store::SchemaName::new("outbox")?)?;
//! # Ok(()) }
//! ```
//!
//! Messages of its own aggregate types that cannot be read (no contract
//! for the event type, a schema version newer than the handler's, a
//! payload that does not decode or upcast) go to the quarantine with the
//! raw bytes, the headers and the reason, and are acknowledged. A handler
//! that fails is retried with backoff up to [`RetryPolicy::max_attempts`]
//! deliveries, then the message goes to the dead letters with the last
//! error. Other aggregates go on. Neither holds an inbox row, so after a
//! fix [`Consumer::replay`] applies them once. Events of aggregate types
//! the consumer has no handler for are acknowledged as
//! [`Outcome::Foreign`]: nothing about them is stored.

mod batch;
mod builder;
mod config;
mod handler;
mod incoming;
mod process;
mod replay;
mod runner;
mod source;
mod stats;
pub mod store;
mod strict;

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

pub use builder::{BuildError, BuildErrors, ConsumerBuilder};
pub use config::{ConsumerConfig, MAX_BATCH_SIZE, Ordering, RetryPolicy, StrictStart};
pub use handler::{EventMeta, Handler, HandlerError, Received, idempotency_key};
pub use incoming::{Incoming, Outcome};
pub use process::{ConsumerError, HANDLER_ENDED_TRANSACTION, SWALLOWED};
pub use replay::{ReplayError, ReplayOutcome, ReplayReport};
pub use runner::ConsumerTask;
pub use source::{
    ChannelDelivery, ChannelSender, ChannelSource, ChannelStats, ChannelStatsHandle, Delivery,
    MessageSource, SourceError, channel,
};
pub use store::{CheckedCommit, ConsumerStore, StoreConnection};
pub use strict::SweepReport;

pub use config::validate_name as validate_consumer_name;

use crate::registry::ContractRegistry;
use handler::Dispatch;

/// A built consumer. Cheap to clone; every clone shares the handlers.
/// Run it with [`Consumer::spawn`] on a [`MessageSource`], or feed it
/// messages yourself with [`Consumer::handle`] / [`Consumer::handle_batch`].
///
/// `S` is the store it keeps its inbox, positions and letters in (built
/// with [`ConsumerBuilder::build_on`]).
pub struct Consumer<S: ConsumerStore> {
    inner: Arc<Inner<S>>,
}

impl<S: ConsumerStore> Clone for Consumer<S> {
    fn clone(&self) -> Self {
        Consumer {
            inner: Arc::clone(&self.inner),
        }
    }
}

pub(crate) struct Inner<S: ConsumerStore> {
    pub(crate) name: Arc<str>,
    pub(crate) store: S,
    pub(crate) handlers: HashMap<&'static str, Box<dyn Dispatch<StoreConnection<S>>>>,
    pub(crate) ignored: BTreeSet<String>,
    /// The aggregate types of its handlers and ignored types: events of
    /// any other aggregate type are foreign to it.
    pub(crate) aggregate_types: BTreeSet<&'static str>,
    /// The contracts it was checked against (those linked into the binary,
    /// unless the builder was given others).
    pub(crate) registry: ContractRegistry,
    /// Strict only: (aggregate type, event type) of ignored types that still
    /// move positions, so they must be delivered.
    pub(crate) skipped_types: Vec<(&'static str, &'static str)>,
    pub(crate) config: ConsumerConfig,
    /// Counts written to `outbox_consumer_stats` at each flush.
    pub(crate) tally: stats::Tally,
}

impl<S: ConsumerStore> fmt::Debug for Consumer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Consumer")
            .field("name", &self.inner.name)
            .field("store", &std::any::type_name::<S>())
            .field("event_types", &self.event_types())
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl<S: ConsumerStore> Consumer<S> {
    /// The consumer's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Its settings.
    pub fn config(&self) -> &ConsumerConfig {
        &self.inner.config
    }

    /// The (aggregate type, event type) pairs it handles, sorted.
    pub fn event_types(&self) -> Vec<(&'static str, &'static str)> {
        let mut types: Vec<_> = self
            .inner
            .handlers
            .values()
            .map(|h| (h.aggregate_type(), h.event_type()))
            .collect();
        types.sort_unstable();
        types
    }

    /// The (aggregate type, event type) pairs it must receive: those it
    /// handles and, under strict ordering, the ignored types of the same
    /// aggregates (they move positions). A source's subject filter covers
    /// these.
    pub fn subscribed_types(&self) -> Vec<(&'static str, &'static str)> {
        let mut types = self.event_types();
        types.extend(self.inner.skipped_types.iter().copied());
        types.sort_unstable();
        types.dedup();
        types
    }
}
