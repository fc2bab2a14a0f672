//! Through the in-process bus, the relay dies between the consumers'
//! commits and its mark (a failpoint panics the worker there): the events
//! are published again, every consumer receives them a second time, and
//! its inbox drops the duplicates, so each effect happens once. (Failpoints
//! are global to the process: this file holds one test.)

use outbox_postgres::prelude::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use outbox_core::consumer::ConsumerConfig;
use outbox_core::relay::failpoint::{self, AFTER_PUBLISH, Action};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::transport::InProcessBus;
use outbox_tests::consumers::{create_effects, effects, tick_consumer};
use outbox_tests::events::emit_ticks;
use outbox_tests::transports::Counting;
use outbox_tests::{TestDb, wait};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_dying_after_the_consumers_committed_publishes_again_and_the_inboxes_drop_it() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let bus = InProcessBus::new();
    let consumers = ["ledger", "mailer"].map(|name| {
        tick_consumer(&db, name, ConsumerConfig::default(), Duration::ZERO, &[])
            .spawn(bus.subscribe(name))
    });
    let total = emit_ticks(&db.pool, &db.outbox, 3, 4, 12).await;
    failpoint::arm(AFTER_PUBLISH, Action::Panic, 1);
    let attempts = Arc::new(AtomicU64::new(0));
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        Counting::new(bus.transport(), Arc::clone(&attempts)),
        RelayConfig {
            poll_interval: Duration::from_millis(50),
            error_backoff: Duration::from_millis(50),
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    wait::until(
        "every event published after the worker restarted",
        Duration::from_secs(30),
        || async { db.published().await == total as i64 },
    )
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    failpoint::disarm(AFTER_PUBLISH);
    assert_eq!(
        attempts.load(Ordering::Relaxed),
        2 * total as u64,
        "the batch the worker died on was published a second time"
    );
    for name in ["ledger", "mailer"] {
        let applied = effects(&db, name).await;
        assert_eq!(
            applied.len(),
            total,
            "{name} applied an event twice or missed one"
        );
        let mut ids: Vec<_> = applied.iter().map(|e| e.event_id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), total, "{name}");
    }
    for task in consumers {
        task.drain(Duration::from_secs(5)).await.unwrap();
    }
    db.drop_schema().await;
}
