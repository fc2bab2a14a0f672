//! `failed` and `events`: events by status, one event, and their repairs (retry, skip, republish) by id or by filter with a limit.

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{EventFilter, EventRecord, EventStatus, OperationsStore, Page};

use crate::args::{EventFilterArgs, EventRepairArgs, EventsAction, FailedAction};
use crate::output::{Output, confirm, ops_error, print_next, print_report, repair_limit, request};
use crate::table::{Table, cut, opt, when};
use crate::{EXIT_OK, Outcome};

pub(crate) fn filter_of(args: &EventFilterArgs, status: EventStatus) -> EventFilter {
    EventFilter {
        status,
        event_type: args.event_type.clone(),
        aggregate_type: args.aggregate_type.clone(),
        aggregate_id: args.aggregate_id.clone(),
        since: args.since,
        until: args.until,
        error_contains: args.error.clone(),
        after: None,
        limit: None,
    }
}

pub(crate) fn print_events(out: &Output, page: &Page<EventRecord>) {
    if out.json {
        out.json(page);
        return;
    }
    let mut table = Table::new(&[
        "EVENT ID",
        "TYPE",
        "AGGREGATE",
        "VERSION",
        "STATUS",
        "ATTEMPTS",
        "LAST ERROR",
    ]);
    for e in &page.items {
        table.row(vec![
            e.id.to_string(),
            format!("{} v{}", e.event_type, e.schema_version),
            format!("{}/{}", e.aggregate_type, cut(&e.aggregate_id, 40)),
            e.aggregate_version.to_string(),
            e.status.clone(),
            e.attempts.to_string(),
            cut(e.last_error.as_deref().unwrap_or(""), 60),
        ]);
    }
    print!("{}", table.render());
    print_next(page.next, "--after");
}

pub(crate) fn print_event(out: &Output, event: &EventRecord) {
    if out.json {
        out.json(event);
        return;
    }
    let lines = [
        ("event id", event.id.to_string()),
        (
            "event type",
            format!("{} v{}", event.event_type, event.schema_version),
        ),
        (
            "aggregate",
            format!(
                "{}/{} at version {}",
                event.aggregate_type, event.aggregate_id, event.aggregate_version
            ),
        ),
        ("status", event.status.clone()),
        ("emitted", when(&event.created_at)),
        ("published", opt(&event.published_at.as_ref().map(when))),
        ("failed", opt(&event.failed_at.as_ref().map(when))),
        ("attempts", event.attempts.to_string()),
        ("last error", opt(&event.last_error)),
        ("traceparent", opt(&event.traceparent)),
    ];
    for (name, value) in lines {
        println!("{name:<12} {}", if value.is_empty() { "-" } else { &value });
    }
    println!(
        "payload\n{}",
        serde_json::to_string_pretty(&event.payload).unwrap_or_default()
    );
}

pub(crate) async fn failed(
    ops: &impl OperationsStore,
    out: &Output,
    action: FailedAction,
) -> Outcome {
    match action {
        FailedAction::List {
            filter,
            limit,
            after,
        } => {
            let page = ops
                .events(&EventFilter {
                    limit,
                    after,
                    ..filter_of(&filter, EventStatus::Failed)
                })
                .await
                .map_err(ops_error)?;
            print_events(out, &page);
            Ok(EXIT_OK)
        }
        FailedAction::Show { id } => show_event(ops, out, id).await,
        FailedAction::Retry(args) => {
            let (ids, request) = select_events(ops, &args, EventStatus::Failed, "retry").await?;
            let report = ops.retry_failed(&ids, &request).await.map_err(ops_error)?;
            Ok(print_report(out, "retried", &report))
        }
        FailedAction::Skip(args) => {
            let (ids, request) = select_events(ops, &args, EventStatus::Failed, "skip").await?;
            let report = ops.skip_failed(&ids, &request).await.map_err(ops_error)?;
            Ok(print_report(out, "skipped", &report))
        }
    }
}

pub(crate) async fn events(
    ops: &impl OperationsStore,
    out: &Output,
    action: EventsAction,
) -> Outcome {
    match action {
        EventsAction::List {
            status,
            filter,
            limit,
            after,
        } => {
            let status = EventStatus::from_name(&status).ok_or_else(|| {
                format!("unknown status {status:?}; use pending, published, failed or skipped")
            })?;
            let page = ops
                .events(&EventFilter {
                    limit,
                    after,
                    ..filter_of(&filter, status)
                })
                .await
                .map_err(ops_error)?;
            print_events(out, &page);
            Ok(EXIT_OK)
        }
        EventsAction::Show { id } => show_event(ops, out, id).await,
        EventsAction::Republish(args) => {
            let (ids, request) =
                select_events(ops, &args, EventStatus::Published, "publish again").await?;
            let report = ops.republish(&ids, &request).await.map_err(ops_error)?;
            Ok(print_report(out, "republished", &report))
        }
    }
}

pub(crate) async fn show_event(
    ops: &impl OperationsStore,
    out: &Output,
    id: uuid::Uuid,
) -> Outcome {
    match ops.event(id).await.map_err(ops_error)? {
        Some(event) => {
            print_event(out, &event);
            Ok(EXIT_OK)
        }
        None => Err(format!("no event {id}")),
    }
}

/// The ids of a repair: given explicitly, or found by filters with an
/// explicit limit and a confirmation (`--yes`, or `y` on a terminal).
pub(crate) async fn select_events(
    ops: &impl OperationsStore,
    args: &EventRepairArgs,
    status: EventStatus,
    verb: &str,
) -> Result<(Vec<uuid::Uuid>, RepairRequest), String> {
    let request = request(&args.who)?;
    if !args.ids.is_empty() {
        if !args.filter.is_empty() {
            return Err("give either --id or filters, not both".to_owned());
        }
        return Ok((args.ids.clone(), request));
    }
    if args.filter.is_empty() {
        return Err(format!(
            "name the events to {verb}: --id ID (repeatable), or filters (--event-type, --aggregate-type, --aggregate-id, --since, --until, --error) with --limit N; there is no repair of everything"
        ));
    }
    let limit = repair_limit(args.limit)?;
    let mut ids: Vec<uuid::Uuid> = Vec::new();
    let mut after = None;
    while ids.len() < limit {
        let page = ops
            .events(&EventFilter {
                limit: Some((limit - ids.len()) as i64),
                after,
                ..filter_of(&args.filter, status)
            })
            .await
            .map_err(ops_error)?;
        ids.extend(page.items.iter().map(|e| e.id));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    ids.truncate(limit);
    if ids.is_empty() {
        return Err("no event matches the filters; nothing was changed".to_owned());
    }
    confirm(&format!("{verb} {} event(s)", ids.len()), args.yes)?;
    Ok((ids, request))
}
