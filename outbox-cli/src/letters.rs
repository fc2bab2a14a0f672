//! `quarantine` and `dead-letters`: a consumer's letters (listed, grouped
//! by error fingerprint, shown), replays requested of the running consumer
//! (and waited for), discards.

use std::time::{Duration, Instant};

use outbox_core::audit::RepairRequest;
use outbox_core::ops::format::{ErrorGroup, GROUP_SCAN, group_by_error};
use outbox_core::ops::scan::{self, LetterScan, REPAIR_SCAN};
use outbox_core::ops::{LetterFilter, LetterKind, LetterRecord, LetterStore, Page, RepairReport};
use serde::Serialize;

use crate::args::{LetterAction, LetterFilterArgs, LetterRepairArgs};
use crate::output::{Output, confirm, ops_error, print_next, print_report, repair_limit, request};
use crate::table::{Table, age, cut, opt, when};
use crate::{EXIT_OK, EXIT_PROBLEMS, Outcome};

/// [`scan::scan_letters`] through `ops`, its errors worded for the tool.
pub(crate) async fn scan_letters(
    ops: &impl LetterStore,
    filter: LetterFilter,
    fingerprint: Option<&str>,
    want: usize,
    max_read: usize,
) -> Result<LetterScan, String> {
    scan::scan_letters(
        |filter| async move { ops.letters(&filter).await.map_err(ops_error) },
        filter,
        fingerprint,
        want,
        max_read,
    )
    .await
}

/// A fingerprint as given, trimmed and in lower case (as printed).
fn normal_fingerprint(given: &str) -> String {
    given.trim().to_ascii_lowercase()
}

/// `list --group`: what `--json` prints.
#[derive(Serialize)]
struct Groups {
    groups: Vec<ErrorGroup>,
    /// Letters read.
    letters: usize,
    /// Whether more letters matched than were read.
    truncated: bool,
}

fn print_groups(out: &Output, letters: &[LetterRecord], truncated: bool) {
    let groups = Groups {
        groups: group_by_error(letters),
        letters: letters.len(),
        truncated,
    };
    if out.json {
        out.json(&groups);
        return;
    }
    let mut table = Table::new(&[
        "FINGERPRINT",
        "LETTERS",
        "FIRST SEEN",
        "LAST SEEN",
        "EVENT TYPES",
        "EXAMPLES",
        "FAILURE",
    ]);
    for g in &groups.groups {
        table.row(vec![
            g.fingerprint.clone(),
            g.count.to_string(),
            when(&g.first_seen),
            when(&g.last_seen),
            cut(&g.event_types.join(", "), 40),
            g.examples
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(","),
            cut(&g.shape, 80),
        ]);
    }
    print!("{}", table.render());
    if truncated {
        println!(
            "(grouped the oldest {GROUP_SCAN} matching letters; narrow the filters to see the rest)"
        );
    }
}

pub(crate) fn print_letters(out: &Output, page: &Page<LetterRecord>) {
    if out.json {
        out.json(page);
        return;
    }
    let mut table = Table::new(&[
        "ID",
        "EVENT",
        "AGGREGATE",
        "WRITTEN",
        "REPLAYS",
        "STATE",
        "REASON",
    ]);
    for l in &page.items {
        let state = if let Some(resolution) = &l.resolution {
            cut(resolution, 30)
        } else if l.replay_requested_at.is_some() {
            "replay asked".to_owned()
        } else {
            "open".to_owned()
        };
        table.row(vec![
            l.id.to_string(),
            match (&l.event_type, l.schema_version) {
                (Some(t), Some(v)) => format!("{t} v{v}"),
                (Some(t), None) => t.clone(),
                _ => String::new(),
            },
            match (&l.aggregate_type, &l.aggregate_id, l.aggregate_version) {
                (Some(t), Some(i), Some(v)) => format!("{t}/{}@{v}", cut(i, 30)),
                _ => String::new(),
            },
            when(&l.created_at),
            l.replays.to_string(),
            state,
            cut(&l.reason, 70),
        ]);
    }
    print!("{}", table.render());
    print_next(page.next, "--after");
}

pub(crate) fn print_letter(out: &Output, letter: &LetterRecord) {
    if out.json {
        out.json(letter);
        return;
    }
    let lines = [
        ("letter", letter.id.to_string()),
        ("consumer", letter.consumer.clone()),
        ("kind", letter.kind.clone()),
        ("event id", opt(&letter.event_id)),
        (
            "event type",
            match (&letter.event_type, letter.schema_version) {
                (Some(t), Some(v)) => format!("{t} v{v}"),
                _ => String::new(),
            },
        ),
        (
            "aggregate",
            match (
                &letter.aggregate_type,
                &letter.aggregate_id,
                letter.aggregate_version,
            ) {
                (Some(t), Some(i), Some(v)) => format!("{t}/{i} at version {v}"),
                _ => String::new(),
            },
        ),
        ("written", when(&letter.created_at)),
        ("attempts", letter.attempts.to_string()),
        ("reason", letter.reason.clone()),
        ("replays", letter.replays.to_string()),
        ("last replay", opt(&letter.last_replay_error)),
        (
            "replay asked",
            opt(&letter.replay_requested_at.as_ref().map(when)),
        ),
        ("resolved", opt(&letter.resolved_at.as_ref().map(when))),
        ("resolution", opt(&letter.resolution)),
    ];
    for (name, value) in lines {
        println!("{name:<12} {}", if value.is_empty() { "-" } else { &value });
    }
    println!(
        "headers\n{}",
        serde_json::to_string_pretty(&letter.headers).unwrap_or_default()
    );
    println!(
        "payload\n{}",
        serde_json::to_string_pretty(&letter.payload).unwrap_or_default()
    );
}

pub(crate) async fn letters(
    ops: &impl LetterStore,
    out: &Output,
    consumer: &str,
    kind: LetterKind,
    action: LetterAction,
) -> Outcome {
    match action {
        LetterAction::List {
            filter,
            all,
            limit,
            after,
            group,
        } if group || filter.fingerprint.is_some() => {
            let fingerprint = filter.fingerprint.as_deref().map(normal_fingerprint);
            let filter = LetterFilter {
                include_resolved: all,
                after,
                ..letter_filter_of(consumer, kind, filter)
            };
            if group {
                let scan =
                    scan_letters(ops, filter, fingerprint.as_deref(), usize::MAX, GROUP_SCAN)
                        .await?;
                print_groups(out, &scan.letters, scan.stopped_at.is_some());
            } else {
                // One fingerprint's letters, a page at a time from the
                // cursor; a page that read GROUP_SCAN letters without
                // filling up ends at the last one read, and the next page
                // goes on from there.
                let page_size = outbox_core::ops::page_limit(limit) as usize;
                let fingerprint = fingerprint.unwrap_or_default();
                let page = scan::fingerprint_page(
                    |filter| async move { ops.letters(&filter).await.map_err(ops_error) },
                    filter,
                    &fingerprint,
                    page_size,
                    GROUP_SCAN,
                )
                .await?;
                let (items, next) = (page.letters, page.next);
                print_letters(out, &Page { items, next });
            }
            Ok(EXIT_OK)
        }
        LetterAction::List {
            filter,
            all,
            limit,
            after,
            group: _,
        } => {
            let page = ops
                .letters(&LetterFilter {
                    include_resolved: all,
                    after,
                    limit,
                    ..letter_filter_of(consumer, kind, filter)
                })
                .await
                .map_err(ops_error)?;
            print_letters(out, &page);
            Ok(EXIT_OK)
        }
        LetterAction::Show { id } => match ops.letter(consumer, id).await.map_err(ops_error)? {
            Some(letter) if letter.kind == kind.as_str() => {
                print_letter(out, &letter);
                Ok(EXIT_OK)
            }
            Some(letter) => Err(format!(
                "letter {id} of {consumer} is {}, not {}",
                letter.kind,
                kind.as_str()
            )),
            None => Err(format!("no letter {id} of consumer {consumer}")),
        },
        LetterAction::Replay { select, wait } => {
            let (ids, request) = select_letters(ops, consumer, kind, select, "replay").await?;
            let report = ops
                .request_replay(consumer, kind, &ids, &request)
                .await
                .map_err(ops_error)?;
            if let Some(wait) = wait {
                return wait_for_replays(ops, out, consumer, &report, wait).await;
            }
            Ok(print_report(out, "replay_requested", &report))
        }
        LetterAction::Discard { select } => {
            let (ids, request) = select_letters(ops, consumer, kind, select, "discard").await?;
            let report = ops
                .discard(consumer, kind, &ids, &request)
                .await
                .map_err(ops_error)?;
            Ok(print_report(out, "discarded", &report))
        }
    }
}

pub(crate) fn letter_filter_of(
    consumer: &str,
    kind: LetterKind,
    filter: LetterFilterArgs,
) -> LetterFilter {
    LetterFilter {
        consumer: consumer.to_owned(),
        kind,
        event_type: filter.event_type,
        aggregate_type: filter.aggregate_type,
        aggregate_id: filter.aggregate_id,
        since: filter.since,
        until: filter.until,
        reason_contains: filter.error,
        ..LetterFilter::default()
    }
}

/// The letters a repair names: explicit ids, or open letters matching
/// filters with an explicit limit and a confirmation. The reason is checked
/// first, so a repair without one is refused before anything is read.
pub(crate) async fn select_letters(
    ops: &impl LetterStore,
    consumer: &str,
    kind: LetterKind,
    select: LetterRepairArgs,
    verb: &str,
) -> Result<(Vec<i64>, RepairRequest), String> {
    let request = request(&select.who)?;
    if !select.ids.is_empty() {
        if !select.filter.is_empty() || select.limit.is_some() {
            return Err("give either --id or filters with --limit, not both".to_owned());
        }
        return Ok((select.ids, request));
    }
    if select.filter.is_empty() {
        return Err(format!(
            "name the letters to {verb}: --id ID (repeatable), or filters (--event-type, --aggregate-type, --aggregate-id, --since, --until, --error, --fingerprint) with --limit N; there is no repair of everything"
        ));
    }
    let limit = repair_limit(select.limit)?;
    if let Some(fingerprint) = select.filter.fingerprint.as_deref().map(normal_fingerprint) {
        let filter = letter_filter_of(consumer, kind, select.filter);
        let scan = scan_letters(ops, filter, Some(&fingerprint), limit, REPAIR_SCAN).await?;
        let ids: Vec<i64> = scan.letters.iter().map(|l| l.id).collect();
        let cut_short = scan.stopped_at.is_some() && ids.len() < limit;
        if ids.is_empty() {
            return Err(if cut_short {
                format!(
                    "no open letter with fingerprint {fingerprint} among the oldest {REPAIR_SCAN} matching the filters; narrow them (--since, --event-type); nothing was changed"
                )
            } else {
                format!(
                    "no open letter with fingerprint {fingerprint} matches the filters; nothing was changed"
                )
            });
        }
        if cut_short {
            eprintln!(
                "note: read the oldest {REPAIR_SCAN} matching letters and found {} with fingerprint {fingerprint}; more may follow",
                ids.len()
            );
        }
        confirm(
            &format!("{verb} {} letter(s) of {consumer}", ids.len()),
            select.yes,
        )?;
        return Ok((ids, request));
    }
    let filter = letter_filter_of(consumer, kind, select.filter);
    let mut ids: Vec<i64> = Vec::new();
    let mut after = None;
    while ids.len() < limit {
        let page = ops
            .letters(&LetterFilter {
                limit: Some((limit - ids.len()) as i64),
                after,
                ..filter.clone()
            })
            .await
            .map_err(ops_error)?;
        ids.extend(page.items.iter().map(|l| l.id));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    ids.truncate(limit);
    if ids.is_empty() {
        return Err("no open letter matches the filters; nothing was changed".to_owned());
    }
    confirm(
        &format!("{verb} {} letter(s) of {consumer}", ids.len()),
        select.yes,
    )?;
    Ok((ids, request))
}

/// Waits until the consumer ran the requested replays, then shows what
/// each did; exits 1 when a replay did not apply its event (applied,
/// already applied or an ignored type count as done), did not run in
/// time, or a letter could not be requested (closed or unknown).
pub(crate) async fn wait_for_replays(
    ops: &impl LetterStore,
    out: &Output,
    consumer: &str,
    report: &RepairReport,
    wait: Duration,
) -> Outcome {
    let audit_id = report.audit_id;
    let ids: Vec<i64> = report
        .outcomes
        .iter()
        .filter(|o| o.outcome == "replay_requested")
        .filter_map(|o| o.id.parse().ok())
        .collect();
    let not_requested: Vec<&outbox_core::ops::IdOutcome> = report
        .outcomes
        .iter()
        .filter(|o| o.outcome != "replay_requested")
        .collect();
    // Each requested letter gets one outcome with `ran_at` in the audit
    // row, written in the transaction that settles it.
    // `--wait` may be as long as a u64 of seconds: past what an Instant
    // holds, the wait has no deadline.
    let deadline = Instant::now().checked_add(wait);
    let row = loop {
        let row = ops
            .audit_entry(audit_id)
            .await
            .map_err(ops_error)?
            .ok_or_else(|| format!("audit row {audit_id} is gone"))?;
        let done = ran_ids(&row.outcomes);
        if ids.iter().all(|id| done.contains(&id.to_string()))
            || deadline.is_some_and(|deadline| Instant::now() > deadline)
        {
            break row;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let ran: Vec<&serde_json::Value> = row
        .outcomes
        .as_array()
        .map(|all| all.iter().filter(|o| o.get("ran_at").is_some()).collect())
        .unwrap_or_default();
    let done = ran_ids(&row.outcomes);
    let not_run: Vec<i64> = ids
        .iter()
        .copied()
        .filter(|id| !done.contains(&id.to_string()))
        .collect();
    if !not_run.is_empty() {
        eprintln!(
            "{} replay(s) did not run within {}: is consumer {consumer} running? The requests stay; it runs them when it does (audit row {audit_id})",
            not_run.len(),
            age(Some(wait.as_secs_f64()))
        );
    }
    // Only an applied (or ignored) event is a success; a replay that
    // left its event unapplied is not, even when it closed the letter.
    let open = ran
        .iter()
        .filter(|o| {
            !o.get("outcome")
                .and_then(serde_json::Value::as_str)
                .is_some_and(outbox_core::consumer::ReplayOutcome::label_succeeded)
        })
        .count();
    if out.json {
        out.json(&row);
    } else {
        let mut table = Table::new(&["LETTER", "OUTCOME", "DETAIL"]);
        for o in &ran {
            let text = |key: &str| o.get(key).and_then(serde_json::Value::as_str).unwrap_or("");
            let detail = ["error", "reason"]
                .iter()
                .map(|k| text(k))
                .find(|t| !t.is_empty())
                .map(str::to_owned)
                .or_else(|| {
                    o.get("waiting_for")
                        .map(|v| format!("waits for version {v}"))
                })
                .or_else(|| {
                    o.get("position").map(|v| {
                        let open = o.get("letter_open") == Some(&serde_json::Value::Bool(true));
                        format!(
                            "position {v}: not applied{}",
                            if open { "; the letter stays open" } else { "" }
                        )
                    })
                })
                .unwrap_or_default();
            table.row(vec![
                text("id").to_owned(),
                text("outcome").to_owned(),
                cut(&detail, 80),
            ]);
        }
        for o in &not_requested {
            table.row(vec![
                o.id.clone(),
                o.outcome.clone(),
                o.detail.clone().unwrap_or_default(),
            ]);
        }
        for id in &not_run {
            table.row(vec![
                id.to_string(),
                "not_run".to_owned(),
                "no outcome yet".to_owned(),
            ]);
        }
        print!("{}", table.render());
        println!(
            "{} of {} replay(s) ran by {consumer} applied their event; audit row {audit_id}",
            ran.len() - open,
            ran.len()
        );
    }
    Ok(
        if open == 0 && not_requested.is_empty() && not_run.is_empty() {
            EXIT_OK
        } else {
            EXIT_PROBLEMS
        },
    )
}

/// The letter ids of the outcomes a consumer recorded (`ran_at`).
pub(crate) fn ran_ids(outcomes: &serde_json::Value) -> Vec<String> {
    outcomes
        .as_array()
        .map(|all| {
            all.iter()
                .filter(|o| o.get("ran_at").is_some())
                .filter_map(|o| o.get("id").and_then(serde_json::Value::as_str))
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}
