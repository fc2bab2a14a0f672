//! One relay worker: claim a batch, publish it in waves, record the outcome,
//! repeat; sleep until NOTIFY or the poll interval when there is nothing
//! to do; back off after database errors. Stops between batches when asked.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, watch};
use uuid::Uuid;

use super::claim_size::ClaimSize;
use super::config::RelayConfig;
use super::health::HealthState;
use super::store::{BatchOutcome, ClaimedBatch, ClaimedEvent, FailedAttempt, RelayStore};
use super::waves;
use crate::envelope::Envelope;
use crate::metrics as m;
use crate::transport::{PublishFailure, Transport, TransportHealth};

/// What workers share.
pub(crate) struct Shared<S, T> {
    pub(crate) store: S,
    pub(crate) transport: T,
    pub(crate) config: RelayConfig,
    pub(crate) wake: Notify,
    pub(crate) schema_label: String,
    pub(crate) health: Arc<HealthState>,
}

/// How often a worker refreshes its heartbeat: other workers count it as
/// alive for 30 seconds (and emitters honour a waiting flag for five
/// minutes).
const HEARTBEAT_EVERY: Duration = Duration::from_secs(10);

pub(crate) async fn run<S: RelayStore, T: Transport>(
    shared: Arc<Shared<S, T>>,
    worker_id: Uuid,
    mut shutdown: watch::Receiver<bool>,
) {
    let config = &shared.config;
    let mut waiting = false;
    // Whether the worker has looked again SETTLE_AFTER_FLAG after raising
    // its waiting flag.
    let mut settled = true;
    let mut last_heartbeat = Instant::now();
    if let Err(error) = shared.store.heartbeat(worker_id, false).await {
        tracing::warn!(%error, "relay could not register its worker");
    }
    let mut consecutive_errors: u32 = 0;
    let mut consecutive_down: u32 = 0;
    let mut claim_size = ClaimSize::new(config.batch_size);
    while !*shutdown.borrow() {
        // A transport that is down would fail every publish and walk the
        // events towards the failed state: claim nothing until it is back.
        match shared.transport.health().await {
            health @ (TransportHealth::Up | TransportHealth::Degraded { .. }) => {
                consecutive_down = 0;
                shared
                    .health
                    .transport_up(&shared.schema_label, shared.transport.name(), health);
            }
            TransportHealth::Down { reason } => {
                if consecutive_down == 0
                    && let Err(error) = shared.store.pause(worker_id).await
                {
                    tracing::warn!(%error, "relay could not pause its claiming session");
                }
                consecutive_down = consecutive_down.saturating_add(1);
                shared
                    .health
                    .transport_down(&shared.schema_label, shared.transport.name(), reason);
                let delay =
                    error_delay(config.error_backoff, consecutive_down).min(TRANSPORT_RECHECK_MAX);
                sleep_or_stop(delay, &mut shutdown).await;
                continue;
            }
        }

        // Registered before the claim: a notification that arrives between
        // an empty claim and the sleep is not lost.
        let notified = shared.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();

        let claim_started = Instant::now();
        let batch = match shared.store.claim_for(worker_id, claim_size.get()).await {
            Ok(batch) => {
                consecutive_errors = 0;
                claim_size.succeeded();
                batch
            }
            Err(error) => {
                if shared.store.is_statement_timeout(&error) {
                    claim_size.timed_out();
                    tracing::warn!(
                        claim_size = claim_size.get(),
                        "relay claim cancelled by the statement timeout; claiming fewer events until claims go through again"
                    );
                }
                consecutive_errors = consecutive_errors.saturating_add(1);
                metrics::counter!(m::STORE_ERRORS, "schema" => shared.schema_label.clone())
                    .increment(1);
                tracing::warn!(%error, consecutive_errors, "relay claim failed");
                let delay = error_delay(config.error_backoff, consecutive_errors);
                sleep_or_stop(delay, &mut shutdown).await;
                continue;
            }
        };

        if batch.events().is_empty() {
            if let Err(error) = batch.release().await {
                tracing::warn!(%error, "relay could not release an empty claim");
            }
            if !config.listen {
                sleep_or_stop(config.poll_interval, &mut shutdown).await;
                continue;
            }
            if !waiting || last_heartbeat.elapsed() >= HEARTBEAT_EVERY {
                // Announce the sleep, then look once more before sleeping:
                // an emit that committed before it saw the flag is found now.
                match shared.store.heartbeat(worker_id, true).await {
                    Ok(()) => {
                        last_heartbeat = Instant::now();
                        if !waiting {
                            waiting = true;
                            settled = false;
                            continue;
                        }
                    }
                    Err(error) => tracing::warn!(%error, "relay could not announce it is waiting"),
                }
            }
            let sleep = if settled {
                config.poll_interval
            } else {
                settled = true;
                config.poll_interval.min(SETTLE_AFTER_FLAG)
            };
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep(sleep) => {}
                _ = shutdown.changed() => {}
            }
            continue;
        }

        crate::failpoint::hit(crate::failpoint::AFTER_CLAIM).await;
        process(&shared, batch, claim_started).await;
        // After the batch, not before it: the flag costs a write, and a
        // stale "waiting" only makes emitters send a NOTIFY too many.
        if waiting || last_heartbeat.elapsed() >= HEARTBEAT_EVERY {
            waiting = false;
            last_heartbeat = Instant::now();
            if let Err(error) = shared.store.heartbeat(worker_id, false).await {
                tracing::warn!(%error, "relay could not refresh its heartbeat");
            }
        }
    }
    if let Err(error) = shared.store.deregister(worker_id).await {
        tracing::warn!(%error, "relay could not deregister");
    }
}

/// The failed attempt of a claimed row the store could not read: moved to
/// the failed state at once (retrying would read the same row), logged and
/// counted as an event given up on.
fn unreadable_failure(event: &ClaimedEvent, reason: &str, schema: &str) -> FailedAttempt {
    metrics::counter!(m::MOVED_TO_FAILED, "schema" => schema.to_owned()).increment(1);
    tracing::error!(
        event_id = %event.envelope.id,
        event_type = %event.envelope.event_type,
        aggregate_type = %event.envelope.aggregate_type,
        aggregate_id = %event.envelope.aggregate_id,
        %reason,
        "event moved to the failed state without a publish: its stored row cannot be read"
    );
    FailedAttempt {
        event_id: event.envelope.id,
        aggregate_type: event.envelope.aggregate_type.clone(),
        aggregate_id: event.envelope.aggregate_id.clone(),
        error: reason.to_owned(),
        retry_in: Duration::ZERO,
        give_up: true,
    }
}

/// After raising its waiting flag a worker looks again at once, and once
/// more after this pause (or a NOTIFY) before its long sleep. An emit whose
/// statement read the flag just before it went up sent no NOTIFY; if its
/// transaction committed after the first look (the commit's round trip,
/// usually a millisecond or two), the second look finds it. A transaction
/// that stays open longer after its emit is found at the next poll.
const SETTLE_AFTER_FLAG: Duration = Duration::from_millis(250);

/// The longest pause between two looks at a transport that is down: once
/// the broker is back, publishing resumes within this.
const TRANSPORT_RECHECK_MAX: Duration = Duration::from_secs(5);

fn error_delay(base: Duration, consecutive: u32) -> Duration {
    let factor = 2u32.saturating_pow(consecutive.saturating_sub(1).min(10));
    (base * factor).min(Duration::from_secs(30))
}

async fn sleep_or_stop(delay: Duration, shutdown: &mut watch::Receiver<bool>) {
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = shutdown.changed() => {}
    }
}

/// Publishes one batch in waves and records the outcome. The batch
/// duration runs from the start of the claim (`started`) to the recorded
/// outcome.
async fn process<S: RelayStore, T: Transport>(
    shared: &Shared<S, T>,
    batch: S::Batch,
    started: Instant,
) {
    let config = &shared.config;
    let schema = shared.schema_label.clone();
    let transport = shared.transport.name();
    let events = batch.events();
    let plan = waves::plan(events);
    let mut blocked_runs = vec![false; plan.runs];
    let mut outcome = BatchOutcome::default();
    // The publish timeout, and a hard limit: no wave starts once the claim
    // timeout has passed since the claim was sent. PostgreSQL ends an idle
    // claim transaction no earlier than that (its clock starts when the
    // claim statement finished, after it was sent), and only then can
    // another worker own these events' partitions. So a worker stalled
    // after its claim, even before it read the clock here, sends nothing
    // once another may be publishing the same aggregates — unless it
    // stalled in the instant between the check before a wave and the send
    // (the fencing token is for a receiver to catch that one).
    let fence = tokio::time::Instant::from_std(started + config.claim_timeout);
    let deadline = (tokio::time::Instant::now() + config.publish_timeout).min(fence);
    let span = tracing::debug_span!(
        "outbox.relay.batch",
        events = events.len(),
        waves = plan.waves.len()
    );
    let _guard = span.enter();

    for wave in &plan.waves {
        let mut indices: Vec<usize> = Vec::with_capacity(wave.len());
        for &index in wave {
            if blocked_runs[plan.run_of[index]] {
                continue;
            }
            match &events[index].unreadable {
                None => indices.push(index),
                Some(reason) => {
                    // Nothing to publish: failed at once, and the rest of
                    // its aggregate waits behind it like behind any
                    // failed head.
                    blocked_runs[plan.run_of[index]] = true;
                    outcome
                        .failed
                        .push(unreadable_failure(&events[index], reason, &schema));
                }
            }
        }
        if indices.is_empty() {
            continue;
        }
        let envelopes: Vec<&Envelope> = indices.iter().map(|&i| &events[i].envelope).collect();
        // Past the deadline the claim may be gone (the server ends it
        // after the claim timeout, and another worker may own its
        // partitions by then): a worker that was stalled sends nothing
        // more; the rest of the batch is left unattempted. Checked right
        // before the send (the timeout below polls the send first).
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        metrics::counter!(m::PUBLISH_ATTEMPTS, "schema" => schema.clone(), "transport" => transport)
            .increment(envelopes.len() as u64);
        let results = match tokio::time::timeout_at(
            deadline,
            super::fence::publishing(batch.fencing_token(), shared.transport.publish(&envelopes)),
        )
        .await
        {
            Ok(results) => results,
            Err(_) => vec![
                Err(PublishFailure::retryable(format!(
                    "publish did not finish within {:?}",
                    config.publish_timeout
                )));
                envelopes.len()
            ],
        };
        for (position, &index) in indices.iter().enumerate() {
            let event = &events[index];
            let result = results.get(position).cloned().unwrap_or_else(|| {
                Err(PublishFailure::retryable(
                    "the transport returned no outcome for this event",
                ))
            });
            match result {
                Ok(()) => outcome.published.push(event.envelope.id),
                Err(failure) => {
                    blocked_runs[plan.run_of[index]] = true;
                    let attempts = event.attempts + 1;
                    let give_up = !failure.retryable || attempts >= config.max_attempts;
                    let kind = if failure.retryable {
                        "retryable"
                    } else {
                        "permanent"
                    };
                    metrics::counter!(m::PUBLISH_FAILURES, "schema" => schema.clone(), "transport" => transport, "kind" => kind)
                        .increment(1);
                    if give_up {
                        metrics::counter!(m::MOVED_TO_FAILED, "schema" => schema.clone())
                            .increment(1);
                        tracing::error!(
                            event_id = %event.envelope.id,
                            event_type = %event.envelope.event_type,
                            attempts,
                            reason = %failure,
                            "event moved to the failed state"
                        );
                    } else {
                        tracing::warn!(event_id = %event.envelope.id, attempts, reason = %failure, "publish failed, will retry");
                    }
                    outcome.failed.push(FailedAttempt {
                        event_id: event.envelope.id,
                        aggregate_type: event.envelope.aggregate_type.clone(),
                        aggregate_id: event.envelope.aggregate_id.clone(),
                        error: failure.to_string(),
                        retry_in: config.backoff.delay(attempts),
                        give_up,
                    });
                }
            }
        }
    }

    crate::failpoint::hit(crate::failpoint::AFTER_PUBLISH).await;

    let published = outcome.published.len() as u64;
    let claimed = events.len();
    match batch.complete(outcome).await {
        Ok(()) => {
            metrics::counter!(m::PUBLISHED, "schema" => schema.clone(), "transport" => transport)
                .increment(published);
        }
        Err(error) => {
            // The claim transaction is gone: nothing was marked, the events
            // are published again later (at least once).
            metrics::counter!(m::STORE_ERRORS, "schema" => schema.clone()).increment(1);
            tracing::error!(%error, "relay could not record a batch outcome; its events will be published again");
        }
    }
    metrics::histogram!(m::BATCH_DURATION, "schema" => schema.clone())
        .record(started.elapsed().as_secs_f64());
    metrics::histogram!(m::BATCH_EVENTS, "schema" => schema).record(claimed as f64);
}
