//! Example services for the outbox framework: an order service that emits
//! events and the consumers that react to them. `contracts` holds the event
//! contracts; their committed schema registry is `schemas/` at the
//! repository root. `metrics_endpoint` serves `/metrics` for Prometheus; `brokers` wires
//! the service to NATS, Kafka or RabbitMQ (`OUTBOX_BROKER`, feature
//! `brokers`, on by default); `embedded` is the same service on one SQLite
//! file with in-process delivery (no server, no broker).

#[cfg(feature = "brokers")]
pub mod brokers;
pub mod contracts;
pub mod embedded;
pub mod metrics_endpoint;
pub mod orders;
pub mod projections;
