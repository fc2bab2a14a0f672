//! Opening a pool on a server that can run the outbox: MySQL ≥ 8.0.1 or
//! MariaDB ≥ 10.6, the first releases with `FOR UPDATE SKIP LOCKED`, which
//! the relay's claim needs. An older server is refused at start with its
//! version in the error, not at the first claim.

use std::str::FromStr;

use sqlx::MySqlPool;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};

/// The server cannot run the outbox, or cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The server is older than the first release with `SKIP LOCKED`.
    #[error(
        "{server} {version} is too old for the outbox: it needs MySQL 8.0.1 or MariaDB 10.6 (FOR UPDATE SKIP LOCKED)"
    )]
    TooOld {
        /// `MySQL` or `MariaDB`.
        server: &'static str,
        /// What `SELECT VERSION()` said.
        version: String,
    },
    /// The server writes a statement-based binary log, which refuses
    /// writes in the READ COMMITTED transactions the relay and the
    /// consumer run (MySQL: "Transaction level 'READ-COMMITTED' in InnoDB
    /// is not safe for binlog mode 'STATEMENT'").
    #[error(
        "the server logs statements (binlog_format = STATEMENT): the outbox's READ COMMITTED transactions need binlog_format ROW or MIXED (the default of MySQL 8 and MariaDB)"
    )]
    StatementBinlog,
    /// The version string could not be read.
    #[error("cannot read the server version {0:?}")]
    UnknownVersion(String),
    /// The database failed.
    #[error(transparent)]
    Database(#[from] sqlx::Error),
}

/// What the server said it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerVersion {
    /// MariaDB (true) or MySQL (false).
    pub mariadb: bool,
    /// Major, minor, patch.
    pub version: (u32, u32, u32),
}

impl ServerVersion {
    /// Reads `SELECT VERSION()` output (`8.0.36`, `10.11.6-MariaDB-0+deb12u1`).
    pub fn parse(text: &str) -> Result<ServerVersion, ConnectError> {
        let unknown = || ConnectError::UnknownVersion(text.to_owned());
        let numbers = text.split(['-', '+']).next().ok_or_else(unknown)?;
        let mut parts = numbers.split('.').map(|p| p.parse::<u32>());
        let mut next = || parts.next().unwrap_or(Ok(0)).map_err(|_| unknown());
        let version = (next()?, next()?, next()?);
        Ok(ServerVersion {
            mariadb: text.to_ascii_lowercase().contains("mariadb"),
            version,
        })
    }

    /// Whether it has `FOR UPDATE SKIP LOCKED`.
    pub fn has_skip_locked(&self) -> bool {
        if self.mariadb {
            self.version >= (10, 6, 0)
        } else {
            self.version >= (8, 0, 1)
        }
    }
}

/// Whether a server with binary logging `log_bin` in `format` refuses
/// writes in READ COMMITTED transactions.
fn statement_binlog(log_bin: bool, format: &str) -> bool {
    log_bin && format.eq_ignore_ascii_case("STATEMENT")
}

/// Reads the server's version and refuses one without `SKIP LOCKED`, or
/// one whose statement-based binary log refuses READ COMMITTED writes.
pub async fn check_server(pool: &MySqlPool) -> Result<ServerVersion, ConnectError> {
    let (text, log_bin, format): (String, i64, String) = sqlx::query_as(
        "SELECT CAST(VERSION() AS CHAR), CAST(@@log_bin AS SIGNED), CAST(@@binlog_format AS CHAR)",
    )
    .fetch_one(pool)
    .await?;
    let version = ServerVersion::parse(&text)?;
    if !version.has_skip_locked() {
        return Err(ConnectError::TooOld {
            server: if version.mariadb { "MariaDB" } else { "MySQL" },
            version: text,
        });
    }
    if statement_binlog(log_bin != 0, &format) {
        return Err(ConnectError::StatementBinlog);
    }
    Ok(version)
}

/// A pool over `url` (`mysql://user:password@host:3306/database`), ten
/// connections at most, checked with [`check_server`].
pub async fn connect(url: &str) -> Result<MySqlPool, ConnectError> {
    let options = MySqlConnectOptions::from_str(url)?;
    let pool = MySqlPoolOptions::new()
        .max_connections(10)
        .connect_with(options)
        .await?;
    check_server(&pool).await?;
    Ok(pool)
}

#[cfg(test)]
mod tests {
    use super::{ServerVersion, statement_binlog};

    #[test]
    fn only_a_statement_binlog_is_refused() {
        assert!(statement_binlog(true, "STATEMENT"));
        assert!(statement_binlog(true, "statement"));
        assert!(!statement_binlog(false, "STATEMENT"));
        assert!(!statement_binlog(true, "ROW"));
        assert!(!statement_binlog(true, "MIXED"));
    }

    #[test]
    fn versions_with_and_without_skip_locked() {
        let cases = [
            ("10.11.19-MariaDB-0+deb12u1", true, (10, 11, 19), true),
            ("10.5.23-MariaDB", true, (10, 5, 23), false),
            ("10.6.0-MariaDB-log", true, (10, 6, 0), true),
            ("8.0.36", false, (8, 0, 36), true),
            ("8.0.0-dmr", false, (8, 0, 0), false),
            ("5.7.44-log", false, (5, 7, 44), false),
            ("9.1.0", false, (9, 1, 0), true),
        ];
        for (text, mariadb, version, skip_locked) in cases {
            let parsed = ServerVersion::parse(text).unwrap();
            assert_eq!(
                (parsed.mariadb, parsed.version),
                (mariadb, version),
                "{text}"
            );
            assert_eq!(parsed.has_skip_locked(), skip_locked, "{text}");
        }
        assert!(ServerVersion::parse("not a version").is_err());
    }
}
