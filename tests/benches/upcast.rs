//! Decoding cost of upcasting, without a database (criterion), plus the
//! allocations per event of each path (counted with dhat's heap stats).
//!
//! Paths, each decoding one payload into the current type:
//!   decode           the current version (serde only);
//!   one step         the previous version and one typed upcast;
//!   three steps      three versions back, three typed upcasts;
//!   json + typed     parcel.booked v1: a JSON upcaster, then a typed one.
//! After criterion's report the binary prints the ratios against `decode`
//! measured side by side (interleaved rounds, median of per-round ratios)
//! and allocations per event.
//!
//! `cargo bench -p outbox-tests --bench upcast`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use outbox_core::OutboxEvent;
use outbox_tests::events::ParcelBooked;
use outbox_tests::stats::median;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::value::{RawValue, to_raw_value};

#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

/// v1.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "bench.widget_built", aggregate = "widget", version = 1)]
struct WidgetBuiltV1 {
    #[outbox(aggregate_id)]
    widget_id: String,
    name: String,
    parts: Vec<String>,
}

/// v2: adds the size.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "bench.widget_built", aggregate = "widget", version = 2, upcast_from = WidgetBuiltV1)]
struct WidgetBuiltV2 {
    #[outbox(aggregate_id)]
    widget_id: String,
    name: String,
    parts: Vec<String>,
    size_mm: u32,
}

/// v3: adds the colour.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "bench.widget_built", aggregate = "widget", version = 3, upcast_from = WidgetBuiltV2)]
struct WidgetBuiltV3 {
    #[outbox(aggregate_id)]
    widget_id: String,
    name: String,
    parts: Vec<String>,
    size_mm: u32,
    colour: String,
}

/// v4 (current): the size becomes metres.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, OutboxEvent)]
#[outbox(event_type = "bench.widget_built", aggregate = "widget", version = 4, upcast_from = WidgetBuiltV3)]
struct WidgetBuilt {
    #[outbox(aggregate_id)]
    widget_id: String,
    name: String,
    parts: Vec<String>,
    size_m: f64,
    colour: String,
}

impl From<WidgetBuiltV1> for WidgetBuiltV2 {
    fn from(v: WidgetBuiltV1) -> Self {
        WidgetBuiltV2 {
            widget_id: v.widget_id,
            name: v.name,
            parts: v.parts,
            size_mm: 0,
        }
    }
}

impl From<WidgetBuiltV2> for WidgetBuiltV3 {
    fn from(v: WidgetBuiltV2) -> Self {
        WidgetBuiltV3 {
            widget_id: v.widget_id,
            name: v.name,
            parts: v.parts,
            size_mm: v.size_mm,
            colour: String::new(),
        }
    }
}

impl From<WidgetBuiltV3> for WidgetBuilt {
    fn from(v: WidgetBuiltV3) -> Self {
        WidgetBuilt {
            widget_id: v.widget_id,
            name: v.name,
            parts: v.parts,
            size_m: f64::from(v.size_mm) / 1000.0,
            colour: v.colour,
        }
    }
}

struct Payloads {
    v1: Box<RawValue>,
    v3: Box<RawValue>,
    v4: Box<RawValue>,
    parcel_v1: Box<RawValue>,
    parcel_v3: Box<RawValue>,
}

fn payloads() -> Payloads {
    let parts = vec!["frame".to_owned(), "wheel".to_owned(), "bolt".to_owned()];
    Payloads {
        v1: to_raw_value(&WidgetBuiltV1 {
            widget_id: "W-1042".into(),
            name: "Small widget".into(),
            parts: parts.clone(),
        })
        .unwrap(),
        v3: to_raw_value(&WidgetBuiltV3 {
            widget_id: "W-1042".into(),
            name: "Small widget".into(),
            parts: parts.clone(),
            size_mm: 120,
            colour: "blue".into(),
        })
        .unwrap(),
        v4: to_raw_value(&WidgetBuilt {
            widget_id: "W-1042".into(),
            name: "Small widget".into(),
            parts,
            size_m: 0.12,
            colour: "blue".into(),
        })
        .unwrap(),
        parcel_v1: to_raw_value(&serde_json::json!({"parcel_id": "P-77", "weight_grams": 2500}))
            .unwrap(),
        parcel_v3: to_raw_value(
            &serde_json::json!({"parcel_id": "P-77", "weight_kg": 2.5, "carrier": "DHL"}),
        )
        .unwrap(),
    }
}

type Path = (&'static str, fn(&Payloads));

const PATHS: [Path; 5] = [
    ("decode v4", |p| {
        black_box(WidgetBuilt::decode(4, &p.v4).unwrap());
    }),
    ("v3 + one typed step", |p| {
        black_box(WidgetBuilt::decode(3, &p.v3).unwrap());
    }),
    ("v1 + three typed steps", |p| {
        black_box(WidgetBuilt::decode(1, &p.v1).unwrap());
    }),
    ("parcel decode v3", |p| {
        black_box(ParcelBooked::decode(3, &p.parcel_v3).unwrap());
    }),
    ("parcel v1 + json + typed step", |p| {
        black_box(ParcelBooked::decode(1, &p.parcel_v1).unwrap());
    }),
];

fn criterion_paths(c: &mut Criterion) {
    let payloads = payloads();
    let mut group = c.benchmark_group("upcast");
    for (name, path) in PATHS {
        group.bench_function(name, |b| b.iter(|| path(&payloads)));
    }
    group.finish();
}

/// Nanoseconds per call of `path`, over `iterations`.
fn time(path: fn(&Payloads), payloads: &Payloads, iterations: u32) -> f64 {
    let started = Instant::now();
    for _ in 0..iterations {
        path(payloads);
    }
    started.elapsed().as_nanos() as f64 / f64::from(iterations)
}

fn ratios_and_allocations(full: bool) {
    let payloads = payloads();
    let (rounds, iterations) = if full { (15, 200_000) } else { (1, 1_000) };
    let mut per_path: Vec<Vec<f64>> = vec![Vec::new(); PATHS.len()];
    for round in 0..rounds {
        for offset in 0..PATHS.len() {
            let index = (round + offset) % PATHS.len();
            per_path[index].push(time(PATHS[index].1, &payloads, iterations));
        }
    }
    println!(
        "\nside by side ({rounds} rounds x {iterations} calls), median ns per event and ratio to its plain decode:"
    );
    let allocations: Vec<(u64, u64)> = PATHS
        .iter()
        .map(|(_, path)| {
            let _profiler = dhat::Profiler::builder().testing().build();
            let before = dhat::HeapStats::get();
            for _ in 0..1000 {
                path(&payloads);
            }
            let after = dhat::HeapStats::get();
            (
                (after.total_blocks - before.total_blocks) / 1000,
                (after.total_bytes - before.total_bytes) / 1000,
            )
        })
        .collect();
    for (index, (name, _)) in PATHS.iter().enumerate() {
        let baseline = if index < 3 { 0 } else { 3 };
        let ratios: Vec<f64> = (0..rounds)
            .map(|r| per_path[index][r] / per_path[baseline][r])
            .collect();
        let mut sorted = ratios.clone();
        let ratio = median(&mut sorted);
        let mut times = per_path[index].clone();
        println!(
            "  {name:<30} {:>8.0} ns  ratio {ratio:.2} (min {:.2}, max {:.2})  {} allocations, {} bytes per event",
            median(&mut times),
            sorted[0],
            sorted[sorted.len() - 1],
            allocations[index].0,
            allocations[index].1,
        );
    }
}

fn main() {
    let full = std::env::args().any(|arg| arg == "--bench");
    let mut criterion = if full {
        Criterion::default()
            .configure_from_args()
            .measurement_time(Duration::from_secs(3))
    } else {
        // Smoke run under `cargo test`: every path once, briefly.
        Criterion::default()
            .warm_up_time(Duration::from_millis(50))
            .measurement_time(Duration::from_millis(100))
            .sample_size(10)
    };
    criterion_paths(&mut criterion);
    criterion.final_summary();
    ratios_and_allocations(full);
}
