//! A small contract for tests that need many events, and helpers to emit
//! them.

use outbox_core::{EventDraft, Outbox, OutboxEvent};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sqlx::PgPool;

/// A counter tick on an aggregate (`counter/<id>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "counter.ticked", aggregate = "counter", version = 1)]
pub struct Ticked {
    /// The counter.
    #[outbox(aggregate_id)]
    pub counter: String,
    /// Which tick this was, as the producer counted.
    pub tick: u64,
    /// Filler to give the payload a realistic size.
    pub note: String,
}

impl Ticked {
    /// Tick `tick` of counter `counter`.
    pub fn new(counter: impl Into<String>, tick: u64) -> Ticked {
        Ticked {
            counter: counter.into(),
            tick,
            note: "a payload of about one hundred bytes, like a small domain event".into(),
        }
    }
}

/// Emits `per_counter` ticks on each of `counters` counters (named
/// `c0`, `c1`, ...), interleaved, in transactions of `per_transaction`.
/// Returns the number emitted.
pub async fn emit_ticks(
    pool: &PgPool,
    outbox: &Outbox,
    counters: usize,
    per_counter: u64,
    per_transaction: usize,
) -> usize {
    let mut drafts = Vec::new();
    for tick in 1..=per_counter {
        for counter in 0..counters {
            drafts.push(
                EventDraft::new(&Ticked::new(format!("c{counter}"), tick)).expect("serializable"),
            );
        }
    }
    let total = drafts.len();
    let mut rest = drafts.into_iter().peekable();
    while rest.peek().is_some() {
        let chunk: Vec<EventDraft> = rest.by_ref().take(per_transaction).collect();
        let mut tx = pool.begin().await.expect("begin");
        outbox.emit_drafts(&mut tx, chunk).await.expect("emit");
        tx.commit().await.expect("commit");
    }
    total
}
