//! The consumer conformance suite (`outbox_tests::consumer_conformance`)
//! on `MySqlConsumerStore`, a fresh MariaDB database per case (the server
//! of `MYSQL_URL`; `scripts/test.sh` starts MariaDB).

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use outbox_core::consumer::{Consumer, ConsumerBuilder, ConsumerConfig};
use outbox_mysql::MySqlConsumerStore;
use outbox_tests::consumer_conformance::{
    self, ConsumerUnderTest, LetterRow, ending_statement, poisoned,
};
use outbox_tests::events::Ticked;
use outbox_tests::mysql::MySqlTestDb;
use sqlx::MySqlConnection;

struct MariaDb {
    db: MySqlTestDb,
}

impl ConsumerUnderTest for MariaDb {
    type Store = MySqlConsumerStore;
    const KEEPS_NUL: bool = true;

    async fn fresh() -> MariaDb {
        let db = MySqlTestDb::new().await;
        sqlx::query(
            "CREATE TABLE effects (
                seq      BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                consumer VARCHAR(200) NOT NULL,
                counter  VARCHAR(500) NOT NULL,
                version  BIGINT NOT NULL
            ) ENGINE = InnoDB",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        MariaDb { db }
    }

    fn consumer(
        &self,
        name: &str,
        config: ConsumerConfig,
        failing: Arc<AtomicBool>,
    ) -> Consumer<MySqlConsumerStore> {
        ConsumerBuilder::<MySqlConnection>::for_connection(name)
            .config(config)
            .on_fn::<Ticked, _>(move |tick, tx| {
                let poisoned = poisoned(&failing, &tick);
                let ending = ending_statement(&failing, &tick.event.counter);
                Box::pin(async move {
                    poisoned?;
                    sqlx::query(
                        "INSERT INTO effects (consumer, counter, version) VALUES (?, ?, ?)",
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
            .build_on(MySqlConsumerStore::new(self.db.pool.clone()))
            .unwrap()
    }

    async fn applied(&self, consumer: &str, counter: &str) -> Vec<i64> {
        sqlx::query_scalar(
            "SELECT version FROM effects WHERE consumer = ? AND counter = ? ORDER BY seq",
        )
        .bind(consumer)
        .bind(counter)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    async fn letters(&self, consumer: &str) -> Vec<LetterRow> {
        sqlx::query_as(
            "SELECT id, kind, aggregate_version, reason, resolution, headers, payload
             FROM outbox_dead_letters WHERE consumer_name = ? ORDER BY id",
        )
        .bind(consumer)
        .fetch_all(&self.db.pool)
        .await
        .unwrap()
    }

    async fn inbox_rows(&self, consumer: &str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM outbox_processed_events WHERE consumer_name = ?")
            .bind(consumer)
            .fetch_one(&self.db.pool)
            .await
            .unwrap()
    }

    async fn finish(self) {
        self.db.drop_database().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consumer_keeps_its_promises_on_mariadb() {
    consumer_conformance::run::<MariaDb>().await;
}

/// An aggregate id longer than the MySQL consumer's column (500
/// characters; PostgreSQL producers have no such limit) is quarantined
/// with the message's attributes and payload, at the first delivery, and
/// the next message goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aggregate_id_too_long_for_mysql_is_quarantined_not_retried() {
    use outbox_core::consumer::Outcome;
    use outbox_tests::consumers::tick;
    let db = MariaDb::fresh().await;
    let consumer = db.consumer("long", ConsumerConfig::default(), Arc::default());
    let long = "x".repeat(501);
    let outcome = consumer.handle_envelope(&tick(&long, 1)).await.unwrap();
    match &outcome {
        Outcome::Quarantined { reason } => assert!(
            reason.contains("aggregate id has 501 characters") && reason.contains("at most 500"),
            "{reason}"
        ),
        other => panic!("expected a quarantine, got {other:?}"),
    }
    let letters = db.letters("long").await;
    assert_eq!(letters.len(), 1);
    assert!(letters[0].5.contains(&long), "the attributes are kept");
    assert_eq!(
        consumer
            .handle_envelope(&tick(&"y".repeat(500), 1))
            .await
            .unwrap(),
        Outcome::Applied,
        "500 characters fit"
    );
    db.finish().await;
}
