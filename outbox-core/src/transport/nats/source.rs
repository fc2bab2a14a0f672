//! The JetStream subscription side: a durable pull consumer whose messages
//! feed a [`Consumer`](crate::consumer::Consumer). Explicit acks, sent only
//! after the consumer's transaction committed; a failed handler's message
//! comes back through a delayed NAK; the ack wait and the delivery limit
//! follow the consumer's retry policy.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::{self, AckKind, consumer::pull};
use futures_util::{FutureExt, StreamExt};

use super::{NatsConfig, NatsError, SubjectTemplate, connect};
use crate::consumer::{Consumer, Delivery, Incoming, MessageSource, SourceError};
use crate::store::ConfigError;

/// Settings of a JetStream source.
#[derive(Debug, Clone)]
pub struct JetStreamSourceConfig {
    /// The server and stream (the stream must exist: the relay creates it).
    pub nats: NatsConfig,
    /// The durable consumer's name (usually the consumer's name).
    pub durable: String,
    /// The subject filter (empty: the whole stream).
    pub filter_subject: String,
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
    /// Unacknowledged messages JetStream hands out at once.
    pub max_ack_pending: i64,
}

impl JetStreamSourceConfig {
    /// Settings aligned with `consumer`: durable name = consumer name,
    /// a filter covering its event types, pulls of one batch (twice the
    /// consumer's batch size, at least 10), ack wait = twice the handler
    /// timeout + 10 s (a failing batch runs twice: together, then one by
    /// one; raise it for batches of slow handlers, or a slow batch is
    /// redelivered while it runs, harmless for the database but not for
    /// external calls), no delivery limit.
    pub fn for_consumer(consumer: &Consumer, nats: NatsConfig) -> Result<Self, ConfigError> {
        let template = SubjectTemplate::new(&nats.subject_template)?;
        let subjects: Vec<String> = consumer
            .subscribed_types()
            .into_iter()
            .map(|(aggregate_type, event_type)| template.filter_for(aggregate_type, event_type))
            .collect();
        let retry = consumer.config().retry;
        let batch = consumer.config().batch_size.max(1);
        Ok(JetStreamSourceConfig {
            filter_subject: common_filter(&subjects, &template.stream_subject()),
            durable: consumer.name().to_owned(),
            ack_wait: retry.handler_timeout * 2 + Duration::from_secs(10),
            pull_batch: (batch * 2).max(10),
            max_deliver: -1,
            max_ack_pending: 1000,
            nats,
        })
    }
}

/// The narrowest single subject filter that covers all `subjects` (NATS
/// before 2.10 allows one filter per consumer): the subject itself when
/// there is one, else their common leading tokens followed by `>`, else
/// `fallback`.
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

/// Messages of a durable JetStream pull consumer.
pub struct JetStreamSource {
    messages: pull::Stream,
    durable: Arc<str>,
}

impl std::fmt::Debug for JetStreamSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamSource")
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

impl JetStreamSource {
    /// Connects and creates (or binds to) the durable consumer.
    pub async fn connect(config: JetStreamSourceConfig) -> Result<JetStreamSource, NatsError> {
        crate::consumer::validate_durable(&config.durable)?;
        if config.ack_wait.is_zero() {
            return Err(ConfigError::InvalidValue {
                what: "JetStream ack_wait",
                reason: "must be above zero".into(),
            }
            .into());
        }
        let stream_error = |reason: String| NatsError::Stream {
            stream: config.nats.stream.clone(),
            reason,
        };
        let client = connect(&config.nats).await?;
        let context = jetstream::new(client);
        let stream = context
            .get_stream(&config.nats.stream)
            .await
            .map_err(|e| stream_error(format!("cannot open it: {e}")))?;
        let consumer = stream
            .get_or_create_consumer(
                &config.durable,
                pull::Config {
                    durable_name: Some(config.durable.clone()),
                    filter_subject: config.filter_subject.clone(),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: config.ack_wait,
                    max_deliver: config.max_deliver,
                    max_ack_pending: config.max_ack_pending,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| stream_error(format!("cannot create consumer {}: {e}", config.durable)))?;
        let messages = consumer
            .stream()
            .max_messages_per_batch(config.pull_batch.max(1))
            .heartbeat(Duration::from_secs(5))
            .messages()
            .await
            .map_err(|e| stream_error(format!("cannot pull from {}: {e}", config.durable)))?;
        Ok(JetStreamSource {
            messages,
            durable: Arc::from(config.durable),
        })
    }
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
            metrics::gauge!(crate::metrics::CONSUMER_PENDING, "consumer" => Arc::clone(durable))
                .set(pending as f64);
        }
        let attributes = message
            .headers
            .as_ref()
            .map(|headers| {
                headers
                    .iter()
                    .filter_map(|(name, values)| {
                        let attribute = AsRef::<str>::as_ref(name).strip_prefix("ce-")?;
                        let value = values.first()?.as_str();
                        Some((attribute.to_owned(), value.to_owned()))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let incoming = Incoming::new(attributes, message.payload.to_vec(), attempt);
        JetStreamDelivery { message, incoming }
    }
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
        let mut batch = Vec::new();
        let first = match self.messages.next().await {
            Some(Ok(message)) => message,
            Some(Err(error)) => return Err(SourceError(format!("JetStream pull failed: {error}"))),
            None => return Ok(batch),
        };
        batch.push(JetStreamDelivery::new(first, &self.durable));
        while batch.len() < max {
            match self.messages.next().now_or_never() {
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
    use super::common_filter;

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
}
