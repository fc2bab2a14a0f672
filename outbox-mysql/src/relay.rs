//! The relay's store seam on MySQL/MariaDB.
//!
//! A claim is one short READ COMMITTED transaction that commits before
//! anything is published (a transaction held open while publishing, as on
//! PostgreSQL, would hold row locks across a broker round trip):
//!
//! 1. lock up to `limit` **aggregate heads** with `FOR UPDATE SKIP
//!    LOCKED`: pending, due, unleased events with nothing unpublished
//!    before them (under `FailedHeadPolicy::Skip`, failed events do not
//!    count), in insertion order;
//! 2. extend each head with the pending versions after it, while the
//!    batch has room;
//! 3. lease them: a fresh token and an expiry (`claim_timeout` ahead).
//!
//! Only a head starts a claim of its aggregate, and a head is locked by
//! one claim at a time (the others skip it, and skip its later versions,
//! which are not heads), so two relays never hold one aggregate at once;
//! after the commit the lease keeps the others away until the outcome is
//! written, fenced by the token (a relay whose lease ran out cannot
//! overwrite the new holder's outcome). A relay that dies leaves a lease
//! that runs out. READ COMMITTED takes no gap locks, so producers'
//! inserts never wait for a claim.
//!
//! Wake-up: there is no LISTEN/NOTIFY and no commit hook on the caller's
//! connection, so relays poll (`RelayConfig::poll_interval`; lower it for
//! latency; an idle poll is two indexed queries, the window and the whole
//! backlog, each finding nothing).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::DateTime;
use outbox_core::Envelope;
use outbox_core::relay::retention::delete_batch;
use outbox_core::relay::{
    BatchOutcome, BlockedAggregate, ClaimedBatch, ClaimedEvent, EventTypeStats, FailedHeadPolicy,
    OutboxStats, Relay, RelayConfig, RelayStore, StoreError, WakeupListener,
};
use outbox_core::store::ConfigError;
use outbox_core::transport::Transport;
use sqlx::mysql::{MySqlPoolOptions, MySqlRow};
use sqlx::{Executor, MySql, MySqlPool, QueryBuilder, Row};
use uuid::Uuid;

use crate::{millis, now_ms, time_column, uuid_column};

/// Locks aggregate heads: pending, due, unleased events with no pending
/// (or, unless skipped, failed) version below them, each test one seek in
/// `outbox_events_unpublished`. `$window` narrows the rows looked at.
macro_rules! heads_query {
    ($window:literal) => {
        concat!(
            "SELECT e.seq, e.id, e.event_type, e.schema_version, e.aggregate_type, e.aggregate_id,
       e.aggregate_version, e.created_at, e.traceparent, e.payload, e.attempt_count
FROM outbox_events e
WHERE e.status = 'pending' AND e.next_attempt_at <= ?
  AND (e.claimed_until IS NULL OR e.claimed_until <= ?)",
            $window,
            "
  AND NOT EXISTS (
      SELECT 1 FROM outbox_events h FORCE INDEX (outbox_events_unpublished)
      WHERE h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
        AND h.status = 'pending' AND h.aggregate_version < e.aggregate_version)
  AND (? OR NOT EXISTS (
      SELECT 1 FROM outbox_events h FORCE INDEX (outbox_events_unpublished)
      WHERE h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
        AND h.status = 'failed' AND h.aggregate_version < e.aggregate_version))
ORDER BY e.seq
LIMIT ?
FOR UPDATE SKIP LOCKED"
        )
    };
}

/// Heads among the oldest pending events: those within `window` sequence
/// numbers of the oldest. When fewer aggregates than a batch have events,
/// a search of the whole backlog for more heads than there are would read
/// every pending row; the window bounds it. Binds: now, now, window, skip
/// failed heads, limit.
const HEADS_IN_WINDOW: &str = heads_query!(
    "
  AND e.seq < ? + (SELECT MIN(p.seq) FROM outbox_events p WHERE p.status = 'pending')"
);

/// Heads anywhere in the backlog, when the window had none (its events
/// all held by other claims or waiting behind a blocked head). Binds: now,
/// now, skip failed heads, limit.
const HEADS: &str = heads_query!("");

/// Aggregates whose later versions one statement looks up (two bound
/// values each, within MySQL's 65,535).
const FOLLOWERS_PER_STATEMENT: usize = 10_000;

/// The columns of a claimed event.
macro_rules! claimed_columns {
    () => {
        "SELECT seq, id, event_type, schema_version, aggregate_type, aggregate_id,
       aggregate_version, created_at, traceparent, payload, attempt_count
FROM outbox_events "
    };
}

/// `sql` followed by `claim_token = <token> AND seq IN (<seqs>)`: a lease's
/// rows found by primary key (the token has no index of its own, so that
/// writing it on every lease and mark touches no secondary index).
fn on_lease_rows(sql: &str, token: &str, seqs: &[i64]) -> QueryBuilder<MySql> {
    let mut query = QueryBuilder::<MySql>::new(sql);
    query
        .push("claim_token = ")
        .push_bind(token)
        .push(" AND seq IN (");
    let mut list = query.separated(", ");
    for seq in seqs {
        list.push_bind(*seq);
    }
    query.push(")");
    query
}

/// Ends a lease without an outcome (with [`on_lease_rows`]).
const RELEASE: &str = "UPDATE outbox_events SET claim_token = NULL, claimed_until = NULL WHERE ";

/// Records one failed attempt where the lease holds. Binds: status, error,
/// next attempt, now (first failure), failed at, seq, token.
const FAILED: &str = "
UPDATE outbox_events
SET status = ?, attempt_count = attempt_count + 1, last_error = ?, next_attempt_at = ?,
    first_failed_at = COALESCE(first_failed_at, ?), failed_at = ?,
    claim_token = NULL, claimed_until = NULL
WHERE seq = ? AND claim_token = ?";

/// Aggregates whose head retries or, unless failed heads are skipped, has
/// failed. Binds: skip failed heads (twice), limit.
pub(crate) const BLOCKED: &str = "
SELECT e.aggregate_type, e.aggregate_id, e.id, e.status, e.last_error,
       COALESCE(e.first_failed_at, e.failed_at, e.created_at) AS since
FROM outbox_events e
WHERE ((e.status = 'failed' AND NOT ?) OR (e.status = 'pending' AND e.attempt_count > 0))
  AND NOT EXISTS (
      SELECT 1 FROM outbox_events o
      WHERE o.aggregate_type = e.aggregate_type AND o.aggregate_id = e.aggregate_id
        AND o.aggregate_version < e.aggregate_version
        AND (o.status = 'pending' OR (o.status = 'failed' AND NOT ?)))
ORDER BY since
LIMIT ?";

/// The relay's store on MySQL/MariaDB; cheap to clone.
#[derive(Debug, Clone)]
pub struct MySqlRelayStore {
    pool: MySqlPool,
    lease: Duration,
    skip_failed_heads: bool,
    /// The relay's workers (the head window spans a batch for each, and
    /// three more).
    workers: i64,
}

impl MySqlRelayStore {
    /// A store on the database of `pool`, with the lease (`claim_timeout`)
    /// and failed-head policy of `config`. It opens connections of its own
    /// (`config.workers` plus one, when first used) with `pool`'s settings
    /// and READ COMMITTED isolation.
    pub fn new(pool: MySqlPool, config: &RelayConfig) -> MySqlRelayStore {
        let options = (*pool.connect_options()).clone();
        // `statement_timeout` bounds what a claim waits for a lock: a row
        // (InnoDB) or the table's metadata (a migration's DDL), whose
        // server default is a year. Whole seconds, at least one.
        let lock_wait = config
            .statement_timeout
            .as_secs()
            .saturating_add(u64::from(config.statement_timeout.subsec_nanos() > 0))
            .clamp(1, 1 << 30);
        let pool = MySqlPoolOptions::new()
            .max_connections(config.workers.saturating_add(1).min(64) as u32)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                        .await?;
                    sqlx::query(
                        "SET SESSION innodb_lock_wait_timeout = ?, SESSION lock_wait_timeout = ?",
                    )
                    .bind(lock_wait)
                    .bind(lock_wait)
                    .execute(&mut *conn)
                    .await?;
                    Ok(())
                })
            })
            .connect_lazy_with(options);
        MySqlRelayStore {
            pool,
            lease: config.claim_timeout,
            skip_failed_heads: config.failed_head_policy == FailedHeadPolicy::Skip,
            workers: config.workers as i64,
        }
    }

    /// Aggregates whose later events wait behind a retrying or failed head,
    /// longest blocked first, at most `limit` (none for a limit below 1).
    pub async fn blocked_aggregates(
        &self,
        limit: i64,
    ) -> Result<Vec<BlockedAggregate>, StoreError> {
        let rows = sqlx::query(BLOCKED)
            .bind(self.skip_failed_heads)
            .bind(self.skip_failed_heads)
            .bind(limit.max(0))
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::new("list blocked aggregates"))?;
        rows.iter()
            .map(|row| {
                Ok(BlockedAggregate {
                    aggregate_type: row.try_get("aggregate_type")?,
                    aggregate_id: row.try_get("aggregate_id")?,
                    head_event_id: uuid_column(row, "id")?,
                    head_status: row.try_get("status")?,
                    last_error: row.try_get("last_error")?,
                    blocked_since: time_column(row, "since")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::new("decode blocked aggregates"))
    }

    /// Deletes up to `batch` published events older than `age`, and up to
    /// `batch` idempotency keys older than `keep_keys`; returns how many
    /// events went. `batch` is taken within `1..=100_000`: call it again
    /// while it returns that many (a batch below 1 deletes one
    /// row of each; MySQL refuses a negative `LIMIT`).
    pub async fn purge_published(
        &self,
        age: Duration,
        keep_keys: Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        let now = now_ms();
        let batch = delete_batch(batch);
        let events = sqlx::query(
            "DELETE FROM outbox_events WHERE status = 'published' AND published_at < ?
             ORDER BY published_at LIMIT ?",
        )
        .bind(now - millis(age))
        .bind(batch)
        .execute(&self.pool)
        .await
        .map_err(StoreError::new("purge published events"))?;
        sqlx::query(
            "DELETE FROM outbox_idempotency_keys WHERE created_at < ? ORDER BY created_at LIMIT ?",
        )
        .bind(now - millis(keep_keys))
        .bind(batch)
        .execute(&self.pool)
        .await
        .map_err(StoreError::new("purge idempotency keys"))?;
        Ok(events.rows_affected())
    }

    /// Steps 1 to 3 of a claim, in one transaction.
    async fn claim_rows(&self, limit: usize, token: &str) -> Result<Vec<MySqlRow>, sqlx::Error> {
        let now = now_ms();
        let limit = limit.clamp(1, 100_000);
        let mut tx = self.pool.begin().await?;
        let window = (limit as i64).saturating_mul(self.workers.saturating_add(3));
        let mut heads = sqlx::query(HEADS_IN_WINDOW)
            .bind(now)
            .bind(now)
            .bind(window)
            .bind(self.skip_failed_heads)
            .bind(limit as i64)
            .fetch_all(&mut *tx)
            .await?;
        if heads.is_empty() {
            heads = sqlx::query(HEADS)
                .bind(now)
                .bind(now)
                .bind(self.skip_failed_heads)
                .bind(limit as i64)
                .fetch_all(&mut *tx)
                .await?;
        }
        if heads.is_empty() {
            tx.commit().await?;
            return Ok(Vec::new());
        }
        let mut seqs: Vec<i64> = Vec::with_capacity(limit);
        let mut head_versions: BTreeMap<(String, String), i64> = BTreeMap::new();
        for row in &heads {
            seqs.push(row.try_get("seq")?);
            head_versions.insert(
                (row.try_get("aggregate_type")?, row.try_get("aggregate_id")?),
                row.try_get("aggregate_version")?,
            );
        }
        let mut rows = heads;
        if seqs.len() < limit {
            let mut followers = self.followers(&mut tx, &head_versions, now).await?;
            followers.truncate(limit - seqs.len());
            if !followers.is_empty() {
                let mut query =
                    QueryBuilder::<MySql>::new(concat!(claimed_columns!(), "WHERE seq IN ("));
                let mut list = query.separated(", ");
                for seq in &followers {
                    list.push_bind(*seq);
                }
                query.push(")");
                rows.extend(query.build().fetch_all(&mut *tx).await?);
                seqs.extend(followers);
            }
        }
        let mut lease = QueryBuilder::<MySql>::new("UPDATE outbox_events SET claim_token = ");
        lease
            .push_bind(token)
            .push(", claimed_until = ")
            .push_bind(now.saturating_add(millis(self.lease)))
            .push(" WHERE status = 'pending' AND (claimed_until IS NULL OR claimed_until <= ")
            .push_bind(now)
            .push(") AND seq IN (");
        let mut list = lease.separated(", ");
        for seq in &seqs {
            list.push_bind(*seq);
        }
        lease.push(")");
        let leased = lease.build().execute(&mut *tx).await?.rows_affected();
        if leased != rows.len() as u64 {
            // A follower changed between the look and the lease (a repair,
            // another claim): a lease with a hole in it could publish a
            // version before its predecessor. Nothing is claimed this time.
            tx.rollback().await?;
            return Ok(Vec::new());
        }
        outbox_core::failpoint::hit(outbox_core::failpoint::IN_CLAIM).await;
        tx.commit().await?;
        Ok(rows)
    }

    /// The pending versions after each head, in version order per
    /// aggregate, as far as they run without a version that is not due
    /// (or, under Block, a failed one).
    async fn followers(
        &self,
        tx: &mut sqlx::MySqlConnection,
        heads: &BTreeMap<(String, String), i64>,
        now: i64,
    ) -> Result<Vec<i64>, sqlx::Error> {
        // Two values per aggregate, and MySQL binds at most 65,535 in one
        // statement: a claim of up to 50,000 heads asks in chunks. Each
        // aggregate's rows stay together and in version order.
        let keys: Vec<&(String, String)> = heads.keys().collect();
        let mut rows = Vec::new();
        for chunk in keys.chunks(FOLLOWERS_PER_STATEMENT) {
            let mut query = QueryBuilder::<MySql>::new(
                "SELECT seq, aggregate_type, aggregate_id, aggregate_version, status, next_attempt_at,
                        claimed_until
                 FROM outbox_events WHERE status IN ('pending', 'failed') AND (aggregate_type, aggregate_id) IN (",
            );
            let mut list = query.separated(", ");
            for (aggregate_type, aggregate_id) in chunk {
                list.push("(")
                    .push_bind_unseparated(aggregate_type)
                    .push_unseparated(", ")
                    .push_bind_unseparated(aggregate_id)
                    .push_unseparated(")");
            }
            query.push(") ORDER BY aggregate_type, aggregate_id, aggregate_version");
            rows.extend(query.build().fetch_all(&mut *tx).await?);
        }
        let mut followers = Vec::new();
        let mut stopped: Option<(String, String)> = None;
        for row in &rows {
            let key: (String, String) =
                (row.try_get("aggregate_type")?, row.try_get("aggregate_id")?);
            let version: i64 = row.try_get("aggregate_version")?;
            let Some(&head) = heads.get(&key) else {
                continue;
            };
            if version <= head || stopped.as_ref() == Some(&key) {
                continue;
            }
            let status: String = row.try_get("status")?;
            let due = row.try_get::<i64, _>("next_attempt_at")? <= now;
            // Leased by another claim: possible only when a repair put an
            // older version back below a chain a relay holds; the chain
            // stays with its holder.
            let leased = row
                .try_get::<Option<i64>, _>("claimed_until")?
                .is_some_and(|until| until > now);
            if status == "failed" && self.skip_failed_heads {
                continue;
            }
            if status != "pending" || !due || leased {
                stopped = Some(key);
                continue;
            }
            followers.push(row.try_get("seq")?);
        }
        Ok(followers)
    }
}

/// Starts the relay loop of `outbox-core` over the MySQL store of `pool`.
pub async fn start_relay<T: Transport>(
    pool: MySqlPool,
    transport: T,
    config: RelayConfig,
) -> Result<Relay, ConfigError> {
    let store = MySqlRelayStore::new(pool, &config);
    Relay::start(store, transport, config, "mysql").await
}

fn decode_claimed(row: &MySqlRow) -> Result<ClaimedEvent, sqlx::Error> {
    let (payload, unreadable) = ClaimedEvent::read_payload(row.try_get("payload")?);
    let schema_version: i32 = row.try_get("schema_version")?;
    let attempts: i32 = row.try_get("attempt_count")?;
    Ok(ClaimedEvent {
        envelope: Envelope {
            id: uuid_column(row, "id")?,
            event_type: row.try_get("event_type")?,
            schema_version: u32::try_from(schema_version).unwrap_or(0),
            aggregate_type: row.try_get("aggregate_type")?,
            aggregate_id: row.try_get("aggregate_id")?,
            aggregate_version: row.try_get("aggregate_version")?,
            occurred_at: time_column(row, "created_at")?,
            traceparent: row.try_get("traceparent")?,
            payload,
        },
        attempts: u32::try_from(attempts).unwrap_or(0),
        unreadable,
    })
}

/// Events leased to one worker until they are completed, released, or the
/// lease runs out. Dropped unsettled (a worker that panicked mid-batch),
/// it gives its lease back at once (a spawned release); a process that
/// dies, or a runtime shutting down first, leaves the lease to run out.
#[derive(Debug)]
pub struct MySqlClaim {
    pool: MySqlPool,
    token: String,
    events: Vec<ClaimedEvent>,
    /// Each event's row (`seq`), so the outcome is written by primary key.
    seqs: HashMap<Uuid, i64>,
    settled: bool,
}

impl Drop for MySqlClaim {
    fn drop(&mut self) {
        if self.settled || self.events.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, token) = (self.pool.clone(), std::mem::take(&mut self.token));
        let seqs: Vec<i64> = self.seqs.values().copied().collect();
        runtime.spawn(async move {
            let mut release = on_lease_rows(RELEASE, &token, &seqs);
            if let Err(error) = release.build().execute(&pool).await {
                tracing::warn!(%error, "could not give back an abandoned claim; its lease runs out");
            }
        });
    }
}

impl MySqlClaim {
    /// Ends the lease of what is still leased.
    fn release_query(&self) -> QueryBuilder<MySql> {
        let seqs: Vec<i64> = self.seqs.values().copied().collect();
        on_lease_rows(RELEASE, &self.token, &seqs)
    }

    async fn record(&self, outcome: &BatchOutcome) -> Result<(), sqlx::Error> {
        let now = now_ms();
        if outcome.failed.is_empty() && outcome.published.len() == self.events.len() {
            return self
                .mark_published(&self.pool, now, &outcome.published)
                .await;
        }
        let mut tx = self.pool.begin().await?;
        if !outcome.published.is_empty() {
            self.mark_published(&mut *tx, now, &outcome.published)
                .await?;
        }
        for failure in &outcome.failed {
            let Some(seq) = self.seqs.get(&failure.event_id) else {
                continue;
            };
            sqlx::query(FAILED)
                .bind(if failure.give_up { "failed" } else { "pending" })
                .bind(&failure.error)
                .bind(now.saturating_add(millis(failure.retry_in)))
                .bind(now)
                .bind(failure.give_up.then_some(now))
                .bind(*seq)
                .bind(&self.token)
                .execute(&mut *tx)
                .await?;
        }
        // What was neither published nor failed was not attempted: it
        // stays pending, unchanged, free for the next claim.
        self.release_query().build().execute(&mut *tx).await?;
        tx.commit().await
    }

    /// Marks `published` published where the lease still holds.
    async fn mark_published<'e>(
        &self,
        executor: impl Executor<'e, Database = MySql>,
        now: i64,
        published: &[Uuid],
    ) -> Result<(), sqlx::Error> {
        let seqs: Vec<i64> = published
            .iter()
            .filter_map(|id| self.seqs.get(id).copied())
            .collect();
        if seqs.is_empty() {
            return Ok(());
        }
        let mut query = QueryBuilder::<MySql>::new(
            "UPDATE outbox_events SET status = 'published', published_at = ",
        );
        query
            .push_bind(now)
            .push(", claim_token = NULL, claimed_until = NULL WHERE claim_token = ")
            .push_bind(&self.token)
            .push(" AND seq IN (");
        let mut list = query.separated(", ");
        for seq in seqs {
            list.push_bind(seq);
        }
        query.push(")");
        let marked = query.build().execute(executor).await?.rows_affected();
        if marked < published.len() as u64 {
            tracing::warn!(
                published = published.len(),
                marked,
                "the claim's lease ran out before its outcome was recorded; \
                 another worker claimed the rest again and will publish them once more"
            );
        }
        Ok(())
    }
}

impl ClaimedBatch for MySqlClaim {
    fn events(&self) -> &[ClaimedEvent] {
        &self.events
    }

    async fn complete(mut self, outcome: BatchOutcome) -> Result<(), StoreError> {
        if self.events.is_empty() {
            return Ok(());
        }
        self.record(&outcome)
            .await
            .map_err(StoreError::new("record batch outcome"))?;
        self.settled = true;
        Ok(())
    }

    async fn release(mut self) -> Result<(), StoreError> {
        if self.events.is_empty() {
            return Ok(());
        }
        self.release_query()
            .build()
            .execute(&self.pool)
            .await
            .map_err(StoreError::new("release claim"))?;
        self.settled = true;
        Ok(())
    }
}

/// The relay's listener on MySQL: there are no notifications, so it never
/// wakes anyone; workers poll every `poll_interval`.
#[derive(Debug)]
pub struct MySqlWakeups {
    _private: (),
}

impl WakeupListener for MySqlWakeups {
    async fn wait(&mut self) -> Result<(), StoreError> {
        std::future::pending::<()>().await;
        Ok(())
    }
}

impl RelayStore for MySqlRelayStore {
    type Batch = MySqlClaim;
    type Listener = MySqlWakeups;

    async fn claim(&self, limit: usize) -> Result<MySqlClaim, StoreError> {
        let token = Uuid::now_v7().to_string();
        let rows = self
            .claim_rows(limit, &token)
            .await
            .map_err(StoreError::new("claim"))?;
        let mut seqs = HashMap::with_capacity(rows.len());
        let mut events = Vec::with_capacity(rows.len());
        for row in &rows {
            let event = decode_claimed(row).map_err(StoreError::new("decode claimed event"))?;
            let seq: i64 = row
                .try_get("seq")
                .map_err(StoreError::new("decode claimed event"))?;
            seqs.insert(event.envelope.id, seq);
            events.push(event);
        }
        events.sort_unstable_by(|a, b| {
            let (a, b) = (&a.envelope, &b.envelope);
            (&a.aggregate_type, &a.aggregate_id, a.aggregate_version).cmp(&(
                &b.aggregate_type,
                &b.aggregate_id,
                b.aggregate_version,
            ))
        });
        Ok(MySqlClaim {
            pool: self.pool.clone(),
            token,
            events,
            seqs,
            settled: false,
        })
    }

    async fn heartbeat(&self, _worker_id: Uuid, _waiting: bool) -> Result<(), StoreError> {
        Ok(())
    }

    async fn deregister(&self, _relay_id: Uuid) -> Result<(), StoreError> {
        Ok(())
    }

    async fn listener(&self) -> Result<MySqlWakeups, StoreError> {
        Ok(MySqlWakeups { _private: () })
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let row = sqlx::query(
            "SELECT
                (SELECT COUNT(*) FROM outbox_events WHERE status = 'pending') AS pending,
                (SELECT COUNT(*) FROM outbox_events WHERE status = 'failed') AS failed,
                (SELECT MIN(created_at) FROM outbox_events WHERE status = 'pending') AS oldest,
                (SELECT COUNT(*) FROM outbox_events) AS live",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(StoreError::new("read backlog figures"))?;
        let decode = || StoreError::new("decode backlog");
        let oldest: Option<i64> = row.try_get("oldest").map_err(decode())?;
        let types = sqlx::query(
            "SELECT event_type,
                    COUNT(CASE WHEN status = 'pending' THEN 1 END) AS pending,
                    COUNT(CASE WHEN status = 'failed' THEN 1 END) AS failed,
                    MIN(CASE WHEN status = 'pending' THEN created_at END) AS oldest
             FROM outbox_events WHERE status IN ('pending', 'failed')
             GROUP BY event_type ORDER BY event_type",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(StoreError::new("read backlog per event type"))?;
        let event_types = types
            .iter()
            .map(|row| {
                let oldest: Option<i64> = row.try_get("oldest")?;
                Ok(EventTypeStats {
                    event_type: row.try_get("event_type")?,
                    pending: row.try_get("pending")?,
                    failed: row.try_get("failed")?,
                    oldest_pending_at: oldest.and_then(DateTime::from_timestamp_millis),
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::new("decode backlog per event type"))?;
        let blocked = self.blocked_aggregates(i64::MAX).await?.len() as i64;
        Ok(OutboxStats {
            pending: row.try_get("pending").map_err(decode())?,
            failed: row.try_get("failed").map_err(decode())?,
            oldest_pending_at: oldest.and_then(DateTime::from_timestamp_millis),
            blocked_aggregates: blocked,
            dead_tuples: 0,
            live_tuples: row.try_get("live").map_err(decode())?,
            event_types,
        })
    }
}
