//! What Prometheus scrapes from a service that installs
//! `metrics-exporter-prometheus` the way the example service does: a relay
//! and a consumer on real PostgreSQL, then `GET /metrics` over HTTP. The
//! series the dashboard and the alert rules read are there, with their
//! labels, help text and histogram buckets; counters an alert takes the
//! `increase()` of exist at zero before the first incident.
//!
//! Its own test binary: a process has one metrics recorder.

use std::time::Duration;

use outbox_core::consumer::{ConsumerConfig, RetryPolicy, channel};
use outbox_core::relay::{Backoff, Relay, RelayConfig};
use outbox_core::transport::PublishFailure;
use outbox_examples::metrics_endpoint;
use outbox_postgres::PgRelayStore;
use outbox_tests::consumers::{create_effects, tick, tick_consumer};
use outbox_tests::events::Ticked;
use outbox_tests::transports::RecordingTransport;
use outbox_tests::{TestDb, wait};

/// The value of the first series starting with `prefix`.
fn value(scraped: &str, prefix: &str) -> Option<f64> {
    scraped
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_the_relay_and_consumer_series() {
    let handle = metrics_endpoint::install_recorder().unwrap();
    let addr = metrics_endpoint::serve("127.0.0.1:0".parse().unwrap(), handle)
        .await
        .unwrap();

    // Before anything happened: a started consumer's incident counters exist at zero.
    let db = TestDb::new().await;
    create_effects(&db).await;
    let config = ConsumerConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        sweep_interval: Duration::from_millis(100),
        ..ConsumerConfig::default()
    };
    let consumer = tick_consumer(&db, "scraped", config, Duration::ZERO, &["broken"]);
    let (sender, source) = channel();
    let source_stats = source.stats();
    let task = consumer.clone().spawn(source);
    wait::until(
        "the consumer registered",
        Duration::from_secs(10),
        || async {
            let scraped = metrics_endpoint::scrape(addr).await.unwrap();
            value(
                &scraped,
                "outbox_consumer_quarantined_total{consumer=\"scraped\"}",
            ) == Some(0.0)
        },
    )
    .await;

    // The relay publishes ten events (one attempt fails and is retried) and
    // gives up on an eleventh.
    let mut tx = db.pool.begin().await.unwrap();
    for n in 0..10u64 {
        db.outbox
            .emit(&mut tx, &Ticked::new(format!("m{n}"), 1))
            .await
            .unwrap();
    }
    db.outbox
        .emit(&mut tx, &Ticked::new("stuck", 1))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let failed_once = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&failed_once);
    let transport = RecordingTransport::failing(move |e| {
        if e.aggregate_id == "stuck" {
            return Some(PublishFailure::permanent("too large"));
        }
        (e.aggregate_id == "m3" && !flag.swap(true, std::sync::atomic::Ordering::SeqCst))
            .then(|| PublishFailure::retryable("broker busy"))
    });
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        stats_interval: Duration::from_millis(100),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(50),
            multiplier: 2.0,
            jitter: 0.0,
        },
        ..RelayConfig::default()
    };
    let store = PgRelayStore::new(
        db.pool.clone(),
        db.schema.clone(),
        config.failed_head_policy,
        config.claim_timeout,
    );
    let relay = Relay::start(store, transport.clone(), config, "scraped")
        .await
        .unwrap();
    wait::until("ten published", Duration::from_secs(20), || async {
        transport.published_count() == 10
    })
    .await;

    // The consumer applies one, sees it again, and dead-letters a broken one.
    let c1 = tick("c1", 1);
    sender.send(&c1).unwrap();
    let stats = source_stats;
    wait::until("c1 applied", Duration::from_secs(10), || async {
        stats.acked() == 1
    })
    .await;
    sender.send(&c1).unwrap();
    sender.send(&tick("broken", 1)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let scraped = loop {
        let scraped = metrics_endpoint::scrape(addr).await.unwrap();
        let settled = value(
            &scraped,
            "outbox_consumer_dead_lettered_total{consumer=\"scraped\"}",
        ) == Some(1.0)
            && value(
                &scraped,
                "outbox_relay_published_total{schema=\"scraped\",transport=\"recording\"}",
            ) == Some(10.0)
            && scraped.contains(
                "outbox_event_type_failed_events{schema=\"scraped\",event_type=\"counter.ticked\"} 1",
            );
        if settled {
            break scraped;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the figures did not reach /metrics:\n{scraped}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    drop(sender);
    task.drain(Duration::from_secs(5)).await.unwrap();
    relay.drain(Duration::from_secs(5)).await.unwrap();

    let expect = |prefix: &str, expected: f64| {
        assert_eq!(
            value(&scraped, prefix),
            Some(expected),
            "{prefix} in\n{scraped}"
        );
    };
    expect(
        "outbox_relay_publish_failures_total{schema=\"scraped\",transport=\"recording\",kind=\"retryable\"}",
        1.0,
    );
    expect(
        "outbox_relay_publish_failures_total{schema=\"scraped\",transport=\"recording\",kind=\"permanent\"}",
        1.0,
    );
    expect("outbox_relay_failed_total{schema=\"scraped\"}", 1.0);
    expect("outbox_failed_events{schema=\"scraped\"}", 1.0);
    expect(
        "outbox_event_type_pending_events{schema=\"scraped\",event_type=\"counter.ticked\"}",
        0.0,
    );
    expect(
        "outbox_relay_transport_up{schema=\"scraped\",transport=\"recording\"}",
        1.0,
    );
    expect("outbox_pending_events{schema=\"scraped\"}", 0.0);
    // The failed head blocks its aggregate (FailedHeadPolicy::Block).
    expect("outbox_blocked_aggregates{schema=\"scraped\"}", 1.0);
    expect(
        "outbox_consumer_duplicates_total{consumer=\"scraped\"}",
        1.0,
    );
    expect(
        "outbox_consumer_messages_total{consumer=\"scraped\",outcome=\"applied\"}",
        1.0,
    );
    assert!(
        value(
            &scraped,
            "outbox_consumer_lag_seconds{consumer=\"scraped\"}"
        )
        .unwrap()
            >= 0.0
    );
    assert!(
        scraped.contains(
            "outbox_relay_batch_duration_seconds_bucket{schema=\"scraped\",le=\"0.005\"}"
        ),
        "batch durations are a histogram with buckets:\n{scraped}"
    );
    assert!(
        scraped
            .contains("outbox_consumer_handler_duration_seconds_bucket{consumer=\"scraped\",le=")
    );
    assert!(scraped.contains("# TYPE outbox_relay_batch_duration_seconds histogram"));
    assert!(scraped.contains(
        "# HELP outbox_oldest_pending_age_seconds Age of the oldest pending event in seconds."
    ));
    assert!(scraped.contains("# TYPE outbox_relay_published_total counter"));
    db.drop_schema().await;
}
