//! The fault suite, CI length: relays and consumers as separate processes
//! (`fault-node`) against a private PostgreSQL cluster (reached through a
//! TCP proxy the suite owns) and a private nats-server, with load from a producer
//! process, while faults are injected at random from a printed seed:
//! SIGKILL of a relay and of a consumer (restarted), SIGSTOP of a relay
//! past its claim timeout (then SIGCONT), nats-server killed and
//! restarted, PostgreSQL restarted (`pg_ctl restart -m fast`), every
//! database connection of the relays and consumers cut;
//! the consumers' sources deliver 5% of messages twice and shuffle every
//! batch (`tests/src/chaos.rs`).
//! At the end the invariants are checked from the databases, not from
//! logs: every committed event published; each consumer applied each event
//! exactly once (Strict) or at most once with the last version as its
//! final state (RejectStale); under Strict each aggregate's versions applied
//! gap-free and ascending; the poison events in the mix (a schema version
//! from a newer producer, a payload that does not decode) quarantined once
//! each with a reason, and nothing else in the quarantine or dead letters;
//! nothing left pending or claimed; the producer's idempotency keys gave
//! one event each.
//!
//! `OUTBOX_FAULT_SEED=<n>` replays a schedule; `OUTBOX_FAULT_SECONDS`
//! (default 90) sets how long faults are injected, and the producer spreads
//! its load over that window; `OUTBOX_FAULT_LOGS=<dir>` keeps each
//! process's stderr.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use outbox_tests::consumers::create_effects;
use outbox_tests::pgcluster::PgCluster;
use outbox_tests::proxy::TcpProxy;
use outbox_tests::{NatsServer, TestDb, wait};
use sqlx::AssertSqlSafe;

const AGGREGATES: usize = 12;
const ROUNDS: u64 = 40;
const WRITERS: usize = 3;
const CONSUMERS: [(&str, &str); 2] = [("strict", "strict"), ("stale", "stale")];
const POISON: usize = 6;

/// A small deterministic generator (SplitMix64): the same seed, the same
/// schedule.
struct Schedule(u64);

impl Schedule {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    KillRelay,
    StopRelay,
    KillConsumer,
    RestartNats,
    CutDatabase,
    RestartPostgres,
}

const FAULTS: [Fault; 6] = [
    Fault::KillRelay,
    Fault::StopRelay,
    Fault::KillConsumer,
    Fault::RestartNats,
    Fault::CutDatabase,
    Fault::RestartPostgres,
];

struct Node {
    args: Vec<String>,
    child: Child,
}

impl Drop for Node {
    fn drop(&mut self) {
        // A failed run must not leave its processes behind.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Cluster {
    env: Vec<(String, String)>,
    relays: Vec<Node>,
    consumers: Vec<Node>,
}

impl Cluster {
    fn spawn(&self, args: &[&str]) -> Node {
        let child = Command::new(env!("CARGO_BIN_EXE_fault-node"))
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::null())
            .stderr(match std::env::var("OUTBOX_FAULT_LOGS") {
                Ok(dir) => Stdio::from(
                    std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(format!("{dir}/{}.log", args.join("-")))
                        .expect("log file"),
                ),
                Err(_) => Stdio::null(),
            })
            .spawn()
            .expect("start fault-node");
        Node {
            args: args.iter().map(|s| s.to_string()).collect(),
            child,
        }
    }

    fn restart(&self, node: &mut Node) {
        let _ = node.child.kill();
        let _ = node.child.wait();
        let args: Vec<&str> = node.args.iter().map(String::as_str).collect();
        *node = self.spawn(&args);
    }
}

fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status()
        .expect("kill(1)");
    assert!(status.success(), "kill -{name} failed");
}

async fn scalar(db: &TestDb, sql: &str) -> i64 {
    db.scalar::<i64>(sql).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_at_random_lose_nothing_apply_nothing_twice_and_leave_nothing_stuck() {
    let seed: u64 = std::env::var("OUTBOX_FAULT_SEED")
        .ok()
        .map(|s| s.parse().expect("OUTBOX_FAULT_SEED is a number"))
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let fault_seconds: u64 = std::env::var("OUTBOX_FAULT_SECONDS")
        .map(|s| s.parse().expect("OUTBOX_FAULT_SECONDS is a number"))
        .unwrap_or(90);
    println!("fault suite seed {seed} (replay with OUTBOX_FAULT_SEED={seed})");
    let mut schedule = Schedule(seed);

    // A private PostgreSQL cluster: the suite restarts it.
    let postgres = PgCluster::start();
    let db = TestDb::on_server(&postgres.url(), 4).await;
    create_effects(&db).await;
    let mut nats = NatsServer::start();
    let proxy = TcpProxy::start(&format!("127.0.0.1:{}", postgres.port())).await;
    let cluster = Cluster {
        env: vec![
            ("DATABASE_URL".into(), postgres.url()),
            ("OUTBOX_TEST_SCHEMA".into(), db.schema.as_str().to_owned()),
            ("OUTBOX_PG_ADDR".into(), proxy.address()),
            ("OUTBOX_NATS_URL".into(), nats.url()),
            // Consumers see 5% of messages twice and every batch shuffled.
            ("OUTBOX_CHAOS".into(), format!("{seed}:50:1")),
        ],
        relays: Vec::new(),
        consumers: Vec::new(),
    };
    let mut cluster = cluster;
    // The stream must exist before the consumers' durables.
    drop(
        outbox_nats::NatsTransport::connect(outbox_nats::NatsConfig {
            url: nats.url(),
            ..outbox_nats::NatsConfig::default()
        })
        .await
        .unwrap(),
    );
    cluster.relays = vec![cluster.spawn(&["relay"]), cluster.spawn(&["relay"])];
    cluster.consumers = CONSUMERS
        .iter()
        .flat_map(|(name, ordering)| [*name, *name].map(|n| (n, *ordering)))
        .map(|(name, ordering)| cluster.spawn(&["consumer", name, ordering]))
        .collect();
    let mut producer = cluster.spawn(&[
        "producer",
        &AGGREGATES.to_string(),
        &ROUNDS.to_string(),
        &WRITERS.to_string(),
        &(fault_seconds * 1000 / ROUNDS).to_string(),
    ]);

    // Events from a newer producer (schema version 99) and one whose
    // payload does not decode: each consumer must quarantine them.
    let mut poison = Vec::new();
    for n in 0..POISON {
        let (version, payload) = if n % 2 == 0 {
            (
                99,
                format!(r#"{{"counter":"poison-{n}","tick":1,"note":"from a newer producer"}}"#),
            )
        } else {
            (1, r#"{"wrong":true}"#.to_owned())
        };
        let id: uuid::Uuid = sqlx::query_scalar(AssertSqlSafe(format!(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload)
             VALUES (gen_random_uuid(), 'counter', $1, 1, 'counter.ticked', $2, $3::json) RETURNING id",
            db.table("outbox_events")
        )))
        .bind(format!("poison-{n}"))
        .bind(version)
        .bind(payload)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        poison.push(id);
    }

    // Every fault kind once, in a seeded order, then seeded picks.
    let mut order: Vec<Fault> = FAULTS.to_vec();
    for i in (1..order.len()).rev() {
        order.swap(i, schedule.below(i as u64 + 1) as usize);
    }
    let started = Instant::now();
    let mut injected = Vec::new();
    while started.elapsed() < Duration::from_secs(fault_seconds) || injected.len() < FAULTS.len() {
        let fault = if injected.len() < order.len() {
            order[injected.len()]
        } else {
            FAULTS[schedule.below(FAULTS.len() as u64) as usize]
        };
        tokio::time::sleep(Duration::from_millis(1_000 + schedule.below(2_000))).await;
        let at = started.elapsed().as_secs_f64();
        match fault {
            Fault::KillRelay => {
                let i = schedule.below(cluster.relays.len() as u64) as usize;
                let mut node = cluster.relays.remove(i);
                cluster.restart(&mut node);
                cluster.relays.push(node);
            }
            Fault::StopRelay => {
                let i = schedule.below(cluster.relays.len() as u64) as usize;
                signal(&cluster.relays[i].child, "STOP");
                // Past the claim timeout (3 s): its claim transaction is
                // cut off by the server while it sleeps.
                tokio::time::sleep(Duration::from_millis(4_000)).await;
                signal(&cluster.relays[i].child, "CONT");
            }
            Fault::KillConsumer => {
                let i = schedule.below(cluster.consumers.len() as u64) as usize;
                let mut node = cluster.consumers.remove(i);
                cluster.restart(&mut node);
                cluster.consumers.push(node);
            }
            Fault::RestartNats => {
                nats.stop();
                tokio::time::sleep(Duration::from_millis(500 + schedule.below(1_500))).await;
                nats.resume();
            }
            Fault::RestartPostgres => {
                // Blocks this worker for the restart (a second or two);
                // the proxy runs on the other.
                postgres.restart();
            }
            Fault::CutDatabase => {
                proxy.down();
                tokio::time::sleep(Duration::from_millis(500 + schedule.below(2_000))).await;
                proxy.up();
            }
        }
        println!("  {at:6.1} s  {fault:?}");
        injected.push(fault);
        for node in cluster
            .relays
            .iter_mut()
            .chain(cluster.consumers.iter_mut())
        {
            if let Some(status) = node.child.try_wait().unwrap() {
                panic!(
                    "seed {seed}: fault-node {:?} exited by itself ({status}); run with OUTBOX_FAULT_LOGS=<dir> for its stderr",
                    node.args
                );
            }
        }
    }
    println!(
        "{} faults injected in {:.0} s",
        injected.len(),
        started.elapsed().as_secs_f64()
    );

    let produced = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            if let Some(status) = producer.child.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the producer finishes");
    assert!(produced.success(), "the producer failed");

    let ticks = (WRITERS as u64 * ROUNDS * AGGREGATES as u64) as i64;
    let moves = (ROUNDS * AGGREGATES as u64) as i64;
    let applicable = ticks + moves;
    let total = applicable + POISON as i64;
    let outbox = db.table("outbox_events");
    assert_eq!(
        scalar(
            &db,
            &format!("SELECT count(*) FROM {outbox} WHERE event_type = 'counter.ticked' AND aggregate_id NOT LIKE 'poison-%'")
        )
        .await,
        ticks,
        "each idempotency key produced one event"
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while scalar(
        &db,
        &format!("SELECT count(*) FROM {outbox} WHERE status = 'published'"),
    )
    .await
        < total
    {
        if Instant::now() > deadline {
            let rows: Vec<(String, i64, Option<String>)> = sqlx::query_as(AssertSqlSafe(format!(
                "SELECT status, count(*), max(last_error) FROM {outbox} GROUP BY status"
            )))
            .fetch_all(&db.pool)
            .await
            .unwrap();
            let alive: Vec<bool> = cluster
                .relays
                .iter_mut()
                .map(|n| n.child.try_wait().unwrap().is_none())
                .collect();
            panic!(
                "seed {seed}: not everything published within 120 s: {rows:?}; relays alive: {alive:?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let effects = db.table("effects");
    wait::until(
        "every event applied by the strict consumer",
        Duration::from_secs(180),
        || async {
            scalar(
                &db,
                &format!(
                    "SELECT count(DISTINCT event_id) FROM {effects} WHERE consumer = 'strict'"
                ),
            )
            .await
                == applicable
        },
    )
    .await;
    wait::until("the stale consumer at every aggregate's last version", Duration::from_secs(120), || async {
        scalar(
            &db,
            &format!(
                "SELECT count(*) FROM (SELECT aggregate_id FROM {effects} WHERE consumer = 'stale'
                 GROUP BY aggregate_id HAVING max(aggregate_version) = CASE WHEN aggregate_id LIKE 'p%' THEN {ROUNDS} ELSE {} END) AS done",
                WRITERS as u64 * ROUNDS
            ),
        )
        .await
            == 2 * AGGREGATES as i64
    })
    .await;
    // Let redeliveries of the last messages settle as duplicates.
    tokio::time::sleep(Duration::from_secs(3)).await;

    for (name, _) in CONSUMERS {
        assert_eq!(
            scalar(
                &db,
                &format!(
                    "SELECT count(*) FROM (SELECT event_id FROM {effects} WHERE consumer = '{name}' GROUP BY event_id HAVING count(*) > 1) AS twice"
                )
            )
            .await,
            0,
            "{name}: no event applied twice"
        );
        // The poison events, and nothing else, in the quarantine: once
        // each, with a reason; nothing dead-lettered.
        let letters: Vec<(uuid::Uuid, String, String)> = sqlx::query_as(AssertSqlSafe(format!(
            "SELECT event_id, kind, reason FROM {} WHERE consumer_name = $1 ORDER BY event_id",
            db.table("outbox_dead_letters")
        )))
        .bind(name)
        .fetch_all(&db.pool)
        .await
        .unwrap();
        let mut expected = poison.clone();
        expected.sort();
        assert_eq!(
            letters.iter().map(|l| l.0).collect::<Vec<_>>(),
            expected,
            "{name}: each poison event quarantined once, nothing else lettered"
        );
        for (event, kind, reason) in &letters {
            assert_eq!(kind, "quarantined", "{name}: {event}");
            assert!(!reason.is_empty(), "{name}: {event} has a reason");
        }
        // Nothing silently gone: every other event has its inbox row
        // (applied, or passed over as stale).
        assert_eq!(
            scalar(
                &db,
                &format!(
                    "SELECT count(*) FROM {outbox} o WHERE o.aggregate_id NOT LIKE 'poison-%' AND NOT EXISTS (SELECT 1 FROM {} p WHERE p.consumer_name = '{name}' AND p.event_id = o.id)",
                    db.table("outbox_processed_events")
                )
            )
            .await,
            0,
            "{name}: every event settled in the inbox"
        );
    }
    // Strict: versions per aggregate gap-free and ascending in commit order.
    let rows: Vec<(String, i64)> = sqlx::query_as(AssertSqlSafe(format!(
        "SELECT aggregate_id, aggregate_version FROM {effects} WHERE consumer = 'strict' ORDER BY seq"
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let mut by_aggregate: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (aggregate, version) in rows {
        by_aggregate.entry(aggregate).or_default().push(version);
    }
    assert_eq!(
        by_aggregate.len(),
        2 * AGGREGATES,
        "strict: no poison applied"
    );
    for (aggregate, versions) in &by_aggregate {
        let last = if aggregate.starts_with('p') {
            ROUNDS as i64
        } else {
            (WRITERS as u64 * ROUNDS) as i64
        };
        assert_eq!(
            versions,
            &(1..=last).collect::<Vec<i64>>(),
            "strict: {aggregate} gap-free and ascending"
        );
    }
    // Nothing claimed or pending forever.
    assert_eq!(
        scalar(
            &db,
            &format!("SELECT count(*) FROM {outbox} WHERE status <> 'published'")
        )
        .await,
        0
    );

    for node in cluster
        .relays
        .iter_mut()
        .chain(cluster.consumers.iter_mut())
    {
        let _ = node.child.kill();
        let _ = node.child.wait();
    }
    println!(
        "seed {seed}: {total} events, {} faults, invariants hold",
        injected.len()
    );
    db.drop_schema().await;
}
