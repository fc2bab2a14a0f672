//! # outbox-nats
//!
//! NATS JetStream for `outbox-core`: [`NatsTransport`] publishes the relay's
//! events, [`JetStreamSource`] feeds a consumer from a durable pull
//! consumer. This file holds the publishing side and the settings both
//! sides share.
//!
//! Each event goes to a subject rendered from a template
//! (`events.{aggregate_type}.{event_type}` by default; an aggregate id in
//! the template is written as one token with
//! [`encode_token`], so `a.b` stays one
//! token), carries the envelope as CloudEvents headers with the `ce-`
//! prefix (binary content mode, values percent-encoded as the binding
//! requires) and its event id as `Nats-Msg-Id`, so JetStream drops a
//! republished duplicate within the stream's duplicate window. A batch is
//! sent in one go and the acks are awaited together: one round trip per
//! wave, not per message.
//!
//! The transport starts while the broker is down: it reports itself down
//! ([`Transport::health`]), the relay keeps events pending without using
//! up their attempts, the client reconnects with backoff, and the stream
//! is checked (or created) as soon as the server answers.
//!
//! ## The relay on JetStream
//!
//! Runs against the PostgreSQL at `DATABASE_URL` and the NATS server at
//! `NATS_URL` (the repository's `scripts/test.sh` starts both).
//!
//! ```
//! use std::time::Duration;
//! use outbox_core::OutboxEvent;
//! use outbox_postgres::Outbox;
//! use outbox_postgres::prelude::*; // Relay::start_postgres
//! use outbox_core::relay::{Relay, RelayConfig, RelayStore};
//! use outbox_postgres::{PgRelayStore, SchemaName};
//! use outbox_nats::{NatsConfig, NatsTransport};
//! # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, OutboxEvent)]
//! # #[outbox(event_type = "doc.order_shipped", aggregate = "doc_shipment", version = 1)]
//! # struct OrderPlaced { #[outbox(aggregate_id)] order_id: String, total_cents: i64 }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
//! # let pool = sqlx::PgPool::connect(&url).await?;
//! # let schema = SchemaName::new(format!("doc_nats_relay_{}", std::process::id()))?;
//! # let outbox = Outbox::new(schema.clone());
//! # outbox.migrate(&pool).await?;
//! # let mut tx = pool.begin().await?;
//! # outbox.emit(&mut tx, &OrderPlaced { order_id: "o-1".into(), total_cents: 1 }).await?;
//! # tx.commit().await?;
//! let nats = NatsConfig {
//!     url: std::env::var("NATS_URL").unwrap_or_else(|_| NatsConfig::default().url),
//!     stream: format!("DOC_RELAY_{}", std::process::id()),
//!     subject_template: format!("doc{}.{{aggregate_type}}.{{event_type}}", std::process::id()),
//!     ..NatsConfig::default()
//! };
//! let transport = NatsTransport::connect(nats.clone()).await?; // creates the stream
//! let relay = Relay::start_postgres(pool.clone(), schema.clone(), transport, RelayConfig::default()).await?;
//!
//! let store = PgRelayStore::new(pool.clone(), schema.clone(), Default::default(), Duration::from_secs(120));
//! while store.stats().await?.pending > 0 {
//!     tokio::time::sleep(Duration::from_millis(20)).await;
//! }
//! relay.drain(Duration::from_secs(5)).await?;
//! # let client = async_nats::connect(nats.url.as_str()).await?;
//! # let _ = async_nats::jetstream::new(client).delete_stream(&nats.stream).await;
//! # sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {} CASCADE", schema.quoted()))).execute(&pool).await?;
//! # Ok(()) }
//! ```

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_nats::jetstream::{self, message::PublishMessage, stream};
use async_nats::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use futures_util::future::join_all;

mod source;

pub use source::{
    JetStreamDelivery, JetStreamSource, JetStreamSourceConfig, common_filter, durable_for_filter,
};

use outbox_core::Envelope;
use outbox_core::encoding::{encode_header_value, encode_token};
use outbox_core::store::ConfigError;
use outbox_core::transport::template::{DestinationTemplate, Placeholder, Segment};
use outbox_core::transport::{PublishFailure, Transport, TransportHealth};

/// A validated subject template such as `events.{aggregate_type}.{event_type}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubjectTemplate {
    template: DestinationTemplate,
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
        let parsed = DestinationTemplate::parse("NATS subject template", template, |c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
        })?;
        let prefix = match parsed.segments().first() {
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
            template: parsed,
            prefix,
        })
    }

    /// The subject of events of one (aggregate type, event type), with `*`
    /// for the aggregate id when the template uses it: a consumer's
    /// filter.
    pub fn filter_for(&self, aggregate_type: &str, event_type: &str) -> String {
        self.template.render_with(aggregate_type, event_type, "*")
    }

    /// The subject filter that captures every rendered subject (`events.>`).
    pub fn stream_subject(&self) -> String {
        format!("{}>", self.prefix)
    }

    /// The subject of one event, or why it cannot have one. The aggregate
    /// id is written as one token ([`encode_token`]); the aggregate and
    /// event types are contract names and go in as they are.
    pub fn render(&self, envelope: &Envelope) -> Result<String, String> {
        if envelope.aggregate_id.is_empty() && self.template.uses(Placeholder::AggregateId) {
            return Err(format!(
                "the aggregate id is empty, so {:?} renders an empty subject token",
                self.template.text()
            ));
        }
        let subject = self.template.render(envelope, encode_token);
        if subject.len() > MAX_SUBJECT_BYTES {
            return Err(format!(
                "the subject rendered from {:?} is {} bytes long (the aggregate id is {} bytes before encoding); NATS refuses protocol lines over 4096 bytes, so at most {MAX_SUBJECT_BYTES} are published: shorten the id or drop {{aggregate_id}} from the template",
                self.template.text(),
                subject.len(),
                envelope.aggregate_id.len()
            ));
        }
        let valid = subject.split('.').all(|token| {
            !token.is_empty()
                && token
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b'*' && b != b'>')
        });
        if valid {
            Ok(subject)
        } else {
            Err(format!(
                "subject {subject:?} rendered from {:?} is not a valid NATS subject",
                self.template.text()
            ))
        }
    }
}

/// The longest subject the transport publishes: the server refuses
/// protocol lines over 4096 bytes (`max_control_line`), and the line also
/// holds the reply inbox and the sizes.
const MAX_SUBJECT_BYTES: usize = 3500;

/// Settings of the JetStream transport.
#[derive(Debug, Clone)]
pub struct NatsConfig {
    /// Server URL(s), e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// The stream that stores the events (default `OUTBOX`).
    pub stream: String,
    /// The subject template (default `events.{aggregate_type}.{event_type}`).
    pub subject_template: String,
    /// CloudEvents `source` of this producer: the service that emits the
    /// events (default `/` and the running program's name, e.g.
    /// `/order-service`; [`NatsConfig::for_service`] sets it from a name).
    pub source: String,
    /// Where the schema registry folder is served, ending in `/`
    /// (`https://schemas.example.com/orders/`): `ce-dataschema` is then the
    /// URL of the event's schema file, `<base><event_type>/v<N>.json`, which
    /// is that file's `$id` when the registry's `settings.schema_base` is the
    /// same. Default none: `urn:outbox:schema:<event_type>:v<N>`.
    pub dataschema_base: Option<String>,
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
            source: outbox_core::transport::default_source(),
            dataschema_base: None,
            duplicate_window: Duration::from_secs(120),
            message_id_header: true,
            create_stream: true,
            connect_timeout: Duration::from_secs(5),
            ack_timeout: Duration::from_secs(10),
        }
    }
}

impl NatsConfig {
    /// The defaults, for the service `name`: CloudEvents `source` `/name`.
    pub fn for_service(name: &str) -> NatsConfig {
        NatsConfig {
            source: outbox_core::transport::source_of(name),
            ..NatsConfig::default()
        }
    }
}

/// The transport could not start.
#[derive(Debug, thiserror::Error)]
pub enum NatsError {
    /// A setting is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The client could not be created (a URL that cannot be parsed, or
    /// options the client refuses). A server that is down is not this
    /// error at start: the transport reports itself down and the source
    /// subscribes once the server answers.
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

/// Creates a client that connects in the background and keeps
/// reconnecting with backoff for as long as it lives, then waits up to the
/// settings' `connect_timeout` for the first connection. A server that is
/// down is not an error here (a service may boot during a broker outage);
/// an address that cannot be parsed is. [`is_connected`] tells which.
pub async fn connect(config: &NatsConfig) -> Result<async_nats::Client, NatsError> {
    let client = async_nats::ConnectOptions::new()
        .name("outbox")
        .connection_timeout(config.connect_timeout)
        .max_reconnects(None)
        .retry_on_initial_connect()
        .connect(config.url.as_str())
        .await
        .map_err(|error| NatsError::Connect {
            url: config.url.clone(),
            reason: error.to_string(),
        })?;
    // A timeout past what an Instant holds waits without a deadline.
    let deadline = tokio::time::Instant::now().checked_add(config.connect_timeout);
    while !is_connected(&client) && deadline.is_none_or(|d| tokio::time::Instant::now() < d) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(client)
}

/// Whether the client has a live connection to a server.
pub fn is_connected(client: &async_nats::Client) -> bool {
    client.connection_state() == async_nats::connection::State::Connected
}

/// Whether a stream check failed on the configuration (wrong subjects, a
/// missing stream that may not be created, a bad name), which no retry
/// fixes, rather than on a broker that did not answer.
pub fn is_misconfigured(error: &NatsError) -> bool {
    match error {
        NatsError::Config(_) => true,
        NatsError::Connect { .. } => false,
        NatsError::Stream { reason, .. } => {
            reason.contains("which do not include")
                || reason.contains("create_stream is off")
                || reason.contains("a stream name must")
        }
    }
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
    client: async_nats::Client,
    context: jetstream::Context,
    config: NatsConfig,
    template: SubjectTemplate,
    names: Vec<(&'static str, HeaderName)>,
    /// The stream was found (or created) with the template's subjects.
    stream_ready: AtomicBool,
    /// One stream check at a time.
    stream_check: tokio::sync::Mutex<()>,
}

impl NatsTransport {
    /// Validates the settings and connects. When the server answers within
    /// `connect_timeout`, the stream is checked or created now, and a stream
    /// that exists with other subjects (or is missing while
    /// `create_stream` is off) is an error. When it does not answer, the
    /// transport starts anyway and reports itself down until the client
    /// has reconnected and the stream is checked: a relay started during a
    /// broker outage keeps its events pending and publishes them, in
    /// order, once the broker is back.
    pub async fn connect(config: NatsConfig) -> Result<NatsTransport, NatsError> {
        let template = SubjectTemplate::new(&config.subject_template)?;
        if config.ack_timeout.is_zero() {
            return Err(ConfigError::InvalidValue {
                what: "NATS ack_timeout",
                reason: "must be above zero".into(),
            }
            .into());
        }
        if let Some(base) = &config.dataschema_base
            && (!base.ends_with('/') || !base.contains(':') || base.contains(char::is_whitespace))
        {
            return Err(ConfigError::InvalidValue {
                what: "NATS dataschema_base",
                reason: format!("{base:?} must be an absolute URI ending in `/`"),
            }
            .into());
        }
        outbox_core::transport::validate_source("NATS source", &config.source)?;
        let client = connect(&config).await?;
        let context = jetstream::ContextBuilder::new()
            .timeout(config.ack_timeout)
            .max_ack_inflight(65_536)
            .build(client.clone());
        let names = outbox_core::ce::ALL
            .iter()
            .map(|attribute| {
                let name =
                    HeaderName::from_str(&header_name(attribute)).expect("valid header name");
                (*attribute, name)
            })
            .collect();
        let transport = NatsTransport {
            client,
            context,
            template,
            names,
            config,
            stream_ready: AtomicBool::new(false),
            stream_check: tokio::sync::Mutex::new(()),
        };
        match transport.check_stream().await {
            Ok(()) => {}
            Err(error) if is_misconfigured(&error) => return Err(error),
            Err(error) => tracing::warn!(
                url = %transport.config.url,
                %error,
                "NATS is not available; the transport reports itself down and events stay pending until it is"
            ),
        }
        Ok(transport)
    }

    /// The subject template in use.
    pub fn template(&self) -> &SubjectTemplate {
        &self.template
    }

    /// Checks (or creates) the stream once per connection lifetime.
    async fn check_stream(&self) -> Result<(), NatsError> {
        if self.stream_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        let _one = self.stream_check.lock().await;
        if self.stream_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        if !is_connected(&self.client) {
            return Err(NatsError::Connect {
                url: self.config.url.clone(),
                reason: format!("not connected ({:?})", self.client.connection_state()),
            });
        }
        let subject = self.template.stream_subject();
        let check = ensure_stream(&self.context, &self.config, &subject);
        match tokio::time::timeout(self.config.ack_timeout, check).await {
            Ok(Ok(())) => {
                self.stream_ready.store(true, Ordering::Release);
                Ok(())
            }
            Ok(Err(error)) => Err(error),
            Err(_) => Err(NatsError::Stream {
                stream: self.config.stream.clone(),
                reason: format!("no answer within {:?}", self.config.ack_timeout),
            }),
        }
    }

    fn headers(&self, envelope: &Envelope) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (attribute, value) in envelope.cloudevents_attributes_with(
            &self.config.source,
            self.config.dataschema_base.as_deref(),
        ) {
            let Some((_, name)) = self.names.iter().find(|(a, _)| *a == attribute) else {
                continue;
            };
            let value = HeaderValue::from_str(&encode_header_value(&value))
                .expect("a percent-encoded value is printable ASCII");
            headers.insert(name.clone(), value);
        }
        if self.config.message_id_header {
            headers.insert(
                async_nats::header::NATS_MESSAGE_ID,
                HeaderValue::from_str(&envelope.id.to_string())
                    .expect("a UUID is a valid header value"),
            );
        }
        headers
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
            let headers = self.headers(envelope);
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
        let deadline = self.config.ack_timeout;
        let results = join_all(pending.into_iter().map(|entry| async move {
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
        .await;
        if results.iter().any(|r| {
            r.as_ref()
                .is_err_and(|failure| failure.reason.contains("no stream found"))
        }) {
            // The stream was deleted under us: check (or create) it again.
            self.stream_ready.store(false, Ordering::Release);
        }
        results
    }

    fn name(&self) -> &'static str {
        "nats"
    }

    async fn health(&self) -> TransportHealth {
        match self.check_stream().await {
            Ok(()) if is_connected(&self.client) => TransportHealth::Up,
            Ok(()) => TransportHealth::Down {
                reason: format!(
                    "not connected to NATS at {} ({:?}); the client reconnects with backoff",
                    self.config.url,
                    self.client.connection_state()
                ),
            },
            Err(error) => TransportHealth::Down {
                reason: error.to_string(),
            },
        }
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
        assert_eq!(by_id.render(&envelope).unwrap(), "orders.A%201");
        envelope.aggregate_id = "a1".into();
        assert_eq!(by_id.render(&envelope).unwrap(), "orders.a1");
        envelope.aggregate_id = "a.b.*.>".into();
        assert_eq!(by_id.render(&envelope).unwrap(), "orders.a%2Eb%2E%2A%2E%3E");
        envelope.aggregate_id = String::new();
        assert!(by_id.render(&envelope).unwrap_err().contains("empty"));
        envelope.aggregate_id = "x".repeat(4000);
        assert!(by_id.render(&envelope).unwrap_err().contains("bytes long"));
        envelope.aggregate_id = "a1".into();
        envelope.event_type = "order created".into();
        assert!(
            template
                .render(&envelope)
                .unwrap_err()
                .contains("not a valid NATS subject")
        );

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
