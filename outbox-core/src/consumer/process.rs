//! One message through the inbox, the ordering policy, the handler and the
//! commit; what the other paths (batches in `batch.rs`, strict ordering's
//! parked messages in `strict.rs`, replays in `replay.rs`) share.
//!
//! The inbox holds an event once its effect committed (or, under strict
//! ordering, once it is parked or passed over). Quarantined and
//! dead-lettered messages hold no inbox row: they were not applied, so a
//! replay after a fix can apply them once. At most one open letter exists
//! per (consumer, event), and none for an event the consumer applied.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use futures_util::FutureExt;
use tracing::Instrument;
use uuid::Uuid;

use super::Consumer;
use super::config::Ordering;
use super::handler::{Decoded, Dispatch, EventMeta, HandlerError};
use super::incoming::{Incoming, Outcome};
use super::store::{CheckedCommit, ConsumerStore, StoreConnection};
use super::store::{Letter, LetterKind, Position, StrictClaim};
use crate::envelope::Envelope;
use crate::metrics as m;
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

/// Why a handler's `Ok` is not taken when it ended the consumer's
/// transaction itself: the stores'
/// [`ConsumerStore::transaction_intact`](super::ConsumerStore::transaction_intact)
/// finds the savepoint the consumer took when it began gone.
pub const HANDLER_ENDED_TRANSACTION: &str = "the handler returned Ok, but it ended the consumer's transaction itself (ROLLBACK or COMMIT on the connection it was given); the inbox row and the position did not commit with its effects, so the message is retried";

/// The error of a handler that returned `Ok` after a statement of its
/// transaction failed (stores that can tell, such as PostgreSQL with its
/// aborted-transaction state, report it with this text).
pub const SWALLOWED: &str = "the handler returned Ok, but a statement in its transaction failed (an error was swallowed); rolled back";

/// A message read and matched with its handler, or why it cannot be.
pub(super) enum Prepared<'a, C> {
    Ready {
        envelope: Envelope,
        dispatch: &'a dyn Dispatch<C>,
        decoded: Decoded,
    },
    Unreadable {
        envelope: Option<Envelope>,
        reason: String,
    },
    /// A known event type of one of this consumer's aggregate types that it
    /// has no handler for.
    Ignored { envelope: Envelope },
    /// An event of an aggregate type this consumer does not handle.
    Foreign,
}

/// What the ordering policy says about a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Gate {
    /// Apply it.
    Go,
    /// At or below the position: passed over.
    Stale(Option<i64>),
    /// Strict: below the version the aggregate started at, so never
    /// applied here: it goes to the dead letters with that reason.
    BeforeStart { start: i64, position: i64 },
    /// Strict: a predecessor is missing; it waits for this version.
    Park(i64),
}

/// Strict ordering's decision for `version` at `position`.
pub(super) fn strict_gate(position: &Position, version: i64) -> Gate {
    if version <= position.version {
        match position.start_version {
            Some(start) if version < start => Gate::BeforeStart {
                start,
                position: position.version,
            },
            _ => Gate::Stale(Some(position.version)),
        }
    } else if version > position.version + 1 {
        // A version past a gap always waits first, whatever the pin: one
        // that overtook a failing predecessor, or reached this instance
        // first, must not be taken for the start.
        Gate::Park(position.version + 1)
    } else {
        Gate::Go
    }
}

impl<S: ConsumerStore> Consumer<S> {
    pub(super) fn db_error(
        &self,
        doing: &'static str,
    ) -> impl FnOnce(sqlx::Error) -> ConsumerError + '_ {
        move |source| ConsumerError {
            consumer: self.inner.name.to_string(),
            doing,
            source,
        }
    }

    /// Begins a message's transaction (statements cut off after the
    /// handler timeout where the store can).
    pub(super) async fn begin(&self) -> Result<sqlx::Transaction<'static, S::Db>, ConsumerError> {
        self.inner
            .store
            .begin(self.inner.config.retry.handler_timeout)
            .await
            .map_err(self.db_error("beginning a transaction"))
    }

    /// Begins a batch's transaction as [`begin`](Self::begin) does.
    pub(super) async fn begin_batch(
        &self,
    ) -> Result<sqlx::Transaction<'static, S::Db>, ConsumerError> {
        self.inner
            .store
            .begin_batch(self.inner.config.retry.handler_timeout)
            .await
            .map_err(self.db_error("beginning a transaction"))
    }

    /// A connection of the consumer's store, outside any transaction.
    pub(super) async fn acquire(&self) -> Result<sqlx::pool::PoolConnection<S::Db>, ConsumerError> {
        self.inner
            .store
            .acquire()
            .await
            .map_err(self.db_error("acquiring a connection"))
    }

    /// Processes one message in its own transaction and says whether to
    /// acknowledge it. Errors only when the database cannot be reached;
    /// then nothing was committed and the message must come again.
    pub async fn handle(&self, incoming: &Incoming) -> Result<Outcome, ConsumerError> {
        let prepared = self.prepare(incoming);
        let outcome = match prepared {
            Prepared::Foreign => Outcome::Foreign,
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

    /// Reads the envelope, finds the handler, decodes and upcasts. Why a
    /// message is unreadable is stored, logged and shown to operators, so
    /// its reason is made printable here, once: it quotes external text
    /// (a header's value or name, a parser's error), and a NUL in it would
    /// fail PostgreSQL's `text` at every delivery.
    pub(super) fn prepare<'a>(&'a self, incoming: &Incoming) -> Prepared<'a, StoreConnection<S>> {
        match self.read_message(incoming) {
            Prepared::Unreadable { envelope, reason } => Prepared::Unreadable {
                envelope,
                reason: crate::redact::printable(&reason).into_owned(),
            },
            prepared => prepared,
        }
    }

    fn read_message<'a>(&'a self, incoming: &Incoming) -> Prepared<'a, StoreConnection<S>> {
        if let Some(problem) = incoming.problem() {
            return Prepared::Unreadable {
                envelope: None,
                reason: format!("cannot read the message: {problem}"),
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
        if !self
            .inner
            .aggregate_types
            .contains(envelope.aggregate_type.as_str())
        {
            return Prepared::Foreign;
        }
        if let Some(reason) = self.inner.store.refuses(incoming, &envelope) {
            return Prepared::Unreadable {
                envelope: None,
                reason,
            };
        }
        if envelope.aggregate_version == i64::MIN || envelope.aggregate_version == i64::MAX {
            // The ordering policies read the version before and after a
            // message's own; at the ends of i64 one of them does not exist,
            // and the statements computing it would fail at every delivery.
            return Prepared::Unreadable {
                envelope: None,
                reason: format!(
                    "aggregate version {} of {}/{} is out of range: versions lie between {} and {}",
                    envelope.aggregate_version,
                    envelope.aggregate_type,
                    envelope.aggregate_id,
                    i64::MIN + 1,
                    i64::MAX - 1
                ),
            };
        }
        let Some(dispatch) = self.inner.handlers.get(envelope.event_type.as_str()) else {
            let known = self.inner.registry.current(&envelope.event_type).is_some();
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
                    crate::redact::scrub_message(&panic_message(&panic))
                ),
                envelope: Some(envelope),
            },
        }
    }

    /// Writes the quarantine row. A message whose event was applied
    /// already, or that is in the quarantine already, is a duplicate.
    /// Under strict ordering a quarantined version 1 fixes its aggregate's
    /// start in the same transaction: its successors wait behind the
    /// letter instead of becoming the start.
    async fn quarantine_one(
        &self,
        incoming: &Incoming,
        envelope: Option<&Envelope>,
        reason: String,
    ) -> Result<Outcome, ConsumerError> {
        let mut tx = self.begin().await?;
        if let Some(envelope) = envelope
            && envelope.aggregate_version == 1
            && self.is_strict()
            && self.tracks(envelope)
        {
            self.inner
                .store
                .pin_first(
                    &mut tx,
                    &self.inner.name,
                    &[(&envelope.aggregate_type, &envelope.aggregate_id)],
                )
                .await
                .map_err(
                    self.db_error("fixing an aggregate's start at its quarantined version 1"),
                )?;
        }
        let written = self
            .write_letter(
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
        if !written {
            return Ok(Outcome::Duplicate);
        }
        tracing::warn!(
            consumer = %self.inner.name,
            event_id = ?envelope.map(|e| e.id),
            event_type = ?envelope.map(|e| e.event_type.as_str()),
            %reason,
            "message quarantined"
        );
        Ok(Outcome::Quarantined { reason })
    }

    async fn apply_one(
        &self,
        incoming: &Incoming,
        envelope: Envelope,
        dispatch: &dyn Dispatch<StoreConnection<S>>,
        decoded: Decoded,
    ) -> Result<Outcome, ConsumerError> {
        self.pin_first_starts([&envelope]).await?;
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
        let max_attempts = self.inner.config.retry.max_attempts;
        if start > max_attempts {
            let reason = format!(
                "the handler was started {} times without an outcome (the process crashed, hung or lost its database connection each time); not started again",
                start - 1
            );
            return self
                .dead_letter(incoming, &envelope, reason, start - 1)
                .await;
        }
        let mut tx = self.begin().await?;
        let Some((gate, moved)) = self.claim_and_gate(&mut tx, &envelope).await? else {
            if redelivered {
                self.forget_starts(&mut tx, envelope.id).await?;
                tx.commit()
                    .await
                    .map_err(self.db_error("committing a duplicate"))?;
            }
            return Ok(Outcome::Duplicate);
        };
        // A redelivery's start count is settled with the transaction that
        // settles the message (kept when it rolls back); deleted at each
        // commit below, not before the handler: a failing start records its
        // retry in that row while its transaction still holds the position.
        match gate {
            Gate::Go => {}
            Gate::Stale(position) => {
                if redelivered {
                    self.forget_starts(&mut tx, envelope.id).await?;
                }
                tx.commit()
                    .await
                    .map_err(self.db_error("committing a stale message"))?;
                return Ok(Outcome::Stale { position });
            }
            Gate::BeforeStart { start: first, .. } => {
                let _ = tx.rollback().await;
                let reason = before_start_reason(&envelope, first);
                return self
                    .dead_letter(incoming, &envelope, reason, incoming.attempt())
                    .await;
            }
            Gate::Park(waiting_for) => {
                if redelivered {
                    self.forget_starts(&mut tx, envelope.id).await?;
                }
                self.park(&mut tx, &envelope).await?;
                tx.commit()
                    .await
                    .map_err(self.db_error("committing a parked message"))?;
                return Ok(Outcome::Parked { waiting_for });
            }
        }
        // The transaction is checked at its commit when no statement of
        // ours follows the handler: a redelivery deletes its start count,
        // and a strict position not moved by the claim is moved after the
        // handler, so those are checked before that statement.
        let check_at_commit = !redelivered && (moved.is_some() || !self.is_strict());
        let result = match self
            .run_handler(dispatch, decoded, &envelope, start, &mut tx)
            .await
        {
            Ok(()) => {
                self.after_handler(&mut tx, &envelope, moved, check_at_commit)
                    .await?
            }
            Err(error) => Err(error),
        };
        if redelivered && result.is_ok() {
            self.forget_starts(&mut tx, envelope.id).await?;
        }
        let (tx, error) = match result {
            Ok(successor_parked) => match self
                .commit_handled(tx, check_at_commit)
                .await
                .map_err(self.db_error("committing the handler's transaction"))?
            {
                CheckedCommit::Committed => {
                    crate::failpoint::hit(crate::failpoint::CONSUMER_AFTER_COMMIT).await;
                    self.record_lag(&envelope);
                    if successor_parked {
                        self.drain_logged(&envelope.aggregate_type, &envelope.aggregate_id)
                            .await;
                    }
                    return Ok(Outcome::Applied);
                }
                CheckedCommit::HandlerFailed(tx, error) => (tx, error),
            },
            Err(error) => (tx, error),
        };
        // A start that will be retried is recorded as due back
        // before the transaction lets go of the position: a sweep
        // that takes the position next finds the predecessor on
        // its way and keeps the successors waiting for it.
        let retried = !error.is_permanent() && start < max_attempts;
        if retried && self.tracks(&envelope) {
            let delay = self.inner.config.retry.backoff.delay(start);
            self.inner
                .store
                .roll_back_for_retry(tx, &self.inner.name, &envelope, delay)
                .await
                .map_err(self.db_error("recording a retry"))?;
        } else {
            let _ = tx.rollback().await;
        }
        self.after_failure(incoming, &envelope, start, error).await
    }

    /// Commits a handler's transaction, checked on the way
    /// ([`ConsumerStore::commit_checked`]) unless `after_handler` checked
    /// it already.
    async fn commit_handled(
        &self,
        tx: sqlx::Transaction<'static, S::Db>,
        check: bool,
    ) -> sqlx::Result<CheckedCommit<S::Db>> {
        if check {
            self.inner.store.commit_checked(tx).await
        } else {
            tx.commit().await?;
            Ok(CheckedCommit::Committed)
        }
    }

    /// Under strict ordering, fixes the start of the never-started
    /// aggregates whose version 1 is among `envelopes`, in its own
    /// committed statement, before any handler starts on them: a failure,
    /// a crash or a letter of that version 1 then holds its successors
    /// (they park, then go to the dead letters behind it) instead of a
    /// sweep on another instance making a later version the start.
    pub(super) async fn pin_first_starts<'e>(
        &self,
        envelopes: impl IntoIterator<Item = &'e Envelope>,
    ) -> Result<(), ConsumerError> {
        if !self.is_strict() {
            return Ok(());
        }
        let mut firsts: Vec<(&str, &str)> = envelopes
            .into_iter()
            .filter(|e| e.aggregate_version == 1 && self.tracks(e))
            .map(|e| (e.aggregate_type.as_str(), e.aggregate_id.as_str()))
            .collect();
        if firsts.is_empty() {
            return Ok(());
        }
        firsts.sort_unstable();
        firsts.dedup();
        let mut conn = self.acquire().await?;
        self.inner
            .store
            .pin_first(&mut conn, &self.inner.name, &firsts)
            .await
            .map_err(self.db_error("fixing an aggregate's start before its first handler"))
    }

    /// Records the event in the inbox and applies the ordering policy, in
    /// one round trip; `None` for a duplicate. With `Gate::Go`, whether
    /// the position was already moved to this version (and then whether
    /// its successor waits parked).
    async fn claim_and_gate(
        &self,
        tx: &mut StoreConnection<S>,
        envelope: &Envelope,
    ) -> Result<Option<(Gate, Option<bool>)>, ConsumerError> {
        let sql = &self.inner.store;
        let name = &*self.inner.name;
        match self.inner.config.ordering {
            Ordering::Unordered => Ok(self
                .claim(tx, envelope.id)
                .await?
                .then_some((Gate::Go, Some(false)))),
            Ordering::RejectStale => Ok(sql
                .claim_stale(tx, name, envelope)
                .await
                .map_err(self.db_error("recording the event and moving its position"))?
                .map(|moved| {
                    if moved {
                        (Gate::Go, Some(false))
                    } else {
                        (Gate::Stale(None), None)
                    }
                })),
            Ordering::Strict { .. } => Ok(sql
                .claim_strict(tx, name, envelope)
                .await
                .map_err(self.db_error("recording the event and its aggregate's position"))?
                .map(|claim| match claim {
                    StrictClaim::Advanced { successor_parked } => {
                        (Gate::Go, Some(successor_parked))
                    }
                    StrictClaim::Locked(position) => {
                        (strict_gate(&position, envelope.aggregate_version), None)
                    }
                })),
        }
    }

    /// After a handler returned `Ok`: finds a transaction the handler left
    /// failed by swallowing an error, or ended itself (then a failed
    /// attempt), and, under strict ordering when the claim did not move
    /// the position yet (`moved` is `None`), moves it and says whether the
    /// next version waits parked. Returns whether a successor waits
    /// parked. With `check_at_commit` (only where the claim moved the
    /// position, or no position is kept), the transaction is not checked
    /// here: the caller commits it with [`ConsumerStore::commit_checked`]
    /// and runs nothing in between (one round trip less per message on
    /// PostgreSQL).
    pub(super) async fn after_handler(
        &self,
        tx: &mut StoreConnection<S>,
        envelope: &Envelope,
        moved: Option<bool>,
        check_at_commit: bool,
    ) -> Result<Result<bool, HandlerError>, ConsumerError> {
        if moved.is_some() || !self.is_strict() {
            // No position to move: only the check, unless the commit does it.
            if !check_at_commit && let Err(failed) = self.inner.store.transaction_intact(tx).await {
                return Ok(Err(failed));
            }
            return Ok(Ok(moved.unwrap_or(false)));
        }
        // Checked first: a handler that ended the transaction would have
        // the position's move commit on its own.
        if let Err(ended) = self.inner.store.transaction_intact(tx).await {
            return Ok(Err(ended));
        }
        let settle = self
            .inner
            .store
            .settle_strict(tx, &self.inner.name, envelope)
            .await;
        match settle {
            Ok(successor_parked) => Ok(Ok(successor_parked)),
            Err(error) if self.inner.store.is_failed_transaction(&error) => {
                Ok(Err(HandlerError::retryable(SWALLOWED)))
            }
            Err(error) => Err(self.db_error("setting the aggregate position")(error)),
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
        self.dead_letter(incoming, envelope, reason, attempt).await
    }

    /// Writes a dead letter (no inbox row: a replay can apply it once) and
    /// drops the message's start count, in one transaction. A message that
    /// another instance applied (or dead-lettered) meanwhile is a duplicate.
    async fn dead_letter(
        &self,
        incoming: &Incoming,
        envelope: &Envelope,
        reason: String,
        attempts: u32,
    ) -> Result<Outcome, ConsumerError> {
        let mut tx = self.begin().await?;
        let letter = Letter {
            kind: LetterKind::DeadLettered,
            envelope: Some(envelope),
            headers: incoming.headers_json(),
            payload: incoming.payload(),
            reason: &crate::redact::printable(&reason),
            attempts,
        };
        let written = self
            .inner
            .store
            .letter(&mut tx, &self.inner.name, &letter)
            .await
            .map_err(self.db_error("writing a dead letter"))?;
        self.forget_starts(&mut tx, envelope.id).await?;
        tx.commit()
            .await
            .map_err(self.db_error("committing a dead letter"))?;
        if !written {
            return Ok(Outcome::Duplicate);
        }
        tracing::warn!(
            consumer = %self.inner.name, event_id = %envelope.id,
            event_type = %envelope.event_type, attempts, %reason, "message moved to dead letters"
        );
        Ok(Outcome::DeadLettered { reason })
    }

    /// Runs a handler with its deadline, its trace context, and panics
    /// turned into errors.
    pub(super) async fn run_handler(
        &self,
        dispatch: &dyn Dispatch<StoreConnection<S>>,
        decoded: Decoded,
        envelope: &Envelope,
        attempt: u32,
        tx: &mut StoreConnection<S>,
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
        let failure = match result {
            Ok(Ok(Ok(()))) => return Ok(()),
            Ok(Ok(Err(error))) => error,
            Ok(Err(panic)) => {
                HandlerError::retryable(format!("handler panicked: {}", panic_message(&panic)))
            }
            Err(_) => {
                return Err(HandlerError::retryable(format!(
                    "handler timed out after {timeout:?}"
                )));
            }
        };
        Err(self.redacted(failure, dispatch, envelope))
    }

    /// A handler's failure as everything after it may show and store it:
    /// its text without the event's redacted values (those of the version
    /// it was written with and of the handler's version). The one place
    /// handler error text passes through on its way to outcomes, logs,
    /// letters and parked messages.
    fn redacted(
        &self,
        failure: HandlerError,
        dispatch: &dyn Dispatch<StoreConnection<S>>,
        envelope: &Envelope,
    ) -> HandlerError {
        let raw: serde_json::Value =
            serde_json::from_str(envelope.payload.get()).unwrap_or(serde_json::Value::Null);
        let written_with = self
            .inner
            .registry
            .get(&envelope.event_type, envelope.schema_version)
            .map(|contract| contract.redacted_fields);
        let mut secrets = crate::redact::secret_values(&raw, written_with);
        secrets.extend(dispatch.secrets(envelope));
        secrets.sort_unstable_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        secrets.dedup();
        let message = crate::redact::scrub_with_secrets(&failure.to_string(), &secrets);
        failure.with_message(crate::redact::printable(&message).into_owned())
    }

    async fn count_start(&self, event_id: Uuid) -> Result<u32, ConsumerError> {
        let mut conn = self.acquire().await?;
        self.inner
            .store
            .count_start(&mut conn, &self.inner.name, event_id)
            .await
            .map_err(self.db_error("counting a handler start"))
    }

    async fn forget_starts(
        &self,
        tx: &mut StoreConnection<S>,
        event_id: Uuid,
    ) -> Result<(), ConsumerError> {
        self.inner
            .store
            .forget_starts(tx, &self.inner.name, event_id)
            .await
            .map_err(self.db_error("clearing a handler start count"))
    }

    pub(super) fn is_strict(&self) -> bool {
        matches!(self.inner.config.ordering, Ordering::Strict { .. })
    }

    pub(super) async fn claim(
        &self,
        tx: &mut StoreConnection<S>,
        event_id: Uuid,
    ) -> Result<bool, ConsumerError> {
        self.inner
            .store
            .claim_one(tx, &self.inner.name, event_id)
            .await
            .map_err(self.db_error("recording the event in the inbox"))
    }

    /// The ordering policy on the aggregate's position (locked under
    /// strict ordering until the transaction ends), for an event already
    /// recorded in the inbox (replays, skipped types).
    pub(super) async fn gate(
        &self,
        tx: &mut StoreConnection<S>,
        envelope: &Envelope,
    ) -> Result<Gate, ConsumerError> {
        let sql = &self.inner.store;
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
                Ok(strict_gate(&position, envelope.aggregate_version))
            }
        }
    }

    /// Writes a quarantine or dead-letter row; false when the event was
    /// applied already or has an open letter.
    pub(super) async fn write_letter(
        &self,
        tx: &mut StoreConnection<S>,
        kind: LetterKind,
        incoming: &Incoming,
        envelope: Option<&Envelope>,
        reason: &str,
    ) -> Result<bool, ConsumerError> {
        // Reasons quote aggregate ids and versions (a strict hole's); the
        // reasons of unreadable messages and handler errors are printable
        // already.
        let reason = crate::redact::printable(reason);
        let letter = Letter {
            kind,
            envelope,
            headers: incoming.headers_json(),
            payload: incoming.payload(),
            reason: &reason,
            attempts: incoming.attempt(),
        };
        self.inner
            .store
            .letter(tx, &self.inner.name, &letter)
            .await
            .map_err(self.db_error("writing a quarantine or dead-letter row"))
    }

    pub(super) fn record_lag(&self, envelope: &Envelope) {
        let now = Utc::now();
        let lag =
            ((now - envelope.occurred_at).num_microseconds().unwrap_or(0) as f64 / 1e6).max(0.0);
        metrics::gauge!(m::CONSUMER_LAG, "consumer" => Arc::clone(&self.inner.name)).set(lag);
        self.inner.tally.lag(now, lag);
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
            Outcome::Applied => self.inner.tally.applied(),
            Outcome::Duplicate => {
                self.inner.tally.duplicate();
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

pub(super) fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a non-string panic payload".to_owned()
    }
}

/// Why a strict consumer dead-letters a version below its aggregate's start.
pub(super) fn before_start_reason(envelope: &Envelope, start: i64) -> String {
    format!(
        "strict ordering: version {} of {}/{} arrived after the aggregate was started at version {start} (the lowest version that arrived within the park timeout); it was never applied here",
        envelope.aggregate_version, envelope.aggregate_type, envelope.aggregate_id
    )
}
