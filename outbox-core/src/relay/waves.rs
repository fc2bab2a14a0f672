//! Publishing in waves: never two events of one aggregate in flight.
//!
//! A claimed batch holds, per aggregate, a run of consecutive versions.
//! Wave k holds the k-th event of every run; the relay sends a wave, awaits
//! every ack, and only then sends the next. If version k fails (a timeout,
//! say) version k+1 is not sent at all, so the broker can never hold k+1
//! before k, whatever the transport does with concurrent messages.

use super::store::ClaimedEvent;

/// The waves of a batch whose events are sorted by aggregate then version:
/// indices into the batch, and for each index the run (aggregate) it
/// belongs to.
pub(crate) struct Waves {
    pub(crate) waves: Vec<Vec<usize>>,
    pub(crate) run_of: Vec<usize>,
    pub(crate) runs: usize,
}

pub(crate) fn plan(events: &[ClaimedEvent]) -> Waves {
    let mut waves: Vec<Vec<usize>> = Vec::new();
    let mut run_of = Vec::with_capacity(events.len());
    let mut runs = 0;
    let mut position = 0;
    for (index, event) in events.iter().enumerate() {
        let same_aggregate = index > 0 && {
            let previous = &events[index - 1].envelope;
            previous.aggregate_type == event.envelope.aggregate_type
                && previous.aggregate_id == event.envelope.aggregate_id
        };
        if same_aggregate {
            position += 1;
        } else {
            position = 0;
            runs += 1;
        }
        run_of.push(runs - 1);
        if waves.len() <= position {
            waves.push(Vec::new());
        }
        waves[position].push(index);
    }
    Waves {
        waves,
        run_of,
        runs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::Envelope;

    fn event(aggregate: &str, version: i64) -> ClaimedEvent {
        ClaimedEvent {
            envelope: Envelope {
                id: uuid::Uuid::now_v7(),
                event_type: "t.e".into(),
                schema_version: 1,
                aggregate_type: "t".into(),
                aggregate_id: aggregate.into(),
                aggregate_version: version,
                occurred_at: chrono::Utc::now(),
                traceparent: None,
                payload: serde_json::value::to_raw_value(&serde_json::json!({})).unwrap(),
            },
            attempts: 0,
            unreadable: None,
        }
    }

    #[test]
    fn wave_k_holds_the_kth_event_of_each_aggregate() {
        let events = vec![
            event("a", 1),
            event("a", 2),
            event("a", 3),
            event("b", 7),
            event("c", 1),
            event("c", 2),
        ];
        let plan = plan(&events);
        assert_eq!(plan.waves, vec![vec![0, 3, 4], vec![1, 5], vec![2]]);
        assert_eq!(plan.run_of, vec![0, 0, 0, 1, 2, 2]);
        assert_eq!(plan.runs, 3);
    }

    #[test]
    fn empty_batch_has_no_waves() {
        assert!(plan(&[]).waves.is_empty());
    }
}
