//! How a repair classifies each id it was given: one place for every store,
//! so `outbox` prints the same outcomes and details whichever database the
//! operations API runs on.

use super::{IdOutcome, LetterKind, MAX_REPAIR_IDS, OpsError};
use crate::audit::RepairError;

/// Refuses a repair given no ids or more than [`MAX_REPAIR_IDS`], before it
/// opens a transaction.
pub fn check_repair_ids<T>(ids: &[T]) -> Result<(), OpsError> {
    if ids.is_empty() {
        return Err(RepairError::NoIds.into());
    }
    if ids.len() > MAX_REPAIR_IDS {
        return Err(OpsError::TooMany {
            given: ids.len(),
            max: MAX_REPAIR_IDS,
        });
    }
    Ok(())
}

/// A letter as a repair found it after its statement ran: what the outcome
/// of an id the statement did not change is explained by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LetterRepairState {
    /// The letter's stored kind (`quarantined` or `dead_lettered`).
    pub kind: String,
    /// Why it was closed, when it is.
    pub resolution: Option<String>,
    /// Whether an operator's replay request waits for the consumer.
    pub requested: bool,
}

impl IdOutcome {
    /// The outcome of one event id of a relay repair: `done` when the
    /// repair's statement changed it, `not_eligible` (with its status) when
    /// it exists in another state, `not_found` when there is no such row.
    pub fn for_event(
        id: String,
        changed: bool,
        status: Option<&str>,
        done: &str,
        not_eligible: &str,
    ) -> Self {
        match (changed, status) {
            (true, _) => IdOutcome {
                id,
                outcome: done.to_owned(),
                detail: None,
            },
            (false, Some(status)) => IdOutcome {
                id,
                outcome: not_eligible.to_owned(),
                detail: Some(format!("its status is {status}")),
            },
            (false, None) => IdOutcome {
                id,
                outcome: "not_found".to_owned(),
                detail: Some("no such event (or removed by retention)".to_owned()),
            },
        }
    }

    /// The outcome of one letter id of a replay request or discard of
    /// `kind` letters: `done` when the repair's statement changed it, else
    /// why not (`wrong_kind`, `already_resolved`, `already_requested`,
    /// `not_found`).
    pub fn for_letter(
        id: i64,
        changed: bool,
        state: Option<&LetterRepairState>,
        kind: LetterKind,
        consumer: &str,
        done: &str,
    ) -> Self {
        let (outcome, detail) = if changed {
            (done, None)
        } else {
            match state {
                Some(state) if state.kind != kind.as_str() => (
                    "wrong_kind",
                    Some(format!(
                        "letter {id} is {}, not {}",
                        state.kind,
                        kind.as_str()
                    )),
                ),
                Some(LetterRepairState {
                    resolution: Some(resolution),
                    ..
                }) => ("already_resolved", Some(resolution.clone())),
                Some(state) if state.requested => (
                    "already_requested",
                    Some(
                        "a replay is already asked for; the consumer runs it at its next sweep"
                            .to_owned(),
                    ),
                ),
                Some(_) => ("already_resolved", None),
                None => (
                    "not_found",
                    Some(format!("no letter {id} of consumer {consumer}")),
                ),
            }
        };
        IdOutcome {
            id: id.to_string(),
            outcome: outcome.to_owned(),
            detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(kind: &str, resolution: Option<&str>, requested: bool) -> LetterRepairState {
        LetterRepairState {
            kind: kind.to_owned(),
            resolution: resolution.map(str::to_owned),
            requested,
        }
    }

    #[test]
    fn a_letter_id_is_classified_by_what_kept_the_repair_from_it() {
        let outcome = |changed, state: Option<&LetterRepairState>| {
            IdOutcome::for_letter(7, changed, state, LetterKind::Quarantined, "c", "discarded")
                .outcome
        };
        assert_eq!(outcome(true, None), "discarded");
        assert_eq!(
            outcome(false, Some(&state("dead_lettered", None, false))),
            "wrong_kind"
        );
        assert_eq!(
            outcome(false, Some(&state("quarantined", Some("replayed"), false))),
            "already_resolved"
        );
        assert_eq!(
            outcome(false, Some(&state("quarantined", None, true))),
            "already_requested"
        );
        assert_eq!(outcome(false, None), "not_found");
    }

    #[test]
    fn an_event_id_names_its_status_when_the_repair_did_not_apply() {
        let not = IdOutcome::for_event(
            "e".into(),
            false,
            Some("published"),
            "retried",
            "not_failed",
        );
        assert_eq!(not.outcome, "not_failed");
        assert_eq!(not.detail.as_deref(), Some("its status is published"));
        let gone = IdOutcome::for_event("e".into(), false, None, "retried", "not_failed");
        assert_eq!(gone.outcome, "not_found");
        let done = IdOutcome::for_event("e".into(), true, Some("pending"), "retried", "not_failed");
        assert_eq!((done.outcome.as_str(), done.detail), ("retried", None));
    }

    #[test]
    fn a_repair_needs_between_one_and_the_maximum_ids() {
        assert!(check_repair_ids::<i64>(&[]).is_err());
        assert!(check_repair_ids(&[1]).is_ok());
        assert!(matches!(
            check_repair_ids(&vec![0u8; MAX_REPAIR_IDS + 1]),
            Err(OpsError::TooMany { .. })
        ));
    }
}
