//! A message as a source delivers it, and what became of it.

use std::time::Duration;

use crate::envelope::{Envelope, EnvelopeError};

/// A message from a source: CloudEvents attributes (names without any
/// transport prefix: `id`, `type`, `schemaversion`, ...), the raw payload
/// bytes, and the delivery attempt. Kept raw so a message that cannot be
/// read is quarantined byte for byte.
#[derive(Clone, PartialEq, Eq)]
pub struct Incoming {
    attributes: Vec<(String, String)>,
    payload: Vec<u8>,
    attempt: u32,
    /// Why the source could not read the message's headers, if it could not.
    problem: Option<String>,
}

impl Incoming {
    /// A message with its attributes, payload and attempt (1 = first delivery).
    pub fn new(attributes: Vec<(String, String)>, payload: Vec<u8>, attempt: u32) -> Incoming {
        Incoming {
            attributes,
            payload,
            attempt: attempt.max(1),
            problem: None,
        }
    }

    /// A message whose headers the source could not decode (a malformed
    /// percent-encoding, say): the consumer quarantines it with `reason`.
    pub fn malformed(
        attributes: Vec<(String, String)>,
        payload: Vec<u8>,
        attempt: u32,
        reason: impl Into<String>,
    ) -> Incoming {
        Incoming {
            problem: Some(reason.into()),
            ..Incoming::new(attributes, payload, attempt)
        }
    }

    /// Why the source could not read the headers, when it could not.
    pub fn problem(&self) -> Option<&str> {
        self.problem.as_deref()
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

impl std::fmt::Debug for Incoming {
    /// The payload is shown with the redacted fields of its contract
    /// masked (every value, when the message names no known contract).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let payload = std::str::from_utf8(&self.payload).map(|text| {
            let event_type = self.attribute(crate::envelope::ce::TYPE).unwrap_or("");
            let version = self
                .attribute(crate::envelope::ce::SCHEMAVERSION)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            crate::redact::redacted_payload(event_type, version, text)
        });
        let mut debug = f.debug_struct("Incoming");
        debug.field("attributes", &self.attributes);
        match payload {
            Ok(payload) => debug.field("payload", &format_args!("{payload}")),
            Err(_) => debug.field(
                "payload",
                &format_args!("[{} bytes, not UTF-8]", self.payload.len()),
            ),
        };
        debug
            .field("attempt", &self.attempt)
            .field("problem", &self.problem)
            .finish()
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
    /// The event belongs to an aggregate type this consumer has no handler
    /// for (another service's event in a shared stream): acknowledged,
    /// counted, nothing stored.
    Foreign,
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
            Outcome::Foreign => "foreign",
            Outcome::Retry { .. } => "retry",
            Outcome::DeadLettered { .. } => "dead_lettered",
        }
    }

    /// Whether the message should be acknowledged.
    pub fn acknowledge(&self) -> bool {
        !matches!(self, Outcome::Retry { .. })
    }
}
