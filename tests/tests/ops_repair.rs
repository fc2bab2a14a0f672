//! The operations API and the `outbox` tool beyond the scripted incident:
//! skipping a failed head, retrying by filter with a limit, publishing
//! again (the inbox keeps it a duplicate), discarding letters, a requested
//! replay that fails again, retention, paging, consumer figures, and the
//! refusals that keep every repair named, reasoned and bounded.

use outbox_postgres::prelude::*;
use std::process::{Command, Output};
use std::time::Duration;

use outbox_core::Envelope;
use outbox_core::audit::{RepairError, RepairRequest};
use outbox_core::consumer::{
    ConsumerBuilder, ConsumerConfig, HandlerError, Outcome, ReplayOutcome, RetryPolicy, channel,
};
use outbox_core::ops::{
    EventFilter, EventStatus, LetterFilter, LetterKind, MAX_REPAIR_IDS, OpsError, StatusOptions,
};
use outbox_core::relay::{Backoff, Relay, RelayConfig};
use outbox_core::transport::PublishFailure;
use outbox_postgres::Ops;
use outbox_postgres::PgRelayStore;
use outbox_tests::consumers::{create_effects, effects, tick, tick_consumer};
use outbox_tests::events::{CardCharged, Ticked};
use outbox_tests::transports::RecordingTransport;
use outbox_tests::{TestDb, db, wait};
use serde_json::Value;
use uuid::Uuid;

fn tool(db: &TestDb, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_outbox-tool"))
        .env_remove("DATABASE_URL")
        .args([
            "--database-url",
            &db::test_database_url(),
            "--schema",
            db.schema.as_str(),
        ])
        .args(args)
        .env("USER", "ci-operator")
        .output()
        .expect("run outbox-tool")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn request(reason: &str) -> RepairRequest {
    RepairRequest::new("ada", reason).unwrap()
}

fn charge(id: &str, cents: i64) -> CardCharged {
    CardCharged {
        charge_id: id.into(),
        card_number: 4_000_000_000_000_002,
        amount_cents: cents,
    }
}

fn quick_relay_config() -> RelayConfig {
    RelayConfig {
        poll_interval: Duration::from_millis(50),
        backoff: Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(50),
            multiplier: 2.0,
            jitter: 0.0,
        },
        stats_interval: Duration::ZERO,
        ..RelayConfig::default()
    }
}

async fn start_relay(db: &TestDb, transport: RecordingTransport) -> Relay {
    let config = quick_relay_config();
    let store = PgRelayStore::new(
        db.pool.clone(),
        db.schema.clone(),
        config.failed_head_policy,
        config.claim_timeout,
    );
    Relay::start(store, transport, config, "ops").await.unwrap()
}

/// Inserts a failed `card.charged` event for `aggregate` as the relay
/// leaves one, returning its id.
async fn insert_failed(db: &TestDb, aggregate: &str, error: &str) -> Uuid {
    let id = Uuid::now_v7();
    let payload = serde_json::to_string(&charge(aggregate, 1)).unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {}.outbox_events
            (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload,
             status, attempt_count, failed_at, last_error)
         VALUES ($1, 'card', $2, 1, 'card.charged', 1, $3::json, 'failed', 3, now(), $4)",
        db.schema.as_str()
    )))
    .bind(id)
    .bind(aggregate)
    .bind(payload)
    .bind(error)
    .execute(&db.pool)
    .await
    .unwrap();
    id
}

async fn audit_count(db: &TestDb) -> i64 {
    db.scalar("SELECT count(*) FROM {s}.outbox_audit").await
}

#[tokio::test]
async fn a_skipped_head_releases_its_aggregate_and_stays_inspectable() {
    let db = TestDb::new().await;
    let mut tx = db.pool.begin().await.unwrap();
    db.outbox
        .emit_all(
            &mut tx,
            &[charge("ch-1", 1), charge("ch-1", 2), charge("ch-1", 3)],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let transport = RecordingTransport::failing(|e: &Envelope| {
        (e.aggregate_version == 1)
            .then(|| PublishFailure::permanent("schema rejected by the broker"))
    });
    let relay = start_relay(&db, transport.clone()).await;
    wait::until("the head failed", Duration::from_secs(20), || async {
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events WHERE status = 'failed'")
            .await
            == 1
    })
    .await;
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let head = ops
        .events(&EventFilter {
            status: EventStatus::Failed,
            ..EventFilter::default()
        })
        .await
        .unwrap()
        .items[0]
        .id;
    assert_eq!(ops.blocked(10).await.unwrap().len(), 1);

    let report = ops
        .skip_failed(
            &[head],
            &request("v1 of ch-1 was a test charge, never to be sent"),
        )
        .await
        .unwrap();
    assert_eq!(report.count("skipped"), 1);
    wait::until(
        "ch-1 v2 and v3 published",
        Duration::from_secs(20),
        || async { db.published().await == 2 },
    )
    .await;
    relay.drain(Duration::from_secs(5)).await.unwrap();
    let versions: Vec<i64> = transport
        .published()
        .iter()
        .map(|e| e.aggregate_version)
        .collect();
    assert_eq!(versions, vec![2, 3], "the skipped head is never published");

    let skipped = ops.event(head).await.unwrap().unwrap();
    assert_eq!(skipped.status, "skipped");
    assert!(
        skipped
            .last_error
            .as_deref()
            .unwrap()
            .starts_with("skipped by ada: v1 of ch-1 was a test charge, never to be sent (last error: permanent: schema rejected by the broker"),
        "{:?}",
        skipped.last_error
    );
    assert_eq!(skipped.payload["card_number"], "[REDACTED]");
    let status = ops.status(&StatusOptions::default()).await.unwrap();
    assert_eq!(
        (
            status.backlog.failed,
            status.backlog.skipped,
            status.blocked.len()
        ),
        (0, 1, 0)
    );
    assert!(status.problems.is_empty(), "{:?}", status.problems);
    let listed = ops
        .events(&EventFilter {
            status: EventStatus::Skipped,
            ..EventFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    // Skipping it again: it is not failed any more.
    let again = ops.skip_failed(&[head], &request("again")).await.unwrap();
    assert_eq!(again.outcomes[0].outcome, "not_failed");
    assert_eq!(
        again.outcomes[0].detail.as_deref(),
        Some("its status is skipped")
    );
    let audit = ops.audit(None, None).await.unwrap();
    assert_eq!(audit.items.len(), 2);
    assert_eq!(audit.items[1].action, "relay.skip");
    assert_eq!(audit.items[1].operator, "ada");
    db.drop_schema().await;
}

#[tokio::test]
async fn a_repair_by_filter_takes_at_most_its_limit_oldest_first() {
    let db = TestDb::new().await;
    let first = insert_failed(&db, "a", "broker said no").await;
    let second = insert_failed(&db, "b", "broker said no").await;
    let third = insert_failed(&db, "c", "broker said no").await;
    let _other = insert_failed(&db, "d", "quota exceeded").await;

    let both = tool(
        &db,
        &[
            "failed",
            "retry",
            "--id",
            &first.to_string(),
            "--event-type",
            "card.charged",
            "--reason",
            "x",
        ],
    );
    assert_eq!(both.status.code(), Some(2));
    assert!(stderr(&both).contains("not both"), "{}", stderr(&both));

    let retried = tool(
        &db,
        &[
            "--json",
            "failed",
            "retry",
            "--error",
            "said no",
            "--limit",
            "2",
            "--yes",
            "--reason",
            "the broker accepts them again",
        ],
    );
    assert_eq!(retried.status.code(), Some(0), "{}", stderr(&retried));
    let report: Value = serde_json::from_str(&stdout(&retried)).unwrap();
    let ids: Vec<&str> = report["outcomes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![first.to_string(), second.to_string()]);
    let pending: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {}.outbox_events WHERE status = 'pending' AND attempt_count = 0 ORDER BY seq",
        db.schema.as_str()
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(pending, vec![first, second], "retried with attempts reset");
    let failed: Vec<Uuid> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM {}.outbox_events WHERE status = 'failed' ORDER BY seq",
        db.schema.as_str()
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(failed.len(), 2);
    assert_eq!(failed[0], third);

    let nothing = tool(
        &db,
        &[
            "failed",
            "retry",
            "--aggregate-id",
            "zz",
            "--limit",
            "5",
            "--yes",
            "--reason",
            "x",
        ],
    );
    assert_eq!(nothing.status.code(), Some(2));
    assert!(stderr(&nothing).contains("nothing was changed"));
    assert_eq!(audit_count(&db).await, 1);
    db.drop_schema().await;
}

#[tokio::test]
async fn a_republished_event_keeps_its_id_and_the_inbox_drops_it() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let mut tx = db.pool.begin().await.unwrap();
    let id = db
        .outbox
        .emit(&mut tx, &charge("ch-9", 900))
        .await
        .unwrap()
        .event_id;
    tx.commit().await.unwrap();
    let transport = RecordingTransport::new();
    let relay = start_relay(&db, transport.clone()).await;
    wait::until("published", Duration::from_secs(20), || async {
        transport.published_count() == 1
    })
    .await;
    let consumer = outbox_core::consumer::ConsumerBuilder::new("ledger")
        .on_fn::<CardCharged, _>(outbox_tests::consumers::effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let first = transport.published()[0].clone();
    assert!(matches!(
        consumer.handle_envelope(&first).await.unwrap(),
        Outcome::Applied
    ));

    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let unknown = Uuid::now_v7();
    let report = ops
        .republish(&[id, unknown], &request("the ledger's stream was purged"))
        .await
        .unwrap();
    assert_eq!(report.outcomes[0].outcome, "republished");
    assert_eq!(report.outcomes[1].outcome, "not_found");
    wait::until("published again", Duration::from_secs(20), || async {
        transport.published().iter().filter(|e| e.id == id).count() == 2
    })
    .await;
    relay.drain(Duration::from_secs(5)).await.unwrap();
    let again = transport
        .published()
        .into_iter()
        .filter(|e| e.id == id)
        .nth(1)
        .unwrap();
    assert_eq!(again.id, first.id, "the same event id");
    assert_eq!(again.payload.get(), first.payload.get());
    assert!(matches!(
        consumer.handle_envelope(&again).await.unwrap(),
        Outcome::Duplicate
    ));
    assert_eq!(effects(&db, "ledger").await.len(), 1);
    db.drop_schema().await;
}

#[tokio::test]
async fn only_published_events_are_republished() {
    let db = TestDb::new().await;
    let failed = insert_failed(&db, "x", "no").await;
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let report = ops.republish(&[failed], &request("try")).await.unwrap();
    assert_eq!(report.outcomes[0].outcome, "not_published");
    assert_eq!(
        report.outcomes[0].detail.as_deref(),
        Some("its status is failed")
    );
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events WHERE status = 'failed'")
            .await,
        1
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn refused_repairs_change_nothing_and_write_no_audit_row() {
    let db = TestDb::new().await;
    let failed = insert_failed(&db, "x", "no").await;
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    assert!(matches!(
        ops.retry_failed(&[], &request("r")).await,
        Err(OpsError::Refused(RepairError::NoIds))
    ));
    let many = vec![failed; MAX_REPAIR_IDS + 1];
    assert!(matches!(
        ops.retry_failed(&many, &request("r")).await,
        Err(OpsError::TooMany { given, max }) if given == MAX_REPAIR_IDS + 1 && max == MAX_REPAIR_IDS
    ));
    assert!(matches!(
        RepairRequest::new("ada", "  "),
        Err(RepairError::MissingReason)
    ));
    let no_reason = tool(&db, &["failed", "skip", "--id", &failed.to_string()]);
    assert_eq!(no_reason.status.code(), Some(2));
    assert!(stderr(&no_reason).contains("needs a reason"));
    let no_ids = tool(
        &db,
        &[
            "dead-letters",
            "--consumer",
            "c",
            "discard",
            "--reason",
            "r",
        ],
    );
    assert_eq!(no_ids.status.code(), Some(2));
    assert!(stderr(&no_ids).contains("there is no repair of everything"));
    let no_limit = tool(
        &db,
        &[
            "quarantine",
            "--consumer",
            "c",
            "replay",
            "--event-type",
            "x",
            "--reason",
            "r",
        ],
    );
    assert_eq!(no_limit.status.code(), Some(2));
    assert!(stderr(&no_limit).contains("explicit --limit"));
    assert_eq!(audit_count(&db).await, 0);
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events WHERE status = 'failed'")
            .await,
        1
    );
    db.drop_schema().await;
}

fn dead_letter_config() -> ConsumerConfig {
    ConsumerConfig {
        retry: RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        sweep_interval: Duration::from_millis(100),
        ..ConsumerConfig::default()
    }
}

#[tokio::test]
async fn discarded_letters_are_closed_with_who_and_why() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let consumer = tick_consumer(
        &db,
        "billing",
        dead_letter_config(),
        Duration::ZERO,
        &["c1"],
    );
    for version in 1..=3 {
        assert!(matches!(
            consumer
                .handle_envelope(&tick("c1", version))
                .await
                .unwrap(),
            Outcome::DeadLettered { .. }
        ));
    }
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let open = ops
        .letters(&LetterFilter {
            consumer: "billing".into(),
            kind: LetterKind::DeadLettered,
            ..LetterFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(open.items.len(), 3);
    let first = open.items[0].id;

    // By filter: the limit takes the oldest two.
    let discarded = tool(
        &db,
        &[
            "--json",
            "dead-letters",
            "--consumer",
            "billing",
            "discard",
            "--aggregate-id",
            "c1",
            "--limit",
            "2",
            "--yes",
            "--reason",
            "c1 was closed by hand in the ledger",
        ],
    );
    assert_eq!(discarded.status.code(), Some(0), "{}", stderr(&discarded));
    let report: Value = serde_json::from_str(&stdout(&discarded)).unwrap();
    assert_eq!(report["outcomes"][0]["id"], first.to_string());
    assert_eq!(report["outcomes"][1]["outcome"], "discarded");

    let still_open = ops
        .letters(&LetterFilter {
            consumer: "billing".into(),
            kind: LetterKind::DeadLettered,
            ..LetterFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(still_open.items.len(), 1);
    let all = ops
        .letters(&LetterFilter {
            consumer: "billing".into(),
            kind: LetterKind::DeadLettered,
            include_resolved: true,
            ..LetterFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(all.items.len(), 3);
    assert_eq!(
        all.items[0].resolution.as_deref(),
        Some("discarded by ci-operator: c1 was closed by hand in the ledger")
    );
    // A discarded letter is not replayed.
    let replay = consumer.replay(&[first], &request("r")).await.unwrap();
    assert_eq!(replay.letters[0].1, ReplayOutcome::NotFound);
    let asked = ops
        .request_replay("billing", LetterKind::DeadLettered, &[first], &request("r"))
        .await
        .unwrap();
    assert_eq!(asked.outcomes[0].outcome, "already_resolved");
    // Letters are repaired by their kind: a dead letter is not in quarantine.
    let open_id = still_open.items[0].id.to_string();
    let wrong = tool(
        &db,
        &[
            "--json",
            "quarantine",
            "discard",
            "--consumer",
            "billing",
            "--id",
            &open_id,
            "--reason",
            "r",
        ],
    );
    assert_eq!(wrong.status.code(), Some(1), "{}", stderr(&wrong));
    let wrong: Value = serde_json::from_slice(&wrong.stdout).unwrap();
    assert_eq!(wrong["outcomes"][0]["outcome"], "wrong_kind");
    assert!(
        ops.letter("billing", still_open.items[0].id)
            .await
            .unwrap()
            .unwrap()
            .resolved_at
            .is_none()
    );
    // Nobody runs the consumer: --wait gives up with exit 1; the request
    // stays, and a second one is refused as already asked for.
    let waited = tool(
        &db,
        &[
            "dead-letters",
            "--consumer",
            "billing",
            "replay",
            "--aggregate-id",
            "c1",
            "--limit",
            "1",
            "--yes",
            "--reason",
            "r",
            "--wait",
            "1s",
        ],
    );
    assert_eq!(waited.status.code(), Some(1), "{}", stderr(&waited));
    assert!(
        stderr(&waited).contains("did not run within 1s"),
        "{}",
        stderr(&waited)
    );
    assert!(stdout(&waited).contains("not_run"), "{}", stdout(&waited));
    let second_ask = ops
        .request_replay(
            "billing",
            LetterKind::DeadLettered,
            &[still_open.items[0].id],
            &request("two"),
        )
        .await
        .unwrap();
    assert_eq!(second_ask.outcomes[0].outcome, "already_requested");
    let out_of_range = tool(
        &db,
        &[
            "dead-letters",
            "--consumer",
            "billing",
            "replay",
            "--aggregate-id",
            "c1",
            "--limit",
            "0",
            "--yes",
            "--reason",
            "r",
        ],
    );
    assert_eq!(out_of_range.status.code(), Some(2));
    assert!(
        stderr(&out_of_range).contains("out of range"),
        "{}",
        stderr(&out_of_range)
    );
    // The quarantine view does not mix in dead letters.
    let wrong_kind = tool(
        &db,
        &[
            "quarantine",
            "--consumer",
            "billing",
            "show",
            &first.to_string(),
        ],
    );
    assert_eq!(wrong_kind.status.code(), Some(2));
    assert!(stderr(&wrong_kind).contains("is dead_lettered, not quarantined"));
    assert!(effects(&db, "billing").await.is_empty());
    db.drop_schema().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requested_replay_that_fails_again_leaves_the_letter_open_and_exits_1() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let consumer = tick_consumer(
        &db,
        "billing",
        dead_letter_config(),
        Duration::ZERO,
        &["c1"],
    );
    assert!(matches!(
        consumer.handle_envelope(&tick("c1", 1)).await.unwrap(),
        Outcome::DeadLettered { .. }
    ));
    let letter: i64 = db.scalar("SELECT id FROM {s}.outbox_dead_letters").await;
    let (sender, source) = channel();
    let task = consumer.clone().spawn(source);
    let output = tool(
        &db,
        &[
            "dead-letters",
            "--consumer",
            "billing",
            "replay",
            "--id",
            &letter.to_string(),
            "--reason",
            "downstream should be back",
            "--wait",
            "20s",
        ],
    );
    assert_eq!(
        output.status.code(),
        Some(1),
        "{}{}",
        stdout(&output),
        stderr(&output)
    );
    assert!(
        stdout(&output).contains("downstream refuses counter c1"),
        "{}",
        stdout(&output)
    );
    assert!(
        stdout(&output).contains("0 of 1 replay(s)"),
        "{}",
        stdout(&output)
    );
    drop(sender);
    task.drain(Duration::from_secs(5)).await.unwrap();

    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let after = ops.letter("billing", letter).await.unwrap().unwrap();
    assert!(after.resolved_at.is_none(), "still open");
    assert!(
        after.replay_requested_at.is_none(),
        "not run again on its own"
    );
    assert_eq!(
        after.last_replay_error.as_deref(),
        Some("downstream refuses counter c1")
    );
    let audit = ops.audit(None, None).await.unwrap();
    let outcomes: Vec<&str> = audit.items[0]
        .outcomes
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["replay_requested", "failed"]);
    db.drop_schema().await;
}

#[tokio::test]
async fn cleanup_is_a_dry_run_until_executed_with_a_reason() {
    let db = TestDb::new().await;
    db.execute(
        "INSERT INTO {s}.outbox_events
            (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload,
             status, published_at, created_at)
         SELECT gen_random_uuid(), 'card', 'old-' || n, 1, 'card.charged', 1, '{}', 'published',
                now() - interval '10 days', now() - interval '10 days'
         FROM generate_series(1, 5) n",
    )
    .await;
    db.execute(
        "INSERT INTO {s}.outbox_events
            (id, aggregate_type, aggregate_id, aggregate_version, event_type, schema_version, payload,
             status, published_at, created_at)
         VALUES (gen_random_uuid(), 'card', 'new', 1, 'card.charged', 1, '{}', 'published', now(), now()),
                (gen_random_uuid(), 'card', 'stuck', 1, 'card.charged', 1, '{}', 'pending', NULL,
                 now() - interval '10 days')",
    )
    .await;

    let dry = tool(&db, &["cleanup", "--older-than", "7d"]);
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    assert!(
        stdout(&dry).contains("dry run: 5 published events are older than 7d 0h"),
        "{}",
        stdout(&dry)
    );
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events")
            .await,
        7
    );
    let no_reason = tool(&db, &["cleanup", "--older-than", "7d", "--execute"]);
    assert_eq!(no_reason.status.code(), Some(2));
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_events")
            .await,
        7
    );

    let done = tool(
        &db,
        &[
            "--json",
            "cleanup",
            "--older-than",
            "7d",
            "--execute",
            "--batch",
            "2",
            "--reason",
            "retention is 7 days",
        ],
    );
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    let report: Value = serde_json::from_str(&stdout(&done)).unwrap();
    assert_eq!(report["eligible"], 5);
    assert_eq!(report["deleted"], 5);
    assert_eq!(report["executed"], true);
    let left: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT aggregate_id FROM {}.outbox_events ORDER BY aggregate_id",
        db.schema.as_str()
    )))
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(left, vec!["new", "stuck"], "pending and recent rows stay");
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let audit = ops.audit(None, None).await.unwrap();
    assert_eq!(audit.items.len(), 1);
    assert_eq!(audit.items[0].action, "relay.cleanup");
    assert_eq!(audit.items[0].outcomes[0]["deleted"], 5);
    db.drop_schema().await;
}

#[tokio::test]
async fn listings_page_with_a_cursor() {
    let db = TestDb::new().await;
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(insert_failed(&db, &format!("p{n}"), "no").await);
    }
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let mut seen = Vec::new();
    let mut after = None;
    let mut pages = 0;
    loop {
        let page = ops
            .events(&EventFilter {
                status: EventStatus::Failed,
                limit: Some(2),
                after,
                ..EventFilter::default()
            })
            .await
            .unwrap();
        pages += 1;
        seen.extend(page.items.iter().map(|e| e.id));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, ids);
    assert_eq!(pages, 3);
    let filtered = ops
        .events(&EventFilter {
            status: EventStatus::Failed,
            aggregate_id: Some("p3".into()),
            ..EventFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(filtered.items.len(), 1);
    assert_eq!(filtered.items[0].id, ids[3]);
    let cli: Value = serde_json::from_str(&stdout(&tool(
        &db,
        &["--json", "failed", "list", "--limit", "2"],
    )))
    .unwrap();
    assert_eq!(cli["items"].as_array().unwrap().len(), 2);
    let next = cli["next"].as_i64().unwrap().to_string();
    let second: Value = serde_json::from_str(&stdout(&tool(
        &db,
        &["--json", "failed", "list", "--limit", "2", "--after", &next],
    )))
    .unwrap();
    assert_eq!(second["items"][0]["id"], ids[2].to_string());
    db.drop_schema().await;
}

#[tokio::test]
async fn status_shows_what_each_consumer_did() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let config = ConsumerConfig {
        sweep_interval: Duration::from_millis(100),
        ..ConsumerConfig::default()
    };
    let consumer = tick_consumer(&db, "counter", config, Duration::ZERO, &[]);
    let (sender, source) = channel();
    let task = consumer.spawn(source);
    let first = tick("c1", 1);
    sender.send(&first).unwrap();
    sender.send(&tick("c1", 2)).unwrap();
    sender.send(&first).unwrap();
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    wait::until("stats flushed", Duration::from_secs(20), || async {
        let status = ops.status(&StatusOptions::default()).await.unwrap();
        status
            .consumers
            .iter()
            .any(|c| c.consumer == "counter" && c.applied == 2 && c.duplicates == 1)
    })
    .await;
    drop(sender);
    task.drain(Duration::from_secs(5)).await.unwrap();
    let status = ops.status(&StatusOptions::default()).await.unwrap();
    let counter = &status.consumers[0];
    assert!(counter.lag_seconds.unwrap() >= 0.0);
    assert!(counter.last_applied_at.is_some());
    assert!(status.problems.is_empty(), "{:?}", status.problems);
    // A lag above the threshold is a problem.
    let strict = ops
        .status(&StatusOptions {
            max_consumer_lag: Duration::ZERO,
            ..StatusOptions::default()
        })
        .await
        .unwrap();
    assert!(
        strict
            .problems
            .iter()
            .any(|p| p.contains("consumer counter")),
        "{:?}",
        strict.problems
    );
    db.drop_schema().await;
}

#[test]
fn the_tool_explains_bad_usage_with_exit_code_2() {
    let help = Command::new(env!("CARGO_BIN_EXE_outbox-tool"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("Exit codes: 0 ok; 1"));

    let no_database = Command::new(env!("CARGO_BIN_EXE_outbox-tool"))
        .env_remove("DATABASE_URL")
        .arg("status")
        .output()
        .unwrap();
    assert_eq!(no_database.status.code(), Some(2));
    assert!(stderr(&no_database).contains("pass --database-url or set DATABASE_URL"));

    let unreachable = Command::new(env!("CARGO_BIN_EXE_outbox-tool"))
        .args([
            "--database-url",
            "postgres://postgres@127.0.0.1:1/none",
            "status",
        ])
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(2));
    assert!(stderr(&unreachable).contains("cannot connect to the database"));

    let bad_schema = Command::new(env!("CARGO_BIN_EXE_outbox-tool"))
        .args([
            "--database-url",
            "postgres://postgres@127.0.0.1:1/none",
            "--schema",
            "app; DROP TABLE x",
            "status",
        ])
        .output()
        .unwrap();
    assert_eq!(bad_schema.status.code(), Some(2));
    assert!(
        stderr(&bad_schema).contains("schema"),
        "{}",
        stderr(&bad_schema)
    );

    let unknown = Command::new(env!("CARGO_BIN_EXE_outbox-tool"))
        .arg("frobnicate")
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(2));
}

#[tokio::test]
async fn a_strict_consumer_passes_a_version_the_producer_skipped() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    let config = ConsumerConfig {
        ordering: outbox_core::consumer::Ordering::Strict {
            park_timeout: Duration::from_millis(100),
        },
        ..ConsumerConfig::default()
    };
    let consumer = tick_consumer(&db, "strict", config, Duration::ZERO, &[]);
    assert!(matches!(
        consumer.handle_envelope(&tick("c1", 1)).await.unwrap(),
        Outcome::Applied
    ));
    // Version 2 was skipped at the producer: it never comes.
    assert!(matches!(
        consumer.handle_envelope(&tick("c1", 3)).await.unwrap(),
        Outcome::Parked { waiting_for: 2 }
    ));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(consumer.sweep().await.unwrap().dead_lettered, 1);
    let letter: i64 = db.scalar("SELECT id FROM {s}.outbox_dead_letters").await;

    // Only from the version before: passing 3 from position 1 is refused.
    let early = tool(
        &db,
        &[
            "positions",
            "--consumer",
            "strict",
            "pass",
            "--aggregate-type",
            "counter",
            "--aggregate-id",
            "c1",
            "--version",
            "3",
            "--reason",
            "v2 skipped",
        ],
    );
    assert_eq!(early.status.code(), Some(1), "{}", stderr(&early));
    assert!(
        stdout(&early).contains("the position is 1; only a position at 2 can pass version 3"),
        "{}",
        stdout(&early)
    );
    let passed = tool(
        &db,
        &[
            "positions",
            "--consumer",
            "strict",
            "pass",
            "--aggregate-type",
            "counter",
            "--aggregate-id",
            "c1",
            "--version",
            "2",
            "--reason",
            "v2 was skipped at the producer (audit row 7 there)",
        ],
    );
    assert_eq!(passed.status.code(), Some(0), "{}", stderr(&passed));
    let shown: Value = serde_json::from_str(&stdout(&tool(
        &db,
        &[
            "--json",
            "positions",
            "--consumer",
            "strict",
            "show",
            "--aggregate-type",
            "counter",
            "--aggregate-id",
            "c1",
        ],
    )))
    .unwrap();
    assert_eq!(shown["version"], 2);

    let replay = consumer
        .replay(&[letter], &request("v2 passed"))
        .await
        .unwrap();
    assert_eq!(replay.letters[0].1, ReplayOutcome::Applied);
    let applied: Vec<i64> = effects(&db, "strict")
        .await
        .iter()
        .map(|e| e.aggregate_version)
        .collect();
    assert_eq!(applied, vec![1, 3]);
    let actions: Vec<String> = Ops::new(db.pool.clone(), db.schema.clone())
        .audit(None, None)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|a| a.action)
        .collect();
    assert_eq!(
        actions,
        vec![
            "consumer.replay",
            "consumer.pass_version",
            "consumer.pass_version"
        ]
    );
    db.drop_schema().await;
}

#[tokio::test]
async fn cleanup_keeps_idempotency_keys_for_their_own_retention() {
    let db = TestDb::new().await;
    let keyed = |cents: i64| {
        let (pool, outbox) = (db.pool.clone(), db.outbox.clone());
        async move {
            let mut tx = pool.begin().await.unwrap();
            let outcome = outbox
                .emit_with(
                    &mut tx,
                    &charge("ch-1", cents),
                    outbox_core::EmitOptions {
                        idempotency_key: Some("charge-command-1".into()),
                        ..outbox_core::EmitOptions::default()
                    },
                )
                .await
                .unwrap();
            tx.commit().await.unwrap();
            outcome
        }
    };
    assert!(matches!(
        keyed(100).await,
        outbox_core::EmitOutcome::Emitted(_)
    ));
    // Published two hours ago; the key is as old.
    db.execute(
        "UPDATE {s}.outbox_events SET status = 'published',
            published_at = now() - interval '2 hours', created_at = now() - interval '2 hours'",
    )
    .await;
    db.execute("UPDATE {s}.outbox_idempotency_keys SET created_at = now() - interval '2 hours'")
        .await;

    let dry = tool(&db, &["cleanup", "--older-than", "1h"]);
    assert_eq!(dry.status.code(), Some(0), "{}", stderr(&dry));
    assert!(
        stdout(&dry).contains("idempotency keys"),
        "the dry run says what happens to keys: {}",
        stdout(&dry)
    );
    let done = tool(
        &db,
        &[
            "--json",
            "cleanup",
            "--older-than",
            "1h",
            "--execute",
            "--reason",
            "hourly retention of published rows",
        ],
    );
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    let report: Value = serde_json::from_str(&stdout(&done)).unwrap();
    assert_eq!(report["deleted"], 1);
    assert_eq!(
        report["keys_deleted"], 0,
        "keys younger than the key retention (7 days) stay: {report}"
    );
    assert_eq!(
        db.scalar::<i64>("SELECT count(*) FROM {s}.outbox_idempotency_keys")
            .await,
        1
    );
    // The client retries its command: still one event.
    assert!(
        matches!(keyed(100).await, outbox_core::EmitOutcome::Duplicate { .. }),
        "a retried command within the key retention is a duplicate"
    );

    // A shorter key retention only when asked for.
    let keys = tool(
        &db,
        &[
            "--json",
            "cleanup",
            "--older-than",
            "1h",
            "--keys-older-than",
            "1h",
            "--execute",
            "--reason",
            "clients retry for at most an hour",
        ],
    );
    assert_eq!(keys.status.code(), Some(0), "{}", stderr(&keys));
    let report: Value = serde_json::from_str(&stdout(&keys)).unwrap();
    assert_eq!(report["keys_deleted"], 1, "{report}");
    db.drop_schema().await;
}

/// Emits versions 1..=3 of `aggregate`, marks 1 and 2 published and
/// leaves 3 as the relay leaves a head whose publish failed and waits for
/// its retry at `retry_in` from now; returns the three ids.
async fn retrying_head_after_two_published(
    db: &TestDb,
    aggregate: &str,
    retry_in: &str,
) -> Vec<Uuid> {
    let mut tx = db.pool.begin().await.unwrap();
    let emitted = db
        .outbox
        .emit_all(
            &mut tx,
            &[
                charge(aggregate, 1),
                charge(aggregate, 2),
                charge(aggregate, 3),
            ],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let ids: Vec<Uuid> = emitted.iter().map(|e| e.event_id).collect();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {}.outbox_events SET status = 'published', published_at = now(), attempt_count = 1
         WHERE id = ANY($1)",
        db.schema.as_str()
    )))
    .bind(&ids[..2])
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "WITH head AS (
            UPDATE {s}.outbox_events SET attempt_count = 2, last_error = 'broker timed out',
                   next_attempt_at = now() + $2::interval
            WHERE id = $1 RETURNING aggregate_type, aggregate_id, id)
         INSERT INTO {s}.outbox_blocked_aggregates (aggregate_type, aggregate_id, head_event_id)
         SELECT * FROM head",
        s = db.schema.as_str()
    )))
    .bind(ids[2])
    .bind(retry_in)
    .execute(&db.pool)
    .await
    .unwrap();
    ids
}

#[tokio::test]
async fn a_version_republished_behind_a_retrying_head_is_published_first_and_the_head_can_be_retried_now()
 {
    let db = TestDb::new().await;
    let ids = retrying_head_after_two_published(&db, "ch-1", "-1 second").await;
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let report = ops
        .republish(&ids[..1], &request("billing lost v1"))
        .await
        .unwrap();
    assert_eq!(report.count("republished"), 1);
    // The claim outside a worker takes the republished version, then the
    // due head, in version order.
    let store = PgRelayStore::new(
        db.pool.clone(),
        db.schema.clone(),
        outbox_core::relay::FailedHeadPolicy::Block,
        Duration::from_secs(120),
    );
    {
        use outbox_core::relay::{ClaimedBatch, RelayStore};
        let batch = store.claim(10).await.unwrap();
        let versions: Vec<i64> = batch
            .events()
            .iter()
            .map(|e| e.envelope.aggregate_version)
            .collect();
        assert_eq!(
            versions,
            vec![1, 3],
            "the republished lower version is not stuck behind the blocked head"
        );
        batch.release().await.unwrap();
    }
    // Relay workers publish them in the same order.
    let transport = RecordingTransport::new();
    let relay = start_relay(&db, transport.clone()).await;
    wait::until("v1 and v3 published", Duration::from_secs(20), || async {
        transport.published_count() == 2
    })
    .await;
    relay.drain(Duration::from_secs(5)).await.unwrap();
    let versions: Vec<i64> = transport
        .published()
        .iter()
        .map(|e| e.aggregate_version)
        .collect();
    assert_eq!(versions, vec![1, 3]);

    // A head whose next retry is an hour away: the operator retries it now.
    let ids = retrying_head_after_two_published(&db, "ch-2", "1 hour").await;
    let blocked = tool(&db, &["blocked", "list"]);
    assert!(stdout(&blocked).contains("ch-2"), "{}", stdout(&blocked));
    let head = ids[2].to_string();
    let retried = tool(
        &db,
        &[
            "blocked",
            "retry",
            "--id",
            &head,
            "--reason",
            "the broker is back; do not wait an hour",
        ],
    );
    assert_eq!(retried.status.code(), Some(0), "{}", stderr(&retried));
    let due: bool = db
        .scalar(&format!(
            "SELECT next_attempt_at <= now() FROM {{s}}.outbox_events WHERE id = '{head}'"
        ))
        .await;
    assert!(due, "the head is due now");
    let audit = ops.audit(None, None).await.unwrap();
    assert_eq!(audit.items[0].action, "relay.retry_blocked");
    db.drop_schema().await;
}

#[tokio::test]
async fn the_tool_groups_letters_by_error_fingerprint_and_repairs_a_group_up_to_a_limit() {
    let db = TestDb::new().await;
    create_effects(&db).await;
    // The oldest letter fails another way than the three after it.
    let consumer = ConsumerBuilder::new("billing")
        .config(dead_letter_config())
        .on_fn::<Ticked, _>(|received, _| {
            let counter = received.event.counter.clone();
            Box::pin(async move {
                Err(if counter == "c0" {
                    HandlerError::retryable("the ledger is locked for 30 s")
                } else {
                    HandlerError::retryable(format!("downstream refuses counter {counter}"))
                })
            })
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    for counter in ["c0", "c1", "c2", "c3"] {
        assert!(matches!(
            consumer.handle_envelope(&tick(counter, 1)).await.unwrap(),
            Outcome::DeadLettered { .. }
        ));
    }
    let grouped = tool(
        &db,
        &[
            "--json",
            "dead-letters",
            "--consumer",
            "billing",
            "list",
            "--group",
        ],
    );
    assert_eq!(grouped.status.code(), Some(0), "{}", stderr(&grouped));
    let report: Value = serde_json::from_str(&stdout(&grouped)).unwrap();
    assert_eq!(report["letters"], 4);
    assert_eq!(report["truncated"], false);
    let groups = report["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "two failures: {report}");
    assert_eq!(groups[0]["count"], 3, "the largest first: {report}");
    assert_eq!(groups[1]["count"], 1);
    let fingerprint = groups[0]["fingerprint"].as_str().unwrap().to_owned();
    let ops = Ops::new(db.pool.clone(), db.schema.clone());
    let open = ops
        .letters(&LetterFilter {
            consumer: "billing".into(),
            kind: LetterKind::DeadLettered,
            ..LetterFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        fingerprint,
        outbox_core::ops::format::error_fingerprint(&open.items[1].reason),
        "the tool and the console share one fingerprint"
    );
    let human = tool(
        &db,
        &["dead-letters", "--consumer", "billing", "list", "--group"],
    );
    let text = stdout(&human);
    assert!(
        text.contains(&fingerprint) && text.contains("downstream refuses counter <id>"),
        "{text}"
    );

    // Paged one at a time, the cursor goes on within the group.
    let first = tool(
        &db,
        &[
            "--json",
            "dead-letters",
            "--consumer",
            "billing",
            "list",
            "--fingerprint",
            &fingerprint.to_uppercase(),
            "--limit",
            "1",
        ],
    );
    let first: Value = serde_json::from_str(&stdout(&first)).unwrap();
    assert_eq!(first["items"][0]["id"], open.items[1].id, "{first}");
    let next = first["next"].as_i64().expect("a next page").to_string();
    let second = tool(
        &db,
        &[
            "--json",
            "dead-letters",
            "--consumer",
            "billing",
            "list",
            "--fingerprint",
            &fingerprint,
            "--limit",
            "1",
            "--after",
            &next,
        ],
    );
    let second: Value = serde_json::from_str(&stdout(&second)).unwrap();
    assert_eq!(second["items"][0]["id"], open.items[2].id, "{second}");

    // A group's oldest two, discarded by fingerprint (the older letter of
    // the other failure stays).
    let discarded = tool(
        &db,
        &[
            "--json",
            "dead-letters",
            "--consumer",
            "billing",
            "discard",
            "--fingerprint",
            &fingerprint,
            "--limit",
            "2",
            "--yes",
            "--reason",
            "settled by hand",
        ],
    );
    assert_eq!(discarded.status.code(), Some(0), "{}", stderr(&discarded));
    let report: Value = serde_json::from_str(&stdout(&discarded)).unwrap();
    assert_eq!(report["outcomes"][0]["id"], open.items[1].id.to_string());
    assert_eq!(report["outcomes"][1]["id"], open.items[2].id.to_string());
    let listed = tool(
        &db,
        &[
            "--json",
            "dead-letters",
            "--consumer",
            "billing",
            "list",
            "--fingerprint",
            &fingerprint,
        ],
    );
    let page: Value = serde_json::from_str(&stdout(&listed)).unwrap();
    assert_eq!(page["items"].as_array().unwrap().len(), 1);
    assert_eq!(page["items"][0]["id"], open.items[3].id);
    assert_eq!(page["next"], Value::Null);
    let unknown = tool(
        &db,
        &[
            "dead-letters",
            "--consumer",
            "billing",
            "discard",
            "--fingerprint",
            "000000000000",
            "--limit",
            "5",
            "--yes",
            "--reason",
            "r",
        ],
    );
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        stderr(&unknown).contains("no open letter with fingerprint"),
        "{}",
        stderr(&unknown)
    );
    db.drop_schema().await;
}
