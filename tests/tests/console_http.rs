//! The web console through its router, on a real PostgreSQL outbox: every
//! view renders the incident (a failed head blocking its aggregate, dead
//! letters of two failures, a quarantined message) with redacted payloads;
//! every action is a two-step POST that needs the operator's CSRF token,
//! shows first what it would touch, and writes an audit row in the
//! operator's name; read-only consoles, cross-site posts and requests
//! without an operator are refused; a SQLite outbox is served too.

use outbox_postgres::prelude::*;
use std::time::Duration;

use axum::Router;
use axum::http::StatusCode;
use outbox_console::{Console, Identify};
use outbox_core::ContractRegistry;
use outbox_core::Envelope;
use outbox_core::OutboxEvent;
use outbox_core::consumer::{
    ConsumerBuilder, ConsumerConfig, HandlerError, Ordering, Outcome, RetryPolicy,
};
use outbox_core::ops::{EventFilter, EventStatus, LetterFilter, LetterKind};
use outbox_core::relay::{Relay, RelayConfig};
use outbox_core::transport::PublishFailure;
use outbox_postgres::Ops;
use outbox_tests::console::{get, post, post_with};
use outbox_tests::consumers::{create_effects, effect_handler, tick, tick_consumer};
use outbox_tests::events::{CardCharged, ParcelBooked, ParcelBookedV2};
use outbox_tests::transports::RecordingTransport;
use outbox_tests::{TestDb, wait};
use uuid::Uuid;

/// The card number of every seeded charge: a `redact` field, never shown.
const SECRET: u64 = 4_111_999_988_887_777;

/// A failed head (v1 of card `ch-1`, v2 waiting behind it), a failed
/// event of card `ch-2`, and a published one of `ch-3`, as a relay whose
/// broker refuses the first versions of `ch-1` and `ch-2` leaves them.
/// Returns the two failed ids.
async fn seed_failed(db: &TestDb) -> (Uuid, Uuid) {
    seed_failed_publishing(db).await.0
}

/// As [`seed_failed`], with the envelopes the relay handed its transport
/// for the events it published.
async fn seed_failed_publishing(db: &TestDb) -> ((Uuid, Uuid), Vec<Envelope>) {
    let charge = |id: &str| CardCharged {
        charge_id: id.into(),
        card_number: SECRET,
        amount_cents: 1250,
    };
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox
        .emit_all(
            &mut tx,
            &[
                charge("ch-1"),
                charge("ch-1"),
                charge("ch-2"),
                charge("ch-3"),
            ],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let transport = RecordingTransport::failing(|e: &Envelope| {
        (e.aggregate_version == 1 && e.aggregate_id != "ch-3")
            .then(|| PublishFailure::permanent("message too large for the broker"))
    });
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    };
    let relay = Relay::start_postgres(
        db.pool.clone(),
        db.schema.clone(),
        transport.clone(),
        config,
    )
    .await
    .unwrap();
    wait::until(
        "both first versions failed, ch-3 published",
        Duration::from_secs(20),
        || async {
            db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events WHERE status = 'failed'")
                .await
                == 2
                && db.published().await == 1
        },
    )
    .await;
    relay.drain(Duration::from_secs(5)).await.unwrap();
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let failed = ops
        .events(&EventFilter {
            status: EventStatus::Failed,
            ..EventFilter::default()
        })
        .await
        .unwrap();
    let id_of = |aggregate: &str| {
        failed
            .items
            .iter()
            .find(|e| e.aggregate_id == aggregate)
            .unwrap()
            .id
    };
    ((id_of("ch-1"), id_of("ch-2")), transport.published())
}

/// Every action the console offers.
const ACTIONS: [&str; 6] = [
    "retry-failed",
    "skip-failed",
    "republish",
    "retry-blocked",
    "replay",
    "discard",
];

/// Whether `action` acts on letters (else on events).
fn is_letter_action(action: &str) -> bool {
    matches!(action, "replay" | "discard")
}

/// The dead letters of [`seed_dead_letters`]; the oldest one's id.
async fn seed_letter(db: &TestDb) -> String {
    seed_dead_letters(db).await;
    db.scalar::<i64>("SELECT min(id) FROM {s}.outbox_dead_letters")
        .await
        .to_string()
}

/// Three dead letters of consumer `billing` with one failure (the handler
/// refuses counters c1..c3) and one with another failure shape.
async fn seed_dead_letters(db: &TestDb) {
    create_effects(db).await;
    let config = ConsumerConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        ..ConsumerConfig::default()
    };
    let consumer = tick_consumer(db, "billing", config, Duration::ZERO, &["c1", "c2", "c3"]);
    for counter in ["c1", "c2", "c3"] {
        assert!(matches!(
            consumer.handle_envelope(&tick(counter, 1)).await.unwrap(),
            Outcome::DeadLettered { .. }
        ));
    }
}

/// A charge whose handler fails for good at consumer `payments`: a dead
/// letter whose payload holds the redacted card number.
async fn seed_card_letter(db: &TestDb) {
    let consumer = ConsumerBuilder::new("payments")
        .config(ConsumerConfig {
            retry: RetryPolicy {
                max_attempts: 1,
                ..RetryPolicy::default()
            },
            ..ConsumerConfig::default()
        })
        .on_fn::<CardCharged, _>(|_, _| {
            Box::pin(async {
                Err(HandlerError::retryable(
                    "the card processor refused the charge",
                ))
            })
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let charge = Envelope::for_event(
        &CardCharged {
            charge_id: "ch-7".into(),
            card_number: SECRET,
            amount_cents: 990,
        },
        1,
    )
    .unwrap();
    assert!(matches!(
        consumer.handle_envelope(&charge).await.unwrap(),
        Outcome::DeadLettered { .. }
    ));
}

/// A v3 parcel quarantined at a consumer that reads v2 only.
async fn seed_quarantine(db: &TestDb) {
    let consumer = ConsumerBuilder::new("parcels")
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
        consumer.handle_envelope(&v3).await.unwrap(),
        Outcome::Quarantined { .. }
    ));
}

fn console(db: &TestDb) -> Router {
    Console::new(
        Ops::new(db.pool.clone(), db.schema.clone()),
        Identify::fixed("ada"),
    )
    .router()
}

async fn audit_rows(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM {s}.outbox_audit").await
}

async fn status_of(db: &TestDb, id: Uuid) -> String {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT status FROM {}.outbox_events WHERE id = $1",
        db.schema.as_str()
    )))
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

fn no_secret(path: &str, body: &str) {
    assert!(
        !body.contains(&SECRET.to_string()),
        "{path} shows the redacted card number:\n{body}"
    );
}

#[tokio::test]
async fn every_view_shows_the_incident_with_payloads_redacted() {
    let db = TestDb::new().await;
    let ((head, other), published) = seed_failed_publishing(&db).await;
    seed_dead_letters(&db).await;
    seed_quarantine(&db).await;
    seed_card_letter(&db).await;
    let router = console(&db);

    let status = get(&router, "/").await.expect(StatusCode::OK);
    for expected in [
        "id=\"problems\"",
        "billing",
        "parcels",
        "card / ch-1",
        &head.to_string(),
    ] {
        assert!(
            status.body.contains(expected),
            "status lacks {expected}:\n{}",
            status.body
        );
    }
    let policy = status.headers["content-security-policy"].to_str().unwrap();
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
    assert_eq!(status.headers["cache-control"], "no-store");
    let failed = get(&router, "/events?status=failed")
        .await
        .expect(StatusCode::OK);
    assert!(failed.body.contains(&head.to_string()) && failed.body.contains(&other.to_string()));
    let filtered = get(&router, "/events?status=failed&aggregate_id=ch-2")
        .await
        .expect(StatusCode::OK);
    assert!(filtered.body.contains(&other.to_string()));
    assert!(
        !filtered.body.contains(&head.to_string()),
        "the filter keeps ch-2 only"
    );
    let paged = get(&router, "/events?status=failed&limit=1")
        .await
        .expect(StatusCode::OK);
    assert!(paged.body.contains(&head.to_string()), "oldest first");
    assert!(!paged.body.contains(&other.to_string()));
    assert!(
        paged
            .body
            .contains("<select name=\"limit\"><option value=\"1\" selected>1</option>"),
        "the filter form keeps the page size: {}",
        paged.body
    );
    let next = {
        let marker = "id=\"next\" href=\"";
        let start = paged.body.find(marker).expect("a full page links the next") + marker.len();
        let end = paged.body[start..].find('"').unwrap() + start;
        paged.body[start..end].replace("&amp;", "&")
    };
    assert!(
        next.contains("status=failed") && next.contains("limit=1"),
        "{next}"
    );
    let second = get(&router, &next).await.expect(StatusCode::OK);
    assert!(second.body.contains(&other.to_string()), "{}", second.body);
    assert!(!second.body.contains(&head.to_string()));

    let event = get(&router, &format!("/events/{head}"))
        .await
        .expect(StatusCode::OK);
    assert!(event.body.contains("[REDACTED]"), "{}", event.body);
    assert!(event.body.contains("message too large for the broker"));
    assert!(
        event.body.contains("&quot;amount_cents&quot;: 1250")
            || event.body.contains("\"amount_cents\": 1250")
    );
    // The attributes shown are those the relay published the event with
    // (all but the transport's own `source` and `dataschema`).
    let [sent] = published.as_slice() else {
        panic!("one event published: {published:?}")
    };
    let shown = get(&router, &format!("/events/{}", sent.id))
        .await
        .expect(StatusCode::OK);
    let attributes = sent.cloudevents_attributes("/console-test");
    let rows = shown.body.matches("<tr><td><code>").count();
    assert_eq!(rows, attributes.len() - 2, "{}", shown.body);
    for (name, value) in attributes {
        let row = format!("<tr><td><code>{name}</code></td><td><code>{value}</code></td></tr>");
        assert_eq!(
            shown.body.contains(&row),
            name != "source" && name != "dataschema",
            "{row} in {}",
            shown.body
        );
    }
    let blocked = get(&router, "/blocked").await.expect(StatusCode::OK);
    assert!(blocked.body.contains("card / ch-1") && blocked.body.contains(&head.to_string()));
    // The blocked and audit pages keep the page size their form asked for.
    for (path, rows) in [("/blocked?limit=1", "1"), ("/audit?limit=7", "7")] {
        let page = get(&router, path).await.expect(StatusCode::OK);
        assert!(
            page.body.contains(&format!(
                "<select name=\"limit\"><option value=\"{rows}\" selected>{rows}</option>"
            )),
            "{path}: {}",
            page.body
        );
    }

    let letters = get(&router, "/consumers/billing/dead_lettered")
        .await
        .expect(StatusCode::OK);
    // Three letters of one failure shape: one group, counted.
    assert_eq!(
        letters.body.matches("class=\"group\"").count(),
        1,
        "{}",
        letters.body
    );
    assert!(
        letters.body.contains("<td class=\"num count\">3</td>"),
        "{}",
        letters.body
    );
    let fingerprint = {
        let marker = "data-fingerprint=\"";
        let start = letters.body.find(marker).unwrap() + marker.len();
        letters.body[start..start + 12].to_owned()
    };
    let group = get(
        &router,
        &format!("/consumers/billing/dead_lettered?fingerprint={fingerprint}"),
    )
    .await
    .expect(StatusCode::OK);
    assert_eq!(
        group.body.matches("name=\"id\"").count(),
        3,
        "{}",
        group.body
    );
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let letter = ops
        .letters(&LetterFilter {
            consumer: "billing".into(),
            kind: LetterKind::DeadLettered,
            ..LetterFilter::default()
        })
        .await
        .unwrap()
        .items[0]
        .clone();
    let detail = get(
        &router,
        &format!("/consumers/billing/dead_lettered/{}", letter.id),
    )
    .await
    .expect(StatusCode::OK);
    assert!(
        detail.body.contains("downstream refuses counter c1"),
        "{}",
        detail.body
    );
    assert!(detail.body.contains("Headers"));
    let quarantine = get(&router, "/consumers/parcels/quarantined")
        .await
        .expect(StatusCode::OK);
    assert!(
        quarantine.body.contains("schema version"),
        "{}",
        quarantine.body
    );
    // A letter asked for under the other kind is not there.
    get(
        &router,
        &format!("/consumers/billing/quarantined/{}", letter.id),
    )
    .await
    .expect(StatusCode::NOT_FOUND);
    get(&router, "/consumers/billing/sideways")
        .await
        .expect(StatusCode::NOT_FOUND);
    get(&router, "/events/not-a-uuid")
        .await
        .expect(StatusCode::BAD_REQUEST);
    get(&router, &format!("/events/{}", Uuid::now_v7()))
        .await
        .expect(StatusCode::NOT_FOUND);
    get(&router, "/events?status=lost")
        .await
        .expect(StatusCode::BAD_REQUEST);
    // A NUL in a filter or a path is the request's fault, named as such,
    // not a database error from PostgreSQL's `text`.
    let nul = get(&router, "/events?event_type=a%00b")
        .await
        .expect(StatusCode::BAD_REQUEST);
    assert!(nul.body.contains("NUL character"), "{}", nul.body);
    get(&router, "/consumers/bil%00ling/dead_lettered")
        .await
        .expect(StatusCode::BAD_REQUEST);
    get(&router, "/audit").await.expect(StatusCode::OK);
    get(&router, "/assets/console.js")
        .await
        .expect(StatusCode::OK);

    let card_group = get(&router, "/consumers/payments/dead_lettered")
        .await
        .expect(StatusCode::OK);
    let card_letter = {
        let marker = "href=\"/consumers/payments/dead_lettered/";
        let start = card_group.body.find(marker).expect("an example letter") + marker.len();
        let end = card_group.body[start..].find('"').unwrap() + start;
        card_group.body[start..end].to_owned()
    };
    let shown = get(
        &router,
        &format!("/consumers/payments/dead_lettered/{card_letter}"),
    )
    .await
    .expect(StatusCode::OK);
    assert!(shown.body.contains("[REDACTED]"), "{}", shown.body);
    assert!(shown.body.contains("the card processor refused the charge"));
    let preview = post(
        &router,
        "/actions/preview",
        &[
            ("action", "discard"),
            ("consumer", "payments"),
            ("kind", "dead_lettered"),
            ("id", &card_letter),
            ("csrf", &shown.csrf()),
        ],
    )
    .await
    .expect(StatusCode::OK);
    no_secret("a letter's preview", &preview.body);
    let card_fingerprint = {
        let marker = "data-fingerprint=\"";
        let start = card_group.body.find(marker).unwrap() + marker.len();
        card_group.body[start..start + 12].to_owned()
    };
    for path in [
        format!("/consumers/payments/dead_lettered?fingerprint={card_fingerprint}"),
        "/consumers/payments/dead_lettered".to_owned(),
        format!("/consumers/payments/dead_lettered/{card_letter}"),
        "/audit".to_owned(),
        "/".to_owned(),
        "/events?status=failed".to_owned(),
        "/events?status=pending".to_owned(),
        format!("/events/{head}"),
        "/blocked".to_owned(),
    ] {
        let page = get(&router, &path).await.expect(StatusCode::OK);
        no_secret(&path, &page.body);
    }
    db.drop_schema().await;
}

#[tokio::test]
async fn an_action_needs_the_token_shows_what_it_touches_and_is_audited() {
    let db = TestDb::new().await;
    let (head, other) = seed_failed(&db).await;
    let router = console(&db);
    let page = get(&router, "/events?status=failed")
        .await
        .expect(StatusCode::OK);
    let csrf = page.csrf();
    let head_id = head.to_string();

    // No token, a wrong token, another site: refused, nothing written;
    // each run below carries a valid confirmation of its preview, so what
    // refuses it is the token or the site, as the answer says.
    const NO_TOKEN: &str = "missing or wrong CSRF token";
    let refused = post(
        &router,
        "/actions/preview",
        &[("action", "retry-failed"), ("id", &head_id)],
    )
    .await
    .expect(StatusCode::FORBIDDEN);
    assert!(refused.body.contains(NO_TOKEN), "{}", refused.body);
    let wrong = "0".repeat(64);
    let letter_id = seed_letter(&db).await;
    for action in ACTIONS {
        let id = if is_letter_action(action) {
            &letter_id
        } else {
            &head_id
        };
        let target = [
            ("action", action),
            ("id", id.as_str()),
            ("consumer", "billing"),
            ("kind", "dead_lettered"),
        ];
        let mut previewed = target.to_vec();
        previewed.push(("csrf", csrf.as_str()));
        let confirm = post(&router, "/actions/preview", &previewed)
            .await
            .expect(StatusCode::OK)
            .confirm();
        let mut run = target.to_vec();
        run.extend([("reason", "r"), ("confirm", confirm.as_str())]);
        for token in [None, Some(wrong.as_str())] {
            let mut fields = run.clone();
            fields.extend(token.map(|t| ("csrf", t)));
            let refused = post(&router, "/actions/run", &fields)
                .await
                .expect(StatusCode::FORBIDDEN);
            assert!(
                refused.body.contains(NO_TOKEN),
                "{action}: {}",
                refused.body
            );
        }
        let mut fields = run.clone();
        fields.push(("csrf", csrf.as_str()));
        let refused = post_with(
            &router,
            "/actions/run",
            &fields,
            &[("origin", "https://evil.example")],
        )
        .await
        .expect(StatusCode::FORBIDDEN);
        assert!(
            refused.body.contains("another site"),
            "{action}: {}",
            refused.body
        );
        // A token (and confirmation) of another console, another key.
        let refused = post(&console(&db), "/actions/run", &fields)
            .await
            .expect(StatusCode::FORBIDDEN);
        assert!(
            refused.body.contains(NO_TOKEN),
            "{action}: {}",
            refused.body
        );
    }
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_dead_letters WHERE resolved_at IS NULL AND replay_requested_at IS NULL")
            .await,
        3,
        "every letter open, none asked to replay"
    );
    assert_eq!(audit_rows(&db).await, 0);
    assert_eq!(status_of(&db, head).await, "failed");

    // By filter: an explicit limit is required, and it is the cap.
    let failed_filter = [
        ("action", "skip-failed"),
        ("by", "filter"),
        ("status", "failed"),
        ("csrf", csrf.as_str()),
    ];
    post(&router, "/actions/preview", &failed_filter)
        .await
        .expect(StatusCode::BAD_REQUEST);
    let mut with_limit = failed_filter.to_vec();
    with_limit.push(("limit", "5000"));
    post(&router, "/actions/preview", &with_limit)
        .await
        .expect(StatusCode::BAD_REQUEST);
    let mut capped = failed_filter.to_vec();
    capped.push(("limit", "1"));
    let preview = post(&router, "/actions/preview", &capped)
        .await
        .expect(StatusCode::OK);
    assert!(
        preview.body.contains("Skip 1 failed event?"),
        "{}",
        preview.body
    );
    // Two failed events match; the limit took the oldest only.
    assert!(preview.body.contains(&head.to_string()), "{}", preview.body);
    assert!(
        !preview.body.contains(&other.to_string()),
        "{}",
        preview.body
    );
    assert_eq!(audit_rows(&db).await, 0, "a preview changes nothing");

    // Step one: what it would touch; nothing changes.
    let preview = post(
        &router,
        "/actions/preview",
        &[
            ("action", "retry-failed"),
            ("id", &head_id),
            ("csrf", &csrf),
        ],
    )
    .await
    .expect(StatusCode::OK);
    assert!(
        preview.body.contains("Retry 1 failed event?"),
        "{}",
        preview.body
    );
    assert!(preview.body.contains("back to pending"));
    assert!(preview.body.contains(&head_id));
    no_secret("/actions/preview", &preview.body);
    assert_eq!(status_of(&db, head).await, "failed");
    assert_eq!(audit_rows(&db).await, 0);

    // Step two without a reason: refused, nothing written.
    post(
        &router,
        "/actions/run",
        &[
            ("action", "retry-failed"),
            ("id", &head_id),
            ("csrf", &preview.csrf()),
            ("reason", " "),
            ("confirm", &preview.confirm()),
        ],
    )
    .await
    .expect(StatusCode::BAD_REQUEST);
    assert_eq!(audit_rows(&db).await, 0);

    let done = post(
        &router,
        "/actions/run",
        &[
            ("action", "retry-failed"),
            ("id", &head_id),
            ("csrf", &preview.csrf()),
            ("reason", "the broker takes 2 MiB messages again"),
            ("confirm", &preview.confirm()),
        ],
    )
    .await
    .expect(StatusCode::OK);
    assert!(done.body.contains("retried"), "{}", done.body);
    assert_eq!(status_of(&db, head).await, "pending");
    assert_eq!(
        status_of(&db, other).await,
        "failed",
        "only the confirmed id"
    );
    let (operator, reason, action): (String, String, String) =
        sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT operator, reason, action FROM {}.outbox_audit",
            db.schema.as_str()
        )))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        (operator.as_str(), reason.as_str(), action.as_str()),
        (
            "ada",
            "the broker takes 2 MiB messages again",
            "relay.retry"
        )
    );
    let history = get(&router, &format!("/events/{head}"))
        .await
        .expect(StatusCode::OK);
    assert!(
        history
            .body
            .contains("the broker takes 2 MiB messages again")
    );

    db.drop_schema().await;
}

#[tokio::test]
async fn letters_are_replayed_or_discarded_by_group_up_to_the_limit() {
    let db = TestDb::new().await;
    seed_dead_letters(&db).await;
    let router = console(&db);
    let listing = get(&router, "/consumers/billing/dead_lettered")
        .await
        .expect(StatusCode::OK);
    let fingerprint = {
        let marker = "data-fingerprint=\"";
        let start = listing.body.find(marker).unwrap() + marker.len();
        listing.body[start..start + 12].to_owned()
    };
    let group = get(
        &router,
        &format!("/consumers/billing/dead_lettered?fingerprint={fingerprint}"),
    )
    .await
    .expect(StatusCode::OK);
    let csrf = group.csrf();

    // Every letter, paged as the tool's `list --limit 2 --after ID`.
    let every = href_of(&listing, "list-all").expect("a link to every letter");
    let mut page = get(&router, &format!("{every}&limit=2"))
        .await
        .expect(StatusCode::OK);
    let mut pages = vec![letter_ids_on(&page)];
    while let Some(next) = href_of(&page, "next-page") {
        assert!(
            next.contains("list=1") && next.contains("limit=2"),
            "{next}"
        );
        page = get(&router, &next).await.expect(StatusCode::OK);
        pages.push(letter_ids_on(&page));
    }
    assert_eq!(
        pages.iter().map(Vec::len).collect::<Vec<_>>(),
        vec![2, 1],
        "{pages:?}"
    );
    assert!(pages.concat().windows(2).all(|w| w[0] < w[1]));
    let preview = post(
        &router,
        "/actions/preview",
        &[
            ("action", "discard"),
            ("by", "filter"),
            ("consumer", "billing"),
            ("kind", "dead_lettered"),
            ("fingerprint", &fingerprint),
            ("limit", "2"),
            ("csrf", &csrf),
        ],
    )
    .await
    .expect(StatusCode::OK);
    assert!(
        preview.body.contains("Discard 2 letters?"),
        "{}",
        preview.body
    );
    let ids: Vec<String> = preview
        .body
        .match_indices("type=\"hidden\" name=\"id\" value=\"")
        .map(|(at, m)| {
            let rest = &preview.body[at + m.len()..];
            rest[..rest.find('"').unwrap()].to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 2);
    let confirm = preview.confirm();
    let mut fields = vec![
        ("action", "discard"),
        ("consumer", "billing"),
        ("kind", "dead_lettered"),
        ("csrf", csrf.as_str()),
        ("reason", "c1 and c2 were settled by hand"),
    ];
    fields.extend(ids.iter().map(|id| ("id", id.as_str())));
    // A run must carry its preview's confirmation, for exactly its ids.
    let third: i64 = db
        .scalar("SELECT max(id) FROM {s}.outbox_dead_letters")
        .await;
    let third = third.to_string();
    let mut more = fields.clone();
    more.extend([("id", third.as_str()), ("confirm", confirm.as_str())]);
    let refused = post(&router, "/actions/run", &more)
        .await
        .expect(StatusCode::FORBIDDEN);
    assert!(
        refused.body.contains("from its preview"),
        "{}",
        refused.body
    );
    post(&router, "/actions/run", &fields)
        .await
        .expect(StatusCode::FORBIDDEN);
    let mut replayed = fields.clone();
    replayed[0] = ("action", "replay");
    replayed.push(("confirm", confirm.as_str()));
    post(&router, "/actions/run", &replayed)
        .await
        .expect(StatusCode::FORBIDDEN);
    let (issued, hash) = confirm.split_once('.').expect("ISSUED.HASH");
    let older = format!("{}.{hash}", issued.parse::<i64>().unwrap() - 60);
    let mut moved = fields.clone();
    moved.push(("confirm", older.as_str()));
    post(&router, "/actions/run", &moved)
        .await
        .expect(StatusCode::FORBIDDEN);
    assert_eq!(audit_rows(&db).await, 0, "nothing ran");
    fields.push(("confirm", confirm.as_str()));
    let done = post(&router, "/actions/run", &fields)
        .await
        .expect(StatusCode::OK);
    assert_eq!(done.body.matches(">discarded<").count(), 2, "{}", done.body);
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let open = ops
        .letters(&LetterFilter {
            consumer: "billing".into(),
            kind: LetterKind::DeadLettered,
            ..LetterFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(open.items.len(), 1, "the limit left the third open");

    // Replay the last one by id: requested for the running consumer.
    let last = open.items[0].id.to_string();
    let done = preview_and_run(
        &router,
        &[
            ("action", "replay"),
            ("consumer", "billing"),
            ("kind", "dead_lettered"),
            ("id", &last),
            ("csrf", &csrf),
        ],
        "c3's downstream is back",
    )
    .await;
    assert!(done.body.contains("replay_requested"), "{}", done.body);
    let shown = get(&router, &format!("/consumers/billing/dead_lettered/{last}"))
        .await
        .expect(StatusCode::OK);
    assert!(shown.body.contains("replay requested"), "{}", shown.body);
    // Discarding it instead would withdraw that request: the preview says so.
    let preview = post(
        &router,
        "/actions/preview",
        &[
            ("action", "discard"),
            ("consumer", "billing"),
            ("kind", "dead_lettered"),
            ("id", &last),
            ("csrf", &csrf),
        ],
    )
    .await
    .expect(StatusCode::OK);
    assert!(
        preview
            .body
            .contains("the replay requested of it is withdrawn"),
        "{}",
        preview.body
    );
    assert!(
        shown.body.contains("c3&#39;s downstream is back")
            || shown.body.contains("c3's downstream is back")
    );
    let audit = ops.audit(None, None).await.unwrap();
    let rows: Vec<(&str, &str, &str, usize)> = audit
        .items
        .iter()
        .map(|row| {
            (
                row.action.as_str(),
                row.operator.as_str(),
                row.reason.as_str(),
                row.ids.len(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![
            ("consumer.replay", "ada", "c3's downstream is back", 1),
            (
                "consumer.discard",
                "ada",
                "c1 and c2 were settled by hand",
                2
            ),
        ],
        "each action one audit row in the operator's name, with its reason and ids"
    );
    db.drop_schema().await;
}

/// Previews an action on `fields` (its ids, consumer and kind, the CSRF
/// token), then runs what the preview showed with `reason` and the
/// preview's confirmation, as the preview page's form does.
async fn preview_and_run(
    router: &Router,
    fields: &[(&str, &str)],
    reason: &str,
) -> outbox_tests::console::Page {
    let preview = post(router, "/actions/preview", fields)
        .await
        .expect(StatusCode::OK);
    let confirm = preview.confirm();
    let mut run: Vec<(&str, &str)> = fields.to_vec();
    run.extend([("reason", reason), ("confirm", confirm.as_str())]);
    post(router, "/actions/run", &run)
        .await
        .expect(StatusCode::OK)
}

/// One event applied by consumer `ledger` (so it has a lag to show).
async fn seed_applied(db: &TestDb) {
    create_effects(db).await;
    let consumer = tick_consumer(db, "ledger", ConsumerConfig::default(), Duration::ZERO, &[]);
    assert_eq!(
        consumer.handle_envelope(&tick("l1", 1)).await.unwrap(),
        Outcome::Applied
    );
    consumer.flush_stats().await.unwrap();
}

/// Inserts `count` open dead letters of consumer `bulk` with reasons
/// `reason(n)`, after the ones already there.
async fn bulk_letters(db: &TestDb, count: i64, reason: &str) {
    db.execute(&format!(
        "INSERT INTO {{s}}.outbox_dead_letters
            (consumer_name, kind, event_id, event_type, schema_version, aggregate_type,
             aggregate_id, aggregate_version, payload, reason, attempts)
         SELECT 'bulk', 'dead_lettered', gen_random_uuid(), 'tick', 1, 'counter',
                'agg-' || n, 1, convert_to('{{}}', 'UTF8'), {reason}, 1
         FROM generate_series(1, {count}) AS n
         ORDER BY n"
    ))
    .await;
}

/// The `href` of the element with `id` on `page`, unescaped.
fn href_of(page: &outbox_tests::console::Page, id: &str) -> Option<String> {
    let at = page.body.find(&format!("id=\"{id}\""))?;
    let rest = &page.body[at..];
    let start = rest.find("href=\"")? + "href=\"".len();
    let end = start + rest[start..].find('"')?;
    Some(rest[start..end].replace("&amp;", "&"))
}

/// Letter ids (`/consumers/bulk/dead_lettered/ID` links) in a group page's
/// table.
fn letter_ids_on(page: &outbox_tests::console::Page) -> Vec<i64> {
    let table = &page.body[page.body.find("id=\"letters\"").expect("a letters table")..];
    let table = &table[..table.find("</table>").unwrap()];
    let marker = "type=\"checkbox\" name=\"id\" value=\"";
    table
        .match_indices(marker)
        .map(|(at, m)| {
            let rest = &table[at + m.len()..];
            rest[..rest.find('"').unwrap()].parse().unwrap()
        })
        .collect()
}

/// One failure's letters behind more letters of another than a grouping
/// reads: its group pages go on from where the last one stopped (a page
/// cut short by the read bound says so and links on), page by page to the
/// last, and an action by fingerprint finds them, as the tool's
/// `--fingerprint` does.
#[tokio::test]
async fn a_failures_letters_are_paged_and_acted_on_past_the_grouping_scan() {
    let db = TestDb::new().await;
    bulk_letters(&db, 5_010, "'the ledger is closed'").await;
    bulk_letters(
        &db,
        130,
        "'the card processor refused the charge of order ' || n",
    )
    .await;
    let router = console(&db);
    let groups = get(&router, "/consumers/bulk/dead_lettered")
        .await
        .expect(StatusCode::OK);
    assert!(groups.body.contains("id=\"truncated\""), "{}", groups.body);
    let refused = outbox_core::ops::format::error_fingerprint(
        "the card processor refused the charge of order 7",
    );
    assert!(
        !groups.body.contains(&refused),
        "the grouping reads the oldest 5,000 letters only"
    );

    // The first page read 5,000 letters of the other failure and found
    // none of this one: it says so and links on.
    let mut page = get(
        &router,
        &format!(
            "/consumers/bulk/dead_lettered?fingerprint={}",
            refused.to_uppercase()
        ),
    )
    .await
    .expect(StatusCode::OK);
    assert!(page.body.contains("id=\"cut-short\""), "{}", page.body);
    let mut seen = letter_ids_on(&page);
    assert!(seen.is_empty());
    let mut sizes = Vec::new();
    while let Some(next) = href_of(&page, "next-page") {
        page = get(&router, &next).await.expect(StatusCode::OK);
        let ids = letter_ids_on(&page);
        sizes.push(ids.len());
        seen.extend(ids);
        assert!(sizes.len() < 5, "the pages never end: {sizes:?}");
    }
    assert_eq!(sizes, vec![100, 30], "pages of 100, then the rest");
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "oldest first, no repeats"
    );
    let first_card: i64 = db
        .scalar(
            "SELECT min(id) FROM {s}.outbox_dead_letters WHERE reason LIKE 'the card processor%'",
        )
        .await;
    assert_eq!(seen[0], first_card);
    assert_eq!(seen.len(), 130);

    // An action by fingerprint reads as far as the tool's repairs do.
    let csrf = page.csrf();
    let preview = post(
        &router,
        "/actions/preview",
        &[
            ("action", "discard"),
            ("by", "filter"),
            ("consumer", "bulk"),
            ("kind", "dead_lettered"),
            ("fingerprint", &refused),
            ("limit", "120"),
            ("csrf", &csrf),
        ],
    )
    .await
    .expect(StatusCode::OK);
    assert!(
        preview.body.contains("Discard 120 letters?"),
        "{}",
        preview.body
    );
    let previewed = preview
        .body
        .matches("type=\"hidden\" name=\"id\" value=\"")
        .count();
    assert_eq!(previewed, 120);
    db.drop_schema().await;
}

#[tokio::test]
async fn a_read_only_console_shows_everything_and_refuses_every_action() {
    let db = TestDb::new().await;
    let (head, _) = seed_failed(&db).await;
    let writable = console(&db);
    let csrf = get(&writable, "/events?status=failed").await.csrf();
    let router = Console::new(
        Ops::new(db.pool.clone(), db.schema.clone()),
        Identify::fixed("ada"),
    )
    .read_only(true)
    .router();
    let page = get(&router, "/events?status=failed")
        .await
        .expect(StatusCode::OK);
    assert!(page.body.contains(&head.to_string()));
    assert!(page.body.contains("read-only"));
    assert!(
        !page.body.contains("name=\"action\""),
        "no action buttons:\n{}",
        page.body
    );
    let (head_id, letter_id) = (head.to_string(), seed_letter(&db).await);
    for action in ACTIONS {
        let id = if is_letter_action(action) {
            &letter_id
        } else {
            &head_id
        };
        for path in ["/actions/preview", "/actions/run"] {
            let refused = post(
                &router,
                path,
                &[
                    ("action", action),
                    ("id", id),
                    ("consumer", "billing"),
                    ("kind", "dead_lettered"),
                    ("csrf", &csrf),
                    ("reason", "r"),
                ],
            )
            .await
            .expect(StatusCode::FORBIDDEN);
            assert!(
                refused.body.contains("read-only"),
                "{action} {path}: {}",
                refused.body
            );
        }
    }
    assert_eq!(status_of(&db, head).await, "failed");
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_dead_letters WHERE resolved_at IS NULL AND replay_requested_at IS NULL")
            .await,
        3,
        "every letter open, none asked to replay"
    );
    assert_eq!(audit_rows(&db).await, 0);
    db.drop_schema().await;
}

/// The status page flags problems by the thresholds it is given (the
/// tool's `status --max-age/--max-lag`), not only by the defaults.
#[tokio::test]
async fn the_status_page_flags_by_the_thresholds_it_is_given() {
    let db = TestDb::new().await;
    seed_failed(&db).await;
    seed_applied(&db).await;
    let pending_age = "the oldest pending event is";
    let lagging = "consumer ledger: its last applied event was";
    let default = get(&console(&db), "/").await.expect(StatusCode::OK);
    assert!(default.body.contains("event(s) failed"), "{}", default.body);
    assert!(
        !default.body.contains(pending_age) && !default.body.contains(lagging),
        "a pending event seconds old, a consumer seconds behind: within 5 minutes"
    );
    let strict = Console::new(
        Ops::new(db.pool.clone(), db.schema.clone()),
        Identify::fixed("ada"),
    )
    .status_options(outbox_core::ops::StatusOptions {
        max_pending_age: Duration::ZERO,
        max_consumer_lag: Duration::ZERO,
        ..outbox_core::ops::StatusOptions::default()
    })
    .router();
    let flagged = get(&strict, "/").await.expect(StatusCode::OK);
    assert!(
        flagged.body.contains(pending_age)
            && flagged.body.contains(lagging)
            && flagged.body.contains("(more than 0 s)"),
        "{}",
        flagged.body
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn requests_without_an_operator_see_nothing() {
    let db = TestDb::new().await;
    seed_failed(&db).await;
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let router = Console::new(ops.clone(), Identify::basic_token("a-long-console-token")).router();
    let refused = get(&router, "/").await.expect(StatusCode::UNAUTHORIZED);
    assert!(
        refused.headers["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Basic")
    );
    assert!(!refused.body.contains("card"));
    let send = |credentials: &str| {
        let router = router.clone();
        let header = format!("Basic {credentials}");
        async move {
            outbox_tests::console::send(
                &router,
                axum::http::Request::get("/")
                    .header("authorization", header)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
        }
    };
    // bob:wrong
    send("Ym9iOndyb25n").await.expect(StatusCode::UNAUTHORIZED);
    // bob:a-long-console-token
    let page = send("Ym9iOmEtbG9uZy1jb25zb2xlLXRva2Vu")
        .await
        .expect(StatusCode::OK);
    assert!(
        page.body.contains("<strong id=\"operator\">bob</strong>"),
        "{}",
        page.body
    );

    let nobody = Console::new(ops, Identify::from_fn(|_| None)).router();
    get(&nobody, "/").await.expect(StatusCode::FORBIDDEN);
    get(&nobody, "/assets/console.css")
        .await
        .expect(StatusCode::FORBIDDEN);
    db.drop_schema().await;
}

#[tokio::test]
async fn a_sqlite_outbox_is_served_with_its_letters() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("app.db").display());
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .connect_with(
            outbox_sqlite::connect_options(&url)
                .unwrap()
                .create_if_missing(true),
        )
        .await
        .unwrap();
    outbox_sqlite::migrate(&pool).await.unwrap();
    let id = Uuid::now_v7();
    let now_ms = chrono::Utc::now().timestamp_millis();
    let payload = serde_json::to_string(&CardCharged {
        charge_id: "ch-9".into(),
        card_number: SECRET,
        amount_cents: 5,
    })
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox_events (id, aggregate_type, aggregate_id, aggregate_version, event_type,
             schema_version, payload, created_at, status, attempt_count, last_error, first_failed_at, failed_at)
         VALUES (?, 'card', 'ch-9', 1, 'card.charged', 1, ?, ?, 'failed', 3, 'permanent: refused', ?, ?)",
    )
    .bind(id.to_string())
    .bind(payload)
    .bind(now_ms)
    .bind(now_ms)
    .bind(now_ms)
    .execute(&pool)
    .await
    .unwrap();
    let letter_id: i64 = sqlx::query_scalar(
        "INSERT INTO outbox_dead_letters (consumer_name, kind, event_id, event_type, schema_version,
             aggregate_type, aggregate_id, aggregate_version, headers, payload, reason, attempts, created_at)
         VALUES ('billing', 'dead_lettered', ?1, 'card.charged', 1, 'card', 'ch-9', 1, '{}', ?2,
                 'the card processor refused the charge', 5, ?3)
         RETURNING id",
    )
    .bind(Uuid::now_v7().to_string())
    .bind(
        serde_json::to_vec(&CardCharged {
            charge_id: "ch-9".into(),
            card_number: SECRET,
            amount_cents: 5,
        })
        .unwrap(),
    )
    .bind(now_ms)
    .fetch_one(&pool)
    .await
    .unwrap();
    let ops = outbox_sqlite::SqliteOps::new(pool.clone());
    let router = Console::new(ops.clone(), Identify::fixed("ada")).router();
    let status = get(&router, "/").await.expect(StatusCode::OK);
    assert!(status.body.contains("card / ch-9"), "{}", status.body);
    let event = get(&router, &format!("/events/{id}"))
        .await
        .expect(StatusCode::OK);
    assert!(event.body.contains("[REDACTED]"), "{}", event.body);
    no_secret("sqlite event", &event.body);
    let letters = get(&router, "/consumers/billing/dead_lettered")
        .await
        .expect(StatusCode::OK);
    assert!(
        letters
            .body
            .contains("the card processor refused the charge"),
        "{}",
        letters.body
    );
    no_secret("sqlite letters", &letters.body);
    let shown = get(
        &router,
        &format!("/consumers/billing/dead_lettered/{letter_id}"),
    )
    .await
    .expect(StatusCode::OK);
    assert!(shown.body.contains("[REDACTED]"), "{}", shown.body);
    no_secret("a sqlite letter", &shown.body);
    let discarded = preview_and_run(
        &router,
        &[
            ("action", "discard"),
            ("consumer", "billing"),
            ("kind", "dead_lettered"),
            ("id", &letter_id.to_string()),
            ("csrf", &shown.csrf()),
        ],
        "refund handled by hand",
    )
    .await;
    assert!(discarded.body.contains(">discarded<"), "{}", discarded.body);
    let resolution: String =
        sqlx::query_scalar("SELECT resolution FROM outbox_dead_letters WHERE id = ?1")
            .bind(letter_id)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(resolution, "discarded by ada: refund handled by hand");
    let done = preview_and_run(
        &router,
        &[
            ("action", "retry-failed"),
            ("id", &id.to_string()),
            ("csrf", &event.csrf()),
        ],
        "the broker is back",
    )
    .await;
    assert!(done.body.contains(">retried<"), "{}", done.body);
    let failed = ops
        .events(&EventFilter {
            status: EventStatus::Failed,
            ..EventFilter::default()
        })
        .await
        .unwrap();
    assert!(failed.items.is_empty(), "retried on SQLite");
    let audit = ops.audit(None, None).await.unwrap();
    assert_eq!(audit.items[0].operator, "ada");
    assert_eq!(audit.items[1].action, "consumer.discard");
}

/// Starts `outbox console` on `listen` with `env` (stdout and stderr piped).
fn console_process(
    db: &TestDb,
    listen: &str,
    env: &[(&str, &str)],
    extra: &[&str],
) -> std::process::Child {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_outbox-tool"));
    command
        .env_remove("DATABASE_URL")
        .env_remove("OUTBOX_CONSOLE_TOKEN")
        .args([
            "--database-url",
            &outbox_tests::db::test_database_url(),
            "--schema",
            db.schema.as_str(),
            "console",
            "--listen",
            listen,
        ])
        .args(extra)
        .env("USER", "ci-operator")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (name, value) in env {
        command.env(name, value);
    }
    command.spawn().expect("run outbox-tool console")
}

/// One HTTP/1.1 GET over a plain socket: the status line and the body.
fn http_get(address: &str, path: &str, authorization: Option<&str>) -> (String, String) {
    http_get_as(address, address, path, authorization)
}

/// [`http_get`] naming `host` in the request.
fn http_get_as(
    address: &str,
    host: &str,
    path: &str,
    authorization: Option<&str>,
) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(address).expect("the console accepts");
    let auth = authorization
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.lines().next().unwrap_or_default().to_owned();
    (status, response)
}

#[tokio::test]
async fn the_tool_serves_the_console_on_loopback_or_with_a_token_only() {
    use std::io::BufRead;
    let db = TestDb::new().await;
    seed_failed(&db).await;
    seed_applied(&db).await;

    // A public address without a token is refused before anything is served.
    let refused = console_process(&db, "0.0.0.0:0", &[], &[])
        .wait_with_output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("without a token"), "{stderr}");
    let short = console_process(
        &db,
        "127.0.0.1:0",
        &[("OUTBOX_CONSOLE_TOKEN", "short")],
        &[],
    )
    .wait_with_output()
    .unwrap();
    assert_eq!(short.status.code(), Some(2));

    // Loopback without a token: served, loudly, as the OS user.
    let mut child = console_process(&db, "127.0.0.1:0", &[], &[]);
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let address = line
        .trim()
        .strip_prefix("outbox console listening on http://")
        .and_then(|rest| rest.strip_suffix('/'))
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let (status, body) = http_get(&address, "/", None);
    assert!(status.contains("200"), "{body}");
    let (status, _) = http_get_as(&address, "rebound.example", "/", None);
    assert!(
        status.contains("421"),
        "another host's name is refused: {status}"
    );
    assert!(
        body.contains("<strong id=\"operator\">ci-operator</strong>"),
        "{body}"
    );
    assert!(body.contains("card / ch-1"), "{body}");
    assert!(
        !body.contains("the oldest pending event is")
            && !body.contains("its last applied event was"),
        "seconds old is within the default 5 minutes"
    );
    child.kill().unwrap();
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("WARNING") && stderr.contains("ci-operator"),
        "{stderr}"
    );

    // With a token: HTTP Basic, the user name is the operator.
    let token = "a-long-console-token";
    let mut child = console_process(
        &db,
        "127.0.0.1:0",
        &[("OUTBOX_CONSOLE_TOKEN", token)],
        &["--max-age", "0s", "--max-lag", "0s"],
    );
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let address = line
        .trim()
        .trim_start_matches("outbox console listening on http://")
        .trim_end_matches('/')
        .to_owned();
    let (status, _) = http_get(&address, "/", None);
    assert!(status.contains("401"), "{status}");
    // bob:a-long-console-token
    let (status, body) = http_get(
        &address,
        "/",
        Some("Basic Ym9iOmEtbG9uZy1jb25zb2xlLXRva2Vu"),
    );
    assert!(status.contains("200"), "{body}");
    assert!(
        body.contains("<strong id=\"operator\">bob</strong>"),
        "{body}"
    );
    assert!(
        body.contains("the oldest pending event is") && body.contains("(more than 0 s)"),
        "--max-age 0s flags any pending event: {body}"
    );
    assert!(
        body.contains("consumer ledger: its last applied event was"),
        "--max-lag 0s flags any lag: {body}"
    );
    child.kill().unwrap();
    let _ = child.wait();
    db.drop_schema().await;
}

#[tokio::test]
async fn posts_from_other_sites_and_requests_for_other_hosts_are_refused() {
    let db = TestDb::new().await;
    let (head, _) = seed_failed(&db).await;
    let router = Console::new(
        Ops::new(db.pool.clone(), db.schema.clone()),
        Identify::fixed("ada"),
    )
    .allowed_hosts(["console.test", "127.0.0.1:8080"])
    .router();
    let page = get(&router, "/events?status=failed").await;
    // A request without the Host of the console's address is misdirected
    // (a page of another site rebinding its name to the console's address).
    assert_eq!(page.status, StatusCode::MISDIRECTED_REQUEST);
    let named = |host: &'static str| {
        let router = router.clone();
        async move {
            outbox_tests::console::send(
                &router,
                axum::http::Request::get("/events?status=failed")
                    .header("host", host)
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
        }
    };
    named("evil.example:8080")
        .await
        .expect(StatusCode::MISDIRECTED_REQUEST);
    let page = named("127.0.0.1:8080").await.expect(StatusCode::OK);
    let csrf = page.csrf();
    let id = head.to_string();
    let run = [
        ("action", "retry-failed"),
        ("id", id.as_str()),
        ("csrf", csrf.as_str()),
        ("reason", "r"),
    ];
    // A browser's same-origin POSTs through a proxy that rewrote Host.
    let same_origin = [
        ("sec-fetch-site", "same-origin"),
        ("origin", "https://outbox.example.com"),
    ];
    let preview = post_with(&router, "/actions/preview", &run, &same_origin)
        .await
        .expect(StatusCode::OK);
    let confirm = preview.confirm();
    let mut confirmed = run.to_vec();
    confirmed.push(("confirm", confirm.as_str()));
    // With everything else right, another site's POST is refused.
    for headers in [
        vec![("sec-fetch-site", "cross-site")],
        vec![("sec-fetch-site", "same-site")],
        vec![("origin", "null")],
        vec![("origin", "https://evil.example")],
    ] {
        let refused = post_with(&router, "/actions/run", &confirmed, &headers)
            .await
            .expect(StatusCode::FORBIDDEN);
        assert!(
            refused.body.contains("another site"),
            "{headers:?}: {}",
            refused.body
        );
    }
    assert_eq!(audit_rows(&db).await, 0);
    post_with(&router, "/actions/run", &confirmed, &same_origin)
        .await
        .expect(StatusCode::OK);
    assert_eq!(status_of(&db, head).await, "pending");
    db.drop_schema().await;
}

/// The links of a page (`href` values, entities decoded).
fn links(body: &str) -> Vec<String> {
    body.match_indices("href=\"")
        .map(|(at, marker)| {
            let rest = &body[at + marker.len()..];
            rest[..rest.find('"').unwrap()].replace("&amp;", "&")
        })
        .collect()
}

#[tokio::test]
async fn nested_under_a_prefix_every_link_stays_under_it_and_answers() {
    let db = TestDb::new().await;
    seed_failed(&db).await;
    seed_dead_letters(&db).await;
    let console = Console::new(
        Ops::new(db.pool.clone(), db.schema.clone()),
        Identify::fixed("ada"),
    )
    .base_path("/outbox")
    .router();
    let app = Router::new().nest("/outbox", console);
    let mut seen = std::collections::HashSet::new();
    let mut queue = vec!["/outbox".to_owned()];
    while let Some(path) = queue.pop() {
        if !seen.insert(path.clone()) || seen.len() > 60 {
            continue;
        }
        let page = get(&app, &path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.body);
        if !page.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
        {
            continue;
        }
        for link in links(&page.body) {
            assert!(
                link.starts_with("/outbox"),
                "{path} links {link} outside the prefix"
            );
            queue.push(link);
        }
    }
    assert!(
        seen.contains("/outbox/blocked") && seen.contains("/outbox/audit"),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|p| p.starts_with("/outbox/consumers/billing/dead_lettered")),
        "{seen:?}"
    );
    db.drop_schema().await;
}

/// Runs `action` on `id` through the console's two steps; returns the
/// outcome page.
async fn act(router: &Router, action: &str, id: &str, reason: &str) -> outbox_tests::console::Page {
    let csrf = get(router, "/events?status=failed").await.csrf();
    let preview = post(
        router,
        "/actions/preview",
        &[("action", action), ("id", id), ("csrf", &csrf)],
    )
    .await
    .expect(StatusCode::OK);
    assert!(preview.body.contains(id), "{}", preview.body);
    post(
        router,
        "/actions/run",
        &[
            ("action", action),
            ("id", id),
            ("csrf", &preview.csrf()),
            ("reason", reason),
            ("confirm", &preview.confirm()),
        ],
    )
    .await
    .expect(StatusCode::OK)
}

/// A head the broker keeps refusing (retryable) blocks its aggregate while
/// it waits for its next attempt: "try now" by filter on the pending
/// events previews which one heads the blocked aggregate (tried) and which
/// waits behind it (left), and running it resets the head's attempts.
#[tokio::test]
async fn a_retrying_head_is_tried_now_and_the_preview_names_it() {
    let db = TestDb::new().await;
    let charge = |id: &str| CardCharged {
        charge_id: id.into(),
        card_number: SECRET,
        amount_cents: 500,
    };
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox
        .emit_all(&mut tx, &[charge("busy-1"), charge("busy-1")])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let transport = RecordingTransport::failing(|_: &Envelope| {
        Some(PublishFailure::retryable("the broker is busy"))
    });
    let config = RelayConfig {
        poll_interval: Duration::from_millis(50),
        stats_interval: Duration::ZERO,
        backoff: outbox_core::relay::Backoff {
            initial: Duration::from_secs(3600),
            max: Duration::from_secs(3600),
            multiplier: 2.0,
            jitter: 0.0,
        },
        ..RelayConfig::default()
    };
    let relay = Relay::start_postgres(db.pool.clone(), db.schema.clone(), transport, config)
        .await
        .unwrap();
    wait::until(
        "the head is retrying and blocks",
        Duration::from_secs(20),
        || async {
            db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_blocked_aggregates")
                .await
                == 1
        },
    )
    .await;
    relay.drain(Duration::from_secs(5)).await.unwrap();
    let head: Uuid = db
        .scalar("SELECT id FROM {s}.outbox_events WHERE aggregate_version = 1")
        .await;
    let behind: Uuid = db
        .scalar("SELECT id FROM {s}.outbox_events WHERE aggregate_version = 2")
        .await;

    let router = console(&db);
    let csrf = get(&router, "/events?status=pending").await.csrf();
    let preview = post(
        &router,
        "/actions/preview",
        &[
            ("action", "retry-blocked"),
            ("by", "filter"),
            ("status", "pending"),
            ("limit", "10"),
            ("csrf", &csrf),
        ],
    )
    .await
    .expect(StatusCode::OK);
    let row_of = |id: Uuid| {
        let at = preview.body.find(&format!("value=\"{id}\"")).unwrap();
        let row = &preview.body[at..];
        row[..row.find("</tr>").unwrap()].to_owned()
    };
    assert!(
        row_of(head).contains("tried now, attempts reset: it heads a blocked aggregate"),
        "{}",
        preview.body
    );
    assert!(
        row_of(behind).contains("left: it does not head a blocked aggregate"),
        "{}",
        preview.body
    );
    let done = post(
        &router,
        "/actions/run",
        &[
            ("action", "retry-blocked"),
            ("id", &head.to_string()),
            ("id", &behind.to_string()),
            ("csrf", &preview.csrf()),
            ("reason", "the broker has room again"),
            ("confirm", &preview.confirm()),
        ],
    )
    .await
    .expect(StatusCode::OK);
    assert!(
        done.body.contains(">retried<") && done.body.contains(">not_blocked_head<"),
        "{}",
        done.body
    );
    let (attempts, due): (i32, bool) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT attempt_count, next_attempt_at <= now() FROM {} WHERE id = $1",
        db.table("outbox_events")
    )))
    .bind(head)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (attempts, due),
        (0, true),
        "the head is due now, attempts reset"
    );
    let audited: i64 = db
        .scalar("SELECT count(*) FROM {s}.outbox_audit WHERE action = 'relay.retry_blocked' AND operator = 'ada'")
        .await;
    assert_eq!(audited, 1);
    db.drop_schema().await;
}

#[tokio::test]
async fn every_relay_repair_runs_through_the_console_and_is_audited() {
    let db = TestDb::new().await;
    let (head, other) = seed_failed(&db).await;
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let published = ops
        .events(&EventFilter {
            status: EventStatus::Published,
            ..EventFilter::default()
        })
        .await
        .unwrap()
        .items[0]
        .id;
    let router = console(&db);

    let done = act(
        &router,
        "skip-failed",
        &other.to_string(),
        "ch-2 was a test charge",
    )
    .await;
    assert!(done.body.contains(">skipped<"), "{}", done.body);
    assert_eq!(status_of(&db, other).await, "skipped");
    let done = act(
        &router,
        "republish",
        &published.to_string(),
        "the projection lost it",
    )
    .await;
    assert!(done.body.contains(">republished<"), "{}", done.body);
    let done = act(
        &router,
        "retry-failed",
        &head.to_string(),
        "the broker is fixed",
    )
    .await;
    assert!(done.body.contains(">retried<"), "{}", done.body);
    // A published event is not a retrying head: the page says what was left.
    let done = act(
        &router,
        "retry-blocked",
        &published.to_string(),
        "try it now",
    )
    .await;
    assert!(done.body.contains(">not_blocked_head<"), "{}", done.body);

    let audit = ops.audit(None, None).await.unwrap();
    let actions: Vec<(&str, &str)> = audit
        .items
        .iter()
        .map(|row| (row.action.as_str(), row.operator.as_str()))
        .collect();
    assert_eq!(
        actions,
        vec![
            ("relay.retry_blocked", "ada"),
            ("relay.retry", "ada"),
            ("relay.republish", "ada"),
            ("relay.skip", "ada"),
        ]
    );
    let shown = get(&router, "/audit").await.expect(StatusCode::OK);
    for reason in [
        "ch-2 was a test charge",
        "the projection lost it",
        "the broker is fixed",
    ] {
        assert!(shown.body.contains(reason), "{}", shown.body);
    }
    db.drop_schema().await;
}
