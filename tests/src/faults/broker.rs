//! The rig's broker: which one, how the `fault-node` processes reach it,
//! and how each broker-side fault is done to it.
//!
//! | fault | NATS JetStream | Kafka (librdkafka mock cluster) | RabbitMQ (private node) |
//! |---|---|---|---|
//! | restart | nats-server killed, started on its store | the mock broker taken down (connections closed, new ones refused) and up, its log kept | the node killed (SIGKILL) and booted again on its store |
//! | blackhole | proxy drops everything | every response held back for the length (round-trip time) | proxy drops everything |
//! | delay | proxy holds every byte | round-trip time | proxy holds every byte |
//! | duplicates | stored messages again under new `Nats-Msg-Id`s | stored records produced again | messages from a tap queue published again |
//! | poison | an undecodable event and a headerless message | the same, as records | the same, as messages |
//!
//! Kafka clients learn the brokers' addresses from the cluster's metadata,
//! so a TCP proxy in front of the bootstrap address would only see the
//! first connection: the mock cluster's own round-trip time stands in for
//! the proxy's delay and silence.

use std::time::Duration;

use async_nats::HeaderMap;
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions,
    QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties, ExchangeKind};
use outbox_core::Envelope;
use outbox_core::transport::Transport;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{DefaultProducerContext, FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use uuid::Uuid;

use super::schedule::Schedule;
use crate::NatsServer;
use crate::proxy::TcpProxy;
use crate::rabbitnode::RabbitNode;

/// Which broker a rig runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum BrokerKind {
    /// A private nats-server with JetStream.
    Nats,
    /// librdkafka's mock cluster, in the test process, reached over TCP.
    Kafka,
    /// A private RabbitMQ node.
    RabbitMq,
}

impl BrokerKind {
    /// `nats`, `kafka` or `rabbitmq` (what `fault-node` reads from
    /// `OUTBOX_BROKER`).
    pub fn name(self) -> &'static str {
        match self {
            BrokerKind::Nats => "nats",
            BrokerKind::Kafka => "kafka",
            BrokerKind::RabbitMq => "rabbitmq",
        }
    }
}

/// The topics the rig's events go to (`outbox.event.<aggregate_type>`, the
/// crate's default template) and their partitions.
pub const KAFKA_TOPICS: [&str; 2] = ["outbox.event.counter", "outbox.event.piece"];
const KAFKA_PARTITIONS: i32 = 4;
/// The exchange (the crate's default) and the rig's queue that sees every
/// message, from which duplicates are taken.
const RABBIT_EXCHANGE: &str = "outbox";
const RABBIT_TAP: &str = "rig.tap";
/// The mock cluster's one broker.
const MOCK_BROKER: i32 = 1;

/// The broker of a running rig.
pub enum RigBroker {
    /// nats-server behind the rig's proxy.
    Nats {
        /// The server.
        server: NatsServer,
        /// Between the nodes and the server.
        proxy: TcpProxy,
    },
    /// The mock cluster.
    Kafka {
        /// The cluster (it lives as long as the test process holds it).
        cluster: MockCluster<'static, DefaultProducerContext>,
    },
    /// The private node behind the rig's proxy.
    RabbitMq {
        /// The node.
        node: RabbitNode,
        /// Between the nodes and the broker.
        proxy: TcpProxy,
    },
}

impl RigBroker {
    /// Starts the broker and creates what must exist before consumers
    /// start (the stream; the topics; the exchange and the tap queue).
    pub async fn start(kind: BrokerKind) -> RigBroker {
        match kind {
            BrokerKind::Nats => {
                let server = NatsServer::start();
                let proxy = TcpProxy::start(server.url().trim_start_matches("nats://")).await;
                drop(
                    outbox_nats::NatsTransport::connect(outbox_nats::NatsConfig {
                        url: server.url(),
                        ..outbox_nats::NatsConfig::default()
                    })
                    .await
                    .expect("create the stream"),
                );
                RigBroker::Nats { server, proxy }
            }
            BrokerKind::Kafka => {
                let cluster = MockCluster::new(1).expect("librdkafka mock cluster");
                for topic in KAFKA_TOPICS {
                    cluster
                        .create_topic(topic, KAFKA_PARTITIONS, 1)
                        .expect("create a topic");
                }
                RigBroker::Kafka { cluster }
            }
            BrokerKind::RabbitMq => {
                let node = tokio::task::block_in_place(RabbitNode::start);
                let proxy = TcpProxy::start(&node.address()).await;
                let broker = RigBroker::RabbitMq { node, proxy };
                broker.declare_tap().await;
                broker
            }
        }
    }

    /// Which broker.
    pub fn kind(&self) -> BrokerKind {
        match self {
            RigBroker::Nats { .. } => BrokerKind::Nats,
            RigBroker::Kafka { .. } => BrokerKind::Kafka,
            RigBroker::RabbitMq { .. } => BrokerKind::RabbitMq,
        }
    }

    /// The environment that tells `fault-node` which broker and where.
    pub fn env(&self) -> Vec<(String, String)> {
        let (name, value) = match self {
            RigBroker::Nats { proxy, .. } => {
                ("OUTBOX_NATS_URL", format!("nats://{}", proxy.address()))
            }
            RigBroker::Kafka { cluster } => ("OUTBOX_KAFKA_BOOTSTRAP", cluster.bootstrap_servers()),
            RigBroker::RabbitMq { proxy, .. } => (
                "OUTBOX_AMQP_URL",
                format!("amqp://guest:guest@{}/%2f", proxy.address()),
            ),
        };
        vec![
            ("OUTBOX_BROKER".to_owned(), self.kind().name().to_owned()),
            (name.to_owned(), value),
        ]
    }

    /// Takes the broker down for `down`, then brings it back.
    pub async fn restart(&mut self, down: Duration) {
        match self {
            RigBroker::Nats { server, .. } => {
                server.stop();
                tokio::time::sleep(down).await;
                server.resume();
            }
            RigBroker::Kafka { cluster } => {
                cluster.broker_down(MOCK_BROKER).expect("mock broker down");
                tokio::time::sleep(down).await;
                cluster.broker_up(MOCK_BROKER).expect("mock broker up");
            }
            RigBroker::RabbitMq { node, .. } => {
                tokio::task::block_in_place(|| node.kill());
                tokio::time::sleep(down).await;
                // Boots in 5–15 s: the outage is that much longer.
                tokio::task::block_in_place(|| node.resume());
            }
        }
    }

    /// Silence between the nodes and the broker for `length`, then heals.
    pub async fn blackhole(&mut self, length: Duration) {
        match self {
            RigBroker::Nats { proxy, .. } | RigBroker::RabbitMq { proxy, .. } => {
                proxy.blackhole();
                tokio::time::sleep(length).await;
                proxy.heal();
            }
            RigBroker::Kafka { cluster } => {
                cluster
                    .broker_round_trip_time(MOCK_BROKER, length)
                    .expect("mock round-trip time");
                tokio::time::sleep(length).await;
                cluster
                    .broker_round_trip_time(MOCK_BROKER, Duration::ZERO)
                    .expect("mock round-trip time");
            }
        }
    }

    /// Holds every exchange with the broker `latency` (until [`heal`](Self::heal)).
    pub fn delay(&self, latency: Duration) {
        match self {
            RigBroker::Nats { proxy, .. } | RigBroker::RabbitMq { proxy, .. } => {
                proxy.delay(latency)
            }
            RigBroker::Kafka { cluster } => cluster
                .broker_round_trip_time(MOCK_BROKER, latency)
                .expect("mock round-trip time"),
        }
    }

    /// Ends a [`delay`](Self::delay).
    pub fn heal(&self) {
        match self {
            RigBroker::Nats { proxy, .. } | RigBroker::RabbitMq { proxy, .. } => proxy.heal(),
            RigBroker::Kafka { cluster } => cluster
                .broker_round_trip_time(MOCK_BROKER, Duration::ZERO)
                .expect("mock round-trip time"),
        }
    }

    /// Publishes `count` messages the broker holds a second time, as a
    /// broker or a mirroring tool might (under new ids where the broker
    /// deduplicates by id). Gives up quietly while the broker is down:
    /// the fault is a load, not a check.
    pub async fn republish(&mut self, count: u64, schedule: &mut Schedule) {
        match self {
            RigBroker::Nats { server, .. } => republish_nats(&server.url(), count, schedule).await,
            RigBroker::Kafka { cluster } => {
                republish_kafka(&cluster.bootstrap_servers(), count, schedule).await
            }
            RigBroker::RabbitMq { node, .. } => republish_rabbit(&node.url(), count).await,
        }
    }

    /// Publishes an event-shaped message whose payload does not decode
    /// (`id`, aggregate `broker-poison-<n>`) and a message without any
    /// headers whose payload is `garbage`.
    pub async fn publish_poison(
        &mut self,
        id: Uuid,
        n: usize,
        garbage: &[u8],
    ) -> Result<(), String> {
        match self {
            RigBroker::Nats { server, .. } => {
                publish_poison_nats(&server.url(), id, n, garbage).await?
            }
            RigBroker::Kafka { cluster } => {
                let bootstrap = cluster.bootstrap_servers();
                let transport = outbox_kafka::KafkaTransport::connect(outbox_kafka::KafkaConfig {
                    bootstrap_servers: bootstrap.clone(),
                    source: "/not-the-outbox".into(),
                    ..outbox_kafka::KafkaConfig::default()
                })
                .await
                .map_err(|e| e.to_string())?;
                publish_one(&transport, &undecodable(id, n)).await?;
                let producer = kafka_producer(&bootstrap)?;
                producer
                    .send(
                        FutureRecord::<str, [u8]>::to(KAFKA_TOPICS[0])
                            .key("garbage")
                            .payload(garbage),
                        Duration::from_secs(10),
                    )
                    .await
                    .map_err(|(e, _)| e.to_string())?;
            }
            RigBroker::RabbitMq { node, .. } => {
                let transport =
                    outbox_rabbitmq::RabbitTransport::connect(outbox_rabbitmq::RabbitConfig {
                        url: node.url(),
                        source: "/not-the-outbox".into(),
                        ..outbox_rabbitmq::RabbitConfig::default()
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                publish_one(&transport, &undecodable(id, n)).await?;
                let channel = rabbit_channel(&node.url()).await?;
                channel
                    .basic_publish(
                        RABBIT_EXCHANGE.into(),
                        "counter.counter.ticked".into(),
                        BasicPublishOptions {
                            mandatory: true,
                            ..BasicPublishOptions::default()
                        },
                        garbage,
                        BasicProperties::default().with_delivery_mode(2),
                    )
                    .await
                    .map_err(|e| e.to_string())?
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    /// Waits (up to `limit`) until each queue in `queues` exists and has a
    /// consumer (RabbitMQ; other brokers keep messages for consumers that
    /// come later). A source declares and binds its queue before it
    /// consumes, so this is the README's "declare the consumers' queues
    /// first": RabbitMQ routes a message only to the queues bound when it
    /// is published, and the tap queue accepts the relays' `mandatory`
    /// publishes, so an event published before a consumer's queue is bound
    /// would never reach that consumer.
    pub async fn wait_for_queues(&self, queues: &[&str], limit: Duration) {
        let RigBroker::RabbitMq { node, .. } = self else {
            return;
        };
        let deadline = std::time::Instant::now() + limit;
        for queue in queues {
            loop {
                let consumers = match rabbit_channel(&node.url()).await {
                    // A passive declare of a missing queue closes the
                    // channel: a fresh one each look.
                    Ok(channel) => channel
                        .queue_declare(
                            (*queue).into(),
                            QueueDeclareOptions {
                                passive: true,
                                ..QueueDeclareOptions::default()
                            },
                            FieldTable::default(),
                        )
                        .await
                        .map(|declared| declared.consumer_count())
                        .unwrap_or(0),
                    Err(_) => 0,
                };
                if consumers > 0 {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the consumers' queue {queue} has no consumer after {limit:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// The exchange, and a durable queue bound to every routing key: it
    /// keeps a copy of every message for [`republish`](Self::republish).
    /// It does not stand in for the consumers' queues: the rig waits for
    /// those before any event is written ([`wait_for_queues`](Self::wait_for_queues)).
    async fn declare_tap(&self) {
        let RigBroker::RabbitMq { node, .. } = self else {
            return;
        };
        let channel = rabbit_channel(&node.url())
            .await
            .unwrap_or_else(|e| panic!("the rig's RabbitMQ node: {e}"));
        channel
            .exchange_declare(
                RABBIT_EXCHANGE.into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare the exchange");
        channel
            .queue_declare(
                RABBIT_TAP.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare the tap queue");
        channel
            .queue_bind(
                RABBIT_TAP.into(),
                RABBIT_EXCHANGE.into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind the tap queue");
    }
}

/// An event of the rig's consumers' own type whose payload does not
/// decode, as a buggy producer would publish it.
fn undecodable(id: Uuid, n: usize) -> Envelope {
    Envelope {
        id,
        event_type: "counter.ticked".into(),
        schema_version: 1,
        aggregate_type: "counter".into(),
        aggregate_id: format!("broker-poison-{n}"),
        aggregate_version: 1,
        occurred_at: chrono::Utc::now(),
        traceparent: None,
        payload: serde_json::value::RawValue::from_string(r#"{"tick":"not a number"}"#.into())
            .expect("JSON"),
    }
}

async fn publish_one(transport: &impl Transport, envelope: &Envelope) -> Result<(), String> {
    let outcome = transport.publish(&[envelope]).await;
    match outcome.into_iter().next() {
        Some(Ok(())) => Ok(()),
        Some(Err(failure)) => Err(failure.to_string()),
        None => Err("no outcome".into()),
    }
}

fn kafka_producer(bootstrap: &str) -> Result<FutureProducer, String> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("message.timeout.ms", "10000")
        .create()
        .map_err(|e| e.to_string())
}

async fn rabbit_channel(url: &str) -> Result<lapin::Channel, String> {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .map_err(|e| e.to_string())?;
    let channel = connection
        .create_channel()
        .await
        .map_err(|e| e.to_string())?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await
        .map_err(|e| e.to_string())?;
    Ok(channel)
}

async fn jetstream(url: &str) -> Option<async_nats::jetstream::Context> {
    for _ in 0..40 {
        if let Ok(client) = async_nats::connect(url).await {
            return Some(async_nats::jetstream::new(client));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    None
}

async fn republish_nats(url: &str, count: u64, schedule: &mut Schedule) {
    let Some(js) = jetstream(url).await else {
        return;
    };
    let Ok(mut stream) = js.get_stream("OUTBOX").await else {
        return;
    };
    let Ok(info) = stream.info().await else {
        return;
    };
    let (first, last) = (info.state.first_sequence, info.state.last_sequence);
    if last < first || last == 0 {
        return;
    }
    for _ in 0..count {
        let sequence = first + schedule.below(last - first + 1);
        let Ok(message) = stream.get_raw_message(sequence).await else {
            continue;
        };
        let mut headers = HeaderMap::new();
        for (name, values) in message.headers.iter() {
            let name: &str = name.as_ref();
            if name.eq_ignore_ascii_case("Nats-Msg-Id") {
                continue;
            }
            for value in values {
                headers.append(name, value.as_str());
            }
        }
        headers.insert("Nats-Msg-Id", format!("copy-{}", Uuid::new_v4()).as_str());
        if let Ok(ack) = js
            .publish_with_headers(message.subject.clone(), headers, message.payload)
            .await
        {
            let _ = ack.await;
        }
    }
}

/// Reads `count` records at random offsets of the rig's topics (a
/// consumer of no group, assigned by hand) and produces each again.
async fn republish_kafka(bootstrap: &str, count: u64, schedule: &mut Schedule) {
    let Ok(producer) = kafka_producer(bootstrap) else {
        return;
    };
    let reader: BaseConsumer = match ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "rig-republish")
        .set("enable.auto.commit", "false")
        .create()
    {
        Ok(reader) => reader,
        Err(_) => return,
    };
    for _ in 0..count {
        let topic = KAFKA_TOPICS[schedule.below(KAFKA_TOPICS.len() as u64) as usize];
        let partition = schedule.below(KAFKA_PARTITIONS as u64) as i32;
        let picked = tokio::task::block_in_place(|| {
            let (low, high) = reader
                .fetch_watermarks(topic, partition, Duration::from_secs(2))
                .ok()?;
            if high <= low {
                return None;
            }
            let offset = low + schedule.below((high - low) as u64) as i64;
            let mut assignment = TopicPartitionList::new();
            assignment
                .add_partition_offset(topic, partition, Offset::Offset(offset))
                .ok()?;
            reader.assign(&assignment).ok()?;
            let message = reader.poll(Duration::from_secs(2))?.ok()?;
            Some((
                message.key().map(<[u8]>::to_vec),
                message.payload().map(<[u8]>::to_vec),
                message.headers().map(copy_headers),
            ))
        });
        let Some((key, payload, headers)) = picked else {
            continue;
        };
        let mut record = FutureRecord::<[u8], [u8]>::to(topic).partition(partition);
        if let Some(key) = &key {
            record = record.key(key.as_slice());
        }
        if let Some(payload) = &payload {
            record = record.payload(payload.as_slice());
        }
        if let Some(headers) = headers {
            record = record.headers(headers);
        }
        let _ = producer.send(record, Duration::from_secs(5)).await;
    }
}

fn copy_headers(headers: &rdkafka::message::BorrowedHeaders) -> OwnedHeaders {
    use rdkafka::message::Headers;
    let mut copy = OwnedHeaders::new_with_capacity(headers.count());
    for header in headers.iter() {
        copy = copy.insert(Header {
            key: header.key,
            value: header.value,
        });
    }
    copy
}

/// Takes `count` messages off the tap queue and publishes each again with
/// its routing key and properties (it lands in the tap queue again too).
async fn republish_rabbit(url: &str, count: u64) {
    let Ok(channel) = rabbit_channel(url).await else {
        return;
    };
    for _ in 0..count {
        let Ok(Some(message)) = channel
            .basic_get(RABBIT_TAP.into(), BasicGetOptions { no_ack: true })
            .await
        else {
            return;
        };
        let delivery = message.delivery;
        if let Ok(confirm) = channel
            .basic_publish(
                RABBIT_EXCHANGE.into(),
                delivery.routing_key.clone(),
                BasicPublishOptions::default(),
                &delivery.data,
                delivery.properties.clone(),
            )
            .await
        {
            let _ = confirm.await;
        }
    }
}

async fn publish_poison_nats(url: &str, id: Uuid, n: usize, garbage: &[u8]) -> Result<(), String> {
    let js = jetstream(url)
        .await
        .ok_or_else(|| "nats-server does not answer".to_owned())?;
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("ce-specversion", "1.0".to_owned()),
        ("ce-id", id.to_string()),
        ("ce-source", "/not-the-outbox".to_owned()),
        ("ce-type", "counter.ticked".to_owned()),
        ("ce-time", "2026-12-03T00:00:00Z".to_owned()),
        ("ce-schemaversion", "1".to_owned()),
        ("ce-aggregatetype", "counter".to_owned()),
        ("ce-aggregateid", format!("broker-poison-{n}")),
        ("ce-aggregateversion", "1".to_owned()),
        ("Nats-Msg-Id", id.to_string()),
    ] {
        headers.insert(name, value.as_str());
    }
    let sent = async {
        js.publish_with_headers(
            "events.counter.counter.ticked",
            headers,
            br#"{"tick":"not a number"}"#.to_vec().into(),
        )
        .await?
        .await?;
        js.publish("events.counter.counter.ticked", garbage.to_vec().into())
            .await?
            .await?;
        Ok::<_, async_nats::Error>(())
    }
    .await;
    sent.map_err(|e| e.to_string())
}
