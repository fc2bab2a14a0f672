//! A relay worker's claiming session: its own connection, on which it
//! holds the ownership locks of its partitions (session advisory locks) and
//! runs every claim.
//!
//! Why locks on the claiming connection and not a lease column with a
//! fencing token: the lock and the claim live and die with the same
//! session. A worker that crashes or loses its connection loses its
//! partitions and its open claim in the same instant, so no other worker
//! can own a partition while a claim from it is still open, and no write
//! to the database has to compare tokens (the session still hands a
//! fencing token to the transport, for what leaves the process). A worker
//! that stalls (SIGSTOP, a long pause) keeps its session until the server ends it: `idle_session_timeout` (the
//! lease) between claims, `idle_in_transaction_session_timeout` (the claim
//! timeout) inside one. The other workers see a member as gone as soon as
//! its backend has exited (`pg_stat_activity`), or when its heartbeat is
//! older than the lease.

use std::future::Future;
use std::time::{Duration, Instant};

use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool};
use uuid::Uuid;

use crate::sql::RelaySql;
use outbox_core::metrics as m;
use outbox_core::relay::StoreError;

/// How a worker's session is set up and rebalanced.
#[derive(Debug, Clone)]
pub(crate) struct SessionSettings {
    /// Session settings, one round trip when the connection opens.
    pub(crate) setup: String,
    /// A member whose heartbeat is older is gone; also the server's
    /// `idle_session_timeout` on the claiming connection.
    pub(crate) lease: Duration,
    /// How often a worker looks at the membership and rebalances.
    pub(crate) rebalance_interval: Duration,
    /// Namespace of the ownership locks (distinct from any other lock the
    /// outbox takes).
    pub(crate) namespace: i32,
    /// The schema's label for metrics.
    pub(crate) label: String,
    /// The server's `idle_in_transaction_session_timeout` on the claiming
    /// connection: a transaction opened ahead of a claim is ended before
    /// half of it has passed.
    pub(crate) claim_timeout: Duration,
    /// How long the worker waits for any answer on its claiming
    /// connection (the statement timeout plus [`DEADLINE_MARGIN`]) before
    /// it drops the connection: see [`within`].
    pub(crate) deadline: Duration,
}

/// What the client-side deadline adds to the statement timeout: time for
/// the server's own cancellation to come back when the network works.
pub(crate) const DEADLINE_MARGIN: Duration = Duration::from_secs(5);

/// Runs `work` (a statement, or the connection's opening) with the
/// client-side deadline. The server bounds its statements by the statement
/// timeout, but on a silent network (packets dropped, no reset) neither
/// the answer nor the cancellation arrives, and a worker would wait as long
/// as the silence lasts. Past the deadline the worker gives the operation
/// up and must drop the connection (its protocol state is unknown): the
/// server rolls back the claim when it notices (its idle and keepalive
/// timeouts), the partitions' locks go with the session, and the worker
/// reports a store error and opens a new session at its next claim.
pub(crate) async fn within<T>(
    deadline: Duration,
    operation: &'static str,
    work: impl Future<Output = sqlx::Result<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(deadline, work).await {
        Ok(result) => result.map_err(StoreError::new(operation)),
        Err(_) => Err(StoreError::new(operation)(sqlx::Error::Io(
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "no answer from PostgreSQL within {deadline:?} (the client-side deadline: statement timeout + {DEADLINE_MARGIN:?}); the connection is dropped"
                ),
            ),
        ))),
    }
}

impl SessionSettings {
    pub(crate) fn setup_sql(
        claim_timeout: Duration,
        statement_timeout: Duration,
        lease: Duration,
    ) -> String {
        // The claim's plan settings (see `PgRelayStore::new`), its idle
        // timeout inside a claim, the statement bound, and the lease:
        // a session idle between claims for longer is ended by the server
        // and its partitions freed. The claim's plan is generic: its
        // parameters (partitions, limit, policy) do not change the best
        // plan (the settings above fix it), and a custom plan of the CTE
        // cost 0.7–1.3 ms of planning per batch (pg_stat_statements, see
        // docs/benchmarks.md).
        format!(
            "SET jit = off; SET enable_sort = off; SET enable_bitmapscan = off; \
             SET idle_in_transaction_session_timeout = '{}ms'; SET statement_timeout = '{}ms'; \
             SET idle_session_timeout = '{}ms'; SET application_name = 'outbox-relay'; \
             SET plan_cache_mode = force_generic_plan",
            claim_timeout.as_millis().max(1),
            statement_timeout.as_millis().max(1),
            lease.as_millis().max(1)
        )
    }
}

/// One worker's session.
#[derive(Default)]
pub(crate) struct WorkerSession {
    /// The claiming connection; `None` after an error (the session, its
    /// locks and any open claim are gone) until the next claim opens one.
    pub(crate) conn: Option<PgConnection>,
    /// Partitions whose lock this session holds, ascending.
    pub(crate) owned: Vec<i16>,
    /// A claim that checked each aggregate's head ran since `owned` last
    /// grew: the next claims take the steady statement.
    pub(crate) steady: bool,
    /// The transaction id of the rebalance in which this session last
    /// took partitions: its claims' fencing token (see
    /// [`outbox_core::relay::fencing_token`]).
    pub(crate) fencing_token: Option<u64>,
    last_rebalance: Option<Instant>,
    /// When the connection was last used: past the lease the server has
    /// ended it (`idle_session_timeout`).
    last_used: Option<Instant>,
    /// When the transaction for the next claim was opened, if one is open
    /// on the connection: after a full batch its `COMMIT` and the next
    /// `BEGIN` go in one round trip (the worker claims again at once). It
    /// is empty (no snapshot, no locks, no transaction id) until the
    /// claim runs in it.
    begun: Option<Instant>,
    /// The client-side deadline of its statements (from the settings).
    deadline: Duration,
}

impl std::fmt::Debug for WorkerSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerSession")
            .field("connected", &self.conn.is_some())
            .field("owned", &self.owned.len())
            .field("begun", &self.begun.is_some())
            .finish()
    }
}

impl WorkerSession {
    /// Opens the connection if there is none and rebalances when due.
    pub(crate) async fn prepare(
        &mut self,
        pool: &PgPool,
        sql: &RelaySql,
        settings: &SessionSettings,
        partitions: i16,
        worker: Uuid,
    ) -> Result<(), StoreError> {
        // A transaction opened ahead of this claim that has been open
        // nearly as long as the server's idle-in-transaction limit (the
        // worker was stalled or descheduled between two batches) has had
        // its session ended: start a new one instead of failing on it.
        if self
            .begun
            .is_some_and(|at| at.elapsed() >= settings.claim_timeout.mul_f64(0.9))
        {
            tracing::debug!(%worker, "relay session idled in its open transaction past the claim timeout; opening a new one");
            self.lose(settings, worker);
        }
        // A worker that slept past the lease (a long poll interval, no
        // events) finds its session ended by the server: start a new one
        // instead of failing a claim on the dead one.
        let margin = settings.lease.mul_f64(0.8);
        if self.conn.is_some() && self.last_used.is_some_and(|at| at.elapsed() >= margin) {
            tracing::debug!(%worker, "relay session idled past the lease; opening a new one");
            self.lose(settings, worker);
        }
        self.last_used = Some(Instant::now());
        self.deadline = settings.deadline;
        if self.conn.is_none() {
            let mut conn = within(
                settings.deadline,
                "open the claiming connection",
                PgConnection::connect_with(&pool.connect_options()),
            )
            .await?;
            within(
                settings.deadline,
                "set up the claiming connection",
                sqlx::raw_sql(AssertSqlSafe(settings.setup.clone())).execute(&mut conn),
            )
            .await?;
            self.conn = Some(conn);
            self.forget_partitions(settings, worker);
        }
        let due = self
            .last_rebalance
            .is_none_or(|at| at.elapsed() >= settings.rebalance_interval);
        // An empty transaction opened ahead of this claim ends first when
        // the rebalance runs (its writes must not wait for the batch) or
        // when it has been open long enough (half the server's limit) that
        // the claim might not finish inside it.
        let stale = self
            .begun
            .is_some_and(|at| at.elapsed() >= settings.claim_timeout / 2);
        if due || stale {
            self.end_begun(settings, worker).await?;
        }
        if due {
            let result = self.rebalance(sql, settings, partitions, worker).await;
            if result.is_err() {
                self.lose(settings, worker);
            }
            result?;
        }
        Ok(())
    }

    /// The session is gone (an error on its connection): so are its locks.
    pub(crate) fn lose(&mut self, settings: &SessionSettings, worker: Uuid) {
        self.conn = None;
        self.begun = None;
        self.forget_partitions(settings, worker);
    }

    /// Ends the empty transaction opened ahead of a claim, if any.
    pub(crate) async fn end_begun(
        &mut self,
        settings: &SessionSettings,
        worker: Uuid,
    ) -> Result<(), StoreError> {
        if self.begun.take().is_none() {
            return Ok(());
        }
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        let ended = within(
            settings.deadline,
            "end the transaction opened ahead",
            sqlx::raw_sql("COMMIT").execute(conn),
        )
        .await;
        if let Err(error) = ended {
            self.lose(settings, worker);
            return Err(error);
        }
        Ok(())
    }

    /// The client-side deadline of the session's statements.
    pub(crate) fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Takes the connection for a claim: whether a transaction is already
    /// open on it (opened by the previous batch's `COMMIT; BEGIN`).
    pub(crate) fn take_for_claim(&mut self) -> (PgConnection, bool) {
        let conn = self.conn.take().expect("prepared connection");
        (conn, self.begun.take().is_some())
    }

    /// The connection back after a claim ended well; `begun` when its
    /// last round trip opened the next claim's transaction. The session's
    /// idle clock starts now (not at the claim's start: a long publish is
    /// not idleness).
    pub(crate) fn give_back(&mut self, conn: PgConnection, begun: bool) {
        let now = Instant::now();
        self.conn = Some(conn);
        self.last_used = Some(now);
        self.begun = begun.then_some(now);
    }

    fn forget_partitions(&mut self, settings: &SessionSettings, worker: Uuid) {
        self.owned.clear();
        self.steady = false;
        self.fencing_token = None;
        self.last_rebalance = None;
        owned_gauge(settings, worker, 0);
    }

    /// Refreshes membership, computes this worker's share (partition `p`
    /// goes to the live worker at index `p mod n`, workers ordered by id),
    /// gives up what is no longer its share and takes what is free of it.
    /// A partition held by a worker that has not given it up yet stays
    /// with it until it does (between two of its claims) or its session ends.
    async fn rebalance(
        &mut self,
        sql: &RelaySql,
        settings: &SessionSettings,
        partitions: i16,
        worker: Uuid,
    ) -> Result<(), StoreError> {
        let conn = self.conn.as_mut().expect("prepared connection");
        let live: Vec<Uuid> = within(
            settings.deadline,
            "refresh relay membership",
            sqlx::query_scalar(AssertSqlSafe(sql.membership.as_str()))
                .bind(worker)
                .bind(&self.owned)
                .bind(settings.lease.as_secs_f64())
                .fetch_one(&mut *conn),
        )
        .await?;
        self.last_rebalance = Some(Instant::now());
        let index = live.iter().position(|id| *id == worker).unwrap_or(0);
        let share = share(partitions, live.len().max(1), index);
        let give_up: Vec<i16> = self
            .owned
            .iter()
            .copied()
            .filter(|p| share.binary_search(p).is_err())
            .collect();
        let take: Vec<i16> = share
            .iter()
            .copied()
            .filter(|p| self.owned.binary_search(p).is_err())
            .collect();
        if give_up.is_empty() && take.is_empty() {
            return Ok(());
        }
        let (taken, _, xid): (Vec<i16>, i64, Option<i64>) = within(
            settings.deadline,
            "rebalance relay partitions",
            sqlx::query_as(AssertSqlSafe(sql.rebalance.as_str()))
                .bind(settings.namespace)
                .bind(&give_up)
                .bind(&take)
                .fetch_one(&mut *conn),
        )
        .await?;
        let before = self.owned.len();
        self.owned.retain(|p| give_up.binary_search(p).is_err());
        if !taken.is_empty() {
            // Its first claim checks the newly owned partitions' heads.
            self.steady = false;
            self.fencing_token = xid.map(|xid| xid as u64);
        }
        self.owned.extend(taken);
        self.owned.sort_unstable();
        if !give_up.is_empty() || self.owned.len() != before {
            metrics::counter!(m::RELAY_REBALANCES, "schema" => settings.label.clone()).increment(1);
            tracing::debug!(
                %worker,
                owned = self.owned.len(),
                gave_up = give_up.len(),
                live = live.len(),
                "relay partitions rebalanced"
            );
        }
        owned_gauge(settings, worker, self.owned.len());
        Ok(())
    }
}

fn owned_gauge(settings: &SessionSettings, worker: Uuid, owned: usize) {
    metrics::gauge!(
        m::RELAY_PARTITIONS_OWNED,
        "schema" => settings.label.clone(),
        "worker" => worker.to_string()
    )
    .set(owned as f64);
}

/// The partitions of the worker at `index` among `workers` live ones.
pub(crate) fn share(partitions: i16, workers: usize, index: usize) -> Vec<i16> {
    (0..partitions)
        .filter(|p| *p as usize % workers == index)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shares_cover_every_partition_once() {
        for workers in 1..=7 {
            let mut all: Vec<i16> = (0..workers).flat_map(|i| share(256, workers, i)).collect();
            all.sort_unstable();
            assert_eq!(all, (0..256).collect::<Vec<i16>>(), "{workers} workers");
            let sizes: Vec<usize> = (0..workers).map(|i| share(256, workers, i).len()).collect();
            assert!(
                sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
                "{sizes:?}"
            );
        }
    }
}
