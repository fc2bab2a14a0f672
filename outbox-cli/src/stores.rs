//! The stores the tool opens: a PostgreSQL schema, a SQLite file, a MySQL/MariaDB database; each checked for its outbox tables before a command runs.

use std::time::Duration;

use outbox_core::ops::Redaction;
use outbox_core::relay::FailedHeadPolicy;

use crate::args::Command;
use crate::output::Output;
use crate::{EXIT_OK, Outcome};
use crate::{console, store_command};

/// Whether `url` names a SQLite database (`sqlite://file.db`,
/// `sqlite:file.db`, `sqlite::memory:`).
pub(crate) fn is_sqlite_url(url: &str) -> bool {
    url.starts_with("sqlite:")
}

/// The commands on a SQLite outbox: `migrate` creates the file and its
/// tables; every other command needs a migrated file (a mistyped path is
/// an error, not a new empty database). The consumer's commands run on
/// the file's consumer tables as on PostgreSQL.
pub(crate) async fn sqlite(
    url: &str,
    command: Command,
    redaction: Redaction,
    failed_heads: FailedHeadPolicy,
    out: &Output,
) -> Outcome {
    let migrate = matches!(command, Command::Migrate);
    let options = outbox_sqlite::connect_options(url)
        .map_err(|e| format!("not a SQLite database URL: {e}"))?
        .create_if_missing(migrate);
    let file = options.get_filename();
    if !migrate && !file.exists() && !url.contains(":memory:") {
        return Err(format!(
            "no SQLite database at {}: check the path, or create it with `outbox --database-url {url} migrate`",
            file.display()
        ));
    }
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| format!("cannot open the SQLite database {url}: {e}"))?;
    if migrate {
        outbox_sqlite::migrate(&pool)
            .await
            .map_err(|e| e.to_string())?;
        if out.json {
            println!(
                "{}",
                serde_json::json!({ "database": url, "migrated": true, "schema_version": outbox_sqlite::SCHEMA_VERSION })
            );
        } else {
            println!(
                "{url} migrated (schema version {})",
                outbox_sqlite::SCHEMA_VERSION
            );
        }
        return Ok(EXIT_OK);
    }
    let version: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&pool)
        .await
        .map_err(|e| format!("cannot read {url}: {e}"))?;
    if version == 0 {
        return Err(format!(
            "{url} has no outbox tables: run `outbox --database-url {url} migrate` (or the service's migrate) first"
        ));
    }
    if version < outbox_sqlite::SCHEMA_VERSION {
        return Err(format!(
            "{url} has outbox schema version {version}, older than this tool's {}: run `outbox --database-url {url} migrate` (or the service's migrate), which upgrades it in place",
            outbox_sqlite::SCHEMA_VERSION
        ));
    }
    if version > outbox_sqlite::SCHEMA_VERSION {
        return Err(format!(
            "{url} has outbox schema version {version}, newer than this tool's {}: use the tool of the service's release",
            outbox_sqlite::SCHEMA_VERSION
        ));
    }
    let ops = outbox_sqlite::SqliteOps::new(pool)
        .with_redaction(redaction)
        .with_failed_head_policy(failed_heads);
    match command {
        Command::Console(args) => console::serve(ops, args).await,
        command => store_command(&ops, out, command).await,
    }
}

/// Whether `url` names a MySQL or MariaDB database (`mysql://…`,
/// `mariadb://…`).
pub(crate) fn is_mysql_url(url: &str) -> bool {
    url.starts_with("mysql:") || url.starts_with("mariadb:")
}

/// The commands on a MySQL/MariaDB outbox: `migrate` creates the tables;
/// every other command needs them. A server without `SKIP LOCKED` is
/// refused with its version. The consumer's commands run on the
/// database's consumer tables as on PostgreSQL.
pub(crate) async fn mysql(
    url: &str,
    command: Command,
    redaction: Redaction,
    failed_heads: FailedHeadPolicy,
    out: &Output,
) -> Outcome {
    let url = url.replacen("mariadb:", "mysql:", 1);
    let options = <sqlx::mysql::MySqlConnectOptions as std::str::FromStr>::from_str(&url)
        .map_err(|e| format!("not a MySQL database URL: {e}"))?;
    let database = options.get_database().unwrap_or_default().to_owned();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| format!("cannot connect to the database: {e}"))?;
    outbox_mysql::check_server(&pool)
        .await
        .map_err(|e| e.to_string())?;
    if let Command::Migrate = command {
        outbox_mysql::migrate(&pool)
            .await
            .map_err(|e| e.to_string())?;
        if out.json {
            println!(
                "{}",
                serde_json::json!({ "database": database, "migrated": true, "schema_version": outbox_mysql::SCHEMA_VERSION })
            );
        } else {
            println!(
                "database {database} migrated (schema version {})",
                outbox_mysql::SCHEMA_VERSION
            );
        }
        return Ok(EXIT_OK);
    }
    outbox_mysql::check_schema(&pool)
        .await
        .map_err(|e| format!("database {database}: {e}"))?;
    let ops = outbox_mysql::MySqlOps::new(pool)
        .with_redaction(redaction)
        .with_failed_head_policy(failed_heads);
    match command {
        Command::Console(args) => console::serve(ops, args).await,
        command => store_command(&ops, out, command).await,
    }
}
