//! The transport seam: how the relay hands events to a broker. The relay
//! knows this trait only. Each broker is its own crate behind it:
//! `outbox-nats` (NATS JetStream), `outbox-kafka` and `outbox-rabbitmq`;
//! the consumer side of each implements
//! [`MessageSource`](crate::consumer::MessageSource). [`InProcessBus`]
//! needs no broker: it hands events to the consumers of the same process
//! and acknowledges a publish only once each of them committed it.

pub use crate::encoding;
mod in_process;
mod source;
pub mod template;

pub use in_process::{InProcessBus, InProcessDelivery, InProcessSource, InProcessTransport};
pub use source::{default_source, source_of, validate_source};

use std::fmt;
use std::future::Future;

use crate::envelope::Envelope;

/// Why one message was not acknowledged by the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishFailure {
    /// Whether trying again can help (a timeout, a broker that is down) or
    /// not (a message the broker will never accept, such as one over its
    /// size limit). Permanent failures go to the failed state at once.
    pub retryable: bool,
    /// What the broker or client said.
    pub reason: String,
}

impl PublishFailure {
    /// A failure worth retrying.
    pub fn retryable(reason: impl Into<String>) -> Self {
        PublishFailure {
            retryable: true,
            reason: reason.into(),
        }
    }

    /// A failure no retry can fix.
    pub fn permanent(reason: impl Into<String>) -> Self {
        PublishFailure {
            retryable: false,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for PublishFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.retryable {
            "retryable"
        } else {
            "permanent"
        };
        write!(f, "{kind}: {}", self.reason)
    }
}

/// Whether a transport can publish now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportHealth {
    /// Connected, and the destination (stream, topic, exchange) is ready.
    Up,
    /// Not connected, or the destination is not ready; publishing would
    /// only fail.
    Down {
        /// What is wrong, for logs and health endpoints.
        reason: String,
    },
    /// Connected and publishing, but something needs an operator's look:
    /// some events would fail (a Kafka topic the contracts map to does
    /// not exist, say). The relay publishes as when up and reports the
    /// reason.
    Degraded {
        /// What needs a look.
        reason: String,
    },
}

impl TransportHealth {
    /// Whether the transport can publish: [`TransportHealth::Up`] or
    /// [`TransportHealth::Degraded`].
    pub fn is_up(&self) -> bool {
        !matches!(self, TransportHealth::Down { .. })
    }
}

/// Publishes events to a broker.
pub trait Transport: Send + Sync + 'static {
    /// Publishes `events` and waits for the broker's acknowledgement of each
    /// one; returns one outcome per event, in the same order. The relay
    /// never passes two events of one aggregate in one call, so the
    /// transport may send all of them at once.
    fn publish(
        &self,
        events: &[&Envelope],
    ) -> impl Future<Output = Vec<Result<(), PublishFailure>>> + Send;

    /// A short name for logs and metrics (`nats`).
    fn name(&self) -> &'static str;

    /// Whether the broker can take messages now. The relay asks before each
    /// claim and claims nothing while the transport is down, so a broker
    /// outage leaves events pending with their attempts untouched instead
    /// of walking them towards the failed state. Must be cheap when the
    /// transport is up (a flag or a connection state, no round trip). The
    /// default says up.
    fn health(&self) -> impl Future<Output = TransportHealth> + Send {
        async { TransportHealth::Up }
    }
}
