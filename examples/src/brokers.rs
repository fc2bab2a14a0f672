//! The example service's broker, chosen by `OUTBOX_BROKER`: `nats` (the
//! default), `kafka` or `rabbitmq`. Each wires a relay and the consumers
//! through the broker's own crate; nothing else in the service changes.
//!
//! Destinations are each crate's defaults, as a service that keeps them
//! gets them: NATS stream `OUTBOX` with subjects
//! `events.{aggregate_type}.{event_type}`, Kafka topics
//! `outbox.event.{aggregate_type}` (Debezium's), RabbitMQ exchange `outbox`
//! with routing keys `{aggregate_type}.{event_type}`; the CloudEvents
//! `source` is `/order-service`. `OUTBOX_DEMO_NAMES=1` uses names of the
//! demo's own instead (stream `OUTBOX_DEMO` with subjects `demo.…`, topics
//! `demo.event.…`, exchange `outbox-demo`), for a broker shared with a
//! service that uses the defaults.
//!
//! - `nats`: `NATS_URL` (default `nats://127.0.0.1:4222`); the demo's own
//!   stream is recreated on each run, the default one is left as it is
//!   (the consumers' durables resume after what they acknowledged);
//! - `kafka`: `KAFKA_BOOTSTRAP_SERVERS` (the topics must exist or be
//!   auto-created); without it, an in-process librdkafka mock cluster
//!   (there is no Kafka server package on the project's machines), on
//!   which the topics are created;
//! - `rabbitmq`: `AMQP_URL` (default `amqp://guest:guest@127.0.0.1:5672/%2f`);
//!   the consumers' queues are deleted first, so each run starts clean.

use anyhow::{Context, bail};
use outbox_core::consumer::ConsumerTask;
use outbox_core::relay::{Relay, RelayConfig};
use outbox_kafka::{KafkaConfig, KafkaSource, KafkaSourceConfig, KafkaTransport, TopicTemplate};
use outbox_nats::{JetStreamSource, JetStreamSourceConfig, NatsConfig, NatsTransport};
use outbox_postgres::prelude::*;
use outbox_postgres::{PgConsumer, SchemaName};
use outbox_rabbitmq::{RabbitConfig, RabbitSource, RabbitSourceConfig, RabbitTransport};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use sqlx::PgPool;

/// Which broker the service runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrokerKind {
    /// NATS JetStream.
    Nats,
    /// Kafka.
    Kafka,
    /// RabbitMQ.
    RabbitMq,
}

impl BrokerKind {
    /// From `OUTBOX_BROKER` (unset: NATS).
    pub fn from_env() -> anyhow::Result<BrokerKind> {
        match std::env::var("OUTBOX_BROKER").as_deref() {
            Err(_) | Ok("") | Ok("nats") => Ok(BrokerKind::Nats),
            Ok("kafka") => Ok(BrokerKind::Kafka),
            Ok("rabbitmq") => Ok(BrokerKind::RabbitMq),
            Ok(other) => bail!("OUTBOX_BROKER={other:?}: use nats, kafka or rabbitmq"),
        }
    }
}

/// The service's name: its CloudEvents `source` is `/order-service`.
const SERVICE: &str = "order-service";

/// Whether `OUTBOX_DEMO_NAMES` asks for the demo's own destinations.
fn demo_names() -> bool {
    std::env::var("OUTBOX_DEMO_NAMES").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A relay and consumer tasks on one broker, and what keeps it alive.
pub struct Wired {
    /// The relay.
    pub relay: Relay,
    /// One task per consumer.
    pub consumers: Vec<ConsumerTask>,
    /// Where the events go, for the service's first line.
    pub destination: String,
    /// The mock cluster when Kafka runs in process (dropped last).
    pub kafka_mock: Option<MockCluster<'static, DefaultProducerContext>>,
}

/// Starts the relay on `kind` and one task per consumer.
pub async fn wire(
    kind: BrokerKind,
    pool: &PgPool,
    schema: &SchemaName,
    consumers: Vec<PgConsumer>,
) -> anyhow::Result<Wired> {
    match kind {
        BrokerKind::Nats => {
            let url = std::env::var("NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
            let mut nats = NatsConfig {
                url: url.clone(),
                ..NatsConfig::for_service(SERVICE)
            };
            if demo_names() {
                nats.stream = "OUTBOX_DEMO".into();
                nats.subject_template = "demo.{aggregate_type}.{event_type}".into();
                reset_stream(&url, &nats.stream).await?;
            }
            let relay =
                start_relay(pool, schema, NatsTransport::connect(nats.clone()).await?).await?;
            let mut tasks = Vec::new();
            for consumer in consumers {
                let config = JetStreamSourceConfig::for_consumer(&consumer, nats.clone())?;
                tasks.push(consumer.spawn(JetStreamSource::connect(config).await?));
            }
            Ok(Wired {
                relay,
                consumers: tasks,
                destination: format!("NATS JetStream stream {} at {url}", nats.stream),
                kafka_mock: None,
            })
        }
        BrokerKind::Kafka => {
            let template = if demo_names() {
                "demo.event.{aggregate_type}".to_owned()
            } else {
                KafkaConfig::default().topic_template
            };
            let (servers, mock) = match std::env::var("KAFKA_BOOTSTRAP_SERVERS") {
                Ok(servers) if !servers.is_empty() => (servers, None),
                _ => {
                    let mock = MockCluster::new(1).context("librdkafka mock cluster")?;
                    let topics = TopicTemplate::new(&template)?;
                    let mut names = std::collections::BTreeSet::new();
                    for consumer in &consumers {
                        for (aggregate_type, event_type) in consumer.subscribed_types() {
                            names.insert(
                                topics
                                    .topic_for(aggregate_type, event_type)
                                    .map_err(anyhow::Error::msg)?,
                            );
                        }
                    }
                    for topic in names {
                        mock.create_topic(&topic, 4, 1)
                            .with_context(|| format!("create topic {topic}"))?;
                    }
                    (mock.bootstrap_servers(), Some(mock))
                }
            };
            let kafka = KafkaConfig {
                bootstrap_servers: servers.clone(),
                topic_template: template.clone(),
                ..KafkaConfig::for_service(SERVICE)
            };
            let relay =
                start_relay(pool, schema, KafkaTransport::connect(kafka.clone()).await?).await?;
            let mut tasks = Vec::new();
            for consumer in consumers {
                let config = KafkaSourceConfig::for_consumer(&consumer, kafka.clone())?;
                tasks.push(consumer.spawn(KafkaSource::connect(config).await?));
            }
            let kind = if mock.is_some() {
                "librdkafka's in-process mock cluster"
            } else {
                "the cluster"
            };
            Ok(Wired {
                relay,
                consumers: tasks,
                destination: format!("Kafka topics {template} on {kind} at {servers}"),
                kafka_mock: mock,
            })
        }
        BrokerKind::RabbitMq => {
            let mut rabbit = RabbitConfig {
                url: std::env::var("AMQP_URL").unwrap_or_else(|_| RabbitConfig::default().url),
                ..RabbitConfig::for_service(SERVICE)
            };
            if demo_names() {
                rabbit.exchange = "outbox-demo".into();
            }
            let mut tasks = Vec::new();
            let mut sources = Vec::new();
            for consumer in &consumers {
                let config = RabbitSourceConfig::for_consumer(consumer, rabbit.clone())?;
                reset_queue(&rabbit.url, &config.queue).await?;
                // The queues exist before the relay publishes (else its
                // mandatory publishes come back unroutable and wait).
                sources.push(RabbitSource::connect(config).await?);
            }
            for (consumer, source) in consumers.into_iter().zip(sources) {
                tasks.push(consumer.spawn(source));
            }
            let relay = start_relay(
                pool,
                schema,
                RabbitTransport::connect(rabbit.clone()).await?,
            )
            .await?;
            Ok(Wired {
                relay,
                consumers: tasks,
                destination: format!("RabbitMQ exchange {}", rabbit.exchange),
                kafka_mock: None,
            })
        }
    }
}

async fn start_relay<T: outbox_core::transport::Transport>(
    pool: &PgPool,
    schema: &SchemaName,
    transport: T,
) -> anyhow::Result<Relay> {
    Ok(Relay::start_postgres(
        pool.clone(),
        schema.clone(),
        transport,
        RelayConfig::default(),
    )
    .await?)
}

/// Deletes the demo stream (and its durable consumers) so every run starts clean.
async fn reset_stream(url: &str, stream: &str) -> anyhow::Result<()> {
    let client = async_nats::connect(url)
        .await
        .with_context(|| format!("NATS at {url}"))?;
    let context = async_nats::jetstream::new(client);
    let _ = context.delete_stream(stream).await;
    Ok(())
}

/// Deletes a consumer's queue so every run starts clean.
async fn reset_queue(url: &str, queue: &str) -> anyhow::Result<()> {
    let connection = lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .with_context(|| format!("RabbitMQ at {url}"))?;
    let channel = connection.create_channel().await?;
    let _ = channel
        .queue_delete(queue.into(), lapin::options::QueueDeleteOptions::default())
        .await;
    Ok(())
}
