//! The command line, as clap parses it.

use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// `outbox`: operate an outbox.
#[derive(Debug, Parser)]
#[command(
    name = "outbox",
    version,
    about = "Operate an outbox: status, failed events, blocked aggregates, quarantine and dead letters, replays and repairs with a reason and an audit trail, cleanup, migrations, schema registry checks.",
    after_help = "Exit codes: 0 ok; 1 `status --check` found problems, a repair left some of its ids unchanged, or a replay waited for did not apply its event (applied, already applied or an ignored type count as done) or did not run in time; 2 bad usage, a refused repair, or a database that cannot be reached.\n\
                  Payloads are shown redacted: the `redact` fields of event types whose contracts are linked into this binary, every value of other event types (or only --redact-keys)."
)]
pub(crate) struct Cli {
    /// The service's database: `postgres://…`, a SQLite file
    /// (`sqlite://app.db`) or MySQL/MariaDB (`mysql://…`); every command
    /// works on all three.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub(crate) database_url: Option<String>,
    /// The schema that holds the outbox tables (PostgreSQL).
    #[arg(long, default_value = "outbox", global = true)]
    pub(crate) schema: String,
    /// One JSON document instead of human tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// For event types this binary has no contract for, mask only these
    /// top-level keys (comma-separated) instead of every value.
    #[arg(long, global = true, value_delimiter = ',')]
    pub(crate) redact_keys: Option<Vec<String>>,
    /// The relays' `failed_head_policy`: with `block` a failed head holds
    /// its aggregate's later events, with `skip` it does not; `status` and
    /// `blocked` count blocked aggregates as the relays treat them.
    #[arg(
        long,
        value_enum,
        default_value = "block",
        env = "OUTBOX_FAILED_HEAD_POLICY",
        global = true
    )]
    pub(crate) failed_head_policy: HeadPolicy,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// `--failed-head-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum HeadPolicy {
    /// A failed head blocks its aggregate (the relay's default).
    Block,
    /// Failed heads are stepped over.
    Skip,
}

impl From<HeadPolicy> for outbox_core::relay::FailedHeadPolicy {
    fn from(policy: HeadPolicy) -> Self {
        match policy {
            HeadPolicy::Block => outbox_core::relay::FailedHeadPolicy::Block,
            HeadPolicy::Skip => outbox_core::relay::FailedHeadPolicy::Skip,
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Backlog, blocked aggregates and consumers at a glance.
    Status {
        /// Exit with 1 when there are problems (failed or blocked events, an
        /// old backlog, quarantine or dead letters).
        #[arg(long)]
        check: bool,
        /// A pending event older than this is a problem.
        #[arg(long, default_value = "5m", value_parser = parse_duration)]
        max_age: Duration,
        /// A consumer whose last applied event was older than this is a problem.
        #[arg(long, default_value = "5m", value_parser = parse_duration)]
        max_lag: Duration,
    },
    /// Events that failed to publish.
    Failed {
        #[command(subcommand)]
        action: FailedAction,
    },
    /// Events in any state; publishing published ones again.
    Events {
        #[command(subcommand)]
        action: EventsAction,
    },
    /// Aggregates waiting behind a retrying or failed head.
    Blocked {
        #[command(subcommand)]
        action: BlockedAction,
    },
    /// Messages a consumer could not read.
    Quarantine {
        /// The consumer (required; before or after the subcommand).
        #[arg(long, global = true)]
        consumer: Option<String>,
        #[command(subcommand)]
        action: LetterAction,
    },
    /// Messages whose handler failed for good.
    DeadLetters {
        /// The consumer (required; before or after the subcommand).
        #[arg(long, global = true)]
        consumer: Option<String>,
        #[command(subcommand)]
        action: LetterAction,
    },
    /// A consumer's position per aggregate (RejectStale and Strict).
    Positions {
        /// The consumer (required; before or after the subcommand).
        #[arg(long, global = true)]
        consumer: Option<String>,
        #[command(subcommand)]
        action: PositionAction,
    },
    /// Every repair: who, when, why, which ids, what happened.
    Audit {
        #[command(subcommand)]
        action: AuditAction,
    },
    /// Delete published events older than an age, and idempotency keys
    /// older than the key retention (a dry run unless --execute).
    Cleanup {
        /// Delete published events older than this (`7d`, `12h`).
        #[arg(long, value_parser = parse_duration)]
        older_than: Duration,
        /// Delete producer idempotency keys older than this (default 7d,
        /// the longest a client may retry a command: a key deleted sooner
        /// lets a late retry emit its event twice).
        #[arg(long, value_parser = parse_duration, default_value = "7d")]
        keys_older_than: Duration,
        /// Delete; without it only count.
        #[arg(long)]
        execute: bool,
        /// Rows per delete.
        #[arg(long, default_value_t = 1000)]
        batch: i64,
        #[command(flatten)]
        who: Who,
    },
    /// Apply the outbox migrations (PostgreSQL: to the schema; SQLite: to
    /// the file, created if missing; MySQL/MariaDB: to the database).
    Migrate,
    /// Serve the web console: the status, failed events, blocked
    /// aggregates, letters grouped by error and the audit log, with audited
    /// repairs. With OUTBOX_CONSOLE_TOKEN set, browsers sign in with HTTP
    /// Basic (user: the operator's name, password: the token); without it
    /// only a loopback address is served, every request acting as
    /// --operator.
    Console(ConsoleArgs),
    /// Schema registry checks (the `outbox-codegen` commands).
    Registry {
        #[command(subcommand)]
        command: outbox_codegen::cli::Command,
    },
}

/// `outbox console`.
#[derive(Debug, Args)]
pub(crate) struct ConsoleArgs {
    /// The address to serve on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub(crate) listen: std::net::SocketAddr,
    /// Show everything, refuse every action.
    #[arg(long)]
    pub(crate) read_only: bool,
    /// Without OUTBOX_CONSOLE_TOKEN: the operator every request acts as
    /// (default: the OS user). The token is read from the environment
    /// only, never from an argument other users could see.
    #[arg(long)]
    pub(crate) operator: Option<String>,
    /// The status page flags a pending event older than this.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub(crate) max_age: Duration,
    /// The status page flags a consumer whose last applied event was older
    /// than this.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub(crate) max_lag: Duration,
}

/// Who asks for a repair, and why.
#[derive(Debug, Args)]
pub(crate) struct Who {
    /// Why (required for every repair and cleanup).
    #[arg(long)]
    pub(crate) reason: Option<String>,
    /// Who (default: the OS user).
    #[arg(long)]
    pub(crate) operator: Option<String>,
}

/// Filters of event listings.
#[derive(Debug, Args, Default)]
pub(crate) struct EventFilterArgs {
    /// Only this event type.
    #[arg(long)]
    pub(crate) event_type: Option<String>,
    /// Only this aggregate type.
    #[arg(long)]
    pub(crate) aggregate_type: Option<String>,
    /// Only this aggregate id.
    #[arg(long)]
    pub(crate) aggregate_id: Option<String>,
    /// At or after (RFC 3339).
    #[arg(long)]
    pub(crate) since: Option<chrono::DateTime<chrono::Utc>>,
    /// Before (RFC 3339).
    #[arg(long)]
    pub(crate) until: Option<chrono::DateTime<chrono::Utc>>,
    /// The last error contains this text.
    #[arg(long)]
    pub(crate) error: Option<String>,
}

impl EventFilterArgs {
    pub(crate) fn is_empty(&self) -> bool {
        self.event_type.is_none()
            && self.aggregate_type.is_none()
            && self.aggregate_id.is_none()
            && self.since.is_none()
            && self.until.is_none()
            && self.error.is_none()
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum FailedAction {
    /// List failed events, oldest first.
    List {
        #[command(flatten)]
        filter: EventFilterArgs,
        /// Page size.
        #[arg(long)]
        limit: Option<i64>,
        /// The cursor a previous page printed.
        #[arg(long)]
        after: Option<i64>,
    },
    /// Show one event with its payload (redacted).
    Show {
        /// The event id.
        id: uuid::Uuid,
    },
    /// Back to pending with attempts reset (a blocked aggregate's head goes first).
    Retry(EventRepairArgs),
    /// Skip failed heads: never published, kept for inspection; their aggregates go on.
    Skip(EventRepairArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum EventsAction {
    /// List events of a status.
    List {
        /// pending, published, failed, skipped.
        #[arg(long, default_value = "pending")]
        status: String,
        #[command(flatten)]
        filter: EventFilterArgs,
        /// Page size.
        #[arg(long)]
        limit: Option<i64>,
        /// The cursor a previous page printed.
        #[arg(long)]
        after: Option<i64>,
    },
    /// Show one event.
    Show {
        /// The event id.
        id: uuid::Uuid,
    },
    /// Publish published events again (same event ids: consumers that
    /// applied them see duplicates; JetStream drops them within its
    /// duplicate window).
    Republish(EventRepairArgs),
}

/// Which events a repair acts on, and why.
#[derive(Debug, Args)]
pub(crate) struct EventRepairArgs {
    /// Event ids (repeat for several).
    #[arg(long = "id")]
    pub(crate) ids: Vec<uuid::Uuid>,
    /// Instead of ids: the events matching these filters ...
    #[command(flatten)]
    pub(crate) filter: EventFilterArgs,
    /// ... at most this many (required with filters).
    #[arg(long)]
    pub(crate) limit: Option<i64>,
    /// Confirm a repair by filter without asking.
    #[arg(long)]
    pub(crate) yes: bool,
    #[command(flatten)]
    pub(crate) who: Who,
}

#[derive(Debug, Subcommand)]
pub(crate) enum BlockedAction {
    /// List blocked aggregates, oldest first.
    List {
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// Retry the pending head of a blocked aggregate now instead of at its
    /// next attempt time, attempts reset (for a failed head: `failed retry`).
    Retry {
        /// Head event ids, as `blocked list` shows them (repeat for several).
        #[arg(long = "id", required = true)]
        ids: Vec<uuid::Uuid>,
        #[command(flatten)]
        who: Who,
    },
}

/// Filters of letter listings.
#[derive(Debug, Args, Default)]
pub(crate) struct LetterFilterArgs {
    /// Only this event type.
    #[arg(long)]
    pub(crate) event_type: Option<String>,
    /// Only this aggregate type.
    #[arg(long)]
    pub(crate) aggregate_type: Option<String>,
    /// Only this aggregate id.
    #[arg(long)]
    pub(crate) aggregate_id: Option<String>,
    /// Written at or after (RFC 3339).
    #[arg(long)]
    pub(crate) since: Option<chrono::DateTime<chrono::Utc>>,
    /// Written before (RFC 3339).
    #[arg(long)]
    pub(crate) until: Option<chrono::DateTime<chrono::Utc>>,
    /// The reason contains this text.
    #[arg(long)]
    pub(crate) error: Option<String>,
    /// Only letters whose reason has this fingerprint (`list --group`
    /// shows them); looked for among the oldest 5,000 matching letters.
    #[arg(long)]
    pub(crate) fingerprint: Option<String>,
}

impl LetterFilterArgs {
    pub(crate) fn is_empty(&self) -> bool {
        self.event_type.is_none()
            && self.aggregate_type.is_none()
            && self.aggregate_id.is_none()
            && self.since.is_none()
            && self.until.is_none()
            && self.error.is_none()
            && self.fingerprint.is_none()
    }
}

/// Which letters a repair acts on, and why.
#[derive(Debug, Args)]
pub(crate) struct LetterRepairArgs {
    /// Letter ids (repeat for several).
    #[arg(long = "id")]
    pub(crate) ids: Vec<i64>,
    /// Instead of ids: the open letters matching these filters ...
    #[command(flatten)]
    pub(crate) filter: LetterFilterArgs,
    /// ... at most this many (required with filters).
    #[arg(long)]
    pub(crate) limit: Option<i64>,
    /// Confirm a repair by filter without asking.
    #[arg(long)]
    pub(crate) yes: bool,
    #[command(flatten)]
    pub(crate) who: Who,
}

#[derive(Debug, Subcommand)]
pub(crate) enum LetterAction {
    /// List open letters, oldest first.
    List {
        #[command(flatten)]
        filter: LetterFilterArgs,
        /// Closed letters too.
        #[arg(long)]
        all: bool,
        /// Page size.
        #[arg(long)]
        limit: Option<i64>,
        /// The cursor a previous page printed.
        #[arg(long)]
        after: Option<i64>,
        /// Group the (oldest 5,000) matching letters by error fingerprint:
        /// each failure once, with its count, first and last seen, event
        /// types and example ids.
        #[arg(long, conflicts_with_all = ["after", "limit"])]
        group: bool,
    },
    /// Show one letter with its payload (redacted) and headers.
    Show {
        /// The letter id.
        id: i64,
    },
    /// Ask the running consumer to replay letters (it has the handlers).
    Replay {
        #[command(flatten)]
        select: LetterRepairArgs,
        /// Wait up to this long for the consumer to run them (`30s`); exit 1
        /// when a replay did not apply its event or did not run in time.
        #[arg(long, value_parser = parse_duration)]
        wait: Option<Duration>,
    },
    /// Close letters without running them.
    Discard {
        #[command(flatten)]
        select: LetterRepairArgs,
    },
}

/// One aggregate.
#[derive(Debug, Args)]
pub(crate) struct AggregateArgs {
    /// The aggregate type.
    #[arg(long)]
    pub(crate) aggregate_type: String,
    /// The aggregate id.
    #[arg(long)]
    pub(crate) aggregate_id: String,
}

#[derive(Debug, Subcommand)]
pub(crate) enum PositionAction {
    /// Show the last version the consumer applied of an aggregate.
    Show {
        #[command(flatten)]
        aggregate: AggregateArgs,
    },
    /// Move the position past a version the producer skipped (`failed
    /// skip`), so a strict consumer goes on; only from the version before.
    Pass {
        #[command(flatten)]
        aggregate: AggregateArgs,
        /// The skipped version.
        #[arg(long)]
        version: i64,
        #[command(flatten)]
        who: Who,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum AuditAction {
    /// List audit rows, newest first.
    List {
        /// Page size.
        #[arg(long)]
        limit: Option<i64>,
        /// The cursor a previous page printed.
        #[arg(long)]
        before: Option<i64>,
    },
}

/// `90s`, `5m`, `12h`, `7d`, or plain seconds.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 30s, 5m, 12h or 7d"))?;
    let per_unit: u64 = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => {
            return Err(format!("{text:?}: unknown unit {unit:?}; use s, m, h or d"));
        }
    };
    // A wrapped product would turn "older than ages" into "older than
    // hours" and delete what was meant to stay.
    let seconds = value
        .checked_mul(per_unit)
        .ok_or_else(|| format!("{text:?} is too long a duration"))?;
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_their_unit_and_refuse_what_would_wrap() {
        assert_eq!(parse_duration("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("12h"), Ok(Duration::from_secs(43_200)));
        assert_eq!(parse_duration(" 7d "), Ok(Duration::from_secs(604_800)));
        assert!(parse_duration("3w").unwrap_err().contains("unknown unit"));
        assert!(parse_duration("-1d").is_err());
        // 213503982334602 days overflow u64 seconds; wrapped, they would
        // read as about 17 hours.
        let error = parse_duration("213503982334602d").unwrap_err();
        assert!(error.contains("too long"), "{error}");
        assert_eq!(
            parse_duration("18446744073709551615"),
            Ok(Duration::from_secs(u64::MAX))
        );
    }
}
