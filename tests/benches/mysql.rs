//! MySQL/MariaDB store against hand-written SQL, side by side in one run
//! (interleaved rounds, a fresh database per variant, the same server):
//!
//! 1. emit: `MySqlOutbox::emit` against a hand-written `INSERT` of the
//!    same rows (versions counted in memory), ten events per transaction,
//!    and the emit of schema version 1 (counter and insert as two
//!    statements, written out here) against the same baseline; then the
//!    three once more through a TCP proxy that holds every byte 250 µs
//!    each way (a round trip of a few milliseconds with the runtime's
//!    timer; measured and printed), where round trips, not the server,
//!    decide;
//! 2. drain of a backlog (5,000 aggregates) with a transport that
//!    acknowledges at once: `start_relay` (per-aggregate order kept)
//!    against a hand-written claim loop per worker — `SELECT … ORDER BY
//!    seq LIMIT n FOR UPDATE SKIP LOCKED`, publish, `UPDATE … SET status =
//!    'published'`, commit, in READ COMMITTED (no order across workers) —
//!    at 1 and 4 workers, batch 100 and 1,000;
//! 3. a producer during a drain: while four relay workers drain the
//!    backlog, a producer commits ten events per transaction into the same
//!    aggregates; its commit latencies side by side with the claim
//!    latencies (a producer held up by claims' locks would wait as long as
//!    a claim).
//!
//! `cargo bench -p outbox-tests --bench mysql`; settings from the
//! environment: `OUTBOX_BENCH_ROUNDS` (3), `OUTBOX_BENCH_EMITS` (10000),
//! `OUTBOX_BENCH_BACKLOG` (100000). Under `cargo test` (no `--bench`
//! argument) it runs one smoke round of 300 emits and a 2,000-event
//! backlog. Needs the MariaDB/MySQL server of `MYSQL_URL`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_core::relay::{Relay, RelayConfig, RelayStore, StoreError};
use outbox_core::{EventDraft, OutboxEvent};
use outbox_mysql::{MySqlOutbox, MySqlRelayStore};
use outbox_tests::events::Ticked;
use outbox_tests::mysql::MySqlTestDb;
use outbox_tests::proxy::TcpProxy;
use outbox_tests::stats::{median, percentile};
use outbox_tests::transports::DiscardTransport;
use sqlx::{MySqlPool, Row};

/// Aggregates of the emit measurement.
const AGGREGATES: usize = 400;
/// Aggregates of the drained backlog: more than four workers take in
/// batches of 1,000, so per-aggregate order leaves room to scale out.
const BACKLOG_AGGREGATES: usize = 5_000;
const PER_TRANSACTION: usize = 10;

fn setting(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn tick(n: usize) -> Ticked {
    Ticked::new(format!("c{}", n % AGGREGATES), (n / AGGREGATES) as u64)
}

fn backlog_tick(n: usize) -> Ticked {
    Ticked::new(
        format!("b{}", n % BACKLOG_AGGREGATES),
        (n / BACKLOG_AGGREGATES) as u64,
    )
}

fn rate(events: usize, elapsed: Duration) -> f64 {
    events as f64 / elapsed.as_secs_f64()
}

async fn emit_ours(pool: &MySqlPool, total: usize) -> Duration {
    let outbox = MySqlOutbox::new();
    let start = Instant::now();
    for first in (0..total).step_by(PER_TRANSACTION) {
        let mut tx = pool.begin().await.unwrap();
        for n in first..(first + PER_TRANSACTION).min(total) {
            outbox.emit(&mut tx, &tick(n)).await.unwrap();
        }
        tx.commit().await.unwrap();
    }
    start.elapsed()
}

async fn emit_by_hand(pool: &MySqlPool, total: usize) -> Duration {
    let mut versions: HashMap<String, i64> = HashMap::new();
    let start = Instant::now();
    for first in (0..total).step_by(PER_TRANSACTION) {
        let mut tx = pool.begin().await.unwrap();
        for n in first..(first + PER_TRANSACTION).min(total) {
            let event = tick(n);
            let draft = EventDraft::new(&event).unwrap();
            let version = versions.entry(event.aggregate_id()).or_default();
            *version += 1;
            sqlx::query(
                "INSERT INTO outbox_events
                    (id, aggregate_type, aggregate_id, aggregate_version, event_type,
                     schema_version, payload, traceparent, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(draft.event_id().to_string())
            .bind(draft.aggregate_type())
            .bind(draft.aggregate_id())
            .bind(*version)
            .bind(draft.event_type())
            .bind(i64::from(draft.schema_version()))
            .bind(draft.payload_json())
            .bind(draft.traceparent())
            .bind(chrono::Utc::now().timestamp_millis())
            .execute(&mut *tx)
            .await
            .unwrap();
        }
        tx.commit().await.unwrap();
    }
    start.elapsed()
}

/// The emit of release 1 by hand, for comparison: the counter row moved
/// with one statement, the event inserted with a second.
async fn emit_two_statements(pool: &MySqlPool, total: usize) -> Duration {
    let start = Instant::now();
    for first in (0..total).step_by(PER_TRANSACTION) {
        let mut tx = pool.begin().await.unwrap();
        for n in first..(first + PER_TRANSACTION).min(total) {
            let draft = EventDraft::new(&tick(n)).unwrap();
            let counted = sqlx::query(
                "INSERT INTO outbox_aggregate_versions (aggregate_type, aggregate_id, version)
                 VALUES (?, ?, LAST_INSERT_ID(1))
                 ON DUPLICATE KEY UPDATE version = LAST_INSERT_ID(version + 1)",
            )
            .bind(draft.aggregate_type())
            .bind(draft.aggregate_id())
            .execute(&mut *tx)
            .await
            .unwrap();
            sqlx::query(
                "INSERT INTO outbox_events
                    (id, aggregate_type, aggregate_id, aggregate_version, event_type,
                     schema_version, payload, traceparent, created_at)
                 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            )
            .bind(draft.event_id().to_string())
            .bind(draft.aggregate_type())
            .bind(draft.aggregate_id())
            .bind(counted.last_insert_id() as i64)
            .bind(draft.event_type())
            .bind(i64::from(draft.schema_version()))
            .bind(draft.payload_json())
            .bind(draft.traceparent())
            .bind(chrono::Utc::now().timestamp_millis())
            .execute(&mut *tx)
            .await
            .unwrap();
        }
        tx.commit().await.unwrap();
    }
    start.elapsed()
}

/// A pool on `db` through `proxy` (one connection, as one request's
/// transaction has).
async fn through(proxy: &TcpProxy, db: &MySqlTestDb) -> MySqlPool {
    let port: u16 = proxy
        .address()
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .unwrap();
    let options = (*db.pool.connect_options())
        .clone()
        .host("127.0.0.1")
        .port(port);
    sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap()
}

/// The three emits with every byte held `one_way` in each direction (a
/// network round trip of twice that), `emits` events each; returns the
/// rates (hand-written, ours, two statements) and the round trip measured
/// (ms).
async fn emits_over_a_network(one_way: Duration, emits: usize) -> (f64, f64, f64, f64) {
    // The server of MYSQL_URL, wherever it is.
    let url = outbox_tests::mysql::server_url();
    let server: sqlx::mysql::MySqlConnectOptions = url
        .parse()
        .unwrap_or_else(|e| panic!("MYSQL_URL {url:?} is not a MySQL URL: {e}"));
    let proxy = TcpProxy::start(&format!("{}:{}", server.get_host(), server.get_port())).await;
    proxy.delay(one_way);
    let mut rates = [0.0; 4];
    for (variant, rate_of) in rates.iter_mut().enumerate() {
        let db = MySqlTestDb::new().await;
        let pool = through(&proxy, &db).await;
        *rate_of = match variant {
            0 => rate(emits, emit_by_hand(&pool, emits).await),
            1 => rate(emits, emit_ours(&pool, emits).await),
            2 => rate(emits, emit_two_statements(&pool, emits).await),
            _ => {
                // The round trip as measured: the median of 21 pings.
                let mut pings = Vec::new();
                for _ in 0..21 {
                    let started = Instant::now();
                    sqlx::query("SELECT 1").execute(&pool).await.unwrap();
                    pings.push(started.elapsed().as_secs_f64() * 1000.0);
                }
                median(&mut pings)
            }
        };
        pool.close().await;
        db.drop_database().await;
    }
    (rates[0], rates[1], rates[2], rates[3])
}

/// A database with the pending events (and version counters) of
/// `template`, copied on the server (the template is filled once per run).
async fn with_backlog(template: &MySqlTestDb) -> MySqlTestDb {
    let db = MySqlTestDb::new().await;
    for table in ["outbox_events", "outbox_aggregate_versions"] {
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {table} SELECT * FROM `{}`.{table}",
            template.name
        )))
        .execute(&db.pool)
        .await
        .unwrap();
    }
    db
}

async fn fill(db: &MySqlTestDb, total: usize) {
    let outbox = MySqlOutbox::new();
    for first in (0..total).step_by(1000) {
        let drafts = (first..(first + 1000).min(total))
            .map(|n| EventDraft::new(&backlog_tick(n)).unwrap())
            .collect();
        let mut tx = db.pool.begin().await.unwrap();
        outbox.emit_drafts(&mut tx, drafts).await.unwrap();
        tx.commit().await.unwrap();
    }
}

fn relay_config(workers: usize, batch: usize) -> RelayConfig {
    RelayConfig {
        batch_size: batch,
        workers,
        poll_interval: Duration::from_millis(5),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    }
}

/// The relay's drain of `total` events.
async fn drain_ours(db: &MySqlTestDb, total: usize, workers: usize, batch: usize) -> Duration {
    let transport = DiscardTransport::default();
    let config = relay_config(workers, batch);
    let store = MySqlRelayStore::new(db.pool.clone(), &config);
    let start = Instant::now();
    let relay = Relay::start(store, transport.clone(), config, "mysql")
        .await
        .unwrap();
    while (transport.count() as usize) < total {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let elapsed = start.elapsed();
    relay.drain(Duration::from_secs(10)).await.unwrap();
    elapsed
}

/// The hand-written claim loop: each worker locks the next `batch` pending
/// rows it can get, publishes them and marks them in one transaction.
async fn drain_by_hand(db: &MySqlTestDb, total: usize, workers: usize, batch: usize) -> Duration {
    let options = (*db.pool.connect_options()).clone();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(workers as u32)
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::Executor::execute(
                    conn,
                    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
                )
                .await?;
                Ok(())
            })
        })
        .connect_with(options)
        .await
        .unwrap();
    let transport = DiscardTransport::default();
    let start = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|_| {
            let (pool, transport) = (pool.clone(), transport.clone());
            tokio::spawn(async move { hand_worker(pool, transport, batch).await })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = start.elapsed();
    assert_eq!(transport.count() as usize, total, "hand-written drain");
    elapsed
}

async fn hand_worker(pool: MySqlPool, transport: DiscardTransport, batch: usize) {
    use outbox_core::transport::Transport;
    loop {
        let mut tx = pool.begin().await.unwrap();
        let rows = sqlx::query(
            "SELECT seq, id, event_type, schema_version, aggregate_type, aggregate_id,
                    aggregate_version, created_at, traceparent, payload
             FROM outbox_events WHERE status = 'pending'
             ORDER BY seq LIMIT ? FOR UPDATE SKIP LOCKED",
        )
        .bind(batch as i64)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        if rows.is_empty() {
            tx.commit().await.unwrap();
            return;
        }
        let envelopes: Vec<outbox_core::Envelope> = rows
            .iter()
            .map(|row| outbox_core::Envelope {
                id: row.get::<String, _>("id").parse().unwrap(),
                event_type: row.get("event_type"),
                schema_version: row.get::<i32, _>("schema_version") as u32,
                aggregate_type: row.get("aggregate_type"),
                aggregate_id: row.get("aggregate_id"),
                aggregate_version: row.get("aggregate_version"),
                occurred_at: chrono::DateTime::from_timestamp_millis(row.get("created_at"))
                    .unwrap(),
                traceparent: row.get("traceparent"),
                payload: serde_json::value::RawValue::from_string(row.get("payload")).unwrap(),
            })
            .collect();
        let refs: Vec<&outbox_core::Envelope> = envelopes.iter().collect();
        assert!(transport.publish(&refs).await.iter().all(Result::is_ok));
        let mut mark = sqlx::QueryBuilder::<sqlx::MySql>::new(
            "UPDATE outbox_events SET status = 'published', published_at = ",
        );
        mark.push_bind(chrono::Utc::now().timestamp_millis())
            .push(" WHERE seq IN (");
        let mut list = mark.separated(", ");
        for row in &rows {
            list.push_bind(row.get::<i64, _>("seq"));
        }
        mark.push(")");
        mark.build().execute(&mut *tx).await.unwrap();
        tx.commit().await.unwrap();
    }
}

/// The MySQL store with each claim timed.
#[derive(Clone)]
struct TimedClaims {
    inner: MySqlRelayStore,
    claims: Arc<Mutex<Vec<f64>>>,
}

impl RelayStore for TimedClaims {
    type Batch = <MySqlRelayStore as RelayStore>::Batch;
    type Listener = <MySqlRelayStore as RelayStore>::Listener;

    async fn claim(&self, limit: usize) -> Result<Self::Batch, StoreError> {
        let started = Instant::now();
        let batch = self.inner.claim(limit).await;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        self.claims.lock().unwrap().push(ms);
        batch
    }

    fn is_statement_timeout(&self, error: &StoreError) -> bool {
        self.inner.is_statement_timeout(error)
    }

    async fn heartbeat(&self, worker_id: uuid::Uuid, waiting: bool) -> Result<(), StoreError> {
        self.inner.heartbeat(worker_id, waiting).await
    }

    async fn deregister(&self, relay_id: uuid::Uuid) -> Result<(), StoreError> {
        self.inner.deregister(relay_id).await
    }

    async fn listener(&self) -> Result<Self::Listener, StoreError> {
        self.inner.listener().await
    }

    async fn stats(&self) -> Result<outbox_core::relay::OutboxStats, StoreError> {
        self.inner.stats().await
    }
}

/// Commit latencies (ms) of a producer emitting while four workers drain
/// the backlog, and the claims' latencies (ms) meanwhile.
async fn producer_during_drain(
    db: &MySqlTestDb,
    total: usize,
    batch: usize,
) -> (Vec<f64>, Vec<f64>) {
    let transport = DiscardTransport::default();
    let config = relay_config(4, batch);
    let claims = Arc::new(Mutex::new(Vec::new()));
    let store = TimedClaims {
        inner: MySqlRelayStore::new(db.pool.clone(), &config),
        claims: Arc::clone(&claims),
    };
    let relay = Relay::start(store, transport.clone(), config, "mysql")
        .await
        .unwrap();
    let outbox = MySqlOutbox::new();
    let mut commits = Vec::new();
    let mut n = total;
    while (transport.count() as usize) < total * 9 / 10 {
        let started = Instant::now();
        let mut tx = db.pool.begin().await.unwrap();
        for _ in 0..PER_TRANSACTION {
            outbox.emit(&mut tx, &backlog_tick(n)).await.unwrap();
            n += 1;
        }
        tx.commit().await.unwrap();
        commits.push(started.elapsed().as_secs_f64() * 1000.0);
    }
    relay.drain(Duration::from_secs(10)).await.unwrap();
    let claims = claims.lock().unwrap().clone();
    (commits, claims)
}

fn spread(name: &str, values: &mut [f64]) -> String {
    format!(
        "{name} p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (n={})",
        percentile(values, 0.5),
        percentile(values, 0.99),
        percentile(values, 1.0),
        values.len()
    )
}

#[tokio::main]
async fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let rounds = if full {
        setting("OUTBOX_BENCH_ROUNDS", 3)
    } else {
        1
    };
    let emits = if full {
        setting("OUTBOX_BENCH_EMITS", 10_000)
    } else {
        300
    };
    let total = if full {
        setting("OUTBOX_BENCH_BACKLOG", 100_000)
    } else {
        2_000
    };

    let template = MySqlTestDb::new().await;
    fill(&template, total).await;

    let mut emit_ratios = Vec::new();
    let mut two_statement_ratios = Vec::new();
    let mut drain_ratios: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    let mut ours_rates: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    for round in 1..=rounds {
        let hand_db = MySqlTestDb::new().await;
        let hand = rate(emits, emit_by_hand(&hand_db.pool, emits).await);
        hand_db.drop_database().await;
        let ours_db = MySqlTestDb::new().await;
        let ours = rate(emits, emit_ours(&ours_db.pool, emits).await);
        ours_db.drop_database().await;
        let two_db = MySqlTestDb::new().await;
        let two = rate(emits, emit_two_statements(&two_db.pool, emits).await);
        two_db.drop_database().await;
        println!(
            "round {round} emit ({PER_TRANSACTION} per transaction): hand-written {hand:.0}/s, emit {ours:.0}/s, ratio {:.3}; counter and insert as two statements {two:.0}/s, ratio {:.3}",
            ours / hand,
            two / hand
        );
        emit_ratios.push(ours / hand);
        two_statement_ratios.push(two / hand);
        for workers in [1, 4] {
            for batch in [100, 1000] {
                let db = with_backlog(&template).await;
                let hand = rate(total, drain_by_hand(&db, total, workers, batch).await);
                db.drop_database().await;
                let db = with_backlog(&template).await;
                let ours = rate(total, drain_ours(&db, total, workers, batch).await);
                db.drop_database().await;
                println!(
                    "round {round} drain {total} with {workers} workers at batch {batch}: hand-written {hand:.0}/s, relay {ours:.0}/s, ratio {:.3}",
                    ours / hand
                );
                drain_ratios
                    .entry((workers, batch))
                    .or_default()
                    .push(ours / hand);
                ours_rates.entry((workers, batch)).or_default().push(ours);
            }
        }
    }
    let network = Duration::from_micros(250);
    let (hand, ours, two, round_trip) = emits_over_a_network(network, (emits / 5).max(100)).await;
    println!(
        "emit through a proxy holding bytes {network:?} each way (a round trip of {round_trip:.2} ms measured, the timer's granularity included): hand-written {hand:.0}/s, emit {ours:.0}/s, ratio {:.3}; two statements {two:.0}/s, ratio {:.3}",
        ours / hand,
        two / hand
    );
    println!("median emit ratio: {:.3}", median(&mut emit_ratios));
    println!(
        "median ratio of the two-statement emit: {:.3}",
        median(&mut two_statement_ratios)
    );
    for ((workers, batch), mut ratios) in drain_ratios {
        println!(
            "median drain ratio, {workers} workers at batch {batch}: {:.3}",
            median(&mut ratios)
        );
    }
    for batch in [100, 1000] {
        let one = median(ours_rates.get_mut(&(1, batch)).unwrap());
        let four = median(ours_rates.get_mut(&(4, batch)).unwrap());
        println!(
            "relay 4 workers / 1 worker at batch {batch}: {four:.0}/s / {one:.0}/s = {:.2}",
            four / one
        );
    }

    let db = with_backlog(&template).await;
    let (mut commits, mut claims) = producer_during_drain(&db, total, 1000).await;
    db.drop_database().await;
    println!(
        "producer during a 4-worker drain at batch 1000: {}; {}",
        spread("commit (10 events)", &mut commits),
        spread("claim", &mut claims)
    );
    template.drop_database().await;
}
