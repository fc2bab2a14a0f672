//! `/metrics` for Prometheus: the framework records through the `metrics`
//! facade; a service installs a recorder. This one is
//! `metrics-exporter-prometheus`, rendered by a small HTTP endpoint on the
//! service's own runtime (a service with a web framework mounts
//! [`PrometheusHandle::render`] on its router instead).

use std::net::SocketAddr;

use anyhow::Context;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The Prometheus text format's content type.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Bucket bounds of the duration histograms, in seconds.
const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Bucket bounds of the relay's batch sizes.
const BATCH_BUCKETS: &[f64] = &[1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];

/// Installs the Prometheus recorder for this process, with the help text
/// of every outbox metric. Histograms get buckets (the exporter's default
/// is a summary, whose quantiles cannot be added up over instances).
pub fn install_recorder() -> anyhow::Result<PrometheusHandle> {
    use outbox_core::metrics::{BATCH_DURATION, BATCH_EVENTS, CONSUMER_HANDLER_DURATION};
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(BATCH_DURATION.into()), SECONDS_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(CONSUMER_HANDLER_DURATION.into()),
            SECONDS_BUCKETS,
        )?
        .set_buckets_for_metric(Matcher::Full(BATCH_EVENTS.into()), BATCH_BUCKETS)?
        .install_recorder()
        .context("installing the Prometheus recorder")?;
    outbox_core::metrics::describe_all();
    Ok(handle)
}

/// Serves `GET /metrics` on `addr` (port 0: any free port) until the
/// runtime stops; returns the address it listens on.
pub async fn serve(addr: SocketAddr, handle: PrometheusHandle) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("binding the metrics endpoint to {addr}"))?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors, say: wait instead of spinning.
                    tracing_free_warn(&error);
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let handle = handle.clone();
            tokio::spawn(async move {
                let _ = answer(stream, &handle).await;
            });
        }
    });
    Ok(local)
}

fn tracing_free_warn(error: &std::io::Error) {
    eprintln!("metrics endpoint: accepting a connection failed: {error}");
}

async fn answer(mut stream: TcpStream, handle: &PrometheusHandle) -> std::io::Result<()> {
    let mut request = Vec::new();
    let mut buffer = [0u8; 1024];
    // The request line and headers; a scrape sends no body.
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 16 * 1024 {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            break;
        }
        request.extend_from_slice(&buffer[..read]);
    }
    let line = String::from_utf8_lossy(&request);
    let target = line.split_whitespace().nth(1).unwrap_or("");
    let (status, content_type, body) =
        if line.starts_with("GET ") && (target == "/metrics" || target.starts_with("/metrics?")) {
            ("200 OK", CONTENT_TYPE, handle.render())
        } else {
            (
                "404 Not Found",
                "text/plain",
                "metrics are at /metrics\n".to_owned(),
            )
        };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    stream.shutdown().await
}

/// Fetches `http://{addr}/metrics` (what Prometheus does on each scrape).
pub async fn scrape(addr: SocketAddr) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to the metrics endpoint at {addr}"))?;
    stream
        .write_all(
            format!("GET /metrics HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("the metrics endpoint sent no header end")?;
    anyhow::ensure!(
        head.starts_with("HTTP/1.1 200"),
        "the metrics endpoint answered {}",
        head.lines().next().unwrap_or("")
    );
    Ok(body.to_owned())
}
