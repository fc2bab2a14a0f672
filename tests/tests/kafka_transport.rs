//! What only Kafka has: records keyed by aggregate id on the Debezium
//! topic with the CloudEvents Kafka binding's headers, as a plain Kafka
//! reader sees them; and the cluster's refusals (authorization, injected
//! into librdkafka's mock cluster) reported per record as permanent, while
//! errors the producer retries itself end in delivery.

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
    let events: Vec<Envelope> = ["a.b", "Zoë 100%", "a.b", "plain"]
        .iter()
        .enumerate()
        .map(|(n, id)| Envelope::for_event(&Ticked::new(*id, n as u64), n as i64 + 1).unwrap())
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
    let partitions_of_ab: Vec<i32> = seen
        .iter()
        .filter(|(key, _, _)| key == "a.b")
        .map(|(_, partition, _)| *partition)
        .collect();
    assert_eq!(partitions_of_ab.len(), 2);
    assert_eq!(
        partitions_of_ab[0], partitions_of_ab[1],
        "one aggregate, one partition"
    );
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
async fn errors_the_producer_retries_itself_end_delivered() {
    let broker = KafkaBroker::start();
    let transport = outbox_kafka::KafkaTransport::connect(broker.config())
        .await
        .unwrap();
    let envelope = Envelope::for_event(&Ticked::new("flaky", 1), 1).unwrap();
    broker.cluster().request_errors(
        RDKafkaApiKey::Produce,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
        ],
    );
    let outcome = transport.publish(&[&envelope]).await.remove(0);
    assert!(
        outcome.is_ok(),
        "librdkafka retries transient errors itself: {outcome:?}"
    );
}
