//! Test support for the integration and fault-injection tests: a fresh
//! PostgreSQL schema per test, private nats-server processes that a test can
//! stop and restart, and helpers to wait for conditions with a deadline.
//! Every helper fails loudly (a panic naming the service and how to start
//! it) when a service cannot be had: a test never skips.

pub mod browser;
pub mod chaos;
pub mod conformance;
pub mod console;
pub mod consumer_conformance;
pub mod consumers;
pub mod cpu;
pub mod db;
pub mod events;
pub mod faults;
pub mod jetstream;
pub mod metrics;
pub mod mysql;
pub mod nats;
pub mod pgcluster;
pub mod ports;
pub mod proxy;
pub mod rabbitnode;
pub mod relay_processes;
pub mod statements;
pub mod stats;
pub mod store_conformance;
pub mod tansu;
pub mod transports;
pub mod wait;

pub use db::TestDb;
pub use nats::NatsServer;
