//! # outbox-rabbitmq
//!
//! RabbitMQ for `outbox-core`: [`RabbitTransport`] publishes the relay's
//! events on a topic exchange with publisher confirms and persistent
//! delivery; [`RabbitSource`] feeds a consumer from a durable queue with
//! manual acknowledgements sent after the consumer's commit.
//!
//! What travels:
//!
//! - **exchange**: a durable topic exchange (`outbox` by default), declared
//!   by both sides (or only checked, with `declare: false`);
//! - **routing key**: rendered from a template (`{aggregate_type}.{event_type}`
//!   by default); an aggregate id in the template is written as one word
//!   with [`outbox_core::encoding::encode_token`], so `a.b` stays one word;
//! - **properties**: `message_id` = event id, `type` = event type,
//!   `content_type` = `application/json`, `timestamp` = occurred at (seconds),
//!   `app_id` = the CloudEvents source, `delivery_mode` 2 (persistent);
//! - **headers**: every CloudEvents attribute but `datacontenttype` (that
//!   is `content_type`) under the AMQP binding's preferred `cloudEvents_`
//!   prefix (`cloudEvents_id`, `cloudEvents_type`, ...,
//!   `cloudEvents_aggregateid`; `cloudEvents:` is read too), as AMQP long
//!   strings, not percent-encoded (AMQP header values are binary-safe);
//! - **mandatory**: a message no queue is bound for comes back from the
//!   broker, and is a retryable failure: its event is not marked
//!   published until a queue is bound (RabbitMQ would drop it silently).
//!   It protects only while no queue at all is bound: RabbitMQ routes a
//!   message to the queues bound when it is published, so declare every
//!   consumer's queue ([`RabbitSource::declare`]) before the relay first
//!   publishes what that consumer must see.
//!
//! **Ordering.** A queue is declared with `x-single-active-consumer`: of all
//! instances consuming it, one receives messages at a time, in queue order;
//! another takes over when it disconnects. That keeps each aggregate's
//! order without a consistent-hash exchange, at the cost that one queue is
//! consumed by one process at a time (scale by batching, or by one queue
//! per consumer and aggregate range). A message whose handler fails is held
//! (unacknowledged) for its backoff and then returned to the queue with
//! `basic.nack(requeue)`: no busy loop, and the prefetch bound counts it.
//!
//! ## The relay on RabbitMQ
//!
//! Runs against the PostgreSQL at `DATABASE_URL` and the RabbitMQ at
//! `AMQP_URL` (the repository's `scripts/test.sh` starts both).
//!
//! ```
//! use std::time::Duration;
//! use outbox_core::OutboxEvent;
//! use outbox_postgres::Outbox;
//! use outbox_postgres::prelude::*; // Relay::start_postgres
//! use outbox_core::relay::{Relay, RelayConfig, RelayStore};
//! use outbox_postgres::{PgRelayStore, SchemaName};
//! use outbox_rabbitmq::{RabbitConfig, RabbitSource, RabbitSourceConfig, RabbitTransport};
//! # #[derive(serde::Serialize, serde::Deserialize, schemars::JsonSchema, OutboxEvent)]
//! # #[outbox(event_type = "doc.order_shipped", aggregate = "doc_shipment", version = 1)]
//! # struct OrderPlaced { #[outbox(aggregate_id)] order_id: String, total_cents: i64 }
//! # #[tokio::main]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
//! # let pool = sqlx::PgPool::connect(&url).await?;
//! # let schema = SchemaName::new(format!("doc_rabbit_relay_{}", std::process::id()))?;
//! # let outbox = Outbox::new(schema.clone());
//! # outbox.migrate(&pool).await?;
//! # let mut tx = pool.begin().await?;
//! # outbox.emit(&mut tx, &OrderPlaced { order_id: "o-1".into(), total_cents: 1 }).await?;
//! # tx.commit().await?;
//! let rabbit = RabbitConfig {
//!     url: std::env::var("AMQP_URL").unwrap_or_else(|_| RabbitConfig::default().url),
//!     exchange: format!("doc-relay-{}", std::process::id()),
//!     ..RabbitConfig::default()
//! };
//! // Queues first: a consumer's queue is bound before the relay publishes
//! // (usually `RabbitSourceConfig::for_consumer(&consumer, ..)`).
//! let queue = RabbitSourceConfig {
//!     rabbit: rabbit.clone(),
//!     queue: format!("doc-relay-{}", std::process::id()),
//!     bindings: vec!["#".into()],
//!     prefetch: 10,
//!     single_active_consumer: true,
//! };
//! RabbitSource::declare(&queue).await?;
//! let transport = RabbitTransport::connect(rabbit).await?; // declares the exchange
//! let relay = Relay::start_postgres(pool.clone(), schema.clone(), transport, RelayConfig::default()).await?;
//!
//! let store = PgRelayStore::new(pool.clone(), schema.clone(), Default::default(), Duration::from_secs(120));
//! while store.stats().await?.pending > 0 {
//!     tokio::time::sleep(Duration::from_millis(20)).await;
//! }
//! assert_eq!(store.stats().await?.failed, 0, "published, not given up on");
//! relay.drain(Duration::from_secs(5)).await?;
//! # let connection = lapin::Connection::connect(&queue.rabbit.url, lapin::ConnectionProperties::default()).await?;
//! # let channel = connection.create_channel().await?;
//! # channel.queue_delete(queue.queue.as_str().into(), lapin::options::QueueDeleteOptions::default()).await?;
//! # sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {} CASCADE", schema.quoted()))).execute(&pool).await?;
//! # Ok(()) }
//! ```

mod config;
mod connection;
mod headers;
mod source;
mod transport;

pub use config::{RabbitConfig, RabbitError, RoutingKeyTemplate};
pub use headers::{HEADER_PREFIX, header_name};
pub use source::{RabbitDelivery, RabbitSource, RabbitSourceConfig};
pub use transport::RabbitTransport;
