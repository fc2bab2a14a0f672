//! Findings and their rendering for people (a summary line, then one line
//! per finding) and for machines (`--format json`).

use std::fmt;

use serde::Serialize;

/// How bad a finding is. Errors fail a check; warnings and notes do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Fails the check.
    Error,
    /// Worth a look; does not fail the check.
    Warning,
    /// Information, such as a compatibility classification.
    Note,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Note => "note",
        })
    }
}

/// What a finding is about, as a stable code for tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FindingKind {
    /// A published (committed) version's schema changed.
    FrozenChanged,
    /// Only documentation (descriptions, titles) of a committed schema changed.
    DocsChanged,
    /// A contract exists in code but not in the registry folder.
    MissingInRegistry,
    /// A version in the folder has no contract, no upcaster and no retirement.
    RemovedWithoutRetirement,
    /// Versions 1..=current are not all present or retired.
    ChainHole,
    /// A version N > 1 has no upcaster from N-1.
    MissingUpcaster,
    /// Two types claim one (event type, version), or other registry conflicts.
    DuplicateContract,
    /// `registry.json` does not match what the contracts produce.
    ManifestStale,
    /// `asyncapi.json` does not match what the contracts produce.
    AsyncApiStale,
    /// A schema file's hash does not match the manifest.
    HashMismatch,
    /// A file is in the folder but not in the manifest, or the reverse.
    UnlistedFile,
    /// The compatibility class between two versions.
    Compatibility,
    /// A new version was added (diff).
    VersionAdded,
    /// An event type was added (diff).
    EventTypeAdded,
    /// A version was retired (diff).
    VersionRetired,
    /// A change between versions breaks the event type's compatibility mode.
    CompatibilityMode,
    /// A schema file's `$id` is not the URI producers put in `dataschema`.
    SchemaIdMismatch,
}

impl fmt::Display for FindingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        f.write_str(&text)
    }
}

/// One finding of a check or diff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Error, warning or note.
    pub severity: Severity,
    /// Stable code.
    pub kind: FindingKind,
    /// The event type concerned.
    pub event_type: String,
    /// The schema version concerned, if one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// JSON pointer into the schema where the first difference is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// What is wrong and what to do.
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}] {}", self.severity, self.kind, self.event_type)?;
        if let Some(version) = self.version {
            write!(f, " v{version}")?;
        }
        if let Some(path) = &self.path {
            write!(f, " at {path}")?;
        }
        write!(f, ": {}", self.message)
    }
}

/// The outcome of a check or a diff.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// What produced the report (`check schemas`, `diff OLD NEW`).
    pub subject: String,
    /// Every finding, errors first.
    pub findings: Vec<Finding>,
}

impl Report {
    /// An empty report about `subject`.
    pub fn new(subject: impl Into<String>) -> Report {
        Report {
            subject: subject.into(),
            findings: Vec::new(),
        }
    }

    /// Adds a finding.
    pub fn push(&mut self, finding: Finding) {
        self.findings.push(finding);
    }

    /// Whether any finding is an error.
    pub fn has_errors(&self) -> bool {
        self.count(Severity::Error) > 0
    }

    /// Number of findings of a severity.
    pub fn count(&self, severity: Severity) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == severity)
            .count()
    }

    /// Findings sorted: errors first, then by event type and version.
    pub fn sorted(mut self) -> Report {
        self.findings.sort_by(|a, b| {
            (a.severity, &a.event_type, a.version, a.kind).cmp(&(
                b.severity,
                &b.event_type,
                b.version,
                b.kind,
            ))
        });
        self
    }

    /// The one-line summary.
    pub fn summary(&self) -> String {
        let verdict = if self.has_errors() { "FAILED" } else { "ok" };
        format!(
            "{}: {verdict}: {} error(s), {} warning(s), {} note(s)",
            self.subject,
            self.count(Severity::Error),
            self.count(Severity::Warning),
            self.count(Severity::Note)
        )
    }

    /// The summary line and one line per finding.
    pub fn render_text(&self) -> String {
        let mut out = self.summary();
        out.push('\n');
        for finding in &self.findings {
            out.push_str(&finding.to_string());
            out.push('\n');
        }
        out
    }

    /// The report as JSON (summary counts plus findings).
    pub fn render_json(&self) -> String {
        let value = serde_json::json!({
            "subject": self.subject,
            "ok": !self.has_errors(),
            "errors": self.count(Severity::Error),
            "warnings": self.count(Severity::Warning),
            "notes": self.count(Severity::Note),
            "findings": self.findings,
        });
        let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
        text.push('\n');
        text
    }
}
