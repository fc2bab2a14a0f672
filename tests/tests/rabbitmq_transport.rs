//! What only RabbitMQ has: the message properties a plain AMQP reader sees
//! (message id, type, persistence, `content_type`, the service's `app_id`,
//! `cloudEvents_` headers without a duplicate content type); a message no
//! queue is bound for, which by default is not dropped: it comes back,
//! its event waits (retrying) and is published, in order, once a queue is
//! bound; and the broker's own refusal of a message over its
//! `max_message_size`, which closes the channel: only that message fails
//! for good, the others of its batch are retryable, and the next batch
//! goes out on a new channel.

use outbox_postgres::prelude::*;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties};
use outbox_core::Envelope;
use outbox_core::consumer::MessageSource;
use outbox_core::transport::Transport;
use outbox_rabbitmq::{RabbitConfig, RabbitSource, RabbitSourceConfig, RabbitTransport};
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
    assert_eq!(text("cloudEvents_id"), envelope.id.to_string());
    assert_eq!(
        text("cloudEvents_subject"),
        "Zoë 100%",
        "not percent-encoded"
    );
    assert_eq!(text("cloudEvents_aggregateversion"), "3");
    assert_eq!(text("cloudEvents_specversion"), "1.0");
    assert_eq!(text("cloudEvents_source"), config.source);
    assert!(
        !headers.keys().any(|name| name
            .as_str()
            .to_ascii_lowercase()
            .contains("datacontenttype")),
        "the content type travels once, as content_type: {headers:?}"
    );
    assert!(
        headers
            .keys()
            .all(|name| !name.as_str().starts_with("cloudEvents:")),
        "the binding's preferred prefix only: {headers:?}"
    );
    assert_eq!(
        properties.app_id().as_ref().unwrap().as_str(),
        config.source,
        "app_id names the service"
    );
    assert_ne!(config.source, "/outbox", "no shared default source");
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
    let exchange = unique_name("refusal");
    let transport = RabbitTransport::connect(RabbitConfig {
        url: amqp_url(),
        exchange: exchange.clone(),
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
    // A queue for the small messages: unrouted ones would come back.
    let (_connection, _channel, _queue) = queue_for(&exchange).await;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_no_queue_is_bound_for_waits_instead_of_being_dropped() {
    use outbox_core::relay::{Backoff, Relay, RelayConfig};
    use outbox_tests::{TestDb, wait};

    let db = TestDb::new().await;
    let config = RabbitConfig {
        url: amqp_url(),
        exchange: unique_name("unbound"),
        ..RabbitConfig::default()
    };
    assert!(config.mandatory, "mandatory by default");
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        RabbitTransport::connect(config.clone()).await.unwrap(),
        RelayConfig {
            poll_interval: Duration::from_millis(50),
            backoff: Backoff {
                initial: Duration::from_millis(100),
                max: Duration::from_millis(300),
                multiplier: 2.0,
                jitter: 0.0,
            },
            max_attempts: 1_000,
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    let events: Vec<Ticked> = (1..=3).map(|t| Ticked::new("unrouted", t)).collect();
    db.outbox.emit_all(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();
    // Nothing is bound to the exchange: the broker returns the message,
    // the event is not marked published and its aggregate waits.
    wait::until(
        "the head retried as unroutable",
        Duration::from_secs(20),
        || async {
            db.scalar::<i64>(
                "SELECT count(*) FROM {s}.outbox_events
                 WHERE aggregate_version = 1 AND status = 'pending' AND attempt_count >= 2
                   AND last_error LIKE '%unroutable%'",
            )
            .await
                == 1
        },
    )
    .await;
    assert_eq!(db.published().await, 0, "nothing dropped as published");

    // A queue is bound: the three go out, in order.
    let (_connection, channel, queue) = queue_for(&config.exchange).await;
    wait::until("all three published", Duration::from_secs(30), || async {
        db.published().await == 3
    })
    .await;
    relay.drain(Duration::from_secs(5)).await.unwrap();
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut versions = Vec::new();
    while versions.len() < 3 {
        let delivery = tokio::time::timeout(Duration::from_secs(10), consumer.next())
            .await
            .expect("the messages within 10 s")
            .unwrap()
            .unwrap();
        let headers = delivery.properties.headers().as_ref().unwrap().inner();
        if let Some(AMQPValue::LongString(v)) = headers.get("cloudEvents_aggregateversion") {
            versions.push(String::from_utf8(v.as_bytes().to_vec()).unwrap());
        }
        delivery.ack(BasicAckOptions::default()).await.unwrap();
    }
    assert_eq!(versions, vec!["1", "2", "3"]);
    db.drop_schema().await;
}

/// RabbitMQ routes a message only to the queues bound when it is
/// published: while one consumer's queue is bound, `mandatory` does not
/// send a message back, and a consumer whose queue is declared later never
/// sees it. `RabbitSource::declare` (at deploy time, before the relay)
/// binds a consumer's queue without consuming, so what is published
/// meanwhile waits in it for the consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_declared_before_publishing_keeps_what_is_published_until_its_consumer_starts() {
    let rabbit = RabbitConfig {
        url: amqp_url(),
        exchange: unique_name("declared"),
        ..RabbitConfig::default()
    };
    let source_config = |queue: String| RabbitSourceConfig {
        rabbit: rabbit.clone(),
        queue,
        bindings: vec!["counter.counter.ticked".into()],
        prefetch: 10,
        single_active_consumer: true,
    };
    let early = source_config(unique_name("declared-early"));
    let late = source_config(unique_name("declared-late"));
    RabbitSource::declare(&early).await.unwrap();
    RabbitSource::declare(&early)
        .await
        .expect("declaring again is safe");

    let transport = RabbitTransport::connect(rabbit.clone()).await.unwrap();
    for version in 1..=3_i64 {
        let envelope =
            Envelope::for_event(&Ticked::new("declared", version as u64), version).unwrap();
        assert!(transport.publish(&[&envelope]).await[0].is_ok());
    }
    // Confirmed before the late queue exists: RabbitMQ gave it nothing.
    RabbitSource::declare(&late).await.unwrap();
    let connection = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    let passive = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    let waiting = |queue: String| {
        let channel = channel.clone();
        async move {
            channel
                .queue_declare(queue.as_str().into(), passive, FieldTable::default())
                .await
                .unwrap()
                .message_count()
        }
    };
    assert_eq!(
        waiting(late.queue.clone()).await,
        0,
        "the late queue missed them"
    );
    assert_eq!(
        waiting(early.queue.clone()).await,
        3,
        "the declared queue kept them"
    );

    // The consumer starts later and receives all three, in order.
    let mut source = RabbitSource::connect(early.clone()).await.unwrap();
    let mut versions = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while versions.len() < 3 {
            for delivery in source.next_batch(10).await.unwrap() {
                use outbox_core::consumer::Delivery;
                versions.push(delivery.incoming().envelope().unwrap().aggregate_version);
                delivery.ack().await.unwrap();
            }
        }
    })
    .await
    .expect("the three events reach the consumer");
    assert_eq!(versions, vec![1, 2, 3]);
    drop(source);
    for queue in [&early.queue, &late.queue] {
        channel
            .queue_delete(queue.as_str().into(), Default::default())
            .await
            .unwrap();
    }
}
