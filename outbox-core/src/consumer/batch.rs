//! Batch mode: up to N messages in one transaction with one inbox
//! statement. A handler error rolls the batch back and every message is
//! processed on its own, so each gets exactly the outcome it would have
//! alone.
//!
//! Locks are taken in the order the single-message path takes them:
//! inbox keys first (sorted by event id), then the positions of the
//! batch's aggregates (sorted), so a batch instance and a single-message
//! instance on overlapping messages wait for each other instead of
//! deadlocking.

use std::collections::HashSet;

use uuid::Uuid;

use super::Consumer;
use super::config::Ordering;
use super::incoming::{Incoming, Outcome};
use super::process::{ConsumerError, Gate, Prepared, transaction_intact};
use crate::store::consumer::LetterKind;

impl Consumer {
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
            return self.one_by_one(batch).await;
        }
        let prepared: Vec<Prepared<'_>> = batch.iter().map(|i| self.prepare(i)).collect();
        // Inbox keys of what is applied or passed over; not of what goes to
        // the quarantine (it holds no inbox row).
        let ids: Vec<Uuid> = prepared
            .iter()
            .filter_map(|p| match p {
                Prepared::Ready { envelope, .. } => Some(envelope.id),
                Prepared::Ignored { envelope } if self.tracks(envelope) => Some(envelope.id),
                _ => None,
            })
            .collect();
        let mut tx = self.begin().await?;
        let mut fresh: HashSet<Uuid> = self
            .inner
            .sql
            .claim_many(&mut tx, &self.inner.name, &ids)
            .await
            .map_err(self.db_error("recording the batch in the inbox"))?
            .into_iter()
            .collect();
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
        let mut outcomes = Vec::with_capacity(batch.len());
        let mut advanced: Vec<(String, String)> = Vec::new();
        for (incoming, prepared) in batch.iter().zip(prepared) {
            let outcome = match prepared {
                Prepared::Foreign => Outcome::Foreign,
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
                            Gate::Go { .. } => {
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
                                    return self.one_by_one(batch).await;
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

    async fn one_by_one(&self, batch: &[&Incoming]) -> Result<Vec<Outcome>, ConsumerError> {
        let mut outcomes = Vec::with_capacity(batch.len());
        for incoming in batch {
            outcomes.push(self.handle(incoming).await?);
        }
        Ok(outcomes)
    }
}
