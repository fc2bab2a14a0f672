//! The PostgreSQL side of the relay: claim, complete, wake-ups, backlog
//! figures and retention.
//!
//! Claim lifetime: the claiming transaction stays open while the batch is
//! published; its row locks die with it, so a relay that crashes or loses
//! its connection releases everything at once, and a relay that hangs is
//! cut off by `idle_in_transaction_session_timeout` (the configured claim
//! timeout). No lease column, no sweeper.
//!
//! Who claims what: a relay worker claims on its own session, only from the
//! partitions whose ownership lock that session holds (see
//! `session.rs`). [`RelayStore::claim`] on this store, the claim outside a
//! worker, takes rows with `FOR UPDATE SKIP LOCKED`, keeps other such
//! claims off its aggregates with per-aggregate advisory locks
//! (`pg_try_advisory_xact_lock`), and stays off owned partitions: it holds
//! each candidate's partition lock shared for its transaction, which fails
//! while a worker owns the partition and keeps workers from taking it
//! until the claim ends (so while workers own every partition it claims
//! nothing).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgListener;
use sqlx::{AssertSqlSafe, PgPool, Postgres, Row, Transaction};
use uuid::Uuid;

use crate::session::{SessionSettings, WorkerSession, within};
use crate::sql::RelaySql;
use outbox_core::Envelope;
use outbox_core::relay::FailedHeadPolicy;
use outbox_core::relay::retention::delete_batch;
use outbox_core::relay::{
    BatchOutcome, BlockedAggregate, ClaimedBatch, ClaimedEvent, EventTypeStats, OutboxStats,
    RelayStore, StoreError, WakeupListener,
};
use outbox_core::store::SchemaName;

/// The relay store on PostgreSQL.
#[derive(Debug, Clone)]
pub struct PgRelayStore {
    pool: PgPool,
    schema: SchemaName,
    sql: std::sync::Arc<RelaySql>,
    lock_namespace: i32,
    skip_failed_heads: bool,
    claim_timeout: Duration,
    begin_claim: String,
    /// Other live workers exist: claim with advisory locks.
    shared: std::sync::Arc<std::sync::atomic::AtomicBool>,
    channel: String,
    statement_timeout: Duration,
    session_settings: SessionSettings,
    /// Each worker's claiming session, by worker id.
    sessions: std::sync::Arc<
        std::sync::Mutex<HashMap<Uuid, std::sync::Arc<tokio::sync::Mutex<WorkerSession>>>>,
    >,
    /// The partition count fixed at migration, read once.
    partitions: std::sync::Arc<tokio::sync::OnceCell<i16>>,
}

impl PgRelayStore {
    /// A store on `pool` for the outbox in `schema`.
    pub fn new(
        pool: PgPool,
        schema: SchemaName,
        policy: FailedHeadPolicy,
        claim_timeout: Duration,
    ) -> PgRelayStore {
        let skip_failed_heads = policy == FailedHeadPolicy::Skip;
        PgRelayStore {
            sql: std::sync::Arc::new(RelaySql::new(&schema)),
            lock_namespace: lock_namespace(&schema),
            skip_failed_heads,
            // One round trip: the claim transaction gets its idle timeout
            // (a hung relay's rows are released), no JIT (the claim's cost
            // estimate can cross jit_above_cost, and compiling costs more
            // than the whole claim), and a plan that walks the pending
            // index in seq order whatever the statistics say: before
            // PostgreSQL has analyzed a backlog that arrived at once (a
            // broker outage, a bulk import), it estimates a handful of
            // pending rows and reads and sorts all of them instead
            // (measured on 200k fresh rows: 158 ms per claim of 500 with a
            // bitmap scan and a sort, 13 ms with the index in order).
            begin_claim: begin_claim(claim_timeout, DEFAULT_STATEMENT_TIMEOUT),
            claim_timeout,
            statement_timeout: DEFAULT_STATEMENT_TIMEOUT,
            session_settings: SessionSettings {
                setup: SessionSettings::setup_sql(
                    claim_timeout,
                    DEFAULT_STATEMENT_TIMEOUT,
                    DEFAULT_LEASE,
                ),
                lease: DEFAULT_LEASE,
                rebalance_interval: DEFAULT_REBALANCE_INTERVAL,
                namespace: lock_namespace(&schema) ^ crate::sql::OWNERSHIP_SALT,
                label: schema.as_str().to_owned(),
                claim_timeout,
                deadline: DEFAULT_STATEMENT_TIMEOUT + crate::session::DEADLINE_MARGIN,
            },
            sessions: Default::default(),
            partitions: Default::default(),
            channel: schema.notify_channel(),
            shared: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true)),
            schema,
            pool,
        }
    }

    /// Bounds each statement of a claim transaction (the claim, the
    /// outcome, the commit) to `timeout` (default 30 s): a claim stuck
    /// behind a lock (a migration holding the table, say) fails with
    /// PostgreSQL's statement timeout, rolls back and is retried after the
    /// relay's error backoff instead of hanging the worker.
    pub fn with_statement_timeout(mut self, timeout: Duration) -> PgRelayStore {
        self.begin_claim = begin_claim(self.claim_timeout, timeout);
        self.statement_timeout = timeout;
        self.session_settings.setup =
            SessionSettings::setup_sql(self.claim_timeout, timeout, self.session_settings.lease);
        self.session_settings.deadline = timeout.saturating_add(crate::session::DEADLINE_MARGIN);
        self
    }

    /// Sets how the relay's workers divide the partitions (see
    /// [`RelayConfig::lease`](outbox_core::relay::RelayConfig::lease)): a member
    /// whose heartbeat is older than `lease`, or whose claiming session
    /// was idle between claims for that long, is gone; each worker looks
    /// at the membership every `rebalance_interval`. Defaults: 10 s, 1 s.
    pub fn with_partitioning(
        mut self,
        lease: Duration,
        rebalance_interval: Duration,
    ) -> PgRelayStore {
        self.session_settings.lease = lease;
        self.session_settings.rebalance_interval = rebalance_interval;
        self.session_settings.setup =
            SessionSettings::setup_sql(self.claim_timeout, self.statement_timeout, lease);
        self
    }

    /// The metrics label of this store's schema (default: the schema name).
    pub fn with_label(mut self, label: impl Into<String>) -> PgRelayStore {
        self.session_settings.label = label.into();
        self
    }

    /// The partitions the worker `worker_id` of this process owns now
    /// (empty before its first claim).
    pub async fn owned_partitions(&self, worker_id: Uuid) -> Vec<i16> {
        match self.existing_session(worker_id) {
            Some(session) => session.lock().await.owned.clone(),
            None => Vec::new(),
        }
    }

    /// The worker's session if it has claimed before.
    fn existing_session(
        &self,
        worker_id: Uuid,
    ) -> Option<std::sync::Arc<tokio::sync::Mutex<WorkerSession>>> {
        self.sessions
            .lock()
            .expect("sessions")
            .get(&worker_id)
            .cloned()
    }

    fn session(&self, worker_id: Uuid) -> std::sync::Arc<tokio::sync::Mutex<WorkerSession>> {
        std::sync::Arc::clone(
            self.sessions
                .lock()
                .expect("sessions")
                .entry(worker_id)
                .or_default(),
        )
    }

    async fn partition_count(&self) -> Result<i16, StoreError> {
        self.partitions
            .get_or_try_init(|| async {
                let count: i32 = sqlx::query_scalar(AssertSqlSafe(self.sql.partitions.as_str()))
                    .fetch_one(&self.pool)
                    .await
                    .map_err(StoreError::new("read the partition count"))?;
                Ok(count.clamp(1, i16::MAX as i32) as i16)
            })
            .await
            .copied()
    }

    /// A claim for one worker on its own session: only from the
    /// partitions it owns (all of them: the lone worker's claim).
    async fn claim_owned(&self, worker_id: Uuid, limit: usize) -> Result<PgClaim, StoreError> {
        let partitions = self.partition_count().await?;
        let mut session = self.session(worker_id).lock_owned().await;
        session
            .prepare(
                &self.pool,
                &self.sql,
                &self.session_settings,
                partitions,
                worker_id,
            )
            .await?;
        if session.owned.is_empty() {
            session.end_begun(&self.session_settings, worker_id).await?;
            return Ok(PgClaim {
                tx: ClaimTx::Idle,
                events: Vec::new(),
                sql: std::sync::Arc::clone(&self.sql),
                skip_failed_heads: self.skip_failed_heads,
                full: false,
            });
        }
        let (mut conn, begun) = session.take_for_claim();
        let all = session.owned.len() == partitions as usize;
        let owned = partition_bitmap(&session.owned, partitions);
        let deadline = self.session_settings.deadline;
        let result = async {
            if !begun {
                within(
                    deadline,
                    "begin claim",
                    sqlx::raw_sql("BEGIN").execute(&mut conn),
                )
                .await?;
            }
            let run = |steady: bool| {
                let sql = match (steady, all) {
                    (false, true) => &self.sql.claim_checked_all,
                    (false, false) => &self.sql.claim_checked_owned,
                    (true, true) => &self.sql.claim_steady_all,
                    (true, false) => &self.sql.claim_steady_owned,
                };
                sqlx::query(AssertSqlSafe(sql.as_str()))
                    .bind(&owned)
                    .bind(limit as i64)
                    .bind(self.skip_failed_heads)
            };
            if session.steady {
                match within(deadline, "claim", run(true).fetch_all(&mut conn)).await {
                    Ok(rows) => return Ok(rows),
                    // A row of its partitions is locked by something other
                    // than a claim of this worker (an operator's statement,
                    // a hand-held lock): the steady claim does not pass
                    // over it, this batch takes the checked claim instead.
                    Err(error) if crate::has_sqlstate(&error.source, LOCK_NOT_AVAILABLE) => {
                        tracing::debug!(%worker_id, "a row of the worker's partitions is locked elsewhere; checked claim");
                        within(
                            deadline,
                            "begin claim",
                            sqlx::raw_sql("ROLLBACK; BEGIN").execute(&mut conn),
                        )
                        .await?;
                    }
                    Err(error) => return Err(error),
                }
            }
            within(deadline, "claim", run(false).fetch_all(&mut conn)).await
        }
        .await;
        let rows = match result {
            Ok(rows) => rows,
            Err(error) => {
                // The connection goes with its locks and its transaction.
                session.lose(&self.session_settings, worker_id);
                return Err(error);
            }
        };
        let events = match decode_sorted(&rows) {
            Ok(events) => events,
            Err(error) => {
                session.lose(&self.session_settings, worker_id);
                return Err(error);
            }
        };
        let full = events.len() >= limit;
        session.steady = true;
        Ok(PgClaim {
            tx: ClaimTx::Session { conn, session },
            events,
            sql: std::sync::Arc::clone(&self.sql),
            skip_failed_heads: self.skip_failed_heads,
            full,
        })
    }

    fn claim_sql(&self) -> &str {
        if self.shared.load(std::sync::atomic::Ordering::Relaxed) {
            &self.sql.claim_shared
        } else {
            &self.sql.claim_alone
        }
    }

    /// The pool this store uses.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Aggregates whose later events wait behind a retrying or failed head,
    /// oldest first, at most `limit` (none for a limit below 1).
    pub async fn blocked_aggregates(
        &self,
        limit: i64,
    ) -> Result<Vec<BlockedAggregate>, StoreError> {
        let rows = sqlx::query(AssertSqlSafe(self.sql.blocked.as_str()))
            .bind(limit.max(0))
            .bind(self.skip_failed_heads)
            .fetch_all(&self.pool)
            .await
            .map_err(StoreError::new("list blocked aggregates"))?;
        rows.iter()
            .map(|row| {
                Ok(BlockedAggregate {
                    aggregate_type: row.try_get(0)?,
                    aggregate_id: row.try_get(1)?,
                    head_event_id: row.try_get(2)?,
                    head_status: row.try_get(3)?,
                    last_error: row.try_get(4)?,
                    blocked_since: row.try_get(5)?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(StoreError::new("list blocked aggregates"))
    }

    /// Runs a claim under `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)`, in a
    /// transaction with the claim's settings that is rolled back (nothing
    /// is claimed or marked), and returns the plan. Which claim depends on
    /// the live relay workers: with two or more, the shared claim over
    /// every partition (per-aggregate advisory locks; the workers
    /// themselves each claim from their own partitions, the same walk of
    /// the pending index); otherwise the lone worker's, as it runs after
    /// taking its partitions (its later claims are the same without the
    /// count for the fast path). Operators use it to see that the claim walks the pending
    /// index and how many buffers it touches (dead tuples and a held xmin
    /// horizon show up here first).
    ///
    /// ```no_run
    /// # async fn example(store: outbox_postgres::PgRelayStore) -> Result<(), Box<dyn std::error::Error>> {
    /// let explained = store.explain_claim(500).await?;
    /// println!("{} claim, {:.2} ms", explained.variant, explained.execution_ms().unwrap_or(0.0));
    /// # Ok(()) }
    /// ```
    pub async fn explain_claim(&self, limit: usize) -> Result<ClaimPlan, StoreError> {
        let live: i64 = sqlx::query_scalar(AssertSqlSafe(self.sql.live_workers.as_str()))
            .fetch_one(&self.pool)
            .await
            .map_err(StoreError::new("count live relay workers"))?;
        let (variant, claim) = if live >= 2 {
            (ClaimVariant::Shared, &self.sql.explain_shared)
        } else {
            (ClaimVariant::Alone, &self.sql.claim_checked_all)
        };
        let mut transaction = self
            .pool
            .begin_with(AssertSqlSafe(self.begin_claim.clone()))
            .await
            .map_err(StoreError::new("begin explain"))?;
        let sql = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {claim}");
        let query = sqlx::query_scalar(AssertSqlSafe(sql));
        let query = match variant {
            ClaimVariant::Shared => query.bind(self.lock_namespace),
            ClaimVariant::Alone => query.bind(Vec::<u8>::new()),
        };
        let plan: serde_json::Value = query
            .bind(limit as i64)
            .bind(self.skip_failed_heads)
            .fetch_one(&mut *transaction)
            .await
            .map_err(StoreError::new("explain claim"))?;
        transaction
            .rollback()
            .await
            .map_err(StoreError::new("end explain"))?;
        Ok(ClaimPlan {
            variant,
            sql: claim.clone(),
            plan,
        })
    }

    /// Deletes one batch of published events older than `age`; returns how
    /// many went. Never touches pending or failed events. `batch` is taken
    /// within `1..=100_000`.
    pub async fn purge_published(&self, age: Duration, batch: i64) -> Result<u64, StoreError> {
        sqlx::query(AssertSqlSafe(self.sql.purge_published.as_str()))
            .bind(age.as_secs_f64())
            .bind(delete_batch(batch))
            .execute(&self.pool)
            .await
            .map(|done| done.rows_affected())
            .map_err(StoreError::new("purge published events"))
    }

    /// Deletes one batch of idempotency keys older than `age`; `batch` is
    /// taken within `1..=100_000`.
    pub async fn purge_idempotency_keys(
        &self,
        age: Duration,
        batch: i64,
    ) -> Result<u64, StoreError> {
        sqlx::query(AssertSqlSafe(self.sql.purge_keys.as_str()))
            .bind(age.as_secs_f64())
            .bind(delete_batch(batch))
            .execute(&self.pool)
            .await
            .map(|done| done.rows_affected())
            .map_err(StoreError::new("purge idempotency keys"))
    }
}

/// What [`PgRelayStore::with_statement_timeout`] is when not set.
pub const DEFAULT_STATEMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// The lease when [`PgRelayStore::with_partitioning`] is not called.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// The rebalance interval when [`PgRelayStore::with_partitioning`] is not called.
pub const DEFAULT_REBALANCE_INTERVAL: Duration = Duration::from_secs(1);

/// The statements that open a claim transaction, in one round trip.
fn begin_claim(claim_timeout: Duration, statement_timeout: Duration) -> String {
    format!(
        "BEGIN; SET LOCAL jit = off; SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off; \
         SET LOCAL idle_in_transaction_session_timeout = '{}ms'; SET LOCAL statement_timeout = '{}ms'",
        claim_timeout.as_millis().max(1),
        statement_timeout.as_millis().max(1)
    )
}

/// Which claim statement [`PgRelayStore::explain_claim`] explained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimVariant {
    /// A lone live worker owning every partition: no advisory locks.
    Alone,
    /// Several live workers: the claim over every partition with each
    /// candidate aggregate's advisory lock (as [`RelayStore::claim`] runs
    /// it, without the partition locks that keep that one off owned
    /// partitions).
    Shared,
}

impl std::fmt::Display for ClaimVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClaimVariant::Alone => "lone-worker",
            ClaimVariant::Shared => "shared",
        })
    }
}

/// The plan of the claim, as [`PgRelayStore::explain_claim`] found it.
#[derive(Debug, Clone)]
pub struct ClaimPlan {
    /// Which claim the relay runs with the workers alive now.
    pub variant: ClaimVariant,
    /// Its SQL text.
    pub sql: String,
    /// `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` output.
    pub plan: serde_json::Value,
}

impl ClaimPlan {
    /// The execution time PostgreSQL measured, in milliseconds.
    pub fn execution_ms(&self) -> Option<f64> {
        self.plan.get(0)?.get("Execution Time")?.as_f64()
    }

    /// Rows the plan read from the pending index (`outbox_events_pending_idx`),
    /// over all its nodes and loops. A healthy claim of `n` reads about
    /// `n` to `2n`; a claim that reads the whole backlog shows it here.
    pub fn pending_index_rows(&self) -> u64 {
        fn walk(node: &serde_json::Value) -> u64 {
            let own = if node.get("Index Name").and_then(|n| n.as_str())
                == Some("outbox_events_pending_idx")
            {
                let rows = node
                    .get("Actual Rows")
                    .and_then(|r| r.as_f64())
                    .unwrap_or(0.0);
                let loops = node
                    .get("Actual Loops")
                    .and_then(|l| l.as_f64())
                    .unwrap_or(1.0);
                (rows * loops) as u64
            } else {
                0
            };
            own + node
                .get("Plans")
                .and_then(|p| p.as_array())
                .map(|plans| plans.iter().map(walk).sum())
                .unwrap_or(0)
        }
        self.plan
            .get(0)
            .and_then(|p| p.get("Plan"))
            .map(walk)
            .unwrap_or(0)
    }

    /// Whether any node of the plan scans the outbox table sequentially
    /// (reads every row) instead of through an index.
    pub fn scans_outbox_sequentially(&self) -> bool {
        fn walk(node: &serde_json::Value) -> bool {
            let seq = node.get("Node Type").and_then(|t| t.as_str()) == Some("Seq Scan")
                && node.get("Relation Name").and_then(|r| r.as_str()) == Some("outbox_events");
            seq || node
                .get("Plans")
                .and_then(|p| p.as_array())
                .is_some_and(|plans| plans.iter().any(walk))
        }
        self.plan
            .get(0)
            .and_then(|p| p.get("Plan"))
            .is_some_and(walk)
    }
}

/// The partitions as the claim takes them: bit `p` (bit `p % 8` of byte
/// `p / 8`, as PostgreSQL's `get_bit` on `bytea` counts) set for each.
fn partition_bitmap(owned: &[i16], partitions: i16) -> Vec<u8> {
    let mut bits = vec![0u8; (partitions.max(1) as usize).div_ceil(8)];
    for &partition in owned.iter().filter(|p| (0..partitions).contains(*p)) {
        let p = partition as usize;
        bits[p / 8] |= 1 << (p % 8);
    }
    bits
}

/// PostgreSQL refused a row lock at once (`NOWAIT`).
const LOCK_NOT_AVAILABLE: &str = "55P03";

/// The advisory lock namespace of a schema, so relays of different
/// schemas in one database never contend.
fn lock_namespace(schema: &SchemaName) -> i32 {
    // FNV-1a over the name; stable across processes and versions.
    let mut hash: u32 = 0x811c_9dc5;
    for byte in schema.as_str().bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    hash as i32
}

/// A claim: the open transaction and the events it locked.
pub struct PgClaim {
    tx: ClaimTx,
    events: Vec<ClaimedEvent>,
    sql: std::sync::Arc<RelaySql>,
    skip_failed_heads: bool,
    /// The claim took as many events as it asked for: the worker claims
    /// again at once, so a session's commit opens the next transaction in
    /// the same round trip.
    full: bool,
}

/// Where a claim's transaction runs.
enum ClaimTx {
    /// On a pooled connection ([`RelayStore::claim`]).
    Pooled(Transaction<'static, Postgres>),
    /// On a worker's session; the connection goes back to it at the end.
    Session {
        conn: sqlx::PgConnection,
        session: tokio::sync::OwnedMutexGuard<WorkerSession>,
    },
    /// Nothing claimed, no transaction (a worker that owns no partition).
    Idle,
}

impl ClaimedBatch for PgClaim {
    fn events(&self) -> &[ClaimedEvent] {
        &self.events
    }

    fn fencing_token(&self) -> Option<u64> {
        match &self.tx {
            ClaimTx::Session { session, .. } => session.fencing_token,
            ClaimTx::Pooled(_) | ClaimTx::Idle => None,
        }
    }

    async fn complete(mut self, outcome: BatchOutcome) -> Result<(), StoreError> {
        // The claim marked every event published; set back the ones that
        // were not, in one statement, and only when there are any.
        let published: HashSet<Uuid> = outcome.published.iter().copied().collect();
        let failed_ids: HashSet<Uuid> = outcome.failed.iter().map(|f| f.event_id).collect();
        let unattempted: Vec<Uuid> = self
            .events
            .iter()
            .map(|e| e.envelope.id)
            .filter(|id| !published.contains(id) && !failed_ids.contains(id))
            .collect();
        if !outcome.failed.is_empty() || !unattempted.is_empty() {
            let failed = &outcome.failed;
            let previous: HashMap<Uuid, i32> = self
                .events
                .iter()
                .map(|e| (e.envelope.id, e.attempts as i32))
                .collect();
            let ids: Vec<Uuid> = failed.iter().map(|f| f.event_id).collect();
            let types: Vec<&str> = failed.iter().map(|f| f.aggregate_type.as_str()).collect();
            let aggregate_ids: Vec<&str> = failed.iter().map(|f| f.aggregate_id.as_str()).collect();
            let errors: Vec<&str> = failed.iter().map(|f| f.error.as_str()).collect();
            let delays: Vec<i64> = failed
                .iter()
                .map(|f| f.retry_in.as_millis().min(i64::MAX as u128) as i64)
                .collect();
            let give_up: Vec<bool> = failed.iter().map(|f| f.give_up).collect();
            let attempts: Vec<i32> = failed
                .iter()
                .map(|f| previous.get(&f.event_id).copied().unwrap_or(0))
                .collect();
            let query = sqlx::query(AssertSqlSafe(self.sql.complete.as_str()))
                .bind(&ids)
                .bind(&types)
                .bind(&aggregate_ids)
                .bind(&errors)
                .bind(&delays)
                .bind(&give_up)
                .bind(&attempts)
                .bind(&unattempted)
                .bind(self.skip_failed_heads);
            match &mut self.tx {
                ClaimTx::Pooled(transaction) => {
                    query
                        .execute(&mut **transaction)
                        .await
                        .map_err(StoreError::new("record batch outcome"))?;
                }
                ClaimTx::Session { conn, session } => {
                    let recorded = within(
                        session.deadline(),
                        "record batch outcome",
                        query.execute(&mut *conn),
                    )
                    .await;
                    if recorded.is_err() {
                        // The connection goes (dropped with this claim),
                        // and with it the session's locks.
                        session.owned.clear();
                    }
                    recorded?;
                }
                ClaimTx::Idle => return Ok(()),
            };
        }
        let command = if self.full {
            End::CommitAndBegin
        } else {
            End::Commit
        };
        self.tx.end(command).await
    }

    async fn release(self) -> Result<(), StoreError> {
        self.tx.end(End::Rollback).await
    }
}

/// How a claim's transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Commit,
    /// Commits and, on a worker's session, opens the next claim's
    /// transaction in the same round trip.
    CommitAndBegin,
    Rollback,
}

impl End {
    fn operation(self) -> &'static str {
        match self {
            End::Commit | End::CommitAndBegin => "commit batch outcome",
            End::Rollback => "release claim",
        }
    }
}

impl ClaimTx {
    /// Commits or rolls back; a session's connection goes back to it, or,
    /// after an error, is closed (its locks and transaction with it).
    async fn end(self, end: End) -> Result<(), StoreError> {
        match self {
            ClaimTx::Pooled(transaction) => {
                let ended = if end == End::Rollback {
                    transaction.rollback().await
                } else {
                    transaction.commit().await
                };
                ended.map_err(StoreError::new(end.operation()))
            }
            ClaimTx::Session {
                mut conn,
                mut session,
            } => {
                let command = match end {
                    End::Commit => "COMMIT",
                    End::CommitAndBegin => "COMMIT; BEGIN",
                    End::Rollback => "ROLLBACK",
                };
                let deadline = session.deadline();
                match within(
                    deadline,
                    end.operation(),
                    sqlx::raw_sql(command).execute(&mut conn),
                )
                .await
                {
                    Ok(_) => {
                        session.give_back(conn, end == End::CommitAndBegin);
                        Ok(())
                    }
                    Err(error) => {
                        session.owned.clear();
                        Err(error)
                    }
                }
            }
            ClaimTx::Idle => Ok(()),
        }
    }
}

/// NOTIFY listener on the outbox channel.
pub struct PgWakeups {
    listener: PgListener,
}

impl WakeupListener for PgWakeups {
    async fn wait(&mut self) -> Result<(), StoreError> {
        self.listener
            .recv()
            .await
            .map(|_| ())
            .map_err(StoreError::new("receive notification"))
    }
}

impl RelayStore for PgRelayStore {
    type Batch = PgClaim;
    type Listener = PgWakeups;

    /// SQLSTATE 57014: the claim's `statement_timeout` (or a cancel
    /// request) cut it off.
    fn is_statement_timeout(&self, error: &StoreError) -> bool {
        crate::is_statement_timeout(error)
    }

    async fn claim(&self, limit: usize) -> Result<PgClaim, StoreError> {
        let mut transaction = self
            .pool
            .begin_with(AssertSqlSafe(self.begin_claim.clone()))
            .await
            .map_err(StoreError::new("begin claim"))?;
        let rows = sqlx::query(AssertSqlSafe(self.claim_sql()))
            .bind(self.lock_namespace)
            .bind(limit as i64)
            .bind(self.skip_failed_heads)
            .fetch_all(&mut *transaction)
            .await
            .map_err(StoreError::new("claim"))?;
        let events = decode_sorted(&rows)?;
        Ok(PgClaim {
            tx: ClaimTx::Pooled(transaction),
            events,
            sql: std::sync::Arc::clone(&self.sql),
            skip_failed_heads: self.skip_failed_heads,
            full: false,
        })
    }

    async fn claim_for(&self, worker_id: Uuid, limit: usize) -> Result<PgClaim, StoreError> {
        self.claim_owned(worker_id, limit).await
    }

    async fn pause(&self, worker_id: Uuid) -> Result<(), StoreError> {
        match self.existing_session(worker_id) {
            Some(session) => {
                session
                    .lock()
                    .await
                    .end_begun(&self.session_settings, worker_id)
                    .await
            }
            None => Ok(()),
        }
    }

    async fn heartbeat(&self, worker_id: Uuid, waiting: bool) -> Result<(), StoreError> {
        // Under the same client-side deadline as the session's statements:
        // a worker must not wait on a silent network here either.
        let others: i64 = within(
            self.session_settings.deadline,
            "heartbeat",
            sqlx::query_scalar(AssertSqlSafe(self.sql.heartbeat.as_str()))
                .bind(worker_id)
                .bind(waiting)
                .fetch_one(&self.pool),
        )
        .await?;
        self.shared
            .store(others > 0, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    async fn deregister(&self, relay_id: Uuid) -> Result<(), StoreError> {
        // Closing the session gives up its partitions at once.
        let session = self.sessions.lock().expect("sessions").remove(&relay_id);
        if let Some(session) = session {
            let mut session = session.lock().await;
            if let Some(conn) = session.conn.take() {
                let _ = sqlx::Connection::close(conn).await;
            }
            session.owned.clear();
        }
        sqlx::query(AssertSqlSafe(self.sql.deregister.as_str()))
            .bind(relay_id)
            .execute(&self.pool)
            .await
            .map(|_| ())
            .map_err(StoreError::new("deregister relay"))
    }

    async fn listener(&self) -> Result<PgWakeups, StoreError> {
        let mut listener = PgListener::connect_with(&self.pool)
            .await
            .map_err(StoreError::new("connect listener"))?;
        listener
            .listen(&self.channel)
            .await
            .map_err(StoreError::new("listen"))?;
        Ok(PgWakeups { listener })
    }

    async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let table = format!("{}.outbox_events", self.schema.quoted());
        let row = sqlx::query(AssertSqlSafe(self.sql.stats.as_str()))
            .bind(table)
            .bind(self.skip_failed_heads)
            .fetch_one(&self.pool)
            .await
            .map_err(StoreError::new("read backlog figures"))?;
        let read = || -> Result<OutboxStats, sqlx::Error> {
            let by_type: String = row.try_get("event_types")?;
            let event_types: Vec<EventTypeStats> =
                serde_json::from_str(&by_type).map_err(|e| sqlx::Error::Decode(e.into()))?;
            Ok(OutboxStats {
                pending: event_types.iter().map(|t| t.pending).sum(),
                failed: event_types.iter().map(|t| t.failed).sum(),
                oldest_pending_at: event_types.iter().filter_map(|t| t.oldest_pending_at).min(),
                blocked_aggregates: row.try_get("blocked")?,
                dead_tuples: row.try_get("dead")?,
                live_tuples: row.try_get("live")?,
                event_types,
            })
        };
        read().map_err(StoreError::new("decode backlog figures"))
    }
}

/// The claimed rows as events, sorted by aggregate and version (the
/// order the waves need).
fn decode_sorted(rows: &[sqlx::postgres::PgRow]) -> Result<Vec<ClaimedEvent>, StoreError> {
    let mut events = rows
        .iter()
        .map(decode_claimed)
        .collect::<Result<Vec<_>, sqlx::Error>>()
        .map_err(StoreError::new("decode claimed event"))?;
    events.sort_unstable_by(|a, b| {
        let (a, b) = (&a.envelope, &b.envelope);
        (&a.aggregate_type, &a.aggregate_id, a.aggregate_version).cmp(&(
            &b.aggregate_type,
            &b.aggregate_id,
            b.aggregate_version,
        ))
    });
    Ok(events)
}

fn decode_claimed(row: &sqlx::postgres::PgRow) -> Result<ClaimedEvent, sqlx::Error> {
    let (payload, unreadable) = ClaimedEvent::read_payload(row.try_get("payload")?);
    let schema_version: i32 = row.try_get("schema_version")?;
    let attempts: i32 = row.try_get("attempt_count")?;
    let occurred_at: DateTime<Utc> = row.try_get("created_at")?;
    Ok(ClaimedEvent {
        envelope: Envelope {
            id: row.try_get("id")?,
            event_type: row.try_get("event_type")?,
            schema_version: schema_version.max(0) as u32,
            aggregate_type: row.try_get("aggregate_type")?,
            aggregate_id: row.try_get("aggregate_id")?,
            aggregate_version: row.try_get("aggregate_version")?,
            occurred_at,
            traceparent: row.try_get("traceparent")?,
            payload,
        },
        attempts: attempts.max(0) as u32,
        unreadable,
    })
}

#[cfg(test)]
mod tests {
    use super::partition_bitmap;

    #[test]
    fn the_partition_bitmap_sets_bit_p_mod_8_of_byte_p_div_8() {
        let bits = partition_bitmap(&[0, 9, 255], 256);
        assert_eq!(bits.len(), 32);
        assert_eq!(bits[0], 0b0000_0001);
        assert_eq!(bits[1], 0b0000_0010);
        assert_eq!(bits[31], 0b1000_0000);
        assert_eq!(bits.iter().map(|b| b.count_ones()).sum::<u32>(), 3);
        // Out of range partitions are ignored, a count not divisible by 8 rounds up.
        assert_eq!(partition_bitmap(&[-1, 12], 10), vec![0, 0]);
        assert_eq!(partition_bitmap(&[9], 10), vec![0, 0b10]);
    }
}
