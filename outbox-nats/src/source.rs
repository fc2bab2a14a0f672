//! The JetStream subscription side: durable pull consumers whose messages
//! feed a [`Consumer`](outbox_core::consumer::Consumer). Explicit acks, sent only
//! after the consumer's transaction committed; a failed handler's message
//! comes back through a delayed NAK; the ack wait follows the handler
//! timeout, and there is no delivery limit (the consumer's retry policy
//! decides when a message is dead-lettered).
//!
//! A consumer subscribes to the subjects of its own aggregate types only
//! (one filter per aggregate type): events of other services in a shared
//! stream never reach it. nats-server 2.10 and later take several filters
//! on one durable consumer; older servers get one durable consumer per
//! filter, named `<durable>-<8 hex digits of the filter's SHA-256>`, whose
//! messages are merged.
//!
//! Header names are matched without regard to case and values are
//! percent-decoded (CloudEvents NATS binding); a value that does not decode
//! makes the message unreadable (it goes to the quarantine with the reason).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures_util::stream::SelectAll;
use futures_util::{FutureExt, Stream, StreamExt};
use sha2::Digest;

use super::{NatsConfig, NatsError, SubjectTemplate, connect, is_connected};
use outbox_core::consumer::{
    Consumer, ConsumerStore, Delivery, Incoming, MessageSource, SourceError,
};
use outbox_core::encoding::decode_header_value;
use outbox_core::store::ConfigError;

/// Settings of a JetStream source.
#[derive(Debug, Clone)]
pub struct JetStreamSourceConfig {
    /// The server and stream (the stream must exist: the relay creates it).
    pub nats: NatsConfig,
    /// The durable consumer's name (usually the consumer's name).
    pub durable: String,
    /// Subject filters; a message on any of them is delivered. Empty: the
    /// whole stream (every event of every service that publishes to it).
    pub filter_subjects: Vec<String>,
    /// How long JetStream waits for an ack before delivering again. Must
    /// exceed the time a message can wait in the client plus its handling.
    pub ack_wait: Duration,
    /// Messages pulled ahead per request (their ack clocks run while they
    /// wait in the client).
    pub pull_batch: usize,
    /// Deliveries after which JetStream gives up on a message (`-1`:
    /// never, the default from [`for_consumer`](Self::for_consumer)). The
    /// consumer bounds handler runs itself (max attempts, with handler
    /// starts of redeliveries counted in the database), so a limit here
    /// would only strand messages that were redelivered while the database
    /// was down.
    pub max_deliver: i64,
    /// Unacknowledged messages JetStream hands out at once (per durable).
    pub max_ack_pending: i64,
}

impl JetStreamSourceConfig {
    /// Settings aligned with `consumer`: durable name = consumer name,
    /// one filter per aggregate type it handles (the narrowest subject that
    /// covers that aggregate's handled event types under the template, so
    /// events of other aggregate types in the stream never arrive), pulls
    /// of one batch (twice the consumer's batch size, at least 10), ack wait
    /// = twice the handler timeout + 10 s (a failing batch runs twice:
    /// together, then one by one; raise it for batches of slow handlers, or
    /// a slow batch is redelivered while it runs, harmless for the database
    /// but not for external calls), no delivery limit.
    ///
    /// The subscription is by subject: an event published on a subject none
    /// of the filters matches (another template, another stream) never
    /// reaches the consumer. To widen it, add subjects to
    /// `filter_subjects` (or clear it for the whole stream); events of
    /// aggregate types without a handler are then acknowledged as foreign
    /// and nothing is stored for them.
    pub fn for_consumer<S: ConsumerStore>(
        consumer: &Consumer<S>,
        nats: NatsConfig,
    ) -> Result<Self, ConfigError> {
        let template = SubjectTemplate::new(&nats.subject_template)?;
        let mut by_aggregate: BTreeMap<&str, Vec<String>> = BTreeMap::new();
        for (aggregate_type, event_type) in consumer.subscribed_types() {
            by_aggregate
                .entry(aggregate_type)
                .or_default()
                .push(template.filter_for(aggregate_type, event_type));
        }
        let mut filter_subjects: Vec<String> = by_aggregate
            .values()
            .map(|subjects| common_filter(subjects, &template.stream_subject()))
            .collect();
        filter_subjects.sort();
        filter_subjects.dedup();
        let retry = consumer.config().retry;
        let batch = consumer.config().batch_size.max(1);
        Ok(JetStreamSourceConfig {
            filter_subjects,
            durable: consumer.name().to_owned(),
            ack_wait: retry
                .handler_timeout
                .saturating_mul(2)
                .saturating_add(Duration::from_secs(10)),
            pull_batch: (batch * 2).max(10),
            max_deliver: -1,
            max_ack_pending: 1000,
            nats,
        })
    }
}

/// The narrowest single subject filter that covers all `subjects`: the
/// subject itself when there is one, else their common leading tokens
/// followed by `>`, else `fallback`.
pub fn common_filter(subjects: &[String], fallback: &str) -> String {
    let Some(first) = subjects.first() else {
        return fallback.to_owned();
    };
    if subjects.iter().all(|s| s == first) {
        return first.clone();
    }
    let split: Vec<Vec<&str>> = subjects.iter().map(|s| s.split('.').collect()).collect();
    let mut common = Vec::new();
    for (index, token) in split[0].iter().enumerate() {
        // Keep one token for `>` to match.
        if split
            .iter()
            .all(|tokens| tokens.len() > index + 1 && tokens[index] == *token)
        {
            common.push(*token);
        } else {
            break;
        }
    }
    if common.is_empty() {
        fallback.to_owned()
    } else {
        format!("{}.>", common.join("."))
    }
}

/// The durable name of the pull consumer for one filter, when an older
/// server needs one durable per filter.
pub fn durable_for_filter(durable: &str, filter: &str) -> String {
    let digest = sha2::Sha256::digest(filter.as_bytes());
    format!("{durable}-{}", hex::encode(&digest[..4]))
}

type MessageStream = Pin<Box<dyn Stream<Item = Result<jetstream::Message, String>> + Send>>;

/// Messages of one or more durable JetStream pull consumers.
pub struct JetStreamSource {
    config: JetStreamSourceConfig,
    client: async_nats::Client,
    /// Set up once the server answered; until then every pull tries again.
    messages: Option<SelectAll<MessageStream>>,
    durable: Arc<str>,
}

impl std::fmt::Debug for JetStreamSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamSource")
            .field("durable", &self.durable)
            .field("filter_subjects", &self.config.filter_subjects)
            .field("subscribed", &self.messages.is_some())
            .finish_non_exhaustive()
    }
}

impl JetStreamSource {
    /// Validates the settings, connects, and creates (or binds to) the
    /// durable consumer(s). When the server does not answer within the
    /// connect timeout, the source starts anyway and subscribes as soon as
    /// it can: the consumer loop sees a source error per failed pull and
    /// backs off.
    pub async fn connect(config: JetStreamSourceConfig) -> Result<JetStreamSource, NatsError> {
        outbox_core::consumer::validate_consumer_name(&config.durable)?;
        if config.ack_wait.is_zero() {
            return Err(ConfigError::InvalidValue {
                what: "JetStream ack_wait",
                reason: "must be above zero".into(),
            }
            .into());
        }
        if let Some(bad) = config
            .filter_subjects
            .iter()
            .find(|s| s.is_empty() || s.contains(char::is_whitespace))
        {
            return Err(ConfigError::InvalidValue {
                what: "JetStream filter_subjects",
                reason: format!("{bad:?} is not a subject filter"),
            }
            .into());
        }
        let client = connect(&config.nats).await?;
        let mut source = JetStreamSource {
            durable: Arc::from(config.durable.as_str()),
            config,
            client,
            messages: None,
        };
        if is_connected(&source.client) {
            source.subscribe().await?;
        } else {
            tracing::warn!(
                durable = %source.durable,
                url = %source.config.nats.url,
                "NATS is not reachable; the source subscribes once it is"
            );
        }
        Ok(source)
    }

    /// The durable consumers this source reads from, with their filters.
    pub fn durables(&self, multi_filter: bool) -> Vec<(String, Vec<String>)> {
        let filters = &self.config.filter_subjects;
        if filters.len() <= 1 || multi_filter {
            vec![(self.config.durable.clone(), filters.clone())]
        } else {
            filters
                .iter()
                .map(|f| (durable_for_filter(&self.config.durable, f), vec![f.clone()]))
                .collect()
        }
    }

    async fn subscribe(&mut self) -> Result<(), NatsError> {
        let config = &self.config;
        let stream_error = |reason: String| NatsError::Stream {
            stream: config.nats.stream.clone(),
            reason,
        };
        let context = jetstream::new(self.client.clone());
        let stream = context
            .get_stream(&config.nats.stream)
            .await
            .map_err(|e| stream_error(format!("cannot open it: {e}")))?;
        let multi_filter = server_takes_several_filters(&self.client.server_info().version);
        let mut all = SelectAll::new();
        for (durable, filters) in self.durables(multi_filter) {
            let (filter_subject, filter_subjects) = match filters.as_slice() {
                [] => (String::new(), Vec::new()),
                [one] => (one.clone(), Vec::new()),
                several => (String::new(), several.to_vec()),
            };
            let consumer = stream
                .get_or_create_consumer(
                    &durable,
                    pull::Config {
                        durable_name: Some(durable.clone()),
                        filter_subject,
                        filter_subjects,
                        ack_policy: jetstream::consumer::AckPolicy::Explicit,
                        ack_wait: config.ack_wait,
                        max_deliver: config.max_deliver,
                        max_ack_pending: config.max_ack_pending,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| stream_error(format!("cannot create consumer {durable}: {e}")))?;
            let messages = consumer
                .stream()
                .max_messages_per_batch(config.pull_batch.max(1))
                .heartbeat(Duration::from_secs(5))
                .messages()
                .await
                .map_err(|e| stream_error(format!("cannot pull from {durable}: {e}")))?;
            let messages: MessageStream =
                Box::pin(messages.map(|item| item.map_err(|e| e.to_string())));
            all.push(messages);
        }
        self.messages = Some(all);
        Ok(())
    }
}

/// Whether a nats-server version (`2.10.4`) accepts several subject
/// filters on one consumer (2.10 and later).
fn server_takes_several_filters(version: &str) -> bool {
    let mut parts = version
        .trim_start_matches('v')
        .split('.')
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    (major, minor) >= (2, 10)
}

/// A JetStream message being processed.
pub struct JetStreamDelivery {
    message: jetstream::Message,
    incoming: Incoming,
}

impl std::fmt::Debug for JetStreamDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamDelivery")
            .field("subject", &self.message.subject)
            .field("attempt", &self.incoming.attempt())
            .finish_non_exhaustive()
    }
}

impl JetStreamDelivery {
    fn new(message: jetstream::Message, durable: &Arc<str>) -> JetStreamDelivery {
        let (attempt, pending) = match message.info() {
            Ok(info) => (
                info.delivered.clamp(1, i64::from(u32::MAX)) as u32,
                Some(info.pending),
            ),
            Err(_) => (1, None),
        };
        if let Some(pending) = pending {
            metrics::gauge!(outbox_core::metrics::CONSUMER_PENDING, "consumer" => Arc::clone(durable))
                .set(pending as f64);
        }
        let mut attributes = Vec::new();
        let mut problem = None;
        if let Some(headers) = message.headers.as_ref() {
            for (name, values) in headers.iter() {
                let name: &str = name.as_ref();
                let Some(attribute) = ce_attribute(name) else {
                    continue;
                };
                let Some(raw) = values.first() else {
                    continue;
                };
                match decode_header_value(name, raw.as_str()) {
                    Ok(value) => attributes.push((attribute, value)),
                    Err(error) => {
                        problem.get_or_insert_with(|| error.to_string());
                        attributes.push((attribute, raw.as_str().to_owned()));
                    }
                }
            }
        }
        let payload = message.payload.to_vec();
        let incoming = match problem {
            None => Incoming::new(attributes, payload, attempt),
            Some(reason) => Incoming::malformed(attributes, payload, attempt, reason),
        };
        JetStreamDelivery { message, incoming }
    }
}

/// The CloudEvents attribute of a header name (`ce-`, `CE-`, `Ce-` ...),
/// lower-cased: header names are case-insensitive in NATS.
fn ce_attribute(name: &str) -> Option<String> {
    let prefix = name.get(..3)?;
    prefix
        .eq_ignore_ascii_case("ce-")
        .then(|| name[3..].to_ascii_lowercase())
}

impl Delivery for JetStreamDelivery {
    fn incoming(&self) -> &Incoming {
        &self.incoming
    }

    async fn ack(self) -> Result<(), SourceError> {
        self.message
            .ack()
            .await
            .map_err(|e| SourceError(format!("JetStream ack failed: {e}")))
    }

    async fn retry_later(self, delay: Duration) -> Result<(), SourceError> {
        self.message
            .ack_with(AckKind::Nak(Some(delay)))
            .await
            .map_err(|e| SourceError(format!("JetStream nak failed: {e}")))
    }
}

impl MessageSource for JetStreamSource {
    type Delivery = JetStreamDelivery;

    async fn next_batch(&mut self, max: usize) -> Result<Vec<JetStreamDelivery>, SourceError> {
        if self.messages.is_none() {
            if !is_connected(&self.client) {
                return Err(SourceError(format!(
                    "not connected to NATS at {}; subscribing once it is",
                    self.config.nats.url
                )));
            }
            self.subscribe()
                .await
                .map_err(|e| SourceError(e.to_string()))?;
        }
        let Some(messages) = self.messages.as_mut() else {
            return Err(SourceError("not subscribed".into()));
        };
        // A JetStream source never closes: a pull that failed (a missed
        // heartbeat after a server restart, say) or a stream that ended is
        // subscribed again at the next call, after the consumer loop's
        // backoff. Unacknowledged messages come back after the ack wait.
        let first = match messages.next().await {
            Some(Ok(message)) => message,
            Some(Err(error)) => {
                self.messages = None;
                return Err(SourceError(format!(
                    "JetStream pull failed: {error}; subscribing again"
                )));
            }
            None => {
                self.messages = None;
                return Err(SourceError(
                    "the JetStream pull stream ended; subscribing again".into(),
                ));
            }
        };
        let mut batch = vec![JetStreamDelivery::new(first, &self.durable)];
        while batch.len() < max {
            match messages.next().now_or_never() {
                Some(Some(Ok(message))) => {
                    batch.push(JetStreamDelivery::new(message, &self.durable))
                }
                _ => break,
            }
        }
        Ok(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_filter_covers_all_subjects() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            common_filter(&s(&["events.order.order.created"]), "events.>"),
            "events.order.order.created"
        );
        assert_eq!(
            common_filter(
                &s(&["events.order.order.created", "events.order.order.shipped"]),
                "events.>"
            ),
            "events.order.order.>"
        );
        assert_eq!(
            common_filter(
                &s(&[
                    "events.order.order.created",
                    "events.payment.payment.captured"
                ]),
                "events.>"
            ),
            "events.>"
        );
        assert_eq!(common_filter(&[], "events.>"), "events.>");
    }

    #[test]
    fn header_names_match_without_case_and_servers_are_told_apart() {
        assert_eq!(ce_attribute("ce-id").as_deref(), Some("id"));
        assert_eq!(ce_attribute("CE-Type").as_deref(), Some("type"));
        assert_eq!(ce_attribute("Nats-Msg-Id"), None);
        assert_eq!(ce_attribute("ce"), None);
        assert!(!server_takes_several_filters("2.9.10"));
        assert!(server_takes_several_filters("2.10.0"));
        assert!(server_takes_several_filters("v2.11.3"));
        assert!(server_takes_several_filters("3.0.0"));
        assert_eq!(
            durable_for_filter("billing", "events.order.>"),
            durable_for_filter("billing", "events.order.>")
        );
        assert_ne!(
            durable_for_filter("billing", "events.order.>"),
            durable_for_filter("billing", "events.payment.>")
        );
    }
}
