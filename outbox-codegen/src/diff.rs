//! `diff OLD NEW`: two registry folders compared the way `buf breaking
//! --against` compares a branch with main. A published version that changed
//! is an error, a version or event type that disappeared without a recorded
//! retirement is an error, a new version is classified against its
//! predecessor (an error only when it is not backward compatible and has no
//! upcaster).

use crate::check::compare_published;
use crate::compat;
use crate::folder::LoadedFolder;
use crate::report::{Finding, FindingKind, Report, Severity};

/// Compares two loaded folders.
pub(crate) fn diff(old: &LoadedFolder, new: &LoadedFolder) -> Report {
    let mut report = Report::new(format!(
        "schema registry diff {} → {}",
        old.dir.display(),
        new.dir.display()
    ));
    let push = |report: &mut Report, severity, kind, event_type: &str, version, message: String| {
        report.push(Finding {
            severity,
            kind,
            event_type: event_type.to_owned(),
            version,
            path: None,
            message,
        })
    };
    for (event_type, before) in &old.model.event_types {
        let Some(after) = new.model.event_types.get(event_type) else {
            for version in before.versions.keys() {
                push(
                    &mut report,
                    Severity::Error,
                    FindingKind::RemovedWithoutRetirement,
                    event_type,
                    Some(*version),
                    format!(
                        "v{version} disappeared with its event type; record a retirement instead of deleting it"
                    ),
                );
            }
            continue;
        };
        if before.aggregate_type != after.aggregate_type {
            push(
                &mut report,
                Severity::Error,
                FindingKind::FrozenChanged,
                event_type,
                None,
                format!(
                    "aggregate type changed from {} to {}; an event type belongs to one aggregate for good",
                    before.aggregate_type, after.aggregate_type
                ),
            );
        }
        for (version, published) in &before.versions {
            match after.versions.get(version) {
                Some(current) => compare_published(
                    &mut report,
                    event_type,
                    *version,
                    &published.schema,
                    &current.schema,
                    &format!(
                        "add version {} with an upcaster instead",
                        after.current_version() + 1
                    ),
                ),
                None if after.retired.contains_key(version) => push(
                    &mut report,
                    Severity::Note,
                    FindingKind::VersionRetired,
                    event_type,
                    Some(*version),
                    format!("v{version} retired: {}", after.retired[version]),
                ),
                None => push(
                    &mut report,
                    Severity::Error,
                    FindingKind::RemovedWithoutRetirement,
                    event_type,
                    Some(*version),
                    format!("v{version} was removed without a recorded retirement"),
                ),
            }
        }
    }
    for (event_type, after) in &new.model.event_types {
        let before = old.model.event_types.get(event_type);
        if before.is_none() {
            push(
                &mut report,
                Severity::Note,
                FindingKind::EventTypeAdded,
                event_type,
                None,
                format!("new event type (aggregate {})", after.aggregate_type),
            );
        }
        for (version, added) in &after.versions {
            if before.is_some_and(|b| b.versions.contains_key(version)) {
                continue;
            }
            let Some(previous) = after.versions.get(&(version - 1)) else {
                push(
                    &mut report,
                    Severity::Note,
                    FindingKind::VersionAdded,
                    event_type,
                    Some(*version),
                    format!("v{version} added"),
                );
                continue;
            };
            let classification = compat::classify(&previous.schema, &added.schema);
            let class = classification.compatibility();
            let (severity, verdict) = match (class.is_backward(), added.upcast_from) {
                (_, Some(link)) => (
                    Severity::Note,
                    format!("upcaster from v{} present", link.version),
                ),
                (_, None) if after.retired.contains_key(&(version - 1)) => (
                    Severity::Note,
                    format!("v{} is retired, no upcaster needed", version - 1),
                ),
                (backward, None) => (
                    Severity::Error,
                    format!(
                        "no upcaster from v{} ({}); every version N > 1 needs one, as the check demands",
                        version - 1,
                        if backward {
                            "backward compatible, but consumers still need the link"
                        } else {
                            "not backward compatible"
                        }
                    ),
                ),
            };
            push(
                &mut report,
                severity,
                FindingKind::VersionAdded,
                event_type,
                Some(*version),
                format!(
                    "v{version} added: {class} against v{} ({}); {verdict}",
                    version - 1,
                    classification.describe()
                ),
            );
            for finding in crate::check::mode_findings(event_type, after, *version) {
                report.push(finding);
            }
        }
        if let Some(before) = before
            && before.effective_mode() != after.effective_mode()
        {
            push(
                &mut report,
                Severity::Warning,
                FindingKind::CompatibilityMode,
                event_type,
                None,
                format!(
                    "compatibility mode changed from {} to {}",
                    before.effective_mode(),
                    after.effective_mode()
                ),
            );
        }
    }
    report.sorted()
}
