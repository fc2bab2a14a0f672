//! Relay scale-out: each event's partition is a stable function of its
//! aggregate; live relay workers (in one process or several) divide the
//! partitions through session advisory locks on their claiming
//! connections; a worker that joins, leaves, dies or stalls causes a
//! rebalance, and no aggregate's versions reach the broker out of order
//! while ownership moves. Real PostgreSQL; relays as OS processes
//! (`fault-node relay-log`) where they are killed and stopped.

use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_core::metrics as m;
use outbox_core::relay::{Relay, RelayConfig};
use outbox_tests::events::emit_ticks;
use outbox_tests::transports::RecordingTransport;
use outbox_tests::{TestDb, metrics, wait};
use sqlx::AssertSqlSafe;

/// Partition locks held now by the live workers of this schema.
async fn owned_partitions(db: &TestDb) -> Vec<i64> {
    sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT count(l.*) FROM {} r
         LEFT JOIN pg_locks l ON l.pid = r.backend_pid AND l.locktype = 'advisory'
                              AND l.objsubid = 2 AND l.granted
         WHERE EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = r.backend_pid)
         GROUP BY r.relay_id ORDER BY r.relay_id",
        db.table("outbox_relay_listeners")
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

fn fast(workers: usize) -> RelayConfig {
    RelayConfig {
        workers,
        batch_size: 100,
        poll_interval: Duration::from_millis(50),
        publish_timeout: Duration::from_secs(2),
        claim_timeout: Duration::from_secs(3),
        lease: Duration::from_secs(2),
        rebalance_interval: Duration::from_millis(100),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    }
}

#[tokio::test]
async fn the_partition_of_an_aggregate_never_changes() {
    // Golden values: a new version of the crate (or of PostgreSQL) that
    // changed them would move aggregates between partitions of running
    // relays.
    let db = TestDb::new().await;
    for (aggregate_type, aggregate_id, partition) in [
        ("counter", "c0", 74),
        ("counter", "c1", 169),
        ("order", "42", 208),
        ("piece", "p1", 23),
        ("Zoë", "100%", 178),
        ("a", "b/c", 89),
        ("shipment", "", 101),
    ] {
        let found: i16 = sqlx::query_scalar(AssertSqlSafe(format!(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
             VALUES (gen_random_uuid(), $1, $2, 1, 't.e', 1, '{{}}') RETURNING partition",
            db.table("outbox_events")
        )))
        .bind(aggregate_type)
        .bind(aggregate_id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(found, partition, "{aggregate_type}/{aggregate_id}");
    }
    let count: i32 = db
        .scalar("SELECT partitions FROM {s}.outbox_partitioning")
        .await;
    assert_eq!(count, 256);
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_divide_the_partitions_and_take_over_when_one_leaves() {
    let db = TestDb::with_pool_size(8).await;
    metrics::install();
    emit_ticks(&db.pool, &db.outbox, 200, 20, 500).await;
    let first = RecordingTransport::new();
    let a = Relay::start(
        outbox_core::store::PgRelayStore::new(
            db.pool.clone(),
            db.schema.clone(),
            Default::default(),
            Duration::from_secs(3),
        )
        .with_partitioning(Duration::from_secs(2), Duration::from_millis(100))
        .with_label("scale-out-a"),
        first.clone(),
        fast(2),
        "scale-out-a",
    )
    .await
    .unwrap();
    wait::until(
        "two workers own 128 partitions each",
        Duration::from_secs(20),
        || async { owned_partitions(&db).await == vec![128, 128] },
    )
    .await;

    let second = RecordingTransport::new();
    let b = Relay::start_postgres(db.pool.clone(), db.schema.clone(), second.clone(), fast(1))
        .await
        .unwrap();
    wait::until(
        "three workers share the partitions",
        Duration::from_secs(20),
        || async {
            let mut owned = owned_partitions(&db).await;
            owned.sort();
            owned == vec![85, 85, 86]
        },
    )
    .await;
    assert!(metrics::counter(m::RELAY_REBALANCES, &[("schema", "scale-out-a")]) >= 1);
    // `outbox status` shows who owns what (as of each worker's last
    // rebalance: wait for the rows to catch up with the locks).
    let ops = outbox_core::ops::Ops::new(db.pool.clone(), db.schema.clone());
    wait::until(
        "status lists three owners of 256 partitions",
        Duration::from_secs(10),
        || async {
            let status = ops.status(&Default::default()).await.unwrap();
            let mut all: Vec<i32> = status
                .relay_workers
                .iter()
                .filter(|w| w.connected)
                .flat_map(|w| w.partitions.clone())
                .collect();
            all.sort();
            status.partitions == 256
                && status.relay_workers.iter().filter(|w| w.connected).count() == 3
                && all == (0..256).collect::<Vec<i32>>()
        },
    )
    .await;

    // A clean leave: its session closes and the others take its share.
    b.drain(Duration::from_secs(10)).await.unwrap();
    let left = Instant::now();
    wait::until(
        "the remaining two own everything again",
        Duration::from_secs(20),
        || async { owned_partitions(&db).await == vec![128, 128] },
    )
    .await;
    println!("takeover after a clean leave: {:?}", left.elapsed());

    wait::until("every event published", Duration::from_secs(60), || async {
        db.published().await == 4_000
    })
    .await;
    a.drain(Duration::from_secs(10)).await.unwrap();
    let mut published = first.published();
    published.extend(second.published());
    let mut versions: HashMap<String, Vec<i64>> = HashMap::new();
    for envelope in &published {
        versions
            .entry(envelope.aggregate_id.clone())
            .or_default()
            .push(envelope.aggregate_version);
    }
    // Each relay publishes an aggregate's versions in order; an aggregate
    // that moved went on where the other stopped.
    for (aggregate, mut seen) in versions {
        seen.sort();
        seen.dedup();
        assert_eq!(seen, (1..=20).collect::<Vec<i64>>(), "{aggregate}");
    }
    db.drop_schema().await;
}

/// Publishes nothing anywhere; reports itself down after its first batch
/// until the test lets it up.
#[derive(Clone, Default)]
struct PausingTransport {
    published: std::sync::Arc<std::sync::atomic::AtomicU64>,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl outbox_core::transport::Transport for PausingTransport {
    async fn publish(
        &self,
        events: &[&outbox_core::Envelope],
    ) -> Vec<Result<(), outbox_core::transport::PublishFailure>> {
        use std::sync::atomic::Ordering;
        let before = self
            .published
            .fetch_add(events.len() as u64, Ordering::SeqCst);
        if before == 0 {
            self.down.store(true, Ordering::SeqCst);
        }
        vec![Ok(()); events.len()]
    }

    async fn health(&self) -> outbox_core::transport::TransportHealth {
        if self.down.load(std::sync::atomic::Ordering::SeqCst) {
            outbox_core::transport::TransportHealth::Down {
                reason: "paused by the test".into(),
            }
        } else {
            outbox_core::transport::TransportHealth::Up
        }
    }

    fn name(&self) -> &'static str {
        "pausing"
    }
}

/// After a full batch the worker's commit opens the next claim's
/// transaction in the same round trip. When the worker then does not claim
/// (its transport went down), that empty transaction must be ended before
/// the server's idle-in-transaction timeout (the claim timeout) ends the
/// whole session: the worker keeps its session, its partitions and its
/// backend, and no claim fails.
#[tokio::test]
async fn a_transaction_opened_ahead_of_a_claim_does_not_outlive_a_pause() {
    use std::sync::atomic::Ordering;
    let db = TestDb::with_pool_size(4).await;
    metrics::install();
    emit_ticks(&db.pool, &db.outbox, 10, 5, 50).await;
    let transport = PausingTransport::default();
    let config = RelayConfig {
        workers: 1,
        batch_size: 20,
        poll_interval: Duration::from_millis(50),
        publish_timeout: Duration::from_secs(1),
        claim_timeout: Duration::from_secs(3),
        // Rebalances far apart: only the pause ends the open transaction.
        lease: Duration::from_secs(30),
        rebalance_interval: Duration::from_secs(20),
        error_backoff: Duration::from_millis(300),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    };
    let relay = Relay::start(
        outbox_core::store::PgRelayStore::new(
            db.pool.clone(),
            db.schema.clone(),
            Default::default(),
            config.claim_timeout,
        )
        .with_partitioning(config.lease, config.rebalance_interval)
        .with_label("opened-ahead"),
        transport.clone(),
        config,
        "opened-ahead",
    )
    .await
    .unwrap();
    wait::until("the first full batch", Duration::from_secs(20), || async {
        transport.published.load(Ordering::SeqCst) >= 20
    })
    .await;
    let backend = || async {
        sqlx::query_scalar::<_, Option<i32>>(AssertSqlSafe(format!(
            "SELECT backend_pid FROM {}",
            db.table("outbox_relay_listeners")
        )))
        .fetch_one(&db.pool)
        .await
        .unwrap()
    };
    let before = backend().await;
    assert!(before.is_some(), "the worker's backend is recorded");
    // Down for 2.5 claim timeouts: the worker sleeps and looks again.
    tokio::time::sleep(Duration::from_millis(7_500)).await;
    transport.down.store(false, Ordering::SeqCst);
    wait::until("every event published", Duration::from_secs(20), || async {
        db.published().await == 50
    })
    .await;
    assert_eq!(
        metrics::counter(m::STORE_ERRORS, &[("schema", "opened-ahead")]),
        0,
        "a claim failed: the session was ended under the worker"
    );
    assert_eq!(
        backend().await,
        before,
        "the worker had to open a new session"
    );
    relay.drain(Duration::from_secs(10)).await.unwrap();
    db.drop_schema().await;
}

struct Node(Child);

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn relay_process(db: &TestDb, log: &std::path::Path) -> Node {
    Node(
        Command::new(env!("CARGO_BIN_EXE_fault-node"))
            .args(["relay-log", "100", log.to_str().unwrap(), "20"])
            .env("OUTBOX_TEST_SCHEMA", db.schema.as_str())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start fault-node"),
    )
}

fn signal(node: &Node, name: &str) {
    outbox_tests::faults::signal(&node.0, name);
}

/// Every publish, from every process's log, in time order.
fn merged_log(dir: &std::path::Path) -> Vec<(u128, u32, String, i64)> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            let [at, pid, aggregate, version] = parts.as_slice() else {
                panic!("a torn log line: {line:?}");
            };
            lines.push((
                at.parse().unwrap(),
                pid.parse().unwrap(),
                aggregate.to_string(),
                version.parse().unwrap(),
            ));
        }
    }
    lines.sort_by_key(|l| l.0);
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn order_holds_while_relay_processes_die_stall_and_join() {
    let db = TestDb::with_pool_size(4).await;
    emit_ticks(&db.pool, &db.outbox, 1_000, 100, 2_000).await;
    let logs = tempfile::tempdir().unwrap();
    let log = |n: usize| logs.path().join(format!("relay-{n}.log"));
    let mut relays: Vec<Node> = (0..3).map(|n| relay_process(&db, &log(n))).collect();
    wait::until(
        "three processes own every partition",
        Duration::from_secs(30),
        || async {
            let owned = owned_partitions(&db).await;
            owned.len() == 3 && owned.iter().sum::<i64>() == 256
        },
    )
    .await;

    // SIGKILL: its session ends with the process; the others take over.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let killed = relays.remove(0);
    signal(&killed, "KILL");
    let at = Instant::now();
    wait::until(
        "the killed relay's partitions taken over",
        Duration::from_secs(20),
        || async {
            let owned = owned_partitions(&db).await;
            owned.len() == 2 && owned.iter().sum::<i64>() == 256
        },
    )
    .await;
    let crash_takeover = at.elapsed();
    drop(killed);

    // SIGSTOP past the lease (2 s) and the claim timeout (3 s): the server
    // ends its session; the other takes everything; it wakes, publishes
    // nothing stale, and gets its share back.
    signal(&relays[0], "STOP");
    let at = Instant::now();
    wait::until(
        "the stalled relay's partitions taken over",
        Duration::from_secs(30),
        || async { owned_partitions(&db).await == vec![256] },
    )
    .await;
    let stall_takeover = at.elapsed();
    signal(&relays[0], "CONT");

    // A fourth joins.
    relays.push(relay_process(&db, &log(3)));
    wait::until(
        "every event published",
        Duration::from_secs(120),
        || async { db.published().await == 100_000 },
    )
    .await;
    drop(relays);

    let lines = merged_log(logs.path());
    assert!(lines.len() >= 100_000, "{} publishes", lines.len());
    // The first time each version reached the broker, the versions of each
    // aggregate came in ascending order, all of them.
    let mut first_seen: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let mut publishers: BTreeMap<u32, usize> = BTreeMap::new();
    for (_, pid, aggregate, version) in &lines {
        *publishers.entry(*pid).or_default() += 1;
        let seen = first_seen.entry(aggregate.as_str()).or_default();
        if !seen.contains(version) {
            seen.push(*version);
        }
    }
    assert_eq!(first_seen.len(), 1_000);
    for (aggregate, versions) in &first_seen {
        assert_eq!(
            versions,
            &(1..=100).collect::<Vec<i64>>(),
            "{aggregate}: first publishes in order"
        );
    }
    assert!(publishers.len() >= 3, "publishers: {publishers:?}");
    println!(
        "{} publishes ({} duplicates) by {} processes; takeover after SIGKILL {crash_takeover:?}, after SIGSTOP {stall_takeover:?}",
        lines.len(),
        lines.len() - 100_000,
        publishers.len()
    );
    // Bounded takeover: after a crash within a rebalance or two (the
    // session is gone at once), after a stall within the claim timeout (3 s)
    // plus a rebalance, with room for a loaded machine.
    assert!(
        crash_takeover < Duration::from_secs(5),
        "{crash_takeover:?}"
    );
    assert!(
        stall_takeover < Duration::from_secs(10),
        "{stall_takeover:?}"
    );
    db.drop_schema().await;
}
