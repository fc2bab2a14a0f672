//! The store conformance suite (`outbox_tests::store_conformance`) on
//! SQLite (`outbox-sqlite`): a fresh database file per case.

use outbox_core::relay::FailedHeadPolicy;
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::transport::Transport;
use outbox_sqlite::{SqliteOps, SqliteOutbox};
use outbox_tests::events::Ticked;
use outbox_tests::store_conformance::{self, PayloadAsText, StoreUnderTest};
use sqlx::SqlitePool;

struct Sqlite {
    pool: SqlitePool,
    _dir: tempfile::TempDir,
}

impl StoreUnderTest for Sqlite {
    type Ops = SqliteOps;

    async fn fresh() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
        let pool = outbox_sqlite::connect(&url).await.expect("open the file");
        outbox_sqlite::migrate(&pool).await.expect("migrate");
        Sqlite { pool, _dir: dir }
    }

    async fn emit(&self, ticks: &[Ticked], commit: bool) {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .expect("begin");
        for tick in ticks {
            SqliteOutbox::new().emit(&mut tx, tick).await.expect("emit");
        }
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
    }

    async fn start_relay<T: Transport>(&self, transport: T, config: RelayConfig) -> Relay {
        outbox_sqlite::start_relay(self.pool.clone(), transport, config)
            .await
            .expect("start the relay")
    }

    fn ops(&self, failed_heads: FailedHeadPolicy) -> SqliteOps {
        SqliteOps::new(self.pool.clone()).with_failed_head_policy(failed_heads)
    }

    async fn published(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE status = 'published'")
            .fetch_one(&self.pool)
            .await
            .expect("count published events")
    }

    async fn clean_up(self) {
        self.pool.close().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_keeps_every_store_promise() {
    store_conformance::run::<Sqlite>().await;
}

impl PayloadAsText for Sqlite {
    async fn overwrite_payload(&self, aggregate_id: &str, version: i64, payload: &str) {
        sqlx::query(
            "UPDATE outbox_events SET payload = ?1 WHERE aggregate_id = ?2 AND aggregate_version = ?3",
        )
        .bind(payload)
        .bind(aggregate_id)
        .bind(version)
        .execute(&self.pool)
        .await
        .expect("overwrite a payload");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_fails_an_unreadable_stored_payload_alone() {
    store_conformance::an_unreadable_stored_payload_fails_its_event_not_the_relay::<Sqlite>().await;
}
