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
