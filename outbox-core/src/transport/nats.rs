//! NATS JetStream: the relay's publishing side (this file) and the
//! settings both sides share.
//!
//! Each event goes to a subject rendered from a template
//! (`events.{aggregate_type}.{event_type}` by default), carries the
//! envelope as CloudEvents headers with the `ce-` prefix (binary content
//! mode) and its event id as `Nats-Msg-Id`, so JetStream drops a
//! republished duplicate within the stream's duplicate window. A batch is
//! sent in one go and the acks are awaited together: one round trip per
//! wave, not per message.

use std::str::FromStr;
use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage, stream};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use futures_util::future::join_all;

mod source;

pub use source::{JetStreamDelivery, JetStreamSource, JetStreamSourceConfig, common_filter};

use super::{PublishFailure, Transport};
use crate::envelope::Envelope;
use crate::store::ConfigError;

/// Placeholders a subject template may use.
const PLACEHOLDERS: &[(&str, Part)] = &[
    ("{aggregate_type}", Part::AggregateType),
    ("{event_type}", Part::EventType),
    ("{aggregate_id}", Part::AggregateId),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    AggregateType,
    EventType,
    AggregateId,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Value(Part),
}

/// A validated subject template such as `events.{aggregate_type}.{event_type}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectTemplate {
    text: String,
    segments: Vec<Segment>,
    prefix: String,
}

impl SubjectTemplate {
    /// Parses and checks a template: it starts with a literal prefix that
    /// ends in `.` (the stream listens on `<prefix>>`), uses only the known
    /// placeholders, and has no characters NATS forbids in subjects.
    pub fn new(template: &str) -> Result<SubjectTemplate, ConfigError> {
        let bad = |reason: String| ConfigError::InvalidValue {
            what: "NATS subject template",
            reason: format!("{template:?}: {reason}"),
        };
        let mut segments = Vec::new();
        let mut rest = template;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('{') {
                let Some((name, tail)) = after.split_once('}') else {
                    return Err(bad("unclosed `{`".into()));
                };
                let placeholder = format!("{{{name}}}");
                let Some((_, part)) = PLACEHOLDERS.iter().find(|(p, _)| *p == placeholder) else {
                    return Err(bad(format!(
                        "unknown placeholder {placeholder}; use {{aggregate_type}}, {{event_type}} or {{aggregate_id}}"
                    )));
                };
                segments.push(Segment::Value(*part));
                rest = tail;
            } else {
                let end = rest.find('{').unwrap_or(rest.len());
                let literal = &rest[..end];
                if let Some(bad_char) = literal
                    .chars()
                    .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
                {
                    return Err(bad(format!(
                        "character {bad_char:?} is not allowed in a subject"
                    )));
                }
                segments.push(Segment::Literal(literal.to_owned()));
                rest = &rest[end..];
            }
        }
        if !segments.iter().any(|s| matches!(s, Segment::Value(_))) {
            return Err(bad(
                "it uses no placeholder, so every event would share one subject".into(),
            ));
        }
        let prefix = match segments.first() {
            Some(Segment::Literal(literal)) if literal.ends_with('.') && literal.len() > 1 => {
                literal.clone()
            }
            _ => {
                return Err(bad(
                    "it must start with a fixed prefix ending in `.`, such as `events.`".into(),
                ));
            }
        };
        if prefix.starts_with('.') || prefix.contains("..") {
            return Err(bad("empty subject tokens (`..` or a leading `.`)".into()));
        }
        Ok(SubjectTemplate {
            text: template.to_owned(),
            segments,
            prefix,
        })
    }

    /// The subject of events of one (aggregate type, event type), with `*`
    /// for the aggregate id when the template uses it: a consumer's
    /// filter.
    pub fn filter_for(&self, aggregate_type: &str, event_type: &str) -> String {
        let mut subject = String::with_capacity(64);
        for segment in &self.segments {
            match segment {
                Segment::Literal(literal) => subject.push_str(literal),
                Segment::Value(Part::AggregateType) => subject.push_str(aggregate_type),
                Segment::Value(Part::EventType) => subject.push_str(event_type),
                Segment::Value(Part::AggregateId) => subject.push('*'),
            }
        }
        subject
    }

    /// The subject filter that captures every rendered subject (`events.>`).
    pub fn stream_subject(&self) -> String {
        format!("{}>", self.prefix)
    }

    /// The subject of one event, or why it cannot have one (an aggregate id
    /// with characters NATS forbids, for instance).
    pub fn render(&self, envelope: &Envelope) -> Result<String, String> {
        let mut subject = String::with_capacity(64);
        for segment in &self.segments {
            match segment {
                Segment::Literal(literal) => subject.push_str(literal),
                Segment::Value(Part::AggregateType) => subject.push_str(&envelope.aggregate_type),
                Segment::Value(Part::EventType) => subject.push_str(&envelope.event_type),
                Segment::Value(Part::AggregateId) => subject.push_str(&envelope.aggregate_id),
            }
        }
        let valid = !subject.is_empty()
            && subject.split('.').all(|token| {
                !token.is_empty()
                    && !token.contains(|c: char| c.is_whitespace() || c == '*' || c == '>')
            })
            && subject.is_ascii();
        if valid {
            Ok(subject)
        } else {
            Err(format!(
                "subject {subject:?} rendered from {:?} is not a valid NATS subject",
                self.text
            ))
        }
    }
}

/// Settings of the JetStream transport.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// Server URL(s), e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// The stream that stores the events (default `OUTBOX`).
    pub stream: String,
    /// The subject template (default `events.{aggregate_type}.{event_type}`).
    pub subject_template: String,
    /// CloudEvents `source` of this producer (default `/outbox`).
    pub source: String,
    /// How long JetStream remembers message ids to drop duplicates
    /// (default 2 minutes; set when the stream is created).
    pub duplicate_window: Duration,
    /// Send the event id as `Nats-Msg-Id` (default true). Off only to test
    /// what consumers do with duplicates.
    pub message_id_header: bool,
    /// Create the stream at start-up when it does not exist (default true);
    /// otherwise a missing stream is a start-up error.
    pub create_stream: bool,
    /// Timeout of the connection handshake at start-up (default 5 s).
    pub connect_timeout: Duration,
    /// How long to wait for each batch's acks (default 10 s).
    pub ack_timeout: Duration,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: "nats://127.0.0.1:4222".to_owned(),
            stream: "OUTBOX".to_owned(),
            subject_template: "events.{aggregate_type}.{event_type}".to_owned(),
            source: "/outbox".to_owned(),
            duplicate_window: Duration::from_secs(120),
            message_id_header: true,
            create_stream: true,
            connect_timeout: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(10),
        }
    }
}

/// The transport could not start.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// A setting is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The server cannot be reached.
    #[error("cannot connect to NATS at {url}: {reason}")]
    Connect {
        /// The URL tried.
        url: String,
        /// What the client reported.
        reason: String,
    },
    /// The stream is missing, unreachable, or configured for other subjects.
    #[error("JetStream stream {stream}: {reason}")]
    Stream {
        /// The stream name.
        stream: String,
        /// What is wrong.
        reason: String,
    },
}

/// CloudEvents header names, with the NATS binding's `ce-` prefix.
pub fn header_name(attribute: &str) -> String {
    format!("ce-{attribute}")
}

/// Connects to NATS with the settings' handshake timeout; fails when the
/// server is unreachable (a relay that cannot publish should say so at
/// start-up). After start the client reconnects on its own.
pub async fn connect(config: &NatsConfig) -> Result<async_nats::Client, NatsError> {
    async_nats::ConnectOptions::new()
        .name("outbox")
        .connection_timeout(config.connect_timeout)
        .max_reconnects(None)
        .connect(config.url.as_str())
        .await
        .map_err(|error| NatsError::Connect {
            url: config.url.clone(),
            reason: error.to_string(),
        })
}

/// Checks that the stream exists and listens on `subject`, creating it when
/// allowed.
pub async fn ensure_stream(
    context: &jetstream::Context,
    config: &NatsConfig,
    subject: &str,
) -> Result<(), NatsError> {
    let stream_error = |reason: String| NatsError::Stream {
        stream: config.stream.clone(),
        reason,
    };
    if config.stream.is_empty()
        || config
            .stream
            .contains(|c: char| c.is_whitespace() || matches!(c, '.' | '*' | '>'))
    {
        return Err(stream_error(
            "a stream name must be non-empty without whitespace, `.`, `*` or `>`".into(),
        ));
    }
    let existing = match context.get_stream(&config.stream).await {
        Ok(mut stream) => Some(
            stream
                .info()
                .await
                .map_err(|e| stream_error(format!("cannot read its info: {e}")))?
                .config
                .subjects
                .clone(),
        ),
        Err(error) if error.to_string().contains("stream not found") => None,
        Err(error) => return Err(stream_error(format!("cannot look it up: {error}"))),
    };
    match existing {
        Some(subjects) if subjects.iter().any(|s| s == subject) => Ok(()),
        Some(subjects) => Err(stream_error(format!(
            "it exists with subjects {subjects:?}, which do not include {subject:?}"
        ))),
        None if config.create_stream => context
            .create_stream(stream::Config {
                name: config.stream.clone(),
                subjects: vec![subject.to_owned()],
                duplicate_window: config.duplicate_window,
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|e| stream_error(format!("cannot create it: {e}"))),
        None => Err(stream_error(
            "it does not exist and create_stream is off".into(),
        )),
    }
}

/// Publishes envelopes to JetStream.
pub struct NatsTransport {
    context: jetstream::Context,
    template: SubjectTemplate,
    source: String,
    message_id_header: bool,
    ack_timeout: Duration,
    names: Vec<(&'static str, HeaderName)>,
}

impl NatsTransport {
    /// Validates the settings, connects, and checks or creates the stream.
    pub async fn connect(config: NatsConfig) -> Result<NatsTransport, NatsError> {
        let template = SubjectTemplate::new(&config.subject_template)?;
        if config.ack_timeout.is_zero() {
            return Err(ConfigError::InvalidValue {
                what: "NATS ack_timeout",
                reason: "must be above zero".into(),
            }
            .into());
        }
        let client = connect(&config).await?;
        let context = jetstream::ContextBuilder::new()
            .timeout(config.ack_timeout)
            .max_ack_inflight(65_536)
            .build(client);
        ensure_stream(&context, &config, &template.stream_subject()).await?;
        let names = crate::envelope::ce::ALL
            .iter()
            .map(|attribute| {
                let name =
                    HeaderName::from_str(&header_name(attribute)).expect("valid header name");
                (*attribute, name)
            })
            .collect();
        Ok(NatsTransport {
            context,
            template,
            source: config.source,
            message_id_header: config.message_id_header,
            ack_timeout: config.ack_timeout,
            names,
        })
    }

    /// The subject template in use.
    pub fn template(&self) -> &SubjectTemplate {
        &self.template
    }

    fn headers(&self, envelope: &Envelope) -> Result<HeaderMap, PublishFailure> {
        let mut headers = HeaderMap::new();
        for (attribute, value) in envelope.cloudevents_attributes(&self.source) {
            let Some((_, name)) = self.names.iter().find(|(a, _)| *a == attribute) else {
                continue;
            };
            let value = HeaderValue::from_str(&value).map_err(|_| {
                PublishFailure::permanent(format!(
                    "attribute {attribute} cannot be a NATS header value"
                ))
            })?;
            headers.insert(name.clone(), value);
        }
        if self.message_id_header {
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                HeaderValue::from_str(&envelope.id.to_string())
                    .expect("a UUID is a valid header value"),
            );
        }
        Ok(headers)
    }
}

impl Transport for NatsTransport {
    async fn publish(&self, events: &[&Envelope]) -> Vec<Result<(), PublishFailure>> {
        let mut pending = Vec::with_capacity(events.len());
        for envelope in events {
            let subject = match self.template.render(envelope) {
                Ok(subject) => subject,
                Err(reason) => {
                    pending.push(Err(PublishFailure::permanent(reason)));
                    continue;
                }
            };
            let headers = match self.headers(envelope) {
                Ok(headers) => headers,
                Err(failure) => {
                    pending.push(Err(failure));
                    continue;
                }
            };
            let message = PublishMessage::build()
                .headers(headers)
                .payload(Bytes::copy_from_slice(envelope.payload.get().as_bytes()));
            match self.context.send_publish(subject, message).await {
                Ok(ack) => pending.push(Ok(ack)),
                Err(error) => pending.push(Err(classify(&error))),
            }
        }
        // Every message is on its way; wait for all acks at once so one
        // timeout bounds the whole batch.
        let deadline = self.ack_timeout;
        join_all(pending.into_iter().map(|entry| async move {
            match entry {
                Ok(ack) => match tokio::time::timeout(deadline, ack.into_future()).await {
                    Ok(Ok(_ack)) => Ok(()),
                    Ok(Err(error)) => Err(classify(&error)),
                    Err(_) => Err(PublishFailure::retryable(format!(
                        "no ack from JetStream within {deadline:?}"
                    ))),
                },
                Err(failure) => Err(failure),
            }
        }))
        .await
    }

    fn name(&self) -> &'static str {
        "nats"
    }
}

fn classify(error: &jetstream::context::PublishError) -> PublishFailure {
    use jetstream::context::PublishErrorKind;
    match error.kind() {
        PublishErrorKind::MaxPayloadExceeded => {
            PublishFailure::permanent(format!("JetStream refused the message: {error}"))
        }
        _ => PublishFailure::retryable(format!("JetStream publish failed: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_checked_and_rendered() {
        let template = SubjectTemplate::new("events.{aggregate_type}.{event_type}").unwrap();
        assert_eq!(template.stream_subject(), "events.>");
        let mut envelope: Envelope = serde_json::from_value(serde_json::json!({
            "id": "0190f5a2-7c1e-7d3a-9b1e-2f4c6a8d0e11", "event_type": "order.created", "schema_version": 1,
            "aggregate_type": "order", "aggregate_id": "A 1", "aggregate_version": 1,
            "occurred_at": "2026-01-01T00:00:00Z", "traceparent": null, "payload": {}
        }))
        .unwrap();
        assert_eq!(
            template.render(&envelope).unwrap(),
            "events.order.order.created"
        );
        let by_id = SubjectTemplate::new("orders.{aggregate_id}").unwrap();
        assert!(
            by_id
                .render(&envelope)
                .unwrap_err()
                .contains("not a valid NATS subject")
        );
        envelope.aggregate_id = "a1".into();
        assert_eq!(by_id.render(&envelope).unwrap(), "orders.a1");

        for (bad, reason) in [
            ("{event_type}", "fixed prefix"),
            ("events.{aggregate}", "unknown placeholder"),
            ("events.{event_type", "unclosed"),
            ("events >.{event_type}", "not allowed"),
            ("events.all", "no placeholder"),
        ] {
            let error = SubjectTemplate::new(bad).unwrap_err().to_string();
            assert!(error.contains(reason), "{bad}: {error}");
        }
    }
}
