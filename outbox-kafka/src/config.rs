//! Settings both sides share, the topic template, and the errors of
//! starting up.

use std::time::Duration;

use outbox_core::Envelope;
use outbox_core::store::ConfigError;
use outbox_core::transport::template::{DestinationTemplate, Placeholder};
use rdkafka::ClientConfig;

/// The longest topic name Kafka accepts.
const MAX_TOPIC_BYTES: usize = 249;

/// Settings of the Kafka transport (and the source's connection).
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// `bootstrap.servers`: `host:port[,host:port...]` (default
    /// `127.0.0.1:9092`).
    pub bootstrap_servers: String,
    /// The topic template (default `outbox.event.{aggregate_type}`, the
    /// topic Debezium's outbox event router writes, so consumers written for
    /// it can switch). Placeholders `{aggregate_type}` and `{event_type}`;
    /// the aggregate id is the record key, never part of a topic.
    pub topic_template: String,
    /// CloudEvents `source` of this producer: the service that emits the
    /// events (default `/` and the running program's name, e.g.
    /// `/order-service`; [`KafkaConfig::for_service`] sets it from a name).
    pub source: String,
    /// Where the schema registry folder is served, ending in `/`; see
    /// `NatsConfig::dataschema_base` in `outbox-nats`. Default none.
    pub dataschema_base: Option<String>,
    /// How long the producer tries to deliver one batch, retries included
    /// (`message.timeout.ms`, default 30 s); after it, the batch's
    /// undelivered messages are retryable failures.
    pub delivery_timeout: Duration,
    /// How long start-up and the health check wait for the cluster's
    /// metadata (default 5 s).
    pub connect_timeout: Duration,
    /// How the producer places keys on partitions (`partitioner`,
    /// default `murmur2_random`): murmur2 of the key, as the Java client,
    /// Kafka Connect (Debezium) and Kafka Streams place them, so a topic
    /// also written by them, or joined by key with one of theirs, has each
    /// aggregate on the partition they expect. librdkafka's own default,
    /// `consistent_random` (CRC32), places most keys elsewhere. Any of
    /// librdkafka's partitioners may be named.
    pub partitioner: String,
    /// How long a record for a topic or partition the cluster does not
    /// know (a topic created a moment ago, a partition electing its
    /// leader) is retried before its event fails for good (default 60 s,
    /// counted from the first refusal for that topic).
    pub unknown_topic_retry: Duration,
    /// Create missing topics at start: those the template renders for the
    /// contracts linked into the binary, with these partitions and
    /// replication factor (default none: topics are the cluster's
    /// operators' business; missing ones are reported by the transport's
    /// health as degraded).
    pub create_topics: Option<TopicCreation>,
    /// Further librdkafka settings (security, `compression.type`,
    /// `linger.ms`, ...), applied last. `enable.idempotence` and `acks`
    /// cannot be weakened here: the transport refuses to start.
    pub client: Vec<(String, String)>,
}

/// How [`KafkaConfig::create_topics`] creates a missing topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicCreation {
    /// Partitions (at least 1).
    pub partitions: i32,
    /// Replication factor (at least 1; at most the brokers there are).
    pub replication: i32,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            bootstrap_servers: "127.0.0.1:9092".to_owned(),
            topic_template: "outbox.event.{aggregate_type}".to_owned(),
            source: outbox_core::transport::default_source(),
            dataschema_base: None,
            delivery_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            partitioner: "murmur2_random".to_owned(),
            unknown_topic_retry: Duration::from_secs(60),
            create_topics: None,
            client: Vec::new(),
        }
    }
}

impl KafkaConfig {
    /// The defaults, for the service `name`: CloudEvents `source` `/name`.
    pub fn for_service(name: &str) -> KafkaConfig {
        KafkaConfig {
            source: outbox_core::transport::source_of(name),
            ..KafkaConfig::default()
        }
    }

    /// Checks every setting, naming the first wrong one.
    pub(crate) fn validate(&self) -> Result<TopicTemplate, ConfigError> {
        let bad = |what: &'static str, reason: String| ConfigError::InvalidValue { what, reason };
        if self.bootstrap_servers.trim().is_empty() {
            return Err(bad(
                "Kafka bootstrap_servers",
                "name at least one host:port".into(),
            ));
        }
        if self.delivery_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(bad(
                "Kafka timeouts",
                "delivery_timeout and connect_timeout must be above zero".into(),
            ));
        }
        // librdkafka takes `message.timeout.ms` in whole milliseconds, reads
        // 0 as "no limit" and refuses more than i32::MAX.
        if self.delivery_timeout < Duration::from_millis(1)
            || self.delivery_timeout > outbox_core::relay::LONGEST_SETTING
        {
            return Err(bad(
                "Kafka delivery_timeout",
                format!(
                    "{:?} is outside 1 ms..={:?} (librdkafka's message.timeout.ms)",
                    self.delivery_timeout,
                    outbox_core::relay::LONGEST_SETTING
                ),
            ));
        }
        outbox_core::transport::validate_source("Kafka source", &self.source)?;
        if self.partitioner.trim().is_empty() {
            return Err(bad(
                "Kafka partitioner",
                "name one of librdkafka's partitioners (murmur2_random is the Java client's)"
                    .into(),
            ));
        }
        if let Some(creation) = self.create_topics
            && (creation.partitions < 1 || creation.replication < 1)
        {
            return Err(bad(
                "Kafka create_topics",
                format!(
                    "{} partitions, replication {}: both must be at least 1",
                    creation.partitions, creation.replication
                ),
            ));
        }
        if let Some(base) = &self.dataschema_base
            && (!base.ends_with('/') || !base.contains(':') || base.contains(char::is_whitespace))
        {
            return Err(bad(
                "Kafka dataschema_base",
                format!("{base:?} must be an absolute URI ending in `/`"),
            ));
        }
        for (key, value) in &self.client {
            let weakens = match key.as_str() {
                "enable.idempotence" => value != "true",
                "acks" | "request.required.acks" => value != "all" && value != "-1",
                _ => false,
            };
            if weakens {
                return Err(bad(
                    "Kafka client settings",
                    format!(
                        "{key}={value} would let a publish count as delivered before every in-sync replica has it, or reorder an aggregate's events on retry"
                    ),
                ));
            }
        }
        TopicTemplate::new(&self.topic_template)
    }

    /// The client settings common to producer and consumer.
    pub(crate) fn client_config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &self.bootstrap_servers)
            .set("client.id", "outbox");
        config
    }

    /// Applies the user's settings last.
    pub(crate) fn apply_extra(&self, config: &mut ClientConfig) {
        for (key, value) in &self.client {
            config.set(key, value);
        }
    }
}

/// A validated topic template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    template: DestinationTemplate,
}

impl TopicTemplate {
    /// Parses and checks a template: Kafka's topic characters (ASCII
    /// letters, digits, `.`, `_`, `-`) and no `{aggregate_id}` (a topic per
    /// aggregate would not scale; the id is the record key).
    pub fn new(text: &str) -> Result<TopicTemplate, ConfigError> {
        let template = DestinationTemplate::parse("Kafka topic template", text, |c| {
            c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
        })?;
        if template.uses(Placeholder::AggregateId) {
            return Err(ConfigError::InvalidValue {
                what: "Kafka topic template",
                reason: format!(
                    "{text:?}: {{aggregate_id}} would make a topic per aggregate; the aggregate id is the record key"
                ),
            });
        }
        Ok(TopicTemplate { template })
    }

    /// The topic of one event, or why it cannot have one.
    pub fn render(&self, envelope: &Envelope) -> Result<String, String> {
        self.check(self.template.render(envelope, |id| id.to_owned()))
    }

    /// The topic of events of one (aggregate type, event type).
    pub fn topic_for(&self, aggregate_type: &str, event_type: &str) -> Result<String, String> {
        self.check(self.template.render_with(aggregate_type, event_type, ""))
    }

    fn check(&self, topic: String) -> Result<String, String> {
        let valid = !topic.is_empty()
            && topic.len() <= MAX_TOPIC_BYTES
            && topic != "."
            && topic != ".."
            && topic
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if valid {
            Ok(topic)
        } else {
            Err(format!(
                "topic {topic:?} rendered from {:?} is not a valid Kafka topic (1 to {MAX_TOPIC_BYTES} of ASCII letters, digits, `.`, `_`, `-`)",
                self.template.text()
            ))
        }
    }
}

/// The transport or source could not start.
#[derive(Debug, thiserror::Error)]
pub enum KafkaError {
    /// A setting is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// librdkafka refused the client settings, or (with `create_topics`)
    /// the cluster refused to create a missing topic at start.
    #[error("Kafka client settings refused: {0}")]
    Client(String),
    /// The subscription could not be made.
    #[error("Kafka subscription to {topics:?}: {reason}")]
    Subscribe {
        /// The topics.
        topics: Vec<String>,
        /// What the client said.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_follow_debezium_by_default_and_refuse_ids() {
        let template = TopicTemplate::new(&KafkaConfig::default().topic_template).unwrap();
        assert_eq!(
            template.topic_for("order", "order.created").unwrap(),
            "outbox.event.order"
        );
        assert!(
            TopicTemplate::new("outbox.{aggregate_id}")
                .unwrap_err()
                .to_string()
                .contains("record key")
        );
        let weak = KafkaConfig {
            client: vec![("acks".into(), "1".into())],
            ..KafkaConfig::default()
        };
        assert!(weak.validate().unwrap_err().to_string().contains("acks=1"));
    }
}
