//! # outbox-cli
//!
//! The `outbox` operator tool over [`outbox_core::ops`]: `status`,
//! `failed list|show|retry|skip`, `events list|show|republish`,
//! `blocked list`, `quarantine` and `dead-letters list|show|replay|discard`,
//! `positions show|pass`, `audit list`, `cleanup`, `migrate`,
//! `registry check|diff|…`. Human tables by default, `--json` for scripts.
//! Exit codes: 0 ok; 1 `status --check` found problems, a repair left some
//! of the ids it named unchanged, or a replay waited for left its letter
//! open or did not run in time; 2
//! bad usage, a refused repair or no database. The runbook is
//! `docs/operations.md` in the repository.
//!
//! `--database-url` takes PostgreSQL (`postgres://…`), a SQLite file
//! (`sqlite://app.db`, the `outbox-sqlite` store) or MySQL/MariaDB
//! (`mysql://…`, the `outbox-mysql` store). On SQLite and MySQL the relay's
//! commands run through [`outbox_core::ops::OperationsStore`] unchanged
//! (`status`, `failed`, `events`, `blocked`, `audit`, `cleanup`,
//! `migrate`); the consumer's (`quarantine`, `dead-letters`, `positions`)
//! exit 2 with the reason: those stores keep no consumer tables yet.
//!
//! The tool shows payloads through the contracts linked into it: fields
//! marked `#[outbox(redact)]` are masked, and event types it has no
//! contract for are masked entirely (or only `--redact-keys`). A service
//! builds its own `outbox` binary with its contracts linked in (the
//! repository's tests build and run exactly this, as
//! `tests/src/bin/outbox-tool.rs`):
//!
//! ```ignore
//! // src/bin/outbox.rs of the service; `my_service_contracts` is the crate
//! // with its #[derive(OutboxEvent)] types
//! extern crate my_service_contracts;
//!
//! fn main() -> std::process::ExitCode {
//!     outbox_cli::run()
//! }
//! ```
//!
//! Replays are run by the consumer itself (it has the handlers): the tool
//! marks the letters with the request and the audit row, and the running
//! consumer replays them at its next sweep (`--wait` waits for it).

mod args;
mod console;
mod table;

use std::ffi::OsString;
use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use outbox_core::audit::RepairRequest;
use outbox_core::ops::{
    EventFilter, EventRecord, EventStatus, LetterFilter, LetterKind, LetterRecord, OperationsStore,
    Ops, OpsError, Page, Redaction, RepairReport, StatusOptions,
};
use outbox_core::relay::FailedHeadPolicy;
use outbox_core::store::SchemaName;
use serde::Serialize;
use sqlx::postgres::PgPoolOptions;

use args::{
    AuditAction, BlockedAction, Cli, Command, EventFilterArgs, EventRepairArgs, EventsAction,
    FailedAction, LetterAction, LetterFilterArgs, LetterRepairArgs, PositionAction, Who,
};
use table::{Table, age, cut, opt, when};

/// Exit code: done, nothing to report.
pub const EXIT_OK: u8 = 0;
/// Exit code: `status --check` found problems, a repair left some of its
/// ids unchanged, or a replay waited for did not apply its event or did
/// not run in time.
pub const EXIT_PROBLEMS: u8 = 1;
/// Exit code: bad usage, a refused repair, or the database cannot be reached.
pub const EXIT_USAGE: u8 = 2;

/// Parses the process arguments and runs the command.
pub fn run() -> ExitCode {
    run_from(std::env::args_os())
}

/// Runs the command in `args` (the first is the program name).
pub fn run_from(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return ExitCode::from(if error.use_stderr() {
                EXIT_USAGE
            } else {
                EXIT_OK
            });
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(format!("cannot start the runtime: {error}")),
    };
    match runtime.block_on(execute(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(message) => fail(message),
    }
}

fn fail(message: String) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(EXIT_USAGE)
}

type Outcome = Result<u8, String>;

async fn execute(cli: Cli) -> Outcome {
    if let Command::Registry { command } = cli.command {
        let format = if cli.json {
            outbox_codegen::cli::Format::Json
        } else {
            outbox_codegen::cli::Format::Text
        };
        let code = outbox_codegen::cli::run_with(outbox_codegen::cli::Cli { format, command });
        return Ok(if code == ExitCode::SUCCESS {
            EXIT_OK
        } else {
            exit_code_of(code)
        });
    }
    let url = cli
        .database_url
        .clone()
        .ok_or("no database: pass --database-url or set DATABASE_URL")?;
    let redaction = Redaction {
        unknown_type_keys: cli.redact_keys.clone(),
        extra_keys: Vec::new(),
    };
    let out = Output { json: cli.json };
    let failed_heads = cli.failed_head_policy.into();
    if is_sqlite_url(&url) {
        return sqlite(&url, cli.command, redaction, failed_heads, &out).await;
    }
    if is_mysql_url(&url) {
        return mysql(&url, cli.command, redaction, failed_heads, &out).await;
    }
    let schema = SchemaName::new(cli.schema.clone()).map_err(|e| e.to_string())?;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&url)
        .await
        .map_err(|e| format!("cannot connect to the database: {e}"))?;
    if let Command::Migrate = cli.command {
        outbox_core::store::migrate(&pool, &schema)
            .await
            .map_err(|e| e.to_string())?;
        if out.json {
            println!(
                "{}",
                serde_json::json!({ "schema": schema.as_str(), "migrated": true })
            );
        } else {
            println!("schema {schema} migrated");
        }
        return Ok(EXIT_OK);
    }
    let ops = Ops::new(pool, schema)
        .with_redaction(redaction)
        .with_failed_head_policy(failed_heads);
    match cli.command {
        Command::Console(args) => console::serve(ops, args).await,
        Command::Quarantine { consumer, action } => {
            letters(
                &ops,
                &out,
                &required_consumer(consumer)?,
                LetterKind::Quarantined,
                action,
            )
            .await
        }
        Command::DeadLetters { consumer, action } => {
            letters(
                &ops,
                &out,
                &required_consumer(consumer)?,
                LetterKind::DeadLettered,
                action,
            )
            .await
        }
        Command::Positions { consumer, action } => {
            positions(&ops, &out, &required_consumer(consumer)?, action).await
        }
        command => relay_command(&ops, &out, command).await,
    }
}

/// Whether `url` names a SQLite database (`sqlite://file.db`,
/// `sqlite:file.db`, `sqlite::memory:`).
fn is_sqlite_url(url: &str) -> bool {
    url.starts_with("sqlite:")
}

/// The commands on a SQLite outbox: `migrate` creates the file and its
/// tables; every other command needs a migrated file (a mistyped path is
/// an error, not a new empty database). The consumer's commands are
/// refused: the SQLite store keeps no consumer tables yet.
async fn sqlite(
    url: &str,
    command: Command,
    redaction: Redaction,
    failed_heads: FailedHeadPolicy,
    out: &Output,
) -> Outcome {
    let migrate = matches!(command, Command::Migrate);
    let options = outbox_sqlite::connect_options(url)
        .map_err(|e| format!("not a SQLite database URL: {e}"))?
        .create_if_missing(migrate);
    let file = options.get_filename();
    if !migrate && !file.exists() && !url.contains(":memory:") {
        return Err(format!(
            "no SQLite database at {}: check the path, or create it with `outbox --database-url {url} migrate`",
            file.display()
        ));
    }
    let pool = sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| format!("cannot open the SQLite database {url}: {e}"))?;
    if migrate {
        outbox_sqlite::migrate(&pool)
            .await
            .map_err(|e| e.to_string())?;
        if out.json {
            println!(
                "{}",
                serde_json::json!({ "database": url, "migrated": true, "schema_version": outbox_sqlite::SCHEMA_VERSION })
            );
        } else {
            println!(
                "{url} migrated (schema version {})",
                outbox_sqlite::SCHEMA_VERSION
            );
        }
        return Ok(EXIT_OK);
    }
    let version: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&pool)
        .await
        .map_err(|e| format!("cannot read {url}: {e}"))?;
    if version == 0 {
        return Err(format!(
            "{url} has no outbox tables: run `outbox --database-url {url} migrate` (or the service's migrate) first"
        ));
    }
    if version > outbox_sqlite::SCHEMA_VERSION {
        return Err(format!(
            "{url} has outbox schema version {version}, newer than this tool's {}: use the tool of the service's release",
            outbox_sqlite::SCHEMA_VERSION
        ));
    }
    let ops = outbox_sqlite::SqliteOps::new(pool)
        .with_redaction(redaction)
        .with_failed_head_policy(failed_heads);
    match command {
        Command::Console(args) => console::serve(ops, args).await,
        command => relay_command(&ops, out, command).await,
    }
}

/// Whether `url` names a MySQL or MariaDB database (`mysql://…`,
/// `mariadb://…`).
fn is_mysql_url(url: &str) -> bool {
    url.starts_with("mysql:") || url.starts_with("mariadb:")
}

/// The commands on a MySQL/MariaDB outbox: `migrate` creates the tables;
/// every other command needs them. A server without `SKIP LOCKED` is
/// refused with its version. The consumer's commands are refused: the
/// MySQL store keeps no consumer tables yet.
async fn mysql(
    url: &str,
    command: Command,
    redaction: Redaction,
    failed_heads: FailedHeadPolicy,
    out: &Output,
) -> Outcome {
    let url = url.replacen("mariadb:", "mysql:", 1);
    let options = <sqlx::mysql::MySqlConnectOptions as std::str::FromStr>::from_str(&url)
        .map_err(|e| format!("not a MySQL database URL: {e}"))?;
    let database = options.get_database().unwrap_or_default().to_owned();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(options)
        .await
        .map_err(|e| format!("cannot connect to the database: {e}"))?;
    outbox_mysql::check_server(&pool)
        .await
        .map_err(|e| e.to_string())?;
    if let Command::Migrate = command {
        outbox_mysql::migrate(&pool)
            .await
            .map_err(|e| e.to_string())?;
        if out.json {
            println!(
                "{}",
                serde_json::json!({ "database": database, "migrated": true, "schema_version": outbox_mysql::SCHEMA_VERSION })
            );
        } else {
            println!(
                "database {database} migrated (schema version {})",
                outbox_mysql::SCHEMA_VERSION
            );
        }
        return Ok(EXIT_OK);
    }
    let migrated: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.tables
         WHERE table_schema = DATABASE() AND table_name = 'outbox_events'",
    )
    .fetch_one(&pool)
    .await
    .map_err(|e| format!("cannot read the database: {e}"))?;
    if migrated == 0 {
        return Err(format!(
            "database {database} has no outbox tables: run `outbox --database-url … migrate` (or the service's migrate) first"
        ));
    }
    let ops = outbox_mysql::MySqlOps::new(pool)
        .with_redaction(redaction)
        .with_failed_head_policy(failed_heads);
    match command {
        Command::Console(args) => console::serve(ops, args).await,
        command => relay_command(&ops, out, command).await,
    }
}

/// Runs a command on the relay's side of any store (status, events,
/// blocked aggregates, the audit, repairs, cleanup). The consumer's
/// commands are refused here: on PostgreSQL they are run before this.
async fn relay_command<O: OperationsStore>(ops: &O, out: &Output, command: Command) -> Outcome {
    match command {
        Command::Status {
            check,
            max_age,
            max_lag,
        } => {
            let options = StatusOptions {
                max_pending_age: max_age,
                max_consumer_lag: max_lag,
                ..StatusOptions::default()
            };
            status(ops, out, check, &options).await
        }
        Command::Failed { action } => failed(ops, out, action).await,
        Command::Events { action } => events(ops, out, action).await,
        Command::Blocked {
            action: BlockedAction::List { limit },
        } => blocked(ops, out, limit).await,
        Command::Blocked {
            action: BlockedAction::Retry { ids, who },
        } => {
            let report = ops
                .retry_blocked(&ids, &request(&who)?)
                .await
                .map_err(ops_error)?;
            Ok(print_report(out, "retried", &report))
        }
        Command::Audit {
            action: AuditAction::List { limit, before },
        } => audit(ops, out, limit, before).await,
        Command::Cleanup {
            older_than,
            keys_older_than,
            execute,
            batch,
            who,
        } => {
            let plan = outbox_core::ops::Cleanup {
                events_older_than: older_than,
                keys_older_than,
                batch,
                execute,
            };
            cleanup(ops, out, &plan, &who).await
        }
        Command::Quarantine { .. } | Command::DeadLetters { .. } | Command::Positions { .. } => {
            Err("quarantine, dead letters and positions are a consumer's tables, which this store does not keep (the SQLite and MySQL stores have the relay's side only so far): run consumers on PostgreSQL".to_owned())
        }
        Command::Migrate | Command::Registry { .. } | Command::Console(_) => Ok(EXIT_OK),
    }
}

fn required_consumer(consumer: Option<String>) -> Result<String, String> {
    consumer.ok_or_else(|| "name the consumer: --consumer NAME".to_owned())
}

fn exit_code_of(code: ExitCode) -> u8 {
    // The codegen tool uses the same codes: 1 findings, 2 bad input.
    if code == ExitCode::from(1) {
        EXIT_PROBLEMS
    } else {
        EXIT_USAGE
    }
}

/// Human tables or one JSON document.
struct Output {
    json: bool,
}

impl Output {
    fn json<T: Serialize>(&self, value: &T) {
        match serde_json::to_string_pretty(value) {
            Ok(text) => println!("{text}"),
            Err(error) => eprintln!("error: cannot render JSON: {error}"),
        }
    }
}

fn ops_error(error: OpsError) -> String {
    error.to_string()
}

fn request(who: &Who) -> Result<RepairRequest, String> {
    let reason = who.reason.clone().unwrap_or_default();
    let request = match &who.operator {
        Some(operator) => RepairRequest::new(operator.clone(), reason),
        None => RepairRequest::by_os_user(reason),
    };
    request
        .map_err(|e| format!("{e} (use --reason \"…\" and, without an OS user, --operator NAME)"))
}

/// Partitions as ranges (`: 0-3, 8, 10-12`), or nothing when there are none.
fn ranges(partitions: &[i32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut iter = partitions.iter().copied().peekable();
    while let Some(start) = iter.next() {
        let mut end = start;
        while iter.peek() == Some(&(end + 1)) {
            end = iter.next().unwrap_or(end);
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(": {}", parts.join(", "))
    }
}

async fn status(
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

fn blocked_table(blocked: &[outbox_core::ops::BlockedRecord]) -> Table {
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

fn filter_of(args: &EventFilterArgs, status: EventStatus) -> EventFilter {
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

fn print_events(out: &Output, page: &Page<EventRecord>) {
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

fn print_next(next: Option<i64>, flag: &str) {
    if let Some(next) = next {
        println!("(more: {flag} {next})");
    }
}

fn print_event(out: &Output, event: &EventRecord) {
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

async fn failed(ops: &impl OperationsStore, out: &Output, action: FailedAction) -> Outcome {
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

async fn events(ops: &impl OperationsStore, out: &Output, action: EventsAction) -> Outcome {
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

async fn show_event(ops: &impl OperationsStore, out: &Output, id: uuid::Uuid) -> Outcome {
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
async fn select_events(
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

/// The `--limit` of a repair by filter: required, from 1 to
/// `MAX_REPAIR_IDS`.
fn repair_limit(limit: Option<i64>) -> Result<usize, String> {
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

fn confirm(what: &str, yes: bool) -> Result<(), String> {
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
fn print_report(out: &Output, done: &str, report: &RepairReport) -> u8 {
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

async fn blocked(ops: &impl OperationsStore, out: &Output, limit: i64) -> Outcome {
    let blocked = ops.blocked(limit).await.map_err(ops_error)?;
    if out.json {
        out.json(&blocked);
    } else {
        print!("{}", blocked_table(&blocked).render());
    }
    Ok(EXIT_OK)
}

fn print_letters(out: &Output, page: &Page<LetterRecord>) {
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

fn print_letter(out: &Output, letter: &LetterRecord) {
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

async fn letters(
    ops: &Ops,
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

fn letter_filter_of(consumer: &str, kind: LetterKind, filter: LetterFilterArgs) -> LetterFilter {
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
async fn select_letters(
    ops: &Ops,
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
            "name the letters to {verb}: --id ID (repeatable), or filters (--event-type, --aggregate-type, --aggregate-id, --since, --until, --error) with --limit N; there is no repair of everything"
        ));
    }
    let limit = repair_limit(select.limit)?;
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

async fn positions(ops: &Ops, out: &Output, consumer: &str, action: PositionAction) -> Outcome {
    match action {
        PositionAction::Show { aggregate } => {
            let position = ops
                .position(consumer, &aggregate.aggregate_type, &aggregate.aggregate_id)
                .await
                .map_err(ops_error)?
                .ok_or_else(|| {
                    format!(
                        "consumer {consumer} has no position for {}/{}",
                        aggregate.aggregate_type, aggregate.aggregate_id
                    )
                })?;
            if out.json {
                out.json(&position);
            } else {
                println!(
                    "{consumer} at {}/{}: version {} ({}), moved {}",
                    position.aggregate_type,
                    position.aggregate_id,
                    position.version,
                    if position.pinned {
                        "started"
                    } else {
                        "not started"
                    },
                    when(&position.updated_at)
                );
            }
            Ok(EXIT_OK)
        }
        PositionAction::Pass {
            aggregate,
            version,
            who,
        } => {
            let request = request(&who)?;
            let report = ops
                .pass_version(
                    consumer,
                    &aggregate.aggregate_type,
                    &aggregate.aggregate_id,
                    version,
                    &request,
                )
                .await
                .map_err(ops_error)?;
            Ok(print_report(out, "passed", &report))
        }
    }
}

/// Waits until the consumer ran the requested replays, then shows what
/// each did; exits 1 when a replay did not apply its event (applied,
/// already applied or an ignored type count as done), did not run in
/// time, or a letter could not be requested (closed or unknown).
async fn wait_for_replays(
    ops: &Ops,
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
    let deadline = Instant::now() + wait;
    let row = loop {
        let row = ops
            .audit_entry(audit_id)
            .await
            .map_err(ops_error)?
            .ok_or_else(|| format!("audit row {audit_id} is gone"))?;
        let done = ran_ids(&row.outcomes);
        if ids.iter().all(|id| done.contains(&id.to_string())) || Instant::now() > deadline {
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
fn ran_ids(outcomes: &serde_json::Value) -> Vec<String> {
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

async fn audit(
    ops: &impl OperationsStore,
    out: &Output,
    limit: Option<i64>,
    before: Option<i64>,
) -> Outcome {
    let page = ops.audit(before, limit).await.map_err(ops_error)?;
    if out.json {
        out.json(&page);
        return Ok(EXIT_OK);
    }
    let mut table = Table::new(&["ID", "AT", "OPERATOR", "ACTION", "TARGET", "IDS", "REASON"]);
    for a in &page.items {
        table.row(vec![
            a.id.to_string(),
            when(&a.at),
            a.operator.clone(),
            a.action.clone(),
            a.target.clone(),
            cut(&a.ids.join(","), 40),
            cut(&a.reason, 60),
        ]);
    }
    print!("{}", table.render());
    print_next(page.next, "--before");
    Ok(EXIT_OK)
}

async fn cleanup(
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
