//! Consumers fed by the real nats-server with JetStream: emit → relay →
//! JetStream → consumer end to end with the trace context carried to the
//! handler; article test 6 over the wire (an unreadable version and an
//! unknown type are quarantined, the stream moves on); a v1 payload in the
//! broker reaches a v3 handler through a JSON and a typed upcaster; a
//! failing handler is redelivered by JetStream with a delayed NAK and ends
//! in the dead letters.

use outbox_postgres::prelude::*;
use std::time::Duration;

use async_nats::HeaderMap;
use outbox_core::consumer::{ConsumerBuilder, ConsumerConfig, Received, RetryPolicy};
use outbox_core::metrics as m;
use outbox_core::relay::{Backoff, Relay, RelayConfig};
use outbox_core::trace::TraceParent;
use outbox_core::transport::Transport;
use outbox_core::{Envelope, ce};
use outbox_nats::{JetStreamSource, JetStreamSourceConfig, NatsConfig, NatsTransport, header_name};
use outbox_tests::consumers::{
    create_effects, effects, letters, record_effect, tick, tick_consumer,
};
use outbox_tests::events::{ParcelBooked, Ticked};
use outbox_tests::{NatsServer, TestDb, metrics, wait};
use serde_json::json;

fn nats_config(server: &NatsServer) -> NatsConfig {
    NatsConfig {
        url: server.url(),
        ack_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..NatsConfig::default()
    }
}

async fn setup() -> (NatsServer, TestDb, NatsTransport) {
    metrics::install();
    let server = NatsServer::start();
    let db = TestDb::new().await;
    create_effects(&db).await;
    // Creates the stream, as a relay does at start-up.
    let transport = NatsTransport::connect(nats_config(&server)).await.unwrap();
    (server, db, transport)
}

/// Publishes raw messages (attributes with the `ce-` prefix added) the way
/// a producer of any language could.
async fn publish_raw(
    server: &NatsServer,
    subject: &str,
    attributes: &[(&str, String)],
    payload: &str,
) {
    let client = async_nats::connect(server.url()).await.unwrap();
    let context = async_nats::jetstream::new(client);
    let mut headers = HeaderMap::new();
    for (name, value) in attributes {
        headers.insert(header_name(name).as_str(), value.as_str());
    }
    context
        .publish_with_headers(subject.to_owned(), headers, payload.to_owned().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

fn attributes(envelope: &Envelope) -> Vec<(&'static str, String)> {
    envelope.cloudevents_attributes("/legacy-producer")
}

#[tokio::test]
async fn emit_relay_jetstream_consumer_end_to_end_with_the_trace_context_in_the_handler() {
    let (server, db, transport) = setup().await;
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        transport,
        RelayConfig {
            poll_interval: Duration::from_millis(50),
            stats_interval: Duration::ZERO,
            ..RelayConfig::default()
        },
    )
    .await
    .unwrap();
    let name = "e2e";
    let consumer = tick_consumer(&db, name, ConsumerConfig::default(), Duration::ZERO, &[]);
    let source = JetStreamSource::connect(
        JetStreamSourceConfig::for_consumer(&consumer, nats_config(&server)).unwrap(),
    )
    .await
    .unwrap();
    let task = consumer.spawn(source);

    let command: TraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        .parse()
        .unwrap();
    for counter in 0..10 {
        let mut tx = db.pool.begin().await.unwrap();
        let events: Vec<Ticked> = (1..=5)
            .map(|tick| Ticked::new(format!("c{counter}"), tick))
            .collect();
        outbox_core::trace::scope(Some(command), db.outbox.emit_all(&mut tx, &events))
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    wait::until("50 events applied", Duration::from_secs(30), || async {
        effects(&db, name).await.len() == 50
    })
    .await;
    let seen = effects(&db, name).await;
    for effect in &seen {
        let traceparent: TraceParent = effect
            .traceparent
            .as_deref()
            .expect("trace context")
            .parse()
            .unwrap();
        assert_eq!(
            traceparent.trace_id_hex(),
            command.trace_id_hex(),
            "same trace from command to handler"
        );
    }
    for counter in 0..10 {
        let versions: Vec<i64> = seen
            .iter()
            .filter(|e| e.aggregate_id == format!("c{counter}"))
            .map(|e| e.aggregate_version)
            .collect();
        assert_eq!(versions, vec![1, 2, 3, 4, 5]);
    }
    // The outcome is counted after the commit the effects show: drain the
    // task first, so the last increment is in.
    task.drain(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        metrics::counter(
            m::CONSUMER_MESSAGES,
            &[("consumer", name), ("outcome", "applied")]
        ),
        50
    );
    relay.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}

#[tokio::test]
async fn article_6_over_jetstream_unreadable_versions_are_quarantined_and_the_stream_moves_on() {
    let (server, db, _transport) = setup().await;
    let name = "article6-nats";
    let consumer = tick_consumer(&db, name, ConsumerConfig::default(), Duration::ZERO, &[]);
    let mut config = JetStreamSourceConfig::for_consumer(&consumer, nats_config(&server)).unwrap();
    // The whole stream, so the unknown type reaches this consumer too.
    config.filter_subjects = vec!["events.>".into()];
    let task = consumer.spawn(JetStreamSource::connect(config).await.unwrap());

    let subject = "events.counter.counter.ticked";
    let first = tick("c1", 1);
    publish_raw(&server, subject, &attributes(&first), first.payload.get()).await;
    let mut too_new = attributes(&tick("c1", 2));
    too_new.retain(|(k, _)| *k != ce::SCHEMAVERSION);
    too_new.push((ce::SCHEMAVERSION, "7".into()));
    publish_raw(
        &server,
        subject,
        &too_new,
        r#"{"counter":"c1","tick":2,"note":"from the future"}"#,
    )
    .await;
    let mut unknown = attributes(&tick("c2", 1));
    unknown.retain(|(k, _)| *k != ce::TYPE);
    unknown.push((ce::TYPE, "counter.melted".into()));
    publish_raw(
        &server,
        "events.counter.counter.melted",
        &unknown,
        r#"{"counter":"c2"}"#,
    )
    .await;
    let next = tick("c3", 1);
    publish_raw(&server, subject, &attributes(&next), next.payload.get()).await;

    wait::until(
        "two applied, two quarantined",
        Duration::from_secs(20),
        || async { effects(&db, name).await.len() == 2 && letters(&db, name).await.len() == 2 },
    )
    .await;
    let letters = letters(&db, name).await;
    assert!(letters.iter().all(|l| l.kind == "quarantined"));
    assert!(
        letters[0]
            .reason
            .contains("schema version 7 is newer than the newest this binary knows (v1)"),
        "{}",
        letters[0].reason
    );
    assert!(
        letters[1]
            .reason
            .contains("unknown event type \"counter.melted\""),
        "{}",
        letters[1].reason
    );
    assert_eq!(letters[0].headers["schemaversion"], "7");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&letters[0].payload).unwrap()["note"],
        "from the future"
    );
    assert_eq!(
        metrics::counter(m::CONSUMER_QUARANTINED, &[("consumer", name)]),
        2
    );
    let applied: Vec<String> = effects(&db, name)
        .await
        .into_iter()
        .map(|e| e.aggregate_id)
        .collect();
    assert_eq!(
        applied,
        vec!["c1", "c3"],
        "the message after the bad ones was processed"
    );
    task.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}

#[tokio::test]
async fn a_v1_payload_in_the_broker_reaches_a_v3_handler_through_json_and_typed_upcasters() {
    let (server, db, _transport) = setup().await;
    let name = "parcels";
    let table = db.table("effects");
    let consumer = ConsumerBuilder::new(name)
        .on_fn::<ParcelBooked, _>(move |parcel: Received<ParcelBooked>, tx| {
            let table = table.clone();
            Box::pin(async move { record_effect(&table, &parcel, tx).await })
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let task = consumer.spawn(
        JetStreamSource::connect(
            JetStreamSourceConfig::for_consumer(&consumer, nats_config(&server)).unwrap(),
        )
        .await
        .unwrap(),
    );
    let subject = "events.parcel.parcel.booked";
    let payloads = [
        (1, json!({"parcel_id": "P1", "weight_grams": 2500})),
        (2, json!({"parcel_id": "P2", "weight_kg": 1.5})),
        (
            3,
            json!({"parcel_id": "P3", "weight_kg": 0.5, "carrier": "DHL"}),
        ),
    ];
    for (version, payload) in payloads {
        let envelope = Envelope {
            id: uuid::Uuid::now_v7(),
            event_type: "parcel.booked".into(),
            schema_version: version,
            aggregate_type: "parcel".into(),
            aggregate_id: payload["parcel_id"].as_str().unwrap().into(),
            aggregate_version: 1,
            occurred_at: chrono::Utc::now(),
            traceparent: None,
            payload: serde_json::value::to_raw_value(&payload).unwrap(),
        };
        publish_raw(
            &server,
            subject,
            &attributes(&envelope),
            envelope.payload.get(),
        )
        .await;
    }
    wait::until("three parcels applied", Duration::from_secs(20), || async {
        effects(&db, name).await.len() == 3
    })
    .await;
    let values: Vec<serde_json::Value> = effects(&db, name)
        .await
        .into_iter()
        .map(|e| e.value)
        .collect();
    assert_eq!(
        values,
        vec![
            json!({"parcel_id": "P1", "weight_kg": 2.5, "carrier": "unassigned"}),
            json!({"parcel_id": "P2", "weight_kg": 1.5, "carrier": "unassigned"}),
            json!({"parcel_id": "P3", "weight_kg": 0.5, "carrier": "DHL"}),
        ]
    );
    task.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}

#[tokio::test]
async fn jetstream_redelivers_a_failing_message_with_backoff_until_the_dead_letters() {
    let (server, db, transport) = setup().await;
    let name = "nats-poison";
    let consumer = tick_consumer(
        &db,
        name,
        ConsumerConfig {
            retry: RetryPolicy {
                max_attempts: 3,
                backoff: Backoff {
                    initial: Duration::from_millis(100),
                    max: Duration::from_millis(400),
                    multiplier: 2.0,
                    jitter: 0.0,
                },
                handler_timeout: Duration::from_secs(5),
            },
            ..ConsumerConfig::default()
        },
        Duration::ZERO,
        &["bad"],
    );
    let config = JetStreamSourceConfig::for_consumer(&consumer, nats_config(&server)).unwrap();
    assert_eq!(
        config.max_deliver, -1,
        "the consumer bounds attempts; JetStream must not strand messages"
    );
    let task = consumer.spawn(JetStreamSource::connect(config).await.unwrap());
    let bad = tick("bad", 1);
    let good: Vec<Envelope> = (0..10).map(|i| tick(&format!("g{i}"), 1)).collect();
    let mut batch = vec![&bad];
    batch.extend(good.iter());
    assert!(transport.publish(&batch).await.iter().all(Result::is_ok));
    wait::until(
        "10 applied and the bad one dead-lettered",
        Duration::from_secs(20),
        || async { effects(&db, name).await.len() == 10 && letters(&db, name).await.len() == 1 },
    )
    .await;
    let letter = &letters(&db, name).await[0];
    assert_eq!(
        letter.attempts, 3,
        "JetStream's delivery count is the attempt"
    );
    assert_eq!(letter.event_id, Some(bad.id));
    assert_eq!(
        metrics::counter(
            m::CONSUMER_MESSAGES,
            &[("consumer", name), ("outcome", "retry")]
        ),
        2
    );
    task.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}
