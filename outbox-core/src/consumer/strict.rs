//! Strict ordering's second half: messages that came early wait in the
//! parked table and are applied, one transaction each, once their
//! predecessor committed; a parked message whose handler fails waits for
//! the same backoff as a redelivery; a sweep applies what a crash left and
//! settles aggregates that waited too long, either by starting a
//! never-started aggregate at its lowest parked version
//! ([`StrictStart::LowestSeen`](super::StrictStart)) or by moving the
//! waiting messages to the dead letters, naming the missing version.
//! Event types a strict consumer skips still move positions (`skip_one`).

use std::time::Duration;

use super::Consumer;
use super::config::{Ordering, StrictStart};
use super::incoming::{Incoming, Outcome};
use super::process::{ConsumerError, Gate, Prepared};
use super::store::{ConsumerStore, StoreConnection};
use super::store::{ExpiredAggregate, LetterKind};
use crate::envelope::Envelope;
use crate::metrics as m;

/// How long a parked message whose start was counted belongs to the
/// instance that counted it. Other instances' sweeps do not start it again
/// within this time (each would count a start of its own while the first
/// is still on its way to the handler, using up `max_attempts` on a message
/// that never failed); after it, a start whose instance died is taken
/// again. A failed handler replaces the lease with its backoff, a success
/// removes the message.
pub(crate) const PARKED_LEASE: Duration = Duration::from_secs(10);

/// What a sweep of parked messages did (strict ordering).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Parked messages applied because their predecessor had arrived (or
    /// their aggregate was started at them).
    pub applied: u64,
    /// Aggregates never started before whose lowest parked version became
    /// their start ([`StrictStart::LowestSeen`]).
    pub started: u64,
    /// Parked messages moved to the dead letters after the park timeout.
    pub dead_lettered: u64,
}

impl<S: ConsumerStore> Consumer<S> {
    pub(super) async fn set_position(
        &self,
        tx: &mut StoreConnection<S>,
        envelope: &Envelope,
    ) -> Result<(), ConsumerError> {
        self.inner
            .store
            .set_position(tx, &self.inner.name, envelope)
            .await
            .map_err(self.db_error("setting the aggregate position"))
    }

    pub(super) async fn park(
        &self,
        tx: &mut StoreConnection<S>,
        envelope: &Envelope,
    ) -> Result<(), ConsumerError> {
        self.inner
            .store
            .park(tx, &self.inner.name, envelope)
            .await
            .map_err(self.db_error("parking a message"))
    }

    pub(super) async fn drain_logged(&self, aggregate_type: &str, aggregate_id: &str) {
        if let Err(error) = self.drain(aggregate_type, aggregate_id).await {
            // The sweep finds the parked successors again.
            tracing::warn!(consumer = %self.inner.name, %error, "draining parked messages failed");
        }
    }

    /// Applies the parked successors of an aggregate, each in its own
    /// transaction, until the next one is missing, waits for its backoff,
    /// or fails.
    async fn drain(&self, aggregate_type: &str, aggregate_id: &str) -> Result<u64, ConsumerError> {
        let sql = &self.inner.store;
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
                    .start_parked(
                        &mut tx,
                        name,
                        aggregate,
                        position.version.saturating_add(1),
                        PARKED_LEASE,
                    )
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
            crate::failpoint::hit(crate::failpoint::CONSUMER_DRAIN_BETWEEN).await;
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
            // Another instance may have applied or dead-lettered it between
            // the two transactions.
            let still_parked = sql
                .lock_parked(&mut tx, name, envelope.id)
                .await
                .map_err(self.db_error("locking a parked message"))?;
            if !still_parked || envelope.aggregate_version != position.version.saturating_add(1) {
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
                        Ok(()) => self.inner.store.transaction_intact(&mut tx).await,
                        failed => failed,
                    }
                }
                // An event type this consumer skips: it only moves the position.
                Prepared::Ignored { .. } | Prepared::Foreign => Ok(()),
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
                    let retry = &self.inner.config.retry;
                    let still_parked = sql
                        .parked_failed(
                            &mut tx,
                            name,
                            envelope.id,
                            &error.to_string(),
                            retry.backoff.delay(parked.attempts),
                        )
                        .await
                        .map_err(self.db_error("recording a parked message's failure"))?;
                    if still_parked
                        && (error.is_permanent() || parked.attempts >= retry.max_attempts)
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

    /// Moves a parked message to the quarantine or the dead letters (its
    /// inbox row goes: it was not applied), commits, and counts it.
    async fn settle_parked(
        &self,
        mut tx: sqlx::Transaction<'static, S::Db>,
        kind: LetterKind,
        incoming: &Incoming,
        envelope: &Envelope,
        reason: String,
    ) -> Result<(), ConsumerError> {
        let sql = &self.inner.store;
        sql.unpark(&mut tx, &self.inner.name, envelope.id)
            .await
            .map_err(self.db_error("removing a parked message"))?;
        sql.forget_processed(&mut tx, &self.inner.name, envelope.id)
            .await
            .map_err(self.db_error("releasing an inbox row"))?;
        self.write_letter(&mut tx, kind, incoming, Some(envelope), &reason)
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

    /// Strict ordering: applies parked messages whose predecessor has
    /// arrived (after a crash between a commit and its drain) or whose
    /// backoff is over, and settles aggregates whose oldest parked message
    /// waited longer than the park timeout: a never-started aggregate
    /// starts at its lowest parked version under
    /// [`StrictStart::LowestSeen`]; otherwise the parked messages go to the
    /// dead letters, naming the missing version. One aggregate's failure
    /// does not stop the others. The consumer's task runs it every
    /// `sweep_interval`.
    pub async fn sweep(&self) -> Result<SweepReport, ConsumerError> {
        let Ordering::Strict { park_timeout } = self.inner.config.ordering else {
            return Ok(SweepReport::default());
        };
        let sql = &self.inner.store;
        let name = &*self.inner.name;
        let mut report = SweepReport::default();
        let (ready, expired) = {
            let mut conn = self.acquire().await?;
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
        for ExpiredAggregate {
            aggregate_type,
            aggregate_id,
            ..
        } in expired
        {
            match self
                .expire(&aggregate_type, &aggregate_id, park_timeout)
                .await
            {
                Ok(Expired::Started { applied }) => {
                    report.started += 1;
                    report.applied += applied;
                }
                Ok(Expired::DeadLettered(moved)) => report.dead_lettered += moved,
                Err(error) => {
                    tracing::warn!(consumer = %name, aggregate_type, aggregate_id, %error, "expiring parked messages failed")
                }
            }
        }
        Ok(report)
    }

    /// Settles an aggregate whose parked messages waited past the timeout,
    /// under its position lock (one held elsewhere: not now). A never-started aggregate, when the
    /// consumer starts strict aggregates at the lowest version seen, starts
    /// at the lowest version that arrived: a parked one (applied from
    /// there), or one in a letter (then nothing above it may start the
    /// aggregate, and the parked messages wait behind the letter). Parked
    /// messages whose missing predecessor still has not come move to the
    /// dead letters, their reason naming the letter that holds it, if one
    /// does.
    async fn expire(
        &self,
        aggregate_type: &str,
        aggregate_id: &str,
        park_timeout: std::time::Duration,
    ) -> Result<Expired, ConsumerError> {
        let sql = &self.inner.store;
        let name = &*self.inner.name;
        let aggregate = (aggregate_type, aggregate_id);
        let mut tx = self.begin().await?;
        // An aggregate whose position is locked has a message in hand on
        // some instance right now (its handler may be about to fail and
        // retry): it is left for the next sweep rather than settled the
        // instant that handler lets go.
        let Some(mut position) = sql
            .try_lock_position(&mut tx, name, aggregate_type, aggregate_id)
            .await
            .map_err(self.db_error("locking the aggregate position"))?
        else {
            tx.commit()
                .await
                .map_err(self.db_error("ending a sweep's look"))?;
            return Ok(Expired::DeadLettered(0));
        };
        if !position.pinned && self.inner.config.strict_start == StrictStart::LowestSeen {
            let start = sql
                .baseline(&mut tx, name, aggregate)
                .await
                .map_err(self.db_error("starting an aggregate at its lowest version seen"))?;
            match start {
                Some((version, true)) => {
                    tx.commit()
                        .await
                        .map_err(self.db_error("committing an aggregate's start"))?;
                    tracing::info!(
                        consumer = %name, aggregate_type, aggregate_id, first_version = version + 1,
                        "strict ordering: an aggregate this consumer never saw before starts at its lowest version that arrived"
                    );
                    metrics::counter!(m::CONSUMER_STRICT_STARTS, "consumer" => name.to_owned())
                        .increment(1);
                    let applied = self.drain(aggregate_type, aggregate_id).await?;
                    return Ok(Expired::Started { applied });
                }
                // Its lowest version is in a letter: the aggregate starts
                // there, and what is parked waits behind it.
                Some((version, false)) => position.version = version,
                None => {
                    tx.commit()
                        .await
                        .map_err(self.db_error("committing an aggregate's start"))?;
                    return Ok(Expired::DeadLettered(0));
                }
            }
        }
        let missing = position.version.saturating_add(1);
        let hole = sql
            .open_letter_at(&mut tx, name, aggregate, missing)
            .await
            .map_err(self.db_error("looking for the letter of a missing version"))?;
        let reason = match hole {
            Some((letter, kind)) => format!(
                "strict ordering: version {missing} of {aggregate_type}/{aggregate_id} is in this consumer's {} (letter {letter}); the later versions waited for it past {park_timeout:?} (position {}): replay the letters in version order once it can be applied",
                if kind == "quarantined" {
                    "quarantine"
                } else {
                    "dead letters"
                },
                position.version
            ),
            None => format!(
                "strict ordering: version {missing} of {aggregate_type}/{aggregate_id} did not arrive within {park_timeout:?} (position {}); the later versions waited for it",
                position.version
            ),
        };
        let moved = sql
            .expire_parked(
                &mut tx,
                name,
                aggregate,
                position.version,
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
        Ok(Expired::DeadLettered(moved))
    }

    /// A message of an event type this consumer skips: under strict
    /// ordering it still moves the aggregate's position (versions count
    /// across all event types of an aggregate), otherwise it is only
    /// acknowledged.
    pub(super) async fn skip_one(&self, envelope: Envelope) -> Result<Outcome, ConsumerError> {
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
    pub(super) async fn pass_skipped(
        &self,
        tx: &mut StoreConnection<S>,
        envelope: &Envelope,
    ) -> Result<Outcome, ConsumerError> {
        Ok(match self.gate(tx, envelope).await? {
            // Nothing to apply below the start either: a skipped type only
            // moves positions.
            Gate::Stale(position) => Outcome::Stale { position },
            Gate::BeforeStart { .. } => Outcome::Stale { position: None },
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
    pub(super) fn tracks(&self, envelope: &Envelope) -> bool {
        self.is_strict()
            && self
                .inner
                .handlers
                .values()
                .any(|h| h.aggregate_type() == envelope.aggregate_type)
    }
}

/// What settling an expired aggregate did.
enum Expired {
    /// It was started at its lowest parked version; this many applied.
    Started { applied: u64 },
    /// This many parked messages went to the dead letters.
    DeadLettered(u64),
}
