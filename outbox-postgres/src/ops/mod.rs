//! The operations API on PostgreSQL ([`Ops`]): what an operator (the
//! `outbox` CLI, the web console, a health check) reads and repairs, typed
//! and serializable, through the seams of [`outbox_core::ops`].
//!
//! - [`Ops::status`]: the backlog (pending, retrying, failed, skipped,
//!   oldest pending age, per event type), blocked aggregates with their head
//!   and last error, dead tuples, and per consumer its parked messages,
//!   quarantine and dead letters, with the problems a check should flag.
//! - Listings with filters and keyset paging: [`Ops::events`],
//!   [`Ops::letters`], [`Ops::audit`]; single records with [`Ops::event`]
//!   and [`Ops::letter`]. Every payload is shown through [`Redaction`].
//! - Repairs, always by id and with a [`RepairRequest`](outbox_core::audit::RepairRequest) (who and why), each
//!   in one transaction with its audit row: [`Ops::retry_failed`],
//!   [`Ops::skip_failed`], [`Ops::republish`], [`Ops::request_replay`],
//!   [`Ops::discard`], [`Ops::pass_version`] (a strict consumer's position
//!   past a version the producer skipped); and retention with
//!   [`Ops::cleanup`].
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! use outbox_core::audit::RepairRequest;
//! use outbox_core::ops::{EventFilter, EventStatus};
//! use outbox_postgres::{Ops, SchemaName};
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

mod records;
mod repair;
mod status;

use std::sync::Arc;

use outbox_core::ops::Redaction;
use outbox_core::store::SchemaName;
use sqlx::PgPool;

use crate::audit::AuditSql;
use crate::ops_sql::OpsSql;

/// The operations API over one outbox schema. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Ops {
    pool: PgPool,
    schema: SchemaName,
    sql: Arc<OpsSql>,
    audit: Arc<AuditSql>,
    redaction: Redaction,
    failed_heads: outbox_core::relay::FailedHeadPolicy,
}

impl Ops {
    /// Operations on the outbox in `schema` (migrated) of `pool`'s database.
    pub fn new(pool: PgPool, schema: SchemaName) -> Ops {
        Ops {
            sql: Arc::new(OpsSql::new(&schema)),
            audit: Arc::new(AuditSql::new(&schema)),
            redaction: Redaction::default(),
            failed_heads: outbox_core::relay::FailedHeadPolicy::Block,
            schema,
            pool,
        }
    }

    /// Reads blocked aggregates as relays with `policy` see them (default
    /// `Block`: a failed head blocks its aggregate; under `Skip` only a
    /// retrying head does). Give it the relays' `failed_head_policy`.
    pub fn with_failed_head_policy(mut self, policy: outbox_core::relay::FailedHeadPolicy) -> Ops {
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

outbox_core::operations_store_by_inherent_methods!(Ops);
outbox_core::letter_store_by_inherent_methods!(Ops);
