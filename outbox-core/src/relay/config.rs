//! Relay settings, their defaults and their validation at start-up.

use std::time::Duration;

use crate::store::ConfigError;

/// What happens to the later events of an aggregate whose head event ended
/// in the failed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailedHeadPolicy {
    /// They wait until an operator replays or resolves the failed event;
    /// the aggregate shows up in the blocked-aggregates signal. Keeps order.
    #[default]
    Block,
    /// They go on without it. Gives up per-aggregate order for that one
    /// event; choose it only where consumers tolerate a missing version.
    Skip,
}

/// Exponential backoff with jitter for failed publishes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay before the second attempt.
    pub initial: Duration,
    /// Upper bound of any delay.
    pub max: Duration,
    /// Growth per attempt (2.0 doubles).
    pub multiplier: f64,
    /// Random spread, as a fraction of the delay (0.2 = ±20%).
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
            multiplier: 2.0,
            jitter: 0.2,
        }
    }
}

/// The longest any duration setting of the relay or a consumer may be:
/// 2,147,483,647 ms, about 24.8 days, the most PostgreSQL takes for its
/// timeouts (its settings are 32-bit milliseconds). Longer values used to
/// fail every claim or transaction at run time, or overflow where a
/// deadline is computed from them; `validate` refuses them at start.
pub const LONGEST_SETTING: Duration = Duration::from_millis(i32::MAX as u64);

/// Refuses a duration setting above [`LONGEST_SETTING`].
pub(crate) fn at_most_longest(what: &'static str, value: Duration) -> Result<(), ConfigError> {
    if value > LONGEST_SETTING {
        return Err(ConfigError::InvalidValue {
            what,
            reason: format!(
                "{value:?} is longer than the longest setting, {LONGEST_SETTING:?} (PostgreSQL's 32-bit milliseconds)"
            ),
        });
    }
    Ok(())
}

impl Backoff {
    /// The delay after the `attempt`-th failure (1-based), with jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(63) as i32;
        let base = self.initial.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = base.min(self.max.as_secs_f64());
        let spread = if self.jitter > 0.0 {
            rand::random_range(-self.jitter..=self.jitter)
        } else {
            0.0
        };
        Duration::from_secs_f64((capped * (1.0 + spread)).clamp(0.0, self.max.as_secs_f64()))
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let bad = |reason: String| ConfigError::InvalidValue {
            what: "relay backoff",
            reason,
        };
        at_most_longest("backoff initial", self.initial)?;
        at_most_longest("backoff max", self.max)?;
        if self.initial.is_zero() {
            return Err(bad(
                "initial delay must be above zero (a zero delay is a hot retry loop)".into(),
            ));
        }
        if self.max < self.initial {
            return Err(bad(format!(
                "max {:?} is below initial {:?}",
                self.max, self.initial
            )));
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return Err(bad(format!(
                "multiplier {} must be a finite number >= 1",
                self.multiplier
            )));
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(bad(format!("jitter {} must be in 0..1", self.jitter)));
        }
        Ok(())
    }
}

/// Relay settings. `RelayConfig::default()` suits most services.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows claimed per batch (default 500).
    pub batch_size: usize,
    /// Concurrent claim loops in this process, each with its own connection
    /// (default 1; several relay processes may run as well).
    pub workers: usize,
    /// How long an idle worker sleeps when no NOTIFY arrives (default 1 s).
    pub poll_interval: Duration,
    /// Wake up on NOTIFY from emitting transactions (default true).
    pub listen: bool,
    /// Attempts before an event moves to the failed state (default 10).
    pub max_attempts: u32,
    /// Delays between attempts.
    pub backoff: Backoff,
    /// Later events of an aggregate whose head failed: wait or go on.
    pub failed_head_policy: FailedHeadPolicy,
    /// Upper bound for one batch's publish (all waves); a broker that does
    /// not answer within it counts as a failed attempt (default 30 s).
    pub publish_timeout: Duration,
    /// How long PostgreSQL lets a claim transaction sit idle before it kills
    /// it, releasing the rows of a hung relay (default 120 s). Must exceed
    /// `publish_timeout`. A worker starts no publish of a batch later than
    /// this after it sent the claim (another worker may own the events by
    /// then); with [`Relay::start`](crate::relay::Relay::start) over a
    /// `PgRelayStore`, give the store the same value
    /// (`outbox_postgres`'s `Relay::start_postgres` does).
    pub claim_timeout: Duration,
    /// Upper bound for each statement of a claim transaction (default
    /// 30 s): a claim that waits on a lock longer (a migration holding the
    /// outbox table) fails, rolls back and is retried after
    /// `error_backoff`, so a worker never hangs on the database. A claim
    /// cancelled this way is retried at half its size (down to one event),
    /// and the size doubles back after ten claims in a row go through.
    /// The relay also waits no longer than this plus 5 s for any answer
    /// from PostgreSQL on its own connections (a client-side deadline): on
    /// a network that went silent (no reset, no answer) it drops the
    /// connection, reports a store error and opens a new session once
    /// the network answers again. That is PostgreSQL; on MySQL/MariaDB it
    /// bounds a claim's lock waits (`innodb_lock_wait_timeout` and
    /// `lock_wait_timeout` of the relay's connections, in whole seconds),
    /// and a claim that times out is retried after `error_backoff` at its
    /// size; on SQLite the pool's busy timeout (10 s) bounds the wait for
    /// the write lock instead.
    pub statement_timeout: Duration,
    /// Partition ownership: a worker whose claiming session stays idle
    /// between claims this long (stalled, say) is cut off by PostgreSQL
    /// (`idle_session_timeout`) and its partitions go to the others; a
    /// member whose heartbeat is older counts as gone (default 10 s, at
    /// least 1 s). A worker that slept longer than the lease (a long
    /// `poll_interval`, no events) opens a new session when it wakes and
    /// takes its share again. A crashed worker's session ends at once and
    /// its partitions move within `rebalance_interval`.
    pub lease: Duration,
    /// How often each worker looks at the live workers and takes or gives
    /// up partitions (default 1 s).
    pub rebalance_interval: Duration,
    /// Delay after a database error before the next claim (default 1 s,
    /// doubled per consecutive error up to 30 s).
    pub error_backoff: Duration,
    /// How often the backlog gauges (pending, oldest age, failed, blocked,
    /// dead tuples) are refreshed (default 10 s; zero turns it off).
    pub stats_interval: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            batch_size: 500,
            workers: 1,
            poll_interval: Duration::from_secs(1),
            listen: true,
            max_attempts: 10,
            backoff: Backoff::default(),
            failed_head_policy: FailedHeadPolicy::Block,
            publish_timeout: Duration::from_secs(30),
            claim_timeout: Duration::from_secs(120),
            statement_timeout: Duration::from_secs(30),
            lease: Duration::from_secs(10),
            rebalance_interval: Duration::from_secs(1),
            error_backoff: Duration::from_secs(1),
            stats_interval: Duration::from_secs(10),
        }
    }
}

impl RelayConfig {
    /// Checks every setting; the relay refuses to start otherwise.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |what: &'static str, reason: String| ConfigError::InvalidValue { what, reason };
        if self.batch_size == 0 || self.batch_size > 50_000 {
            return Err(bad(
                "relay batch_size",
                format!("{} is outside 1..=50000", self.batch_size),
            ));
        }
        if self.workers == 0 || self.workers > 64 {
            return Err(bad(
                "relay workers",
                format!("{} is outside 1..=64", self.workers),
            ));
        }
        if self.poll_interval.is_zero() {
            return Err(bad(
                "relay poll_interval",
                "must be above zero (zero is a busy loop)".into(),
            ));
        }
        if self.max_attempts == 0 {
            return Err(bad("relay max_attempts", "must be at least 1".into()));
        }
        if self.publish_timeout.is_zero() {
            return Err(bad("relay publish_timeout", "must be above zero".into()));
        }
        if self.claim_timeout <= self.publish_timeout {
            return Err(bad(
                "relay claim_timeout",
                format!(
                    "{:?} must exceed publish_timeout {:?}, or PostgreSQL kills claims that are still publishing",
                    self.claim_timeout, self.publish_timeout
                ),
            ));
        }
        if self.statement_timeout.is_zero() {
            return Err(bad(
                "relay statement_timeout",
                "must be above zero (zero turns PostgreSQL's timeout off)".into(),
            ));
        }
        if self.lease < Duration::from_secs(1) {
            return Err(bad(
                "relay lease",
                format!("{:?} must be at least 1 s", self.lease),
            ));
        }
        if self.rebalance_interval.is_zero() || self.rebalance_interval >= self.lease {
            return Err(bad(
                "relay rebalance_interval",
                format!(
                    "{:?} must be above zero and below the lease {:?}",
                    self.rebalance_interval, self.lease
                ),
            ));
        }
        if self.error_backoff.is_zero() {
            return Err(bad("relay error_backoff", "must be above zero".into()));
        }
        for (what, value) in [
            ("relay poll_interval", self.poll_interval),
            ("relay publish_timeout", self.publish_timeout),
            ("relay claim_timeout", self.claim_timeout),
            ("relay statement_timeout", self.statement_timeout),
            ("relay lease", self.lease),
            ("relay rebalance_interval", self.rebalance_interval),
            ("relay error_backoff", self.error_backoff),
            ("relay stats_interval", self.stats_interval),
        ] {
            at_most_longest(what, value)?;
        }
        self.backoff.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_exponentially_up_to_the_cap_within_the_jitter() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(2),
            multiplier: 2.0,
            jitter: 0.2,
        };
        for (attempt, expected) in [(1, 0.1), (2, 0.2), (3, 0.4), (5, 1.6), (6, 2.0), (40, 2.0)] {
            for _ in 0..50 {
                let delay = backoff.delay(attempt).as_secs_f64();
                assert!(
                    delay >= expected * 0.8 - 1e-9 && delay <= (expected * 1.2).min(2.0) + 1e-9,
                    "attempt {attempt}: {delay}"
                );
            }
        }
    }

    #[test]
    fn rejects_settings_that_would_stall_or_spin() {
        let check = |change: fn(&mut RelayConfig)| {
            let mut config = RelayConfig::default();
            change(&mut config);
            config.validate().unwrap_err().to_string()
        };
        assert!(check(|c| c.batch_size = 0).contains("batch_size"));
        assert!(check(|c| c.workers = 0).contains("workers"));
        assert!(check(|c| c.poll_interval = Duration::ZERO).contains("busy loop"));
        assert!(check(|c| c.max_attempts = 0).contains("max_attempts"));
        assert!(check(|c| c.claim_timeout = c.publish_timeout).contains("claim_timeout"));
        assert!(check(|c| c.statement_timeout = Duration::ZERO).contains("statement_timeout"));
        assert!(check(|c| c.lease = Duration::from_millis(500)).contains("lease"));
        assert!(check(|c| c.rebalance_interval = c.lease).contains("rebalance_interval"));
        assert!(check(|c| c.backoff.initial = Duration::ZERO).contains("hot retry loop"));
        assert!(check(|c| c.backoff.jitter = 1.5).contains("jitter"));
        RelayConfig::default().validate().unwrap();
    }

    /// Longer than PostgreSQL's 32-bit milliseconds: every claim used to
    /// fail on its `SET`, or a deadline computed from the value overflowed.
    #[test]
    fn rejects_durations_longer_than_the_longest_setting() {
        let month = Duration::from_secs(30 * 86_400);
        let check = |change: &dyn Fn(&mut RelayConfig)| {
            let mut config = RelayConfig::default();
            change(&mut config);
            config.validate().unwrap_err().to_string()
        };
        let claim = check(&|c| c.claim_timeout = month);
        assert!(
            claim.contains("relay claim_timeout") && claim.contains("longest setting"),
            "{claim}"
        );
        assert!(check(&|c| c.statement_timeout = Duration::MAX).contains("statement_timeout"));
        assert!(check(&|c| c.poll_interval = month).contains("poll_interval"));
        assert!(check(&|c| c.backoff.max = Duration::MAX).contains("backoff max"));
        let mut longest = RelayConfig {
            claim_timeout: LONGEST_SETTING,
            ..RelayConfig::default()
        };
        longest.backoff.max = LONGEST_SETTING;
        longest.validate().unwrap();
    }
}
