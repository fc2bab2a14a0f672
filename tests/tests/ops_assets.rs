//! The shipped dashboard and alert rules (`ops/`) refer only to metrics
//! the code records, under the names Prometheus exposes them with; every
//! alert has a runbook section and a promtool unit test; `promtool check
//! rules` and `promtool test rules` pass (promtool comes with Debian's
//! `prometheus` package; scripts/test.sh installs it).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use outbox_core::metrics::{ALL, MetricKind};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every `outbox_…` identifier in `text`.
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut at = 0;
    while let Some(found) = text[at..].find("outbox_") {
        let start = at + found;
        let preceded_by_word =
            start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(text.len(), |e| start + e);
        if !preceded_by_word {
            names.insert(text[start..end].to_owned());
        }
        at = end;
    }
    names
}

/// The metric a Prometheus series name belongs to, if the code records it.
fn recorded_as(series: &str) -> Option<&'static str> {
    ALL.iter().find_map(|m| match m.kind {
        MetricKind::Counter | MetricKind::Gauge => (series == m.name).then_some(m.name),
        MetricKind::Histogram => ["_bucket", "_sum", "_count"]
            .iter()
            .any(|suffix| series == format!("{}{suffix}", m.name))
            .then_some(m.name),
    })
}

#[test]
fn dashboard_and_rules_use_only_recorded_metrics() {
    let dashboard = read("ops/grafana/outbox.json");
    let parsed: serde_json::Value = serde_json::from_str(&dashboard).expect("dashboard is JSON");
    let panels = parsed["panels"].as_array().expect("panels");
    let exprs: Vec<&str> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .map(|t| t["expr"].as_str().expect("every target has an expr"))
        .collect();
    assert!(exprs.len() >= 20, "{} queries", exprs.len());
    let mut used = BTreeSet::new();
    for (file, text) in [
        ("ops/grafana/outbox.json", dashboard.clone()),
        (
            "ops/prometheus/alerts.yml",
            read("ops/prometheus/alerts.yml"),
        ),
        (
            "ops/prometheus/alerts.test.yml",
            read("ops/prometheus/alerts.test.yml"),
        ),
    ] {
        for name in metric_names(&text) {
            // Grafana uids and the like are not series.
            if name == "outbox_" {
                continue;
            }
            let metric = recorded_as(&name).unwrap_or_else(|| {
                panic!("{file} refers to {name}, which the code does not record under that name")
            });
            used.insert(metric);
        }
    }
    // What an operator must see is on the dashboard: the list.
    for needed in [
        "outbox_event_type_oldest_pending_age_seconds",
        "outbox_event_type_pending_events",
        "outbox_relay_published_total",
        "outbox_relay_publish_failures_total",
        "outbox_blocked_aggregates",
        "outbox_consumer_lag_seconds",
        "outbox_consumer_duplicates_total",
        "outbox_consumer_quarantined_total",
        "outbox_consumer_dead_lettered_total",
        "outbox_retention_deleted_total",
        "outbox_table_dead_tuples",
    ] {
        assert!(
            exprs.iter().any(|e| metric_names(e).contains(needed)),
            "the dashboard shows no {needed}"
        );
    }
    assert!(used.len() >= 20, "{used:?}");
}

#[test]
fn every_alert_has_a_runbook_section_and_a_unit_test() {
    let rules = read("ops/prometheus/alerts.yml");
    let tests = read("ops/prometheus/alerts.test.yml");
    let runbook = read("docs/operations.md");
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert!(alerts.len() >= 8, "{alerts:?}");
    for alert in alerts {
        assert!(
            runbook.contains(&format!("### {alert}")),
            "docs/operations.md has no section for {alert}"
        );
        let anchor = format!("docs/operations.md#{}", alert.to_lowercase());
        assert!(rules.contains(&anchor), "{alert} does not link {anchor}");
        assert!(
            tests.contains(&format!(
                "alertname: {alert}\n        exp_alerts:\n          - exp_labels"
            )),
            "alerts.test.yml never expects {alert} to fire"
        );
    }
}

fn promtool(args: &[&str]) {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(repo().join("ops/prometheus"))
        .output()
        .unwrap_or_else(|e| {
            panic!("promtool cannot run ({e}); install Debian's prometheus package (scripts/test.sh does)")
        });
    assert!(
        output.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn promtool_checks_the_rules() {
    promtool(&["check", "rules", "alerts.yml"]);
}

#[test]
fn promtool_unit_tests_fire_each_alert_when_it_should() {
    promtool(&["test", "rules", "alerts.test.yml"]);
}
