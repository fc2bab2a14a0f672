//! The consuming side: a durable queue bound to the consumer's routing
//! keys, manual acks sent after the consumer's commit, a prefetch bound,
//! and delayed requeues for retries.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::{FutureExt, StreamExt};
use lapin::message::Delivery as AmqpDelivery;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use outbox_core::consumer::{
    Consumer, ConsumerStore, Delivery, Incoming, MessageSource, SourceError,
};
use outbox_core::store::ConfigError;
use tokio::task::JoinHandle;

use crate::config::{RabbitConfig, RabbitError, RoutingKeyTemplate, redacted_url};
use crate::connection::{Link, RECONNECT_PAUSE, open};
use crate::headers;

/// Settings of a RabbitMQ source.
#[derive(Debug, Clone)]
pub struct RabbitSourceConfig {
    /// The server and exchange (the exchange is declared when missing,
    /// unless `rabbit.declare` is off).
    pub rabbit: RabbitConfig,
    /// The durable queue (usually the consumer's name).
    pub queue: String,
    /// Binding keys of the queue on the exchange; a message whose routing
    /// key matches any of them is delivered (`*` one word, `#` any number).
    pub bindings: Vec<String>,
    /// Unacknowledged messages the broker hands out at once (`basic.qos`).
    pub prefetch: u16,
    /// Declare the queue with `x-single-active-consumer` (default true):
    /// one instance receives at a time, in queue order. Off: deliveries are
    /// spread over every instance, and order per aggregate is only what the
    /// consumer's ordering policy restores (parking under `Strict`,
    /// rejecting stale versions under `RejectStale`).
    pub single_active_consumer: bool,
}

impl RabbitSourceConfig {
    /// Settings aligned with `consumer`: queue = consumer name, one binding
    /// per (aggregate type, event type) it must receive (its handled types
    /// and, under strict ordering, the ignored ones), the aggregate id
    /// position (if the template has one) as `*`; prefetch twice the
    /// consumer's batch size (at least 10); single active consumer.
    ///
    /// The subscription is by routing key: an event published under a key
    /// no binding matches never reaches the queue. To widen it, push keys
    /// onto `bindings` (`#` for everything on the exchange); events of
    /// aggregate types without a handler are then acknowledged as foreign.
    pub fn for_consumer<S: ConsumerStore>(
        consumer: &Consumer<S>,
        rabbit: RabbitConfig,
    ) -> Result<Self, ConfigError> {
        let template = RoutingKeyTemplate::new(&rabbit.routing_key_template)?;
        let mut bindings: Vec<String> = consumer
            .subscribed_types()
            .into_iter()
            .map(|(aggregate_type, event_type)| template.binding_for(aggregate_type, event_type))
            .collect();
        bindings.sort();
        bindings.dedup();
        let prefetch =
            (consumer.config().batch_size.saturating_mul(2)).clamp(10, u16::MAX as usize);
        Ok(RabbitSourceConfig {
            rabbit,
            queue: consumer.name().to_owned(),
            bindings,
            prefetch: prefetch as u16,
            single_active_consumer: true,
        })
    }
}

type Subscription = (Link, lapin::Consumer);

/// Feeds a consumer from a RabbitMQ queue.
pub struct RabbitSource {
    config: Arc<RabbitSourceConfig>,
    link: Option<Subscription>,
    /// A subscription being made in the background: the consumer loop
    /// cancels `next_batch` at every sweep, and a subscription (connect,
    /// declare, bind each key, consume) must survive that.
    connecting: Option<JoinHandle<Result<Subscription, RabbitError>>>,
    last_attempt: Option<Instant>,
}

impl std::fmt::Debug for RabbitSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitSource")
            .field("queue", &self.config.queue)
            .field("bindings", &self.config.bindings)
            .field("connected", &self.link.is_some())
            .finish_non_exhaustive()
    }
}

impl RabbitSource {
    /// Validates the settings and connects: declares the exchange and the
    /// queue, binds it, and starts consuming. A broker that does not answer
    /// is not an error: the source starts and subscribes once it can (each
    /// failed attempt is a source error, and the consumer loop backs off).
    pub async fn connect(config: RabbitSourceConfig) -> Result<RabbitSource, RabbitError> {
        validate(&config)?;
        let mut source = RabbitSource {
            config: Arc::new(config),
            link: None,
            connecting: None,
            last_attempt: Some(Instant::now()),
        };
        match subscribe(&source.config).await {
            Ok(subscription) => source.link = Some(subscription),
            Err(error @ (RabbitError::Config(_) | RabbitError::Topology { .. })) => {
                return Err(error);
            }
            Err(error) => tracing::warn!(
                queue = %source.config.queue,
                %error,
                "RabbitMQ is not reachable; the source subscribes once it is"
            ),
        }
        Ok(source)
    }

    /// Declares the consumer's durable queue and its bindings (and the
    /// exchange, unless `rabbit.declare` is off) without consuming, then
    /// disconnects. RabbitMQ routes a message only to the queues bound
    /// when it is published, so a consumer whose queue is declared after
    /// the relay published (while another consumer's queue was bound, so
    /// `mandatory` did not return the message) never receives those
    /// events. Run this at deploy time, before the relay starts, for every
    /// consumer (the same settings as its source: the queue's arguments
    /// must match). Safe to run again.
    pub async fn declare(config: &RabbitSourceConfig) -> Result<(), RabbitError> {
        validate(config)?;
        let link = open(&config.rabbit).await?;
        declare_queue(&link, config).await?;
        let _ = link.connection.close(200, "declared".into()).await;
        Ok(())
    }

    /// Starts a subscription in the background unless one is under way,
    /// at most once per [`RECONNECT_PAUSE`].
    fn start_subscribing(&mut self) {
        if self.connecting.is_some() {
            return;
        }
        let wait = self.last_attempt.map_or(Duration::ZERO, |at| {
            RECONNECT_PAUSE.saturating_sub(at.elapsed())
        });
        self.last_attempt = Some(Instant::now() + wait);
        let config = Arc::clone(&self.config);
        self.connecting = Some(tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            subscribe(&config).await
        }));
    }
}

/// Checks the settings before anything connects.
fn validate(config: &RabbitSourceConfig) -> Result<(), RabbitError> {
    outbox_core::consumer::validate_consumer_name(&config.queue)?;
    config.rabbit.validate()?;
    if config.prefetch == 0 {
        return Err(ConfigError::InvalidValue {
            what: "RabbitMQ prefetch",
            reason: "must be above zero (zero means unbounded in AMQP)".into(),
        }
        .into());
    }
    if let Some(bad) = config
        .bindings
        .iter()
        .find(|b| b.is_empty() || b.len() > 255 || b.contains(char::is_whitespace))
    {
        return Err(ConfigError::InvalidValue {
            what: "RabbitMQ bindings",
            reason: format!("{bad:?} is not a binding key"),
        }
        .into());
    }
    Ok(())
}

/// Connects, declares the exchange and the queue, binds it and consumes.
async fn subscribe(config: &RabbitSourceConfig) -> Result<Subscription, RabbitError> {
    let link = open(&config.rabbit).await?;
    declare_queue(&link, config).await?;
    let consumer = link
        .channel
        .basic_consume(
            config.queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| RabbitError::Topology {
            what: format!("queue {}", config.queue),
            reason: e.to_string(),
        })?;
    Ok((link, consumer))
}

/// Sets the prefetch, declares the durable queue and binds it once per
/// binding key.
async fn declare_queue(link: &Link, config: &RabbitSourceConfig) -> Result<(), RabbitError> {
    let topology = |what: String| {
        move |e: lapin::Error| RabbitError::Topology {
            what,
            reason: e.to_string(),
        }
    };
    let queue_what = format!("queue {}", config.queue);
    let mut arguments = FieldTable::default();
    if config.single_active_consumer {
        arguments.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    }
    link.channel
        .basic_qos(config.prefetch, BasicQosOptions::default())
        .await
        .map_err(topology(queue_what.clone()))?;
    link.channel
        .queue_declare(
            config.queue.as_str().into(),
            QueueDeclareOptions::durable(),
            arguments,
        )
        .await
        .map_err(topology(queue_what.clone()))?;
    for binding in &config.bindings {
        link.channel
            .queue_bind(
                config.queue.as_str().into(),
                config.rabbit.exchange.as_str().into(),
                binding.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(topology(format!("binding {binding:?} of {queue_what}")))?;
    }
    Ok(())
}

/// A RabbitMQ message being processed.
pub struct RabbitDelivery {
    delivery: AmqpDelivery,
    incoming: Incoming,
}

impl std::fmt::Debug for RabbitDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitDelivery")
            .field("routing_key", &self.delivery.routing_key.as_str())
            .field("attempt", &self.incoming.attempt())
            .finish_non_exhaustive()
    }
}

impl RabbitDelivery {
    fn new(delivery: AmqpDelivery) -> RabbitDelivery {
        let properties = &delivery.properties;
        let (mut attributes, problem) = headers::read(properties.headers().as_ref());
        // The binding carries `datacontenttype` as the `content_type`
        // property.
        if let Some(content_type) = properties.content_type()
            && !attributes
                .iter()
                .any(|(name, _)| name == outbox_core::ce::DATACONTENTTYPE)
        {
            attributes.push((
                outbox_core::ce::DATACONTENTTYPE.to_owned(),
                content_type.as_str().to_owned(),
            ));
        }
        // Quorum queues count deliveries; classic queues only say whether
        // the message was delivered before.
        let attempt = properties
            .headers()
            .as_ref()
            .and_then(|h| h.inner().get("x-delivery-count"))
            .and_then(|count| match count {
                AMQPValue::LongLongInt(n) => u32::try_from(*n).ok(),
                AMQPValue::LongInt(n) => u32::try_from(*n).ok(),
                _ => None,
            })
            .map(|count| count.saturating_add(1))
            .unwrap_or(if delivery.redelivered { 2 } else { 1 });
        let attribute = |wanted: &str| {
            attributes
                .iter()
                .find(|(name, _)| name == wanted)
                .map(|(_, value)| value.clone())
        };
        tracing::debug!(
            delivery_tag = delivery.delivery_tag,
            redelivered = delivery.redelivered,
            event_id = ?attribute(outbox_core::ce::ID),
            aggregate_id = ?attribute(outbox_core::ce::AGGREGATEID),
            aggregate_version = ?attribute(outbox_core::ce::AGGREGATEVERSION),
            "RabbitMQ delivery"
        );
        let payload = delivery.data.clone();
        let incoming = match problem {
            None => Incoming::new(attributes, payload, attempt),
            Some(reason) => Incoming::malformed(attributes, payload, attempt, reason),
        };
        RabbitDelivery { delivery, incoming }
    }
}

impl Delivery for RabbitDelivery {
    fn incoming(&self) -> &Incoming {
        &self.incoming
    }

    async fn ack(self) -> Result<(), SourceError> {
        match self.delivery.ack(BasicAckOptions::default()).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(SourceError(
                "RabbitMQ ack not sent: the channel closed, the broker delivers the message again"
                    .into(),
            )),
            Err(error) => Err(SourceError(format!("RabbitMQ ack failed: {error}"))),
        }
    }

    async fn retry_later(self, delay: Duration) -> Result<(), SourceError> {
        // Hold the message (unacknowledged, counted by the prefetch) for the
        // backoff, then hand it back to the queue. If the channel closes
        // meanwhile, the broker requeues it anyway.
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let requeue = BasicNackOptions {
                requeue: true,
                multiple: false,
            };
            if let Err(error) = self.delivery.nack(requeue).await {
                tracing::debug!(%error, "RabbitMQ nack failed; the broker requeues on channel close");
            }
        });
        Ok(())
    }
}

impl MessageSource for RabbitSource {
    type Delivery = RabbitDelivery;

    async fn next_batch(&mut self, max: usize) -> Result<Vec<RabbitDelivery>, SourceError> {
        let usable = self.link.as_ref().is_some_and(|(link, _)| link.is_open());
        if !usable {
            self.link = None;
            self.start_subscribing();
            let connecting = self.connecting.as_mut().expect("a subscription under way");
            let result = connecting.await;
            self.connecting = None;
            let url = redacted_url(&self.config.rabbit.url);
            match result {
                Ok(Ok(subscription)) => self.link = Some(subscription),
                Ok(Err(error)) => {
                    return Err(SourceError(format!(
                        "RabbitMQ at {url}: {error}; subscribing again"
                    )));
                }
                Err(error) => {
                    return Err(SourceError(format!(
                        "RabbitMQ at {url}: the subscription task failed ({error}); subscribing again"
                    )));
                }
            }
        }
        let Some((_, consumer)) = self.link.as_mut() else {
            return Err(SourceError("not subscribed".into()));
        };
        let first = match consumer.next().await {
            Some(Ok(delivery)) => delivery,
            Some(Err(error)) => {
                self.link = None;
                return Err(SourceError(format!("RabbitMQ delivery failed: {error}")));
            }
            None => {
                self.link = None;
                return Err(SourceError(
                    "RabbitMQ cancelled the subscription; subscribing again".into(),
                ));
            }
        };
        let mut batch = vec![RabbitDelivery::new(first)];
        while batch.len() < max {
            match consumer.next().now_or_never() {
                Some(Some(Ok(delivery))) => batch.push(RabbitDelivery::new(delivery)),
                _ => break,
            }
        }
        Ok(batch)
    }
}
