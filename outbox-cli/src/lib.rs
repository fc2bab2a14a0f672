//! # outbox-cli
//!
//! The `outbox` operator tool over [`outbox_core::ops`]: `status`,
//! `failed list|show|retry|skip`, `events list|show|republish`,
//! `blocked list|retry`, `quarantine` and `dead-letters list|show|replay|discard`,
//! `positions show|pass`, `audit list`, `cleanup`, `migrate`, `console`,
//! `registry check|diff|…`. Human tables by default, `--json` for scripts.
//! Exit codes: 0 ok; 1 `status --check` found problems, a repair left some
//! of the ids it named unchanged, or a replay waited for did not apply its
//! event (applied, already applied or an ignored type count as done) or
//! did not run in time; 2
//! bad usage, a refused repair or no database. The runbook is
//! `docs/operations.md` in the repository.
//!
//! `--database-url` takes PostgreSQL (`postgres://…`), a SQLite file
//! (`sqlite://app.db`, the `outbox-sqlite` store) or MySQL/MariaDB
//! (`mysql://…`, the `outbox-mysql` store). On SQLite and MySQL the relay's
//! commands run through [`outbox_core::ops::OperationsStore`] unchanged
//! (`status`, `failed`, `events`, `blocked`, `audit`, `cleanup`,
//! `migrate`) and the consumer's (`quarantine`, `dead-letters`,
//! `positions`) through [`outbox_core::ops::LetterStore`], as on
//! PostgreSQL.
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
mod audit;
mod cleanup;
mod console;
mod events;
mod letters;
mod output;
mod positions;
mod status;
mod stores;
mod table;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use outbox_core::ops::{LetterKind, LetterStore, OperationsStore, Redaction, StatusOptions};
use outbox_postgres::Ops;
use outbox_postgres::SchemaName;
use sqlx::postgres::PgPoolOptions;

use args::{AuditAction, BlockedAction, Cli, Command};
use audit::audit;
use cleanup::cleanup;
use events::{events, failed};
use letters::letters;
use output::{Output, ops_error, print_report, request};
use positions::positions;
use status::{blocked, status};
use stores::{is_mysql_url, is_sqlite_url, mysql, sqlite};

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

pub(crate) type Outcome = Result<u8, String>;

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
        outbox_postgres::migrate(&pool, &schema)
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
        command => store_command(&ops, &out, command).await,
    }
}

/// Runs a command on a store that keeps a consumer's tables too
/// (PostgreSQL, SQLite, MySQL): the consumer's commands through [`LetterStore`],
/// the rest through [`relay_command`].
pub(crate) async fn store_command<O: OperationsStore + LetterStore>(
    ops: &O,
    out: &Output,
    command: Command,
) -> Outcome {
    match command {
        Command::Quarantine { consumer, action } => {
            letters(
                ops,
                out,
                &required_consumer(consumer)?,
                LetterKind::Quarantined,
                action,
            )
            .await
        }
        Command::DeadLetters { consumer, action } => {
            letters(
                ops,
                out,
                &required_consumer(consumer)?,
                LetterKind::DeadLettered,
                action,
            )
            .await
        }
        Command::Positions { consumer, action } => {
            positions(ops, out, &required_consumer(consumer)?, action).await
        }
        command => relay_command(ops, out, command).await,
    }
}

/// Runs a command on the relay's side of any store (status, events,
/// blocked aggregates, the audit, repairs, cleanup). The consumer's
/// commands are refused here: on stores with consumer tables
/// [`store_command`] runs them before this.
pub(crate) async fn relay_command<O: OperationsStore>(
    ops: &O,
    out: &Output,
    command: Command,
) -> Outcome {
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
            Err("quarantine, dead letters and positions are a consumer's tables, which this store's operations do not read (they implement OperationsStore but not LetterStore)".to_owned())
        }
        Command::Migrate | Command::Registry { .. } | Command::Console(_) => Ok(EXIT_OK),
    }
}

pub(crate) fn required_consumer(consumer: Option<String>) -> Result<String, String> {
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
