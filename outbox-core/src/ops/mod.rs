//! The operations API: what an operator (the `outbox` CLI, a web console,
//! a health check) reads and repairs, typed and serializable.
//!
//! - [`Ops::status`]: the backlog (pending, retrying, failed, skipped,
//!   oldest pending age, per event type), blocked aggregates with their head
//!   and last error, dead tuples, and per consumer its parked messages,
//!   quarantine and dead letters, with the problems a check should flag.
//! - Listings with filters and keyset paging: [`Ops::events`],
//!   [`Ops::letters`], [`Ops::audit`]; single records with [`Ops::event`]
//!   and [`Ops::letter`]. Every payload is shown through [`Redaction`].
//! - Repairs, always by id and with a [`RepairRequest`](crate::audit::RepairRequest) (who and why), each
//!   in one transaction with its audit row: [`Ops::retry_failed`],
//!   [`Ops::skip_failed`], [`Ops::republish`], [`Ops::request_replay`],
//!   [`Ops::discard`], [`Ops::pass_version`] (a strict consumer's position
//!   past a version the producer skipped); and retention with
//!   [`Ops::cleanup`].
//! - [`format`](mod@format): ages, partitions and error fingerprints worded as the CLI and the
//!   console show them.
//! - [`OperationsStore`]: the relay side of all this as a seam, implemented
//!   by [`Ops`] (PostgreSQL) and `outbox_sqlite::SqliteOps` (SQLite).
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_core::audit::RepairRequest;
//! use outbox_core::ops::{EventFilter, EventStatus, Ops};
//! use outbox_core::store::SchemaName;
//!
//! let ops = Ops::new(pool, SchemaName::new("app")?);
//! let status = ops.status(&Default::default()).await?;
//! for problem in &status.problems {
//!     println!("{problem}");
//! }
//! let failed = ops.events(&EventFilter { status: EventStatus::Failed, ..Default::default() }).await?;
//! let ids: Vec<_> = failed.items.iter().map(|e| e.id).collect();
//! let request = RepairRequest::new("ada", "the broker accepts large messages again")?;
//! let report = ops.retry_failed(&ids, &request).await?;
//! println!("audit row {}", report.audit_id);
//! # Ok(()) }
//! ```

pub mod format;
mod outcome;
mod records;
mod redaction;
mod repair;
mod status;
mod store;

#[cfg(feature = "postgres")]
use std::sync::Arc;

#[cfg(feature = "postgres")]
use sqlx::PgPool;

pub use outcome::{LetterRepairState, check_repair_ids};
pub use records::{
    AuditRecord, EventFilter, EventRecord, EventStatus, LetterFilter, LetterKind, LetterRecord,
    Page, PositionRecord, page_limit,
};
pub use redaction::Redaction;
pub use repair::{Cleanup, CleanupReport, DEFAULT_KEY_RETENTION, IdOutcome, RepairReport};
pub use status::{
    Backlog, BlockedRecord, ConsumerStatus, EventTypeBacklog, RelayWorkerStatus, Status,
    StatusOptions, status_problems,
};
pub use store::{CleanupProgress, LetterStore, OperationsStore};

use crate::audit::RepairError;
#[cfg(feature = "postgres")]
use crate::store::SchemaName;
#[cfg(feature = "postgres")]
use crate::store::audit::AuditSql;
#[cfg(feature = "postgres")]
use crate::store::ops::OpsSql;

/// An operation failed.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// A repair was refused before anything changed.
    #[error(transparent)]
    Refused(#[from] RepairError),
    /// Too many ids for one repair.
    #[error("a repair takes at most {max} ids at once ({given} given); split it")]
    TooMany {
        /// The ids given.
        given: usize,
        /// The limit.
        max: usize,
    },
    /// The database failed; nothing of the operation was committed.
    #[error("database error while {doing}: {source}")]
    Database {
        /// What was being done.
        doing: &'static str,
        /// What sqlx reported.
        #[source]
        source: sqlx::Error,
    },
}

impl OpsError {
    #[cfg(feature = "postgres")]
    pub(crate) fn database(doing: &'static str) -> impl FnOnce(sqlx::Error) -> OpsError {
        move |source| OpsError::Database { doing, source }
    }
}

/// The most ids one repair takes: a repair names what it acts on.
pub const MAX_REPAIR_IDS: usize = 10_000;

/// The operations API over one outbox schema. Cheap to clone.
#[cfg(feature = "postgres")]
#[derive(Debug, Clone)]
pub struct Ops {
    pool: PgPool,
    schema: SchemaName,
    sql: Arc<OpsSql>,
    audit: Arc<AuditSql>,
    redaction: Redaction,
    failed_heads: crate::relay::FailedHeadPolicy,
}

#[cfg(feature = "postgres")]
impl Ops {
    /// Operations on the outbox in `schema` (migrated) of `pool`'s database.
    pub fn new(pool: PgPool, schema: SchemaName) -> Ops {
        Ops {
            sql: Arc::new(OpsSql::new(&schema)),
            audit: Arc::new(AuditSql::new(&schema)),
            redaction: Redaction::default(),
            failed_heads: crate::relay::FailedHeadPolicy::Block,
            schema,
            pool,
        }
    }

    /// Reads blocked aggregates as relays with `policy` see them (default
    /// `Block`: a failed head blocks its aggregate; under `Skip` only a
    /// retrying head does). Give it the relays' `failed_head_policy`.
    pub fn with_failed_head_policy(mut self, policy: crate::relay::FailedHeadPolicy) -> Ops {
        self.failed_heads = policy;
        self
    }

    /// Shows payloads with `redaction` (default: the contracts in this
    /// binary, every value of unknown event types masked).
    pub fn with_redaction(mut self, redaction: Redaction) -> Ops {
        self.redaction = redaction;
        self
    }

    /// The schema.
    pub fn schema(&self) -> &SchemaName {
        &self.schema
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
}
