//! The command line: `check`, `diff`, `retire` work on folders alone;
//! `write` and `check-code` need the contracts, so they work in a binary
//! that links them (call [`run`] from its `main`). Exit codes: 0 clean,
//! 1 findings with errors, 2 bad input (unreadable folder, bad arguments).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use outbox_core::ContractRegistry;

use crate::{CodegenError, Report, WriteMode};

/// Command line of `outbox-codegen`.
#[derive(Debug, Parser)]
#[command(
    name = "outbox-codegen",
    about = "Schema registry of outbox event contracts: check, diff, retire, write"
)]
pub struct Cli {
    /// Output format of reports.
    #[arg(long, value_enum, default_value_t = Format::Text, global = true)]
    pub format: Format,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Report formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// A summary line, then one line per finding.
    Text,
    /// One JSON document.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a registry folder on its own: chain, upcasters, hashes, manifest.
    Check {
        /// The registry folder.
        dir: PathBuf,
    },
    /// Compare two registry folders (OLD = main, NEW = this branch).
    Diff {
        /// The folder to compare against.
        old: PathBuf,
        /// The folder being proposed.
        new: PathBuf,
    },
    /// Record the retirement of a version (removes its schema file).
    Retire {
        /// The registry folder.
        dir: PathBuf,
        /// The event type.
        event_type: String,
        /// The version to retire.
        version: u32,
        /// Why it can go (required).
        #[arg(long)]
        reason: String,
    },
    /// Check the contracts linked into this binary against the folder.
    CheckCode {
        /// The registry folder.
        dir: PathBuf,
    },
    /// Write the folder from the contracts linked into this binary.
    Write {
        /// The registry folder.
        dir: PathBuf,
        /// Also overwrite published versions whose schema changed.
        #[arg(long)]
        force: bool,
    },
}

/// Parses the process arguments and runs the command.
pub fn run() -> ExitCode {
    run_with(Cli::parse())
}

/// Runs a parsed command line.
pub fn run_with(cli: Cli) -> ExitCode {
    let outcome: Result<Report, CodegenError> = match &cli.command {
        Command::Check { dir } => crate::check_folder(dir).map_err(CodegenError::from),
        Command::Diff { old, new } => crate::diff(old, new).map_err(CodegenError::from),
        Command::CheckCode { dir } => {
            if let Some(code) = no_contracts() {
                return code;
            }
            crate::check(dir)
        }
        Command::Write { dir, force } => {
            if let Some(code) = no_contracts() {
                return code;
            }
            let mode = if *force {
                WriteMode::Force
            } else {
                WriteMode::Safe
            };
            match crate::write(dir, mode) {
                Ok(summary) => {
                    for file in summary.written {
                        println!("wrote {}", dir.join(file).display());
                    }
                    for file in summary.removed {
                        println!("removed {}", dir.join(file).display());
                    }
                    return ExitCode::SUCCESS;
                }
                Err(error) => Err(error),
            }
        }
        Command::Retire {
            dir,
            event_type,
            version,
            reason,
        } => match crate::retire(dir, event_type, *version, reason) {
            Ok(_) => {
                println!("retired {event_type} v{version} in {}", dir.display());
                return ExitCode::SUCCESS;
            }
            Err(error) => Err(error),
        },
    };
    match outcome {
        Ok(report) => {
            match cli.format {
                Format::Text => print!("{}", report.render_text()),
                Format::Json => print!("{}", report.render_json()),
            }
            if report.has_errors() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(CodegenError::Refused(report)) => {
            match cli.format {
                Format::Text => eprint!("refusing to write:\n{}", report.render_text()),
                Format::Json => print!("{}", report.render_json()),
            }
            ExitCode::from(1)
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::from(2)
        }
    }
}

fn no_contracts() -> Option<ExitCode> {
    match ContractRegistry::global() {
        Ok(registry) if registry.is_empty() => {
            eprintln!(
                "error: no event contracts are linked into this binary; run this command from a binary of your crate \
                 that calls outbox_codegen::cli::run() (or use the registry test with OUTBOX_REGISTRY_WRITE=1)"
            );
            Some(ExitCode::from(2))
        }
        Ok(_) => None,
        Err(errors) => {
            eprintln!("error: {errors}");
            Some(ExitCode::from(2))
        }
    }
}
