//! Batch mode: up to N messages in one transaction. One statement records
//! them in the inbox, one locks and reads the positions of their
//! aggregates, the ordering decisions are made in memory, and one
//! statement after the handlers writes the moved positions and the parked
//! messages (and finds a transaction a handler left aborted). So a batch
//! costs its handlers' statements plus a fixed handful, whatever the
//! ordering policy. Each aggregate's messages are applied in version order
//! within the batch (a batch holding v3, v1, v2 of one aggregate applies
//! v1, v2, v3); a gap parks only that aggregate's later messages.
//!
//! A handler error rolls the batch back and every message is processed on
//! its own, so each gets exactly the outcome it would have alone.
//!
//! Locks are taken in the order the single-message path takes them:
//! inbox keys first (sorted by event id), then the positions of the
//! batch's aggregates (sorted), so a batch instance and a single-message
//! instance on overlapping messages wait for each other instead of
//! deadlocking.

use std::collections::{BTreeMap, HashMap, HashSet};

use uuid::Uuid;

use super::Consumer;
use super::config::Ordering;
use super::incoming::{Incoming, Outcome};
use super::process::{ConsumerError, Gate, Prepared, before_start_reason, strict_gate};
use super::store::{ConsumerStore, StoreConnection};
use super::store::{LetterKind, MovedPosition, Position};
use crate::envelope::Envelope;

type Aggregate = (String, String);

/// What a batch does with one message, decided before anything is
/// written.
#[derive(Debug, Clone)]
enum Decision {
    /// Settled without a statement of its own.
    Done(Outcome),
    /// Its handler runs.
    Apply,
    /// Unreadable: a quarantine row.
    Quarantine,
    /// Below its aggregate's start: a dead letter with this reason.
    Letter(String),
}

/// What a batch changes in positions and parked messages, written after
/// its handlers in one statement.
#[derive(Default)]
struct Settlement {
    positions: HashMap<Aggregate, Position>,
    moved: BTreeMap<Aggregate, MovedPosition>,
    parked: Vec<Envelope>,
}

impl Settlement {
    /// The ordering policy for `envelope` against the batch's view of its
    /// aggregate's position.
    fn gate(&self, ordering: Ordering, envelope: &Envelope) -> Gate {
        let position = self
            .positions
            .get(&aggregate_of(envelope))
            .copied()
            .unwrap_or(Position {
                version: 0,
                pinned: false,
                start_version: None,
            });
        match ordering {
            Ordering::Unordered => Gate::Go,
            Ordering::RejectStale if envelope.aggregate_version > position.version => Gate::Go,
            Ordering::RejectStale => Gate::Stale(None),
            Ordering::Strict { .. } => strict_gate(&position, envelope.aggregate_version),
        }
    }

    /// The aggregate's position moves to `envelope`'s version.
    fn advance(&mut self, ordering: Ordering, envelope: &Envelope) {
        if ordering == Ordering::Unordered {
            return;
        }
        let aggregate = aggregate_of(envelope);
        let position = self.positions.entry(aggregate.clone()).or_insert(Position {
            version: 0,
            pinned: false,
            start_version: None,
        });
        position.version = envelope.aggregate_version;
        if !position.pinned {
            position.pinned = true;
            position.start_version = Some(envelope.aggregate_version);
        }
        let start = position.start_version.unwrap_or(envelope.aggregate_version);
        self.moved.insert(
            aggregate.clone(),
            MovedPosition {
                aggregate,
                version: envelope.aggregate_version,
                start,
            },
        );
    }
}

fn aggregate_of(envelope: &Envelope) -> Aggregate {
    (
        envelope.aggregate_type.clone(),
        envelope.aggregate_id.clone(),
    )
}

impl<S: ConsumerStore> Consumer<S> {
    /// Processes messages in one transaction: one inbox statement for all,
    /// then each message's policy and handler, each aggregate's in version
    /// order. When a handler fails, the batch rolls back and every message
    /// is processed on its own, so each gets exactly the outcome it would
    /// have alone. Give it at most [`MAX_BATCH_SIZE`](super::MAX_BATCH_SIZE)
    /// messages (the consumer's own task never takes more than its
    /// `batch_size`): a store's batch statements bind a few values per
    /// message, and MySQL refuses a statement with more than 65,535.
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
            return self.one_by_one(batch).await;
        }
        let ordering = self.inner.config.ordering;
        let prepared: Vec<Prepared<'_, StoreConnection<S>>> =
            batch.iter().map(|i| self.prepare(i)).collect();
        // Under strict ordering the starts of aggregates whose version 1 is
        // here are fixed (committed) before any of their handlers starts.
        let readable: Vec<&Envelope> = prepared
            .iter()
            .filter_map(|p| match p {
                Prepared::Ready { envelope, .. } => Some(envelope),
                Prepared::Unreadable {
                    envelope: Some(envelope),
                    ..
                } => Some(envelope),
                _ => None,
            })
            .collect();
        self.pin_first_starts(readable).await?;
        // Inbox keys of what is applied or passed over; not of what goes to
        // the quarantine (it holds no inbox row).
        let ids: Vec<Uuid> = prepared
            .iter()
            .filter_map(|p| self.inbox_envelope(p).map(|e| e.id))
            .collect();
        let ordered = ordering != Ordering::Unordered;
        let mut tx = if ordered {
            self.begin_batch().await?
        } else {
            self.begin().await?
        };
        let mut fresh: HashSet<Uuid> = self
            .inner
            .store
            .claim_many(&mut tx, &self.inner.name, &ids)
            .await
            .map_err(self.db_error("recording the batch in the inbox"))?
            .into_iter()
            .collect();
        let mut settlement = Settlement::default();
        if ordered {
            let mut aggregates: Vec<Aggregate> = prepared
                .iter()
                .filter_map(|p| self.inbox_envelope(p))
                .filter(|e| fresh.contains(&e.id))
                .map(aggregate_of)
                .collect();
            aggregates.sort_unstable();
            aggregates.dedup();
            if !aggregates.is_empty() {
                settlement.positions = self
                    .inner
                    .store
                    .lock_positions(&mut tx, &self.inner.name, &aggregates)
                    .await
                    .map_err(self.db_error("locking the batch's aggregate positions"))?
                    .into_iter()
                    .collect();
            }
        }
        // First every decision, in memory, against the batch's view of the
        // positions; then the moved positions and parked messages are
        // written (one statement, still in the generic-plan window the
        // batch's transaction opened with, which it also closes: the
        // handlers' statements are planned as the session plans them);
        // then the letters and the handlers.
        let order = processing_order(ordering, &prepared);
        let mut decisions: Vec<Option<Decision>> = vec![None; batch.len()];
        for &index in &order {
            decisions[index] = Some(match &prepared[index] {
                Prepared::Foreign => Decision::Done(Outcome::Foreign),
                Prepared::Ignored { envelope } if !self.tracks(envelope) => {
                    Decision::Done(Outcome::Ignored)
                }
                Prepared::Unreadable { .. } => Decision::Quarantine,
                Prepared::Ignored { envelope } | Prepared::Ready { envelope, .. } => {
                    let skipped = matches!(prepared[index], Prepared::Ignored { .. });
                    if !fresh.remove(&envelope.id) {
                        Decision::Done(Outcome::Duplicate)
                    } else {
                        match settlement.gate(ordering, envelope) {
                            Gate::Go => {
                                settlement.advance(ordering, envelope);
                                if skipped {
                                    Decision::Done(Outcome::Ignored)
                                } else {
                                    Decision::Apply
                                }
                            }
                            Gate::Stale(position) => Decision::Done(Outcome::Stale { position }),
                            // A skipped type below the start changes nothing.
                            Gate::BeforeStart { .. } if skipped => {
                                Decision::Done(Outcome::Stale { position: None })
                            }
                            Gate::BeforeStart { start, .. } => {
                                Decision::Letter(before_start_reason(envelope, start))
                            }
                            Gate::Park(waiting_for) => {
                                settlement.parked.push(envelope.clone());
                                Decision::Done(Outcome::Parked { waiting_for })
                            }
                        }
                    }
                }
            });
        }
        let ready = if ordered {
            let moved: Vec<MovedPosition> = settlement.moved.into_values().collect();
            self.inner
                .store
                .settle_batch(&mut tx, &self.inner.name, &moved, &settlement.parked)
                .await
                .map_err(self.db_error("settling the batch's positions"))?
        } else {
            Vec::new()
        };
        let mut prepared: Vec<Option<Prepared<'_, StoreConnection<S>>>> =
            prepared.into_iter().map(Some).collect();
        let mut outcomes: Vec<Option<Outcome>> = vec![None; batch.len()];
        for index in order {
            let (Some(prepared), Some(decision)) =
                (prepared[index].take(), decisions[index].take())
            else {
                continue;
            };
            let incoming = batch[index];
            let outcome = match (decision, prepared) {
                (Decision::Done(outcome), _) => outcome,
                (Decision::Quarantine, Prepared::Unreadable { envelope, reason }) => {
                    let written = self
                        .write_letter(
                            &mut tx,
                            LetterKind::Quarantined,
                            incoming,
                            envelope.as_ref(),
                            &reason,
                        )
                        .await?;
                    if written {
                        Outcome::Quarantined { reason }
                    } else {
                        Outcome::Duplicate
                    }
                }
                (Decision::Letter(reason), Prepared::Ready { envelope, .. }) => {
                    self.inner
                        .store
                        .forget_processed(&mut tx, &self.inner.name, envelope.id)
                        .await
                        .map_err(self.db_error("releasing an inbox row"))?;
                    let written = self
                        .write_letter(
                            &mut tx,
                            LetterKind::DeadLettered,
                            incoming,
                            Some(&envelope),
                            &reason,
                        )
                        .await?;
                    if written {
                        Outcome::DeadLettered { reason }
                    } else {
                        Outcome::Duplicate
                    }
                }
                (
                    Decision::Apply,
                    Prepared::Ready {
                        envelope,
                        dispatch,
                        decoded,
                    },
                ) => {
                    let result = self
                        .run_handler(dispatch, decoded, &envelope, incoming.attempt(), &mut tx)
                        .await;
                    if result.is_err() {
                        // Roll back and give every message its own transaction.
                        let _ = tx.rollback().await;
                        return self.one_by_one(batch).await;
                    }
                    self.record_lag(&envelope);
                    Outcome::Applied
                }
                // Decisions are made from the same prepared messages.
                (_, _) => Outcome::Duplicate,
            };
            outcomes[index] = Some(outcome);
        }
        // A handler that swallowed a failed statement left the transaction
        // aborted: found here (its failure is then found one by one).
        if self.inner.store.transaction_intact(&mut tx).await.is_err() {
            let _ = tx.rollback().await;
            return self.one_by_one(batch).await;
        }
        tx.commit()
            .await
            .map_err(self.db_error("committing a batch"))?;
        crate::failpoint::hit(crate::failpoint::CONSUMER_AFTER_COMMIT).await;
        let outcomes: Vec<Outcome> = outcomes
            .into_iter()
            .map(|o| o.unwrap_or(Outcome::Duplicate))
            .collect();
        for (incoming, outcome) in batch.iter().zip(&outcomes) {
            self.record(outcome);
            if let Outcome::Quarantined { reason } | Outcome::DeadLettered { reason } = outcome {
                tracing::warn!(
                    consumer = %self.inner.name,
                    event_id = ?incoming.attribute(crate::ce::ID),
                    event_type = ?incoming.attribute(crate::ce::TYPE),
                    %reason,
                    "{}",
                    if matches!(outcome, Outcome::Quarantined { .. }) {
                        "message quarantined"
                    } else {
                        "message moved to dead letters"
                    }
                );
            }
        }
        for (aggregate_type, aggregate_id) in ready {
            self.drain_logged(&aggregate_type, &aggregate_id).await;
        }
        Ok(outcomes)
    }

    /// The envelope of a prepared message that takes an inbox row: one to
    /// apply, or (strict) a skipped type that still moves positions.
    fn inbox_envelope<'p>(
        &self,
        prepared: &'p Prepared<'_, StoreConnection<S>>,
    ) -> Option<&'p Envelope> {
        match prepared {
            Prepared::Ready { envelope, .. } => Some(envelope),
            Prepared::Ignored { envelope } if self.tracks(envelope) => Some(envelope),
            _ => None,
        }
    }

    async fn one_by_one(&self, batch: &[&Incoming]) -> Result<Vec<Outcome>, ConsumerError> {
        let mut outcomes = Vec::with_capacity(batch.len());
        for incoming in batch {
            outcomes.push(self.handle(incoming).await?);
        }
        Ok(outcomes)
    }
}

/// The order a batch's messages are processed in: under an ordering
/// policy each aggregate's messages together, by version, aggregates in
/// the order they first appear; unordered, as delivered.
fn processing_order<'a, C>(ordering: Ordering, prepared: &'a [Prepared<'_, C>]) -> Vec<usize> {
    if ordering == Ordering::Unordered {
        return (0..prepared.len()).collect();
    }
    let envelope = |p: &'a Prepared<'_, C>| match p {
        Prepared::Ready { envelope, .. } | Prepared::Ignored { envelope } => Some(envelope),
        Prepared::Unreadable { envelope, .. } => envelope.as_ref(),
        Prepared::Foreign => None,
    };
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<(&str, &str), usize> = HashMap::new();
    for (index, prepared) in prepared.iter().enumerate() {
        match envelope(prepared) {
            Some(envelope) => {
                let aggregate = (
                    envelope.aggregate_type.as_str(),
                    envelope.aggregate_id.as_str(),
                );
                match group_of.get(&aggregate) {
                    Some(&group) => groups[group].push(index),
                    None => {
                        group_of.insert(aggregate, groups.len());
                        groups.push(vec![index]);
                    }
                }
            }
            None => groups.push(vec![index]),
        }
    }
    groups
        .into_iter()
        .flat_map(|mut indices| {
            indices.sort_by_key(|&index| {
                envelope(&prepared[index]).map_or(0, |e| e.aggregate_version)
            });
            indices
        })
        .collect()
}
