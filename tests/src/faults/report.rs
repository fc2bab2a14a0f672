//! The soak's report: backlog age sampled every second while the faults
//! run, throughput per second and end-to-end latency read from the
//! databases afterwards (`created_at`, `published_at`, the effects'
//! `applied_at`), recovery time after each fault, the invariants; written
//! as JSON and drawn as a PNG chart with the faults marked.

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::invariants::Check;
use super::rig::{Fault, FaultRecord};

/// One sample of the outbox backlog.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Sample {
    /// Seconds since the rig started.
    pub t: f64,
    /// Age of the oldest pending event (0 when none is pending); absent
    /// when the database did not answer within a second (restarting,
    /// locked).
    pub backlog_age_s: Option<f64>,
    /// Pending events, when the database answered.
    pub pending: Option<i64>,
}

/// Samples the backlog every second until finished.
pub struct Sampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    /// Starts sampling `schema`'s outbox; `clock` gives the rig's seconds.
    pub fn start(
        pool: PgPool,
        schema: &outbox_postgres::SchemaName,
        clock: impl Fn() -> f64 + Send + 'static,
    ) -> Sampler {
        let sql = format!(
            "SELECT count(*), coalesce(extract(epoch FROM clock_timestamp() - min(created_at)), 0)::float8
             FROM {}.outbox_events WHERE status = 'pending'",
            schema.quoted()
        );
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = tick.tick() => {}
                    _ = stopped.changed() => return samples,
                }
                let t = clock();
                let row = tokio::time::timeout(
                    Duration::from_secs(1),
                    sqlx::query_as::<_, (i64, f64)>(AssertSqlSafe(sql.as_str())).fetch_one(&pool),
                )
                .await;
                let (pending, age) = match row {
                    Ok(Ok((pending, age))) => (Some(pending), Some(age)),
                    _ => (None, None),
                };
                samples.push(Sample {
                    t,
                    backlog_age_s: age,
                    pending,
                });
            }
        });
        Sampler { stop, task }
    }

    /// Stops and returns the samples.
    pub async fn finish(self) -> Vec<Sample> {
        let _ = self.stop.send(true);
        self.task.await.expect("sampler")
    }
}

/// A fault and how long the backlog took to recover from it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FaultOutcome {
    /// The fault.
    #[serde(flatten)]
    pub record: FaultRecord,
    /// Seconds from its end until the backlog age was under the threshold
    /// again (absent: not before the samples ended).
    pub recovery_s: Option<f64>,
}

/// Events per second, by second since the rig's start.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PerSecond {
    /// Committed by the producer.
    pub produced: Vec<i64>,
    /// Claimed and published by the relays.
    pub published: Vec<i64>,
    /// Applied by each consumer.
    pub applied: Vec<(String, Vec<i64>)>,
}

/// End-to-end latency of one consumer: commit of the event to the commit
/// of its effect.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Latency {
    /// The consumer.
    pub consumer: String,
    /// Median, seconds.
    pub p50_s: f64,
    /// 99th percentile, seconds.
    pub p99_s: f64,
    /// Maximum, seconds.
    pub max_s: f64,
}

/// Everything a soak run found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// The schedule's seed (`--seed` replays it).
    pub seed: u64,
    /// Events committed by the producer.
    pub events: i64,
    /// The producer's target rate, events per second.
    pub target_rate: f64,
    /// Seconds from start to the producer's last commit.
    pub produce_s: f64,
    /// Seconds from the producer's last commit until everything was
    /// published and applied (absent: not within the limit).
    pub drain_s: Option<f64>,
    /// The backlog age under which the system counts as recovered.
    pub recovery_threshold_s: f64,
    /// The faults, in order, with their recovery.
    pub faults: Vec<FaultOutcome>,
    /// The invariants.
    pub invariants: Vec<Check>,
    /// Throughput by second.
    pub per_second: PerSecond,
    /// Backlog samples.
    pub samples: Vec<Sample>,
    /// End-to-end latency per consumer.
    pub latency: Vec<Latency>,
}

/// Recovery of each fault from the samples: the first sample at or after
/// its end with the backlog age under `threshold`.
pub fn recoveries(faults: &[FaultRecord], samples: &[Sample], threshold: f64) -> Vec<FaultOutcome> {
    faults
        .iter()
        .map(|record| FaultOutcome {
            recovery_s: samples
                .iter()
                .filter(|s| s.t >= record.until)
                .find(|s| s.backlog_age_s.is_some_and(|age| age < threshold))
                .map(|s| s.t - record.until),
            record: record.clone(),
        })
        .collect()
}

/// Reads events per second from the tables; `start` is the database time
/// of the rig's second zero.
pub async fn per_second(
    pool: &PgPool,
    schema: &outbox_postgres::SchemaName,
    start: DateTime<Utc>,
    consumers: &[&str],
) -> Result<PerSecond, sqlx::Error> {
    let s = schema.quoted();
    let series = |sql: String, consumer: Option<String>| async move {
        let rows: Vec<(i32, i64)> = sqlx::query_as(AssertSqlSafe(sql))
            .bind(start)
            .bind(consumer)
            .fetch_all(pool)
            .await?;
        let len = rows
            .iter()
            .map(|r| r.0.max(0) as usize + 1)
            .max()
            .unwrap_or(0);
        let mut out = vec![0; len];
        for (second, count) in rows {
            out[second.max(0) as usize] += count;
        }
        Ok::<_, sqlx::Error>(out)
    };
    let bucket = |column: &str, table: &str, filter: &str| {
        format!(
            "SELECT floor(extract(epoch FROM {column} - $1))::int AS second, count(*)
             FROM {s}.{table} WHERE {column} IS NOT NULL AND ($2::text IS NULL OR {filter}) GROUP BY 1"
        )
    };
    let mut result = PerSecond {
        produced: series(bucket("created_at", "outbox_events", "true"), None).await?,
        published: series(bucket("published_at", "outbox_events", "true"), None).await?,
        applied: Vec::new(),
    };
    for consumer in consumers {
        let applied = series(
            bucket("applied_at", "effects", "consumer = $2"),
            Some((*consumer).to_owned()),
        )
        .await?;
        result.applied.push(((*consumer).to_owned(), applied));
    }
    Ok(result)
}

/// End-to-end latency of `consumer`'s effects.
pub async fn latency(
    pool: &PgPool,
    schema: &outbox_postgres::SchemaName,
    consumer: &str,
) -> Result<Latency, sqlx::Error> {
    let s = schema.quoted();
    let (p50, p99, max): (Option<f64>, Option<f64>, Option<f64>) = sqlx::query_as(AssertSqlSafe(
        format!(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY l), percentile_cont(0.99) WITHIN GROUP (ORDER BY l), max(l)
             FROM (SELECT extract(epoch FROM e.applied_at - o.created_at)::float8 AS l
                   FROM {s}.effects e JOIN {s}.outbox_events o ON o.id = e.event_id
                   WHERE e.consumer = $1) AS latencies"
        ),
    ))
    .bind(consumer)
    .fetch_one(pool)
    .await?;
    Ok(Latency {
        consumer: consumer.to_owned(),
        p50_s: p50.unwrap_or(0.0),
        p99_s: p99.unwrap_or(0.0),
        max_s: max.unwrap_or(0.0),
    })
}

/// Writes `report` as pretty JSON to `path`.
pub fn write_json(report: &Report, path: &Path) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    std::fs::write(path, text)
}

/// Where the chart's font comes from: `OUTBOX_SOAK_FONT` or DejaVu Sans
/// (Debian's `fonts-dejavu-core`).
fn font() -> Result<&'static [u8], String> {
    let path = std::env::var("OUTBOX_SOAK_FONT")
        .unwrap_or_else(|_| "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf".to_owned());
    let bytes = std::fs::read(&path).map_err(|e| {
        format!("the chart's font {path}: {e} (install fonts-dejavu-core or set OUTBOX_SOAK_FONT to a .ttf)")
    })?;
    Ok(Box::leak(bytes.into_boxed_slice()))
}

fn fault_color(fault: Fault) -> plotters::style::RGBColor {
    use plotters::style::RGBColor;
    match fault {
        Fault::KillRelay => RGBColor(214, 39, 40),
        Fault::StopRelay => RGBColor(255, 127, 14),
        Fault::KillConsumer => RGBColor(148, 103, 189),
        Fault::RestartBroker => RGBColor(44, 160, 44),
        Fault::CutDatabase => RGBColor(140, 86, 75),
        Fault::DelayNetwork => RGBColor(65, 68, 81),
        Fault::BlackholeDatabase => RGBColor(0, 0, 0),
        Fault::BlackholeBroker => RGBColor(31, 119, 180),
        Fault::RestartPostgres => RGBColor(227, 119, 194),
        Fault::LockOutbox => RGBColor(127, 127, 127),
        Fault::BrokerDuplicates => RGBColor(188, 189, 34),
        Fault::BrokerPoison => RGBColor(23, 190, 207),
    }
}

/// A named series and its colour.
type Line = (String, plotters::style::RGBColor, Vec<(f64, f64)>);

/// Draws throughput (top) and backlog age (bottom) over time, each fault
/// a vertical line in its kind's colour, into a PNG at `path`.
pub fn draw_chart(report: &Report, path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    plotters::style::register_font("sans-serif", FontStyle::Normal, font()?)
        .map_err(|_| "the chart's font does not load".to_owned())?;
    let error = |e: DrawingAreaErrorKind<_>| e.to_string();
    let seconds = report
        .samples
        .last()
        .map(|s| s.t)
        .unwrap_or(1.0)
        .max(report.per_second.published.len() as f64)
        .max(1.0);
    let smooth = |series: &[i64]| -> Vec<(f64, f64)> {
        // A 5-second moving average: single seconds jitter with batches.
        (0..series.len())
            .map(|i| {
                let from = i.saturating_sub(4);
                let window = &series[from..=i];
                (
                    i as f64,
                    window.iter().sum::<i64>() as f64 / window.len() as f64,
                )
            })
            .collect()
    };
    let mut lines: Vec<Line> = vec![
        (
            "produced".into(),
            RGBColor(120, 120, 120),
            smooth(&report.per_second.produced),
        ),
        (
            "published".into(),
            RGBColor(31, 119, 180),
            smooth(&report.per_second.published),
        ),
    ];
    for ((name, series), color) in report
        .per_second
        .applied
        .iter()
        .zip([RGBColor(44, 160, 44), RGBColor(214, 39, 40)])
    {
        lines.push((format!("applied by {name}"), color, smooth(series)));
    }
    let top_y = lines
        .iter()
        .flat_map(|l| l.2.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.15;
    let ages: Vec<(f64, f64)> = report
        .samples
        .iter()
        .filter_map(|s| s.backlog_age_s.map(|a| (s.t, a)))
        .collect();
    let age_y = ages.iter().map(|a| a.1).fold(1.0, f64::max) * 1.15;

    let root = BitMapBackend::new(path, (1600, 1000)).into_drawing_area();
    root.fill(&WHITE).map_err(error)?;
    let (top, bottom) = root.split_vertically(560);
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!(
                "soak: {} events, seed {}, {} faults (5 s moving average)",
                report.events,
                report.seed,
                report.faults.len()
            ),
            ("sans-serif", 24),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..seconds, 0f64..top_y)
        .map_err(error)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("events per second")
        .draw()
        .map_err(error)?;
    draw_faults(&mut chart, &report.faults, top_y, true)?;
    for (name, color, points) in lines {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))
            .map_err(error)?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(error)?;

    let mut chart = ChartBuilder::on(&bottom)
        .caption(
            format!(
                "age of the oldest pending event (recovered: under {} s)",
                report.recovery_threshold_s
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(35)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..seconds, 0f64..age_y)
        .map_err(error)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("seconds")
        .draw()
        .map_err(error)?;
    draw_faults(&mut chart, &report.faults, age_y, false)?;
    chart
        .draw_series(LineSeries::new(ages, BLACK.stroke_width(1)))
        .map_err(error)?;
    root.present().map_err(error)?;
    Ok(())
}

type Chart<'a, 'b> = plotters::chart::ChartContext<
    'a,
    plotters::backend::BitMapBackend<'b>,
    plotters::coord::cartesian::Cartesian2d<
        plotters::coord::types::RangedCoordf64,
        plotters::coord::types::RangedCoordf64,
    >,
>;

fn draw_faults(
    chart: &mut Chart<'_, '_>,
    faults: &[FaultOutcome],
    height: f64,
    legend: bool,
) -> Result<(), String> {
    use plotters::prelude::*;
    let mut kinds: Vec<Fault> = faults.iter().map(|f| f.record.fault).collect();
    kinds.sort_by_key(|k| format!("{k:?}"));
    kinds.dedup();
    for kind in kinds {
        let color = fault_color(kind);
        let series = chart
            .draw_series(faults.iter().filter(|f| f.record.fault == kind).map(|f| {
                Rectangle::new(
                    [
                        (f.record.at, 0.0),
                        (f.record.until.max(f.record.at + 0.3), height),
                    ],
                    color.mix(0.35).filled(),
                )
            }))
            .map_err(|e| e.to_string())?;
        if legend {
            series.label(format!("{kind:?}")).legend(move |(x, y)| {
                Rectangle::new([(x, y - 5), (x + 20, y + 5)], color.mix(0.5).filled())
            });
        }
    }
    Ok(())
}
