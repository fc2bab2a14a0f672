//! What the SQLite store's tests share: a fresh database file per test,
//! two contracts, and a transport that records what it was given.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::transport::{PublishFailure, Transport};
use outbox_core::{Envelope, OutboxEvent};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;

/// A note on a board; versions from the store's counter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "board.noted", aggregate = "board", version = 1)]
pub struct Noted {
    #[outbox(aggregate_id)]
    pub board: String,
    pub text: String,
}

impl Noted {
    pub fn new(board: impl Into<String>, text: impl Into<String>) -> Noted {
        Noted {
            board: board.into(),
            text: text.into(),
        }
    }
}

/// A move of a piece whose row carries its own version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "piece.moved", aggregate = "piece", version = 1)]
pub struct Moved {
    #[outbox(aggregate_id)]
    pub piece: String,
    #[outbox(aggregate_version)]
    pub version: i64,
}

/// A database file of its own, migrated; removed with the value.
pub struct TestDb {
    pub pool: SqlitePool,
    pub url: String,
    _dir: tempfile::TempDir,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = format!("sqlite://{}", dir.path().join("outbox.db").display());
        let pool = outbox_sqlite::connect(&url)
            .await
            .expect("open the database");
        outbox_sqlite::migrate(&pool).await.expect("migrate");
        TestDb {
            pool,
            url,
            _dir: dir,
        }
    }

    /// A second pool on the same file (another relay's connections).
    pub async fn another_pool(&self) -> SqlitePool {
        outbox_sqlite::connect(&self.url).await.expect("open again")
    }

    pub async fn count(&self, status: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE status = ?1")
            .bind(status)
            .fetch_one(&self.pool)
            .await
            .expect("count events")
    }

    /// `(status, attempt_count)` of an aggregate's version.
    pub async fn state(&self, aggregate_id: &str, version: i64) -> (String, i64) {
        sqlx::query_as(
            "SELECT status, attempt_count FROM outbox_events
             WHERE aggregate_id = ?1 AND aggregate_version = ?2",
        )
        .bind(aggregate_id)
        .bind(version)
        .fetch_one(&self.pool)
        .await
        .expect("event state")
    }
}

/// Records `(aggregate id, version)` of every event it is given; fails the
/// events `fail` picks with a retryable error.
#[derive(Clone)]
pub struct Recording {
    pub published: Arc<Mutex<Vec<(String, i64)>>>,
    fail: Arc<dyn Fn(&Envelope) -> bool + Send + Sync>,
    delay: Duration,
}

impl Recording {
    pub fn new() -> Recording {
        Recording::failing(|_| false)
    }

    pub fn failing(fail: impl Fn(&Envelope) -> bool + Send + Sync + 'static) -> Recording {
        Recording {
            published: Arc::default(),
            fail: Arc::new(fail),
            delay: Duration::ZERO,
        }
    }

    /// Takes `delay` per publish call, as a broker's round trip does (so
    /// claims of several workers overlap).
    pub fn slow(delay: Duration) -> Recording {
        Recording {
            delay,
            ..Recording::new()
        }
    }

    pub fn versions_of(&self, aggregate_id: &str) -> Vec<i64> {
        self.published
            .lock()
            .unwrap()
            .iter()
            .filter(|(id, _)| id == aggregate_id)
            .map(|(_, version)| *version)
            .collect()
    }

    pub fn len(&self) -> usize {
        self.published.lock().unwrap().len()
    }
}

impl Transport for Recording {
    async fn publish(&self, events: &[&Envelope]) -> Vec<Result<(), PublishFailure>> {
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let mut published = self.published.lock().unwrap();
        events
            .iter()
            .map(|event| {
                if (self.fail)(event) {
                    return Err(PublishFailure::retryable("the broker refused it"));
                }
                published.push((event.aggregate_id.clone(), event.aggregate_version));
                Ok(())
            })
            .collect()
    }

    fn name(&self) -> &'static str {
        "recording"
    }
}

/// Waits up to `timeout` for `condition`; panics with `what` otherwise.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !condition().await {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
