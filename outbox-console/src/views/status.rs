//! `/`: the outbox at a glance.

use axum::Extension;
use axum::extract::State;
use maud::{Markup, html};

use super::{age, cut, frame, maybe_time, time};
use crate::{ConsoleError, ConsoleStore, Ctx, Operator};

/// The status page.
pub(crate) async fn page<S: ConsoleStore>(
    State(shared): Ctx<S>,
    Extension(operator): Extension<Operator>,
) -> Result<Markup, ConsoleError> {
    let status = shared.store.status(&shared.status_options).await?;
    let base = &shared.base;
    let backlog = &status.backlog;
    let body = html! {
        p.note { "Outbox " code { (status.schema) } }
        @if status.problems.is_empty() {
            p.healthy #health { "Healthy: nothing needs an operator." }
        } @else {
            h2 { "Problems" }
            ul.problems #problems {
                @for problem in &status.problems { li { (problem) } }
            }
        }
        h2 { "Backlog" }
        table #backlog {
            thead { tr { th.num { "pending" } th.num { "retrying" } th.num { "failed" } th.num { "skipped" } th { "oldest pending" } th.num { "dead tuples" } th.num { "rows" } } }
            tbody { tr {
                td.num { (backlog.pending) }
                td.num { (backlog.retrying) }
                td.num { a href={ (base) "/events?status=failed" } { (backlog.failed) } }
                td.num { a href={ (base) "/events?status=skipped" } { (backlog.skipped) } }
                td { (age(backlog.oldest_pending_age_seconds)) }
                td.num { (backlog.dead_tuples) }
                td.num { (backlog.live_tuples) }
            } }
        }
        @if !status.event_types.is_empty() {
            table #event-types {
                thead { tr { th { "event type" } th.num { "pending" } th.num { "retrying" } th.num { "failed" } th.num { "skipped" } th { "oldest pending" } } }
                tbody {
                    @for t in &status.event_types {
                        tr {
                            td { a href={ (base) "/events?" (crate::form::query([("status", "failed".to_owned()), ("event_type", t.event_type.clone())])) } { (t.event_type) } }
                            td.num { (t.pending) } td.num { (t.retrying) } td.num { (t.failed) } td.num { (t.skipped) }
                            td { (age(t.oldest_pending_age_seconds)) }
                        }
                    }
                }
            }
        }
        h2 { "Blocked aggregates" }
        @if status.blocked.is_empty() {
            p.empty { "None." }
        } @else {
            table #blocked {
                thead { tr { th { "aggregate" } th { "head" } th { "head status" } th { "last error" } th { "since" } } }
                tbody {
                    @for b in &status.blocked {
                        tr {
                            td { (b.aggregate_type) " / " (b.aggregate_id) }
                            td { a href={ (base) "/events/" (b.head_event_id) } { code { (b.head_event_id) } } }
                            td { (b.head_status) }
                            td { (cut(b.last_error.as_deref().unwrap_or(""), 90)) }
                            td { (time(&b.blocked_since)) }
                        }
                    }
                }
            }
            p { a href={ (base) "/blocked" } { "All blocked aggregates" } }
        }
        h2 { "Consumers" }
        @if status.consumers.is_empty() {
            p.empty { "No consumer has written figures, parked messages or letters here." }
        } @else {
            table #consumers {
                thead { tr { th { "consumer" } th { "lag" } th { "last applied" } th.num { "applied" } th.num { "duplicates" } th.num { "parked" } th { "oldest parked" } th.num { "quarantined" } th.num { "dead letters" } th.num { "replays asked" } } }
                tbody {
                    @for c in &status.consumers {
                        tr {
                            td { (c.consumer) }
                            td { (age(c.lag_seconds)) }
                            td { (maybe_time(&c.last_applied_at)) }
                            td.num { (c.applied) }
                            td.num { (c.duplicates) }
                            td.num { (c.parked) }
                            td { (age(c.oldest_parked_age_seconds)) }
                            td.num { a href={ (base) "/consumers/" (super::seg(&c.consumer)) "/quarantined" } { (c.quarantined) } }
                            td.num { a href={ (base) "/consumers/" (super::seg(&c.consumer)) "/dead_lettered" } { (c.dead_lettered) } }
                            td.num { (c.replays_requested) }
                        }
                    }
                }
            }
        }
        @if !status.relay_workers.is_empty() {
            h2 { "Relay workers" }
            p.note { (status.partitions) " partitions" }
            table #relay-workers {
                thead { tr { th { "worker" } th { "heartbeat" } th { "connected" } th { "waiting" } th { "partitions" } } }
                tbody {
                    @for w in &status.relay_workers {
                        tr {
                            td { code { (w.worker) } }
                            td { (time(&w.heartbeat_at)) }
                            td { @if w.connected { "yes" } @else { span.bad { "no" } } }
                            td { @if w.waiting { "yes" } @else { "no" } }
                            td { (ranges(&w.partitions)) }
                        }
                    }
                }
            }
        }
    };
    Ok(frame(&shared, &operator, "Status", body))
}

/// Partitions as ranges: `0-3, 7, 9-10`, or `none`.
fn ranges(partitions: &[i32]) -> String {
    let ranges = outbox_core::ops::format::partition_ranges(partitions);
    if ranges.is_empty() {
        "none".to_owned()
    } else {
        ranges
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn no_partitions_say_none() {
        assert_eq!(super::ranges(&[]), "none");
        assert_eq!(super::ranges(&[2, 3]), "2-3");
    }
}
