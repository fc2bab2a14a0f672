//! A fresh MariaDB/MySQL database per test, on the server of `MYSQL_URL`
//! (default `mysql://root@127.0.0.1:3306/test`; `scripts/test.sh` starts
//! MariaDB when it is down). Fails loudly when the server cannot be had.

use std::str::FromStr;

use sqlx::MySqlPool;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};

/// The server's URL.
pub fn server_url() -> String {
    std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned())
}

/// A database of its own, with the outbox tables; dropped by
/// [`MySqlTestDb::drop_database`].
pub struct MySqlTestDb {
    /// A pool on the database.
    pub pool: MySqlPool,
    /// Its name.
    pub name: String,
    server: MySqlPool,
}

impl MySqlTestDb {
    /// Creates a database named after a fresh UUID and migrates it.
    pub async fn new() -> MySqlTestDb {
        let url = server_url();
        let options = MySqlConnectOptions::from_str(&url)
            .unwrap_or_else(|e| panic!("MYSQL_URL {url:?} is not a MySQL URL: {e}"));
        let server = MySqlPoolOptions::new()
            .max_connections(2)
            .connect_with(options.clone())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot reach MariaDB/MySQL at {url} ({e}); start it (scripts/test.sh does: \
                     start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd) \
                     or set MYSQL_URL"
                )
            });
        let name = format!("outbox_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE `{name}`")))
            .execute(&server)
            .await
            .unwrap_or_else(|e| panic!("create database {name}: {e}"));
        let pool = MySqlPoolOptions::new()
            .max_connections(10)
            .connect_with(options.database(&name))
            .await
            .unwrap_or_else(|e| panic!("connect to {name}: {e}"));
        outbox_mysql::check_server(&pool)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        outbox_mysql::migrate(&pool)
            .await
            .unwrap_or_else(|e| panic!("migrate {name}: {e}"));
        MySqlTestDb { pool, name, server }
    }

    /// A URL of this database (the server's URL with its name), for
    /// processes and tools that connect by URL.
    pub fn url(&self) -> String {
        let server = server_url();
        let (base, query) = match server.split_once('?') {
            Some((base, query)) => (base.to_owned(), format!("?{query}")),
            None => (server.clone(), String::new()),
        };
        let authority_end = base.find("://").map_or(0, |i| i + 3);
        let base = match base[authority_end..].find('/') {
            Some(slash) => &base[..authority_end + slash],
            None => base.as_str(),
        };
        format!("{base}/{}{query}", self.name)
    }

    /// Events with `status`.
    pub async fn count(&self, status: &str) -> i64 {
        sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events WHERE status = ?")
            .bind(status)
            .fetch_one(&self.pool)
            .await
            .expect("count events")
    }

    /// Drops the database.
    pub async fn drop_database(self) {
        self.pool.close().await;
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "DROP DATABASE `{}`",
            self.name
        )))
        .execute(&self.server)
        .await
        .unwrap_or_else(|e| panic!("drop database {}: {e}", self.name));
    }
}
