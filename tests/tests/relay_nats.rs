//! The relay against the real nats-server with JetStream: events committed
//! while the broker is down arrive once it is back (article test 2), the
//! envelope arrives as CloudEvents headers, per-aggregate order holds with
//! three relays over 20,000 events, a message JetStream refuses retries and
//! then fails while others flow, and bad settings stop the start-up.
//!
//! Each test runs its own nats-server (see `outbox_tests::NatsServer`) so it
//! can stop and restart it without disturbing other tests.

use outbox_postgres::prelude::*;
use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream;
use outbox_core::relay::{Backoff, Relay, RelayConfig};
use outbox_core::transport::{Transport, TransportHealth};
use outbox_core::{EventDraft, OutboxEvent};
use outbox_nats::{NatsConfig, NatsError, NatsTransport};
use outbox_tests::events::{Ticked, emit_ticks};
use outbox_tests::jetstream::{StoredMessage, read_all};
use outbox_tests::{NatsServer, TestDb, wait};

fn relay_config() -> RelayConfig {
    RelayConfig {
        batch_size: 200,
        poll_interval: Duration::from_millis(50),
        backoff: Backoff {
            initial: Duration::from_millis(50),
            max: Duration::from_millis(500),
            multiplier: 2.0,
            jitter: 0.1,
        },
        max_attempts: 1000,
        publish_timeout: Duration::from_secs(5),
        claim_timeout: Duration::from_secs(30),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    }
}

fn nats_config(server: &NatsServer) -> NatsConfig {
    NatsConfig {
        url: server.url(),
        ack_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(2),
        ..NatsConfig::default()
    }
}

/// Per aggregate id, the versions in stream order.
fn versions_in_stream(messages: &[StoredMessage]) -> HashMap<String, Vec<i64>> {
    let mut by_aggregate: HashMap<String, Vec<i64>> = HashMap::new();
    for message in messages {
        let aggregate = message
            .header("ce-aggregateid")
            .expect("aggregate id header")
            .to_owned();
        let version: i64 = message
            .header("ce-aggregateversion")
            .unwrap()
            .parse()
            .unwrap();
        by_aggregate.entry(aggregate).or_default().push(version);
    }
    by_aggregate
}

#[tokio::test]
async fn article_test_2_events_committed_while_the_broker_is_down_arrive_after_it_returns() {
    let mut server = NatsServer::start();
    let db = TestDb::new().await;
    let transport = NatsTransport::connect(nats_config(&server)).await.unwrap();
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        transport,
        relay_config(),
    )
    .await
    .unwrap();

    server.stop();
    let total = emit_ticks(&db.pool, &db.outbox, 10, 5, 10).await;
    // The relay sees the broker down and claims nothing: the events stay
    // pending with their attempts untouched (at most one failed attempt,
    // by a batch that was already on its way when the broker went).
    wait::until(
        "the relay reports the broker down",
        Duration::from_secs(30),
        || async { !relay.health().is_up() },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(db.published().await, 0);
    assert_eq!(
        db.scalar::<i64>(
            "SELECT count(*) FROM {s}.outbox_events WHERE status <> 'pending' OR attempt_count > 1"
        )
        .await,
        0,
        "nothing failed, nothing used more than one attempt"
    );

    server.resume();
    wait::until(
        "every event published after the broker returned",
        Duration::from_secs(60),
        || async { db.published().await == total as i64 },
    )
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();

    let messages = read_all(&server.url(), "OUTBOX").await;
    let ids: std::collections::HashSet<&str> = messages
        .iter()
        .map(|m| m.header("ce-id").unwrap())
        .collect();
    assert_eq!(ids.len(), total, "every event arrived");
    assert_eq!(
        messages.len(),
        total,
        "JetStream dropped republished duplicates by Nats-Msg-Id"
    );
    for (aggregate, versions) in versions_in_stream(&messages) {
        assert_eq!(
            versions,
            (1..=5).collect::<Vec<_>>(),
            "order of {aggregate}"
        );
    }
    db.drop_schema().await;
}

#[tokio::test]
async fn the_envelope_arrives_as_cloudevents_headers_with_the_payload_as_body() {
    let server = NatsServer::start();
    let db = TestDb::new().await;
    let event = Ticked::new("c7", 1);
    let mut tx = db.pool.begin().await.unwrap();
    let traceparent: outbox_core::trace::TraceParent =
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
            .parse()
            .unwrap();
    let emitted = outbox_core::trace::scope(Some(traceparent), db.outbox.emit(&mut tx, &event))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let transport = NatsTransport::connect(NatsConfig {
        source: "/counter-service".into(),
        ..nats_config(&server)
    })
    .await
    .unwrap();
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        transport,
        relay_config(),
    )
    .await
    .unwrap();
    wait::until("published", Duration::from_secs(20), || async {
        db.published().await == 1
    })
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();

    let messages = read_all(&server.url(), "OUTBOX").await;
    assert_eq!(messages.len(), 1);
    let message = &messages[0];
    assert_eq!(message.subject, "events.counter.counter.ticked");
    let id = emitted.event_id.to_string();
    for (name, value) in [
        ("Nats-Msg-Id", id.as_str()),
        ("ce-id", id.as_str()),
        ("ce-specversion", "1.0"),
        ("ce-type", "counter.ticked"),
        ("ce-source", "/counter-service"),
        ("ce-subject", "c7"),
        ("ce-schemaversion", "1"),
        ("ce-aggregatetype", "counter"),
        ("ce-aggregateid", "c7"),
        ("ce-aggregateversion", "1"),
        ("ce-datacontenttype", "application/json"),
        ("ce-dataschema", "urn:outbox:schema:counter.ticked:v1"),
    ] {
        assert_eq!(message.header(name), Some(value), "header {name}");
    }
    let carried: outbox_core::trace::TraceParent =
        message.header("ce-traceparent").unwrap().parse().unwrap();
    assert_eq!(
        carried.trace_id, traceparent.trace_id,
        "the trace id travels with the event"
    );
    let decoded: Ticked = serde_json::from_slice(&message.payload).unwrap();
    assert_eq!(decoded, event);
    let envelope = outbox_core::Envelope::from_cloudevents(
        |name| message.header(&format!("ce-{name}")),
        &message.payload,
    )
    .unwrap();
    assert_eq!(envelope.id, emitted.event_id);
    assert_eq!(
        Ticked::decode(envelope.schema_version, &envelope.payload).unwrap(),
        event
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn three_relays_over_20000_events_on_500_aggregates_keep_version_order_at_the_broker() {
    let server = NatsServer::start();
    let db = TestDb::with_pool_size(24).await;
    let mut relays = Vec::new();
    for _ in 0..3 {
        let transport = NatsTransport::connect(nats_config(&server)).await.unwrap();
        let config = RelayConfig {
            batch_size: 150,
            workers: 2,
            ..relay_config()
        };
        relays.push(
            Relay::start_postgres(db.pool.clone(), db.schema.clone(), transport, config)
                .await
                .unwrap(),
        );
    }
    // Emit while the relays run, so claims interleave with commits.
    let total = emit_ticks(&db.pool, &db.outbox, 500, 40, 500).await;
    assert_eq!(total, 20_000);
    wait::until(
        "20,000 events published",
        Duration::from_secs(240),
        || async { db.published().await == total as i64 },
    )
    .await;
    for relay in relays {
        relay.drain(Duration::from_secs(10)).await.unwrap();
    }
    let messages = read_all(&server.url(), "OUTBOX").await;
    assert_eq!(messages.len(), total);
    let by_aggregate = versions_in_stream(&messages);
    assert_eq!(by_aggregate.len(), 500);
    for (aggregate, versions) in by_aggregate {
        assert_eq!(
            versions,
            (1..=40).collect::<Vec<_>>(),
            "order of {aggregate}"
        );
    }
    db.drop_schema().await;
}

#[tokio::test]
async fn a_message_jetstream_refuses_retries_then_fails_while_other_aggregates_flow() {
    let server = NatsServer::start();
    let db = TestDb::new().await;
    // A stream that refuses messages over 2 KiB: a real poison event.
    let context = jetstream::new(async_nats::connect(server.url()).await.unwrap());
    context
        .create_stream(jetstream::stream::Config {
            name: "OUTBOX".into(),
            subjects: vec!["events.>".into()],
            max_message_size: 2048,
            ..Default::default()
        })
        .await
        .unwrap();
    let mut big = Ticked::new("c1", 1);
    big.note = "x".repeat(10_000);
    let mut drafts = vec![EventDraft::new(&big).unwrap()];
    for counter in 0..5 {
        for tick in 1..=3 {
            if counter == 1 && tick == 1 {
                continue;
            }
            drafts.push(EventDraft::new(&Ticked::new(format!("c{counter}"), tick)).unwrap());
        }
    }
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox.emit_drafts(&mut tx, drafts).await.unwrap();
    tx.commit().await.unwrap();

    let transport = NatsTransport::connect(nats_config(&server)).await.unwrap();
    let config = RelayConfig {
        max_attempts: 3,
        ..relay_config()
    };
    let relay = Relay::start_postgres(db.pool.clone(), db.schema.clone(), transport, config)
        .await
        .unwrap();
    wait::until(
        "the poison event failed",
        Duration::from_secs(30),
        || async {
            db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events WHERE status = 'failed'")
                .await
                == 1
        },
    )
    .await;
    wait::until(
        "the other aggregates published",
        Duration::from_secs(30),
        || async { db.published().await == 12 },
    )
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    let (attempts, error): (i32, String) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT attempt_count, last_error FROM {} WHERE status = 'failed'",
        db.table("outbox_events")
    )))
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(attempts, 3);
    assert!(
        error.to_lowercase().contains("maximum") || error.to_lowercase().contains("size"),
        "{error}"
    );
    let c1_waiting: i64 = db
        .scalar("SELECT count(*) FROM {s}.outbox_events WHERE aggregate_id = 'c1' AND status = 'pending'")
        .await;
    assert_eq!(c1_waiting, 2, "later events of the poisoned aggregate wait");
    let messages = read_all(&server.url(), "OUTBOX").await;
    assert_eq!(messages.len(), 12);
    assert!(
        messages
            .iter()
            .all(|m| m.header("ce-aggregateid") != Some("c1"))
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn bad_transport_settings_fail_at_start_and_an_unreachable_broker_is_reported_down() {
    let server = NatsServer::start();
    let error = NatsTransport::connect(NatsConfig {
        subject_template: "events.{aggregate}".into(),
        ..nats_config(&server)
    })
    .await
    .err()
    .unwrap();
    assert!(matches!(error, NatsError::Config(_)), "{error}");
    assert!(
        error
            .to_string()
            .contains("unknown placeholder {aggregate}"),
        "{error}"
    );

    let closed_port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    // A broker that does not answer is not a start-up error (a service may
    // boot during an outage); the transport says it is down, and where.
    let transport = NatsTransport::connect(NatsConfig {
        url: format!("nats://127.0.0.1:{closed_port}"),
        connect_timeout: Duration::from_millis(200),
        ..nats_config(&server)
    })
    .await
    .unwrap();
    match transport.health().await {
        TransportHealth::Down { reason } => {
            assert!(reason.contains(&closed_port.to_string()), "{reason}")
        }
        TransportHealth::Up | TransportHealth::Degraded { .. } => {
            panic!("a broker that is not there is up")
        }
    }
    let error = NatsTransport::connect(NatsConfig {
        url: "not a url at all".into(),
        ..nats_config(&server)
    })
    .await
    .err()
    .unwrap();
    assert!(matches!(error, NatsError::Connect { .. }), "{error}");

    let error = NatsTransport::connect(NatsConfig {
        create_stream: false,
        stream: "MISSING".into(),
        ..nats_config(&server)
    })
    .await
    .err()
    .unwrap();
    assert!(error.to_string().contains("does not exist"), "{error}");
}
