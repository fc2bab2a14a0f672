//! # outbox-kafka
//!
//! Kafka for `outbox-core`: [`KafkaTransport`] publishes the relay's events
//! with an idempotent producer; [`KafkaSource`] feeds a consumer from a
//! consumer group, committing offsets only after the consumer's
//! transaction committed.
//!
//! What travels:
//!
//! - **topic**: rendered from a template, `outbox.event.{aggregate_type}`
//!   by default (Debezium's outbox event router writes the same topics, so
//!   consumers written for it can switch);
//! - **key**: the aggregate id, as UTF-8 bytes: every event of an aggregate
//!   lands on one partition, in order;
//! - **headers**: the CloudEvents Kafka binding in binary mode: `ce_id`,
//!   `ce_type`, `ce_source`, `ce_subject`, `ce_time`, `ce_dataschema`,
//!   `ce_specversion`, the extensions `ce_schemaversion`,
//!   `ce_aggregatetype`, `ce_aggregateid`, `ce_aggregateversion`,
//!   `ce_traceparent`, and `content-type: application/json`; values are
//!   UTF-8 as they are (the Kafka binding does not percent-encode). An `id`
//!   header repeats the event id, as Debezium writes it;
//! - **timestamp**: when the event occurred.
//!
//! The producer runs with `enable.idempotence=true` and `acks=all`: a
//! retried send is neither duplicated nor reordered within a partition.
//! Keys are placed by murmur2 (`partitioner = murmur2_random`), as the Java
//! client, Kafka Connect and Kafka Streams place them. Each batch is queued
//! at once and every delivery report awaited; a record the cluster refuses
//! for good (too large, not authorized) is a permanent failure for that
//! event alone; an unknown topic or partition is retried for
//! `unknown_topic_retry`, then permanent. Topics the contracts map to that
//! the cluster lacks are created with `create_topics`, or reported as a
//! degraded health.
//!
//! ## The relay on Kafka
//!
//! ```no_run
//! use outbox_postgres::prelude::*; // Relay::start_postgres
//! use outbox_core::relay::{Relay, RelayConfig};
//! use outbox_postgres::SchemaName;
//! use outbox_kafka::{KafkaConfig, KafkaTransport};
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/postgres").await?;
//! let kafka = KafkaConfig {
//!     bootstrap_servers: "kafka-1:9092,kafka-2:9092".into(),
//!     client: vec![("compression.type".into(), "zstd".into())],
//!     ..KafkaConfig::default()
//! };
//! let transport = KafkaTransport::connect(kafka).await?;
//! let relay = Relay::start_postgres(pool, SchemaName::new("orders")?, transport, RelayConfig::default()).await?;
//! # Ok(()) }
//! ```
//!
//! The runnable version of this, against librdkafka's mock cluster, is in
//! the repository's transport conformance suite (`tests/tests/conformance_kafka.rs`).

mod config;
mod headers;
mod source;
mod transport;

pub use config::{KafkaConfig, KafkaError, TopicCreation, TopicTemplate};
pub use headers::{HEADER_PREFIX, header_name};
pub use source::{GroupContext, KafkaDelivery, KafkaSource, KafkaSourceConfig};
pub use transport::KafkaTransport;
