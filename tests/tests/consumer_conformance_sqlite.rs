//! The consumer conformance suite (`outbox_tests::consumer_conformance`)
//! on `SqliteConsumerStore`, a fresh file per case.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use outbox_core::consumer::{Consumer, ConsumerBuilder, ConsumerConfig};
use outbox_sqlite::SqliteConsumerStore;
use outbox_tests::consumer_conformance::{
    self, ConsumerUnderTest, LetterRow, ending_statement, poisoned,
};
use outbox_tests::events::Ticked;
use sqlx::{SqliteConnection, SqlitePool};

struct Sqlite {
    pool: SqlitePool,
    _dir: tempfile::TempDir,
}

impl ConsumerUnderTest for Sqlite {
    type Store = SqliteConsumerStore;
    const KEEPS_NUL: bool = true;

    async fn fresh() -> Sqlite {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("consumer.db").display());
        let pool = outbox_sqlite::connect(&url).await.unwrap();
        outbox_sqlite::migrate(&pool).await.unwrap();
        sqlx::query(
            "CREATE TABLE effects (consumer TEXT NOT NULL, counter TEXT NOT NULL,
                                   version INTEGER NOT NULL, seq INTEGER PRIMARY KEY AUTOINCREMENT)",
        )
        .execute(&pool)
        .await
        .unwrap();
        Sqlite { pool, _dir: dir }
    }

    fn consumer(
        &self,
        name: &str,
        config: ConsumerConfig,
        failing: Arc<AtomicBool>,
    ) -> Consumer<SqliteConsumerStore> {
        ConsumerBuilder::<SqliteConnection>::for_connection(name)
            .config(config)
            .on_fn::<Ticked, _>(move |tick, tx| {
                let poisoned = poisoned(&failing, &tick);
                let ending = ending_statement(&failing, &tick.event.counter);
                Box::pin(async move {
                    poisoned?;
                    sqlx::query(
                        "INSERT INTO effects (consumer, counter, version) VALUES (?1, ?2, ?3)",
                    )
                    .bind(tick.meta.consumer.to_string())
                    .bind(&tick.event.counter)
                    .bind(tick.meta.aggregate_version)
                    .execute(&mut *tx)
                    .await?;
                    if let Some(statement) = ending {
                        sqlx::raw_sql(statement).execute(&mut *tx).await?;
                    }
                    Ok(())
                })
            })
            .build_on(SqliteConsumerStore::new(self.pool.clone()))
            .unwrap()
    }

    async fn applied(&self, consumer: &str, counter: &str) -> Vec<i64> {
        sqlx::query_scalar(
            "SELECT version FROM effects WHERE consumer = ?1 AND counter = ?2 ORDER BY seq",
        )
        .bind(consumer)
        .bind(counter)
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    async fn letters(&self, consumer: &str) -> Vec<LetterRow> {
        sqlx::query_as(
            "SELECT id, kind, aggregate_version, reason, resolution, headers, payload
             FROM outbox_dead_letters WHERE consumer_name = ?1 ORDER BY id",
        )
        .bind(consumer)
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    async fn inbox_rows(&self, consumer: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_processed_events WHERE consumer_name = ?1")
            .bind(consumer)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn finish(self) {
        self.pool.close().await;
    }
}

#[tokio::test]
async fn the_consumer_keeps_its_promises_on_sqlite() {
    consumer_conformance::run::<Sqlite>().await;
}
