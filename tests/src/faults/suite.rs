//! The fault suite's run, shared by one test file per broker
//! (`tests/tests/fault_suite.rs` for NATS JetStream,
//! `fault_suite_kafka.rs`, `fault_suite_rabbitmq.rs`): relays and consumers
//! as separate processes (`fault-node`) against a private PostgreSQL
//! cluster and the rig's broker, with load from a producer process, while
//! faults are injected at random from a printed seed, then the invariants
//! read from the databases ([`invariants`]).
//!
//! `OUTBOX_FAULT_SEED=<n>` replays a schedule; `OUTBOX_FAULT_SECONDS`
//! (default 90) sets how long faults are injected, and the producer spreads
//! its load over that window; `OUTBOX_FAULT_LOGS=<dir>` keeps each
//! process's stderr.

use std::path::PathBuf;
use std::time::Duration;

use super::invariants::{self, Expected};
use super::{BrokerKind, FAULTS, Fault, Rig, RigConfig, Schedule};

const AGGREGATES: usize = 12;
const ROUNDS: u64 = 40;
const WRITERS: usize = 3;
const POISON: usize = 6;

/// Runs the suite against `broker` with relays and consumers from
/// `node_binary` (`fault-node`); panics naming the seed and the broken
/// invariants. Needs a multi-threaded runtime (the rig blocks one worker
/// while it restarts a server).
pub async fn run(broker: BrokerKind, node_binary: PathBuf) {
    let seed = Schedule::seed_from_env();
    let fault_seconds: u64 = std::env::var("OUTBOX_FAULT_SECONDS")
        .map(|s| s.parse().expect("OUTBOX_FAULT_SECONDS is a number"))
        .unwrap_or(90);
    let name = broker.name();
    println!("fault suite ({name}) seed {seed} (replay with OUTBOX_FAULT_SEED={seed})");
    let mut rig = Rig::start(
        seed,
        RigConfig {
            broker,
            node_binary,
            relays: 2,
            relay_batch: 50,
            consumer_processes: 2,
            consumer_batch: 8,
            // 5% of messages twice, every batch shuffled.
            chaos: Some(format!("{seed}:50:1")),
            logs: std::env::var_os("OUTBOX_FAULT_LOGS").map(Into::into),
        },
    )
    .await;
    let mut producer = rig.spawn(&[
        "producer",
        &AGGREGATES.to_string(),
        &ROUNDS.to_string(),
        &WRITERS.to_string(),
        &(fault_seconds * 1000 / ROUNDS).to_string(),
    ]);
    rig.insert_poison(POISON).await;

    // Every fault kind once, in a seeded order, then seeded picks.
    let mut order: Vec<Fault> = FAULTS.to_vec();
    for i in (1..order.len()).rev() {
        order.swap(i, rig.schedule.below(i as u64 + 1) as usize);
    }
    let mut injected = Vec::new();
    while rig.elapsed() < fault_seconds as f64 || injected.len() < FAULTS.len() {
        let fault = match order.get(injected.len()) {
            Some(fault) => *fault,
            None => FAULTS[rig.schedule.below(FAULTS.len() as u64) as usize],
        };
        let record = rig.inject(fault).await;
        println!("  {:6.1} s  {fault:?}", record.at);
        injected.push(record);
        if let Err(problem) = rig.check_alive() {
            panic!("{problem}");
        }
    }
    println!(
        "{} faults injected in {:.0} s",
        injected.len(),
        rig.elapsed()
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
    if let Err(problem) = invariants::settle(
        &rig.db,
        Duration::from_secs(240),
        Duration::from_millis(500),
    )
    .await
    {
        panic!("{name} seed {seed}: the system did not settle: {problem}");
    }
    let checks = invariants::check(
        &rig.db,
        &Expected {
            events: ticks + moves,
            poison: &rig.poison,
            garbage: &rig.garbage,
            poison_successors: &rig.poison_successors,
        },
    )
    .await;
    for check in &checks {
        println!(
            "  {} {}: {}",
            if check.held { "ok  " } else { "FAIL" },
            check.name,
            check.detail
        );
    }
    let failed: Vec<&str> = checks
        .iter()
        .filter(|c| !c.held)
        .map(|c| c.name.as_str())
        .collect();
    assert!(
        failed.is_empty(),
        "{name} seed {seed}: invariants broken: {failed:?} (replay with OUTBOX_FAULT_SEED={seed})"
    );
    rig.stop_nodes();
    println!(
        "{name} seed {seed}: {} events, {} faults, invariants hold",
        ticks + moves + POISON as i64,
        injected.len()
    );
    let Rig { db, .. } = rig;
    db.drop_schema().await;
}
