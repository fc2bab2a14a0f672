//! The operations API over the MySQL/MariaDB outbox: the relay side,
//! [`outbox_core::ops::OperationsStore`] (status, listings, blocked
//! aggregates, the audit log, the relay's repairs, retention), and the
//! consumer's, [`outbox_core::ops::LetterStore`] (letters, positions,
//! replay requests, discards, passing a skipped version), with the same
//! records, filters, pages, reports and outcomes as the PostgreSQL store's
//! `outbox_postgres::Ops`.

mod letters;
mod reads;
mod repair;

use outbox_core::ops::Redaction;
use sqlx::MySqlPool;

/// The operations API over the MySQL/MariaDB outbox. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MySqlOps {
    pool: MySqlPool,
    redaction: Redaction,
    skip_failed_heads: bool,
}

impl MySqlOps {
    /// Operations through `pool`.
    pub fn new(pool: MySqlPool) -> MySqlOps {
        MySqlOps {
            pool,
            redaction: Redaction::default(),
            skip_failed_heads: false,
        }
    }

    /// Reads blocked aggregates as relays with `policy` see them (default
    /// `Block`: a failed head blocks its aggregate; under `Skip` only a
    /// retrying head does). Give it the relays' `failed_head_policy`.
    pub fn with_failed_head_policy(
        mut self,
        policy: outbox_core::relay::FailedHeadPolicy,
    ) -> MySqlOps {
        self.skip_failed_heads = policy == outbox_core::relay::FailedHeadPolicy::Skip;
        self
    }

    /// Shows payloads with `redaction` (default: the contracts in this
    /// binary, every value of unknown event types masked).
    pub fn with_redaction(mut self, redaction: Redaction) -> MySqlOps {
        self.redaction = redaction;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.pool
    }
}

outbox_core::operations_store_by_inherent_methods!(MySqlOps);
