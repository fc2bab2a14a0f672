//! The console in a real browser (headless Chromium through chromedriver):
//! an incident of the fault rig's kinds is found, inspected and repaired
//! through the pages as an operator clicks them: a failed head blocking its
//! aggregate is retried with a reason and the aggregate drains in order, a
//! dead-letter group is discarded, a quarantined message is inspected and
//! its replay requested, and once the consumer that reads its version runs
//! the request, the page shows the letter closed and the event applied
//! once. The suite takes the screenshots in
//! docs/console.md, and checks the page source never holds the redacted
//! card number and shows times in the browser's zone.

use outbox_postgres::prelude::*;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::time::Duration;

use fantoccini::{Client, Locator};
use outbox_console::{Console, Identify};
use outbox_core::consumer::{ConsumerBuilder, ConsumerConfig, Ordering, Outcome, RetryPolicy};
use outbox_core::ops::{LetterFilter, LetterKind};
use outbox_core::relay::{Backoff, Relay, RelayConfig};
use outbox_core::transport::PublishFailure;
use outbox_core::{ContractRegistry, Envelope, OutboxEvent};
use outbox_postgres::Ops;
use outbox_postgres::PgRelayStore;
use outbox_tests::browser::{Browser, PAGE_TIMEOUT, VIEWER_ZONE};
use outbox_tests::console::serve;
use outbox_tests::consumers::{create_effects, effect_handler, tick, tick_consumer};
use outbox_tests::events::{CardCharged, ParcelBooked, ParcelBookedV2};
use outbox_tests::transports::RecordingTransport;
use outbox_tests::{TestDb, wait};

const SECRET: u64 = 4_111_999_988_887_777;

/// Where the screenshots go: docs/console/ of the repository.
fn screenshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/console")
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("a screenshot");
    std::fs::create_dir_all(screenshot_dir()).unwrap();
    std::fs::write(screenshot_dir().join(format!("{name}.png")), png).unwrap();
}

/// Waits until the page shows `css`, returning its text.
async fn shown(client: &Client, css: &str) -> String {
    match client
        .wait()
        .at_most(PAGE_TIMEOUT)
        .for_element(Locator::Css(css))
        .await
    {
        Ok(element) => element.text().await.unwrap(),
        Err(error) => {
            let source = client.source().await.unwrap_or_default();
            panic!("the page shows no {css} ({error}):\n{source}")
        }
    }
}

/// Waits until the browser is at a URL holding `part` (a form was sent).
async fn submitted(client: &Client, part: &str) {
    let deadline = std::time::Instant::now() + PAGE_TIMEOUT;
    loop {
        let url = client.current_url().await.unwrap();
        if url.as_str().contains(part) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the browser stayed at {url}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn click(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css} to click: {e}"))
        .click()
        .await
        .unwrap();
}

/// Types the reason and confirms the previewed action; returns the
/// outcome page's audit line.
async fn confirm(client: &Client, reason: &str) -> String {
    client
        .find(Locator::Css("textarea#reason"))
        .await
        .unwrap()
        .send_keys(reason)
        .await
        .unwrap();
    click(client, "button#confirm").await;
    shown(client, "#audit-row").await
}

async fn no_secret(client: &Client, page: &str) {
    let source = client.source().await.unwrap();
    assert!(
        !source.contains(&SECRET.to_string()),
        "{page} holds the redacted card number in its source"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_inspects_and_repairs_an_incident_in_the_browser() {
    let db = TestDb::new().await;
    create_effects(&db).await;

    // A broker that refuses ch-1's first version until it is fixed.
    let refusing = Arc::new(AtomicBool::new(true));
    let transport = RecordingTransport::failing({
        let refusing = Arc::clone(&refusing);
        move |e: &Envelope| {
            (refusing.load(AtomicOrdering::SeqCst) && e.aggregate_version == 1)
                .then(|| PublishFailure::permanent("message too large for the broker (1.2 MiB)"))
        }
    });
    let charge = |cents| CardCharged {
        charge_id: "ch-1".into(),
        card_number: SECRET,
        amount_cents: cents,
    };
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox
        .emit_all(&mut tx, &[charge(100), charge(200), charge(300)])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(50),
            multiplier: 2.0,
            jitter: 0.0,
        },
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    };
    let store = PgRelayStore::new(
        db.pool.clone(),
        db.schema.clone(),
        config.failed_head_policy,
        config.claim_timeout,
    );
    let relay = Relay::start(store, transport.clone(), config, "browser")
        .await
        .unwrap();
    wait::until("ch-1's head failed", Duration::from_secs(20), || async {
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events WHERE status = 'failed'")
            .await
            == 1
    })
    .await;

    // Dead letters of one failure, and a message from a newer producer.
    let billing = tick_consumer(
        &db,
        "billing",
        ConsumerConfig {
            retry: RetryPolicy {
                max_attempts: 1,
                ..RetryPolicy::default()
            },
            ..ConsumerConfig::default()
        },
        Duration::ZERO,
        &["c1", "c2"],
    );
    for counter in ["c1", "c2"] {
        assert!(matches!(
            billing.handle_envelope(&tick(counter, 1)).await.unwrap(),
            Outcome::DeadLettered { .. }
        ));
    }
    let parcels = ConsumerBuilder::new("parcels")
        .config(ConsumerConfig {
            ordering: Ordering::RejectStale,
            ..ConsumerConfig::default()
        })
        .registry(ContractRegistry::from_contracts([ParcelBookedV2::contract()]).unwrap())
        .on_fn::<ParcelBookedV2, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let v3 = Envelope::for_event(
        &ParcelBooked {
            parcel_id: "p1".into(),
            weight_kg: 2.5,
            carrier: "DHL".into(),
        },
        1,
    )
    .unwrap();
    assert!(matches!(
        parcels.handle_envelope(&v3).await.unwrap(),
        Outcome::Quarantined { .. }
    ));

    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let address = serve(Console::new(ops.clone(), Identify::fixed("ada")).router()).await;
    let base = format!("http://{address}");
    let browser = Browser::start().await;
    let client = &browser.client;

    // ---- Found: the status page names the problems.
    client.goto(&format!("{base}/")).await.unwrap();
    let problems = shown(client, "#problems").await;
    assert!(problems.contains("failed"), "{problems}");
    assert!(problems.contains("billing: 2 dead letter"), "{problems}");
    assert!(
        problems.contains("parcels: 1 message(s) in quarantine"),
        "{problems}"
    );
    shown(client, "#blocked").await;
    // Times are shown in the viewer's zone once the page's script ran.
    let shown_time = client
        .execute(
            "var t = document.querySelector('time[datetime]'); return t ? [t.dataset.zone, t.textContent, t.getAttribute('datetime')] : null;",
            vec![],
        )
        .await
        .unwrap();
    let zone = shown_time[0].as_str().unwrap_or_default();
    // ICU may name the zone by its older alias.
    assert!(
        zone == VIEWER_ZONE || zone == "Asia/Calcutta",
        "{shown_time:?}"
    );
    let text = shown_time[1].as_str().unwrap_or_default();
    assert!(
        text.contains("GMT+5:30") || text.contains("IST"),
        "the time is shown at +05:30: {shown_time:?}"
    );
    screenshot(client, "status").await;
    no_secret(client, "the status page").await;

    // ---- Filters read times in the viewer's zone (+05:30 here).
    let local = |at: chrono::DateTime<chrono::Utc>| {
        (at + chrono::Duration::minutes(330))
            .format("%Y-%m-%d %H:%M")
            .to_string()
    };
    for (since, listed) in [
        (
            local(chrono::Utc::now() - chrono::Duration::minutes(60)),
            true,
        ),
        (
            local(chrono::Utc::now() + chrono::Duration::minutes(60)),
            false,
        ),
    ] {
        client
            .goto(&format!("{base}/events?status=failed"))
            .await
            .unwrap();
        let zone = shown(client, "form.filters span.zone").await;
        assert!(
            zone.contains("Asia/"),
            "the label names the viewer's zone: {zone}"
        );
        let input = client
            .find(Locator::Css("input[name=since]"))
            .await
            .unwrap();
        input.send_keys(&since).await.unwrap();
        click(client, "form.filters button[type=submit]").await;
        submitted(client, "since=").await;
        let body = shown(client, "main").await;
        assert_eq!(
            body.contains("card / ch-1"),
            listed,
            "failed at or after {since} (viewer's time): {body}"
        );
        let shown_back = client
            .find(Locator::Css("input[name=since]"))
            .await
            .unwrap()
            .prop("value")
            .await
            .unwrap();
        assert_eq!(
            shown_back.as_deref(),
            Some(since.as_str()),
            "shown in the viewer's zone again"
        );
    }

    // A date alone is the start of that day in the viewer's zone, sent as
    // UTC (JavaScript alone would read it as UTC midnight).
    // (The day the head failed on, in the viewer's zone, so a run across
    // midnight does not move it.)
    let created: chrono::DateTime<chrono::Utc> = db
        .scalar("SELECT min(created_at) FROM {s}.outbox_events")
        .await;
    let today = (created + chrono::Duration::minutes(330)).date_naive();
    client
        .goto(&format!("{base}/events?status=failed"))
        .await
        .unwrap();
    client
        .find(Locator::Css("input[name=since]"))
        .await
        .unwrap()
        .send_keys(&today.to_string())
        .await
        .unwrap();
    click(client, "form.filters button[type=submit]").await;
    submitted(client, "since=").await;
    let url = client.current_url().await.unwrap();
    let sent = url
        .query_pairs()
        .find(|(name, _)| name == "since")
        .map(|(_, value)| value.into_owned());
    let local_midnight =
        today.and_hms_opt(0, 0, 0).unwrap().and_utc() - chrono::Duration::minutes(330);
    assert_eq!(
        sent.as_deref(),
        Some(
            local_midnight
                .format("%Y-%m-%dT%H:%M:%S%.3fZ")
                .to_string()
                .as_str()
        ),
        "{url}"
    );
    assert!(shown(client, "main").await.contains("card / ch-1"));
    screenshot(client, "events").await;

    // ---- Inspected: the blocked aggregate's head, payload redacted.
    click(client, "header nav a[href='/blocked']").await;
    let blocked = shown(client, "table#blocked tbody").await;
    assert!(blocked.contains("card / ch-1"), "{blocked}");
    screenshot(client, "blocked").await;
    click(client, "table#blocked tbody a").await;
    let error = shown(client, "#last-error").await;
    assert!(error.contains("message too large"), "{error}");
    let payload = shown(client, "pre.json").await;
    assert!(payload.contains("[REDACTED]"), "{payload}");
    assert!(payload.contains("\"amount_cents\": 100"), "{payload}");
    no_secret(client, "the event page").await;
    screenshot(client, "event").await;

    // ---- Repaired: the broker is fixed, the head retried with a reason.
    refusing.store(false, AtomicOrdering::SeqCst);
    client.goto(&format!("{base}/blocked")).await.unwrap();
    click(client, "table#blocked tbody input[name=id]").await;
    click(client, "button[value='retry-failed']").await;
    shown(client, "#dry-run").await;
    let title = shown(client, "main h1").await;
    assert_eq!(title, "Retry 1 failed event?");
    let would = shown(client, "td.would").await;
    assert!(would.contains("back to pending"), "{would}");
    screenshot(client, "preview").await;
    let done = confirm(client, "the broker takes 2 MiB messages since 10:40").await;
    assert!(done.contains("Retry 1 failed event"), "{done}");
    assert_eq!(shown(client, "td.outcome").await, "retried");
    wait::until("ch-1 drained", Duration::from_secs(20), || async {
        db.published().await == 3
    })
    .await;
    let versions: Vec<i64> = transport
        .published()
        .iter()
        .map(|e| e.aggregate_version)
        .collect();
    assert_eq!(versions, vec![1, 2, 3], "ch-1 drains in order");

    // ---- Dead letters: one failure, two letters, discarded as a group.
    client
        .goto(&format!("{base}/consumers/billing/dead_lettered"))
        .await
        .unwrap();
    assert_eq!(shown(client, "tr.group td.count").await, "2");
    screenshot(client, "dead-letters").await;
    click(client, "tr.group td a").await;
    shown(client, "table#letters").await;
    click(client, "input.select-all").await;
    click(client, "button[value='discard']").await;
    shown(client, "#dry-run").await;
    assert_eq!(shown(client, "main h1").await, "Discard 2 letters?");
    let done = confirm(client, "c1 and c2 were settled in the ledger by hand").await;
    assert!(done.contains("Discard 2 letters"), "{done}");
    let open = ops
        .letters(&LetterFilter {
            consumer: "billing".into(),
            kind: LetterKind::DeadLettered,
            ..LetterFilter::default()
        })
        .await
        .unwrap();
    assert!(open.items.is_empty(), "both letters closed");

    // ---- Quarantine: the letter in detail, its replay requested.
    client
        .goto(&format!("{base}/consumers/parcels/quarantined"))
        .await
        .unwrap();
    click(client, "tr.group td:last-child a").await;
    let reason = shown(client, "#reason").await;
    assert!(reason.contains("schema version 3"), "{reason}");
    screenshot(client, "letter").await;
    click(client, "button[value='replay']").await;
    shown(client, "#dry-run").await;
    confirm(client, "parcels v3 is deployed now").await;
    assert_eq!(shown(client, "td.outcome").await, "replay_requested");
    // The upgraded consumer (it reads v3 now) runs the requested replay at
    // its next sweep; the letter's page shows it closed, applied.
    let upgraded = ConsumerBuilder::new("parcels")
        .config(ConsumerConfig {
            ordering: Ordering::RejectStale,
            ..ConsumerConfig::default()
        })
        .registry(
            ContractRegistry::from_contracts([
                ParcelBookedV2::contract(),
                ParcelBooked::contract(),
            ])
            .unwrap(),
        )
        .on_fn::<ParcelBooked, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    assert_eq!(upgraded.run_requested_replays().await.unwrap(), 1);
    client
        .goto(&format!("{base}/consumers/parcels/quarantined?resolved=1"))
        .await
        .unwrap();
    click(client, "tr.group td:last-child a").await;
    let state = shown(client, "#state").await;
    assert!(state.contains("replayed: applied"), "{state}");
    let applied: i64 = db
        .scalar("SELECT count(*) FROM {s}.effects WHERE consumer = 'parcels'")
        .await;
    assert_eq!(applied, 1, "the quarantined parcel applied once");

    // ---- The audit log shows the three repairs in the operator's name.
    client.goto(&format!("{base}/audit")).await.unwrap();
    let audit = shown(client, "table.audit tbody").await;
    assert_eq!(audit.matches("ada").count(), 3, "{audit}");
    for action in ["relay.retry", "consumer.discard", "consumer.replay"] {
        assert!(audit.contains(action), "{audit}");
    }
    screenshot(client, "audit").await;

    browser.close().await;
    relay.drain(Duration::from_secs(5)).await.unwrap();
    db.drop_schema().await;
}
