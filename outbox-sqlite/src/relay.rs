//! The relay's store seam on SQLite.
//!
//! SQLite has one writer at a time and no row locks, so a claim is not a
//! lock held while publishing (as PostgreSQL's `FOR UPDATE` is) but a
//! lease written into the rows: one `UPDATE … RETURNING` in `BEGIN
//! IMMEDIATE` stamps the claimed events with a fresh token and an expiry
//! (`claimed_until`, the relay's `claim_timeout` ahead). Other workers, in
//! this process or another one on the same file, pass over leased rows and
//! over every later version of their aggregates; the outcome is recorded
//! only for rows that still carry the token (a worker whose lease ran out
//! and was claimed again cannot overwrite the new holder's outcome), and a
//! worker that died leaves rows whose lease simply runs out.
//!
//! What one claim takes: the first `limit` pending rows in insertion order
//! (`seq`) that are due, not leased, and not behind a version that holds
//! their aggregate (a leased, retrying, or, under `FailedHeadPolicy::Block`,
//! failed one), of which, per aggregate, only a run with nothing
//! unpublished before it and no unpublished version inside it. Held
//! aggregates' rows do not count against the limit, so a relay that holds
//! many aggregates (or hangs holding them) does not starve the others.

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
use sqlx::sqlite::{SqlitePoolOptions, SqliteRow, SqliteSynchronous};
use sqlx::{Connection, Row, SqlitePool};
use tokio::sync::watch;
use uuid::Uuid;

use crate::{millis, now_ms, time_column, uuid_column, wakeup};

/// Claims up to `limit` events. Binds: token, lease expiry, now, limit,
/// skip failed heads.
const CLAIM: &str = "
UPDATE outbox_events SET claim_token = ?1, claimed_until = ?2
WHERE id IN (
    WITH candidates AS (
        SELECT e.id, e.aggregate_type, e.aggregate_id, e.aggregate_version
        FROM outbox_events e
        WHERE e.status = 'pending' AND e.next_attempt_at <= ?3
          AND (e.claimed_until IS NULL OR e.claimed_until <= ?3)
          -- Not behind a version that holds its aggregate (leased, in
          -- backoff, or failed under Block): such rows would fill the
          -- window and starve the aggregates that are free.
          AND NOT EXISTS (
              SELECT 1 FROM outbox_events h
              WHERE h.aggregate_type = e.aggregate_type AND h.aggregate_id = e.aggregate_id
                AND h.status <> 'published' AND h.aggregate_version < e.aggregate_version
                AND ((h.status = 'failed' AND NOT ?5)
                     OR (h.status = 'pending'
                         AND (h.claimed_until > ?3 OR h.next_attempt_at > ?3))))
        ORDER BY e.seq
        LIMIT ?4
    ),
    runs AS (
        SELECT aggregate_type, aggregate_id,
               min(aggregate_version) AS low, max(aggregate_version) AS high, count(*) AS n
        FROM candidates
        GROUP BY aggregate_type, aggregate_id
    ),
    free AS (
        SELECT r.aggregate_type, r.aggregate_id FROM runs r
        WHERE NOT EXISTS (
                SELECT 1 FROM outbox_events o
                WHERE o.aggregate_type = r.aggregate_type AND o.aggregate_id = r.aggregate_id
                  AND o.status <> 'published' AND o.aggregate_version < r.low
                  AND (o.status = 'pending' OR (o.status = 'failed' AND NOT ?5)))
          AND r.n = (
                SELECT count(*) FROM outbox_events o
                WHERE o.aggregate_type = r.aggregate_type AND o.aggregate_id = r.aggregate_id
                  AND o.status <> 'published' AND o.aggregate_version BETWEEN r.low AND r.high
                  AND (o.status = 'pending' OR (o.status = 'failed' AND NOT ?5)))
    )
    SELECT c.id FROM candidates c
    JOIN free f ON f.aggregate_type = c.aggregate_type AND f.aggregate_id = c.aggregate_id
)
RETURNING id, event_type, schema_version, aggregate_type, aggregate_id, aggregate_version,
          created_at, traceparent, payload, attempt_count";

/// Marks published what still carries the token. Binds: now, token, ids
/// (JSON array).
const PUBLISHED: &str = "
UPDATE outbox_events
SET status = 'published', published_at = ?1, claim_token = NULL, claimed_until = NULL
WHERE claim_token = ?2 AND id IN (SELECT value FROM json_each(?3))";

/// Records failed attempts. Binds: now, token, failures (JSON array of
/// `{id, error, delay_ms, give_up}`).
const FAILED: &str = "
UPDATE outbox_events
SET status = CASE WHEN f.give_up THEN 'failed' ELSE 'pending' END,
    attempt_count = attempt_count + 1,
    last_error = f.error,
    next_attempt_at = ?1 + f.delay_ms,
    first_failed_at = coalesce(first_failed_at, ?1),
    failed_at = CASE WHEN f.give_up THEN ?1 END,
    claim_token = NULL,
    claimed_until = NULL
FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.error') AS error,
             json_extract(value, '$.delay_ms') AS delay_ms,
             json_extract(value, '$.give_up') AS give_up
      FROM json_each(?3)) AS f
WHERE outbox_events.id = f.id AND outbox_events.claim_token = ?2";

/// Ends a lease without an outcome. Binds: token.
const RELEASE: &str =
    "UPDATE outbox_events SET claim_token = NULL, claimed_until = NULL WHERE claim_token = ?1";

/// Aggregates whose head retries or, unless failed heads are skipped, has
/// failed. Binds: limit, skip failed heads.
pub(crate) const BLOCKED: &str = "
SELECT e.aggregate_type, e.aggregate_id, e.id, e.status, e.last_error,
       coalesce(e.first_failed_at, e.failed_at, e.created_at) AS since
FROM outbox_events e
WHERE ((e.status = 'failed' AND NOT ?2) OR (e.status = 'pending' AND e.attempt_count > 0))
  AND NOT EXISTS (
      SELECT 1 FROM outbox_events o
      WHERE o.aggregate_type = e.aggregate_type AND o.aggregate_id = e.aggregate_id
        AND o.status <> 'published' AND o.aggregate_version < e.aggregate_version
        AND (o.status = 'pending' OR (o.status = 'failed' AND NOT ?2)))
ORDER BY since
LIMIT ?1";

/// The relay's store on SQLite; cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteRelayStore {
    pool: SqlitePool,
    lease: Duration,
    skip_failed_heads: bool,
}

impl SqliteRelayStore {
    /// A store on the database of `pool`, with the lease and failed-head
    /// policy of `config` (the lease is `claim_timeout`: the relay starts
    /// no publish of a batch later than that after its claim, so no two
    /// workers publish one aggregate at once).
    ///
    /// The store opens connections of its own (as many as `config.workers`
    /// plus one, when first used), with `pool`'s settings except
    /// `synchronous = NORMAL`: the relay's own writes (leases, outcomes) are
    /// not synced at commit. A power loss may undo them, which publishes
    /// those events again (at least once, as after any crash) and never
    /// loses one; what must survive a power loss is the emitting
    /// transaction, and that commits on the caller's connection with
    /// `FULL`. Saves two syncs per batch.
    pub fn new(pool: SqlitePool, config: &RelayConfig) -> SqliteRelayStore {
        let options = (*pool.connect_options())
            .clone()
            .synchronous(SqliteSynchronous::Normal);
        let pool = SqlitePoolOptions::new()
            .max_connections(config.workers.saturating_add(1).min(64) as u32)
            .connect_lazy_with(options);
        SqliteRelayStore {
            pool,
            lease: config.claim_timeout,
            skip_failed_heads: config.failed_head_policy == FailedHeadPolicy::Skip,
        }
    }

    /// The store's own pool (see [`SqliteRelayStore::new`]).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Aggregates whose later events wait behind a retrying or failed head,
    /// longest blocked first, at most `limit` (none for a limit below 1).
    pub async fn blocked_aggregates(
        &self,
        limit: i64,
    ) -> Result<Vec<BlockedAggregate>, StoreError> {
        // SQLite reads a negative LIMIT as "no limit".
        let rows = sqlx::query(BLOCKED)
            .bind(limit.max(0))
            .bind(self.skip_failed_heads)
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
    /// row of each: SQLite would read a negative one as "no limit").
    pub async fn purge_published(
        &self,
        age: Duration,
        keep_keys: Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        let now = now_ms();
        let batch = delete_batch(batch);
        let events = sqlx::query(
            "DELETE FROM outbox_events WHERE seq IN (
                SELECT seq FROM outbox_events
                WHERE status = 'published' AND published_at < ?1
                ORDER BY published_at LIMIT ?2)",
        )
        .bind(now - millis(age))
        .bind(batch)
        .execute(&self.pool)
        .await
        .map_err(StoreError::new("purge published events"))?;
        sqlx::query(
            "DELETE FROM outbox_idempotency_keys WHERE idempotency_key IN (
                SELECT idempotency_key FROM outbox_idempotency_keys
                WHERE created_at < ?1 ORDER BY created_at LIMIT ?2)",
        )
        .bind(now - millis(keep_keys))
        .bind(batch)
        .execute(&self.pool)
        .await
        .map_err(StoreError::new("purge idempotency keys"))?;
        Ok(events.rows_affected())
    }
}

/// Starts the relay of `outbox-core` over the SQLite outbox of `pool`.
pub async fn start_relay<T: Transport>(
    pool: SqlitePool,
    transport: T,
    config: RelayConfig,
) -> Result<Relay, ConfigError> {
    let store = SqliteRelayStore::new(pool, &config);
    Relay::start(store, transport, config, "sqlite").await
}

fn decode_claimed(row: &SqliteRow) -> Result<ClaimedEvent, sqlx::Error> {
    // As bytes: a BLOB (or text that is not UTF-8) in the `TEXT` column
    // is an unreadable payload, not a claim that fails at every try.
    let (payload, unreadable) = ClaimedEvent::read_payload_bytes(row.try_get("payload")?);
    let schema_version: i64 = row.try_get("schema_version")?;
    let attempts: i64 = row.try_get("attempt_count")?;
    Ok(ClaimedEvent {
        envelope: Envelope {
            id: uuid_column(row, "id")?,
            event_type: row.try_get("event_type")?,
            schema_version: schema_version.clamp(0, i64::from(u32::MAX)) as u32,
            aggregate_type: row.try_get("aggregate_type")?,
            aggregate_id: row.try_get("aggregate_id")?,
            aggregate_version: row.try_get("aggregate_version")?,
            occurred_at: time_column(row, "created_at")?,
            traceparent: row.try_get("traceparent")?,
            payload,
        },
        attempts: attempts.clamp(0, i64::from(u32::MAX)) as u32,
        unreadable,
    })
}

/// Events leased to one worker until they are completed, released, or the
/// lease runs out. Dropped unsettled (a worker that panicked mid-batch),
/// it gives its lease back at once (a spawned release), as a PostgreSQL
/// claim's transaction rolls back: the events are claimed again (and
/// published again: at least once) without waiting for the lease to run
/// out. A process that dies, or a runtime shutting down before the release
/// runs, leaves the lease to run out.
#[derive(Debug)]
pub struct SqliteClaim {
    pool: SqlitePool,
    token: String,
    events: Vec<ClaimedEvent>,
    /// Its outcome was recorded or it was released.
    settled: bool,
}

impl Drop for SqliteClaim {
    fn drop(&mut self) {
        if self.settled || self.events.is_empty() {
            return;
        }
        // No runtime (the process is shutting down): the lease runs out.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (pool, token) = (self.pool.clone(), std::mem::take(&mut self.token));
        runtime.spawn(async move {
            if let Err(error) = sqlx::query(RELEASE).bind(&token).execute(&pool).await {
                tracing::warn!(%error, "could not give back an abandoned claim; its lease runs out");
            }
        });
    }
}

impl SqliteClaim {
    async fn record(&self, outcome: &BatchOutcome) -> Result<(), sqlx::Error> {
        let now = now_ms();
        if outcome.failed.is_empty() && outcome.published.len() == self.events.len() {
            // Everything went: one statement, which ends the lease too (an
            // autocommit write takes the write lock at its start).
            return self
                .mark_published(&mut *self.pool.acquire().await?, now, &outcome.published)
                .await;
        }
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        if !outcome.published.is_empty() {
            self.mark_published(&mut tx, now, &outcome.published)
                .await?;
        }
        if !outcome.failed.is_empty() {
            let failures: Vec<serde_json::Value> = outcome
                .failed
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "id": f.event_id.to_string(),
                        "error": f.error,
                        "delay_ms": millis(f.retry_in),
                        "give_up": f.give_up,
                    })
                })
                .collect();
            sqlx::query(FAILED)
                .bind(now)
                .bind(&self.token)
                .bind(serde_json::to_string(&failures).map_err(|e| sqlx::Error::Encode(e.into()))?)
                .execute(&mut *tx)
                .await?;
        }
        // What was neither published nor failed was not attempted: it
        // stays pending, unchanged, free for the next claim.
        sqlx::query(RELEASE)
            .bind(&self.token)
            .execute(&mut *tx)
            .await?;
        tx.commit().await
    }
}

impl SqliteClaim {
    /// Marks `published` published where the lease still holds.
    async fn mark_published(
        &self,
        conn: &mut sqlx::SqliteConnection,
        now: i64,
        published: &[Uuid],
    ) -> Result<(), sqlx::Error> {
        let ids: Vec<String> = published.iter().map(Uuid::to_string).collect();
        let marked = sqlx::query(PUBLISHED)
            .bind(now)
            .bind(&self.token)
            .bind(serde_json::to_string(&ids).map_err(|e| sqlx::Error::Encode(e.into()))?)
            .execute(conn)
            .await?
            .rows_affected();
        if marked < ids.len() as u64 {
            tracing::warn!(
                published = ids.len(),
                marked,
                "the claim's lease ran out before its outcome was recorded; \
                 another worker claimed the rest again and will publish them once more"
            );
        }
        Ok(())
    }
}

impl ClaimedBatch for SqliteClaim {
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
        sqlx::query(RELEASE)
            .bind(&self.token)
            .execute(&self.pool)
            .await
            .map_err(StoreError::new("release claim"))?;
        self.settled = true;
        Ok(())
    }
}

/// Wakes a relay when a transaction of this process that emitted commits.
#[derive(Debug)]
pub struct SqliteWakeups {
    commits: watch::Receiver<u64>,
}

impl WakeupListener for SqliteWakeups {
    async fn wait(&mut self) -> Result<(), StoreError> {
        // The sender lives for the whole process: `changed` fails never.
        let _ = self.commits.changed().await;
        Ok(())
    }
}

impl RelayStore for SqliteRelayStore {
    type Batch = SqliteClaim;
    type Listener = SqliteWakeups;

    async fn claim(&self, limit: usize) -> Result<SqliteClaim, StoreError> {
        let token = Uuid::now_v7().to_string();
        let now = now_ms();
        let rows = async {
            let mut conn = self.pool.acquire().await?;
            let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
            let rows = sqlx::query(CLAIM)
                .bind(&token)
                .bind(now.saturating_add(millis(self.lease)))
                .bind(now)
                .bind(limit.min(i64::MAX as usize) as i64)
                .bind(self.skip_failed_heads)
                .fetch_all(&mut *tx)
                .await?;
            tx.commit().await?;
            Ok::<_, sqlx::Error>(rows)
        }
        .await
        .map_err(StoreError::new("claim"))?;
        let mut events = rows
            .iter()
            .map(decode_claimed)
            .collect::<Result<Vec<_>, _>>()
            .map_err(StoreError::new("decode claimed event"))?;
        events.sort_unstable_by(|a, b| {
            let (a, b) = (&a.envelope, &b.envelope);
            (&a.aggregate_type, &a.aggregate_id, a.aggregate_version).cmp(&(
                &b.aggregate_type,
                &b.aggregate_id,
                b.aggregate_version,
            ))
        });
        Ok(SqliteClaim {
            pool: self.pool.clone(),
            token,
            events,
            settled: false,
        })
    }

    async fn heartbeat(&self, _worker_id: Uuid, _waiting: bool) -> Result<(), StoreError> {
        // Every emit wakes the relays of its process, whoever waits: there
        // is no waiting flag to keep.
        Ok(())
    }

    async fn deregister(&self, _relay_id: Uuid) -> Result<(), StoreError> {
        Ok(())
    }

    async fn listener(&self) -> Result<SqliteWakeups, StoreError> {
        Ok(SqliteWakeups {
            commits: wakeup::subscribe(),
        })
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let decode = StoreError::new("read backlog figures");
        let row = sqlx::query(
            "SELECT
                (SELECT count(*) FROM outbox_events WHERE status = 'pending') AS pending,
                (SELECT count(*) FROM outbox_events WHERE status = 'failed') AS failed,
                (SELECT min(created_at) FROM outbox_events WHERE status = 'pending') AS oldest,
                (SELECT count(*) FROM outbox_events) AS live",
        )
        .fetch_one(&self.pool)
        .await
        .map_err(StoreError::new("read backlog figures"))?;
        let oldest: Option<i64> = row
            .try_get("oldest")
            .map_err(StoreError::new("decode backlog"))?;
        let types = sqlx::query(
            "SELECT event_type,
                    sum(status = 'pending') AS pending,
                    sum(status = 'failed') AS failed,
                    min(CASE WHEN status = 'pending' THEN created_at END) AS oldest
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
            pending: row.try_get("pending").map_err(decode)?,
            failed: row
                .try_get("failed")
                .map_err(StoreError::new("decode backlog"))?,
            oldest_pending_at: oldest.and_then(DateTime::from_timestamp_millis),
            blocked_aggregates: blocked,
            dead_tuples: 0,
            live_tuples: row
                .try_get("live")
                .map_err(StoreError::new("decode backlog"))?,
            event_types,
        })
    }
}
