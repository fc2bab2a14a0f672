//! The envelope: an event with its metadata, the durable contract between
//! producer, relay and consumer, and its CloudEvents mapping on the wire.
//!
//! The store crates and transports (`transport/`) convert from and to it;
//! this file owns the field list, the attribute names and their parsing.

use std::fmt;

use chrono::{DateTime, SecondsFormat, SubsecRound, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::contract::{OutboxEvent, PayloadError};
use crate::redact;
use crate::trace::TraceParent;

/// An event with its metadata. Its `Debug` and `Display` show the payload
/// with redacted fields masked ([`Envelope::redacted_payload`]).
#[derive(Clone, Serialize, Deserialize)]
pub struct Envelope {
    /// The event id (UUID v7): the identity consumers deduplicate on.
    pub id: Uuid,
    /// The event type (`order.created`).
    pub event_type: String,
    /// The schema version the payload was written with.
    pub schema_version: u32,
    /// The aggregate type (`order`).
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The aggregate's version after this event: the ordering key within
    /// one aggregate (1, 2, 3, ...).
    pub aggregate_version: i64,
    /// When the event was emitted.
    pub occurred_at: DateTime<Utc>,
    /// W3C trace context of the command that emitted the event.
    pub traceparent: Option<String>,
    /// The payload as JSON text.
    pub payload: Box<RawValue>,
}

impl Envelope {
    /// Wraps an event: a new UUID v7 id, now (to the microsecond) as
    /// `occurred_at`, the ambient
    /// trace context, and the given aggregate version.
    pub fn for_event<E: OutboxEvent>(
        event: &E,
        aggregate_version: i64,
    ) -> Result<Envelope, PayloadError> {
        Ok(Envelope {
            id: Uuid::now_v7(),
            event_type: E::EVENT_TYPE.to_owned(),
            schema_version: E::SCHEMA_VERSION,
            aggregate_type: E::AGGREGATE_TYPE.to_owned(),
            aggregate_id: event.aggregate_id(),
            aggregate_version,
            // Microseconds: what PostgreSQL and the wire format keep.
            occurred_at: Utc::now().trunc_subsecs(6),
            traceparent: crate::trace::current().map(|tp| tp.to_string()),
            payload: event.to_payload()?,
        })
    }

    /// The payload as a JSON value with the fields that the registered
    /// contract marks as redacted masked. An event type unknown to this
    /// binary is shown with every value masked, since nothing says which
    /// fields are safe.
    pub fn redacted_payload(&self) -> serde_json::Value {
        redact::redacted_payload(&self.event_type, self.schema_version, self.payload.get())
    }

    /// The CloudEvents attributes of this envelope (binary content mode),
    /// names without any transport prefix. `source` identifies the producing
    /// service (for example `/order-service`).
    pub fn cloudevents_attributes(&self, source: &str) -> Vec<(&'static str, String)> {
        self.cloudevents_attributes_with(source, None)
    }

    /// As [`Envelope::cloudevents_attributes`], with `dataschema` under a
    /// schema base URL ([`dataschema_uri_with_base`]).
    pub fn cloudevents_attributes_with(
        &self,
        source: &str,
        dataschema_base: Option<&str>,
    ) -> Vec<(&'static str, String)> {
        let mut attributes = vec![
            (ce::SPECVERSION, "1.0".to_owned()),
            (ce::ID, self.id.to_string()),
            (ce::SOURCE, source.to_owned()),
            (ce::TYPE, self.event_type.clone()),
            (ce::SUBJECT, self.aggregate_id.clone()),
            (
                ce::TIME,
                self.occurred_at
                    .to_rfc3339_opts(SecondsFormat::Micros, true),
            ),
            (ce::DATACONTENTTYPE, "application/json".to_owned()),
            (
                ce::DATASCHEMA,
                dataschema_uri_with_base(dataschema_base, &self.event_type, self.schema_version),
            ),
            (ce::SCHEMAVERSION, self.schema_version.to_string()),
            (ce::AGGREGATETYPE, self.aggregate_type.clone()),
            (ce::AGGREGATEID, self.aggregate_id.clone()),
            (ce::AGGREGATEVERSION, self.aggregate_version.to_string()),
        ];
        if let Some(traceparent) = &self.traceparent {
            attributes.push((ce::TRACEPARENT, traceparent.clone()));
        }
        attributes
    }

    /// Rebuilds an envelope from CloudEvents attributes (looked up by name
    /// without prefix) and the payload bytes. Every missing or malformed
    /// attribute is named in the error.
    pub fn from_cloudevents<'a>(
        attribute: impl Fn(&str) -> Option<&'a str>,
        payload: &[u8],
    ) -> Result<Envelope, EnvelopeError> {
        let required =
            |name: &'static str| attribute(name).ok_or(EnvelopeError::MissingAttribute { name });
        let invalid =
            |name: &'static str, value: &str, reason: String| EnvelopeError::InvalidAttribute {
                name,
                value: value.chars().take(80).collect(),
                reason,
            };
        let id_text = required(ce::ID)?;
        let id = Uuid::parse_str(id_text).map_err(|e| invalid(ce::ID, id_text, e.to_string()))?;
        let event_type = required(ce::TYPE)?.to_owned();
        let version_text = required(ce::SCHEMAVERSION)?;
        let schema_version: u32 = version_text.parse().map_err(|e: std::num::ParseIntError| {
            invalid(ce::SCHEMAVERSION, version_text, e.to_string())
        })?;
        let aggregate_type = required(ce::AGGREGATETYPE)?.to_owned();
        let aggregate_id = required(ce::AGGREGATEID)?.to_owned();
        let aggregate_version_text = required(ce::AGGREGATEVERSION)?;
        let aggregate_version: i64 =
            aggregate_version_text
                .parse()
                .map_err(|e: std::num::ParseIntError| {
                    invalid(ce::AGGREGATEVERSION, aggregate_version_text, e.to_string())
                })?;
        let time_text = required(ce::TIME)?;
        let occurred_at = DateTime::parse_from_rfc3339(time_text)
            .map_err(|e| invalid(ce::TIME, time_text, e.to_string()))?
            .with_timezone(&Utc);
        let traceparent = match attribute(ce::TRACEPARENT) {
            Some(text) => {
                text.parse::<TraceParent>()
                    .map_err(|e| invalid(ce::TRACEPARENT, text, e.reason.to_owned()))?;
                Some(text.to_owned())
            }
            None => None,
        };
        let payload_text = std::str::from_utf8(payload).map_err(|e| EnvelopeError::Payload {
            reason: format!("not UTF-8: {e}"),
        })?;
        let payload =
            RawValue::from_string(payload_text.to_owned()).map_err(|e| EnvelopeError::Payload {
                reason: format!("not JSON: {e}"),
            })?;
        Ok(Envelope {
            id,
            event_type,
            schema_version,
            aggregate_type,
            aggregate_id,
            aggregate_version,
            occurred_at,
            traceparent,
            payload,
        })
    }
}

impl fmt::Debug for Envelope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Envelope")
            .field("id", &self.id)
            .field("event_type", &self.event_type)
            .field("schema_version", &self.schema_version)
            .field("aggregate_type", &self.aggregate_type)
            .field("aggregate_id", &self.aggregate_id)
            .field("aggregate_version", &self.aggregate_version)
            .field("occurred_at", &self.occurred_at)
            .field("traceparent", &self.traceparent)
            .field("payload", &format_args!("{}", self.redacted_payload()))
            .finish()
    }
}

impl fmt::Display for Envelope {
    /// A one-line description with the payload redacted.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} v{} {} {}/{}@{} {}",
            self.event_type,
            self.schema_version,
            self.id,
            self.aggregate_type,
            self.aggregate_id,
            self.aggregate_version,
            self.redacted_payload()
        )
    }
}

/// The `dataschema` URI of an event type at a version when no schema base
/// is configured: `urn:outbox:schema:<event_type>:v<N>`, the `$id` of that
/// version's file in a schema registry folder without a base.
pub fn dataschema_uri(event_type: &str, schema_version: u32) -> String {
    format!("urn:outbox:schema:{event_type}:v{schema_version}")
}

/// The `dataschema` URI of an event type at a version: with a base (where
/// the registry folder is served, ending in `/`) the URL of the schema file,
/// `<base><event_type>/v<N>.json`, equal to that file's `$id`; without one,
/// [`dataschema_uri`].
pub fn dataschema_uri_with_base(
    base: Option<&str>,
    event_type: &str,
    schema_version: u32,
) -> String {
    match base {
        Some(base) => format!("{base}{event_type}/v{schema_version}.json"),
        None => dataschema_uri(event_type, schema_version),
    }
}

/// A message could not be read as an envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// A required attribute is missing.
    #[error("missing CloudEvents attribute `{name}`")]
    MissingAttribute {
        /// The attribute name (without transport prefix).
        name: &'static str,
    },
    /// An attribute has a value that cannot be parsed.
    #[error("invalid CloudEvents attribute `{name}` = {value:?}: {reason}")]
    InvalidAttribute {
        /// The attribute name.
        name: &'static str,
        /// The value (truncated).
        value: String,
        /// Why it was rejected.
        reason: String,
    },
    /// The payload is not JSON text.
    #[error("invalid payload: {reason}")]
    Payload {
        /// Why it was rejected.
        reason: String,
    },
}

/// CloudEvents attribute names used by the envelope mapping.
pub mod ce {
    /// `specversion`: always `1.0`.
    pub const SPECVERSION: &str = "specversion";
    /// `id`: the event id.
    pub const ID: &str = "id";
    /// `source`: the producing service.
    pub const SOURCE: &str = "source";
    /// `type`: the event type.
    pub const TYPE: &str = "type";
    /// `subject`: the aggregate id.
    pub const SUBJECT: &str = "subject";
    /// `time`: when the event occurred (RFC 3339).
    pub const TIME: &str = "time";
    /// `datacontenttype`: `application/json`.
    pub const DATACONTENTTYPE: &str = "datacontenttype";
    /// `dataschema`: URI of the payload's schema version.
    pub const DATASCHEMA: &str = "dataschema";
    /// Extension `schemaversion`.
    pub const SCHEMAVERSION: &str = "schemaversion";
    /// Extension `aggregatetype`.
    pub const AGGREGATETYPE: &str = "aggregatetype";
    /// Extension `aggregateid`.
    pub const AGGREGATEID: &str = "aggregateid";
    /// Extension `aggregateversion`.
    pub const AGGREGATEVERSION: &str = "aggregateversion";
    /// Extension `traceparent` (CloudEvents distributed tracing).
    pub const TRACEPARENT: &str = "traceparent";

    /// Every attribute the mapping writes.
    pub const ALL: &[&str] = &[
        SPECVERSION,
        ID,
        SOURCE,
        TYPE,
        SUBJECT,
        TIME,
        DATACONTENTTYPE,
        DATASCHEMA,
        SCHEMAVERSION,
        AGGREGATETYPE,
        AGGREGATEID,
        AGGREGATEVERSION,
        TRACEPARENT,
    ];
}
