//! The relay: publishes committed outbox events at least once, keeps each
//! aggregate's events in version order across any number of workers and
//! processes, backs off and finally parks events that keep failing, and
//! shows the backlog.
//!
//! The loop knows two seams only: a [`RelayStore`] (PostgreSQL:
//! `outbox_postgres::PgRelayStore`) and a [`Transport`]. Workers are owned
//! tasks: [`Relay::stop`] asks them to finish their batch, [`Relay::drain`]
//! waits for them with a deadline; dropping the handle aborts them.

pub mod config;
pub use crate::failpoint;
mod claim_size;
mod fence;
mod health;
pub mod retention;
pub mod store;
mod waves;
mod worker;

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use uuid::Uuid;

pub use config::{Backoff, FailedHeadPolicy, LONGEST_SETTING, RelayConfig};
pub use fence::fencing_token;
pub use health::RelayHealth;
pub use store::{
    BatchOutcome, BlockedAggregate, ClaimedBatch, ClaimedEvent, EventTypeStats, FailedAttempt,
    OutboxStats, RelayStore, StoreError, WakeupListener,
};

use crate::store::ConfigError;
use crate::transport::Transport;
use worker::Shared;

/// The relay did not stop within the drain deadline; its tasks were
/// aborted (their claims roll back and are published again later).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the relay did not stop within {0:?}; its workers were aborted")]
pub struct DrainTimeout(pub Duration);

/// A running relay.
pub struct Relay {
    id: Uuid,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    health: Arc<health::HealthState>,
}

impl Relay {
    /// Starts a relay over any store. Validates `config` first: a bad
    /// setting is an error here, not a misbehaving loop later.
    pub async fn start<S: RelayStore, T: Transport>(
        store: S,
        transport: T,
        config: RelayConfig,
        label: &str,
    ) -> Result<Relay, ConfigError> {
        config.validate()?;
        let id = Uuid::now_v7();
        let (shutdown, receiver) = watch::channel(false);
        let health = Arc::new(health::HealthState::new());
        let shared = Arc::new(Shared {
            store,
            transport,
            wake: Notify::new(),
            schema_label: label.to_owned(),
            config,
            health: Arc::clone(&health),
        });
        crate::metrics::register_relay(&shared.schema_label, shared.transport.name());
        let mut tasks = Vec::new();
        if shared.config.listen {
            tasks.push(tokio::spawn(listen(Arc::clone(&shared), receiver.clone())));
        }
        if !shared.config.stats_interval.is_zero() {
            tasks.push(tokio::spawn(report_stats(
                Arc::clone(&shared),
                receiver.clone(),
            )));
        }
        for index in 0..shared.config.workers {
            // Each worker has its own identity for the waiting flag.
            let worker_id =
                Uuid::from_u64_pair(id.as_u64_pair().0, id.as_u64_pair().1 ^ index as u64);
            tasks.push(tokio::spawn(supervise(
                Arc::clone(&shared),
                worker_id,
                receiver.clone(),
            )));
        }
        tracing::info!(relay_id = %id, workers = shared.config.workers, "relay started");
        Ok(Relay {
            id,
            shutdown,
            tasks,
            health,
        })
    }

    /// This relay's id.
    pub fn id(&self) -> Uuid {
        self.id
    }

    /// Whether the relay can publish: its transport's state as the workers
    /// last saw it (before each claim), with the reason and the start of an
    /// outage. For a service's health endpoint.
    pub fn health(&self) -> RelayHealth {
        self.health.get()
    }

    /// Asks every worker to stop after its current batch.
    pub fn stop(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Stops and waits up to `timeout` for the workers to finish; aborts
    /// them after that.
    pub async fn drain(mut self, timeout: Duration) -> Result<(), DrainTimeout> {
        self.stop();
        let tasks = std::mem::take(&mut self.tasks);
        let aborts: Vec<_> = tasks.iter().map(|t| t.abort_handle()).collect();
        let all = futures_util::future::join_all(tasks);
        match tokio::time::timeout(timeout, all).await {
            Ok(_) => Ok(()),
            Err(_) => {
                for abort in aborts {
                    abort.abort();
                }
                Err(DrainTimeout(timeout))
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Runs a worker and restarts it after a panic (a failpoint, or a bug):
/// its claim rolls back, and the next loop claims the events again.
async fn supervise<S: RelayStore, T: Transport>(
    shared: Arc<Shared<S, T>>,
    worker_id: Uuid,
    shutdown: watch::Receiver<bool>,
) {
    loop {
        let run = worker::run(Arc::clone(&shared), worker_id, shutdown.clone());
        match AssertUnwindSafe(run).catch_unwind().await {
            Ok(()) => return,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                tracing::error!(%worker_id, %message, "relay worker panicked; restarting it");
                if *shutdown.borrow() {
                    return;
                }
                tokio::time::sleep(shared.config.error_backoff).await;
            }
        }
    }
}

/// Turns NOTIFY into wake-ups for the workers; reconnects after errors.
async fn listen<S: RelayStore, T: Transport>(
    shared: Arc<Shared<S, T>>,
    mut shutdown: watch::Receiver<bool>,
) {
    while !*shutdown.borrow() {
        let mut listener = match shared.store.listener().await {
            Ok(listener) => {
                // What committed before LISTEN took effect sent its NOTIFY
                // to nobody (at start, the workers may already sleep; after
                // a lost connection, they went back to sleep): every worker
                // looks once more now.
                shared.wake.notify_waiters();
                listener
            }
            Err(error) => {
                tracing::warn!(%error, "relay cannot listen for notifications; polling only for now");
                tokio::select! {
                    _ = tokio::time::sleep(shared.config.error_backoff) => continue,
                    _ = shutdown.changed() => return,
                }
            }
        };
        loop {
            tokio::select! {
                received = listener.wait() => match received {
                    Ok(()) => shared.wake.notify_waiters(),
                    Err(error) => {
                        tracing::warn!(%error, "relay lost its notification listener");
                        // Wake everyone: notifications may have been missed.
                        shared.wake.notify_waiters();
                        break;
                    }
                },
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// Refreshes the backlog gauges.
async fn report_stats<S: RelayStore, T: Transport>(
    shared: Arc<Shared<S, T>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut gauges = crate::metrics::BacklogGauges::new(&shared.schema_label);
    while !*shutdown.borrow() {
        match shared.store.stats().await {
            Ok(stats) => gauges.record(&stats),
            Err(error) => tracing::warn!(%error, "relay cannot read backlog figures"),
        }
        tokio::select! {
            _ = tokio::time::sleep(shared.config.stats_interval) => {}
            _ = shutdown.changed() => return,
        }
    }
}
