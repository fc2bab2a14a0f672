//! Replaying quarantined messages and dead letters into the consumer after
//! a fix (a consumer upgraded to read a new schema version, a handler bug
//! fixed, a missing row created).
//!
//! A replay names its letters by id and carries a [`RepairRequest`] (who
//! and why). Each letter goes through the normal path in one transaction
//! that also closes the letter: the inbox (an event applied meanwhile is
//! not applied again), the ordering policy (under strict ordering a
//! replayed version that is still early is parked and applied in order
//! once its predecessor is there), the handler, the commit. A letter whose
//! replay fails stays open with the error. One audit row records the
//! request and what happened to each letter.

use serde::Serialize;

use super::Consumer;
use super::incoming::{Incoming, Outcome};
use super::process::{ConsumerError, Gate, Prepared};
use super::store::{ConsumerStore, StoreConnection};
use crate::audit::{RepairError, RepairRequest};
use crate::metrics as m;

/// What a replay did with one letter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ReplayOutcome {
    /// The handler ran and committed; the letter is closed.
    Applied,
    /// The consumer had applied the event already; the letter is closed,
    /// nothing was applied again.
    AlreadyApplied,
    /// The aggregate's position is at or past this version: nothing was
    /// applied. Under `RejectStale` that is the policy (a newer version
    /// was applied) and the letter is closed. Under `Strict` the version
    /// was never applied here (an operator passed it, or the aggregate
    /// started above it): the letter stays open as the record of it;
    /// discard it if that is intended.
    Stale {
        /// The position.
        position: Option<i64>,
        /// Whether the letter stays open (strict ordering).
        letter_open: bool,
    },
    /// Strict ordering: its predecessor is still missing; the message now
    /// waits in the parked table (and is applied in order when the
    /// predecessor comes); the letter is closed.
    Parked {
        /// The version it waits for.
        waiting_for: i64,
    },
    /// The consumer has no handler for it (any more); the letter is closed.
    Ignored,
    /// The handler failed again; the letter stays open with this error.
    Failed {
        /// The handler's error.
        error: String,
    },
    /// The message still cannot be read; the letter stays open.
    StillUnreadable {
        /// Why.
        reason: String,
    },
    /// There is no open letter with this id for this consumer.
    NotFound,
}

impl ReplayOutcome {
    /// A short label for metrics and tables.
    pub fn label(&self) -> &'static str {
        match self {
            ReplayOutcome::Applied => "applied",
            ReplayOutcome::AlreadyApplied => "already_applied",
            ReplayOutcome::Stale { .. } => "stale",
            ReplayOutcome::Parked { .. } => "parked",
            ReplayOutcome::Ignored => "ignored",
            ReplayOutcome::Failed { .. } => "failed",
            ReplayOutcome::StillUnreadable { .. } => "still_unreadable",
            ReplayOutcome::NotFound => "not_found",
        }
    }

    /// Whether the letter was closed.
    pub fn resolved(&self) -> bool {
        !matches!(
            self,
            ReplayOutcome::Failed { .. }
                | ReplayOutcome::StillUnreadable { .. }
                | ReplayOutcome::NotFound
                | ReplayOutcome::Stale {
                    letter_open: true,
                    ..
                }
        )
    }

    /// Whether the replay did what it was for: the event is applied (now
    /// or before), or the consumer has no handler for it. Anything else
    /// (stale, parked, failed, still unreadable, not found) is not a
    /// success, whether or not the letter was closed; `outbox … replay
    /// --wait` exits 1 for it.
    pub fn succeeded(&self) -> bool {
        Self::label_succeeded(self.label())
    }

    /// [`succeeded`](Self::succeeded) for an outcome's label, as the audit
    /// row records it.
    pub fn label_succeeded(label: &str) -> bool {
        matches!(label, "applied" | "already_applied" | "ignored")
    }
}

/// What a replay did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayReport {
    /// The audit row that records it.
    pub audit_id: i64,
    /// Each letter id with its outcome, in the order given.
    pub letters: Vec<(i64, ReplayOutcome)>,
}

/// A replay was refused or could not reach the database.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The request was refused before anything changed.
    #[error(transparent)]
    Refused(#[from] RepairError),
    /// The database failed; the letters handled before it keep their
    /// outcome (each had its own transaction), the rest are unchanged.
    #[error(transparent)]
    Database(#[from] ConsumerError),
}

/// A replay an operator asked for: its outcome goes to the request's
/// audit row.
struct Requested {
    audit_id: Option<i64>,
}

impl<S: ConsumerStore> Consumer<S> {
    async fn claim_for_replay(
        &self,
        tx: &mut StoreConnection<S>,
        event_id: uuid::Uuid,
    ) -> Result<bool, ConsumerError> {
        self.inner
            .store
            .claim_replay(tx, &self.inner.name, event_id)
            .await
            .map_err(self.db_error("recording the event in the inbox"))
    }

    /// Replays the open letters `letter_ids` (quarantine or dead letters of
    /// this consumer) through the consumer, one transaction each, and
    /// records the request and every outcome in the audit table.
    ///
    /// ```no_run
    /// # async fn example(consumer: outbox_postgres::PgConsumer) -> Result<(), Box<dyn std::error::Error>> {
    /// use outbox_core::audit::RepairRequest;
    /// let request = RepairRequest::new("ada", "billing upgraded to read order.created v3")?;
    /// let report = consumer.replay(&[41, 42], &request).await?;
    /// for (letter, outcome) in &report.letters {
    ///     println!("{letter}: {}", outcome.label());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn replay(
        &self,
        letter_ids: &[i64],
        request: &RepairRequest,
    ) -> Result<ReplayReport, ReplayError> {
        if letter_ids.is_empty() {
            return Err(RepairError::NoIds.into());
        }
        let ids: Vec<String> = letter_ids.iter().map(i64::to_string).collect();
        let audit_id = {
            let mut conn = self.acquire().await?;
            self.inner
                .store
                .audit_begin(
                    &mut conn,
                    request,
                    "consumer.replay",
                    &self.inner.name,
                    &ids,
                )
                .await
                .map_err(self.db_error("writing the audit row"))?
        };
        let mut letters = Vec::with_capacity(letter_ids.len());
        for &letter_id in letter_ids {
            let outcome = self.replay_one(letter_id, None).await?;
            metrics::counter!(
                m::CONSUMER_REPLAYS,
                "consumer" => self.inner.name.to_string(),
                "outcome" => outcome.label(),
            )
            .increment(1);
            tracing::info!(
                consumer = %self.inner.name, letter_id, outcome = outcome.label(),
                operator = request.operator(), "letter replayed"
            );
            letters.push((letter_id, outcome));
        }
        let outcomes = serde_json::Value::Array(
            letters
                .iter()
                .map(|(id, outcome)| {
                    let mut value = serde_json::to_value(outcome).unwrap_or_default();
                    if let Some(object) = value.as_object_mut() {
                        object.insert("id".into(), serde_json::Value::from(id.to_string()));
                    }
                    value
                })
                .collect(),
        );
        let mut conn = self.acquire().await?;
        self.inner
            .store
            .audit_finish(&mut conn, audit_id, &outcomes)
            .await
            .map_err(self.db_error("completing the audit row"))?;
        Ok(ReplayReport { audit_id, letters })
    }

    /// Runs the replays an operator asked for (`outbox quarantine replay`,
    /// `Ops::request_replay`): each requested open letter of this consumer
    /// goes through [`Consumer::replay`]'s path, and its outcome is added to
    /// the request's audit row (with `ran_at`) in the transaction that
    /// settles the letter. The request is taken before the replay runs, so
    /// it runs once, on one instance; a replay that does not close its letter
    /// is not retried on its own. The consumer's task calls this every
    /// `sweep_interval`; returns how many ran.
    pub async fn run_requested_replays(&self) -> Result<usize, ConsumerError> {
        let sql = &self.inner.store;
        let name = &*self.inner.name;
        let requested = {
            let mut conn = self.acquire().await?;
            sql.requested_replays(&mut conn, name)
                .await
                .map_err(self.db_error("reading replay requests"))?
        };
        let mut ran = 0;
        for letter_id in requested {
            // Taking the request is its own statement: of several instances
            // one takes it, and a request runs at most once (a crash before
            // its outcome leaves the letter open and the audit row without
            // an outcome for it; the operator asks again).
            let taken = {
                let mut conn = self.acquire().await?;
                sql.take_replay_request(&mut conn, name, letter_id)
                    .await
                    .map_err(self.db_error("taking a replay request"))?
            };
            let Some(audit_id) = taken else {
                continue;
            };
            let request = Requested { audit_id };
            let outcome = self.replay_one(letter_id, Some(&request)).await?;
            ran += 1;
            metrics::counter!(
                m::CONSUMER_REPLAYS,
                "consumer" => self.inner.name.to_string(),
                "outcome" => outcome.label(),
            )
            .increment(1);
            tracing::info!(consumer = %name, letter_id, outcome = outcome.label(), "requested replay ran");
        }
        Ok(ran)
    }

    /// Records a requested replay's outcome in the request's audit row, in
    /// the transaction that settles its letter.
    async fn settle_request(
        &self,
        conn: &mut StoreConnection<S>,
        letter_id: i64,
        outcome: &ReplayOutcome,
        requested: Option<&Requested>,
    ) -> Result<(), ConsumerError> {
        let Some(requested) = requested else {
            return Ok(());
        };
        if let Some(audit_id) = requested.audit_id {
            let mut entry = serde_json::to_value(outcome).unwrap_or_default();
            if let Some(object) = entry.as_object_mut() {
                object.insert("id".into(), serde_json::Value::from(letter_id.to_string()));
                object.insert(
                    "ran_at".into(),
                    serde_json::Value::from(chrono::Utc::now().to_rfc3339()),
                );
            }
            self.inner
                .store
                .audit_append(conn, audit_id, &serde_json::Value::Array(vec![entry]))
                .await
                .map_err(self.db_error("recording a replay outcome"))?;
        }
        Ok(())
    }

    /// A replay that applied nothing and leaves its letter open: the
    /// replay's transaction is rolled back (no inbox row, no position
    /// change), and the letter records why in its own transaction, with
    /// the request's outcome.
    async fn replay_not_applied(
        &self,
        tx: sqlx::Transaction<'static, S::Db>,
        letter_id: i64,
        why: &str,
        outcome: ReplayOutcome,
        requested: Option<&Requested>,
    ) -> Result<ReplayOutcome, ConsumerError> {
        let _ = tx.rollback().await;
        let mut tx = self.begin().await?;
        self.inner
            .store
            .letter_replay_failed(&mut tx, &self.inner.name, letter_id, why)
            .await
            .map_err(self.db_error("recording a replay that applied nothing"))?;
        self.settle_request(&mut tx, letter_id, &outcome, requested)
            .await?;
        tx.commit()
            .await
            .map_err(self.db_error("committing a replay that applied nothing"))?;
        Ok(outcome)
    }

    async fn replay_one(
        &self,
        letter_id: i64,
        requested: Option<&Requested>,
    ) -> Result<ReplayOutcome, ConsumerError> {
        let sql = &self.inner.store;
        let name = &*self.inner.name;
        // Under strict ordering a version 1 fixes its aggregate's start,
        // committed on its own before the replay's transaction begins (as
        // on the main path, before the handler can start): a single-writer
        // store could not commit it on another connection while that
        // transaction holds the write lock.
        if self.is_strict() {
            let peeked = {
                let mut conn = self.acquire().await?;
                sql.lock_letter(&mut conn, name, letter_id)
                    .await
                    .map_err(self.db_error("reading a letter"))?
            };
            if let Some(stored) = peeked
                && let Prepared::Ready { envelope, .. } = self.prepare(&incoming_of(stored))
            {
                self.pin_first_starts([&envelope]).await?;
            }
        }
        let mut tx = self.begin().await?;
        let Some(stored) = sql
            .lock_letter(&mut tx, name, letter_id)
            .await
            .map_err(self.db_error("reading a letter"))?
        else {
            // Closed meanwhile (a direct replay): say so in the request's row.
            self.settle_request(&mut tx, letter_id, &ReplayOutcome::NotFound, requested)
                .await?;
            tx.commit()
                .await
                .map_err(self.db_error("committing a replay"))?;
            return Ok(ReplayOutcome::NotFound);
        };
        let incoming = incoming_of(stored);
        let resolve = |outcome: &ReplayOutcome| format!("replayed: {}", outcome.label());
        let (outcome, drain) = match self.prepare(&incoming) {
            Prepared::Unreadable { reason, .. } => {
                sql.letter_replay_failed(&mut tx, name, letter_id, &reason)
                    .await
                    .map_err(self.db_error("recording a failed replay"))?;
                let outcome = ReplayOutcome::StillUnreadable { reason };
                self.settle_request(&mut tx, letter_id, &outcome, requested)
                    .await?;
                tx.commit()
                    .await
                    .map_err(self.db_error("committing a failed replay"))?;
                return Ok(outcome);
            }
            Prepared::Foreign => (ReplayOutcome::Ignored, None),
            Prepared::Ignored { envelope } if !self.tracks(&envelope) => {
                (ReplayOutcome::Ignored, None)
            }
            Prepared::Ignored { envelope } => {
                if !self.claim_for_replay(&mut tx, envelope.id).await? {
                    (ReplayOutcome::AlreadyApplied, None)
                } else {
                    match self.pass_skipped(&mut tx, &envelope).await? {
                        Outcome::Stale { position } => (
                            ReplayOutcome::Stale {
                                position,
                                letter_open: false,
                            },
                            None,
                        ),
                        Outcome::Parked { waiting_for } => {
                            (ReplayOutcome::Parked { waiting_for }, None)
                        }
                        _ => (ReplayOutcome::Ignored, Some(envelope)),
                    }
                }
            }
            Prepared::Ready {
                envelope,
                dispatch,
                decoded,
            } => {
                // Its start was fixed before the transaction (above).
                if !self.claim_for_replay(&mut tx, envelope.id).await? {
                    (ReplayOutcome::AlreadyApplied, None)
                } else {
                    match self.gate(&mut tx, &envelope).await? {
                        Gate::Stale(position) if !self.is_strict() => {
                            let outcome = ReplayOutcome::Stale {
                                position,
                                letter_open: false,
                            };
                            (outcome, None)
                        }
                        Gate::Stale(position) => {
                            let why = format!(
                                "strict ordering: the position ({}) is at or past version {}, which was never applied here (passed by an operator?); the letter stays open: discard it if that is intended",
                                position.unwrap_or_default(),
                                envelope.aggregate_version
                            );
                            let outcome = ReplayOutcome::Stale {
                                position,
                                letter_open: true,
                            };
                            return self
                                .replay_not_applied(tx, letter_id, &why, outcome, requested)
                                .await;
                        }
                        Gate::BeforeStart { start, position } => {
                            let why = format!(
                                "{}; the letter stays open: discard it if that is intended",
                                super::process::before_start_reason(&envelope, start)
                            );
                            let outcome = ReplayOutcome::Stale {
                                position: Some(position),
                                letter_open: true,
                            };
                            return self
                                .replay_not_applied(tx, letter_id, &why, outcome, requested)
                                .await;
                        }
                        Gate::Park(waiting_for) => {
                            self.park(&mut tx, &envelope).await?;
                            (ReplayOutcome::Parked { waiting_for }, None)
                        }
                        Gate::Go => {
                            let result = match self
                                .run_handler(dispatch, decoded, &envelope, 1, &mut tx)
                                .await
                            {
                                Ok(()) => {
                                    self.after_handler(&mut tx, &envelope, None, false).await?
                                }
                                Err(error) => Err(error),
                            };
                            match result {
                                Err(error) => {
                                    let error = error.to_string();
                                    let outcome = ReplayOutcome::Failed {
                                        error: error.clone(),
                                    };
                                    return self
                                        .replay_not_applied(
                                            tx, letter_id, &error, outcome, requested,
                                        )
                                        .await;
                                }
                                Ok(successor_parked) => {
                                    // No lag: a replayed event is as old as
                                    // its letter, which says nothing about
                                    // the stream.
                                    self.inner.tally.applied();
                                    (ReplayOutcome::Applied, successor_parked.then_some(envelope))
                                }
                            }
                        }
                    }
                }
            }
        };
        sql.resolve_letter(&mut tx, name, letter_id, &resolve(&outcome))
            .await
            .map_err(self.db_error("closing a letter"))?;
        self.settle_request(&mut tx, letter_id, &outcome, requested)
            .await?;
        tx.commit()
            .await
            .map_err(self.db_error("committing a replay"))?;
        if let Some(envelope) = drain {
            self.drain_logged(&envelope.aggregate_type, &envelope.aggregate_id)
                .await;
        }
        Ok(outcome)
    }
}

/// A letter's message as it arrived: its stored attributes and payload, as
/// a first delivery.
fn incoming_of(stored: super::store::StoredLetter) -> Incoming {
    let attributes =
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&stored.headers)
            .map(|map| {
                map.into_iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k, v.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
    Incoming::new(attributes, stored.payload, 1)
}
