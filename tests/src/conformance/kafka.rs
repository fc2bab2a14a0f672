//! Kafka in the conformance suite: librdkafka's mock cluster (the real
//! protocol, in process), one broker, the events topic with 4 partitions;
//! "down" is the mock broker taken down, with its log kept.
//!
//! What the mock cannot show: replication and `acks=all` across brokers
//! (one broker here), a broker process restart (the mock broker goes down
//! and up in place), authorization (it has no ACLs; the classification of
//! those errors is tested by injecting the error codes).

use outbox_postgres::PgConsumer;
use std::time::Duration;

use outbox_kafka::{KafkaConfig, KafkaSource, KafkaSourceConfig, KafkaTransport};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;

use super::Broker;

/// The topic the conformance events (`counter.ticked`) go to.
pub const TOPIC: &str = "outbox.event.counter";

/// A mock cluster for one test.
pub struct KafkaBroker {
    cluster: MockCluster<'static, DefaultProducerContext>,
}

impl KafkaBroker {
    /// Starts a one-broker mock cluster with the events topic.
    pub fn start() -> KafkaBroker {
        let cluster = MockCluster::new(1).expect("librdkafka mock cluster");
        cluster
            .create_topic(TOPIC, 4, 1)
            .expect("create the events topic");
        KafkaBroker { cluster }
    }

    /// The mock cluster, for error injection.
    pub fn cluster(&self) -> &MockCluster<'static, DefaultProducerContext> {
        &self.cluster
    }

    /// Settings for this cluster.
    pub fn config(&self) -> KafkaConfig {
        KafkaConfig {
            bootstrap_servers: self.cluster.bootstrap_servers(),
            delivery_timeout: Duration::from_secs(20),
            connect_timeout: Duration::from_secs(2),
            client: vec![
                ("message.max.bytes".into(), (1024 * 1024).to_string()),
                ("reconnect.backoff.max.ms".into(), "500".into()),
            ],
            ..KafkaConfig::default()
        }
    }
}

impl Broker for KafkaBroker {
    type Transport = KafkaTransport;
    type Source = KafkaSource;

    fn name(&self) -> &'static str {
        "kafka"
    }

    async fn transport(&self) -> KafkaTransport {
        KafkaTransport::connect(self.config())
            .await
            .expect("Kafka transport")
    }

    async fn source(&self, consumer: &PgConsumer) -> KafkaSource {
        let mut config =
            KafkaSourceConfig::for_consumer(consumer, self.config()).expect("source config");
        // A dropped instance's partitions move to the next one quickly.
        config.kafka.client.extend([
            ("session.timeout.ms".into(), "6000".into()),
            ("heartbeat.interval.ms".into(), "500".into()),
        ]);
        KafkaSource::connect(config).await.expect("Kafka source")
    }

    async fn stop(&mut self) {
        self.cluster.broker_down(1).expect("mock broker down");
    }

    async fn start(&mut self) {
        self.cluster.broker_up(1).expect("mock broker up");
    }
}
