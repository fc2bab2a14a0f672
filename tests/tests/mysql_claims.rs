//! A claim in flight on MariaDB does not hold producers up (no gap-lock
//! convoy): while a relay's claim transaction holds its row locks and
//! leases (paused inside the transaction by the failpoint
//! `relay::in_claim`), producers commit new versions of the claimed
//! aggregates and new aggregates before and after them in key order. Their
//! connection waits at most 3 s for a lock (`innodb_lock_wait_timeout`), so
//! an insert that a claim's locks held up fails the test with the lock
//! wait error instead of passing slowly. Under REPEATABLE READ, the
//! server's default, the head query's next-key locks would hold these
//! inserts until the claim commits.

use std::time::{Duration, Instant};

use outbox_core::failpoint::{self, Action};
use outbox_core::relay::{ClaimedBatch, RelayConfig, RelayStore};
use outbox_mysql::{MySqlOutbox, MySqlRelayStore};
use outbox_tests::events::Ticked;
use outbox_tests::mysql::MySqlTestDb;
use outbox_tests::wait;
use sqlx::Connection;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producers_commit_while_a_claim_holds_its_locks() {
    let db = MySqlTestDb::new().await;
    let outbox = MySqlOutbox::new();
    let mut tx = db.pool.begin().await.unwrap();
    for aggregate in 0..10 {
        for tick in 1..=3 {
            outbox
                .emit(&mut tx, &Ticked::new(format!("c{aggregate}"), tick))
                .await
                .unwrap();
        }
    }
    tx.commit().await.unwrap();

    failpoint::arm(failpoint::IN_CLAIM, Action::Pause, 1);
    let store = MySqlRelayStore::new(db.pool.clone(), &RelayConfig::default());
    let claim = tokio::spawn(async move { store.claim(100).await });
    wait::until(
        "the claim transaction holding its locks",
        Duration::from_secs(30),
        || async { failpoint::is_paused(failpoint::IN_CLAIM) },
    )
    .await;

    let mut producer = db.pool.acquire().await.unwrap();
    sqlx::query("SET SESSION innodb_lock_wait_timeout = 3")
        .execute(&mut *producer)
        .await
        .unwrap();
    let mut waits = Vec::new();
    // A claimed aggregate's next version, new aggregates sorting before,
    // between and after the claimed ones.
    for aggregate in ["c0", "c9", "a-new", "c4-new", "z-new"] {
        let started = Instant::now();
        let mut tx = producer.begin().await.unwrap();
        outbox
            .emit(&mut tx, &Ticked::new(aggregate, 4))
            .await
            .unwrap_or_else(|e| panic!("emit to {aggregate} during the claim: {e}"));
        tx.commit()
            .await
            .unwrap_or_else(|e| panic!("commit of {aggregate} during the claim: {e}"));
        waits.push((aggregate, started.elapsed()));
    }
    assert!(
        failpoint::is_paused(failpoint::IN_CLAIM) && !claim.is_finished(),
        "the producers committed while the claim was still open"
    );
    eprintln!("producer transactions during an open claim: {waits:?}");

    failpoint::release(failpoint::IN_CLAIM);
    let batch = claim.await.unwrap().unwrap();
    // The claim holds what was there when it ran: ten heads and their
    // later versions, none of the events committed during it.
    assert_eq!(batch.events().len(), 30);
    assert!(
        batch
            .events()
            .iter()
            .all(|e| e.envelope.aggregate_version <= 3)
    );
    batch.release().await.unwrap();
    let total: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_events")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(total, 35);
    drop(producer);
    db.drop_database().await;
}
