//! NATS JetStream at its edges: aggregate ids that are not subject tokens
//! or header values (dots, wildcards, spaces, percent signs, non-ASCII,
//! line breaks, 1 KiB) travel in subjects and `ce-` headers and come back
//! unchanged; headers written by other CloudEvents producers (other case,
//! quoted values) are read; other services' events in a shared stream are
//! neither stored nor quarantined; a relay and a consumer started while
//! the broker is down wait for it and then deliver everything in order.
//! Real PostgreSQL, private nats-server processes.

use outbox_postgres::prelude::*;
use std::time::Duration;

use async_nats::HeaderMap;
use outbox_core::consumer::{ConsumerBuilder, ConsumerConfig, Outcome};
use outbox_core::encoding::{decode_token, encode_header_value};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::transport::Transport;
use outbox_core::{Envelope, metrics as m};
use outbox_nats::{
    JetStreamSource, JetStreamSourceConfig, NatsConfig, NatsTransport, durable_for_filter,
};
use outbox_tests::consumers::{create_effects, effect_handler, effects, letters, tick};
use outbox_tests::events::{ParcelBooked, PieceMoved, Ticked};
use outbox_tests::{NatsServer, TestDb, jetstream, metrics, wait};

fn nats_config(server: &NatsServer) -> NatsConfig {
    NatsConfig {
        url: server.url(),
        ack_timeout: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(2),
        ..NatsConfig::default()
    }
}

fn relay_config() -> RelayConfig {
    RelayConfig {
        poll_interval: Duration::from_millis(50),
        stats_interval: Duration::ZERO,
        error_backoff: Duration::from_millis(100),
        ..RelayConfig::default()
    }
}

async fn published(db: &TestDb) -> i64 {
    db.published().await
}

/// The ids the hardening issue names, and a few more.
fn awkward_ids() -> Vec<String> {
    let mut ids: Vec<String> = [
        "a.b",
        "a b",
        "a%20b",
        "Zoë 100%",
        "*",
        ">",
        "line\nbreak",
        "tab\tand \"quotes\"",
        "emoji 😀.>",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    ids.push("x".repeat(1024));
    ids.push(format!("{}é", "ü".repeat(300)));
    ids
}

#[tokio::test]
async fn awkward_aggregate_ids_travel_in_subjects_and_headers_and_come_back_unchanged() {
    metrics::install();
    let server = NatsServer::start();
    let db = TestDb::new().await;
    create_effects(&db).await;
    let nats = NatsConfig {
        subject_template: "events.{aggregate_type}.{aggregate_id}.{event_type}".into(),
        ..nats_config(&server)
    };
    let ids = awkward_ids();
    for id in &ids {
        let mut tx = db.pool.begin().await.unwrap();
        db.outbox
            .emit_all(
                &mut tx,
                &[Ticked::new(id.clone(), 1), Ticked::new(id.clone(), 2)],
            )
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let transport = NatsTransport::connect(nats.clone()).await.unwrap();
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        transport,
        relay_config(),
    )
    .await
    .unwrap();
    let name = "awkward";
    let consumer = ConsumerBuilder::new(name)
        .on_fn::<Ticked, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let config = JetStreamSourceConfig::for_consumer(&consumer, nats.clone()).unwrap();
    assert_eq!(
        config.filter_subjects,
        vec!["events.counter.*.counter.ticked".to_owned()]
    );
    let task = consumer.spawn(JetStreamSource::connect(config).await.unwrap());
    let total = ids.len() * 2;
    wait::until("every event applied", Duration::from_secs(30), || async {
        effects(&db, name).await.len() == total
    })
    .await;
    task.drain(Duration::from_secs(5)).await.unwrap();
    relay.drain(Duration::from_secs(5)).await.unwrap();

    let applied = effects(&db, name).await;
    for id in &ids {
        let versions: Vec<i64> = applied
            .iter()
            .filter(|e| &e.aggregate_id == id)
            .map(|e| e.aggregate_version)
            .collect();
        assert_eq!(versions, vec![1, 2], "{id:?} arrived unchanged, in order");
    }
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events WHERE status <> 'published'")
            .await,
        0
    );
    assert!(letters(&db, name).await.is_empty(), "nothing quarantined");

    // On the wire: one subject token per id, headers per the binding.
    let stored = jetstream::read_all(&server.url(), "OUTBOX").await;
    assert_eq!(stored.len(), total);
    for message in &stored {
        let tokens: Vec<&str> = message.subject.split('.').collect();
        assert_eq!(tokens.len(), 5, "{}", message.subject);
        let id = decode_token(tokens[2]).unwrap();
        assert!(ids.contains(&id), "{id:?}");
        let header = message.header("ce-aggregateid").unwrap();
        assert_eq!(header, encode_header_value(&id));
        assert!(
            header
                .bytes()
                .all(|b| (0x21..=0x7e).contains(&b) && b != b'"'),
            "{header:?}"
        );
    }
    let encoded: Vec<&str> = stored
        .iter()
        .filter_map(|m| m.header("ce-subject"))
        .collect();
    assert!(encoded.contains(&"a%20b"), "a space is %20");
    assert!(encoded.contains(&"a%2520b"), "a percent sign is %25");
    assert!(encoded.contains(&"Zo%C3%AB%20100%25"));
    db.drop_schema().await;
}

#[tokio::test]
async fn an_id_too_long_for_a_subject_fails_with_a_clear_reason_and_blocks_only_itself() {
    let server = NatsServer::start();
    let db = TestDb::new().await;
    let nats = NatsConfig {
        subject_template: "events.{aggregate_type}.{aggregate_id}.{event_type}".into(),
        ..nats_config(&server)
    };
    let transport = NatsTransport::connect(nats).await.unwrap();
    let long = Envelope::for_event(&Ticked::new("é".repeat(1500), 1), 1).unwrap();
    let fine = tick("c1", 1);
    let results = transport.publish(&[&long, &fine]).await;
    let failure = results[0].clone().unwrap_err();
    assert!(!failure.retryable, "no retry shortens an id");
    assert!(
        failure.reason.contains("bytes long") && failure.reason.contains("{aggregate_id}"),
        "{failure}"
    );
    assert!(results[1].is_ok());
    db.drop_schema().await;
}

/// Publishes a message the way another CloudEvents producer might.
async fn publish_raw(server: &NatsServer, subject: &str, headers: &[(&str, &str)], payload: &str) {
    let client = async_nats::connect(server.url()).await.unwrap();
    let context = async_nats::jetstream::new(client);
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.insert(*name, *value);
    }
    context
        .publish_with_headers(subject.to_owned(), map, payload.to_owned().into())
        .await
        .unwrap()
        .await
        .unwrap();
}

#[tokio::test]
async fn headers_of_other_producers_are_read_whatever_their_case_or_quoting() {
    let server = NatsServer::start();
    let db = TestDb::new().await;
    create_effects(&db).await;
    // Creates the stream.
    NatsTransport::connect(nats_config(&server)).await.unwrap();
    let name = "other-producers";
    let consumer = ConsumerBuilder::new(name)
        .on_fn::<Ticked, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let task = consumer.spawn(
        JetStreamSource::connect(
            JetStreamSourceConfig::for_consumer(&consumer, nats_config(&server)).unwrap(),
        )
        .await
        .unwrap(),
    );
    let envelope = tick("ignored", 1);
    let id = envelope.id.to_string();
    let time = "2026-12-03T10:00:00Z";
    publish_raw(
        &server,
        "events.counter.counter.ticked",
        &[
            ("CE-SpecVersion", "1.0"),
            ("Ce-Id", &id),
            ("CE-TYPE", "counter.ticked"),
            ("ce-Source", "/python-producer"),
            ("ce-time", time),
            ("ce-schemaversion", "1"),
            ("ce-aggregatetype", "counter"),
            // A quoted value, as older producers wrote it (with a space
            // the quotes allow), percent-encoded inside.
            ("ce-aggregateid", "\"Zo%c3%ab 100%25\""),
            ("CE-AggregateVersion", "1"),
        ],
        r#"{"counter":"Zoë 100%","tick":1,"note":"from python"}"#,
    )
    .await;
    // A value that is not valid percent-encoding: quarantined, named.
    let bad = tick("bad", 1);
    let bad_id = bad.id.to_string();
    publish_raw(
        &server,
        "events.counter.counter.ticked",
        &[
            ("ce-specversion", "1.0"),
            ("ce-id", &bad_id),
            ("ce-type", "counter.ticked"),
            ("ce-source", "/broken"),
            ("ce-time", time),
            ("ce-schemaversion", "1"),
            ("ce-aggregatetype", "counter"),
            ("ce-aggregateid", "bad%zz"),
            ("ce-aggregateversion", "1"),
        ],
        r#"{"counter":"bad","tick":1,"note":""}"#,
    )
    .await;
    wait::until(
        "one applied, one quarantined",
        Duration::from_secs(20),
        || async { effects(&db, name).await.len() == 1 && letters(&db, name).await.len() == 1 },
    )
    .await;
    task.drain(Duration::from_secs(5)).await.unwrap();
    assert_eq!(effects(&db, name).await[0].aggregate_id, "Zoë 100%");
    let letter = &letters(&db, name).await[0];
    assert!(
        letter.reason.contains("ce-aggregateid") && letter.reason.contains("hex digits"),
        "{}",
        letter.reason
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn foreign_events_in_a_shared_stream_are_acknowledged_and_nothing_is_stored() {
    metrics::install();
    let server = NatsServer::start();
    let db = TestDb::new().await;
    create_effects(&db).await;
    // Two services publish to one stream: this one's counters, another
    // team's parcels and pieces (contracts this binary happens to know)
    // and an event type nobody here knows.
    let transport = NatsTransport::connect(nats_config(&server)).await.unwrap();
    let mut envelopes = vec![tick("c1", 1), tick("c1", 2)];
    envelopes.push(
        Envelope::for_event(
            &ParcelBooked {
                parcel_id: "p1".into(),
                weight_kg: 1.0,
                carrier: "DHL".into(),
            },
            1,
        )
        .unwrap(),
    );
    envelopes.push(Envelope::for_event(&PieceMoved::new("rook", 1), 1).unwrap());
    let refs: Vec<&Envelope> = envelopes.iter().collect();
    assert!(transport.publish(&refs).await.iter().all(Result::is_ok));
    publish_raw(
        &server,
        "events.invoice.invoice.sent",
        &[
            ("ce-specversion", "1.0"),
            ("ce-id", &uuid::Uuid::now_v7().to_string()),
            ("ce-type", "invoice.sent"),
            ("ce-source", "/billing"),
            ("ce-time", "2026-12-03T10:00:00Z"),
            ("ce-schemaversion", "4"),
            ("ce-aggregatetype", "invoice"),
            ("ce-aggregateid", "i-1"),
            ("ce-aggregateversion", "1"),
        ],
        r#"{"customer_email":"someone@example.org"}"#,
    )
    .await;

    let name = "shared-stream";
    let consumer = ConsumerBuilder::new(name)
        .on_fn::<Ticked, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    // Widened to the whole stream on purpose: every foreign event arrives.
    let mut config = JetStreamSourceConfig::for_consumer(&consumer, nats_config(&server)).unwrap();
    config.filter_subjects = vec!["events.>".into()];
    let task = consumer.spawn(JetStreamSource::connect(config).await.unwrap());
    wait::until(
        "two applied, three foreign",
        Duration::from_secs(20),
        || async {
            effects(&db, name).await.len() == 2
                && metrics::counter(
                    m::CONSUMER_MESSAGES,
                    &[("consumer", name), ("outcome", "foreign")],
                ) == 3
        },
    )
    .await;
    task.drain(Duration::from_secs(5)).await.unwrap();
    assert!(letters(&db, name).await.is_empty(), "nothing quarantined");
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_processed_events")
            .await,
        2,
        "inbox rows for this service's events only"
    );
    assert_eq!(
        consumer.handle_envelope(&envelopes[2]).await.unwrap(),
        Outcome::Foreign
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn a_consumer_of_two_aggregate_types_subscribes_to_them_only() {
    metrics::install();
    let server = NatsServer::start();
    let db = TestDb::new().await;
    create_effects(&db).await;
    let transport = NatsTransport::connect(nats_config(&server)).await.unwrap();
    let name = "two-aggregates";
    let consumer = ConsumerBuilder::new(name)
        .on_fn::<Ticked, _>(effect_handler(db.table("effects")))
        .on_fn::<ParcelBooked, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let config = JetStreamSourceConfig::for_consumer(&consumer, nats_config(&server)).unwrap();
    assert_eq!(
        config.filter_subjects,
        vec![
            "events.counter.counter.ticked".to_owned(),
            "events.parcel.parcel.booked".to_owned()
        ],
        "one filter per aggregate type, not the whole stream"
    );
    let source = JetStreamSource::connect(config).await.unwrap();
    let task = consumer.spawn(source);
    let mut envelopes = Vec::new();
    for version in 1..=3 {
        envelopes.push(tick("c1", version));
        envelopes.push(Envelope::for_event(&PieceMoved::new("rook", version), version).unwrap());
        envelopes.push(
            Envelope::for_event(
                &ParcelBooked {
                    parcel_id: "p1".into(),
                    weight_kg: version as f64,
                    carrier: "UPS".into(),
                },
                version,
            )
            .unwrap(),
        );
    }
    let refs: Vec<&Envelope> = envelopes.iter().collect();
    assert!(transport.publish(&refs).await.iter().all(Result::is_ok));
    wait::until("six applied", Duration::from_secs(20), || async {
        effects(&db, name).await.len() == 6
    })
    .await;
    // Give stray deliveries a moment, then check none came.
    tokio::time::sleep(Duration::from_millis(300)).await;
    task.drain(Duration::from_secs(5)).await.unwrap();
    assert_eq!(
        metrics::counter(
            m::CONSUMER_MESSAGES,
            &[("consumer", name), ("outcome", "foreign")]
        ),
        0,
        "the pieces never reached this consumer"
    );
    // nats-server 2.9 takes one filter per consumer: one durable each.
    let client = async_nats::connect(server.url()).await.unwrap();
    let stream = async_nats::jetstream::new(client)
        .get_stream("OUTBOX")
        .await
        .unwrap();
    for filter in [
        "events.counter.counter.ticked",
        "events.parcel.parcel.booked",
    ] {
        let durable = durable_for_filter(name, filter);
        assert!(
            stream
                .get_consumer::<async_nats::jetstream::consumer::pull::Config>(&durable)
                .await
                .is_ok(),
            "durable {durable} for {filter}"
        );
    }
    db.drop_schema().await;
}

#[tokio::test]
async fn a_relay_and_a_consumer_started_while_the_broker_is_down_deliver_in_order_once_it_is_up() {
    metrics::install();
    let mut server = NatsServer::start();
    server.stop();
    let db = TestDb::new().await;
    create_effects(&db).await;
    for counter in 0..5 {
        let mut tx = db.pool.begin().await.unwrap();
        let ticks: Vec<Ticked> = (1..=4)
            .map(|t| Ticked::new(format!("c{counter}"), t))
            .collect();
        db.outbox.emit_all(&mut tx, &ticks).await.unwrap();
        tx.commit().await.unwrap();
    }
    let config = NatsConfig {
        connect_timeout: Duration::from_millis(300),
        ..nats_config(&server)
    };
    let transport = NatsTransport::connect(config.clone())
        .await
        .expect("the relay's transport starts while the broker is down");
    assert!(!transport.health().await.is_up());
    let label = db.schema.as_str().to_owned();
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        transport,
        relay_config(),
    )
    .await
    .unwrap();
    let name = "boots-early";
    let consumer = ConsumerBuilder::new(name)
        .on_fn::<Ticked, _>(effect_handler(db.table("effects")))
        .config(ConsumerConfig {
            error_backoff: Duration::from_millis(100),
            ..ConsumerConfig::default()
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let source = JetStreamSource::connect(
        JetStreamSourceConfig::for_consumer(&consumer, config.clone()).unwrap(),
    )
    .await
    .expect("the source starts while the broker is down");
    let task = consumer.spawn(source);

    wait::until(
        "the relay reports the transport down",
        Duration::from_secs(10),
        || async { !relay.health().is_up() },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let health = relay.health();
    assert!(health.down_since.is_some(), "{health:?}");
    assert_eq!(
        metrics::gauge(
            m::TRANSPORT_UP,
            &[("schema", &label), ("transport", "nats")]
        ),
        Some(0.0)
    );
    assert_eq!(published(&db).await, 0);
    assert_eq!(
        db.scalar::<i64>("SELECT coalesce(sum(attempt_count), 0) FROM {s}.outbox_events")
            .await,
        0,
        "no attempt was used while the broker was down"
    );

    server.resume();
    wait::until("every event applied", Duration::from_secs(60), || async {
        effects(&db, name).await.len() == 20
    })
    .await;
    assert!(relay.health().is_up());
    assert_eq!(
        metrics::gauge(
            m::TRANSPORT_UP,
            &[("schema", &label), ("transport", "nats")]
        ),
        Some(1.0)
    );
    let applied = effects(&db, name).await;
    for counter in 0..5 {
        let versions: Vec<i64> = applied
            .iter()
            .filter(|e| e.aggregate_id == format!("c{counter}"))
            .map(|e| e.aggregate_version)
            .collect();
        assert_eq!(versions, vec![1, 2, 3, 4], "order of c{counter}");
    }
    task.drain(Duration::from_secs(5)).await.unwrap();
    relay.drain(Duration::from_secs(5)).await.unwrap();
    assert_eq!(jetstream::count(&server.url(), "OUTBOX").await, 20);
    db.drop_schema().await;
}
