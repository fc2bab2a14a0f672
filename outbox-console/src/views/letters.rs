//! `/consumers/{consumer}/{kind}`: a consumer's quarantine or dead letters
//! grouped by error fingerprint (the same failure once, with a count, first
//! and last seen, example ids), one group's letters to act on, and
//! `/consumers/{consumer}/{kind}/{id}`: one letter in detail.

use axum::Extension;
use axum::extract::{Path, RawQuery, State};
use maud::{Markup, html};
use outbox_core::ops::format::{ErrorGroup, error_fingerprint, group_by_error};
use outbox_core::ops::scan::{FingerprintPage, REPAIR_SCAN, fingerprint_page, scan_letters};
use outbox_core::ops::{LetterFilter, LetterKind, LetterRecord, Page, page_limit};

use super::{audit_table, csrf_field, cut, frame, history, json, maybe_time, seg, time};
use crate::form::{Fields, query};
use crate::{ConsoleError, ConsoleStore, Ctx, Operator, Shared};

pub(crate) use outbox_core::ops::format::GROUP_SCAN;

/// The filter fields a letters listing keeps in its links.
const FILTER_FIELDS: [&str; 7] = [
    "event_type",
    "aggregate_type",
    "aggregate_id",
    "reason",
    "since",
    "until",
    "resolved",
];

/// `quarantined` or `dead_lettered` from a path.
/// A consumer name from a path: one a consumer can have (no store keeps
/// another), or a bad request before any store is asked (a `%00` in it
/// would fail PostgreSQL's `text`).
fn check_consumer(name: &str) -> Result<(), ConsoleError> {
    outbox_core::consumer::validate_consumer_name(name)
        .map_err(|error| ConsoleError::BadRequest(error.to_string()))
}

pub(crate) fn kind_of(name: &str) -> Result<LetterKind, ConsoleError> {
    match name {
        "quarantined" => Ok(LetterKind::Quarantined),
        "dead_lettered" => Ok(LetterKind::DeadLettered),
        other => Err(ConsoleError::NotFound(format!(
            "letters of kind {other:?} (quarantined or dead_lettered)"
        ))),
    }
}

/// The letters filter of a query string or form.
pub(crate) fn letter_filter(
    consumer: &str,
    kind: LetterKind,
    fields: &Fields,
) -> Result<LetterFilter, ConsoleError> {
    let text = |name: &str| fields.get(name).map(str::to_owned);
    Ok(LetterFilter {
        consumer: consumer.to_owned(),
        kind,
        event_type: text("event_type"),
        aggregate_type: text("aggregate_type"),
        aggregate_id: text("aggregate_id"),
        since: fields.time("since")?,
        until: fields.time("until")?,
        reason_contains: text("reason"),
        include_resolved: fields.get("resolved").is_some(),
        after: None,
        limit: Some(1000),
    })
}

/// How many letters of one failure a group page shows.
pub(crate) const GROUP_PAGE: usize = 100;

/// One page of the store's letters, for a scan.
async fn letters_of<S: ConsoleStore>(
    store: &S,
    filter: LetterFilter,
) -> Result<Page<LetterRecord>, ConsoleError> {
    store.letters(&filter).await
}

/// The letters matching `filter` (up to [`GROUP_SCAN`], oldest first) and
/// whether there were more.
pub(crate) async fn scan<S: ConsoleStore>(
    store: &S,
    filter: LetterFilter,
) -> Result<(Vec<LetterRecord>, bool), ConsoleError> {
    let scan = scan_letters(
        |filter| letters_of(store, filter),
        filter,
        None,
        usize::MAX,
        GROUP_SCAN,
    )
    .await?;
    Ok((scan.letters, scan.stopped_at.is_some()))
}

/// The oldest `limit` letters matching `filter`.
pub(crate) async fn first_letters<S: ConsoleStore>(
    store: &S,
    filter: LetterFilter,
    limit: usize,
) -> Result<Vec<LetterRecord>, ConsoleError> {
    let scan = scan_letters(
        |filter| letters_of(store, filter),
        filter,
        None,
        limit,
        limit,
    )
    .await?;
    Ok(scan.letters)
}

/// The oldest `limit` letters of one fingerprint among those matching
/// `filter` (reading at most [`REPAIR_SCAN`], as the tool's repairs do).
pub(crate) async fn group_members<S: ConsoleStore>(
    store: &S,
    filter: LetterFilter,
    fingerprint: &str,
    limit: usize,
) -> Result<Vec<LetterRecord>, ConsoleError> {
    let fingerprint = fingerprint.trim().to_ascii_lowercase();
    let scan = scan_letters(
        |filter| letters_of(store, filter),
        filter,
        Some(&fingerprint),
        limit,
        REPAIR_SCAN,
    )
    .await?;
    Ok(scan.letters)
}

/// What a letters listing shows.
enum Shown {
    /// The failures, grouped, and whether more letters matched than were
    /// grouped.
    Groups(Vec<ErrorGroup>, bool),
    /// One page of one failure's letters, and whether it is a later page.
    Group(FingerprintPage, bool),
    /// One page of every matching letter (`?list=1`), oldest first, and
    /// whether it is a later page.
    List(Page<LetterRecord>, bool),
}

/// The grouped listing, one group's letters with `?fingerprint=` (a page
/// at a time with `&after=`), or every matching letter with `?list=1`
/// (paged by `&after=` and `&limit=`, as the tool's `list`).
pub(crate) async fn list<S: ConsoleStore>(
    State(shared): Ctx<S>,
    Extension(operator): Extension<Operator>,
    Path((consumer, kind)): Path<(String, String)>,
    RawQuery(raw): RawQuery,
) -> Result<Markup, ConsoleError> {
    check_consumer(&consumer)?;
    let kind = kind_of(&kind)?;
    if !shared.store.keeps_letters() {
        return Err(ConsoleError::NoConsumerTables);
    }
    let fields = Fields::parse(raw.unwrap_or_default().as_bytes())?;
    let filter = letter_filter(&consumer, kind, &fields)?;
    let base = &shared.base;
    let here = format!("{base}/consumers/{}/{}", seg(&consumer), kind.as_str());
    let kept: Vec<(&str, String)> = FILTER_FIELDS
        .iter()
        .map(|name| (*name, fields.get(name).unwrap_or_default().to_owned()))
        .collect();
    let selected = fields
        .get("fingerprint")
        .map(|f| f.trim().to_ascii_lowercase());
    let listed = fields.get("list").is_some();
    let shown = match &selected {
        None if listed => {
            let after = fields.number("after")?;
            let limit = Some(page_limit(fields.number("limit")?));
            let page = shared
                .store
                .letters(&LetterFilter {
                    after,
                    limit,
                    ..filter
                })
                .await?;
            Shown::List(page, after.is_some())
        }
        None => {
            let (letters, more) = scan(&shared.store, filter).await?;
            Shown::Groups(group_by_error(&letters), more)
        }
        Some(fingerprint) => {
            let after = fields.number("after")?;
            let page = fingerprint_page(
                |filter| letters_of(&shared.store, filter),
                LetterFilter { after, ..filter },
                fingerprint,
                GROUP_PAGE,
                GROUP_SCAN,
            )
            .await?;
            Shown::Group(page, after.is_some())
        }
    };
    let title = match kind {
        LetterKind::Quarantined => format!("Quarantine of {consumer}"),
        LetterKind::DeadLettered => format!("Dead letters of {consumer}"),
    };
    let body = html! {
        form.filters method="get" action=(here) {
            (super::text_input("event type", "event_type", &fields))
            (super::text_input("aggregate type", "aggregate_type", &fields))
            (super::text_input("aggregate id", "aggregate_id", &fields))
            (super::text_input("reason contains", "reason", &fields))
            (super::time_input("since", "since", &fields))
            (super::time_input("until", "until", &fields))
            label { "closed too" input type="checkbox" name="resolved" value="1" checked[fields.get("resolved").is_some()]; }
            @if let Some(fingerprint) = &selected {
                input type="hidden" name="fingerprint" value=(fingerprint);
            } @else if listed {
                input type="hidden" name="list" value="1";
                (super::rows_select(page_limit(fields.number("limit")?)))
            }
            button type="submit" { "Filter" }
        }
        @match &shown {
            Shown::Groups(groups, more) => {
                @if *more {
                    p.note #truncated { "Grouped over the oldest " (GROUP_SCAN) " matching letters; narrow the filter to see the rest." }
                }
                p { a #list-all href={ (here) "?" (query(kept.iter().cloned().chain([("list", "1".to_owned())]))) } { "Every letter, oldest first" } }
                (group_table(&here, &kept, groups))
            }
            Shown::List(page, paged) => {
                @let listing = || kept.iter().cloned().chain([("list", "1".to_owned()), ("limit", fields.get("limit").unwrap_or_default().to_owned())]);
                p {
                    a href={ (here) "?" (query(kept.iter().cloned())) } { "Grouped by failure" }
                    @if *paged {
                        " · " a href={ (here) "?" (query(listing())) } { "The oldest" }
                    }
                }
                (group_letters(&shared, &operator, &here, &kept, None, kind, &consumer, &page.items))
                @if let Some(next) = page.next {
                    p #next-page {
                        a href={ (here) "?" (query(listing().chain([("after", next.to_string())]))) } { "Next page" }
                    }
                }
            }
            Shown::Group(page, paged) => {
                @let fingerprint = selected.as_deref().unwrap_or_default();
                @let with_fingerprint = || kept.iter().cloned().chain([("fingerprint", fingerprint.to_owned())]);
                p {
                    a href={ (here) "?" (query(kept.iter().cloned())) } { "All failures" }
                    @if *paged {
                        " · " a href={ (here) "?" (query(with_fingerprint())) } { "The oldest of this failure" }
                    }
                }
                (group_letters(&shared, &operator, &here, &kept, Some(fingerprint), kind, &consumer, &page.letters))
                @if page.cut_short {
                    p.note #cut-short { "Read " (GROUP_SCAN) " matching letters for this page; more of this failure may follow." }
                }
                @if let Some(next) = page.next {
                    p #next-page {
                        a href={ (here) "?" (query(with_fingerprint().chain([("after", next.to_string())]))) } { "Next " (GROUP_PAGE) " of this failure" }
                    }
                }
            }
        }
    };
    Ok(frame(&shared, &operator, &title, body))
}

fn group_table(here: &str, kept: &[(&str, String)], groups: &[ErrorGroup]) -> Markup {
    html! {
        table #groups {
            thead { tr { th { "failure" } th.num { "letters" } th { "first seen" } th { "last seen" } th { "event types" } th { "examples" } } }
            tbody {
                @for g in groups {
                    tr.group data-fingerprint=(g.fingerprint) {
                        td {
                            a href={ (here) "?" (query(kept.iter().cloned().chain([("fingerprint", g.fingerprint.clone())]))) } { (cut(&g.shape, 120)) }
                            br; span.note { "fingerprint " code { (g.fingerprint) } }
                        }
                        td.num.count { (g.count) }
                        td { (time(&g.first_seen)) }
                        td { (time(&g.last_seen)) }
                        td { (g.event_types.join(", ")) }
                        td {
                            @for id in &g.examples {
                                a href={ (here) "/" (id) } { (id) } " "
                            }
                        }
                    }
                }
            }
        }
        @if groups.is_empty() { p.empty #none { "No letters match." } }
    }
}

/// Letters to tick and act on; with a `fingerprint`, also the form that
/// acts on the oldest *n* of that failure.
#[allow(clippy::too_many_arguments)]
fn group_letters<S: ConsoleStore>(
    shared: &Shared<S>,
    operator: &Operator,
    here: &str,
    kept: &[(&str, String)],
    fingerprint: Option<&str>,
    kind: LetterKind,
    consumer: &str,
    members: &[LetterRecord],
) -> Markup {
    let base = &shared.base;
    let selectable = !shared.read_only && members.iter().any(|l| l.resolved_at.is_none());
    html! {
        form.confirm method="post" action={ (base) "/actions/preview" } {
            (csrf_field(shared, operator))
            input type="hidden" name="consumer" value=(consumer);
            input type="hidden" name="kind" value=(kind.as_str());
            table #letters {
                thead { tr {
                    @if selectable { th { input.select-all type="checkbox" title="all"; } }
                    th { "letter" } th { "event" } th { "aggregate" } th.num { "version" } th { "reason" } th.num { "attempts" } th { "at" } th { "state" }
                } }
                tbody {
                    @for l in members {
                        tr {
                            @if selectable { td { @if l.resolved_at.is_none() { input type="checkbox" name="id" value=(l.id); } } }
                            td { a href={ (here) "/" (l.id) } { (l.id) } }
                            td { (l.event_type.as_deref().unwrap_or("unreadable")) @if let Some(v) = l.schema_version { " v" (v) } }
                            td { (l.aggregate_type.as_deref().unwrap_or("-")) " / " (l.aggregate_id.as_deref().unwrap_or("-")) }
                            td.num { (l.aggregate_version.map(|v| v.to_string()).unwrap_or_default()) }
                            td { (cut(&l.reason, 90)) }
                            td.num { (l.attempts) }
                            td { (time(&l.created_at)) }
                            td { (letter_state(l)) }
                        }
                    }
                }
            }
            @if selectable {
                div.actions {
                    "With the ticked letters: "
                    button type="submit" name="action" value="replay" { "Replay" }
                    button.danger type="submit" name="action" value="discard" { "Discard" }
                }
            }
        }
        @if let (true, Some(fingerprint)) = (selectable, fingerprint) {
            h2 { "The whole group" }
            form.actions method="post" action={ (base) "/actions/preview" } {
                (csrf_field(shared, operator))
                input type="hidden" name="by" value="filter";
                input type="hidden" name="consumer" value=(consumer);
                input type="hidden" name="kind" value=(kind.as_str());
                input type="hidden" name="fingerprint" value=(fingerprint);
                @for (name, value) in kept {
                    @if !value.is_empty() { input type="hidden" name=(name) value=(value); }
                }
                label { "the oldest "
                    input type="number" name="limit" min="1" max="1000" required value=(members.len().min(100));
                    " open letters of this failure: "
                }
                button type="submit" name="action" value="replay" { "Replay" }
                button.danger type="submit" name="action" value="discard" { "Discard" }
                span.note { "You will see which letters first, and confirm with a reason." }
            }
        }
    }
}

fn letter_state(l: &LetterRecord) -> Markup {
    html! {
        @if let Some(resolution) = &l.resolution {
            "closed: " (resolution)
        } @else if l.replay_requested_at.is_some() {
            "replay requested"
        } @else {
            "open"
        }
    }
}

/// One letter.
pub(crate) async fn detail<S: ConsoleStore>(
    State(shared): Ctx<S>,
    Extension(operator): Extension<Operator>,
    Path((consumer, kind, id)): Path<(String, String, String)>,
) -> Result<Markup, ConsoleError> {
    check_consumer(&consumer)?;
    let kind = kind_of(&kind)?;
    let id: i64 = id
        .parse()
        .map_err(|_| ConsoleError::BadRequest(format!("{id:?} is not a letter id")))?;
    let letter = shared
        .store
        .letter(&consumer, id)
        .await?
        .filter(|l| l.kind == kind.as_str())
        .ok_or_else(|| {
            ConsoleError::NotFound(format!("{} letter {id} of {consumer}", kind.as_str()))
        })?;
    let history = history(&shared.store, &consumer, &id.to_string()).await?;
    let base = &shared.base;
    let open = letter.resolved_at.is_none();
    let body = html! {
        p { a href={ (base) "/consumers/" (seg(&consumer)) "/" (kind.as_str()) } { "All " (kind.as_str().replace('_', " ")) " letters of " (consumer) } }
        dl.record #letter {
            dt { "state" } dd #state { (letter_state(&letter)) }
            dt { "reason" } dd #reason { (letter.reason) }
            dt { "fingerprint" } dd { code { (error_fingerprint(&letter.reason)) } }
            dt { "event" } dd { code { (letter.event_id.map(|i| i.to_string()).unwrap_or_else(|| "unreadable".into())) } }
            dt { "event type" } dd { (letter.event_type.as_deref().unwrap_or("-")) @if let Some(v) = letter.schema_version { " (schema version " (v) ")" } }
            dt { "aggregate" } dd { (letter.aggregate_type.as_deref().unwrap_or("-")) " / " (letter.aggregate_id.as_deref().unwrap_or("-")) @if let Some(v) = letter.aggregate_version { " version " (v) } }
            dt { "attempts" } dd { (letter.attempts) }
            dt { "written" } dd { (time(&letter.created_at)) }
            dt { "replays" } dd { (letter.replays) }
            dt { "last replay error" } dd { (letter.last_replay_error.as_deref().unwrap_or("-")) }
            dt { "replay requested" } dd { (maybe_time(&letter.replay_requested_at)) }
            dt { "closed" } dd { (maybe_time(&letter.resolved_at)) }
        }
        h2 { "Headers" }
        (json(&letter.headers))
        h2 { "Payload (redacted)" }
        (json(&letter.payload))
        @if open && !shared.read_only {
            form.actions method="post" action={ (base) "/actions/preview" } {
                (csrf_field(&shared, &operator))
                input type="hidden" name="consumer" value=(consumer);
                input type="hidden" name="kind" value=(kind.as_str());
                input type="hidden" name="id" value=(letter.id);
                button type="submit" name="action" value="replay" { "Replay" }
                button.danger type="submit" name="action" value="discard" { "Discard" }
            }
        }
        h2 { "History" }
        p.note { "Repairs that named this letter, among the newest 1,000 audit rows (older ones: the audit log)." }
        (audit_table(&history))
    };
    Ok(frame(
        &shared,
        &operator,
        &format!("Letter {id} of {consumer}"),
        body,
    ))
}
