//! The PostgreSQL entry points on the engine's types, as extension traits
//! (the engine in `outbox-core` names no database, so it cannot carry
//! them itself): `Relay::start_postgres(..)` and `ConsumerBuilder::new(..)
//! … .build(pool, schema)` read as they did when PostgreSQL was in the
//! core, with `use outbox_postgres::prelude::*;` in scope.

use std::future::Future;

use outbox_core::consumer::{BuildErrors, Consumer, ConsumerBuilder};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::store::{ConfigError, SchemaName};
use outbox_core::transport::Transport;
use sqlx::{PgConnection, PgPool};

use crate::{PgConsumerStore, PgRelayStore};

/// A consumer on the PostgreSQL store.
pub type PgConsumer = Consumer<PgConsumerStore>;

/// A consumer builder whose handlers receive `&mut PgConnection`.
pub type PgConsumerBuilder = ConsumerBuilder<PgConnection>;

/// Starts a [`Relay`] over a PostgreSQL outbox.
pub trait RelayPostgresExt: Sized {
    /// Starts a relay over the PostgreSQL outbox of `schema` (migrated with
    /// [`migrate`](crate::migrate)): the claim of [`PgRelayStore`] with the
    /// config's failed-head policy, claim and statement timeouts, partition
    /// lease and rebalance interval, and NOTIFY wake-ups.
    fn start_postgres<T: Transport>(
        pool: PgPool,
        schema: SchemaName,
        transport: T,
        config: RelayConfig,
    ) -> impl Future<Output = Result<Self, ConfigError>> + Send;
}

impl RelayPostgresExt for Relay {
    async fn start_postgres<T: Transport>(
        pool: PgPool,
        schema: SchemaName,
        transport: T,
        config: RelayConfig,
    ) -> Result<Relay, ConfigError> {
        // Before the store takes the settings: it computes deadlines from
        // them, which an unchecked value could overflow.
        config.validate()?;
        let store = PgRelayStore::new(
            pool,
            schema.clone(),
            config.failed_head_policy,
            config.claim_timeout,
        )
        .with_statement_timeout(config.statement_timeout)
        .with_partitioning(config.lease, config.rebalance_interval);
        Relay::start(store, transport, config, schema.as_str()).await
    }
}

/// Builds a [`Consumer`] whose handlers receive `&mut PgConnection` and
/// whose inbox, positions and letters are PostgreSQL tables.
pub trait ConsumerBuilderPostgresExt: Sized {
    /// A consumer called `name` on PostgreSQL: its inbox key, its
    /// positions, its dead letters and its JetStream durable name.
    fn new(name: impl Into<String>) -> Self;

    /// Checks everything and builds the consumer on `pool`, with its tables
    /// in `schema` (migrated with [`migrate`](crate::migrate)).
    fn build(self, pool: PgPool, schema: SchemaName) -> Result<PgConsumer, BuildErrors>;
}

impl ConsumerBuilderPostgresExt for ConsumerBuilder<PgConnection> {
    fn new(name: impl Into<String>) -> Self {
        ConsumerBuilder::for_connection(name)
    }

    fn build(self, pool: PgPool, schema: SchemaName) -> Result<PgConsumer, BuildErrors> {
        self.build_on(PgConsumerStore::new(pool, schema))
    }
}
