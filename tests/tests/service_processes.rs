//! The embedded shape (relay, in-process bus and two consumers in one
//! process, `service-process`) killed with SIGKILL again and again while a
//! producer emits, wherever it is (inside a handler's transaction, between
//! a consumer's commit and the relay's mark, in a claim): after the last
//! restart every event is published and each consumer applied each event
//! exactly once, every aggregate in version order, no letter written. On a
//! SQLite file and on a MariaDB/MySQL database: the consumers' inbox,
//! positions and parked messages of both stores survive the kills.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use outbox_mysql::MySqlOutbox;
use outbox_sqlite::SqliteOutbox;
use outbox_tests::events::Ticked;
use outbox_tests::mysql::MySqlTestDb;
use outbox_tests::wait;
use sqlx::{Connection, MySqlPool, SqlitePool};

const COUNTERS: usize = 20;
const VERSIONS: usize = 30;

/// One effect row: consumer, event id, counter, version.
type Effect = (String, String, String, i64);

/// The database the service runs on, as the test sees it.
trait ServiceStore {
    /// The URL the service process opens.
    fn url(&self) -> String;
    /// One tick on every counter, in one transaction.
    async fn emit_round(&self, round: usize);
    /// Rows of a count query.
    async fn count(&self, sql: &str) -> i64;
    /// The effect rows in commit order.
    async fn effects(&self) -> Vec<Effect>;
}

fn tick(counter: usize, round: usize) -> Ticked {
    Ticked {
        counter: format!("c{counter}"),
        tick: round as u64,
        note: "a payload of realistic size for a small domain event".into(),
    }
}

struct Sqlite {
    url: String,
    pool: SqlitePool,
    _dir: tempfile::TempDir,
}

impl Sqlite {
    async fn new() -> Sqlite {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("service.db").display());
        let pool = outbox_sqlite::connect(&url).await.unwrap();
        outbox_sqlite::migrate(&pool).await.unwrap();
        sqlx::query(
            "CREATE TABLE effects (consumer TEXT NOT NULL, event_id TEXT NOT NULL,
                                   counter TEXT NOT NULL, version INTEGER NOT NULL,
                                   seq INTEGER PRIMARY KEY AUTOINCREMENT)",
        )
        .execute(&pool)
        .await
        .unwrap();
        Sqlite {
            url,
            pool,
            _dir: dir,
        }
    }
}

impl ServiceStore for Sqlite {
    fn url(&self) -> String {
        self.url.clone()
    }

    async fn emit_round(&self, round: usize) {
        let outbox = SqliteOutbox::new();
        let mut conn = self.pool.acquire().await.unwrap();
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.unwrap();
        for counter in 0..COUNTERS {
            outbox.emit(&mut tx, &tick(counter, round)).await.unwrap();
        }
        tx.commit().await.unwrap();
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    async fn effects(&self) -> Vec<Effect> {
        sqlx::query_as("SELECT consumer, event_id, counter, version FROM effects ORDER BY seq")
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }
}

struct MySql {
    db: MySqlTestDb,
}

impl MySql {
    async fn new() -> MySql {
        let db = MySqlTestDb::new().await;
        sqlx::query(
            "CREATE TABLE effects (seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                                   consumer VARCHAR(50) NOT NULL, event_id CHAR(36) NOT NULL,
                                   counter VARCHAR(50) NOT NULL, version BIGINT NOT NULL)",
        )
        .execute(&db.pool)
        .await
        .unwrap();
        MySql { db }
    }

    fn pool(&self) -> &MySqlPool {
        &self.db.pool
    }
}

impl ServiceStore for MySql {
    fn url(&self) -> String {
        self.db.url()
    }

    async fn emit_round(&self, round: usize) {
        let outbox = MySqlOutbox::new();
        let mut tx = self.pool().begin().await.unwrap();
        for counter in 0..COUNTERS {
            outbox.emit(&mut tx, &tick(counter, round)).await.unwrap();
        }
        tx.commit().await.unwrap();
    }

    async fn count(&self, sql: &str) -> i64 {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_one(self.pool())
            .await
            .unwrap()
    }

    async fn effects(&self) -> Vec<Effect> {
        sqlx::query_as("SELECT consumer, event_id, counter, version FROM effects ORDER BY seq")
            .fetch_all(self.pool())
            .await
            .unwrap()
    }
}

fn start(url: &str) -> Child {
    Command::new(env!("CARGO_BIN_EXE_service-process"))
        .env("OUTBOX_DATABASE_URL", url)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the service process")
}

fn kill(child: &mut Child) {
    child.kill().expect("SIGKILL the service process");
    child.wait().expect("reap it");
}

/// Half the events first, then five kills (each after more effects were
/// committed) with a round emitted while the service is down, then the
/// rest; every event applied once per consumer, in order.
async fn killed_again_and_again(store: &impl ServiceStore) {
    let url = store.url();
    let total = (COUNTERS * VERSIONS) as i64;
    let applied = "SELECT count(*) FROM effects";
    for round in 0..VERSIONS / 2 {
        store.emit_round(round).await;
    }
    let mut service = start(&url);
    for kill_number in 1..=5i64 {
        let reached = kill_number * total / 8;
        wait::until(
            "the service applies more events",
            Duration::from_secs(60),
            || async { store.count(applied).await >= reached },
        )
        .await;
        kill(&mut service);
        store
            .emit_round(VERSIONS / 2 + kill_number as usize - 1)
            .await;
        service = start(&url);
    }
    for round in VERSIONS / 2 + 5..VERSIONS {
        store.emit_round(round).await;
    }
    wait::until(
        "every event published and applied by both consumers",
        Duration::from_secs(90),
        || async {
            store
                .count("SELECT count(*) FROM outbox_events WHERE status = 'published'")
                .await
                == total
                && store.count(applied).await >= 2 * total
        },
    )
    .await;
    kill(&mut service);
    let mut once: HashMap<(String, String), usize> = HashMap::new();
    let mut order: HashMap<(String, String), Vec<i64>> = HashMap::new();
    for (consumer, event_id, counter, version) in store.effects().await {
        *once.entry((consumer.clone(), event_id)).or_default() += 1;
        order.entry((consumer, counter)).or_default().push(version);
    }
    assert_eq!(once.len() as i64, 2 * total, "every event applied by both");
    assert!(
        once.values().all(|n| *n == 1),
        "an event applied twice: {:?}",
        once.iter().filter(|(_, n)| **n > 1).collect::<Vec<_>>()
    );
    let all: Vec<i64> = (1..=VERSIONS as i64).collect();
    for ((consumer, counter), versions) in &order {
        assert_eq!(versions, &all, "{consumer} {counter}");
    }
    assert_eq!(
        store
            .count("SELECT count(*) FROM outbox_dead_letters")
            .await,
        0,
        "no letter"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_service_on_sqlite_killed_again_and_again_applies_every_event_once_in_order() {
    killed_again_and_again(&Sqlite::new().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_service_on_mysql_killed_again_and_again_applies_every_event_once_in_order() {
    let store = MySql::new().await;
    killed_again_and_again(&store).await;
    store.db.drop_database().await;
}
