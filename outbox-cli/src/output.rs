//! How the tool answers: human tables or `--json`, repair reports and
//! their exit codes, confirmations, the repair request of
//! `--operator`/`--reason`.

use std::io::{BufRead, IsTerminal, Write};

use outbox_core::audit::RepairRequest;
use outbox_core::ops::{OpsError, RepairReport};
use serde::Serialize;

use crate::args::Who;
use crate::table::Table;
use crate::{EXIT_OK, EXIT_PROBLEMS};

/// Human tables or one JSON document.
pub(crate) struct Output {
    /// `--json`: one JSON document instead of tables.
    pub(crate) json: bool,
}

impl Output {
    /// Prints `value` as pretty JSON.
    pub(crate) fn json<T: Serialize>(&self, value: &T) {
        match serde_json::to_string_pretty(value) {
            Ok(text) => println!("{text}"),
            Err(error) => eprintln!("error: cannot render JSON: {error}"),
        }
    }
}

pub(crate) fn ops_error(error: OpsError) -> String {
    error.to_string()
}

pub(crate) fn request(who: &Who) -> Result<RepairRequest, String> {
    let reason = who.reason.clone().unwrap_or_default();
    let request = match &who.operator {
        Some(operator) => RepairRequest::new(operator.clone(), reason),
        None => RepairRequest::by_os_user(reason),
    };
    request
        .map_err(|e| format!("{e} (use --reason \"…\" and, without an OS user, --operator NAME)"))
}

/// The `--limit` of a repair by filter: required, from 1 to
/// `MAX_REPAIR_IDS`.
pub(crate) fn repair_limit(limit: Option<i64>) -> Result<usize, String> {
    let max = outbox_core::ops::MAX_REPAIR_IDS;
    match limit {
        None => Err(format!(
            "a repair by filter needs an explicit --limit (1 to {max})"
        )),
        Some(n) if n < 1 || n as usize > max => Err(format!(
            "--limit {n} is out of range: a repair by filter takes 1 to {max} ids"
        )),
        Some(n) => Ok(n as usize),
    }
}

pub(crate) fn confirm(what: &str, yes: bool) -> Result<(), String> {
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(format!(
            "{what}: confirm with --yes (no terminal to ask); nothing was changed"
        ));
    }
    eprint!("{what}? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().lock().read_line(&mut answer);
    if matches!(answer.trim(), "y" | "Y" | "yes") {
        Ok(())
    } else {
        Err("not confirmed; nothing was changed".to_owned())
    }
}

/// Prints what a repair did; exit 1 when it changed fewer ids than it
/// named (the outcomes say why), 0 when it changed them all.
pub(crate) fn print_report(out: &Output, done: &str, report: &RepairReport) -> u8 {
    let code = if report.count(done) == report.outcomes.len() {
        EXIT_OK
    } else {
        EXIT_PROBLEMS
    };
    if out.json {
        out.json(report);
        return code;
    }
    let mut table = Table::new(&["ID", "OUTCOME", "DETAIL"]);
    for o in &report.outcomes {
        table.row(vec![
            o.id.clone(),
            o.outcome.clone(),
            o.detail.clone().unwrap_or_default(),
        ]);
    }
    print!("{}", table.render());
    println!(
        "{} of {} {done}; audit row {}",
        report.count(done),
        report.outcomes.len(),
        report.audit_id
    );
    code
}

pub(crate) fn print_next(next: Option<i64>, flag: &str) {
    if let Some(next) = next {
        println!("(more: {flag} {next})");
    }
}
