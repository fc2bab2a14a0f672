//! A fresh schema per test in the `outbox_tests` database.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use outbox_postgres::Outbox;
use outbox_postgres::SchemaName;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{AssertSqlSafe, Connection, Executor, PgConnection, PgPool};

const DATABASE: &str = "outbox_tests";

/// The server URL tests use: `DATABASE_URL` or the local default.
pub fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// The URL of the test database (`DATABASE_URL` with the database
/// replaced), for tools run as a process.
pub fn test_database_url() -> String {
    let url = server_url();
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base.to_owned(), format!("?{query}")),
        None => (url.clone(), String::new()),
    };
    let authority_start = base.find("://").map_or(0, |at| at + 3);
    let host_end = base[authority_start..]
        .find('/')
        .map_or(base.len(), |at| authority_start + at);
    format!("{}/{DATABASE}{query}", &base[..host_end])
}

/// Connect options for the test database.
pub fn test_database_options() -> PgConnectOptions {
    let options: PgConnectOptions = server_url()
        .parse()
        .unwrap_or_else(|e| panic!("DATABASE_URL is not a PostgreSQL URL: {e}"));
    options.database(DATABASE)
}

async fn ensure_database(server_url: &str) {
    let options: PgConnectOptions = server_url.parse().expect("a PostgreSQL URL");
    let mut conn = PgConnection::connect_with(&options).await.unwrap_or_else(|e| {
        panic!(
            "PostgreSQL is not reachable at {server_url} ({e}); start it (scripts/services.sh does) before running the tests"
        )
    });
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(DATABASE)
            .fetch_one(&mut conn)
            .await
            .expect("query pg_database");
    if !exists
        && let Err(error) = conn
            .execute(AssertSqlSafe(format!("CREATE DATABASE {DATABASE}")))
            .await
    {
        let code = error
            .as_database_error()
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        // Another test binary created it at the same moment.
        if !matches!(code.as_deref(), Some("42P04" | "23505")) {
            panic!("cannot create database {DATABASE}: {error}");
        }
    }
    let _ = conn.close().await;
}

/// A schema name no other test uses.
fn unique_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let stamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis();
    format!(
        "t{}_{}_{}",
        stamp,
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A schema of its own, with the outbox migrated into it.
pub struct TestDb {
    /// A pool on the test database.
    pub pool: PgPool,
    /// The schema (outbox tables and the test's business tables).
    pub schema: SchemaName,
    /// The outbox of that schema.
    pub outbox: Outbox,
}

impl TestDb {
    /// Creates a new schema, migrates the outbox into it, and creates a
    /// business table `<schema>.orders (id uuid primary key, customer
    /// text, total_cents bigint)`.
    pub async fn new() -> TestDb {
        TestDb::with_pool_size(8).await
    }

    /// As [`TestDb::new`] with a pool of `size` connections.
    pub async fn with_pool_size(size: u32) -> TestDb {
        TestDb::create(unique_name(), size).await
    }

    /// As [`TestDb::new`] on another server (`server_url`, e.g. a
    /// [`PgCluster`](crate::pgcluster::PgCluster)'s), in its
    /// `outbox_tests` database: processes that get `DATABASE_URL =
    /// server_url` find it with [`test_database_options`].
    pub async fn on_server(server_url: &str, size: u32) -> TestDb {
        let options: PgConnectOptions = server_url.parse().expect("a PostgreSQL URL");
        TestDb::create_on(server_url, options.database(DATABASE), unique_name(), size).await
    }

    /// As [`TestDb::new`] in a schema whose name is `length` bytes long
    /// (unique, padded with `x`): for limits that depend on the name.
    pub async fn with_schema_name_length(length: usize) -> TestDb {
        let mut name = unique_name();
        assert!(
            length >= name.len(),
            "a unique name needs {} bytes",
            name.len()
        );
        name.push_str(&"x".repeat(length - name.len()));
        TestDb::create(name, 8).await
    }

    async fn create(name: String, size: u32) -> TestDb {
        TestDb::create_on(&server_url(), test_database_options(), name, size).await
    }

    async fn create_on(
        server_url: &str,
        options: PgConnectOptions,
        name: String,
        size: u32,
    ) -> TestDb {
        ensure_database(server_url).await;
        let schema = SchemaName::new(name).expect("valid test schema name");
        let pool = PgPoolOptions::new()
            .max_connections(size)
            .connect_with(options)
            .await
            .unwrap_or_else(|e| panic!("cannot connect to the test database: {e}"));
        let outbox = Outbox::new(schema.clone());
        outbox.migrate(&pool).await.expect("migrate the outbox");
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {}.orders (id uuid PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL)",
            schema.quoted()
        )))
        .execute(&pool)
        .await
        .expect("create the business table");
        TestDb {
            pool,
            schema,
            outbox,
        }
    }

    /// `<schema>.<table>`, quoted schema, for SQL in tests.
    pub fn table(&self, table: &str) -> String {
        format!("{}.{table}", self.schema.quoted())
    }

    /// Runs a scalar query with `{s}` replaced by the quoted schema.
    pub async fn scalar<T>(&self, sql: &str) -> T
    where
        T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
    {
        sqlx::query_scalar(AssertSqlSafe(sql.replace("{s}", &self.schema.quoted())))
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    /// Executes a statement with `{s}` replaced by the quoted schema.
    pub async fn execute(&self, sql: &str) {
        sqlx::query(AssertSqlSafe(sql.replace("{s}", &self.schema.quoted())))
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// How many outbox events are in the published state.
    pub async fn published(&self) -> i64 {
        self.scalar("SELECT count(*) FROM {s}.outbox_events WHERE status = 'published'")
            .await
    }

    /// Drops the schema (call at the end of a passing test; a failing test
    /// leaves it for inspection).
    pub async fn drop_schema(self) {
        let _ = sqlx::query(AssertSqlSafe(format!(
            "DROP SCHEMA {} CASCADE",
            self.schema.quoted()
        )))
        .execute(&self.pool)
        .await;
        // Dropping the pool (not `close().await`, which waits for every
        // connection, a listener's included) lets connections go as they
        // are returned.
    }
}
