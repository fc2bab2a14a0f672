//! Redaction holds everywhere a payload could show: the `Debug` output of
//! the types that carry one (`Envelope`, `Incoming`, `ClaimedEvent`,
//! `EventDraft`), decode errors (serde quotes the offending value; here a
//! secret of the wrong type), the quarantine reason stored in the
//! database, the outcome handed back, and everything logged through
//! `tracing` on the way. The secret never appears.

use outbox_postgres::prelude::*;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};

use outbox_core::consumer::{ConsumerBuilder, HandlerError, Incoming, Outcome};
use outbox_core::relay::ClaimedEvent;
use outbox_core::{Envelope, EventDraft, OutboxEvent, ce};
use outbox_tests::TestDb;
use outbox_tests::consumers::{
    create_effects, effect_handler, letters, record_effect, strict_config,
};
use outbox_tests::events::CardCharged;
use serde_json::value::RawValue;

const SECRET_NUMBER: u64 = 4_111_999_988_887_777;
const SECRET_TEXT: &str = "4111-SECRET-7777";

/// Everything written through `tracing`, at every level.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// The tracing output of this test binary (installed once, shared by its
/// tests: each asserts that no secret shows in any of it).
fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        let writer = captured.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        captured
    })
}

fn assert_hidden(what: &str, text: &str) {
    for secret in [SECRET_NUMBER.to_string(), SECRET_TEXT.to_owned()] {
        assert!(!text.contains(&secret), "{what} shows the secret: {text}");
    }
}

fn charge() -> CardCharged {
    CardCharged {
        charge_id: "ch-1".into(),
        card_number: SECRET_NUMBER,
        amount_cents: 1250,
    }
}

#[tokio::test]
async fn a_redacted_field_never_shows_in_debug_output_errors_stored_reasons_or_logs() {
    let captured = captured();

    // Debug output of every type that carries a payload.
    let envelope = Envelope::for_event(&charge(), 1).unwrap();
    assert!(envelope.payload.get().contains(&SECRET_NUMBER.to_string()));
    let shown = format!("{envelope:?} {envelope} {envelope:#?}");
    assert_hidden("Envelope", &shown);
    assert!(
        shown.contains("[REDACTED]") && shown.contains("1250"),
        "{shown}"
    );
    assert_hidden(
        "EventDraft",
        &format!("{:?}", EventDraft::new(&charge()).unwrap()),
    );
    assert_hidden(
        "ClaimedEvent",
        &format!(
            "{:?}",
            ClaimedEvent {
                envelope: envelope.clone(),
                attempts: 0,
                unreadable: None,
            }
        ),
    );
    assert_hidden(
        "Incoming",
        &format!("{:?}", Incoming::from_envelope(&envelope, 1)),
    );

    // A secret of the wrong type: serde's error would quote it.
    let mut wrong = envelope.clone();
    wrong.id = uuid::Uuid::now_v7();
    wrong.payload = RawValue::from_string(format!(
        r#"{{"charge_id":"ch-1","card_number":"{SECRET_TEXT}","amount_cents":1250}}"#
    ))
    .unwrap();
    assert_hidden("Envelope with a wrong type", &format!("{wrong:?}"));
    let error = CardCharged::decode(1, &wrong.payload).unwrap_err();
    let mut chain = format!("{error} {error:?}");
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        chain.push_str(&format!(" {cause} {cause:?}"));
        source = cause.source();
    }
    assert_hidden("DecodeError and its sources", &chain);
    assert!(chain.contains("expected u64"), "{chain}");

    // Through a consumer: quarantined with a reason that names the
    // problem, not the value.
    let db = TestDb::new().await;
    create_effects(&db).await;
    let consumer = ConsumerBuilder::new("cards")
        .on_fn::<CardCharged, _>(effect_handler(db.table("effects")))
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let outcome = consumer.handle_envelope(&wrong).await.unwrap();
    let Outcome::Quarantined { reason } = &outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        reason.contains("card.charged v1") && reason.contains("expected u64"),
        "{reason}"
    );
    assert_hidden("Outcome", &format!("{outcome:?}"));
    let stored = letters(&db, "cards").await;
    assert_eq!(stored.len(), 1);
    assert_hidden("the stored reason", &stored[0].reason);
    // The raw message is kept (for a replay after a fix), not shown.
    assert!(String::from_utf8_lossy(&stored[0].payload).contains(SECRET_TEXT));
    // A message that does not name its attributes right is quarantined
    // too, and its Debug output hides the payload.
    let mut attributes: Vec<(String, String)> = envelope
        .cloudevents_attributes("/x")
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    attributes.retain(|(k, _)| k != ce::ID);
    let headless = Incoming::new(attributes, envelope.payload.get().as_bytes().to_vec(), 1);
    assert_hidden("Incoming without an id", &format!("{headless:?}"));
    assert!(matches!(
        consumer.handle(&headless).await.unwrap(),
        Outcome::Quarantined { .. }
    ));

    let logs = captured.text();
    assert!(
        logs.contains("message quarantined"),
        "the log was captured: {logs}"
    );
    assert_hidden("the tracing output", &logs);
    db.drop_schema().await;
}

#[tokio::test]
async fn a_handler_error_that_quotes_a_redacted_value_never_shows_it() {
    let captured = captured();
    let db = TestDb::new().await;
    create_effects(&db).await;
    let table = db.table("effects");
    // The handler passes the card number on where PostgreSQL expects a
    // uuid; the server's error quotes the value.
    let consumer = ConsumerBuilder::new("cards-sql")
        .config(outbox_core::consumer::ConsumerConfig {
            retry: outbox_core::consumer::RetryPolicy {
                max_attempts: 2,
                ..strict_config(std::time::Duration::from_secs(60)).retry
            },
            ..strict_config(std::time::Duration::from_secs(60))
        })
        .on_fn::<CardCharged, _>(move |received, tx| {
            let table = table.clone();
            Box::pin(async move {
                if received.event.card_number == SECRET_NUMBER {
                    sqlx::query("SELECT $1::uuid")
                        .bind(received.event.card_number.to_string())
                        .execute(&mut *tx)
                        .await?;
                }
                record_effect(&table, &received, tx).await?;
                Ok::<(), HandlerError>(())
            })
        })
        .build(db.pool.clone(), db.schema.clone())
        .unwrap();
    let secret = Envelope::for_event(&charge(), 1).unwrap();
    let outcome = consumer.handle_envelope(&secret).await.unwrap();
    let Outcome::Retry { error, .. } = &outcome else {
        panic!("{outcome:?}");
    };
    assert!(
        error.contains("invalid input syntax for type uuid"),
        "the error still says what went wrong: {error}"
    );
    assert_hidden("the retry outcome", &format!("{outcome:?}"));
    let outcome = consumer
        .handle(&Incoming::from_envelope(&secret, 2))
        .await
        .unwrap();
    let Outcome::DeadLettered { reason } = &outcome else {
        panic!("{outcome:?}");
    };
    assert!(reason.contains("invalid input syntax"), "{reason}");
    assert_hidden("the dead-letter outcome", reason);
    let stored = letters(&db, "cards-sql").await;
    assert_eq!(stored.len(), 1);
    assert_hidden("the dead letter's stored reason", &stored[0].reason);

    // A parked message whose handler fails keeps its last error.
    let plain = |version: i64| {
        Envelope::for_event(
            &CardCharged {
                charge_id: "ch-2".into(),
                card_number: 4_000_000_000_000_002,
                amount_cents: version,
            },
            version,
        )
        .unwrap()
    };
    let parked_secret = Envelope::for_event(
        &CardCharged {
            charge_id: "ch-2".into(),
            ..charge()
        },
        3,
    )
    .unwrap();
    assert_eq!(
        consumer.handle_envelope(&plain(1)).await.unwrap(),
        Outcome::Applied
    );
    assert_eq!(
        consumer.handle_envelope(&parked_secret).await.unwrap(),
        Outcome::Parked { waiting_for: 2 }
    );
    assert_eq!(
        consumer.handle_envelope(&plain(2)).await.unwrap(),
        Outcome::Applied
    );
    let last_error: Option<String> = db
        .scalar("SELECT last_error FROM {s}.outbox_consumer_parked")
        .await;
    let last_error = last_error.expect("the parked message's failure is recorded");
    assert!(last_error.contains("invalid input syntax"), "{last_error}");
    assert_hidden("the parked message's last error", &last_error);

    let logs = captured.text();
    assert!(
        logs.contains("handler failed; will retry"),
        "the log was captured: {logs}"
    );
    assert_hidden("the tracing output", &logs);
    db.drop_schema().await;
}
