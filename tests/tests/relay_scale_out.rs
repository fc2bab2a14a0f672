//! Relay scale-out: each event's partition is a stable function of its
//! aggregate; live relay workers (in one process or several) divide the
//! partitions through session advisory locks on their claiming
//! connections; a worker that joins, leaves, dies or stalls causes a
//! rebalance, and no aggregate's versions reach the broker out of order
//! while ownership moves. Real PostgreSQL; relays as OS processes
//! (`fault-node relay-log`) where they are killed and stopped.

use outbox_postgres::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_core::metrics as m;
use outbox_core::relay::{Relay, RelayConfig};
use outbox_postgres::PgRelayStore;
use outbox_tests::events::{Ticked, emit_ticks};
use outbox_tests::transports::{RecordingTransport, versions_by_aggregate};
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

/// The PostgreSQL store a relay with `config` uses (its failed-head
/// policy, claim timeout, lease and rebalance interval).
fn partitioned_store(db: &TestDb, config: &RelayConfig) -> PgRelayStore {
    PgRelayStore::new(
        db.pool.clone(),
        db.schema.clone(),
        config.failed_head_policy,
        config.claim_timeout,
    )
    .with_partitioning(config.lease, config.rebalance_interval)
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
        partitioned_store(&db, &fast(2)).with_label("scale-out-a"),
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
    let ops = outbox_postgres::Ops::new(db.pool.clone(), db.schema.clone());
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
    let versions = versions_by_aggregate(&published);
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
        partitioned_store(&db, &config).with_label("opened-ahead"),
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

/// A worker's claims after its first run without the head check: they
/// must never pass over a row of its partitions that something else holds
/// locked (an operator's statement, a hand-held `SELECT … FOR UPDATE`), or
/// the next version of that aggregate would overtake it.
#[tokio::test]
async fn a_row_locked_elsewhere_holds_back_its_aggregate_and_nothing_else() {
    let db = TestDb::with_pool_size(4).await;
    // c0 … c4, twenty versions each, interleaved: c0's first is the oldest row.
    emit_ticks(&db.pool, &db.outbox, 5, 20, 100).await;
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query(AssertSqlSafe(format!(
        "SELECT id FROM {} WHERE aggregate_id = 'c0' AND aggregate_version = 1 FOR UPDATE",
        db.table("outbox_events")
    )))
    .fetch_one(&mut *holder)
    .await
    .unwrap();
    let transport = RecordingTransport::new();
    // A locked head's later versions still take candidate places in each
    // claim (they are refused, not passed over): a batch larger than c0's
    // 19 waiting versions leaves room for the others.
    let config = RelayConfig {
        batch_size: 30,
        ..fast(1)
    };
    let relay = Relay::start(
        partitioned_store(&db, &config),
        transport.clone(),
        config,
        "locked-row",
    )
    .await
    .unwrap();
    // Several batches of the other aggregates: the first claim checks
    // heads, the later ones run the steady claim, which meets the lock
    // every time and gives way to the checked claim.
    wait::until(
        "the other aggregates published",
        Duration::from_secs(20),
        || async { transport.published_count() >= 80 },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held: Vec<i64> = transport
        .published()
        .iter()
        .filter(|e| e.aggregate_id == "c0")
        .map(|e| e.aggregate_version)
        .collect();
    assert!(
        held.is_empty(),
        "c0 published while its first version was locked: {held:?}"
    );
    holder.rollback().await.unwrap();
    wait::until("every event published", Duration::from_secs(20), || async {
        db.published().await == 100
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    let versions = versions_by_aggregate(&transport.published());
    assert_eq!(versions.len(), 5);
    for (aggregate, seen) in &versions {
        assert_eq!(seen, &(1..=20).collect::<Vec<i64>>(), "{aggregate}");
    }
    db.drop_schema().await;
}

/// `PgRelayStore::claim` (the claim outside a worker's session) and the
/// workers never claim from one partition at the same time: the pooled
/// claim gets nothing from a partition a worker owns, and a worker cannot
/// take a partition while a pooled claim holds rows of it.
#[tokio::test]
async fn the_pooled_claim_and_the_workers_never_share_a_partition() {
    use outbox_core::relay::{ClaimedBatch, RelayStore};
    use std::sync::atomic::Ordering;
    let db = TestDb::with_pool_size(6).await;
    emit_ticks(&db.pool, &db.outbox, 3, 3, 100).await;
    let config = RelayConfig {
        batch_size: 1,
        ..fast(1)
    };
    // Its claims stay open across the waits below: a generous idle timeout.
    let pooled = partitioned_store(
        &db,
        &RelayConfig {
            claim_timeout: Duration::from_secs(60),
            ..config.clone()
        },
    );

    // A pooled claim first: it holds c0 … c2's first versions.
    let held = pooled.claim(3).await.unwrap();
    assert_eq!(held.events().len(), 3);
    let held_partitions: Vec<i64> = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT DISTINCT partition::bigint FROM {} ORDER BY 1",
        db.table("outbox_events")
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    // A worker starts (its transport goes down after one event, so it
    // keeps its session and partitions but claims no more).
    let transport = PausingTransport::default();
    let relay = Relay::start(
        partitioned_store(&db, &config),
        transport.clone(),
        config.clone(),
        "pooled",
    )
    .await
    .unwrap();
    wait::until(
        "the worker owns every partition the pooled claim does not hold",
        Duration::from_secs(20),
        || async { owned_partitions(&db).await == vec![256 - held_partitions.len() as i64] },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        owned_partitions(&db).await,
        vec![256 - held_partitions.len() as i64],
        "a worker took a partition a pooled claim holds rows of"
    );
    assert_eq!(
        transport.published.load(Ordering::SeqCst),
        0,
        "the worker published from partitions held by the pooled claim"
    );
    // The pooled claim ends: the worker takes the rest and publishes once.
    held.release().await.unwrap();
    wait::until(
        "the worker owns every partition",
        Duration::from_secs(20),
        || async { owned_partitions(&db).await == vec![256] },
    )
    .await;
    wait::until(
        "the worker's one batch",
        Duration::from_secs(20),
        || async { transport.published.load(Ordering::SeqCst) == 1 },
    )
    .await;
    // Now the worker owns everything (and is paused): the pooled claim
    // finds nothing, though eight events are pending.
    wait::until(
        "the worker's batch committed",
        Duration::from_secs(20),
        || async {
            db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events WHERE status = 'pending'")
                .await
                == 8
        },
    )
    .await;
    let empty = pooled.claim(100).await.unwrap();
    assert!(
        empty.events().is_empty(),
        "the pooled claim took from partitions a worker owns: {:?}",
        empty.events()
    );
    empty.release().await.unwrap();
    // The worker stops: its session and locks go (as soon as the server
    // has seen the connection close), and the pooled claim has all.
    relay.drain(Duration::from_secs(10)).await.unwrap();
    let started = Instant::now();
    loop {
        let all = pooled.claim(100).await.unwrap();
        let claimed = all.events().len();
        all.release().await.unwrap();
        if claimed == 8 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the pooled claim still gets {claimed} of 8 after the worker stopped"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    db.drop_schema().await;
}

/// A worker's claim may run in a transaction opened ahead (after a full
/// batch, `COMMIT; BEGIN`), so its `now()` can be older than a fresh
/// event's `next_attempt_at` (that event's transaction start). Version 1
/// written by a transaction that began after the claim's, and version 2 by
/// one that began before it and committed after the first: the claim must
/// not offer version 2 without version 1.
#[tokio::test]
async fn a_version_from_a_transaction_begun_after_the_claims_is_not_overtaken() {
    use outbox_core::relay::{BatchOutcome, ClaimedBatch, RelayStore};
    let db = TestDb::with_pool_size(6).await;
    // Ten events of c0: the first claim (limit 10) is full.
    emit_ticks(&db.pool, &db.outbox, 1, 10, 100).await;
    // No rebalance between the two claims: the second runs in the
    // transaction the first one's commit opened.
    let store = partitioned_store(
        &db,
        &RelayConfig {
            claim_timeout: Duration::from_secs(30),
            lease: Duration::from_secs(30),
            rebalance_interval: Duration::from_secs(20),
            ..RelayConfig::default()
        },
    );
    let worker = uuid::Uuid::now_v7();

    let mut earlier = db.pool.begin().await.unwrap();
    sqlx::query("SELECT now()")
        .execute(&mut *earlier)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let first = store.claim_for(worker, 10).await.unwrap();
    assert_eq!(first.events().len(), 10);
    let published = first.events().iter().map(|e| e.envelope.id).collect();
    first
        .complete(BatchOutcome {
            published,
            failed: Vec::new(),
        })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;

    let mut later = db.pool.begin().await.unwrap();
    db.outbox
        .emit(&mut later, &Ticked::new("a", 1))
        .await
        .unwrap();
    later.commit().await.unwrap();
    db.outbox
        .emit(&mut earlier, &Ticked::new("a", 2))
        .await
        .unwrap();
    earlier.commit().await.unwrap();

    let second = store.claim_for(worker, 100).await.unwrap();
    let versions: Vec<i64> = second
        .events()
        .iter()
        .filter(|e| e.envelope.aggregate_id == "a")
        .map(|e| e.envelope.aggregate_version)
        .collect();
    assert_eq!(versions, vec![1, 2], "a's versions in the second claim");
    second.release().await.unwrap();
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

/// One line of a relay process's log: a publish.
struct Publish {
    at: u128,
    pid: u32,
    aggregate: String,
    version: i64,
    /// The publishing worker's fencing token.
    token: Option<u64>,
}

/// Every publish, from every process's log, in time order.
fn merged_log(dir: &std::path::Path) -> Vec<Publish> {
    let mut lines = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in text.lines() {
            let parts: Vec<&str> = line.split(' ').collect();
            let [at, pid, aggregate, version, token] = parts.as_slice() else {
                panic!("a torn log line: {line:?}");
            };
            lines.push(Publish {
                at: at.parse().unwrap(),
                pid: pid.parse().unwrap(),
                aggregate: aggregate.to_string(),
                version: version.parse().unwrap(),
                token: token.parse().ok(),
            });
        }
    }
    lines.sort_by_key(|l| l.at);
    lines
}

/// No partition was published from by two owners at once: for each
/// partition, the time spans of its publishes under each fencing token do
/// not overlap, and a later owner's token is larger. Returns how many
/// owner changes the partitions saw.
fn check_fencing(lines: &[Publish], partition_of: &HashMap<String, i16>) -> usize {
    // partition → token → (first, last publish time, pid)
    let mut spans: BTreeMap<i16, BTreeMap<u64, (u128, u128, u32)>> = BTreeMap::new();
    for publish in lines {
        let token = publish
            .token
            .unwrap_or_else(|| panic!("a publish without a fencing token by {}", publish.pid));
        let partition = partition_of[&publish.aggregate];
        let span = spans.entry(partition).or_default().entry(token).or_insert((
            publish.at,
            publish.at,
            publish.pid,
        ));
        span.1 = publish.at;
        assert_eq!(span.2, publish.pid, "token {token} used by two processes");
    }
    let mut changes = 0;
    for (partition, by_token) in &spans {
        let mut ordered: Vec<(u64, (u128, u128, u32))> =
            by_token.iter().map(|(t, s)| (*t, *s)).collect();
        ordered.sort_by_key(|(_, span)| span.0);
        for pair in ordered.windows(2) {
            let (earlier_token, earlier) = pair[0];
            let (later_token, later) = pair[1];
            assert!(
                earlier.1 < later.0,
                "partition {partition}: token {earlier_token} (pid {}) published until {} while token {later_token} (pid {}) began at {}",
                earlier.2,
                earlier.1,
                later.2,
                later.0
            );
            assert!(
                earlier_token < later_token,
                "partition {partition}: a later owner has an older token ({earlier_token} then {later_token})"
            );
            if earlier.2 != later.2 {
                changes += 1;
            }
        }
    }
    changes
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
    for publish in &lines {
        *publishers.entry(publish.pid).or_default() += 1;
        let seen = first_seen.entry(publish.aggregate.as_str()).or_default();
        if !seen.contains(&publish.version) {
            seen.push(publish.version);
        }
    }
    // One owner per partition at a time, with increasing fencing tokens.
    let partition_of: HashMap<String, i16> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT DISTINCT aggregate_id, partition FROM {}",
        db.table("outbox_events")
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    let owner_changes = check_fencing(&lines, &partition_of);
    assert!(
        owner_changes > 0,
        "no partition changed owner: nothing was tested"
    );
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
        "{} publishes ({} duplicates) by {} processes, {owner_changes} partition owner changes; takeover after SIGKILL {crash_takeover:?}, after SIGSTOP {stall_takeover:?}",
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
