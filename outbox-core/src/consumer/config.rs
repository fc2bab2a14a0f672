//! How a consumer orders, retries and batches.

use std::time::Duration;

use crate::relay::Backoff;
use crate::store::ConfigError;

/// What a consumer does with an aggregate's versions that arrive out of
/// order. Positions are kept per (consumer, aggregate) in the same
/// transaction as the handler's effect.
///
/// | message version `v`, position `p` | `Unordered` | `RejectStale` | `Strict` |
/// |---|---|---|---|
/// | `v = p + 1` | applied | applied, `p := v` | applied, `p := v`, then parked `v + 1`… |
/// | `v > p + 1` (a gap) | applied | applied, `p := v` (the gap is skipped for good) | parked until `p + 1` arrives; after `park_timeout` the aggregate's parked messages go to dead letters (or, for an aggregate the consumer never started, the lowest parked version becomes its start: see [`StrictStart`]) |
/// | `v <= p` (old or repeated) | applied | acknowledged, counted as stale, not applied | acknowledged, counted as stale, not applied |
///
/// - `Unordered`: the handler is commutative or keyed by event id (counters
///   of distinct things, appending to a log, sending a notification).
/// - `RejectStale` (default): the handler writes the latest state of the
///   aggregate (a projection row, a cache, a search document): an older
///   version must never overwrite a newer one, and a skipped version does
///   no harm because the next one carries the full state.
/// - `Strict`: every version matters in sequence (a ledger, a state
///   machine that rejects skipped transitions). Costs a parked table and
///   a wait bound; a missing version stops that aggregate (only that one)
///   until it arrives, then dead letters with the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ordering {
    /// No position is kept; every new message is applied.
    Unordered,
    /// Versions at or below the position are skipped; gaps are allowed.
    #[default]
    RejectStale,
    /// Versions are applied in sequence without gaps.
    Strict {
        /// How long a message may wait for its missing predecessor.
        park_timeout: Duration,
    },
}

/// Where a strict consumer starts an aggregate it has never seen: one that
/// existed before the consumer did, or whose first versions are gone from
/// the broker (a stream trimmed by age or size).
///
/// Either way, a message whose predecessor is missing first waits in the
/// parked table for up to the park timeout: a version that arrives early
/// because its predecessor's handler failed, or was delivered to another
/// instance, is not mistaken for a start. Once a handler was started on an
/// aggregate (even one that failed), its start is fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StrictStart {
    /// The lowest version that arrived before the park timeout ran out
    /// becomes the aggregate's start, and the parked versions are applied
    /// from there (logged, and counted in
    /// `outbox_consumer_strict_starts_total`). The default: a consumer added
    /// to a running system, or reading a trimmed stream, starts where its
    /// stream starts.
    #[default]
    LowestSeen,
    /// Every aggregate starts at version 1: a consumer that never received
    /// version 1 of an aggregate dead-letters its parked versions after the
    /// park timeout, naming the missing version. For consumers that were
    /// there from an aggregate's first event and read a stream that keeps
    /// everything.
    VersionOne,
}

/// Retries of a failing handler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryPolicy {
    /// Handler starts before a message goes to the dead letters (default
    /// 5). A failed start is retried after the backoff; a redelivery after
    /// a crash counts as a start too (recorded before the handler runs),
    /// a redelivery that could not reach the database does not.
    pub max_attempts: u32,
    /// Delay before the next delivery after a failure (default 1 s doubling
    /// up to 5 min, ±20%).
    pub backoff: Backoff,
    /// Upper bound for one handler run; a handler that takes longer fails
    /// this attempt (default 30 s). The broker's ack wait must exceed it.
    pub handler_timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            backoff: Backoff::default(),
            handler_timeout: Duration::from_secs(30),
        }
    }
}

/// Settings of a consumer.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsumerConfig {
    /// The ordering policy (default [`Ordering::RejectStale`]).
    pub ordering: Ordering,
    /// Retries of failing handlers (a parked message whose handler fails
    /// waits for the same backoff before its next start).
    pub retry: RetryPolicy,
    /// Messages per database transaction (default 1). Above 1 the consumer
    /// takes up to this many messages from its source at once, records
    /// them in the inbox with one statement and runs their handlers in one
    /// transaction; a handler error rolls the batch back and its messages
    /// are processed one by one, so the guarantees per message hold. At
    /// most [`MAX_BATCH_SIZE`].
    pub batch_size: usize,
    /// Pause after a database or source error before the next try
    /// (default 1 s).
    pub error_backoff: Duration,
    /// How often the consumer's task looks for replays an operator asked
    /// for and, under strict ordering, for parked messages that are ready or
    /// expired (default 1 s).
    pub sweep_interval: Duration,
    /// Where a strict consumer starts an aggregate it has never seen
    /// (default [`StrictStart::LowestSeen`]).
    pub strict_start: StrictStart,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            ordering: Ordering::default(),
            retry: RetryPolicy::default(),
            batch_size: 1,
            error_backoff: Duration::from_secs(1),
            sweep_interval: Duration::from_secs(1),
            strict_start: StrictStart::default(),
        }
    }
}

/// The largest consumer batch: one transaction holds a batch, and a
/// store's batch statements bind a few values per message (MySQL refuses
/// more than 65,535 in one statement).
pub const MAX_BATCH_SIZE: usize = 5_000;

impl ConsumerConfig {
    /// Rejects settings that would stall or spin, and durations longer than
    /// [`LONGEST_SETTING`](crate::relay::config::LONGEST_SETTING).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |what: &'static str, reason: &str| ConfigError::InvalidValue {
            what,
            reason: reason.to_owned(),
        };
        if self.batch_size == 0 || self.batch_size > MAX_BATCH_SIZE {
            return Err(ConfigError::InvalidValue {
                what: "consumer batch_size",
                reason: format!(
                    "{} is outside 1..={MAX_BATCH_SIZE} (a batch's statements bind a few values per message, and MySQL takes at most 65,535)",
                    self.batch_size
                ),
            });
        }
        if self.retry.max_attempts == 0 {
            return Err(bad("consumer max_attempts", "must be at least 1"));
        }
        if self.retry.handler_timeout.is_zero() {
            return Err(bad("consumer handler_timeout", "must be above zero"));
        }
        if self.error_backoff.is_zero() {
            return Err(bad(
                "consumer error_backoff",
                "must be above zero, or a database outage becomes a busy loop",
            ));
        }
        if let Ordering::Strict { park_timeout } = self.ordering
            && park_timeout.is_zero()
        {
            return Err(bad("consumer park_timeout", "must be above zero"));
        }
        if self.sweep_interval.is_zero() {
            return Err(bad("consumer sweep_interval", "must be above zero"));
        }
        let park_timeout = match self.ordering {
            Ordering::Strict { park_timeout } => park_timeout,
            _ => Duration::ZERO,
        };
        for (what, value) in [
            ("consumer handler_timeout", self.retry.handler_timeout),
            ("consumer error_backoff", self.error_backoff),
            ("consumer park_timeout", park_timeout),
            ("consumer sweep_interval", self.sweep_interval),
        ] {
            crate::relay::config::at_most_longest(what, value)?;
        }
        self.retry.backoff.validate()
    }
}

/// Checks a consumer name: 1 to 200 characters, letters, digits, `_`, `-`, `.`.
pub fn validate_name(name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(ConfigError::InvalidValue {
            what: "consumer name",
            reason: format!(
                "{name:?}: use 1 to 200 ASCII letters, digits, `_`, `-` or `.` (it is also the JetStream durable name)"
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_settings_that_would_stall_or_spin() {
        assert!(ConsumerConfig::default().validate().is_ok());
        let check = |change: fn(&mut ConsumerConfig)| {
            let mut config = ConsumerConfig::default();
            change(&mut config);
            config.validate().unwrap_err().to_string()
        };
        assert!(check(|c| c.batch_size = 0).contains("batch_size"));
        assert!(check(|c| c.retry.max_attempts = 0).contains("max_attempts"));
        assert!(check(|c| c.error_backoff = Duration::ZERO).contains("error_backoff"));
        assert!(
            check(|c| c.ordering = Ordering::Strict {
                park_timeout: Duration::ZERO
            })
            .contains("park_timeout")
        );
        assert!(check(|c| c.batch_size = MAX_BATCH_SIZE + 1).contains("65,535"));
        let month = Duration::from_secs(30 * 86_400);
        let long = |change: &dyn Fn(&mut ConsumerConfig)| {
            let mut config = ConsumerConfig::default();
            change(&mut config);
            config.validate().unwrap_err().to_string()
        };
        assert!(long(&|c| c.retry.handler_timeout = month).contains("handler_timeout"));
        assert!(
            long(&|c| c.ordering = Ordering::Strict {
                park_timeout: Duration::MAX
            })
            .contains("park_timeout")
        );
        assert!(long(&|c| c.sweep_interval = Duration::MAX).contains("sweep_interval"));
        let widest = ConsumerConfig {
            batch_size: MAX_BATCH_SIZE,
            ..ConsumerConfig::default()
        };
        widest.validate().unwrap();
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_name("billing.projector-1").is_ok());
        for bad in ["", "a b", "x*", "durable>"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
    }
}
