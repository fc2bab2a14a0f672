//! The fault rig shared by the fault suites (`tests/tests/fault_suite*.rs`,
//! CI length, one per broker) and the soak (`src/bin/soak.rs`, a million
//! events): relays and consumers as `fault-node` processes against a
//! private PostgreSQL cluster and a broker of the rig's own, faults from a
//! seeded schedule, invariants read from the databases, and the soak's
//! report.

pub mod broker;
pub mod invariants;
pub mod report;
mod rig;
mod schedule;
pub mod suite;

pub use broker::{BrokerKind, RigBroker};
pub use rig::{
    CONSUMERS, FAULTS, Fault, FaultRecord, Node, RELAY_STATEMENT_TIMEOUT, Rig, RigConfig,
    STRICT_PARK_TIMEOUT, signal,
};
pub use schedule::Schedule;
