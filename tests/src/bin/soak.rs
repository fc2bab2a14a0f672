//! The soak: a million events (by default) through two relay and four
//! consumer processes at a steady rate while faults from a seeded schedule
//! hit them every few seconds; then the invariants, the throughput over
//! time, the recovery after each fault and the end-to-end latency, printed
//! and written as `soak.json` and `soak.png` (see `docs/reliability.md`).
//!
//! ```text
//! scripts/soak.sh [--events 1000000] [--rate 2500] [--seed <n>] [--fault-every 5]
//!                 [--aggregates 1000] [--threshold 2] [--out target/soak]
//!                 [--broker nats|kafka|rabbitmq]
//! ```
//!
//! Exits with 1 when an invariant broke or the system did not drain.

use std::path::PathBuf;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_tests::faults::invariants::{self, Check, Expected};
use outbox_tests::faults::report::{self, Report, Sampler};
use outbox_tests::faults::{BrokerKind, CONSUMERS, FAULTS, Fault, Rig, RigConfig, Schedule};

struct Options {
    events: u64,
    rate: f64,
    seed: u64,
    fault_every: f64,
    aggregates: usize,
    threshold: f64,
    out: PathBuf,
    broker: BrokerKind,
}

fn options() -> Options {
    let mut options = Options {
        events: 1_000_000,
        rate: 2_500.0,
        seed: Schedule::seed_from_env(),
        fault_every: 5.0,
        aggregates: 1_000,
        threshold: 2.0,
        out: PathBuf::from("target/soak"),
        broker: BrokerKind::Nats,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let [flag, value] = pair else {
            usage(&format!("{pair:?} has no value"));
        };
        let number = |what: &str| -> f64 {
            value
                .parse()
                .unwrap_or_else(|_| usage(&format!("{what} {value:?} is not a number")))
        };
        match flag.as_str() {
            "--events" => options.events = number("--events") as u64,
            "--rate" => options.rate = number("--rate"),
            "--seed" => {
                options.seed = value
                    .parse()
                    .unwrap_or_else(|_| usage(&format!("--seed {value:?}")))
            }
            "--fault-every" => options.fault_every = number("--fault-every"),
            "--aggregates" => options.aggregates = number("--aggregates") as usize,
            "--threshold" => options.threshold = number("--threshold"),
            "--out" => options.out = PathBuf::from(value),
            "--broker" => {
                options.broker = match value.as_str() {
                    "nats" => BrokerKind::Nats,
                    "kafka" => BrokerKind::Kafka,
                    "rabbitmq" => BrokerKind::RabbitMq,
                    other => usage(&format!("--broker {other:?}: nats, kafka or rabbitmq")),
                }
            }
            other => usage(&format!("unknown option {other}")),
        }
    }
    if options.events == 0 || options.rate <= 0.0 || options.fault_every < 1.0 {
        usage("--events and --rate must be above zero, --fault-every at least 1");
    }
    options
}

fn usage(problem: &str) -> ! {
    eprintln!(
        "soak: {problem}\nusage: soak [--events N] [--rate EVENTS_PER_S] [--seed N] [--fault-every SECONDS] [--aggregates N] [--threshold SECONDS] [--out DIR] [--broker nats|kafka|rabbitmq]"
    );
    std::process::exit(2)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let options = options();
    std::fs::create_dir_all(&options.out).expect("create the output directory");
    let node_binary = std::env::current_exe()
        .expect("own path")
        .with_file_name("fault-node");
    assert!(
        node_binary.exists(),
        "{} is missing: build it with `cargo build --release -p outbox-tests --bins`",
        node_binary.display()
    );
    let seed = options.seed;
    println!(
        "soak: {} events at {} events/s on {}, a fault every ~{} s, seed {seed} (replay with --seed {seed})",
        options.events,
        options.rate,
        options.broker.name(),
        options.fault_every
    );
    let mut rig = Rig::start(
        seed,
        RigConfig {
            broker: options.broker,
            node_binary,
            relays: 2,
            relay_batch: 500,
            consumer_processes: 2,
            consumer_batch: 64,
            chaos: Some(format!("{seed}:50:1")),
            logs: std::env::var_os("OUTBOX_FAULT_LOGS").map(Into::into),
        },
    )
    .await;
    let start: DateTime<Utc> =
        sqlx::query_scalar("SELECT clock_timestamp() - make_interval(secs => $1::float8)")
            .bind(rig.elapsed())
            .fetch_one(&rig.db.pool)
            .await
            .expect("read the database clock");
    let started = std::time::Instant::now() - Duration::from_secs_f64(rig.elapsed());
    let sampler = Sampler::start(rig.db.pool.clone(), &rig.db.schema, move || {
        started.elapsed().as_secs_f64()
    });
    let mut producer = rig.spawn(&[
        "stream",
        &options.aggregates.to_string(),
        &options.events.to_string(),
        &options.rate.to_string(),
        "4",
        &seed.to_string(),
    ]);
    rig.insert_poison(6).await;

    let mut order: Vec<Fault> = FAULTS.to_vec();
    for i in (1..order.len()).rev() {
        order.swap(i, rig.schedule.below(i as u64 + 1) as usize);
    }
    let mut faults = Vec::new();
    let mut broken: Vec<Check> = Vec::new();
    let every_ms = (options.fault_every * 1_000.0) as u64;
    loop {
        if let Some(status) = producer.child.try_wait().expect("try_wait") {
            if !status.success() {
                broken.push(Check {
                    name: "the producer finished".into(),
                    held: false,
                    detail: format!("it exited with {status}"),
                });
            }
            break;
        }
        let fault = match order.get(faults.len()) {
            Some(fault) => *fault,
            None => FAULTS[rig.schedule.below(FAULTS.len() as u64) as usize],
        };
        let pause = Duration::from_millis(every_ms / 2 + rig.schedule.below(every_ms));
        let record = rig.inject_after(fault, pause).await;
        println!("  {:7.1} s  {:?}", record.at, record.fault);
        faults.push(record);
        if let Err(problem) = rig.check_alive() {
            broken.push(Check {
                name: "no relay or consumer exited by itself".into(),
                held: false,
                detail: problem,
            });
            break;
        }
    }
    let produce_s = rig.elapsed();
    println!(
        "producer done after {produce_s:.0} s, {} faults; draining",
        faults.len()
    );
    // Consumers may be far behind a fast producer: allow a drain at 200
    // events per second at least.
    let limit = Duration::from_secs((options.events / 200).max(900));
    let drained = invariants::settle(&rig.db, limit, Duration::from_secs(5)).await;
    let drain_s = drained.as_ref().ok().map(|took| took.as_secs_f64());
    if let Err(problem) = &drained {
        broken.push(Check {
            name: format!(
                "everything published and applied within {} s",
                limit.as_secs()
            ),
            held: false,
            detail: problem.clone(),
        });
    }
    let samples = sampler.finish().await;
    let mut checks = invariants::check(
        &rig.db,
        &Expected {
            events: options.events as i64,
            poison: &rig.poison,
            garbage: &rig.garbage,
            poison_successors: &rig.poison_successors,
        },
    )
    .await;
    checks.extend(broken);
    rig.stop_nodes();

    let consumers: Vec<&str> = CONSUMERS.iter().map(|c| c.0).collect();
    let per_second = report::per_second(&rig.db.pool, &rig.db.schema, start, &consumers)
        .await
        .expect("read throughput");
    let mut latency = Vec::new();
    for consumer in &consumers {
        latency.push(
            report::latency(&rig.db.pool, &rig.db.schema, consumer)
                .await
                .expect("read latency"),
        );
    }
    let report = Report {
        seed,
        events: options.events as i64,
        target_rate: options.rate,
        produce_s,
        drain_s,
        recovery_threshold_s: options.threshold,
        faults: report::recoveries(&faults, &samples, options.threshold),
        invariants: checks,
        per_second,
        samples,
        latency,
    };
    print_summary(&report);
    let json = options.out.join("soak.json");
    report::write_json(&report, &json).expect("write soak.json");
    let png = options.out.join("soak.png");
    if let Err(problem) = report::draw_chart(&report, &png) {
        eprintln!("soak: no chart: {problem}");
    }
    println!("report: {} and {}", json.display(), png.display());
    let Rig { db, .. } = rig;
    db.drop_schema().await;
    if report.invariants.iter().any(|c| !c.held) {
        eprintln!("soak: invariants broken (replay with --seed {seed})");
        std::process::exit(1);
    }
}

fn print_summary(report: &Report) {
    println!("\nthroughput, events per second (30 s windows):");
    println!(
        "  {:>7}  {:>9}  {:>9}  {:>9}  {:>9}",
        "from s", "produced", "published", "strict", "stale"
    );
    let window = |series: &[i64], from: usize| -> f64 {
        let part = series.iter().skip(from).take(30);
        part.sum::<i64>() as f64 / 30.0
    };
    let len = report
        .per_second
        .published
        .len()
        .max(report.per_second.produced.len());
    for from in (0..len).step_by(30) {
        let applied: Vec<f64> = report
            .per_second
            .applied
            .iter()
            .map(|(_, series)| window(series, from))
            .collect();
        println!(
            "  {from:>7}  {:>9.0}  {:>9.0}  {:>9.0}  {:>9.0}",
            window(&report.per_second.produced, from),
            window(&report.per_second.published, from),
            applied.first().copied().unwrap_or(0.0),
            applied.get(1).copied().unwrap_or(0.0)
        );
    }
    println!(
        "\nfaults and recovery (backlog age back under {} s):",
        report.recovery_threshold_s
    );
    let mut by_kind: std::collections::BTreeMap<String, Vec<Option<f64>>> = Default::default();
    for outcome in &report.faults {
        by_kind
            .entry(format!("{:?}", outcome.record.fault))
            .or_default()
            .push(outcome.recovery_s);
    }
    for (kind, recoveries) in by_kind {
        let known: Vec<f64> = recoveries.iter().flatten().copied().collect();
        let max = known.iter().copied().fold(0.0, f64::max);
        let mean = known.iter().sum::<f64>() / known.len().max(1) as f64;
        println!(
            "  {kind:<17} {:>3} times, recovery mean {mean:.1} s, max {max:.1} s{}",
            recoveries.len(),
            if known.len() < recoveries.len() {
                format!(
                    ", {} not recovered before the end",
                    recoveries.len() - known.len()
                )
            } else {
                String::new()
            }
        );
    }
    println!("\nend-to-end latency (commit of the event to commit of its effect):");
    for l in &report.latency {
        println!(
            "  {:<7} p50 {:.3} s, p99 {:.3} s, max {:.1} s",
            l.consumer, l.p50_s, l.p99_s, l.max_s
        );
    }
    println!(
        "\n{} events produced in {:.0} s, drained {} later",
        report.events,
        report.produce_s,
        report
            .drain_s
            .map(|s| format!("{s:.1} s"))
            .unwrap_or_else(|| "not".into())
    );
    println!("invariants:");
    for check in &report.invariants {
        println!(
            "  {} {}: {}",
            if check.held { "ok  " } else { "FAIL" },
            check.name,
            check.detail
        );
    }
}
