//! `cleanup`: retention of published events and idempotency keys, a dry run until executed with a reason.

use std::io::IsTerminal;

use outbox_core::audit::RepairRequest;
use outbox_core::ops::OperationsStore;

use crate::args::Who;
use crate::output::{Output, ops_error, request};
use crate::table::{age, opt};
use crate::{EXIT_OK, Outcome};

pub(crate) async fn cleanup(
    ops: &impl OperationsStore,
    out: &Output,
    plan: &outbox_core::ops::Cleanup,
    who: &Who,
) -> Outcome {
    let request = if plan.execute {
        request(who)?
    } else {
        // A dry run changes nothing and needs no reason.
        RepairRequest::new("dry-run", "dry run").map_err(|e| e.to_string())?
    };
    let bar = (plan.execute && !out.json && std::io::stderr().is_terminal()).then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} published events deleted ({per_sec}, {eta} left)",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let report = ops
        .cleanup(plan, &request, &mut |deleted, eligible| {
            if let Some(bar) = &bar {
                bar.set_length(deleted.max(u64::try_from(eligible).unwrap_or(0)));
                bar.set_position(deleted);
            }
        })
        .await
        .map_err(ops_error)?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    if out.json {
        out.json(&report);
    } else if report.executed {
        println!(
            "deleted {} published events older than {} and {} idempotency keys older than {}; audit row {}",
            report.deleted,
            age(Some(plan.events_older_than.as_secs_f64())),
            report.keys_deleted,
            age(Some(plan.keys_older_than.as_secs_f64())),
            opt(&report.audit_id)
        );
    } else {
        println!(
            "dry run: {} published events are older than {} and {} idempotency keys older than {} (--keys-older-than); run with --execute --reason \"…\" to delete them",
            report.eligible,
            age(Some(plan.events_older_than.as_secs_f64())),
            report.keys_eligible,
            age(Some(plan.keys_older_than.as_secs_f64()))
        );
    }
    Ok(EXIT_OK)
}
