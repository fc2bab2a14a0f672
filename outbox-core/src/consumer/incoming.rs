//! A message as a source delivers it, and what became of it.

use std::time::Duration;

use crate::envelope::{Envelope, EnvelopeError};

/// A message from a source: CloudEvents attributes (names without any
/// transport prefix: `id`, `type`, `schemaversion`, ...), the raw payload
/// bytes, and the delivery attempt. Kept raw so a message that cannot be
/// read is quarantined byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incoming {
    attributes: Vec<(String, String)>,
    payload: Vec<u8>,
    attempt: u32,
}

impl Incoming {
    /// A message with its attributes, payload and attempt (1 = first delivery).
    pub fn new(attributes: Vec<(String, String)>, payload: Vec<u8>, attempt: u32) -> Incoming {
        Incoming {
            attributes,
            payload,
            attempt: attempt.max(1),
        }
    }

    /// The message a relay would publish for `envelope`.
    pub fn from_envelope(envelope: &Envelope, attempt: u32) -> Incoming {
        let attributes = envelope
            .cloudevents_attributes("/outbox")
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect();
        Incoming::new(
            attributes,
            envelope.payload.get().as_bytes().to_vec(),
            attempt,
        )
    }

    /// One attribute's value.
    pub fn attribute(&self, name: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// Every attribute.
    pub fn attributes(&self) -> &[(String, String)] {
        &self.attributes
    }

    /// The payload bytes.
    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    /// This delivery's attempt number (1 for the first).
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// The envelope, or what is wrong with the message.
    pub fn envelope(&self) -> Result<Envelope, EnvelopeError> {
        Envelope::from_cloudevents(|name| self.attribute(name), &self.payload)
    }

    /// The attributes as a JSON object (for quarantine rows).
    pub(crate) fn headers_json(&self) -> serde_json::Value {
        serde_json::Value::Object(
            self.attributes
                .iter()
                // jsonb cannot hold NUL characters.
                .map(|(k, v)| {
                    (
                        k.replace('\0', "\u{fffd}"),
                        serde_json::Value::String(v.replace('\0', "\u{fffd}")),
                    )
                })
                .collect(),
        )
    }
}

/// What the consumer did with a message. Every variant but
/// [`Outcome::Retry`] means "acknowledge it".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The handler ran and its transaction committed.
    Applied,
    /// The inbox already held this event: nothing was done again.
    Duplicate,
    /// The aggregate's position is at or past this version: not applied.
    Stale {
        /// The position when the message arrived.
        position: Option<i64>,
    },
    /// Strict ordering: a predecessor is missing; the message waits in the
    /// parked table.
    Parked {
        /// The version it waits for.
        waiting_for: i64,
    },
    /// The message cannot be read; it is in the quarantine with the reason.
    Quarantined {
        /// Why.
        reason: String,
    },
    /// The event type is one this consumer ignores on purpose.
    Ignored,
    /// The handler failed; deliver again after `delay`.
    Retry {
        /// The backoff delay.
        delay: Duration,
        /// The handler's error.
        error: String,
    },
    /// The handler failed for good or too often; the message is in the
    /// dead letters with the reason.
    DeadLettered {
        /// Why.
        reason: String,
    },
}

impl Outcome {
    /// The metric label of this outcome.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Duplicate => "duplicate",
            Outcome::Stale { .. } => "stale",
            Outcome::Parked { .. } => "parked",
            Outcome::Quarantined { .. } => "quarantined",
            Outcome::Ignored => "ignored",
            Outcome::Retry { .. } => "retry",
            Outcome::DeadLettered { .. } => "dead_lettered",
        }
    }

    /// Whether the message should be acknowledged.
    pub fn acknowledge(&self) -> bool {
        !matches!(self, Outcome::Retry { .. })
    }
}
