//! Strict ordering must never skip a version without a letter that says
//! so. The windows where it could: a first version that is quarantined
//! (the ordinary rollout order: producers ship a new schema version before
//! consumers) or whose handler takes the process down every time, while a
//! later version waits out its park timeout; a failed first start racing a
//! sweep on another instance (the interleaving is forced: the handler
//! holds the aggregate's position lock until the sweep waits for it, then
//! fails; repeated with fresh aggregates); the same on the replay path;
//! and a replay that could not apply its event, which must not report
//! success (`--wait` exits 1 and the letter stays open).
//! Real PostgreSQL; messages are fed by hand or through the in-memory source.

use outbox_postgres::PgConsumer;
use outbox_postgres::prelude::*;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use outbox_core::audit::RepairRequest;
use outbox_core::consumer::{
    ConsumerBuilder, ConsumerConfig, HandlerError, Incoming, Outcome, ReplayOutcome, channel,
};
use outbox_core::{ContractRegistry, OutboxEvent};
use outbox_tests::consumers::{
    create_effects, effect_handler, effects, parcel_v2, parcel_v3, record_effect, strict_config,
    tick,
};
use outbox_tests::events::{ParcelBooked, ParcelBookedV2, Ticked};
use outbox_tests::{TestDb, db, wait};
use tokio::sync::Notify;

const PARK: Duration = Duration::from_millis(200);

fn request(reason: &str) -> RepairRequest {
    RepairRequest::new("ada", reason).unwrap()
}

/// The versions `consumer` applied to `aggregate`, in commit order.
async fn applied(db: &TestDb, consumer: &str, aggregate: &str) -> Vec<i64> {
    effects(db, consumer)
        .await
        .into_iter()
        .filter(|e| e.aggregate_id == aggregate)
        .map(|e| e.aggregate_version)
        .collect()
}

/// The open letters of `consumer` for `aggregate`: (id, version, kind, reason).
async fn open_letters(
    db: &TestDb,
    consumer: &str,
    aggregate: &str,
) -> Vec<(i64, i64, String, String)> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT id, aggregate_version, kind, reason FROM {}
         WHERE consumer_name = $1 AND aggregate_id = $2 AND resolved_at IS NULL
         ORDER BY aggregate_version",
        db.table("outbox_dead_letters")
    )))
    .bind(consumer)
    .bind(aggregate)
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

/// A parcel consumer that reads `parcel.booked` up to v2 (the binary
/// deployed before producers moved to v3).
fn parcel_consumer_before_the_upgrade(db: &TestDb, name: &str) -> PgConsumer {
    ConsumerBuilder::new(name)
        .config(strict_config(PARK))
        .registry(ContractRegistry::from_contracts([ParcelBookedV2::contract()]).unwrap())
        .on_fn::<ParcelBookedV2, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap()
}

fn parcel_consumer_after_the_upgrade(db: &TestDb, name: &str) -> PgConsumer {
    ConsumerBuilder::new(name)
        .config(strict_config(PARK))
        .on_fn::<ParcelBooked, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap()
}

#[tokio::test]
async fn a_quarantined_first_version_holds_its_successors_until_it_is_replayed() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let name = "parcels";
    let old = parcel_consumer_before_the_upgrade(&db, name);
    // The producer already writes v3; this binary reads up to v2.
    assert!(matches!(
        old.handle_envelope(&parcel_v3("p1", 1)).await.unwrap(),
        Outcome::Quarantined { .. }
    ));
    assert_eq!(
        old.handle_envelope(&parcel_v2("p1", 2)).await.unwrap(),
        Outcome::Parked { waiting_for: 1 }
    );
    tokio::time::sleep(PARK + Duration::from_millis(100)).await;
    let report = old.sweep().await.unwrap();
    assert_eq!(
        report.started, 0,
        "version 1 arrived (it is in the quarantine): version 2 must not become the start"
    );
    assert!(
        applied(&db, name, "p1").await.is_empty(),
        "nothing applied past the hole"
    );
    let open = open_letters(&db, name, "p1").await;
    assert_eq!(open.len(), 2, "{open:?}");
    assert_eq!((open[0].1, open[0].2.as_str()), (1, "quarantined"));
    assert_eq!((open[1].1, open[1].2.as_str()), (2, "dead_lettered"));
    assert!(
        open[1].3.contains("version 1") && open[1].3.contains("quarantine"),
        "the successor's letter names the hole: {}",
        open[1].3
    );

    // After the upgrade both letters are replayed, in order, once each.
    let upgraded = parcel_consumer_after_the_upgrade(&db, name);
    let ids: Vec<i64> = open.iter().map(|l| l.0).collect();
    let report = upgraded
        .replay(&ids, &request("parcels reads v3 now"))
        .await
        .unwrap();
    assert_eq!(
        report.letters,
        vec![
            (ids[0], ReplayOutcome::Applied),
            (ids[1], ReplayOutcome::Applied)
        ]
    );
    assert_eq!(applied(&db, name, "p1").await, vec![1, 2]);
    assert!(open_letters(&db, name, "p1").await.is_empty());
    db.drop_schema().await;
}

#[tokio::test]
async fn a_first_version_that_takes_the_process_down_every_time_holds_its_successors() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let name = "crashing";
    let crash = Arc::new(AtomicBool::new(true));
    let hang = Arc::clone(&crash);
    let table = db.table("effects");
    let consumer = ConsumerBuilder::new(name)
        .config(strict_config(PARK))
        .on_fn::<Ticked, _>(move |received, tx| {
            let (table, hang) = (table.clone(), Arc::clone(&hang));
            Box::pin(async move {
                if received.meta.aggregate_version == 1 && hang.load(AtomicOrdering::SeqCst) {
                    // The process dies here: the future is dropped.
                    std::future::pending::<()>().await;
                }
                record_effect(&table, &received, tx).await
            })
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let first = tick("c1", 1);
    // The first delivery's handler starts and never returns (a crash).
    let crashed =
        tokio::time::timeout(Duration::from_millis(300), consumer.handle_envelope(&first)).await;
    assert!(crashed.is_err(), "the handler hung");
    // Redeliveries crashed as often as max_attempts allows (3): the next
    // one is dead-lettered without running.
    db.execute(&format!(
        "INSERT INTO {{s}}.outbox_consumer_attempts (consumer_name, event_id, starts)
         VALUES ('{name}', '{}', 3)",
        first.id
    ))
    .await;
    assert!(matches!(
        consumer
            .handle(&Incoming::from_envelope(&first, 4))
            .await
            .unwrap(),
        Outcome::DeadLettered { .. }
    ));
    assert_eq!(
        consumer.handle_envelope(&tick("c1", 2)).await.unwrap(),
        Outcome::Parked { waiting_for: 1 }
    );
    tokio::time::sleep(PARK + Duration::from_millis(100)).await;
    let report = consumer.sweep().await.unwrap();
    assert_eq!(report.started, 0, "version 2 must not become the start");
    let open = open_letters(&db, name, "c1").await;
    assert_eq!(
        open.iter().map(|l| l.1).collect::<Vec<_>>(),
        vec![1, 2],
        "{open:?}"
    );
    assert!(open[1].3.contains("version 1"), "{}", open[1].3);

    // Fixed: both replayed in order.
    crash.store(false, AtomicOrdering::SeqCst);
    let ids: Vec<i64> = open.iter().map(|l| l.0).collect();
    let report = consumer.replay(&ids, &request("fixed")).await.unwrap();
    assert!(
        report
            .letters
            .iter()
            .all(|(_, o)| *o == ReplayOutcome::Applied)
    );
    assert_eq!(applied(&db, name, "c1").await, vec![1, 2]);
    db.drop_schema().await;
}

/// A handler that, while armed, tells when it started on version 1,
/// waits to be released, then fails; otherwise records the effect.
struct HeldFirstStart {
    armed: AtomicBool,
    entered: Notify,
    release: Notify,
}

impl HeldFirstStart {
    fn new() -> Arc<HeldFirstStart> {
        Arc::new(HeldFirstStart {
            armed: AtomicBool::new(false),
            entered: Notify::new(),
            release: Notify::new(),
        })
    }

    fn consumer(self: &Arc<Self>, db: &TestDb, name: &str) -> PgConsumer {
        let hook = Arc::clone(self);
        let table = db.table("effects");
        ConsumerBuilder::new(name)
            .config(ConsumerConfig {
                retry: outbox_core::consumer::RetryPolicy {
                    max_attempts: 10,
                    ..strict_config(PARK).retry
                },
                ..strict_config(PARK)
            })
            .on_fn::<Ticked, _>(move |received, tx| {
                let (table, hook) = (table.clone(), Arc::clone(&hook));
                Box::pin(async move {
                    if received.meta.aggregate_version == 1
                        && hook.armed.swap(false, AtomicOrdering::SeqCst)
                    {
                        hook.entered.notify_one();
                        hook.release.notified().await;
                        return Err(HandlerError::retryable("downstream timed out"));
                    }
                    record_effect(&table, &received, tx).await
                })
            })
            .build(db.pool.clone(), db.schema.clone())
            .unwrap()
    }
}

/// Waits until the sweep has either ended (it leaves an aggregate whose
/// position is held alone) or queued on a lock (what it did before the
/// fix: a statement on this test's schema waiting for a lock).
async fn until_the_sweep_waits_or_ends<T>(db: &TestDb, sweep: &tokio::task::JoinHandle<T>) {
    let schema = db.schema.as_str().to_owned();
    wait::until(
        "the sweep waiting for the position lock, or done",
        Duration::from_secs(10),
        || {
            let (pool, schema) = (db.pool.clone(), schema.clone());
            let finished = sweep.is_finished();
            async move {
                finished
                    || sqlx::query_scalar::<_, i64>(
                        "SELECT count(*) FROM pg_stat_activity
                         WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0",
                    )
                    .bind(schema)
                    .fetch_one(&pool)
                    .await
                    .unwrap()
                        > 0
            }
        },
    )
    .await;
}

#[tokio::test]
async fn a_failed_first_start_keeps_its_pin_against_a_concurrent_sweep_twenty_times() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let name = "pinned";
    let hook = HeldFirstStart::new();
    // Two instances of one consumer: `a` has version 2 parked and sweeps,
    // `b` got version 1.
    let a = hook.consumer(&db, name);
    let b = hook.consumer(&db, name);
    for round in 0..20 {
        let aggregate = format!("c{round}");
        let (first, second) = (tick(&aggregate, 1), tick(&aggregate, 2));
        assert_eq!(
            a.handle_envelope(&second).await.unwrap(),
            Outcome::Parked { waiting_for: 1 }
        );
        tokio::time::sleep(PARK + Duration::from_millis(50)).await;
        hook.armed.store(true, AtomicOrdering::SeqCst);
        let started = {
            let (b, first) = (b.clone(), first.clone());
            tokio::spawn(async move { b.handle_envelope(&first).await })
        };
        hook.entered.notified().await;
        // A sweep while the first start holds the aggregate's position:
        // before the fix it queued on the lock and took the position the
        // instant the failed start let go.
        let sweep = {
            let a = a.clone();
            tokio::spawn(async move { a.sweep().await })
        };
        until_the_sweep_waits_or_ends(&db, &sweep).await;
        hook.release.notify_one();
        assert!(
            matches!(started.await.unwrap().unwrap(), Outcome::Retry { .. }),
            "round {round}"
        );
        let report = sweep.await.unwrap().unwrap();
        assert_eq!(
            report.started, 0,
            "round {round}: a handler was started on version 1, so version 2 is not the start"
        );
        // The next sweep finds version 1 retrying: version 2 waits for it.
        let report = a.sweep().await.unwrap();
        assert_eq!(
            (report.started, report.dead_lettered),
            (0, 0),
            "round {round}: version 1 is retrying, version 2 waits for it"
        );
        // The redelivery of version 1 applies it, and version 2 after it.
        assert_eq!(
            b.handle(&Incoming::from_envelope(&first, 2)).await.unwrap(),
            Outcome::Applied,
            "round {round}"
        );
        assert_eq!(
            applied(&db, name, &aggregate).await,
            vec![1, 2],
            "round {round}"
        );
        assert!(open_letters(&db, name, &aggregate).await.is_empty());
    }
    db.drop_schema().await;
}

#[tokio::test]
async fn a_failed_first_start_on_the_replay_path_keeps_its_pin_against_a_concurrent_sweep() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let name = "replayed";
    let hook = HeldFirstStart::new();
    let a = hook.consumer(&db, name);
    let b = hook.consumer(&db, name);
    for round in 0..20 {
        let aggregate = format!("r{round}");
        let (first, second) = (tick(&aggregate, 1), tick(&aggregate, 2));
        // A letter for version 1 written before its aggregate had a
        // position (an older release kept none for letters).
        let letter = {
            let mut tx = db.pool.begin().await.unwrap();
            let id: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "INSERT INTO {} (consumer_name, kind, event_id, event_type, schema_version,
                    aggregate_type, aggregate_id, aggregate_version, headers, payload, reason, attempts)
                 VALUES ($1, 'dead_lettered', $2, 'counter.ticked', 1, 'counter', $3, 1, $4, $5,
                         'handler failed on 3 deliveries', 3)
                 RETURNING id",
                db.table("outbox_dead_letters")
            )))
            .bind(name)
            .bind(first.id)
            .bind(&aggregate)
            .bind(serde_json::Value::Object(
                Incoming::from_envelope(&first, 1)
                    .attributes()
                    .iter()
                    .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
                    .collect(),
            ))
            .bind(first.payload.get().as_bytes())
            .fetch_one(&mut *tx)
            .await
            .unwrap();
            tx.commit().await.unwrap();
            id
        };
        assert_eq!(
            a.handle_envelope(&second).await.unwrap(),
            Outcome::Parked { waiting_for: 1 }
        );
        tokio::time::sleep(PARK + Duration::from_millis(50)).await;
        hook.armed.store(true, AtomicOrdering::SeqCst);
        let replay = {
            let b = b.clone();
            tokio::spawn(async move { b.replay(&[letter], &request("retry v1")).await })
        };
        hook.entered.notified().await;
        let sweep = {
            let a = a.clone();
            tokio::spawn(async move { a.sweep().await })
        };
        until_the_sweep_waits_or_ends(&db, &sweep).await;
        hook.release.notify_one();
        let failed = replay.await.unwrap().unwrap();
        assert!(
            matches!(failed.letters[0].1, ReplayOutcome::Failed { .. }),
            "round {round}: {failed:?}"
        );
        let report = sweep.await.unwrap().unwrap();
        assert_eq!(
            report.started, 0,
            "round {round}: version 2 is not the start"
        );
        // A replay is not retried on its own: the next sweep moves version
        // 2 to the dead letters behind version 1's letter.
        let report = a.sweep().await.unwrap();
        assert_eq!(
            (report.started, report.dead_lettered),
            (0, 1),
            "round {round}"
        );
        let again = b.replay(&[letter], &request("retry v1")).await.unwrap();
        assert_eq!(
            again.letters,
            vec![(letter, ReplayOutcome::Applied)],
            "round {round}"
        );
        assert_eq!(
            applied(&db, name, &aggregate).await,
            vec![1],
            "round {round}"
        );
    }
    db.drop_schema().await;
}

// The tool runs as a blocking child process while the consumer's task
// runs the replay: a second worker thread.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_that_cannot_apply_its_event_leaves_the_letter_open_and_wait_exits_1() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let name = "ledger";
    let failing = Arc::new(AtomicBool::new(true));
    let fails = Arc::clone(&failing);
    let table = db.table("effects");
    let consumer = ConsumerBuilder::new(name)
        .config(strict_config(PARK))
        .on_fn::<Ticked, _>(move |received, tx| {
            let (table, fails) = (table.clone(), Arc::clone(&fails));
            Box::pin(async move {
                if fails.load(AtomicOrdering::SeqCst) {
                    return Err(HandlerError::permanent("account closed"));
                }
                record_effect(&table, &received, tx).await
            })
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    assert!(matches!(
        consumer.handle_envelope(&tick("c1", 1)).await.unwrap(),
        Outcome::DeadLettered { .. }
    ));
    failing.store(false, AtomicOrdering::SeqCst);
    let tool = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_outbox-tool"))
            .env_remove("DATABASE_URL")
            .args([
                "--database-url",
                &db::test_database_url(),
                "--schema",
                db.schema.as_str(),
            ])
            .args(args)
            .env("USER", "ci-operator")
            .output()
            .unwrap()
    };
    // An operator passes version 1 at this consumer (the wrong repair for
    // a letter that could still be replayed): the replay now finds its
    // version behind the position and cannot apply it.
    let passed = tool(&[
        "positions",
        "--consumer",
        name,
        "pass",
        "--aggregate-type",
        "counter",
        "--aggregate-id",
        "c1",
        "--version",
        "1",
        "--reason",
        "producer skipped v1",
    ]);
    assert_eq!(
        passed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&passed.stderr)
    );
    let (_sender, source) = channel();
    let task = consumer.spawn(source);
    let letter: i64 = db.scalar("SELECT id FROM {s}.outbox_dead_letters").await;
    let replayed = tool(&[
        "dead-letters",
        "--consumer",
        name,
        "replay",
        "--id",
        &letter.to_string(),
        "--reason",
        "account reopened",
        "--wait",
        "20s",
    ]);
    let stdout = String::from_utf8_lossy(&replayed.stdout);
    assert_eq!(
        replayed.status.code(),
        Some(1),
        "a replay that applied nothing is not a success:\n{stdout}{}",
        String::from_utf8_lossy(&replayed.stderr)
    );
    assert!(stdout.contains("stale"), "{stdout}");
    assert!(applied(&db, name, "c1").await.is_empty());
    assert_eq!(
        open_letters(&db, name, "c1").await.len(),
        1,
        "the letter stays open: it is the record of a version never applied"
    );
    task.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}

/// Several instances of one strict consumer, two taking batches of 16 and
/// two one message at a time, each fed its share of a stream in which
/// every aggregate's versions come shuffled, 10% of them twice, and some
/// first starts fail once: every version of every aggregate is applied
/// exactly once, in order, and nothing ends in a letter. Timing varies
/// from run to run; three rounds with fresh aggregates.
#[tokio::test]
async fn versions_wait_past_the_park_timeout_for_a_predecessor_that_is_retrying() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let name = "patient";
    let failing = Arc::new(AtomicBool::new(true));
    let fails = Arc::clone(&failing);
    let table = db.table("effects");
    // A failed start comes back after 1 s, 2 s, ...: longer than the park
    // timeout.
    let backoff = outbox_core::relay::Backoff {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(4),
        multiplier: 2.0,
        jitter: 0.0,
    };
    let consumer = ConsumerBuilder::new(name)
        .config(ConsumerConfig {
            retry: outbox_core::consumer::RetryPolicy {
                max_attempts: 10,
                backoff,
                ..strict_config(PARK).retry
            },
            ..strict_config(PARK)
        })
        .on_fn::<Ticked, _>(move |received, tx| {
            let (table, fails) = (table.clone(), Arc::clone(&fails));
            Box::pin(async move {
                if received.meta.aggregate_version == 2 && fails.load(AtomicOrdering::SeqCst) {
                    return Err(HandlerError::retryable("the ledger is locked"));
                }
                record_effect(&table, &received, tx).await
            })
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let versions: Vec<_> = (1..=3).map(|v| tick("c1", v)).collect();
    assert_eq!(
        consumer.handle_envelope(&versions[0]).await.unwrap(),
        Outcome::Applied
    );
    // Version 2 fails and comes back after its backoff; version 3 parks.
    assert!(matches!(
        consumer.handle_envelope(&versions[1]).await.unwrap(),
        Outcome::Retry { .. }
    ));
    assert_eq!(
        consumer.handle_envelope(&versions[2]).await.unwrap(),
        Outcome::Parked { waiting_for: 2 }
    );
    // Past the park timeout, but version 2 is due back: 3 keeps waiting.
    tokio::time::sleep(PARK + Duration::from_millis(100)).await;
    assert_eq!(consumer.sweep().await.unwrap().dead_lettered, 0);
    assert!(matches!(
        consumer
            .handle(&Incoming::from_envelope(&versions[1], 2))
            .await
            .unwrap(),
        Outcome::Retry { .. }
    ));
    tokio::time::sleep(PARK + Duration::from_millis(100)).await;
    assert_eq!(consumer.sweep().await.unwrap().dead_lettered, 0);
    failing.store(false, AtomicOrdering::SeqCst);
    assert_eq!(
        consumer
            .handle(&Incoming::from_envelope(&versions[1], 3))
            .await
            .unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        applied(&db, name, "c1").await,
        vec![1, 2, 3],
        "3 followed 2"
    );

    // A retrying version that never comes back holds its successors only
    // until it is a park timeout overdue.
    let later: Vec<_> = (1..=3).map(|v| tick("c2", v)).collect();
    failing.store(true, AtomicOrdering::SeqCst);
    consumer.handle_envelope(&later[0]).await.unwrap();
    consumer.handle_envelope(&later[1]).await.unwrap();
    consumer.handle_envelope(&later[2]).await.unwrap();
    tokio::time::sleep(PARK + Duration::from_millis(100)).await;
    assert_eq!(
        consumer.sweep().await.unwrap().dead_lettered,
        0,
        "still due back"
    );
    tokio::time::sleep(Duration::from_secs(1) + PARK).await;
    assert_eq!(
        consumer.sweep().await.unwrap().dead_lettered,
        1,
        "a park timeout overdue"
    );
    let open = open_letters(&db, name, "c2").await;
    assert_eq!(open.len(), 1);
    assert!(open[0].3.contains("version 2"), "{}", open[0].3);
    db.drop_schema().await;
}
