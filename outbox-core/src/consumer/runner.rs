//! The consumer loop as an owned task: take a batch from the source,
//! process it, settle each delivery (ack after commit, or a delayed
//! redelivery), sweep parked messages on a timer.

use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::Consumer;
use super::config::Ordering;
use super::incoming::{Incoming, Outcome};
use super::source::{Delivery, MessageSource};
use super::store::ConsumerStore;
use crate::metrics as m;
use crate::relay::DrainTimeout;

/// A running consumer loop. Dropping it aborts the loop (its uncommitted
/// message is delivered again); call [`ConsumerTask::drain`] to stop it
/// cleanly.
#[derive(Debug)]
#[must_use = "dropping a ConsumerTask aborts the consumer loop"]
pub struct ConsumerTask {
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl Drop for ConsumerTask {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl<S: ConsumerStore> Consumer<S> {
    /// Runs the consumer on `source` until [`ConsumerTask::stop`] or until
    /// the source closes. Spawn several (on the same durable JetStream
    /// consumer, for instance) for parallelism: the inbox and the
    /// positions keep them safe against each other.
    pub fn spawn<Src: MessageSource>(&self, source: Src) -> ConsumerTask {
        let (shutdown, receiver) = watch::channel(false);
        let task = tokio::spawn(run(self.clone(), source, receiver));
        ConsumerTask {
            shutdown,
            task: Some(task),
        }
    }
}

impl ConsumerTask {
    /// Asks the loop to stop after the batch in hand.
    pub fn stop(&self) {
        let _ = self.shutdown.send(true);
    }

    /// Whether the loop has ended (stopped, source closed, or panicked).
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Waits for the loop to end by itself (the source closed); an error
    /// when it panicked.
    pub async fn join(mut self) -> Result<(), tokio::task::JoinError> {
        match self.task.take() {
            Some(task) => task.await,
            None => Ok(()),
        }
    }

    /// Stops and waits up to `timeout`; aborts the loop after that (its
    /// uncommitted message is delivered again).
    pub async fn drain(mut self, timeout: Duration) -> Result<(), DrainTimeout> {
        self.stop();
        let Some(task) = self.task.take() else {
            return Ok(());
        };
        let abort = task.abort_handle();
        match tokio::time::timeout(timeout, task).await {
            Ok(_) => Ok(()),
            Err(_) => {
                abort.abort();
                Err(DrainTimeout(timeout))
            }
        }
    }
}

async fn run<S: ConsumerStore, Src: MessageSource>(
    consumer: Consumer<S>,
    mut source: Src,
    mut shutdown: watch::Receiver<bool>,
) {
    let config = consumer.config().clone();
    let strict = matches!(config.ordering, Ordering::Strict { .. });
    // Every consumer sweeps: replays an operator asked for, its stats, and
    // under strict ordering the parked messages.
    let mut sweep = tokio::time::interval(config.sweep_interval);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let name = consumer.name().to_owned();
    crate::metrics::register_consumer(&name);
    tracing::info!(consumer = %name, "consumer started");
    loop {
        if *shutdown.borrow() {
            break;
        }
        tokio::select! {
            biased;
            changed = shutdown.changed() => {
                if changed.is_err() {
                    // The handle is gone: nobody can stop us any more.
                    break;
                }
            }
            _ = sweep.tick() => {
                if strict && let Err(error) = consumer.sweep().await {
                    tracing::warn!(consumer = %name, %error, "sweep of parked messages failed");
                    metrics::counter!(m::CONSUMER_ERRORS, "consumer" => name.clone(), "kind" => "database").increment(1);
                }
                if let Err(error) = consumer.run_requested_replays().await {
                    tracing::warn!(consumer = %name, %error, "requested replays failed");
                    metrics::counter!(m::CONSUMER_ERRORS, "consumer" => name.clone(), "kind" => "database").increment(1);
                }
                if let Err(error) = consumer.flush_stats().await {
                    tracing::debug!(consumer = %name, %error, "writing consumer stats failed; kept for the next flush");
                }
            }
            batch = source.next_batch(config.batch_size) => match batch {
                Ok(batch) if batch.is_empty() => {
                    tracing::info!(consumer = %name, "source closed");
                    break;
                }
                Ok(batch) => settle(&consumer, batch, config.error_backoff).await,
                Err(error) => {
                    tracing::warn!(consumer = %name, %error, "message source failed");
                    metrics::counter!(m::CONSUMER_ERRORS, "consumer" => name.clone(), "kind" => "source").increment(1);
                    pause(&mut shutdown, config.error_backoff).await;
                }
            },
        }
    }
    if let Err(error) = consumer.flush_stats().await {
        tracing::debug!(consumer = %name, %error, "writing consumer stats failed at stop");
    }
    tracing::info!(consumer = %name, "consumer stopped");
}

/// Processes a batch and settles every delivery: acknowledged after the
/// commit (all of a batch's acknowledgements at once), redelivered later
/// on a retry or when the database failed.
async fn settle<S: ConsumerStore, D: Delivery>(
    consumer: &Consumer<S>,
    batch: Vec<D>,
    error_backoff: Duration,
) {
    let refs: Vec<&Incoming> = batch.iter().map(Delivery::incoming).collect();
    let result = consumer.handle_refs(&refs).await;
    match result {
        Ok(outcomes) => {
            // Everything was committed: the settlements go out together
            // (pipelined on the broker connection), none waits for another.
            let settled = futures_util::future::join_all(batch.into_iter().zip(outcomes).map(
                |(delivery, outcome)| async move {
                    tracing::debug!(
                        consumer = %consumer.name(),
                        event_id = ?delivery.incoming().attribute(crate::ce::ID),
                        attempt = delivery.incoming().attempt(),
                        outcome = outcome.label(),
                        "message settled"
                    );
                    match outcome {
                        Outcome::Retry { delay, .. } => delivery.retry_later(delay).await,
                        _ => delivery.ack().await,
                    }
                },
            ))
            .await;
            for error in settled.into_iter().filter_map(Result::err) {
                // Not acknowledged: the broker delivers it again and the
                // inbox turns it into a duplicate.
                tracing::warn!(consumer = %consumer.name(), %error, "settling a message failed");
            }
        }
        Err(error) => {
            tracing::warn!(consumer = %consumer.name(), %error, "processing failed; messages will be delivered again");
            metrics::counter!(m::CONSUMER_ERRORS, "consumer" => consumer.name().to_owned(), "kind" => "database").increment(1);
            for delivery in batch {
                let _ = delivery.retry_later(error_backoff).await;
            }
            tokio::time::sleep(error_backoff).await;
        }
    }
}

async fn pause(shutdown: &mut watch::Receiver<bool>, delay: Duration) {
    tokio::select! {
        _ = shutdown.changed() => {}
        () = tokio::time::sleep(delay) => {}
    }
}
