//! Retention for the PostgreSQL outbox: published events and idempotency
//! keys past their age are deleted in small batches, by hand
//! ([`run_once`]) or by a background task ([`Retention`]).

use std::time::Duration;

use outbox_core::metrics as m;
use outbox_core::relay::retention::{RetentionConfig, RetentionReport, delete_batch};
use outbox_core::relay::{DrainTimeout, StoreError};
use outbox_core::store::ConfigError;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::PgRelayStore;

/// Deletes everything due, batch by batch, until a batch comes back short.
/// A `batch_size` outside `1..=100000` (what [`RetentionConfig::validate`]
/// refuses) is taken as the nearer bound, so a run always ends.
pub async fn run_once(
    store: &PgRelayStore,
    config: &RetentionConfig,
    label: &str,
) -> Result<RetentionReport, StoreError> {
    let batch_size = delete_batch(config.batch_size);
    let mut report = RetentionReport::default();
    loop {
        let deleted = store
            .purge_published(config.keep_published, batch_size)
            .await?;
        report.events += deleted;
        report.batches += 1;
        metrics::counter!(m::RETENTION_DELETED, "schema" => label.to_owned()).increment(deleted);
        if (deleted as i64) < batch_size {
            break;
        }
        tracing::debug!(deleted = report.events, "retention progress");
        tokio::time::sleep(config.pause).await;
    }
    loop {
        let deleted = store
            .purge_idempotency_keys(config.keep_idempotency_keys, batch_size)
            .await?;
        report.keys += deleted;
        report.batches += 1;
        metrics::counter!(m::RETENTION_KEYS_DELETED, "schema" => label.to_owned())
            .increment(deleted);
        if (deleted as i64) < batch_size {
            break;
        }
        tokio::time::sleep(config.pause).await;
    }
    Ok(report)
}

/// Retention as an owned background task.
pub struct Retention {
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

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
    pub async fn drain(mut self, timeout: Duration) -> Result<(), DrainTimeout> {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(timeout, task).await.is_err() {
                abort.abort();
                return Err(DrainTimeout(timeout));
            }
        }
        Ok(())
    }
}

impl Drop for Retention {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}
