//! Actions: every one a POST with the operator's CSRF token, in two steps.
//! `/actions/preview` shows what it would touch (the records by id, or the
//! oldest of a filter up to an explicit limit) and what would happen to
//! each, changing nothing; `/actions/run` does it for exactly the ids shown,
//! with the reason the operator typed, through the operations API (one
//! transaction and one audit row per action).

use std::collections::HashSet;

use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use maud::{Markup, html};
use outbox_core::audit::RepairRequest;
use outbox_core::ops::{
    EventRecord, LetterKind, LetterRecord, MAX_REPAIR_IDS, OpsError, RepairReport,
};
use uuid::Uuid;

use crate::form::Fields;
use crate::identity::{CONFIRMATION_TTL, cross_site};
use crate::views::events::event_filter;
use crate::views::letters::{first_letters, group_members, kind_of, letter_filter};
use crate::views::{csrf_field, cut, frame, home, seg};
use crate::{ConsoleError, ConsoleStore, Ctx, Operator, Shared};

/// The most records one action of the console touches.
pub(crate) const MAX_ACTION: usize = 1000;

/// What an operator can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    RetryFailed,
    SkipFailed,
    Republish,
    RetryBlocked,
    Replay,
    Discard,
}

impl Action {
    fn parse(name: Option<&str>) -> Result<Action, ConsoleError> {
        Ok(match name {
            Some("retry-failed") => Action::RetryFailed,
            Some("skip-failed") => Action::SkipFailed,
            Some("republish") => Action::Republish,
            Some("retry-blocked") => Action::RetryBlocked,
            Some("replay") => Action::Replay,
            Some("discard") => Action::Discard,
            other => {
                return Err(ConsoleError::BadRequest(format!(
                    "unknown action {other:?}: retry-failed, skip-failed, republish, retry-blocked, replay or discard"
                )));
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            Action::RetryFailed => "retry-failed",
            Action::SkipFailed => "skip-failed",
            Action::Republish => "republish",
            Action::RetryBlocked => "retry-blocked",
            Action::Replay => "replay",
            Action::Discard => "discard",
        }
    }

    fn on_letters(self) -> bool {
        matches!(self, Action::Replay | Action::Discard)
    }

    /// `Retry 3 failed events`.
    fn title(self, count: usize) -> String {
        let (verb, what) = match self {
            Action::RetryFailed => ("Retry", "failed event"),
            Action::SkipFailed => ("Skip", "failed event"),
            Action::Republish => ("Publish again", "published event"),
            Action::RetryBlocked => ("Try now", "retrying head"),
            Action::Replay => ("Replay", "letter"),
            Action::Discard => ("Discard", "letter"),
        };
        format!("{verb} {count} {what}{}", if count == 1 { "" } else { "s" })
    }

    /// What the action would do to `event`; `blocked_heads` are the
    /// pending heads of blocked aggregates when the preview could read
    /// them all.
    fn would(self, event: &EventRecord, blocked_heads: Option<&HashSet<Uuid>>) -> String {
        let status = event.status.as_str();
        match (self, status) {
            (Action::RetryBlocked, "pending") => match blocked_heads {
                Some(heads) if heads.contains(&event.id) => {
                    "tried now, attempts reset: it heads a blocked aggregate".into()
                }
                Some(_) => "left: it does not head a blocked aggregate".into(),
                None => {
                    "tried now, attempts reset, if it heads a blocked aggregate (otherwise left)"
                        .into()
                }
            },
            (Action::RetryFailed, "failed") => "back to pending, from its first attempt".into(),
            (Action::SkipFailed, "failed") => {
                "skipped: never published; its aggregate goes on".into()
            }
            (Action::Republish, "published") => "published again with its own id".into(),
            _ => format!("left: its status is {status}"),
        }
    }
}

/// The most blocked aggregates a preview reads to say which pending
/// events head one.
const BLOCKED_READ: i64 = 1000;

/// The pending heads of blocked aggregates, when there are fewer than
/// [`BLOCKED_READ`] (else `None`: the preview then says what decides).
async fn blocked_heads<S: ConsoleStore>(store: &S) -> Result<Option<HashSet<Uuid>>, ConsoleError> {
    let blocked = store.blocked(BLOCKED_READ).await?;
    if blocked.len() as i64 >= BLOCKED_READ {
        return Ok(None);
    }
    Ok(Some(
        blocked
            .into_iter()
            .filter(|b| b.head_status == "pending")
            .map(|b| b.head_event_id)
            .collect(),
    ))
}

/// What an action touches.
enum Targets {
    Events(Vec<(Uuid, Option<EventRecord>)>),
    Letters {
        consumer: String,
        kind: LetterKind,
        letters: Vec<(i64, Option<LetterRecord>)>,
    },
}

impl Targets {
    fn len(&self) -> usize {
        match self {
            Targets::Events(events) => events.len(),
            Targets::Letters { letters, .. } => letters.len(),
        }
    }

    /// The ids, as the run form sends them.
    fn ids(&self) -> Vec<String> {
        match self {
            Targets::Events(events) => events.iter().map(|(id, _)| id.to_string()).collect(),
            Targets::Letters { letters, .. } => {
                letters.iter().map(|(id, _)| id.to_string()).collect()
            }
        }
    }

    /// The consumer and kind of letters; `None` for events.
    fn letters_of(&self) -> Option<(&str, &str)> {
        match self {
            Targets::Events(_) => None,
            Targets::Letters { consumer, kind, .. } => Some((consumer.as_str(), kind.as_str())),
        }
    }
}

/// Refuses an action request that is read-only, from another site, or
/// without the operator's token; returns its fields.
fn admit<S>(
    shared: &Shared<S>,
    operator: &Operator,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Fields, ConsoleError> {
    if shared.read_only {
        return Err(ConsoleError::Forbidden(
            "this console is read-only: no action runs here".into(),
        ));
    }
    if cross_site(headers) {
        return Err(ConsoleError::Forbidden(
            "an action must come from the console's own pages (the request came from another site)"
                .into(),
        ));
    }
    let fields = Fields::parse(body)?;
    if !shared.csrf.accepts(operator, fields.get("csrf")) {
        return Err(ConsoleError::Forbidden(
            "missing or wrong CSRF token: reload the page and try again".into(),
        ));
    }
    Ok(fields)
}

fn event_ids(fields: &Fields) -> Result<Vec<Uuid>, ConsoleError> {
    let ids = fields
        .all("id")
        .into_iter()
        .map(|id| {
            id.parse()
                .map_err(|_| ConsoleError::BadRequest(format!("{id:?} is not an event id")))
        })
        .collect::<Result<Vec<Uuid>, _>>()?;
    checked_count(ids)
}

fn letter_ids(fields: &Fields) -> Result<Vec<i64>, ConsoleError> {
    let ids = fields
        .all("id")
        .into_iter()
        .map(|id| {
            id.parse()
                .map_err(|_| ConsoleError::BadRequest(format!("{id:?} is not a letter id")))
        })
        .collect::<Result<Vec<i64>, _>>()?;
    checked_count(ids)
}

/// The ids of an action, each once, in the order given: at least one, at
/// most [`MAX_ACTION`] (counted before duplicates are dropped, so a huge
/// form is refused before any work).
fn checked_count<T: Eq + std::hash::Hash + Clone>(ids: Vec<T>) -> Result<Vec<T>, ConsoleError> {
    if ids.is_empty() {
        return Err(ConsoleError::BadRequest(
            "no record chosen: tick at least one, or act by filter with a limit".into(),
        ));
    }
    if ids.len() > MAX_ACTION.min(MAX_REPAIR_IDS) {
        return Err(ConsoleError::BadRequest(format!(
            "{} records chosen; one action takes at most {MAX_ACTION}",
            ids.len()
        )));
    }
    let mut seen = std::collections::HashSet::with_capacity(ids.len());
    Ok(ids
        .into_iter()
        .filter(|id| seen.insert(id.clone()))
        .collect())
}

/// The letter kind a letter action names (a form field, so a wrong one
/// is a bad request).
fn letter_kind(fields: &Fields) -> Result<LetterKind, ConsoleError> {
    kind_of(fields.get("kind").unwrap_or_default())
        .map_err(|_| ConsoleError::BadRequest("kind must be quarantined or dead_lettered".into()))
}

/// The limit of an action by filter: required, 1 to 1,000.
fn filter_limit(fields: &Fields) -> Result<usize, ConsoleError> {
    match fields.number("limit")? {
        Some(limit) if (1..=MAX_ACTION as i64).contains(&limit) => Ok(limit as usize),
        Some(limit) => Err(ConsoleError::BadRequest(format!(
            "limit {limit}: an action by filter takes 1 to {MAX_ACTION} records"
        ))),
        None => Err(ConsoleError::BadRequest(
            "an action by filter needs an explicit limit (never all)".into(),
        )),
    }
}

async fn targets<S: ConsoleStore>(
    store: &S,
    action: Action,
    fields: &Fields,
) -> Result<Targets, ConsoleError> {
    let by_filter = fields.get("by") == Some("filter");
    if !action.on_letters() {
        let events = if by_filter {
            let limit = filter_limit(fields)?;
            let mut filter = event_filter(fields)?;
            filter.after = None;
            filter.limit = Some(limit as i64);
            store
                .events(&filter)
                .await?
                .items
                .into_iter()
                .map(|e| (e.id, Some(e)))
                .collect()
        } else {
            let mut events = Vec::new();
            for id in event_ids(fields)? {
                events.push((id, store.event(id).await?));
            }
            events
        };
        return Ok(Targets::Events(events));
    }
    if !store.keeps_letters() {
        return Err(ConsoleError::NoConsumerTables);
    }
    let consumer = fields
        .get("consumer")
        .ok_or_else(|| ConsoleError::BadRequest("a letter action needs its consumer".into()))?
        .to_owned();
    let kind = letter_kind(fields)?;
    let letters = if by_filter {
        let limit = filter_limit(fields)?;
        let mut filter = letter_filter(&consumer, kind, fields)?;
        filter.include_resolved = false;
        let letters = match fields.get("fingerprint") {
            Some(fingerprint) => group_members(store, filter, fingerprint, limit).await?,
            None => first_letters(store, filter, limit).await?,
        };
        letters
            .into_iter()
            .take(limit)
            .map(|l| (l.id, Some(l)))
            .collect()
    } else {
        let mut letters = Vec::new();
        for id in letter_ids(fields)? {
            let letter = store
                .letter(&consumer, id)
                .await?
                .filter(|l| l.kind == kind.as_str());
            letters.push((id, letter));
        }
        letters
    };
    Ok(Targets::Letters {
        consumer,
        kind,
        letters,
    })
}

/// Step one: what the action would touch. Changes nothing.
pub(crate) async fn preview<S: ConsoleStore>(
    State(shared): Ctx<S>,
    Extension(operator): Extension<Operator>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Markup, ConsoleError> {
    let fields = admit(&shared, &operator, &headers, &body)?;
    let action = Action::parse(fields.get("action"))?;
    let targets = targets(&shared.store, action, &fields).await?;
    if targets.len() == 0 {
        return Err(ConsoleError::BadRequest(
            "nothing matches: the action would touch no record".into(),
        ));
    }
    let blocked_heads = match action {
        Action::RetryBlocked => blocked_heads(&shared.store).await?,
        _ => None,
    };
    let confirmation = shared.csrf.confirmation(
        &operator,
        action.name(),
        targets.letters_of(),
        &targets.ids(),
        chrono::Utc::now().timestamp(),
    );
    let base = &shared.base;
    let title = format!("{}?", action.title(targets.len()));
    let body = html! {
        p.note #dry-run { "Nothing has changed yet. This is what the action would touch:" }
        form.confirm method="post" action={ (base) "/actions/run" } {
            (csrf_field(&shared, &operator))
            input type="hidden" name="action" value=(action.name());
            input type="hidden" name="confirm" value=(confirmation);
            @match &targets {
                Targets::Events(events) => {
                    table #targets {
                        thead { tr { th { "event" } th { "type" } th { "aggregate" } th.num { "version" } th { "status" } th { "last error" } th { "would be" } } }
                        tbody {
                            @for (id, event) in events {
                                tr {
                                    td { input type="hidden" name="id" value=(id); a href={ (base) "/events/" (id) } { code { (id) } } }
                                    @if let Some(e) = event {
                                        td { (e.event_type) " v" (e.schema_version) }
                                        td { (e.aggregate_type) " / " (e.aggregate_id) }
                                        td.num { (e.aggregate_version) }
                                        td { (e.status) }
                                        td { (cut(e.last_error.as_deref().unwrap_or(""), 80)) }
                                        td.would { (action.would(e, blocked_heads.as_ref())) }
                                    } @else {
                                        td colspan="6" { "not found (or removed by retention): left" }
                                    }
                                }
                            }
                        }
                    }
                }
                Targets::Letters { consumer, kind, letters } => {
                    input type="hidden" name="consumer" value=(consumer);
                    input type="hidden" name="kind" value=(kind.as_str());
                    table #targets {
                        thead { tr { th { "letter" } th { "event" } th { "aggregate" } th.num { "version" } th { "reason" } th { "would be" } } }
                        tbody {
                            @for (id, letter) in letters {
                                tr {
                                    td { input type="hidden" name="id" value=(id); a href={ (base) "/consumers/" (seg(consumer)) "/" (kind.as_str()) "/" (id) } { (id) } }
                                    @if let Some(l) = letter {
                                        td { (l.event_type.as_deref().unwrap_or("unreadable")) }
                                        td { (l.aggregate_type.as_deref().unwrap_or("-")) " / " (l.aggregate_id.as_deref().unwrap_or("-")) }
                                        td.num { (l.aggregate_version.map(|v| v.to_string()).unwrap_or_default()) }
                                        td { (cut(&l.reason, 80)) }
                                        td.would { (letter_would(action, l)) }
                                    } @else {
                                        td colspan="5" { "not found: left" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            p {
                label for="reason" { "Reason (kept in the audit log with your name, " strong { (operator.0) } "):" }
                br;
                textarea #reason name="reason" required placeholder="what was wrong, and why this fixes it" {}
            }
            div.actions {
                button.primary #confirm type="submit" { (action.title(targets.len())) }
                a href=(home(base)) { "Cancel" }
            }
        }
    };
    Ok(frame(&shared, &operator, &title, body))
}

fn letter_would(action: Action, letter: &LetterRecord) -> String {
    match (&letter.resolution, letter.replay_requested_at, action) {
        (Some(resolution), _, _) => format!("left: already closed ({resolution})"),
        (None, Some(_), Action::Replay) => "left to the replay already requested".into(),
        (None, None, Action::Replay) => "replayed by the running consumer at its next sweep".into(),
        (None, Some(_), _) => {
            "closed without running; the replay requested of it is withdrawn".into()
        }
        (None, None, _) => "closed without running".into(),
    }
}

/// Refuses a run that does not carry the confirmation of a preview of
/// exactly this action on exactly these ids (and letters' consumer and
/// kind) for this operator.
fn confirmed<S>(
    shared: &Shared<S>,
    operator: &Operator,
    action: Action,
    letters_of: Option<(&str, &str)>,
    ids: Vec<String>,
    fields: &Fields,
) -> Result<(), ConsoleError> {
    if shared.csrf.confirms(
        operator,
        action.name(),
        letters_of,
        &ids,
        fields.get("confirm"),
        chrono::Utc::now().timestamp(),
    ) {
        return Ok(());
    }
    Err(ConsoleError::Forbidden(format!(
        "run an action from its preview: this request does not carry the confirmation of a preview of this action on these ids from the last {} minutes; preview it again",
        CONFIRMATION_TTL.as_secs() / 60
    )))
}

/// Step two: the action, for exactly the ids confirmed, with a reason.
pub(crate) async fn run<S: ConsoleStore>(
    State(shared): Ctx<S>,
    Extension(operator): Extension<Operator>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Markup, ConsoleError> {
    let fields = admit(&shared, &operator, &headers, &body)?;
    let action = Action::parse(fields.get("action"))?;
    let request = RepairRequest::new(operator.0.clone(), fields.get("reason").unwrap_or_default())
        .map_err(OpsError::from)?;
    let store = &shared.store;
    let report = if action.on_letters() {
        let consumer = fields
            .get("consumer")
            .ok_or_else(|| ConsoleError::BadRequest("a letter action needs its consumer".into()))?;
        let kind = letter_kind(&fields)?;
        let ids = letter_ids(&fields)?;
        confirmed(
            &shared,
            &operator,
            action,
            Some((consumer, kind.as_str())),
            ids.iter().map(ToString::to_string).collect(),
            &fields,
        )?;
        match action {
            Action::Replay => store.request_replay(consumer, kind, &ids, &request).await?,
            _ => store.discard(consumer, kind, &ids, &request).await?,
        }
    } else {
        let ids = event_ids(&fields)?;
        confirmed(
            &shared,
            &operator,
            action,
            None,
            ids.iter().map(ToString::to_string).collect(),
            &fields,
        )?;
        match action {
            Action::RetryFailed => store.retry_failed(&ids, &request).await?,
            Action::SkipFailed => store.skip_failed(&ids, &request).await?,
            Action::Republish => store.republish(&ids, &request).await?,
            _ => store.retry_blocked(&ids, &request).await?,
        }
    };
    tracing::info!(
        operator = %operator.0,
        action = action.name(),
        audit_id = report.audit_id,
        ids = report.outcomes.len(),
        "outbox console action"
    );
    let body = report_page(&shared, action, &report);
    Ok(frame(&shared, &operator, "Done", body))
}

fn report_page<S>(shared: &Shared<S>, action: Action, report: &RepairReport) -> Markup {
    let base = &shared.base;
    html! {
        p #audit-row { "Audit row " strong { "#" (report.audit_id) } ": " (action.title(report.outcomes.len())) "." }
        @if action == Action::Replay {
            p.note { "The running consumer takes each request at its next sweep; a letter shows “replay requested” until then, and the outcome is added to this audit row." }
        }
        table #outcomes {
            thead { tr { th { "id" } th { "outcome" } th { "detail" } } }
            tbody {
                @for o in &report.outcomes {
                    tr { td { code { (o.id) } } td.outcome { (o.outcome) } td { (o.detail.as_deref().unwrap_or("")) } }
                }
            }
        }
        p { a href=(home(base)) { "Status" } " · " a href={ (base) "/audit" } { "Audit log" } }
    }
}
