//! Settings both sides share, the routing-key template, and the errors of
//! starting up.

use std::time::Duration;

use outbox_core::Envelope;
use outbox_core::encoding::encode_token;
use outbox_core::store::ConfigError;
use outbox_core::transport::template::{DestinationTemplate, Placeholder};

/// The longest routing key AMQP 0-9-1 carries (a short string).
pub(crate) const MAX_ROUTING_KEY_BYTES: usize = 255;

/// Settings of the RabbitMQ transport (and the source's connection).
#[derive(Debug, Clone)]
pub struct RabbitConfig {
    /// Server URL, `amqp://user:password@host:port/vhost` (default
    /// `amqp://guest:guest@127.0.0.1:5672/%2f`). TLS (`amqps://`) is not
    /// compiled in.
    pub url: String,
    /// The topic exchange events go to (default `outbox`).
    pub exchange: String,
    /// The routing-key template (default `{aggregate_type}.{event_type}`).
    pub routing_key_template: String,
    /// CloudEvents `source` of this producer, also the messages' `app_id`:
    /// the service that emits the events (default `/` and the running
    /// program's name, e.g. `/order-service`; [`RabbitConfig::for_service`]
    /// sets it from a name).
    pub source: String,
    /// Where the schema registry folder is served, ending in `/`; see
    /// `NatsConfig::dataschema_base` in `outbox-nats`. Default none.
    pub dataschema_base: Option<String>,
    /// Declare the exchange (durable, topic) at start (default true);
    /// otherwise it is only checked (a passive declare) and a missing
    /// exchange is a start-up error.
    pub declare: bool,
    /// Publish with the `mandatory` flag (default true): a message no queue
    /// is bound for comes back from the broker and counts as a retryable
    /// failure, so its event stays pending, its aggregate waits (blocked,
    /// visible in `outbox blocked list` and the alerts) and it is
    /// published once a queue is bound. Off: such a message is dropped by
    /// the broker and its row marked published, a silent loss, as
    /// RabbitMQ publishers without `mandatory` accept; only for an
    /// exchange where unrouted messages are expected (e.g. one with an
    /// alternate exchange configured by its operators).
    pub mandatory: bool,
    /// The largest payload sent (default 16 MiB, RabbitMQ 4's
    /// `max_message_size`; 3.x allows 128 MiB). A larger event is a
    /// permanent failure at once, named with its size, instead of a channel
    /// closed by the broker.
    pub max_message_bytes: usize,
    /// Timeout of the connection handshake (default 5 s).
    pub connect_timeout: Duration,
    /// How long a batch waits for its publisher confirms (default 10 s).
    pub confirm_timeout: Duration,
}

impl Default for RabbitConfig {
    fn default() -> Self {
        RabbitConfig {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned(),
            exchange: "outbox".to_owned(),
            routing_key_template: "{aggregate_type}.{event_type}".to_owned(),
            source: outbox_core::transport::default_source(),
            dataschema_base: None,
            declare: true,
            mandatory: true,
            max_message_bytes: 16 * 1024 * 1024,
            connect_timeout: Duration::from_secs(5),
            confirm_timeout: Duration::from_secs(10),
        }
    }
}

impl RabbitConfig {
    /// The defaults, for the service `name`: CloudEvents `source` and
    /// `app_id` `/name`.
    pub fn for_service(name: &str) -> RabbitConfig {
        RabbitConfig {
            source: outbox_core::transport::source_of(name),
            ..RabbitConfig::default()
        }
    }

    /// Checks every setting, naming the first wrong one.
    pub(crate) fn validate(&self) -> Result<RoutingKeyTemplate, ConfigError> {
        let bad = |what: &'static str, reason: String| ConfigError::InvalidValue { what, reason };
        if self.exchange.is_empty()
            || self.exchange.len() > MAX_ROUTING_KEY_BYTES
            || !self
                .exchange
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'))
        {
            return Err(bad(
                "RabbitMQ exchange",
                format!(
                    "{:?}: use 1 to 255 ASCII letters, digits, `.`, `_`, `-` or `:`",
                    self.exchange
                ),
            ));
        }
        if self.confirm_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(bad(
                "RabbitMQ timeouts",
                "connect_timeout and confirm_timeout must be above zero".into(),
            ));
        }
        if self.max_message_bytes == 0 {
            return Err(bad(
                "RabbitMQ max_message_bytes",
                "must be above zero".into(),
            ));
        }
        outbox_core::transport::validate_source("RabbitMQ source", &self.source)?;
        if let Some(base) = &self.dataschema_base
            && (!base.ends_with('/') || !base.contains(':') || base.contains(char::is_whitespace))
        {
            return Err(bad(
                "RabbitMQ dataschema_base",
                format!("{base:?} must be an absolute URI ending in `/`"),
            ));
        }
        RoutingKeyTemplate::new(&self.routing_key_template)
    }
}

/// A validated routing-key template: words separated by `.`, no `*` or `#`
/// (those are for bindings), placeholders `{aggregate_type}`,
/// `{event_type}`, `{aggregate_id}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingKeyTemplate {
    template: DestinationTemplate,
}

impl RoutingKeyTemplate {
    /// Parses and checks a template.
    pub fn new(text: &str) -> Result<RoutingKeyTemplate, ConfigError> {
        let template = DestinationTemplate::parse("RabbitMQ routing key template", text, |c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
        })?;
        Ok(RoutingKeyTemplate { template })
    }

    /// The routing key of one event, or why it cannot have one.
    pub fn render(&self, envelope: &Envelope) -> Result<String, String> {
        if envelope.aggregate_id.is_empty() && self.template.uses(Placeholder::AggregateId) {
            return Err(format!(
                "the aggregate id is empty, so {:?} renders an empty routing-key word",
                self.template.text()
            ));
        }
        let key = self.template.render(envelope, encode_token);
        if key.len() > MAX_ROUTING_KEY_BYTES {
            return Err(format!(
                "the routing key rendered from {:?} is {} bytes long (the aggregate id is {} bytes before encoding); AMQP carries at most {MAX_ROUTING_KEY_BYTES}: shorten the id or drop {{aggregate_id}} from the template",
                self.template.text(),
                key.len(),
                envelope.aggregate_id.len()
            ));
        }
        Ok(key)
    }

    /// The binding key that receives every event of one (aggregate type,
    /// event type): the aggregate id, when the template has it, becomes `*`
    /// (one word, which an encoded id always is).
    pub fn binding_for(&self, aggregate_type: &str, event_type: &str) -> String {
        self.template.render_with(aggregate_type, event_type, "*")
    }
}

/// The transport or source could not start.
#[derive(Debug, thiserror::Error)]
pub enum RabbitError {
    /// A setting is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The server cannot be reached or refused the login.
    #[error("cannot connect to RabbitMQ at {url}: {reason}")]
    Connect {
        /// The URL tried, without its password.
        url: String,
        /// What the client reported.
        reason: String,
    },
    /// The exchange or queue is missing or declared differently.
    #[error("RabbitMQ {what}: {reason}")]
    Topology {
        /// What (`exchange outbox`, `queue billing`).
        what: String,
        /// What the broker said.
        reason: String,
    },
}

/// The URL with its password replaced by `***`, for errors and logs.
pub(crate) fn redacted_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((credentials, host)) => match credentials.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(aggregate_id: &str) -> Envelope {
        serde_json::from_value(serde_json::json!({
            "id": "0190f5a2-7c1e-7d3a-9b1e-2f4c6a8d0e11", "event_type": "order.created", "schema_version": 1,
            "aggregate_type": "order", "aggregate_id": aggregate_id, "aggregate_version": 1,
            "occurred_at": "2026-01-01T00:00:00Z", "traceparent": null, "payload": {}
        }))
        .unwrap()
    }

    #[test]
    fn routing_keys_keep_an_id_in_one_word() {
        let default = RoutingKeyTemplate::new("{aggregate_type}.{event_type}").unwrap();
        assert_eq!(
            default.render(&envelope("a.b")).unwrap(),
            "order.order.created"
        );
        let by_id = RoutingKeyTemplate::new("orders.{aggregate_id}").unwrap();
        assert_eq!(
            by_id.render(&envelope("a.b #")).unwrap(),
            "orders.a%2Eb%20%23"
        );
        assert_eq!(by_id.binding_for("order", "order.created"), "orders.*");
        assert!(by_id.render(&envelope("")).unwrap_err().contains("empty"));
        assert!(
            by_id
                .render(&envelope(&"x".repeat(300)))
                .unwrap_err()
                .contains("bytes long")
        );
        assert!(RoutingKeyTemplate::new("orders.#.{event_type}").is_err());
    }

    #[test]
    fn settings_are_checked_and_passwords_hidden() {
        assert!(RabbitConfig::default().validate().is_ok());
        let bad = RabbitConfig {
            exchange: "has space".into(),
            ..RabbitConfig::default()
        };
        assert!(bad.validate().unwrap_err().to_string().contains("exchange"));
        assert_eq!(
            redacted_url("amqp://guest:secret@host:5672/%2f"),
            "amqp://guest:***@host:5672/%2f"
        );
    }
}
