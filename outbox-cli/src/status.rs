//! `status` and `blocked`: the outbox at a glance and the aggregates waiting behind a head.

use outbox_core::ops::{OperationsStore, StatusOptions};

use crate::output::{Output, ops_error};
use crate::table::{Table, age, cut, when};
use crate::{EXIT_OK, EXIT_PROBLEMS, Outcome};

/// Partitions as ranges (`: 0-3, 8, 10-12`), or nothing when there are none.
fn ranges(partitions: &[i32]) -> String {
    let ranges = outbox_core::ops::format::partition_ranges(partitions);
    if ranges.is_empty() {
        ranges
    } else {
        format!(": {ranges}")
    }
}

pub(crate) async fn status(
    ops: &impl OperationsStore,
    out: &Output,
    check: bool,
    options: &StatusOptions,
) -> Outcome {
    let status = ops.status(options).await.map_err(ops_error)?;
    if out.json {
        out.json(&status);
    } else {
        let b = &status.backlog;
        println!(
            "outbox {}: {} pending, {} retrying, {} failed, {} skipped; oldest pending {}; dead tuples {} (live {})",
            status.schema,
            b.pending,
            b.retrying,
            b.failed,
            b.skipped,
            if b.oldest_pending_age_seconds.is_some() {
                age(b.oldest_pending_age_seconds)
            } else {
                "none".to_owned()
            },
            b.dead_tuples,
            b.live_tuples
        );
        if !status.event_types.is_empty() {
            let mut table = Table::new(&[
                "EVENT TYPE",
                "PENDING",
                "RETRYING",
                "FAILED",
                "SKIPPED",
                "OLDEST PENDING",
            ]);
            for t in &status.event_types {
                table.row(vec![
                    t.event_type.clone(),
                    t.pending.to_string(),
                    t.retrying.to_string(),
                    t.failed.to_string(),
                    t.skipped.to_string(),
                    age(t.oldest_pending_age_seconds),
                ]);
            }
            print!("\n{}", table.render());
        }
        if !status.blocked.is_empty() {
            println!();
            print!("{}", blocked_table(&status.blocked).render());
        }
        if !status.relay_workers.is_empty() {
            let mut table = Table::new(&["RELAY WORKER", "HEARTBEAT", "SESSION", "PARTITIONS"]);
            for w in &status.relay_workers {
                table.row(vec![
                    w.worker.to_string(),
                    when(&w.heartbeat_at),
                    match (w.backend_pid, w.connected) {
                        (Some(pid), true) => format!("pid {pid}"),
                        (Some(pid), false) => format!("pid {pid} (gone)"),
                        (None, _) => "none".to_owned(),
                    },
                    format!(
                        "{} of {}{}",
                        w.partitions.len(),
                        status.partitions,
                        ranges(&w.partitions)
                    ),
                ]);
            }
            print!("\n{}", table.render());
        }
        if !status.consumers.is_empty() {
            let mut table = Table::new(&[
                "CONSUMER",
                "APPLIED",
                "DUPLICATES",
                "LAG",
                "LAST APPLIED",
                "PARKED",
                "OLDEST PARKED",
                "QUARANTINED",
                "DEAD LETTERS",
                "REPLAYS ASKED",
            ]);
            for c in &status.consumers {
                table.row(vec![
                    c.consumer.clone(),
                    c.applied.to_string(),
                    c.duplicates.to_string(),
                    age(c.lag_seconds),
                    c.last_applied_at.as_ref().map(when).unwrap_or_default(),
                    c.parked.to_string(),
                    age(c.oldest_parked_age_seconds),
                    c.quarantined.to_string(),
                    c.dead_lettered.to_string(),
                    c.replays_requested.to_string(),
                ]);
            }
            print!("\n{}", table.render());
        }
        if status.problems.is_empty() {
            println!("\nno problems");
        } else {
            println!("\nproblems:");
            for problem in &status.problems {
                println!("  - {problem}");
            }
        }
    }
    Ok(if check && !status.problems.is_empty() {
        EXIT_PROBLEMS
    } else {
        EXIT_OK
    })
}

pub(crate) fn blocked_table(blocked: &[outbox_core::ops::BlockedRecord]) -> Table {
    let mut table = Table::new(&[
        "AGGREGATE",
        "HEAD EVENT",
        "HEAD STATUS",
        "BLOCKED SINCE",
        "LAST ERROR",
    ]);
    for b in blocked {
        table.row(vec![
            format!("{}/{}", b.aggregate_type, cut(&b.aggregate_id, 40)),
            b.head_event_id.to_string(),
            b.head_status.clone(),
            when(&b.blocked_since),
            cut(b.last_error.as_deref().unwrap_or(""), 60),
        ]);
    }
    table
}

pub(crate) async fn blocked(ops: &impl OperationsStore, out: &Output, limit: i64) -> Outcome {
    let blocked = ops.blocked(limit).await.map_err(ops_error)?;
    if out.json {
        out.json(&blocked);
    } else {
        print!("{}", blocked_table(&blocked).render());
    }
    Ok(EXIT_OK)
}
