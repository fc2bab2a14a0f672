//! `/events`: events by status with filters and paging, and the actions
//! their status allows; `/events/{id}`: one event and its audit history.

use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use maud::{Markup, html};
use outbox_core::ops::{EventFilter, EventRecord, EventStatus, page_limit};
use outbox_core::{Envelope, ce};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::{audit_table, csrf_field, cut, frame, history, json, maybe_time, time};
use crate::form::{Fields, query};
use crate::{ConsoleError, ConsoleStore, Ctx, Operator, Shared};

/// The filter fields an events listing keeps in its links.
const FILTER_FIELDS: [&str; 7] = [
    "status",
    "event_type",
    "aggregate_type",
    "aggregate_id",
    "error",
    "since",
    "until",
];

/// The events filter of a query string or form (status default failed).
pub(crate) fn event_filter(fields: &Fields) -> Result<EventFilter, ConsoleError> {
    let status = match fields.get("status") {
        None => EventStatus::Failed,
        Some(name) => EventStatus::from_name(name).ok_or_else(|| {
            ConsoleError::BadRequest(format!(
                "status must be pending, published, failed or skipped, not {name:?}"
            ))
        })?,
    };
    let text = |name: &str| fields.get(name).map(str::to_owned);
    Ok(EventFilter {
        status,
        event_type: text("event_type"),
        aggregate_type: text("aggregate_type"),
        aggregate_id: text("aggregate_id"),
        since: fields.time("since")?,
        until: fields.time("until")?,
        error_contains: text("error"),
        after: fields.number("after")?,
        limit: fields.number("limit")?.map(|l| l.clamp(1, 1000)),
    })
}

/// The repairs an event's status allows: `(action, button label)`.
pub(crate) fn actions_for(status: &str) -> &'static [(&'static str, &'static str)] {
    match status {
        "failed" => &[
            ("retry-failed", "Retry (back to pending)"),
            ("skip-failed", "Skip (never publish)"),
        ],
        "published" => &[("republish", "Publish again")],
        "pending" => &[("retry-blocked", "Try now (if it is a retrying head)")],
        _ => &[],
    }
}

/// The listing.
pub(crate) async fn list<S: ConsoleStore>(
    State(shared): Ctx<S>,
    Extension(operator): Extension<Operator>,
    RawQuery(raw): RawQuery,
) -> Result<Markup, ConsoleError> {
    let fields = Fields::parse(raw.unwrap_or_default().as_bytes())?;
    let filter = event_filter(&fields)?;
    let page = shared.store.events(&filter).await?;
    let status = filter.status.as_str();
    let base = &shared.base;
    let kept: Vec<(&str, String)> = FILTER_FIELDS
        .iter()
        .map(|name| (*name, fields.get(name).unwrap_or_default().to_owned()))
        .collect();
    let actions = if shared.read_only {
        &[][..]
    } else {
        actions_for(status)
    };
    let body = html! {
        form.filters method="get" action={ (base) "/events" } {
            label { "status"
                select name="status" {
                    @for s in ["failed", "pending", "published", "skipped"] {
                        option value=(s) selected[s == status] { (s) }
                    }
                }
            }
            (super::text_input("event type", "event_type", &fields))
            (super::text_input("aggregate type", "aggregate_type", &fields))
            (super::text_input("aggregate id", "aggregate_id", &fields))
            (super::text_input("error contains", "error", &fields))
            (super::time_input("since", "since", &fields))
            (super::time_input("until", "until", &fields))
            (super::rows_select(page_limit(filter.limit)))
            button type="submit" { "Filter" }
        }
        form.confirm method="post" action={ (base) "/actions/preview" } {
            (csrf_field(&shared, &operator))
            (events_table(base, &page.items, !actions.is_empty()))
            @if !actions.is_empty() && !page.items.is_empty() {
                div.actions {
                    "With the ticked events: "
                    @for (action, label) in actions {
                        button type="submit" name="action" value=(action) { (label) }
                    }
                }
            }
        }
        @if let Some(next) = page.next {
            p.pager {
                a #next href={ (base) "/events?" (query(kept.iter().cloned().chain([("after", next.to_string()), ("limit", filter.limit.map(|l| l.to_string()).unwrap_or_default())]))) } { "Next page" }
            }
        }
        @if !actions.is_empty() && !page.items.is_empty() {
            h2 { "By filter" }
            form.actions method="post" action={ (base) "/actions/preview" } {
                (csrf_field(&shared, &operator))
                input type="hidden" name="by" value="filter";
                @for (name, value) in &kept {
                    @if !value.is_empty() { input type="hidden" name=(name) value=(value); }
                }
                @if fields.get("status").is_none() { input type="hidden" name="status" value=(status); }
                label { "the oldest "
                    input type="number" name="limit" min="1" max="1000" required value=(page_limit(None).min(page.items.len() as i64));
                    " events matching this filter: "
                }
                @for (action, label) in actions {
                    button type="submit" name="action" value=(action) { (label) }
                }
                span.note { "You will see which events first, and confirm with a reason." }
            }
        }
    };
    Ok(frame(
        &shared,
        &operator,
        &format!("Events: {status}"),
        body,
    ))
}

/// Events as a table, with a tick box per row when `selectable`.
pub(crate) fn events_table(base: &str, events: &[EventRecord], selectable: bool) -> Markup {
    html! {
        table.events {
            thead { tr {
                @if selectable { th { input.select-all type="checkbox" title="all"; } }
                th { "event" } th { "type" } th { "aggregate" } th.num { "version" } th { "status" } th.num { "attempts" } th { "created" } th { "last error" }
            } }
            tbody {
                @for e in events {
                    tr {
                        @if selectable { td { input type="checkbox" name="id" value=(e.id); } }
                        td { a href={ (base) "/events/" (e.id) } { code { (e.id) } } }
                        td { (e.event_type) " v" (e.schema_version) }
                        td { (e.aggregate_type) " / " (e.aggregate_id) }
                        td.num { (e.aggregate_version) }
                        td { (e.status) }
                        td.num { (e.attempts) }
                        td { (time(&e.created_at)) }
                        td { (cut(e.last_error.as_deref().unwrap_or(""), 90)) }
                    }
                }
            }
        }
        @if events.is_empty() { p.empty { "No events match." } }
    }
}

/// One event.
pub(crate) async fn detail<S: ConsoleStore>(
    State(shared): Ctx<S>,
    Extension(operator): Extension<Operator>,
    Path(id): Path<String>,
) -> Result<Markup, ConsoleError> {
    let id: Uuid = id
        .parse()
        .map_err(|_| ConsoleError::BadRequest(format!("{id:?} is not an event id (a UUID)")))?;
    let event =
        shared.store.event(id).await?.ok_or_else(|| {
            ConsoleError::NotFound(format!("event {id} (or removed by retention)"))
        })?;
    let history = history(&shared.store, "relay", &id.to_string()).await?;
    let body = event_detail(&shared, &operator, &event, &history);
    Ok(frame(&shared, &operator, &format!("Event {id}"), body))
}

/// The CloudEvents attributes the relay publishes `e` with that follow
/// from the event alone (the envelope's own mapping, as every transport
/// uses it; `source` and `dataschema` come from the transport's
/// configuration and are left out).
fn published_attributes(e: &EventRecord) -> Vec<(&'static str, String)> {
    let Ok(schema_version) = u32::try_from(e.schema_version) else {
        return Vec::new();
    };
    let envelope = Envelope {
        id: e.id,
        event_type: e.event_type.clone(),
        schema_version,
        aggregate_type: e.aggregate_type.clone(),
        aggregate_id: e.aggregate_id.clone(),
        aggregate_version: e.aggregate_version,
        // The relay publishes the row's creation time as the event's.
        occurred_at: e.created_at,
        traceparent: e.traceparent.clone(),
        payload: RawValue::NULL.to_owned(),
    };
    envelope
        .cloudevents_attributes("")
        .into_iter()
        .filter(|(name, _)| *name != ce::SOURCE && *name != ce::DATASCHEMA)
        .collect()
}

fn event_detail<S: ConsoleStore>(
    shared: &Shared<S>,
    operator: &Operator,
    e: &EventRecord,
    history: &[outbox_core::ops::AuditRecord],
) -> Markup {
    let base = &shared.base;
    let actions = if shared.read_only {
        &[][..]
    } else {
        actions_for(&e.status)
    };
    html! {
        dl.record #event {
            dt { "status" } dd #status { (e.status) }
            dt { "event type" } dd { (e.event_type) " (schema version " (e.schema_version) ")" }
            dt { "aggregate" } dd { (e.aggregate_type) " / " (e.aggregate_id) " version " (e.aggregate_version) }
            dt { "seq" } dd { (e.seq) }
            dt { "created" } dd { (time(&e.created_at)) }
            dt { "published" } dd { (maybe_time(&e.published_at)) }
            dt { "attempts" } dd { (e.attempts) }
            dt { "next attempt" } dd { (time(&e.next_attempt_at)) }
            dt { "failed" } dd { (maybe_time(&e.failed_at)) }
            dt { "last error" } dd #last-error { (e.last_error.as_deref().unwrap_or("-")) }
            dt { "traceparent" } dd { code { (e.traceparent.as_deref().unwrap_or("-")) } }
        }
        h2 { "Attributes it is published with" }
        table #attributes {
            thead { tr { th { "CloudEvents attribute" } th { "value" } } }
            tbody {
                @for (name, value) in published_attributes(e) {
                    tr { td { code { (name) } } td { code { (value) } } }
                }
            }
        }
        p.note { "Plus " code { "source" } " and " code { "dataschema" } ", which the relay's transport sets from its configuration; each broker carries these under its own header names." }
        h2 { "Payload (redacted)" }
        (json(&e.payload))
        @if !actions.is_empty() {
            form.actions method="post" action={ (base) "/actions/preview" } {
                (csrf_field(shared, operator))
                input type="hidden" name="id" value=(e.id);
                @for (action, label) in actions {
                    button type="submit" name="action" value=(action) { (label) }
                }
            }
        }
        h2 { "History" }
        p.note { "Repairs that named this event, among the newest 1,000 audit rows (older ones: the audit log)." }
        (audit_table(history))
    }
}
