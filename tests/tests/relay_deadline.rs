//! A lone relay whose network to PostgreSQL goes silent (a blackhole: no
//! reset, no answer, through the test's TCP proxy) gives up on the
//! connection within its client-side deadline (the statement timeout plus
//! five seconds) and reports a store error while the silence lasts,
//! instead of waiting as long as it lasts; once the network heals it
//! opens a new session and publishes again, in order.

use std::time::Duration;

use outbox_core::metrics as m;
use outbox_core::relay::{Relay, RelayConfig};
use outbox_postgres::PgRelayStore;
use outbox_tests::events::emit_ticks;
use outbox_tests::proxy::TcpProxy;
use outbox_tests::transports::{RecordingTransport, versions_by_aggregate};
use outbox_tests::{TestDb, metrics, wait};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_relay_on_a_silent_network_reports_within_its_deadline_and_recovers() {
    metrics::install();
    let db = TestDb::new().await;
    let direct = db.pool.connect_options();
    let proxy = TcpProxy::start(&format!("{}:{}", direct.get_host(), direct.get_port())).await;
    let port: u16 = proxy
        .address()
        .rsplit_once(':')
        .and_then(|(_, port)| port.parse().ok())
        .expect("the proxy's port");
    let through_proxy = direct.as_ref().clone().host("127.0.0.1").port(port);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(3))
        .connect_with(through_proxy)
        .await
        .unwrap();
    let config = RelayConfig {
        statement_timeout: Duration::from_secs(1),
        claim_timeout: Duration::from_secs(3),
        publish_timeout: Duration::from_secs(2),
        poll_interval: Duration::from_millis(100),
        error_backoff: Duration::from_millis(200),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    };
    let label = "silent-network";
    let store = PgRelayStore::new(
        pool,
        db.schema.clone(),
        config.failed_head_policy,
        config.claim_timeout,
    )
    .with_statement_timeout(config.statement_timeout)
    .with_label(label);
    let transport = RecordingTransport::new();
    let relay = Relay::start(store, transport.clone(), config, label)
        .await
        .unwrap();
    emit_ticks(&db.pool, &db.outbox, 2, 5, 10).await;
    wait::until(
        "the first events published",
        Duration::from_secs(30),
        || async { db.published().await == 10 },
    )
    .await;

    let errors = || metrics::counter(m::STORE_ERRORS, &[("schema", label)]);
    let before = errors();
    proxy.blackhole();
    // The silence lasts until the relay has reported it: without a
    // client-side deadline it would wait for an answer that never comes.
    wait::until(
        "a store error while the network is silent",
        Duration::from_secs(30),
        || async { errors() > before },
    )
    .await;
    proxy.heal();

    emit_ticks(&db.pool, &db.outbox, 2, 5, 10).await;
    wait::until(
        "the events after the silence published",
        Duration::from_secs(90),
        || async { db.published().await == 20 },
    )
    .await;
    relay.drain(Duration::from_secs(10)).await.unwrap();
    for (aggregate, versions) in versions_by_aggregate(&transport.published()) {
        let mut sorted = versions.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(
            sorted,
            (1..=10).collect::<Vec<i64>>(),
            "{aggregate}: every version published"
        );
        assert!(
            versions.windows(2).all(|w| w[0] <= w[1]),
            "{aggregate}: in order ({versions:?})"
        );
    }
    db.drop_schema().await;
}
