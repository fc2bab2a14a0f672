//! A process-wide `metrics` recorder for tests. The debugging recorder's
//! snapshots reset counters, so every read folds the snapshot into running
//! totals; tests tell their series apart by labels (a unique consumer
//! name per test).

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// A series: metric name and sorted labels.
type Series = (String, Vec<(String, String)>);

struct State {
    snapshotter: Snapshotter,
    totals: Mutex<HashMap<Series, u64>>,
}

fn state() -> &'static State {
    static STATE: OnceLock<State> = OnceLock::new();
    STATE.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("another metrics recorder is installed in this test binary");
        State {
            snapshotter,
            totals: Mutex::default(),
        }
    })
}

/// Installs the recorder (idempotent). Call before the code under test runs.
pub fn install() {
    state();
}

/// The total of counter `name` over every series whose labels include all
/// of `labels`.
pub fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    let state = state();
    let mut totals = state.totals.lock().unwrap();
    for (key, _, _, value) in state.snapshotter.snapshot().into_vec() {
        if let DebugValue::Counter(count) = value {
            let (_, key) = key.into_parts();
            let mut series: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            series.sort();
            *totals.entry((key.name().to_owned(), series)).or_default() += count;
        }
    }
    totals
        .iter()
        .filter(|((metric, series), _)| {
            metric == name
                && labels
                    .iter()
                    .all(|(k, v)| series.iter().any(|(sk, sv)| sk == k && sv == v))
        })
        .map(|(_, total)| *total)
        .sum()
}
