//! Operator actions and their audit trail. Every repair (a replay of
//! quarantined messages or dead letters, a retry or skip of failed events,
//! a discard, a cleanup) names its ids, carries a reason and the operator
//! who asked, and leaves one row in `outbox_audit` with what happened to
//! each id. Requests without a reason or an operator are refused before
//! anything changes.

use serde::Serialize;

/// Who asks for a repair, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RepairRequest {
    operator: String,
    reason: String,
}

/// A repair request was refused; nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepairError {
    /// The reason is empty.
    #[error("a repair needs a reason (what was wrong and why this fixes it); nothing was changed")]
    MissingReason,
    /// The operator is empty.
    #[error("a repair needs the operator's name (or the OS user); nothing was changed")]
    MissingOperator,
    /// No ids were named.
    #[error(
        "a repair names the ids it acts on; there is no repair of everything; nothing was changed"
    )]
    NoIds,
    /// A text is longer than allowed.
    #[error("the {what} is {len} characters long (at most {max}); nothing was changed")]
    TooLong {
        /// Which text.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
}

const MAX_REASON: usize = 2000;
const MAX_OPERATOR: usize = 200;

impl RepairRequest {
    /// A request by `operator` for `reason`; both must say something.
    pub fn new(
        operator: impl Into<String>,
        reason: impl Into<String>,
    ) -> Result<RepairRequest, RepairError> {
        let operator = operator.into().trim().to_owned();
        let reason = reason.into().trim().to_owned();
        if operator.is_empty() {
            return Err(RepairError::MissingOperator);
        }
        if reason.is_empty() {
            return Err(RepairError::MissingReason);
        }
        if operator.chars().count() > MAX_OPERATOR {
            return Err(RepairError::TooLong {
                what: "operator name",
                len: operator.chars().count(),
                max: MAX_OPERATOR,
            });
        }
        if reason.chars().count() > MAX_REASON {
            return Err(RepairError::TooLong {
                what: "reason",
                len: reason.chars().count(),
                max: MAX_REASON,
            });
        }
        Ok(RepairRequest { operator, reason })
    }

    /// A request by the user this process runs as (`$USER`, else
    /// `$LOGNAME`), for `reason`.
    pub fn by_os_user(reason: impl Into<String>) -> Result<RepairRequest, RepairError> {
        let user = std::env::var("USER")
            .or_else(|_| std::env::var("LOGNAME"))
            .unwrap_or_default();
        RepairRequest::new(user, reason)
    }

    /// Who asked.
    pub fn operator(&self) -> &str {
        &self.operator
    }

    /// Why.
    pub fn reason(&self) -> &str {
        &self.reason
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_needs_an_operator_and_a_reason() {
        assert_eq!(
            RepairRequest::new("ada", "  "),
            Err(RepairError::MissingReason)
        );
        assert_eq!(
            RepairRequest::new(" ", "fixed the schema"),
            Err(RepairError::MissingOperator)
        );
        assert!(matches!(
            RepairRequest::new("ada", "x".repeat(2001)),
            Err(RepairError::TooLong { what: "reason", .. })
        ));
        let request = RepairRequest::new(" ada ", " consumer upgraded to v3 ").unwrap();
        assert_eq!(request.operator(), "ada");
        assert_eq!(request.reason(), "consumer upgraded to v3");
    }
}

/// An audit row's outcomes with `more` appended: `stored` is the row's
/// outcomes as JSON text (`None`: none yet), `more` an array of outcomes
/// (or one). For stores that keep the outcomes as text and cannot append
/// in SQL; the result is the text to write back.
pub fn appended_outcomes(
    stored: Option<&str>,
    more: &serde_json::Value,
) -> Result<String, serde_json::Error> {
    let mut all: Vec<serde_json::Value> = match stored {
        Some(text) => serde_json::from_str(text)?,
        None => Vec::new(),
    };
    match more {
        serde_json::Value::Array(more) => all.extend(more.iter().cloned()),
        other => all.push(other.clone()),
    }
    Ok(serde_json::Value::Array(all).to_string())
}

#[cfg(test)]
mod appended_outcomes_tests {
    use super::appended_outcomes;
    use serde_json::json;

    #[test]
    fn appends_to_none_to_an_array_and_one_value() {
        assert_eq!(appended_outcomes(None, &json!([1, 2])).unwrap(), "[1,2]");
        assert_eq!(
            appended_outcomes(Some("[1]"), &json!([2])).unwrap(),
            "[1,2]"
        );
        assert_eq!(appended_outcomes(Some("[1]"), &json!(2)).unwrap(), "[1,2]");
        assert!(appended_outcomes(Some("not json"), &json!([])).is_err());
    }
}
