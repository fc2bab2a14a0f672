//! Retention: deletes published events older than a configured age (and
//! old idempotency keys) in small batches, so the outbox does not grow
//! without bound and no long lock or long transaction holds up the relay.
//! Pending and failed events are never touched. Progress is counted
//! (`outbox_retention_deleted_total`) and returned.

use std::time::Duration;

#[cfg(feature = "postgres")]
use tokio::sync::watch;
#[cfg(feature = "postgres")]
use tokio::task::JoinHandle;

#[cfg(feature = "postgres")]
use super::store::StoreError;
#[cfg(feature = "postgres")]
use crate::metrics as m;
#[cfg(feature = "postgres")]
use crate::store::{ConfigError, PgRelayStore};

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
    #[cfg(feature = "postgres")]
    fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=100_000).contains(&self.batch_size) {
            return Err(ConfigError::InvalidValue {
                what: "retention batch_size",
                reason: format!("{} is outside 1..=100000", self.batch_size),
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

/// Deletes everything due, batch by batch, until a batch comes back short.
#[cfg(feature = "postgres")]
pub async fn run_once(
    store: &PgRelayStore,
    config: &RetentionConfig,
    label: &str,
) -> Result<RetentionReport, StoreError> {
    let mut report = RetentionReport::default();
    loop {
        let deleted = store
            .purge_published(config.keep_published, config.batch_size)
            .await?;
        report.events += deleted;
        report.batches += 1;
        metrics::counter!(m::RETENTION_DELETED, "schema" => label.to_owned()).increment(deleted);
        if (deleted as i64) < config.batch_size {
            break;
        }
        tracing::debug!(deleted = report.events, "retention progress");
        tokio::time::sleep(config.pause).await;
    }
    loop {
        let deleted = store
            .purge_idempotency_keys(config.keep_idempotency_keys, config.batch_size)
            .await?;
        report.keys += deleted;
        report.batches += 1;
        metrics::counter!(m::RETENTION_KEYS_DELETED, "schema" => label.to_owned())
            .increment(deleted);
        if (deleted as i64) < config.batch_size {
            break;
        }
        tokio::time::sleep(config.pause).await;
    }
    Ok(report)
}

/// Retention as an owned background task.
#[cfg(feature = "postgres")]
pub struct Retention {
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

#[cfg(feature = "postgres")]
impl Retention {
    /// Starts the periodic task.
    pub fn start(
        store: PgRelayStore,
        config: RetentionConfig,
        label: &str,
    ) -> Result<Retention, ConfigError> {
        config.validate()?;
        let (shutdown, mut receiver) = watch::channel(false);
        let label = label.to_owned();
        let task = tokio::spawn(async move {
            while !*receiver.borrow() {
                match run_once(&store, &config, &label).await {
                    Ok(report) if report.events + report.keys > 0 => {
                        tracing::info!(
                            events = report.events,
                            keys = report.keys,
                            "retention deleted old rows"
                        )
                    }
                    Ok(_) => {}
                    Err(error) => tracing::warn!(%error, "retention run failed"),
                }
                tokio::select! {
                    _ = tokio::time::sleep(config.interval) => {}
                    _ = receiver.changed() => {}
                }
            }
        });
        Ok(Retention {
            shutdown,
            task: Some(task),
        })
    }

    /// Stops after the current batch and waits up to `timeout`.
    pub async fn drain(mut self, timeout: Duration) -> Result<(), super::DrainTimeout> {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(timeout, task).await.is_err() {
                abort.abort();
                return Err(super::DrainTimeout(timeout));
            }
        }
        Ok(())
    }
}

#[cfg(feature = "postgres")]
impl Drop for Retention {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
