//! What a consumer has done since its last flush, written to
//! `outbox_consumer_stats` every `sweep_interval` by its task (one upsert
//! per interval, never one per message): applied and duplicate counts, the
//! lag of the last applied event. `outbox status` reads it.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};

use super::store::ConsumerStore;
use super::{Consumer, ConsumerError};

/// Counts gathered in memory between flushes.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    applied: AtomicU64,
    duplicates: AtomicU64,
    /// When the last event was applied and how old it was then.
    last_applied: Mutex<Option<(DateTime<Utc>, f64)>>,
}

impl Tally {
    pub(crate) fn applied(&self) {
        self.applied.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn duplicate(&self) {
        self.duplicates.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn lag(&self, at: DateTime<Utc>, lag_seconds: f64) {
        if let Ok(mut last) = self.last_applied.lock() {
            *last = Some((at, lag_seconds));
        }
    }

    /// Takes what was gathered; `None` when nothing was.
    fn take(&self) -> Option<Taken> {
        let applied = self.applied.swap(0, Ordering::Relaxed);
        let duplicates = self.duplicates.swap(0, Ordering::Relaxed);
        let last = self.last_applied.lock().ok().and_then(|mut l| l.take());
        (applied > 0 || duplicates > 0 || last.is_some()).then_some(Taken {
            applied,
            duplicates,
            last,
        })
    }

    /// Puts back what a failed flush took, so nothing is lost.
    fn restore(&self, taken: Taken) {
        self.applied.fetch_add(taken.applied, Ordering::Relaxed);
        self.duplicates
            .fetch_add(taken.duplicates, Ordering::Relaxed);
        if let Ok(mut last) = self.last_applied.lock()
            && last.is_none()
        {
            *last = taken.last;
        }
    }
}

struct Taken {
    applied: u64,
    duplicates: u64,
    last: Option<(DateTime<Utc>, f64)>,
}

impl<S: ConsumerStore> Consumer<S> {
    /// Writes the counts gathered since the last flush (applied,
    /// duplicates, the lag of the last applied event) to
    /// `outbox_consumer_stats`, where `outbox status` shows them. The task
    /// of [`Consumer::spawn`] calls it every `sweep_interval` and when it
    /// stops; a service that drives the consumer itself
    /// ([`Consumer::handle_envelope`]) calls it now and then. On a database
    /// error the counts are kept for the next flush.
    pub async fn flush_stats(&self) -> Result<(), ConsumerError> {
        let Some(taken) = self.inner.tally.take() else {
            return Ok(());
        };
        let (at, lag) = match taken.last {
            Some((at, lag)) => (Some(at), Some(lag)),
            None => (None, None),
        };
        let result = self
            .inner
            .store
            .flush_stats(
                &self.inner.name,
                i64::try_from(taken.applied).unwrap_or(i64::MAX),
                i64::try_from(taken.duplicates).unwrap_or(i64::MAX),
                at,
                lag,
            )
            .await;
        if let Err(error) = result {
            self.inner.tally.restore(taken);
            return Err(self.db_error("writing consumer stats")(error));
        }
        Ok(())
    }
}
