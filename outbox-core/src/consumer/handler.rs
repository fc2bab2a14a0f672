//! Typed handlers and what they receive.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use uuid::Uuid;

use crate::contract::OutboxEvent;
use crate::envelope::Envelope;
use crate::upcast::{BoxError, DecodeError};

/// The namespace of idempotency keys (UUID v5 of `consumer/event id`).
const IDEMPOTENCY_NAMESPACE: Uuid = Uuid::from_u128(0x6f75_7462_6f78_4b65_9e1d_2c7a_5b3f_0a01);

/// The stable idempotency key of (consumer, event): the same on every
/// delivery and every instance, different for each consumer.
pub fn idempotency_key(consumer: &str, event_id: Uuid) -> Uuid {
    let mut name = Vec::with_capacity(consumer.len() + 37);
    name.extend_from_slice(consumer.as_bytes());
    name.push(b'/');
    name.extend_from_slice(event_id.as_hyphenated().to_string().as_bytes());
    Uuid::new_v5(&IDEMPOTENCY_NAMESPACE, &name)
}

/// The envelope metadata of a received event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventMeta {
    /// The event id (the inbox key, with the consumer's name).
    pub event_id: Uuid,
    /// The event type.
    pub event_type: String,
    /// The schema version the message was written with (before upcasting).
    pub schema_version: u32,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The aggregate version.
    pub aggregate_version: i64,
    /// When the producer emitted it.
    pub occurred_at: DateTime<Utc>,
    /// The W3C trace context of the producer, when it had one.
    pub traceparent: Option<String>,
    /// This delivery's attempt number (1 for the first).
    pub attempt: u32,
    /// The consumer's name.
    pub consumer: Arc<str>,
}

impl EventMeta {
    pub(crate) fn new(envelope: &Envelope, attempt: u32, consumer: &Arc<str>) -> EventMeta {
        EventMeta {
            event_id: envelope.id,
            event_type: envelope.event_type.clone(),
            schema_version: envelope.schema_version,
            aggregate_type: envelope.aggregate_type.clone(),
            aggregate_id: envelope.aggregate_id.clone(),
            aggregate_version: envelope.aggregate_version,
            occurred_at: envelope.occurred_at,
            traceparent: envelope.traceparent.clone(),
            attempt,
            consumer: Arc::clone(consumer),
        }
    }

    /// A key for external side effects (an HTTP `Idempotency-Key`, a
    /// payment provider's request id, an e-mail's message id) that is the
    /// same on every redelivery of this event to this consumer. The inbox
    /// protects database effects; this key lets the other system drop the
    /// repeat when the handler ran, called out, and then failed or crashed
    /// before its transaction committed.
    pub fn idempotency_key(&self) -> Uuid {
        idempotency_key(&self.consumer, self.event_id)
    }
}

/// A decoded event (upcast to the handler's version) with its metadata.
#[derive(Debug, Clone)]
pub struct Received<E> {
    /// The event, at the handler's schema version.
    pub event: E,
    /// Its envelope metadata.
    pub meta: EventMeta,
}

/// Why a handler failed.
///
/// `?` converts any error into a retryable one; return
/// [`HandlerError::permanent`] for a message that no retry can fix (it goes
/// to the dead letters at once).
///
/// Before the consumer shows or stores a failure anywhere (the
/// [`Outcome::Retry`](super::Outcome::Retry) error, its log lines, a dead
/// letter's reason, a parked message's last error), the error is reduced
/// to its text with the event's redacted values taken out
/// ([`scrub_with_secrets`](crate::scrub_with_secrets)): a database
/// error that quotes a `#[outbox(redact)]` value the handler passed on
/// does not carry it further. Log the original inside the handler if you
/// need it, where you decide what is safe.
pub struct HandlerError {
    permanent: bool,
    source: BoxError,
}

impl HandlerError {
    /// A failure worth retrying (a timeout, a lock conflict, a dependency down).
    pub fn retryable(error: impl Into<BoxError>) -> HandlerError {
        HandlerError {
            permanent: false,
            source: error.into(),
        }
    }

    /// A failure no retry fixes (a business rule rejects the event).
    pub fn permanent(error: impl Into<BoxError>) -> HandlerError {
        HandlerError {
            permanent: true,
            source: error.into(),
        }
    }

    /// Whether retrying is pointless.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The same failure with its text replaced (by its redacted form).
    pub(crate) fn with_message(self, message: String) -> HandlerError {
        HandlerError {
            permanent: self.permanent,
            source: message.into(),
        }
    }

    /// The underlying error.
    pub fn source(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }
}

impl<E: Into<BoxError>> From<E> for HandlerError {
    fn from(error: E) -> Self {
        HandlerError::retryable(error)
    }
}

impl fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HandlerError")
            .field("permanent", &self.permanent)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for HandlerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

/// Handles one event type inside the consumer's transaction.
///
/// Implement it with `async fn` on a struct that holds what the handler
/// needs, or pass a closure to
/// [`ConsumerBuilder::on_fn`](super::ConsumerBuilder::on_fn). Every database
/// effect goes through `tx`, the consumer's transaction: it commits with the
/// inbox row or not at all.
///
/// `C` is the connection type of the consumer's store: `PgConnection` on
/// PostgreSQL, `SqliteConnection` on SQLite, `MySqlConnection` on MySQL.
pub trait Handler<E: OutboxEvent, C: Send + 'static>: Send + Sync + 'static {
    /// Applies `event`.
    fn handle(
        &self,
        event: Received<E>,
        tx: &mut C,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send;
}

/// A handler made from a closure returning a boxed future.
pub(crate) struct FnHandler<F>(pub(crate) F);

impl<E, C, F> Handler<E, C> for FnHandler<F>
where
    E: OutboxEvent,
    C: Send + 'static,
    F: for<'a> Fn(Received<E>, &'a mut C) -> BoxFuture<'a, Result<(), HandlerError>>
        + Send
        + Sync
        + 'static,
{
    fn handle(
        &self,
        event: Received<E>,
        tx: &mut C,
    ) -> impl Future<Output = Result<(), HandlerError>> + Send {
        (self.0)(event, tx)
    }
}

/// A decoded event of some type, ready for its handler.
pub(crate) type Decoded = Box<dyn Any + Send>;

/// A handler with its event type erased; `C` is the store's connection.
pub(crate) trait Dispatch<C>: Send + Sync {
    fn event_type(&self) -> &'static str;
    fn aggregate_type(&self) -> &'static str;
    fn version(&self) -> u32;
    fn readable_from(&self) -> u32;
    fn rust_type(&self) -> &'static str;
    /// Decodes and upcasts a payload of any readable version.
    fn decode(&self, envelope: &Envelope) -> Result<Decoded, DecodeError>;
    /// The values of the handler version's redacted fields in the
    /// decoded payload (decoded again: only a failure asks for them).
    fn secrets(&self, envelope: &Envelope) -> Vec<String>;
    /// Runs the handler on a value `decode` returned.
    fn run<'a>(
        &'a self,
        decoded: Decoded,
        meta: EventMeta,
        tx: &'a mut C,
    ) -> BoxFuture<'a, Result<(), HandlerError>>;
}

/// The typed handler behind a [`Dispatch`].
pub(crate) struct Typed<E, H> {
    handler: H,
    _event: PhantomData<fn() -> E>,
}

impl<E, H> Typed<E, H> {
    pub(crate) fn new(handler: H) -> Self {
        Typed {
            handler,
            _event: PhantomData,
        }
    }
}

impl<E: OutboxEvent, C: Send + 'static, H: Handler<E, C>> Dispatch<C> for Typed<E, H> {
    fn event_type(&self) -> &'static str {
        E::EVENT_TYPE
    }

    fn aggregate_type(&self) -> &'static str {
        E::AGGREGATE_TYPE
    }

    fn version(&self) -> u32 {
        E::SCHEMA_VERSION
    }

    fn readable_from(&self) -> u32 {
        E::READABLE_FROM
    }

    fn rust_type(&self) -> &'static str {
        std::any::type_name::<E>()
    }

    fn decode(&self, envelope: &Envelope) -> Result<Decoded, DecodeError> {
        E::decode(envelope.schema_version, &envelope.payload)
            .map(|event| Box::new(event) as Decoded)
    }

    fn secrets(&self, envelope: &Envelope) -> Vec<String> {
        if E::REDACTED_FIELDS.is_empty() {
            return Vec::new();
        }
        E::decode(envelope.schema_version, &envelope.payload)
            .ok()
            .and_then(|event| serde_json::to_value(&event).ok())
            .map(|value| crate::redact::secret_values(&value, Some(E::REDACTED_FIELDS)))
            .unwrap_or_default()
    }

    fn run<'a>(
        &'a self,
        decoded: Decoded,
        meta: EventMeta,
        tx: &'a mut C,
    ) -> BoxFuture<'a, Result<(), HandlerError>> {
        match decoded.downcast::<E>() {
            Ok(event) => Box::pin(self.handler.handle(
                Received {
                    event: *event,
                    meta,
                },
                tx,
            )),
            // Unreachable by construction (decode and run belong to one
            // Typed); reported as an error, not a panic.
            Err(_) => Box::pin(async {
                Err(HandlerError::permanent(format!(
                    "internal: decoded value is not a {}",
                    std::any::type_name::<E>()
                )))
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_stable_per_consumer_and_event() {
        let event = Uuid::from_u128(42);
        assert_eq!(idempotency_key("a", event), idempotency_key("a", event));
        assert_ne!(idempotency_key("a", event), idempotency_key("b", event));
        assert_ne!(
            idempotency_key("a", event),
            idempotency_key("a", Uuid::from_u128(43))
        );
        assert_eq!(idempotency_key("a", event).get_version_num(), 5);
    }
}
