//! The pages: one module per view, and the frame and small pieces they
//! share (times, ages, payloads, the CSRF field).

pub(crate) mod assets;
pub(crate) mod audit;
pub(crate) mod blocked;
pub(crate) mod events;
pub(crate) mod letters;
pub(crate) mod status;

use chrono::{DateTime, Utc};
use maud::{DOCTYPE, Markup, html};
use outbox_core::ops::AuditRecord;
use outbox_core::ops::format::{self, short_age};

use crate::{ConsoleStore, Operator, Shared};

/// The page frame: title, navigation, who is acting, the read-only banner.
pub(crate) fn frame<S: ConsoleStore>(
    shared: &Shared<S>,
    operator: &Operator,
    title: &str,
    body: Markup,
) -> Markup {
    let base = &shared.base;
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · outbox console" }
                link rel="stylesheet" href={ (base) "/assets/console.css" };
                script src={ (base) "/assets/console.js" } defer {}
            }
            body {
                header {
                    nav {
                        a.brand href=(home(base)) { "outbox" }
                        a href=(home(base)) { "Status" }
                        a href={ (base) "/events?status=failed" } { "Failed" }
                        a href={ (base) "/blocked" } { "Blocked" }
                        a href={ (base) "/events?status=pending" } { "Events" }
                        a href={ (base) "/audit" } { "Audit" }
                    }
                    span.operator { "operator: " strong #operator { (operator.0) } }
                    @if shared.read_only {
                        span.readonly { "read-only" }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

/// The status page's path: the mount path itself (`/outbox`, which a
/// router nested there answers; `/outbox/` it does not), or `/`.
pub(crate) fn home(base: &str) -> String {
    if base.is_empty() {
        "/".to_owned()
    } else {
        base.to_owned()
    }
}

/// A point in time: UTC in the HTML, the viewer's zone once the script ran.
pub(crate) fn time(at: &DateTime<Utc>) -> Markup {
    html! {
        time datetime=(at.to_rfc3339()) { (format::utc_time(at)) }
    }
}

/// A labelled text input of a filter, keeping its value.
pub(crate) fn text_input(label: &str, name: &str, fields: &crate::form::Fields) -> Markup {
    html! {
        label { (label)
            input type="text" name=(name) value=(fields.get(name).unwrap_or_default());
        }
    }
}

/// The page sizes a listing's form offers (any from 1 to 1,000 is taken
/// from the address).
const PAGE_SIZES: [i64; 4] = [50, 100, 500, 1000];

/// A listing form's page size (`limit`), `current` selected.
pub(crate) fn rows_select(current: i64) -> Markup {
    html! {
        label { "rows"
            select name="limit" {
                @if !PAGE_SIZES.contains(&current) {
                    option value=(current) selected { (current) }
                }
                @for size in PAGE_SIZES {
                    option value=(size) selected[size == current] { (size) }
                }
            }
        }
    }
}

/// A filter's time input. Without the page's script what is typed is read
/// as UTC (the label says so); with it, as the viewer's zone (the label
/// names it): the script sends it as UTC (RFC 3339) and shows a sent value
/// back in the viewer's zone.
pub(crate) fn time_input(label: &str, name: &str, fields: &crate::form::Fields) -> Markup {
    html! {
        label { (label) " " span.zone { "(UTC)" }
            input.local-time type="text" name=(name) placeholder="2026-12-06 10:40" value=(fields.get(name).unwrap_or_default());
        }
    }
}

/// An optional point in time (`-` for none).
pub(crate) fn maybe_time(at: &Option<DateTime<Utc>>) -> Markup {
    match at {
        Some(at) => time(at),
        None => html! { "-" },
    }
}

/// An age in seconds, worded as the CLI words it (`-` for none).
pub(crate) fn age(seconds: Option<f64>) -> Markup {
    let text = short_age(seconds);
    html! { @if text.is_empty() { "-" } @else { (text) } }
}

/// A JSON value (already redacted by the operations API), pretty-printed.
pub(crate) fn json(value: &serde_json::Value) -> Markup {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string());
    html! { pre.json { (text) } }
}

/// The hidden CSRF field of an action form.
pub(crate) fn csrf_field<S>(shared: &Shared<S>, operator: &Operator) -> Markup {
    html! { input type="hidden" name="csrf" value=(shared.csrf.token(operator)); }
}

/// Text cut to `max` characters, the whole of it in the title.
pub(crate) fn cut(text: &str, max: usize) -> Markup {
    let line = format::one_line(text);
    match format::cut_chars(&line, max) {
        None => html! { (line) },
        Some(short) => html! { span title=(line) { (short) } },
    }
}

/// Audit rows as a table (newest first).
pub(crate) fn audit_table(rows: &[AuditRecord]) -> Markup {
    html! {
        table.audit {
            thead { tr { th { "#" } th { "at" } th { "operator" } th { "action" } th { "target" } th { "reason" } th { "ids" } th { "outcomes" } } }
            tbody {
                @for row in rows {
                    tr {
                        td { (row.id) }
                        td { (time(&row.at)) }
                        td { (row.operator) }
                        td { code { (row.action) } }
                        td { (row.target) }
                        td { (cut(&row.reason, 80)) }
                        td { (cut(&row.ids.join(", "), 60)) }
                        td { (outcome_counts(&row.outcomes)) }
                    }
                }
            }
        }
        @if rows.is_empty() { p.empty { "No audit rows." } }
    }
}

/// `retried ×3, not_failed ×1` from an audit row's outcomes.
fn outcome_counts(outcomes: &serde_json::Value) -> String {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for outcome in outcomes.as_array().into_iter().flatten() {
        let name = outcome
            .get("outcome")
            .and_then(|o| o.as_str())
            .unwrap_or("?")
            .to_owned();
        match counts.iter_mut().find(|(n, _)| *n == name) {
            Some((_, count)) => *count += 1,
            None => counts.push((name, 1)),
        }
    }
    counts
        .iter()
        .map(|(name, count)| format!("{name} ×{count}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A path segment percent-encoded (everything but unreserved characters).
pub(crate) fn seg(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The audit rows (of the newest 1,000) that name `id` for `target`
/// (`relay` or a consumer), newest first: a record's history.
pub(crate) async fn history<S: ConsoleStore>(
    store: &S,
    target: &str,
    id: &str,
) -> Result<Vec<AuditRecord>, crate::ConsoleError> {
    let page = outbox_core::ops::OperationsStore::audit(store, None, Some(1000)).await?;
    Ok(page
        .items
        .into_iter()
        .filter(|row| row.target == target && row.ids.iter().any(|i| i == id))
        .collect())
}
