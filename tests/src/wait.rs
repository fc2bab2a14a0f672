//! Waiting for a condition with a deadline instead of sleeping blindly.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `condition` every 20 ms until it returns true; panics with
/// `what` after `timeout`.
pub async fn until<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
