//! The Kafka relay against a Kafka-compatible broker in its own process
//! (Tansu, memory-only), killed with SIGKILL and started again while the
//! relay runs: events emitted during the outage wait, pending with no
//! attempt used, and are published in order per aggregate once the broker
//! is back. (The restarted broker is empty, so what it held before is gone
//! with it: that is the broker's storage, not the relay's doing.)

use outbox_postgres::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

use outbox_core::EventDraft;
use outbox_core::relay::{Relay, RelayConfig};
use outbox_kafka::{KafkaConfig, KafkaTransport};
use outbox_tests::events::Ticked;
use outbox_tests::tansu::TansuBroker;
use outbox_tests::{TestDb, wait};
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use sqlx::AssertSqlSafe;

const TOPIC: &str = "outbox.event.counter";

async fn emit(db: &TestDb, events: Vec<Ticked>) {
    let mut tx = db.pool.begin().await.unwrap();
    let drafts = events.iter().map(|e| EventDraft::new(e).unwrap()).collect();
    db.outbox.emit_drafts(&mut tx, drafts).await.unwrap();
    tx.commit().await.unwrap();
}

async fn statuses(db: &TestDb) -> Vec<(String, i64, String, i32)> {
    sqlx::query_as(AssertSqlSafe(format!(
        "SELECT aggregate_id, aggregate_version, status, attempt_count FROM {} ORDER BY aggregate_id, aggregate_version",
        db.table("outbox_events")
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_outlives_a_killed_broker_process_and_publishes_in_order_after_it() {
    let mut broker = TansuBroker::start();
    broker.create_topic(TOPIC, 4);
    let db = TestDb::new().await;
    let transport = KafkaTransport::connect(KafkaConfig {
        bootstrap_servers: broker.bootstrap_servers(),
        connect_timeout: Duration::from_secs(2),
        client: vec![("reconnect.backoff.max.ms".into(), "500".into())],
        ..KafkaConfig::default()
    })
    .await
    .unwrap();
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        transport,
        RelayConfig {
            poll_interval: Duration::from_millis(50),
            stats_interval: Duration::ZERO,
            error_backoff: Duration::from_millis(200),
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    emit(
        &db,
        (1..=4).map(|c| Ticked::new(format!("k{c}"), 1)).collect(),
    )
    .await;
    wait::until(
        "the first events published",
        Duration::from_secs(30),
        || async { statuses(&db).await.iter().all(|r| r.2 == "published") },
    )
    .await;

    broker.kill();
    wait::until(
        "the relay sees the broker down",
        Duration::from_secs(30),
        || async { !relay.health().is_up() },
    )
    .await;
    for tick in 2..=5 {
        emit(
            &db,
            (1..=4)
                .map(|c| Ticked::new(format!("k{c}"), tick))
                .collect(),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (aggregate, version, status, attempts) in statuses(&db).await {
        if version > 1 {
            assert_eq!(
                (status.as_str(), attempts),
                ("pending", 0),
                "{aggregate} v{version} waits untouched while the broker is down"
            );
        }
    }

    broker.resume();
    broker.create_topic(TOPIC, 4);
    wait::until(
        "everything published after the restart",
        Duration::from_secs(60),
        || async { statuses(&db).await.iter().all(|r| r.2 == "published") },
    )
    .await;
    relay.drain(Duration::from_secs(5)).await.unwrap();

    let reader: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap_servers())
        .set("group.id", "plain-reader")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    reader.subscribe(&[TOPIC]).unwrap();
    let mut by_key: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    while by_key.values().map(Vec::len).sum::<usize>() < 16 {
        let message = tokio::time::timeout(Duration::from_secs(30), reader.recv())
            .await
            .expect("the republished records within 30 s")
            .unwrap();
        let key = String::from_utf8(message.key().unwrap().to_vec()).unwrap();
        let payload: serde_json::Value =
            serde_json::from_slice(message.payload().unwrap()).unwrap();
        by_key
            .entry(key)
            .or_default()
            .push(payload["tick"].as_i64().unwrap());
    }
    for c in 1..=4 {
        assert_eq!(by_key[&format!("k{c}")], vec![2, 3, 4, 5], "k{c} in order");
    }
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_topics_creates_the_topics_the_contracts_map_to() {
    let broker = TansuBroker::start();
    let transport = outbox_kafka::KafkaTransport::connect(outbox_kafka::KafkaConfig {
        bootstrap_servers: broker.bootstrap_servers(),
        create_topics: Some(outbox_kafka::TopicCreation {
            partitions: 3,
            replication: 1,
        }),
        connect_timeout: Duration::from_secs(10),
        ..outbox_kafka::KafkaConfig::default()
    })
    .await
    .unwrap();
    assert!(transport.expected_topics().contains("outbox.event.parcel"));
    assert_eq!(transport.missing_topics(), Vec::<String>::new());
    assert_eq!(
        outbox_core::transport::Transport::health(&transport).await,
        outbox_core::transport::TransportHealth::Up
    );
    let envelope =
        outbox_core::Envelope::for_event(&outbox_tests::events::Ticked::new("created", 1), 1)
            .unwrap();
    assert!(
        outbox_core::transport::Transport::publish(&transport, &[&envelope]).await[0].is_ok(),
        "a record goes to a topic created at start"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transport_started_while_the_broker_is_down_creates_its_topics_once_it_answers() {
    let mut broker = TansuBroker::start();
    broker.kill();
    let transport = outbox_kafka::KafkaTransport::connect(outbox_kafka::KafkaConfig {
        bootstrap_servers: broker.bootstrap_servers(),
        create_topics: Some(outbox_kafka::TopicCreation {
            partitions: 2,
            replication: 1,
        }),
        connect_timeout: Duration::from_secs(2),
        ..outbox_kafka::KafkaConfig::default()
    })
    .await
    .unwrap();
    assert!(matches!(
        outbox_core::transport::Transport::health(&transport).await,
        outbox_core::transport::TransportHealth::Down { .. }
    ));

    broker.resume();
    wait::until(
        "the transport up again",
        Duration::from_secs(60),
        || async {
            outbox_core::transport::Transport::health(&transport).await
                == outbox_core::transport::TransportHealth::Up
        },
    )
    .await;
    // Listed by another client, without publishing anything: the topics
    // were created when the transport found the broker, not on first use.
    let servers = broker.bootstrap_servers();
    let topics = tokio::task::spawn_blocking(move || {
        let client: rdkafka::consumer::BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &servers)
            .create()
            .unwrap();
        client
            .fetch_metadata(None, rdkafka::util::Timeout::After(Duration::from_secs(10)))
            .unwrap()
            .topics()
            .iter()
            .map(|t| t.name().to_owned())
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert!(transport.expected_topics().contains("outbox.event.parcel"));
    for expected in transport.expected_topics() {
        assert!(
            topics.contains(&expected),
            "{expected} created once the broker answered ({topics:?})"
        );
    }
    assert_eq!(transport.missing_topics(), Vec::<String>::new());
}
