//! What only RabbitMQ has: the message properties a plain AMQP reader sees
//! (message id, type, persistence, `cloudEvents:` headers), and the broker's
//! own refusal of a message over its `max_message_size`, which closes the
//! channel: only that message fails for good, the others of its batch are
//! retryable, and the next batch goes out on a new channel.

use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};
use outbox_core::Envelope;
use outbox_core::transport::Transport;
use outbox_rabbitmq::{RabbitConfig, RabbitTransport};
use outbox_tests::conformance::rabbitmq::amqp_url;
use outbox_tests::conformance::unique_name;
use outbox_tests::events::Ticked;

async fn queue_for(exchange: &str) -> (Connection, lapin::Channel, String) {
    let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("RabbitMQ (run scripts/services.sh)");
    let channel = connection.create_channel().await.unwrap();
    let queue = unique_name("plain-reader");
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                auto_delete: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    channel
        .queue_bind(
            queue.as_str().into(),
            exchange.into(),
            "#".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    (connection, channel, queue)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_carry_the_event_id_type_persistence_and_cloudevents_headers() {
    let config = RabbitConfig {
        url: amqp_url(),
        exchange: unique_name("props"),
        ..RabbitConfig::default()
    };
    let transport = RabbitTransport::connect(config.clone()).await.unwrap();
    let (_connection, channel, queue) = queue_for(&config.exchange).await;
    let envelope = Envelope::for_event(&Ticked::new("Zoë 100%", 3), 3).unwrap();
    assert!(transport.publish(&[&envelope]).await[0].is_ok());

    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
        .await
        .expect("the message within 10 s")
        .unwrap()
        .unwrap();
    let properties = &delivery.properties;
    assert_eq!(
        properties.message_id().as_ref().unwrap().as_str(),
        envelope.id.to_string()
    );
    assert_eq!(
        properties.kind().as_ref().unwrap().as_str(),
        "counter.ticked"
    );
    assert_eq!(*properties.delivery_mode(), Some(2), "persistent");
    assert_eq!(
        properties.content_type().as_ref().unwrap().as_str(),
        "application/json"
    );
    assert_eq!(delivery.routing_key.as_str(), "counter.counter.ticked");
    let headers = properties.headers().as_ref().unwrap().inner();
    let text = |name: &str| match headers.get(name) {
        Some(AMQPValue::LongString(s)) => String::from_utf8(s.as_bytes().to_vec()).unwrap(),
        other => panic!("{name}: {other:?}"),
    };
    assert_eq!(text("cloudEvents:id"), envelope.id.to_string());
    assert_eq!(
        text("cloudEvents:subject"),
        "Zoë 100%",
        "not percent-encoded"
    );
    assert_eq!(text("cloudEvents:aggregateversion"), "3");
    assert_eq!(text("cloudEvents:specversion"), "1.0");
    delivery.ack(BasicAckOptions::default()).await.unwrap();
}

/// Sets the broker's `max_message_size` (bytes) at run time.
fn set_broker_max_message_size(bytes: u64) {
    let status = std::process::Command::new("rabbitmqctl")
        .args([
            "eval",
            &format!("application:set_env(rabbit, max_message_size, {bytes})."),
        ])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("rabbitmqctl (installed with rabbitmq-server)");
    assert!(status.success(), "rabbitmqctl eval failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_refusing_a_large_message_fails_only_that_message() {
    // Only this test sends messages over 3 MiB; the limit is restored after.
    set_broker_max_message_size(3 * 1024 * 1024);
    let transport = RabbitTransport::connect(RabbitConfig {
        url: amqp_url(),
        exchange: unique_name("refusal"),
        max_message_bytes: 64 * 1024 * 1024,
        ..RabbitConfig::default()
    })
    .await
    .unwrap();
    let small = |id: &str| Envelope::for_event(&Ticked::new(id, 1), 1).unwrap();
    let large = Envelope::for_event(
        &Ticked {
            note: "x".repeat(4 * 1024 * 1024),
            ..Ticked::new("large", 1)
        },
        1,
    )
    .unwrap();
    let (before, after) = (small("before"), small("after"));
    let outcomes = transport.publish(&[&before, &large, &after]).await;
    set_broker_max_message_size(128 * 1024 * 1024);

    let refused = outcomes[1].as_ref().expect_err("the broker refuses it");
    assert!(!refused.retryable, "{refused}");
    assert!(
        refused.reason.contains("larger than configured max size"),
        "{refused}"
    );
    for (name, outcome) in [("before", &outcomes[0]), ("after", &outcomes[2])] {
        if let Err(failure) = outcome {
            assert!(failure.retryable, "{name}: {failure}");
        }
    }
    assert!(
        outcomes[2].is_err(),
        "the channel was closed before the message after it was confirmed"
    );
    // A new channel for the next batch.
    let again = transport.publish(&[&after]).await;
    assert!(again[0].is_ok(), "{:?}", again[0]);
}
