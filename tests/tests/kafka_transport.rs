//! What only Kafka has: records keyed by aggregate id on the Debezium
//! topic with the CloudEvents Kafka binding's headers, as a plain Kafka
//! reader sees them; and the cluster's refusals (authorization, injected
//! into librdkafka's mock cluster) reported per record as permanent.

use outbox_postgres::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;

use outbox_core::Envelope;
use outbox_core::transport::Transport;
use outbox_tests::conformance::kafka::{KafkaBroker, TOPIC};
use outbox_tests::events::Ticked;
use rdkafka::ClientConfig;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_are_keyed_by_aggregate_with_cloudevents_headers() {
    let broker = KafkaBroker::start();
    let transport = outbox_kafka::KafkaTransport::connect(broker.config())
        .await
        .unwrap();
    // Ten records for each of four keys: with keying broken, ten records
    // of a key land on one of four partitions by chance once in 4^9.
    let events: Vec<Envelope> = (1..=10)
        .flat_map(|version| {
            ["a.b", "Zoë 100%", "line\nbreak", "plain"].map(move |id| {
                Envelope::for_event(&Ticked::new(id, version as u64), version).unwrap()
            })
        })
        .collect();
    for envelope in &events {
        // One call per event: the relay never puts two events of one
        // aggregate in a batch.
        assert!(transport.publish(&[envelope]).await[0].is_ok());
    }

    let reader: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.cluster().bootstrap_servers())
        .set("group.id", "plain-reader")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    reader.subscribe(&[TOPIC]).unwrap();
    let mut seen = Vec::new();
    while seen.len() < events.len() {
        let message = tokio::time::timeout(Duration::from_secs(30), reader.recv())
            .await
            .expect("records within 30 s")
            .unwrap();
        let headers: BTreeMap<String, String> = message
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        (
                            h.key.to_owned(),
                            String::from_utf8(h.value.unwrap().to_vec()).unwrap(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let key = String::from_utf8(message.key().unwrap().to_vec()).unwrap();
        seen.push((key, message.partition(), headers));
    }
    for envelope in &events {
        let (key, _, headers) = seen
            .iter()
            .find(|(_, _, h)| h["ce_id"] == envelope.id.to_string())
            .expect("every event read back");
        assert_eq!(
            key, &envelope.aggregate_id,
            "the key is the raw aggregate id"
        );
        assert_eq!(
            headers["id"],
            envelope.id.to_string(),
            "Debezium's id header"
        );
        assert_eq!(
            headers["ce_subject"], envelope.aggregate_id,
            "UTF-8, not percent-encoded"
        );
        assert_eq!(headers["ce_type"], "counter.ticked");
        assert_eq!(headers["ce_specversion"], "1.0");
        assert_eq!(
            headers["ce_aggregateversion"],
            envelope.aggregate_version.to_string()
        );
        assert_eq!(headers["content-type"], "application/json");
        assert!(!headers.contains_key("ce_datacontenttype"));
    }
    let mut partitions_by_key: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (key, partition, _) in &seen {
        partitions_by_key.entry(key).or_default().push(*partition);
    }
    assert_eq!(partitions_by_key.len(), 4);
    for (key, partitions) in &partitions_by_key {
        assert_eq!(partitions.len(), 10);
        assert!(
            partitions.iter().all(|p| *p == partitions[0]),
            "{key:?}: one aggregate, one partition ({partitions:?})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_refusals_are_permanent() {
    let broker = KafkaBroker::start();
    let transport = outbox_kafka::KafkaTransport::connect(broker.config())
        .await
        .unwrap();
    let envelope = Envelope::for_event(&Ticked::new("auth", 1), 1).unwrap();

    broker.cluster().request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
    );
    let refused = transport.publish(&[&envelope]).await.remove(0).unwrap_err();
    assert!(!refused.retryable, "{refused}");
    assert!(refused.reason.contains("uthoriz"), "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalances_lose_nothing_and_apply_nothing_twice() {
    use outbox_core::consumer::ConsumerConfig;
    use outbox_core::relay::{Relay, RelayConfig};
    use outbox_tests::conformance::Broker;
    use outbox_tests::consumers::{create_effects, effects, tick_consumer};
    use outbox_tests::{TestDb, wait};

    let broker = KafkaBroker::start();
    let db = TestDb::new().await;
    create_effects(&db).await;
    let name = outbox_tests::conformance::unique_name("rebalance");
    let consumer = tick_consumer(&db, &name, ConsumerConfig::default(), Duration::ZERO, &[]);
    let first = consumer.spawn(broker.source(&consumer).await);
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        broker.transport().await,
        RelayConfig {
            poll_interval: Duration::from_millis(20),
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    let emit_round = |tick: u64| {
        let db = &db;
        async move {
            let mut tx = db.pool.begin().await.unwrap();
            let events: Vec<Ticked> = (0..12)
                .map(|c| Ticked::new(format!("r{c}"), tick))
                .collect();
            db.outbox.emit_all(&mut tx, &events).await.unwrap();
            tx.commit().await.unwrap();
        }
    };
    for tick in 1..=10 {
        emit_round(tick).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // A second instance joins: the partitions are divided anew.
    let second = consumer.spawn(broker.source(&consumer).await);
    for tick in 11..=20 {
        emit_round(tick).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // The first leaves: the second takes every partition.
    first.drain(Duration::from_secs(10)).await.unwrap();
    for tick in 21..=30 {
        emit_round(tick).await;
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    wait::until("360 events applied", Duration::from_secs(90), || async {
        effects(&db, &name).await.len() >= 360
    })
    .await;
    // Redeliveries after the rebalances settle as duplicates.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = effects(&db, &name).await;
    assert_eq!(seen.len(), 360, "each event applied once");
    let mut by_aggregate: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for effect in seen {
        by_aggregate
            .entry(effect.aggregate_id)
            .or_default()
            .push(effect.aggregate_version);
    }
    for (aggregate, versions) in by_aggregate {
        assert_eq!(
            versions,
            (1..=30).collect::<Vec<i64>>(),
            "{aggregate}: in order"
        );
    }
    second.drain(Duration::from_secs(10)).await.unwrap();
    relay.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}

/// Keys and the partition of 12 that the Java client (and Kafka Connect,
/// Debezium, Kafka Streams) chooses for each: `murmur2(key) & 0x7fffffff %
/// 12`, computed with kafka-python's Java-compatible `murmur2` (the
/// default partitioner of that client), not with the code under test.
const JAVA_PARTITIONS_OF_12: [(&str, i32); 20] = [
    ("order-1", 10),
    ("order-2", 3),
    ("order-42", 0),
    ("8d7e2f4e-5b1c-4c4a-9a0e-1f2e3d4c5b6a", 4),
    ("a.b", 1),
    ("Zoë 100%", 0),
    ("line\nbreak", 9),
    ("plain", 11),
    ("c0", 6),
    ("c1", 11),
    ("c2", 1),
    ("c3", 5),
    ("c4", 2),
    ("c5", 3),
    ("c6", 7),
    ("c7", 11),
    ("c8", 3),
    ("c9", 0),
    ("customer/17", 1),
    ("x", 10),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_land_on_the_partitions_the_java_client_chooses() {
    let broker = KafkaBroker::start();
    let topic = "murmur.counter";
    broker.cluster().create_topic(topic, 12, 1).unwrap();
    let transport = outbox_kafka::KafkaTransport::connect(outbox_kafka::KafkaConfig {
        topic_template: "murmur.{aggregate_type}".into(),
        ..broker.config()
    })
    .await
    .unwrap();
    for (key, _) in JAVA_PARTITIONS_OF_12 {
        let envelope = Envelope::for_event(&Ticked::new(key, 1), 1).unwrap();
        assert!(transport.publish(&[&envelope]).await[0].is_ok(), "{key:?}");
    }
    let reader: StreamConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.cluster().bootstrap_servers())
        .set("group.id", "partition-reader")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    reader.subscribe(&[topic]).unwrap();
    let mut seen: BTreeMap<String, i32> = BTreeMap::new();
    while seen.len() < JAVA_PARTITIONS_OF_12.len() {
        let message = tokio::time::timeout(Duration::from_secs(30), reader.recv())
            .await
            .expect("records within 30 s")
            .unwrap();
        let key = String::from_utf8(message.key().unwrap().to_vec()).unwrap();
        seen.insert(key, message.partition());
    }
    for (key, partition) in JAVA_PARTITIONS_OF_12 {
        assert_eq!(
            seen[key], partition,
            "{key:?} on the Java client's partition (murmur2)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_topic_is_retried_for_a_bounded_time_and_reported_by_health() {
    use outbox_core::transport::TransportHealth;

    let broker = KafkaBroker::start();
    let unknown = |template: &str, retry: Duration| outbox_kafka::KafkaConfig {
        topic_template: template.into(),
        unknown_topic_retry: retry,
        delivery_timeout: Duration::from_secs(5),
        client: vec![
            // The cluster must not create topics on its own here, and
            // librdkafka gives up waiting for a topic after a second.
            ("allow.auto.create.topics".into(), "false".into()),
            ("topic.metadata.propagation.max.ms".into(), "1000".into()),
        ],
        ..broker.config()
    };
    let transport = outbox_kafka::KafkaTransport::connect(unknown(
        "fresh.{aggregate_type}",
        Duration::from_secs(60),
    ))
    .await
    .unwrap();
    // The topics of the contracts linked into this binary that the
    // cluster lacks are reported, and publishing goes on.
    let missing = transport.missing_topics();
    assert!(missing.iter().any(|t| t == "fresh.counter"), "{missing:?}");
    match transport.health().await {
        TransportHealth::Degraded { reason } => {
            assert!(reason.contains("fresh.counter"), "{reason}")
        }
        other => panic!("missing topics degrade the health: {other:?}"),
    }
    assert!(transport.health().await.is_up(), "degraded still publishes");

    // Not there yet (a topic created a moment from now): retryable.
    let envelope = Envelope::for_event(&Ticked::new("unknown", 1), 1).unwrap();
    let first = transport.publish(&[&envelope]).await.remove(0).unwrap_err();
    assert!(first.retryable, "{first}");
    assert!(first.reason.contains("does not know topic"), "{first}");
    // It is created: the retry goes through.
    broker
        .cluster()
        .create_topic("fresh.counter", 4, 1)
        .unwrap();
    let mut delivered = false;
    for _ in 0..20 {
        if transport.publish(&[&envelope]).await[0].is_ok() {
            delivered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(delivered, "published once the topic exists");

    // A topic that never comes: permanent once the window has passed.
    let never = outbox_kafka::KafkaTransport::connect(unknown(
        "never.{aggregate_type}",
        Duration::from_secs(2),
    ))
    .await
    .unwrap();
    let first = never.publish(&[&envelope]).await.remove(0).unwrap_err();
    assert!(first.retryable, "{first}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = never.publish(&[&envelope]).await.remove(0).unwrap_err();
    assert!(!later.retryable, "{later}");
    assert!(
        later.reason.contains("does not exist") && later.reason.contains("never.counter"),
        "{later}"
    );
}
