//! Example services for the outbox framework: an order service that emits
//! events and the consumers that react to them. `contracts` holds the event
//! contracts; their committed schema registry is `schemas/` at the
//! repository root. `metrics_endpoint` serves `/metrics` for Prometheus; `brokers` wires
//! the service to NATS, Kafka or RabbitMQ (`OUTBOX_BROKER`).

pub mod brokers;
pub mod contracts;
pub mod metrics_endpoint;
pub mod orders;
pub mod projections;
