//! Retention's settings and report, shared by the stores: each store
//! deletes published events older than a configured age (and old
//! idempotency keys) in small batches, so the outbox does not grow without
//! bound and no long lock or long transaction holds up the relay
//! (`outbox_postgres::retention`). Pending and failed events are never
//! touched. Progress is counted (`outbox_retention_deleted_total`) and
//! returned as a [`RetentionReport`].

use std::time::Duration;

use crate::store::ConfigError;

/// The most rows one retention or cleanup statement deletes.
pub const MAX_DELETE_BATCH: i64 = 100_000;

/// `batch` taken within `1..=`[`MAX_DELETE_BATCH`]: every store's purge and
/// cleanup deletes with it, so a batch of 0 cannot keep a loop that waits
/// for a short batch going for ever, and a negative one (SQLite's "no
/// limit") cannot delete everything in one statement.
pub fn delete_batch(batch: i64) -> i64 {
    batch.clamp(1, MAX_DELETE_BATCH)
}

/// Retention settings.
#[derive(Debug, Clone)]
pub struct RetentionConfig {
    /// Keep published events this long (default 7 days): long enough to
    /// investigate the failure windows the contract covers.
    pub keep_published: Duration,
    /// Keep idempotency keys this long (default 7 days): the longest a
    /// client may retry a command.
    pub keep_idempotency_keys: Duration,
    /// Rows per delete statement (default 1000).
    pub batch_size: i64,
    /// Pause between two delete batches (default 50 ms), to leave room for
    /// the relay and for autovacuum.
    pub pause: Duration,
    /// Time between two runs of the background task (default 5 minutes).
    pub interval: Duration,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            keep_published: Duration::from_secs(7 * 24 * 3600),
            keep_idempotency_keys: Duration::from_secs(7 * 24 * 3600),
            batch_size: 1000,
            pause: Duration::from_millis(50),
            interval: Duration::from_secs(300),
        }
    }
}

impl RetentionConfig {
    /// Checks the settings: a batch size within 1..=100000 and an interval
    /// above zero.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if delete_batch(self.batch_size) != self.batch_size {
            return Err(ConfigError::InvalidValue {
                what: "retention batch_size",
                reason: format!("{} is outside 1..={MAX_DELETE_BATCH}", self.batch_size),
            });
        }
        if self.interval.is_zero() {
            return Err(ConfigError::InvalidValue {
                what: "retention interval",
                reason: "must be above zero".into(),
            });
        }
        Ok(())
    }
}

/// What one retention run deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionReport {
    /// Published events deleted.
    pub events: u64,
    /// Idempotency keys deleted.
    pub keys: u64,
    /// Delete statements issued.
    pub batches: u32,
}
