//! The operations API over the SQLite outbox: the relay side,
//! [`outbox_core::ops::OperationsStore`] (status, listings, blocked
//! aggregates, the audit log, the relay's repairs, retention), and the
//! consumer's, [`outbox_core::ops::LetterStore`] (letters, positions,
//! replay requests, discards, passing a version), with the same records,
//! filters, pages, reports and outcomes as the PostgreSQL store's
//! `outbox_postgres::Ops`, so the `outbox` CLI runs on a SQLite file
//! unchanged.

pub(crate) mod audit_row;
mod cleanup;
mod letters;
mod reads;
mod repair;

use outbox_core::ops::Redaction;
use sqlx::SqlitePool;

/// The operations API over the SQLite outbox. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SqliteOps {
    pool: SqlitePool,
    redaction: Redaction,
    skip_failed_heads: bool,
}

impl SqliteOps {
    /// Operations through `pool` (the service's pool is fine: repairs are
    /// rare and commit with `pool`'s durability).
    pub fn new(pool: SqlitePool) -> SqliteOps {
        SqliteOps {
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
    ) -> SqliteOps {
        self.skip_failed_heads = policy == outbox_core::relay::FailedHeadPolicy::Skip;
        self
    }

    /// Shows payloads with `redaction` (default: the contracts in this
    /// binary, every value of unknown event types masked).
    pub fn with_redaction(mut self, redaction: Redaction) -> SqliteOps {
        self.redaction = redaction;
        self
    }

    /// The pool.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

outbox_core::operations_store_by_inherent_methods!(SqliteOps);
