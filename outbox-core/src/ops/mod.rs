//! The operations API: what an operator (the `outbox` CLI, a web console,
//! a health check) reads and repairs, typed and serializable.
//!
//! - [`OperationsStore`] and [`LetterStore`]: the seams a store implements
//!   (`outbox_postgres::Ops`, `outbox_sqlite::SqliteOps`,
//!   `outbox_mysql::MySqlOps`): status, listings with filters and keyset
//!   paging, and repairs, always by id and with a
//!   [`RepairRequest`](crate::audit::RepairRequest) (who and why), each in
//!   one transaction with its audit row.
//! - The records they return ([`Status`], [`EventRecord`], [`LetterRecord`],
//!   [`AuditRecord`], [`RepairReport`]); every payload is shown through
//!   [`Redaction`].
//! - [`format`](mod@format): ages, partitions and error fingerprints worded as the CLI and the
//!   console show them.
//! - [`scan`]: a consumer's letters of one failure (fingerprint), a page
//!   at a time, for the CLI's and the console's listings and repairs.

pub mod format;
mod outcome;
mod records;
mod redaction;
mod repair;
pub mod scan;
mod status;
mod store;

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
    /// Maps a driver error to [`OpsError::Database`] naming what was being
    /// done, for `map_err` in every store.
    pub fn database(doing: &'static str) -> impl FnOnce(sqlx::Error) -> OpsError {
        move |source| OpsError::Database { doing, source }
    }
}

/// The most ids one repair takes: a repair names what it acts on.
pub const MAX_REPAIR_IDS: usize = 10_000;
