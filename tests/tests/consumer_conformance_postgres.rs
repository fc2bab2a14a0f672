//! The consumer conformance suite (`outbox_tests::consumer_conformance`)
//! on `PgConsumerStore`, a fresh schema per case.

use outbox_postgres::prelude::*;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use outbox_core::consumer::{Consumer, ConsumerBuilder, ConsumerConfig};
use outbox_postgres::PgConsumerStore;
use outbox_tests::TestDb;
use outbox_tests::consumer_conformance::{
    self, ConsumerUnderTest, LetterRow, ending_statement, poisoned,
};
use outbox_tests::events::Ticked;
use sqlx::AssertSqlSafe;

struct Postgres(TestDb);

impl ConsumerUnderTest for Postgres {
    type Store = PgConsumerStore;
    const KEEPS_NUL: bool = false;

    async fn fresh() -> Postgres {
        let db = TestDb::new().await;
        db.execute(
            "CREATE TABLE {s}.effects (consumer text NOT NULL, counter text NOT NULL,
                                       version bigint NOT NULL, seq bigserial PRIMARY KEY)",
        )
        .await;
        Postgres(db)
    }

    fn consumer(
        &self,
        name: &str,
        config: ConsumerConfig,
        failing: Arc<AtomicBool>,
    ) -> Consumer<PgConsumerStore> {
        let insert = format!(
            "INSERT INTO {} (consumer, counter, version) VALUES ($1, $2, $3)",
            self.0.table("effects")
        );
        ConsumerBuilder::new(name)
            .config(config)
            .on_fn::<Ticked, _>(move |tick, tx| {
                let poisoned = poisoned(&failing, &tick);
                let ending = ending_statement(&failing, &tick.event.counter);
                let insert = insert.clone();
                Box::pin(async move {
                    poisoned?;
                    sqlx::query(AssertSqlSafe(insert))
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
            .build(self.0.pool.clone(), self.0.schema.clone())
            .unwrap()
    }

    async fn applied(&self, consumer: &str, counter: &str) -> Vec<i64> {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT version FROM {} WHERE consumer = $1 AND counter = $2 ORDER BY seq",
            self.0.table("effects")
        )))
        .bind(consumer)
        .bind(counter)
        .fetch_all(&self.0.pool)
        .await
        .unwrap()
    }

    async fn letters(&self, consumer: &str) -> Vec<LetterRow> {
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT id, kind, aggregate_version, reason, resolution, headers::text, payload
             FROM {} WHERE consumer_name = $1 ORDER BY id",
            self.0.table("outbox_dead_letters")
        )))
        .bind(consumer)
        .fetch_all(&self.0.pool)
        .await
        .unwrap()
    }

    async fn inbox_rows(&self, consumer: &str) -> i64 {
        sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT count(*) FROM {} WHERE consumer_name = $1",
            self.0.table("outbox_processed_events")
        )))
        .bind(consumer)
        .fetch_one(&self.0.pool)
        .await
        .unwrap()
    }

    async fn finish(self) {
        self.0.drop_schema().await;
    }
}

#[tokio::test]
async fn the_consumer_keeps_its_promises_on_postgres() {
    consumer_conformance::run::<Postgres>().await;
}
