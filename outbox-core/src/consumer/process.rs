//! One message (or one batch) through the inbox, the ordering policy, the
//! handler and the commit.

use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use futures_util::FutureExt;
use sqlx::PgConnection;
use tracing::Instrument;
use uuid::Uuid;

use super::Consumer;
use super::config::Ordering;
use super::handler::{Decoded, Dispatch, EventMeta, HandlerError};
use super::incoming::{Incoming, Outcome};
use crate::envelope::Envelope;
use crate::metrics as m;
use crate::store::consumer::{Letter, LetterKind};
use crate::trace::{self, TraceParent};

/// The consumer could not reach its database; the message was not
/// settled and must be delivered again.
#[derive(Debug, thiserror::Error)]
#[error("consumer {consumer}: database error while {doing}: {source}")]
pub struct ConsumerError {
    /// The consumer.
    pub consumer: String,
    /// What it was doing.
    pub doing: &'static str,
    /// The driver's error.
    #[source]
    pub source: sqlx::Error,
}

/// What a sweep of parked messages did (strict ordering).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Parked messages applied because their predecessor had arrived.
    pub applied: u64,
    /// Parked messages moved to the dead letters after the park timeout.
    pub dead_lettered: u64,
}

/// A message read and matched with its handler, or why it cannot be.
enum Prepared<'a> {
    Ready {
        envelope: Envelope,
        dispatch: &'a dyn Dispatch,
        decoded: Decoded,
    },
    Unreadable {
        envelope: Option<Envelope>,
        reason: String,
    },
    Ignored {
        envelope: Envelope,
    },
}

impl Prepared<'_> {
    fn event_id(&self) -> Option<Uuid> {
        match self {
            Prepared::Ready { envelope, .. } => Some(envelope.id),
            Prepared::Unreadable { envelope, .. } => envelope.as_ref().map(|e| e.id),
            Prepared::Ignored { envelope } => Some(envelope.id),
        }
    }
}

/// What the ordering policy says about a message.
enum Gate {
    Go,
    Stale(Option<i64>),
    Park(i64),
}

impl Consumer {
    fn db_error(&self, doing: &'static str) -> impl FnOnce(sqlx::Error) -> ConsumerError + '_ {
        move |source| ConsumerError {
            consumer: self.inner.name.to_string(),
            doing,
            source,
        }
    }

    /// Begins a transaction whose statements PostgreSQL cancels after the
    /// handler timeout (same round trip as BEGIN): a handler cut off by its
    /// timeout does not leave a statement running, holding locks, while
    /// the rollback waits for it.
    async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, ConsumerError> {
        self.inner
            .pool
            .begin_with(sqlx::AssertSqlSafe(self.inner.begin_sql.clone()))
            .await
            .map_err(self.db_error("beginning a transaction"))
    }

    /// Processes one message in its own transaction and says whether to
    /// acknowledge it. Errors only when the database cannot be reached;
    /// then nothing was committed and the message must come again.
    pub async fn handle(&self, incoming: &Incoming) -> Result<Outcome, ConsumerError> {
        let prepared = self.prepare(incoming);
        let outcome = match prepared {
            Prepared::Ignored { envelope } => self.skip_one(envelope).await?,
            Prepared::Unreadable { envelope, reason } => {
                self.quarantine_one(incoming, envelope.as_ref(), reason)
                    .await?
            }
            Prepared::Ready {
                envelope,
                dispatch,
                decoded,
            } => {
                self.apply_one(incoming, envelope, dispatch, decoded)
                    .await?
            }
        };
        self.record(&outcome);
        Ok(outcome)
    }

    /// Processes an envelope as a first delivery (feeding a consumer from
    /// any stream of envelopes).
    pub async fn handle_envelope(&self, envelope: &Envelope) -> Result<Outcome, ConsumerError> {
        self.handle(&Incoming::from_envelope(envelope, 1)).await
    }

    /// Processes messages in one transaction: one inbox statement for all,
    /// then each message's policy and handler in order. When a handler
    /// fails, the batch rolls back and every message is processed on its
    /// own, so each gets exactly the outcome it would have alone.
    pub async fn handle_batch(&self, batch: &[Incoming]) -> Result<Vec<Outcome>, ConsumerError> {
        let refs: Vec<&Incoming> = batch.iter().collect();
        self.handle_refs(&refs).await
    }

    pub(crate) async fn handle_refs(
        &self,
        batch: &[&Incoming],
    ) -> Result<Vec<Outcome>, ConsumerError> {
        // Redeliveries are rare and need their start counted first: a batch
        // with one goes message by message.
        if batch.len() <= 1 || batch.iter().any(|i| i.attempt() > 1) {
            let mut outcomes = Vec::with_capacity(batch.len());
            for incoming in batch {
                outcomes.push(self.handle(incoming).await?);
            }
            return Ok(outcomes);
        }
        let prepared: Vec<Prepared<'_>> = batch.iter().map(|i| self.prepare(i)).collect();
        let ids: Vec<Uuid> = prepared
            .iter()
            .filter(|p| match p {
                Prepared::Ignored { envelope } => self.tracks(envelope),
                _ => true,
            })
            .filter_map(Prepared::event_id)
            .collect();
        let mut tx = self.begin().await?;
        if self.inner.config.ordering != Ordering::Unordered {
            let mut aggregates: Vec<(String, String)> = prepared
                .iter()
                .filter_map(|p| match p {
                    Prepared::Ready { envelope, .. } => Some(envelope),
                    Prepared::Ignored { envelope } if self.tracks(envelope) => Some(envelope),
                    _ => None,
                })
                .map(|e| (e.aggregate_type.clone(), e.aggregate_id.clone()))
                .collect();
            aggregates.sort_unstable();
            aggregates.dedup();
            self.inner
                .sql
                .lock_positions(&mut tx, &self.inner.name, &aggregates)
                .await
                .map_err(self.db_error("locking the batch's aggregate positions"))?;
        }
        let mut fresh: HashSet<Uuid> = self
            .inner
            .sql
            .claim_many(&mut tx, &self.inner.name, &ids)
            .await
            .map_err(self.db_error("recording the batch in the inbox"))?
            .into_iter()
            .collect();
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut advanced: Vec<(String, String)> = Vec::new();
        for (incoming, prepared) in batch.iter().zip(prepared) {
            let outcome = match prepared {
                Prepared::Ignored { envelope } => {
                    if !self.tracks(&envelope) {
                        Outcome::Ignored
                    } else if !fresh.remove(&envelope.id) {
                        Outcome::Duplicate
                    } else {
                        let outcome = self.pass_skipped(&mut tx, &envelope).await?;
                        if outcome == Outcome::Ignored {
                            advanced.push((
                                envelope.aggregate_type.clone(),
                                envelope.aggregate_id.clone(),
                            ));
                        }
                        outcome
                    }
                }
                Prepared::Unreadable { envelope, reason } => {
                    if envelope.as_ref().is_some_and(|e| !fresh.remove(&e.id)) {
                        Outcome::Duplicate
                    } else {
                        self.write_letter(
                            &mut tx,
                            LetterKind::Quarantined,
                            incoming,
                            envelope.as_ref(),
                            &reason,
                        )
                        .await?;
                        Outcome::Quarantined { reason }
                    }
                }
                Prepared::Ready {
                    envelope,
                    dispatch,
                    decoded,
                } => {
                    if !fresh.remove(&envelope.id) {
                        Outcome::Duplicate
                    } else {
                        match self.gate(&mut tx, &envelope).await? {
                            Gate::Stale(position) => Outcome::Stale { position },
                            Gate::Park(waiting_for) => {
                                self.park(&mut tx, &envelope).await?;
                                Outcome::Parked { waiting_for }
                            }
                            Gate::Go => {
                                let result = self
                                    .run_handler(
                                        dispatch,
                                        decoded,
                                        &envelope,
                                        incoming.attempt(),
                                        &mut tx,
                                    )
                                    .await;
                                let result = match result {
                                    Ok(()) => transaction_intact(&mut tx).await,
                                    failed => failed,
                                };
                                if result.is_err() {
                                    // Roll back and give every message its own transaction.
                                    let _ = tx.rollback().await;
                                    let mut outcomes = Vec::with_capacity(batch.len());
                                    for incoming in batch {
                                        outcomes.push(self.handle(incoming).await?);
                                    }
                                    return Ok(outcomes);
                                }
                                if self.is_strict() {
                                    self.set_position(&mut tx, &envelope).await?;
                                    advanced.push((
                                        envelope.aggregate_type.clone(),
                                        envelope.aggregate_id.clone(),
                                    ));
                                }
                                self.record_lag(&envelope);
                                Outcome::Applied
                            }
                        }
                    }
                }
            };
            outcomes.push(outcome);
        }
        tx.commit()
            .await
            .map_err(self.db_error("committing a batch"))?;
        crate::failpoint::hit(crate::failpoint::CONSUMER_AFTER_COMMIT).await;
        for outcome in &outcomes {
            self.record(outcome);
        }
        advanced.sort_unstable();
        advanced.dedup();
        for (aggregate_type, aggregate_id) in advanced {
            self.drain_logged(&aggregate_type, &aggregate_id).await;
        }
        Ok(outcomes)
    }

    /// Reads the envelope, finds the handler, decodes and upcasts.
    fn prepare<'a>(&'a self, incoming: &Incoming) -> Prepared<'a> {
        if let Some(reason) = unstorable(incoming) {
            return Prepared::Unreadable {
                envelope: None,
                reason,
            };
        }
        let envelope = match incoming.envelope() {
            Ok(envelope) => envelope,
            Err(error) => {
                return Prepared::Unreadable {
                    envelope: None,
                    reason: format!("cannot read the message: {error}"),
                };
            }
        };
        let Some(dispatch) = self.inner.handlers.get(envelope.event_type.as_str()) else {
            let known = crate::registry::ContractRegistry::global()
                .ok()
                .and_then(|r| r.current(&envelope.event_type))
                .is_some();
            if known || self.inner.ignored.contains(&envelope.event_type) {
                return Prepared::Ignored { envelope };
            }
            let reason = format!(
                "unknown event type {:?} (v{}): no contract for it in this binary and no handler in consumer {}",
                envelope.event_type, envelope.schema_version, self.inner.name
            );
            return Prepared::Unreadable {
                envelope: Some(envelope),
                reason,
            };
        };
        if envelope.aggregate_type != dispatch.aggregate_type() {
            let reason = format!(
                "{} belongs to aggregate type {:?}, but the message says {:?}",
                envelope.event_type,
                dispatch.aggregate_type(),
                envelope.aggregate_type
            );
            return Prepared::Unreadable {
                envelope: Some(envelope),
                reason,
            };
        }
        // Upcasters, conversions and Deserialize impls are user code running
        // on external data: a panic there quarantines the message.
        let decoded = std::panic::catch_unwind(AssertUnwindSafe(|| dispatch.decode(&envelope)));
        match decoded {
            Ok(Ok(decoded)) => Prepared::Ready {
                envelope,
                dispatch: dispatch.as_ref(),
                decoded,
            },
            Ok(Err(error)) => Prepared::Unreadable {
                envelope: Some(envelope),
                reason: error.to_string(),
            },
            Err(panic) => Prepared::Unreadable {
                reason: format!(
                    "decoding {} v{} panicked: {}",
                    envelope.event_type,
                    envelope.schema_version,
                    panic_message(&panic)
                ),
                envelope: Some(envelope),
            },
        }
    }

    async fn quarantine_one(
        &self,
        incoming: &Incoming,
        envelope: Option<&Envelope>,
        reason: String,
    ) -> Result<Outcome, ConsumerError> {
        let mut tx = self.begin().await?;
        if let Some(envelope) = envelope
            && !self.claim(&mut tx, envelope.id).await?
        {
            return Ok(Outcome::Duplicate);
        }
        self.write_letter(
            &mut tx,
            LetterKind::Quarantined,
            incoming,
            envelope,
            &reason,
        )
        .await?;
        tx.commit()
            .await
            .map_err(self.db_error("committing a quarantine row"))?;
        tracing::warn!(
            consumer = %self.inner.name,
            event_id = ?envelope.map(|e| e.id),
            event_type = ?envelope.map(|e| e.event_type.as_str()),
            "message quarantined"
        );
        Ok(Outcome::Quarantined { reason })
    }

    async fn apply_one(
        &self,
        incoming: &Incoming,
        envelope: Envelope,
        dispatch: &dyn Dispatch,
        decoded: Decoded,
    ) -> Result<Outcome, ConsumerError> {
        // A redelivery counts its handler start in a committed row first, so
        // a message that takes the process down each time ends after
        // max_attempts starts; deliveries that never reach a handler (the
        // database is down) do not count.
        let redelivered = incoming.attempt() > 1;
        let start = if redelivered {
            self.count_start(envelope.id).await?
        } else {
            1
        };
        let mut tx = self.begin().await?;
        if !self.claim(&mut tx, envelope.id).await? {
            if redelivered {
                self.forget_starts(&mut tx, envelope.id).await?;
                tx.commit()
                    .await
                    .map_err(self.db_error("committing a duplicate"))?;
            }
            return Ok(Outcome::Duplicate);
        }
        if redelivered {
            // Settled with this transaction; kept when it rolls back.
            self.forget_starts(&mut tx, envelope.id).await?;
        }
        let max_attempts = self.inner.config.retry.max_attempts;
        if start > max_attempts {
            let reason = format!(
                "the handler was started {} times without an outcome (the process crashed, hung or lost its database connection each time); not started again",
                start - 1
            );
            self.write_letter(
                &mut tx,
                LetterKind::DeadLettered,
                incoming,
                Some(&envelope),
                &reason,
            )
            .await?;
            tx.commit()
                .await
                .map_err(self.db_error("committing a dead letter"))?;
            tracing::warn!(consumer = %self.inner.name, event_id = %envelope.id, "message moved to dead letters after repeated crashes");
            return Ok(Outcome::DeadLettered { reason });
        }
        match self.gate(&mut tx, &envelope).await? {
            Gate::Go => {}
            Gate::Stale(position) => {
                tx.commit()
                    .await
                    .map_err(self.db_error("committing a stale message"))?;
                return Ok(Outcome::Stale { position });
            }
            Gate::Park(waiting_for) => {
                self.park(&mut tx, &envelope).await?;
                tx.commit()
                    .await
                    .map_err(self.db_error("committing a parked message"))?;
                return Ok(Outcome::Parked { waiting_for });
            }
        }
        let mut result = self
            .run_handler(dispatch, decoded, &envelope, start, &mut tx)
            .await;
        if result.is_ok() {
            result = transaction_intact(&mut tx).await;
        }
        match result {
            Ok(()) => {
                if self.is_strict() {
                    self.set_position(&mut tx, &envelope).await?;
                }
                tx.commit()
                    .await
                    .map_err(self.db_error("committing the handler's transaction"))?;
                crate::failpoint::hit(crate::failpoint::CONSUMER_AFTER_COMMIT).await;
                self.record_lag(&envelope);
                if self.is_strict() {
                    self.drain_logged(&envelope.aggregate_type, &envelope.aggregate_id)
                        .await;
                }
                Ok(Outcome::Applied)
            }
            Err(error) => {
                let _ = tx.rollback().await;
                self.after_failure(incoming, &envelope, start, error).await
            }
        }
    }

    /// A handler failed: retry later, or dead letters when it is permanent
    /// or the attempts are used up.
    async fn after_failure(
        &self,
        incoming: &Incoming,
        envelope: &Envelope,
        attempt: u32,
        error: HandlerError,
    ) -> Result<Outcome, ConsumerError> {
        let retry = &self.inner.config.retry;
        if !error.is_permanent() && attempt < retry.max_attempts {
            tracing::info!(
                consumer = %self.inner.name, event_id = %envelope.id, attempt, %error,
                "handler failed; will retry"
            );
            return Ok(Outcome::Retry {
                delay: retry.backoff.delay(attempt),
                error: error.to_string(),
            });
        }
        let reason = if error.is_permanent() {
            format!("handler rejected the event: {error}")
        } else {
            format!("handler failed on {attempt} deliveries; last error: {error}")
        };
        let mut tx = self.begin().await?;
        if !self.claim(&mut tx, envelope.id).await? {
            // Another instance applied it in the meantime.
            return Ok(Outcome::Duplicate);
        }
        self.write_letter(
            &mut tx,
            LetterKind::DeadLettered,
            incoming,
            Some(envelope),
            &reason,
        )
        .await?;
        tx.commit()
            .await
            .map_err(self.db_error("committing a dead letter"))?;
        tracing::warn!(
            consumer = %self.inner.name, event_id = %envelope.id,
            event_type = %envelope.event_type, attempt, "message moved to dead letters"
        );
        Ok(Outcome::DeadLettered { reason })
    }

    /// Runs a handler with its deadline, its trace context, and panics
    /// turned into errors.
    async fn run_handler(
        &self,
        dispatch: &dyn Dispatch,
        decoded: Decoded,
        envelope: &Envelope,
        attempt: u32,
        tx: &mut PgConnection,
    ) -> Result<(), HandlerError> {
        let meta = EventMeta::new(envelope, attempt, &self.inner.name);
        let traceparent: Option<TraceParent> =
            envelope.traceparent.as_deref().and_then(|t| t.parse().ok());
        let span = tracing::info_span!(
            "outbox.consume",
            consumer = %self.inner.name,
            event_id = %envelope.id,
            event_type = %envelope.event_type,
            aggregate_id = %envelope.aggregate_id,
            aggregate_version = envelope.aggregate_version,
            trace_id = traceparent.map(|t| t.trace_id_hex()),
            attempt,
        );
        let timeout = self.inner.config.retry.handler_timeout;
        let started = Instant::now();
        let run = AssertUnwindSafe(dispatch.run(decoded, meta, tx)).catch_unwind();
        let result = tokio::time::timeout(timeout, trace::scope(traceparent, run))
            .instrument(span)
            .await;
        metrics::histogram!(m::CONSUMER_HANDLER_DURATION, "consumer" => Arc::clone(&self.inner.name))
            .record(started.elapsed().as_secs_f64());
        match result {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(panic)) => Err(HandlerError::retryable(format!(
                "handler panicked: {}",
                panic_message(&panic)
            ))),
            Err(_) => Err(HandlerError::retryable(format!(
                "handler timed out after {timeout:?}"
            ))),
        }
    }

    async fn count_start(&self, event_id: Uuid) -> Result<u32, ConsumerError> {
        let mut conn = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(self.db_error("acquiring a connection"))?;
        self.inner
            .sql
            .count_start(&mut conn, &self.inner.name, event_id)
            .await
            .map_err(self.db_error("counting a handler start"))
    }

    async fn forget_starts(
        &self,
        tx: &mut PgConnection,
        event_id: Uuid,
    ) -> Result<(), ConsumerError> {
        self.inner
            .sql
            .forget_starts(tx, &self.inner.name, event_id)
            .await
            .map_err(self.db_error("clearing a handler start count"))
    }

    fn is_strict(&self) -> bool {
        matches!(self.inner.config.ordering, Ordering::Strict { .. })
    }

    async fn claim(&self, tx: &mut PgConnection, event_id: Uuid) -> Result<bool, ConsumerError> {
        self.inner
            .sql
            .claim_one(tx, &self.inner.name, event_id)
            .await
            .map_err(self.db_error("recording the event in the inbox"))
    }

    async fn gate(
        &self,
        tx: &mut PgConnection,
        envelope: &Envelope,
    ) -> Result<Gate, ConsumerError> {
        let sql = &self.inner.sql;
        let name = &*self.inner.name;
        match self.inner.config.ordering {
            Ordering::Unordered => Ok(Gate::Go),
            Ordering::RejectStale => {
                let newer = sql
                    .advance_if_newer(tx, name, envelope)
                    .await
                    .map_err(self.db_error("moving the aggregate position"))?;
                Ok(if newer { Gate::Go } else { Gate::Stale(None) })
            }
            Ordering::Strict { .. } => {
                let position = sql
                    .lock_position(tx, name, &envelope.aggregate_type, &envelope.aggregate_id)
                    .await
                    .map_err(self.db_error("locking the aggregate position"))?;
                let version = envelope.aggregate_version;
                Ok(if version <= position {
                    Gate::Stale(Some(position))
                } else if version > position + 1 {
                    Gate::Park(position + 1)
                } else {
                    Gate::Go
                })
            }
        }
    }

    async fn set_position(
        &self,
        tx: &mut PgConnection,
        envelope: &Envelope,
    ) -> Result<(), ConsumerError> {
        self.inner
            .sql
            .set_position(tx, &self.inner.name, envelope)
            .await
            .map_err(self.db_error("setting the aggregate position"))
    }

    async fn park(&self, tx: &mut PgConnection, envelope: &Envelope) -> Result<(), ConsumerError> {
        self.inner
            .sql
            .park(tx, &self.inner.name, envelope)
            .await
            .map_err(self.db_error("parking a message"))
    }

    async fn write_letter(
        &self,
        tx: &mut PgConnection,
        kind: LetterKind,
        incoming: &Incoming,
        envelope: Option<&Envelope>,
        reason: &str,
    ) -> Result<(), ConsumerError> {
        let letter = Letter {
            kind,
            envelope,
            headers: incoming.headers_json(),
            payload: incoming.payload(),
            reason,
            attempts: incoming.attempt(),
        };
        self.inner
            .sql
            .letter(tx, &self.inner.name, &letter)
            .await
            .map_err(self.db_error("writing a quarantine or dead-letter row"))
    }

    async fn drain_logged(&self, aggregate_type: &str, aggregate_id: &str) {
        if let Err(error) = self.drain(aggregate_type, aggregate_id).await {
            // The sweep finds the parked successors again.
            tracing::warn!(consumer = %self.inner.name, %error, "draining parked messages failed");
        }
    }

    /// Strict ordering: applies the parked successors of an aggregate, each
    /// in its own transaction, until the next one is missing or fails.
    async fn drain(&self, aggregate_type: &str, aggregate_id: &str) -> Result<u64, ConsumerError> {
        let sql = &self.inner.sql;
        let name = &*self.inner.name;
        let aggregate = (aggregate_type, aggregate_id);
        let mut applied = 0;
        loop {
            // Count the start before running (committed), so a parked
            // message that takes the process down is bounded too.
            let next = {
                let mut tx = self.begin().await?;
                let position = sql
                    .lock_position(&mut tx, name, aggregate_type, aggregate_id)
                    .await
                    .map_err(self.db_error("locking the aggregate position"))?;
                let next = sql
                    .start_parked(&mut tx, name, aggregate, position + 1)
                    .await
                    .map_err(self.db_error("reading parked messages"))?;
                tx.commit()
                    .await
                    .map_err(self.db_error("counting a parked start"))?;
                next
            };
            let Some(parked) = next else {
                return Ok(applied);
            };
            let mut tx = self.begin().await?;
            let position = sql
                .lock_position(&mut tx, name, aggregate_type, aggregate_id)
                .await
                .map_err(self.db_error("locking the aggregate position"))?;
            let parked = match parked {
                Ok(parked) => parked,
                Err(error) => {
                    sql.dead_letter_parked(
                        &mut tx,
                        name,
                        aggregate,
                        &format!("a parked message cannot be read back: {error}"),
                    )
                    .await
                    .map_err(self.db_error("dead-lettering parked messages"))?;
                    tx.commit()
                        .await
                        .map_err(self.db_error("committing dead letters"))?;
                    return Ok(applied);
                }
            };
            let envelope = parked.envelope;
            if envelope.aggregate_version != position + 1 {
                // Another instance drained it between the two transactions.
                continue;
            }
            let incoming = Incoming::from_envelope(&envelope, parked.attempts);
            if parked.attempts > self.inner.config.retry.max_attempts {
                let reason = format!(
                    "the handler was started {} times on this parked message without an outcome",
                    parked.attempts - 1
                );
                self.settle_parked(tx, LetterKind::DeadLettered, &incoming, &envelope, reason)
                    .await?;
                return Ok(applied);
            }
            let result = match self.prepare(&incoming) {
                Prepared::Ready {
                    dispatch, decoded, ..
                } => {
                    match self
                        .run_handler(dispatch, decoded, &envelope, incoming.attempt(), &mut tx)
                        .await
                    {
                        Ok(()) => transaction_intact(&mut tx).await,
                        failed => failed,
                    }
                }
                // An event type this consumer skips: it only moves the position.
                Prepared::Ignored { .. } => Ok(()),
                Prepared::Unreadable { reason, .. } => {
                    self.settle_parked(tx, LetterKind::Quarantined, &incoming, &envelope, reason)
                        .await?;
                    return Ok(applied);
                }
            };
            match result {
                Ok(()) => {
                    self.set_position(&mut tx, &envelope).await?;
                    // Also drops parked duplicates of this version.
                    sql.unpark_through(&mut tx, name, aggregate, envelope.aggregate_version)
                        .await
                        .map_err(self.db_error("removing a parked message"))?;
                    tx.commit()
                        .await
                        .map_err(self.db_error("committing a parked message"))?;
                    self.record_lag(&envelope);
                    self.record(&Outcome::Applied);
                    applied += 1;
                }
                Err(error) => {
                    let _ = tx.rollback().await;
                    let mut tx = self.begin().await?;
                    // Under the position lock: another instance may have
                    // applied it meanwhile (then the row is gone).
                    sql.lock_position(&mut tx, name, aggregate_type, aggregate_id)
                        .await
                        .map_err(self.db_error("locking the aggregate position"))?;
                    let still_parked = sql
                        .parked_failed(&mut tx, name, envelope.id, &error.to_string())
                        .await
                        .map_err(self.db_error("recording a parked message's failure"))?;
                    if still_parked
                        && (error.is_permanent()
                            || parked.attempts >= self.inner.config.retry.max_attempts)
                    {
                        let reason = format!(
                            "handler failed on {} attempts (parked message); last error: {error}",
                            parked.attempts
                        );
                        self.settle_parked(
                            tx,
                            LetterKind::DeadLettered,
                            &incoming,
                            &envelope,
                            reason,
                        )
                        .await?;
                    } else {
                        tx.commit()
                            .await
                            .map_err(self.db_error("committing a failure"))?;
                    }
                    return Ok(applied);
                }
            }
        }
    }

    /// Moves a parked message to the quarantine or the dead letters,
    /// commits, and counts it.
    async fn settle_parked(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Postgres>,
        kind: LetterKind,
        incoming: &Incoming,
        envelope: &Envelope,
        reason: String,
    ) -> Result<(), ConsumerError> {
        self.unpark_into_letter(&mut tx, kind, incoming, envelope, &reason)
            .await?;
        tx.commit()
            .await
            .map_err(self.db_error("committing a quarantine or dead-letter row"))?;
        self.record(&match kind {
            LetterKind::Quarantined => Outcome::Quarantined { reason },
            LetterKind::DeadLettered => Outcome::DeadLettered { reason },
        });
        Ok(())
    }

    async fn unpark_into_letter(
        &self,
        tx: &mut PgConnection,
        kind: LetterKind,
        incoming: &Incoming,
        envelope: &Envelope,
        reason: &str,
    ) -> Result<(), ConsumerError> {
        self.inner
            .sql
            .unpark(tx, &self.inner.name, envelope.id)
            .await
            .map_err(self.db_error("removing a parked message"))?;
        self.write_letter(tx, kind, incoming, Some(envelope), reason)
            .await
    }

    /// Strict ordering: applies parked messages whose predecessor has
    /// arrived (after a crash between a commit and its drain), and moves the
    /// parked messages of aggregates that waited longer than the park
    /// timeout for a missing version to the dead letters, naming it. One
    /// aggregate's failure does not stop the others. The consumer's task
    /// runs it every `sweep_interval`.
    pub async fn sweep(&self) -> Result<SweepReport, ConsumerError> {
        let Ordering::Strict { park_timeout } = self.inner.config.ordering else {
            return Ok(SweepReport::default());
        };
        let sql = &self.inner.sql;
        let name = &*self.inner.name;
        let mut report = SweepReport::default();
        let (ready, expired) = {
            let mut conn = self
                .inner
                .pool
                .acquire()
                .await
                .map_err(self.db_error("acquiring a connection"))?;
            let ready = sql
                .ready_parked(&mut conn, name)
                .await
                .map_err(self.db_error("finding ready parked messages"))?;
            let expired = sql
                .expired_parked(&mut conn, name, park_timeout.as_secs_f64())
                .await
                .map_err(self.db_error("finding expired parked messages"))?;
            (ready, expired)
        };
        for (aggregate_type, aggregate_id) in ready {
            match self.drain(&aggregate_type, &aggregate_id).await {
                Ok(applied) => report.applied += applied,
                Err(error) => {
                    tracing::warn!(consumer = %name, aggregate_type, aggregate_id, %error, "draining parked messages failed")
                }
            }
        }
        for (aggregate_type, aggregate_id, _, _) in expired {
            match self
                .expire(&aggregate_type, &aggregate_id, park_timeout)
                .await
            {
                Ok(moved) => report.dead_lettered += moved,
                Err(error) => {
                    tracing::warn!(consumer = %name, aggregate_type, aggregate_id, %error, "expiring parked messages failed")
                }
            }
        }
        Ok(report)
    }

    /// Moves an aggregate's parked messages to the dead letters when, under
    /// its position lock, the next version is still missing and the oldest
    /// parked message is still past the timeout.
    async fn expire(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        park_timeout: std::time::Duration,
    ) -> Result<u64, ConsumerError> {
        let sql = &self.inner.sql;
        let name = &*self.inner.name;
        let mut tx = self.begin().await?;
        let position = sql
            .lock_position(&mut tx, name, aggregate_type, aggregate_id)
            .await
            .map_err(self.db_error("locking the aggregate position"))?;
        let reason = format!(
            "strict ordering: version {} of {aggregate_type}/{aggregate_id} did not arrive within {park_timeout:?} (position {position}); the later versions waited for it",
            position + 1
        );
        let moved = sql
            .expire_parked(
                &mut tx,
                name,
                (aggregate_type, aggregate_id),
                position,
                park_timeout.as_secs_f64(),
                &reason,
            )
            .await
            .map_err(self.db_error("dead-lettering parked messages"))?;
        tx.commit()
            .await
            .map_err(self.db_error("committing dead letters"))?;
        if moved > 0 {
            tracing::warn!(consumer = %name, aggregate_type, aggregate_id, moved, "parked messages expired");
            metrics::counter!(m::CONSUMER_DEAD_LETTERED, "consumer" => name.to_owned())
                .increment(moved);
            metrics::counter!(m::CONSUMER_MESSAGES, "consumer" => name.to_owned(), "outcome" => "dead_lettered")
                .increment(moved);
        }
        Ok(moved)
    }

    /// A message of an event type this consumer skips: under strict
    /// ordering it still moves the aggregate's position (versions count
    /// across all event types of an aggregate), otherwise it is only
    /// acknowledged.
    async fn skip_one(&self, envelope: Envelope) -> Result<Outcome, ConsumerError> {
        if !self.tracks(&envelope) {
            return Ok(Outcome::Ignored);
        }
        let mut tx = self.begin().await?;
        if !self.claim(&mut tx, envelope.id).await? {
            return Ok(Outcome::Duplicate);
        }
        let outcome = self.pass_skipped(&mut tx, &envelope).await?;
        tx.commit()
            .await
            .map_err(self.db_error("committing a skipped message"))?;
        if outcome == Outcome::Ignored {
            self.drain_logged(&envelope.aggregate_type, &envelope.aggregate_id)
                .await;
        }
        Ok(outcome)
    }

    /// A skipped message through the strict gate: stale, parked, or it
    /// moves the position (`Ignored`).
    async fn pass_skipped(
        &self,
        tx: &mut PgConnection,
        envelope: &Envelope,
    ) -> Result<Outcome, ConsumerError> {
        Ok(match self.gate(tx, envelope).await? {
            Gate::Stale(position) => Outcome::Stale { position },
            Gate::Park(waiting_for) => {
                self.park(tx, envelope).await?;
                Outcome::Parked { waiting_for }
            }
            Gate::Go => {
                self.set_position(tx, envelope).await?;
                Outcome::Ignored
            }
        })
    }

    /// Whether a skipped message still counts for ordering: strict, and of
    /// an aggregate type this consumer handles.
    fn tracks(&self, envelope: &Envelope) -> bool {
        self.is_strict()
            && self
                .inner
                .handlers
                .values()
                .any(|h| h.aggregate_type() == envelope.aggregate_type)
    }

    fn record_lag(&self, envelope: &Envelope) {
        let lag = (Utc::now() - envelope.occurred_at)
            .num_microseconds()
            .unwrap_or(0) as f64
            / 1e6;
        metrics::gauge!(m::CONSUMER_LAG, "consumer" => Arc::clone(&self.inner.name))
            .set(lag.max(0.0));
    }

    pub(crate) fn record(&self, outcome: &Outcome) {
        let consumer = Arc::clone(&self.inner.name);
        metrics::counter!(
            m::CONSUMER_MESSAGES,
            "consumer" => consumer.clone(),
            "outcome" => outcome.label(),
        )
        .increment(1);
        match outcome {
            Outcome::Duplicate => {
                metrics::counter!(m::CONSUMER_DUPLICATES, "consumer" => consumer).increment(1);
            }
            Outcome::Quarantined { .. } => {
                metrics::counter!(m::CONSUMER_QUARANTINED, "consumer" => consumer).increment(1);
            }
            Outcome::DeadLettered { .. } => {
                metrics::counter!(m::CONSUMER_DEAD_LETTERED, "consumer" => consumer).increment(1);
            }
            _ => {}
        }
    }
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

/// A handler that caught a statement error and returned `Ok` leaves the
/// transaction failed; PostgreSQL would turn the COMMIT into a silent
/// ROLLBACK and the message would be acknowledged without its effect. One
/// trivial statement finds out (sqlx does not expose the server's
/// transaction status).
async fn transaction_intact(tx: &mut PgConnection) -> Result<(), HandlerError> {
    match sqlx::query("SELECT 1").execute(&mut *tx).await {
        Ok(_) => Ok(()),
        Err(error)
            if error
                .as_database_error()
                .and_then(|e| e.code())
                .is_some_and(|code| code == "25P02") =>
        {
            Err(HandlerError::retryable(
                "the handler returned Ok, but a statement in its transaction failed (an error was swallowed); rolled back",
            ))
        }
        Err(error) => Err(HandlerError::retryable(error)),
    }
}

/// PostgreSQL text and jsonb cannot hold NUL characters; a message that
/// carries one in an attribute or as `\u0000` in its payload is refused
/// before any statement would fail on it.
fn unstorable(incoming: &Incoming) -> Option<String> {
    if let Some((name, _)) = incoming
        .attributes()
        .iter()
        .find(|(name, value)| name.contains('\0') || value.contains('\0'))
    {
        return Some(format!(
            "attribute {:?} contains a NUL character, which PostgreSQL text cannot store",
            name.replace('\0', "\\0")
        ));
    }
    let payload = incoming.payload();
    if payload.contains(&0) || payload.windows(6).any(|w| w == b"\\u0000") {
        return Some(
            "the payload contains a NUL character, which PostgreSQL jsonb cannot store".into(),
        );
    }
    None
}
