//! The in-process bus (`outbox_core::transport::InProcessBus`) between a
//! real relay and real consumers on PostgreSQL, with no broker: a publish
//! is acknowledged only after every subscribed consumer committed the
//! event (checked row by row: each effect committed before its event was
//! marked published); instances of one consumer share its queue; a
//! handler that fails keeps its event pending at the producer and holds
//! the aggregate's next version back until it is settled; with no
//! subscriber the transport is down and nothing is claimed.

use outbox_postgres::prelude::*;
use std::time::Duration;

use outbox_core::consumer::{ConsumerConfig, RetryPolicy};
use outbox_core::relay::{Backoff, Relay, RelayConfig};
use outbox_core::transport::{InProcessBus, Transport, TransportHealth};
use outbox_tests::consumers::{create_effects, effects, letters, tick, tick_consumer};
use outbox_tests::events::{Ticked, emit_ticks};
use outbox_tests::{TestDb, wait};

fn quick_relay() -> RelayConfig {
    RelayConfig {
        poll_interval: Duration::from_millis(50),
        error_backoff: Duration::from_millis(50),
        max_attempts: 100,
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(50),
            multiplier: 2.0,
            jitter: 0.0,
        },
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    }
}

fn retry(max_attempts: u32) -> ConsumerConfig {
    ConsumerConfig {
        retry: RetryPolicy {
            max_attempts,
            backoff: Backoff {
                initial: Duration::from_millis(10),
                max: Duration::from_millis(20),
                multiplier: 2.0,
                jitter: 0.0,
            },
            handler_timeout: Duration::from_secs(10),
        },
        ..ConsumerConfig::default()
    }
}

/// Versions of `aggregate` a consumer applied, in commit order.
async fn applied(db: &TestDb, consumer: &str, aggregate: &str) -> Vec<i64> {
    effects(db, consumer)
        .await
        .into_iter()
        .filter(|e| e.aggregate_id == aggregate)
        .map(|e| e.aggregate_version)
        .collect()
}

/// Records, for every event the relay marks published, how many
/// consumers' effects of it were committed when the relay committed the
/// mark. (The PostgreSQL relay marks a claimed batch published in its claim
/// statement and commits once every ack is back, so the check runs at
/// commit: a deferred constraint trigger, which sees what was committed
/// before.)
async fn watch_marks(db: &TestDb) {
    db.execute("CREATE TABLE {s}.marks (event_id uuid NOT NULL, effects_seen bigint NOT NULL)")
        .await;
    db.execute(
        "CREATE FUNCTION {s}.record_mark() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO {s}.marks
             SELECT NEW.id, count(*) FROM {s}.effects e WHERE e.event_id = NEW.id
             HAVING (SELECT status FROM {s}.outbox_events o WHERE o.id = NEW.id) = 'published';
             RETURN NULL;
         END $$",
    )
    .await;
    db.execute(
        "CREATE CONSTRAINT TRIGGER record_mark AFTER UPDATE OF status ON {s}.outbox_events
         DEFERRABLE INITIALLY DEFERRED
         FOR EACH ROW WHEN (NEW.status = 'published' AND OLD.status <> 'published')
         EXECUTE FUNCTION {s}.record_mark()",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_consumer_commits_each_event_once_before_it_counts_as_published() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let bus = InProcessBus::new();
    let ledger = tick_consumer(
        &db,
        "ledger",
        ConsumerConfig::default(),
        Duration::ZERO,
        &[],
    );
    let mailer = tick_consumer(
        &db,
        "mailer",
        ConsumerConfig::default(),
        Duration::ZERO,
        &[],
    );
    let tasks = [
        ledger.spawn(bus.subscribe("ledger")),
        // Two instances of one consumer compete for one queue.
        mailer.spawn(bus.subscribe("mailer")),
        mailer.spawn(bus.subscribe("mailer")),
    ];
    let mut names = bus.subscribers();
    names.sort();
    assert_eq!(names, ["ledger", "mailer"]);
    watch_marks(&db).await;
    let total = emit_ticks(&db.pool, &db.outbox, 4, 5, 10).await as i64;
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        bus.transport(),
        quick_relay(),
    )
    .await
    .unwrap();
    wait::until("every event published", Duration::from_secs(30), || async {
        db.published().await == total
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    for consumer in ["ledger", "mailer"] {
        assert_eq!(
            effects(&db, consumer).await.len() as i64,
            total,
            "{consumer}"
        );
        for counter in 0..4 {
            assert_eq!(
                applied(&db, consumer, &format!("c{counter}")).await,
                [1, 2, 3, 4, 5],
                "{consumer}"
            );
        }
    }
    // Row by row, as the relay marked each event: how many consumers'
    // effects were committed at that moment.
    let marks: Vec<(uuid::Uuid, i64)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT event_id, effects_seen FROM {} ORDER BY event_id",
        db.table("marks")
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(marks.len() as i64, total, "every mark was seen");
    let early: Vec<_> = marks.iter().filter(|(_, seen)| *seen != 2).collect();
    assert!(
        early.is_empty(),
        "events marked published before both consumers committed them: {early:?}"
    );
    for task in tasks {
        task.drain(Duration::from_secs(5)).await.unwrap();
    }
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_handler_keeps_its_event_pending_and_holds_back_the_next_version() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let bus = InProcessBus::new();
    let ledger = tick_consumer(&db, "ledger", retry(3), Duration::ZERO, &[]);
    let picky = tick_consumer(&db, "picky", retry(3), Duration::ZERO, &["bad"]);
    let tasks = [
        ledger.spawn(bus.subscribe("ledger")),
        picky.spawn(bus.subscribe("picky")),
    ];
    let mut tx = db.pool.begin().await.unwrap();
    for (counter, n) in [("bad", 1), ("bad", 2), ("good", 1)] {
        db.outbox
            .emit(&mut tx, &Ticked::new(counter, n))
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        bus.transport(),
        quick_relay(),
    )
    .await
    .unwrap();
    wait::until("every event published", Duration::from_secs(30), || async {
        db.published().await == 3
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();

    // picky dead-lettered both versions of "bad" after three deliveries
    // each, numbered by the bus; ledger applied everything once, the
    // redeliveries caught by its inbox.
    let letters = letters(&db, "picky").await;
    let lettered: Vec<(Option<i64>, i32)> = letters
        .iter()
        .map(|l| (l.aggregate_version, l.attempts))
        .collect();
    assert_eq!(lettered, [(Some(1), 3), (Some(2), 3)]);
    assert_eq!(applied(&db, "ledger", "bad").await, [1, 2]);
    assert_eq!(applied(&db, "ledger", "good").await, [1]);
    assert_eq!(applied(&db, "picky", "good").await, [1]);
    let retried: i32 = db
        .scalar(
            "SELECT attempt_count FROM {s}.outbox_events
             WHERE aggregate_id = 'bad' AND aggregate_version = 1",
        )
        .await;
    assert!(
        retried >= 2,
        "the producer saw {retried} failed attempts of bad v1"
    );
    // Version 2 reached ledger only after picky had settled version 1.
    let held_back: bool = db
        .scalar(
            "SELECT (SELECT applied_at FROM {s}.effects
                     WHERE consumer = 'ledger' AND aggregate_id = 'bad' AND aggregate_version = 2)
                  > (SELECT created_at FROM {s}.outbox_dead_letters
                     WHERE consumer_name = 'picky' AND aggregate_version = 1)",
        )
        .await;
    assert!(
        held_back,
        "version 2 was delivered before version 1 was settled everywhere"
    );
    for task in tasks {
        task.drain(Duration::from_secs(5)).await.unwrap();
    }
    db.drop_schema().await;
}

#[tokio::test]
async fn without_a_subscriber_the_transport_is_down_and_refuses_to_publish() {
    let bus = InProcessBus::new();
    let transport = bus.transport();
    assert!(matches!(
        transport.health().await,
        TransportHealth::Down { .. }
    ));
    let envelope = tick("lonely", 1);
    let refused = transport.publish(&[&envelope]).await;
    let failure = refused[0].as_ref().unwrap_err();
    assert!(failure.retryable);
    assert!(
        failure.reason.contains("no consumer is subscribed"),
        "{failure}"
    );

    let source = bus.subscribe("later");
    assert_eq!(transport.health().await, TransportHealth::Up);
    // A subscribed consumer that stops holds publishing back: it would
    // miss the events otherwise.
    drop(source);
    let TransportHealth::Down { reason } = transport.health().await else {
        panic!("up while a subscribed consumer is not running");
    };
    assert!(reason.contains("consumer later"), "{reason}");
    let refused = transport.publish(&[&envelope]).await;
    assert!(refused[0].as_ref().is_err_and(|f| f.retryable));
    assert_eq!(bus.subscribers(), ["later"]);
    // Subscribing again lets it go on; unsubscribing removes it for good.
    let again = bus.subscribe("later");
    assert_eq!(transport.health().await, TransportHealth::Up);
    drop(again);
    assert!(bus.unsubscribe("later"));
    assert!(bus.subscribers().is_empty());
    assert!(matches!(
        transport.health().await,
        TransportHealth::Down { .. }
    ));
}
