//! The store conformance suite (`outbox_tests::store_conformance`) on
//! PostgreSQL: a fresh schema per case.

use outbox_core::relay::FailedHeadPolicy;
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::transport::Transport;
use outbox_postgres::Ops;
use outbox_postgres::prelude::*;
use outbox_tests::TestDb;
use outbox_tests::events::Ticked;
use outbox_tests::store_conformance::{self, StoreUnderTest};

struct Postgres(TestDb);

impl StoreUnderTest for Postgres {
    type Ops = Ops;

    async fn fresh() -> Self {
        Postgres(TestDb::new().await)
    }

    async fn emit(&self, ticks: &[Ticked], commit: bool) {
        let mut tx = self.0.pool.begin().await.expect("begin");
        for tick in ticks {
            self.0.outbox.emit(&mut tx, tick).await.expect("emit");
        }
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
    }

    async fn start_relay<T: Transport>(&self, transport: T, config: RelayConfig) -> Relay {
        Relay::start_postgres(
            self.0.pool.clone(),
            self.0.schema.clone(),
            transport,
            config,
        )
        .await
        .expect("start the relay")
    }

    fn ops(&self, failed_heads: FailedHeadPolicy) -> Ops {
        Ops::new(self.0.pool.clone(), self.0.schema.clone()).with_failed_head_policy(failed_heads)
    }

    async fn published(&self) -> i64 {
        self.0.published().await
    }

    async fn clean_up(self) {
        self.0.drop_schema().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_every_store_promise() {
    store_conformance::run::<Postgres>().await;
}
