//! Strict ordering: a parked message whose start was counted is leased to
//! the instance that counted it. Other instances' sweeps do not start it
//! again while that instance is on its way to the handler (each would
//! count a start of its own and use up `max_attempts` on a message that
//! never failed), and a start whose instance died comes back once the
//! lease runs out. The window is forced with the `consumer::drain_between`
//! failpoint, which is process-wide: this file holds the only test of its
//! binary. Real PostgreSQL; the consumer is fed directly.

use std::time::{Duration, Instant};

use outbox_core::consumer::{ConsumerConfig, Outcome, RetryPolicy, SweepReport};
use outbox_core::failpoint::{self, Action};
use outbox_tests::consumers::{
    create_effects, effects, letters, strict_config as strict, tick, tick_consumer,
};
use outbox_tests::{TestDb, wait};

async fn versions(db: &TestDb, consumer: &str, aggregate: &str) -> Vec<i64> {
    effects(db, consumer)
        .await
        .iter()
        .filter(|e| e.aggregate_id == aggregate)
        .map(|e| e.aggregate_version)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_start_is_leased_to_its_instance_and_comes_back_after_it_died() {
    let db = TestDb::new().await;
    create_effects(&db).await;

    // 1. Two instances; one start allowed. The first instance applies c1
    // v1, counts the start of the parked v2 and stops in the window before
    // its handler's transaction; the second instance sweeps three times
    // inside that window.
    let one_start = ConsumerConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..strict(Duration::from_secs(60)).retry
        },
        ..strict(Duration::from_secs(60))
    };
    let first = tick_consumer(&db, "lease", one_start.clone(), Duration::ZERO, &[]);
    let second = tick_consumer(&db, "lease", one_start, Duration::ZERO, &[]);
    assert_eq!(
        first.handle_envelope(&tick("c1", 2)).await.unwrap(),
        Outcome::Parked { waiting_for: 1 }
    );
    failpoint::arm(failpoint::CONSUMER_DRAIN_BETWEEN, Action::Pause, 1);
    let applying = {
        let first = first.clone();
        tokio::spawn(async move { first.handle_envelope(&tick("c1", 1)).await })
    };
    wait::until("the drain paused", Duration::from_secs(10), || async {
        failpoint::is_paused(failpoint::CONSUMER_DRAIN_BETWEEN)
    })
    .await;
    for _ in 0..3 {
        assert_eq!(
            second.sweep().await.unwrap(),
            SweepReport::default(),
            "the other instance's sweep left the leased message alone"
        );
    }
    failpoint::release(failpoint::CONSUMER_DRAIN_BETWEEN);
    assert_eq!(applying.await.unwrap().unwrap(), Outcome::Applied);
    assert_eq!(versions(&db, "lease", "c1").await, vec![1, 2]);
    let lettered = letters(&db, "lease").await;
    assert!(
        lettered.is_empty(),
        "a message that never failed went to the letters: {:?}",
        lettered.iter().map(|l| &l.reason).collect::<Vec<_>>()
    );

    // 2. The instance that counted a start dies before its handler ran:
    // nobody starts the message while the lease holds, the sweep applies
    // it after.
    let crashing = tick_consumer(
        &db,
        "lease-crash",
        strict(Duration::from_secs(60)),
        Duration::ZERO,
        &[],
    );
    let survivor = tick_consumer(
        &db,
        "lease-crash",
        strict(Duration::from_secs(60)),
        Duration::ZERO,
        &[],
    );
    assert_eq!(
        crashing.handle_envelope(&tick("c2", 2)).await.unwrap(),
        Outcome::Parked { waiting_for: 1 }
    );
    failpoint::arm(failpoint::CONSUMER_DRAIN_BETWEEN, Action::Panic, 1);
    let died = {
        let crashing = crashing.clone();
        tokio::spawn(async move { crashing.handle_envelope(&tick("c2", 1)).await })
    }
    .await;
    assert!(
        died.as_ref().is_err_and(|e| e.is_panic()),
        "the drain died at the failpoint: {died:?}"
    );
    let died_at = Instant::now();
    assert_eq!(versions(&db, "lease-crash", "c2").await, vec![1]);
    assert_eq!(survivor.sweep().await.unwrap(), SweepReport::default());
    wait::until(
        "the sweep applied the message after the lease",
        Duration::from_secs(30),
        || async {
            survivor.sweep().await.unwrap();
            versions(&db, "lease-crash", "c2").await == vec![1, 2]
        },
    )
    .await;
    assert!(
        died_at.elapsed() >= Duration::from_secs(5),
        "it came back only after the lease: {:?}",
        died_at.elapsed()
    );
    assert!(letters(&db, "lease-crash").await.is_empty());
    failpoint::disarm(failpoint::CONSUMER_DRAIN_BETWEEN);
    db.drop_schema().await;
}
