//! The store conformance suite (`outbox_tests::store_conformance`) on
//! MariaDB (`outbox-mysql`, `MYSQL_URL`): a fresh database per case.

use outbox_core::relay::FailedHeadPolicy;
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::transport::Transport;
use outbox_mysql::{MySqlOps, MySqlOutbox};
use outbox_tests::events::Ticked;
use outbox_tests::mysql::MySqlTestDb;
use outbox_tests::store_conformance::{self, PayloadAsText, StoreUnderTest};

struct MySql(MySqlTestDb);

impl StoreUnderTest for MySql {
    type Ops = MySqlOps;

    async fn fresh() -> Self {
        MySql(MySqlTestDb::new().await)
    }

    async fn emit(&self, ticks: &[Ticked], commit: bool) {
        let mut tx = self.0.pool.begin().await.expect("begin");
        for tick in ticks {
            MySqlOutbox::new().emit(&mut tx, tick).await.expect("emit");
        }
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
    }

    async fn start_relay<T: Transport>(&self, transport: T, config: RelayConfig) -> Relay {
        outbox_mysql::start_relay(self.0.pool.clone(), transport, config)
            .await
            .expect("start the relay")
    }

    fn ops(&self, failed_heads: FailedHeadPolicy) -> MySqlOps {
        MySqlOps::new(self.0.pool.clone()).with_failed_head_policy(failed_heads)
    }

    async fn published(&self) -> i64 {
        self.0.count("published").await
    }

    async fn clean_up(self) {
        self.0.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_keeps_every_store_promise() {
    store_conformance::run::<MySql>().await;
}

impl PayloadAsText for MySql {
    async fn overwrite_payload(&self, aggregate_id: &str, version: i64, payload: &str) {
        sqlx::query(
            "UPDATE outbox_events SET payload = ? WHERE aggregate_id = ? AND aggregate_version = ?",
        )
        .bind(payload)
        .bind(aggregate_id)
        .bind(version)
        .execute(&self.0.pool)
        .await
        .expect("overwrite a payload");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_fails_an_unreadable_stored_payload_alone() {
    store_conformance::an_unreadable_stored_payload_fails_its_event_not_the_relay::<MySql>().await;
}
