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
    totals: Mutex<Folded>,
}

/// Everything read so far: counter totals, the latest gauge values and
/// every histogram sample.
#[derive(Default)]
struct Folded {
    counters: HashMap<Series, u64>,
    gauges: HashMap<Series, f64>,
    histograms: HashMap<Series, Vec<f64>>,
}

impl Folded {
    fn absorb(&mut self, snapshotter: &Snapshotter) {
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            labels.sort();
            let series = (key.name().to_owned(), labels);
            match value {
                DebugValue::Counter(count) => *self.counters.entry(series).or_default() += count,
                DebugValue::Gauge(value) => {
                    self.gauges.insert(series, value.into_inner());
                }
                DebugValue::Histogram(values) => self
                    .histograms
                    .entry(series)
                    .or_default()
                    .extend(values.into_iter().map(|v| v.into_inner())),
            }
        }
    }
}

fn matches(series: &Series, name: &str, labels: &[(&str, &str)]) -> bool {
    series.0 == name
        && labels
            .iter()
            .all(|(k, v)| series.1.iter().any(|(sk, sv)| sk == k && sv == v))
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
    let mut folded = state.totals.lock().unwrap_or_else(|e| e.into_inner());
    folded.absorb(&state.snapshotter);
    folded
        .counters
        .iter()
        .filter(|(series, _)| matches(series, name, labels))
        .map(|(_, total)| *total)
        .sum()
}

/// The latest value of gauge `name` in the series whose labels include
/// all of `labels`, if it was ever set.
pub fn gauge(name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let state = state();
    let mut folded = state.totals.lock().unwrap_or_else(|e| e.into_inner());
    folded.absorb(&state.snapshotter);
    folded
        .gauges
        .iter()
        .find(|(series, _)| matches(series, name, labels))
        .map(|(_, value)| *value)
}

/// Every sample recorded into histogram `name` in series whose labels
/// include all of `labels`.
pub fn histogram(name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    let state = state();
    let mut folded = state.totals.lock().unwrap_or_else(|e| e.into_inner());
    folded.absorb(&state.snapshotter);
    folded
        .histograms
        .iter()
        .filter(|(series, _)| matches(series, name, labels))
        .flat_map(|(_, values)| values.iter().copied())
        .collect()
}
