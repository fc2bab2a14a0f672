//! The fencing token of the batch a transport is publishing.
//!
//! A relay worker that owns partitions (the PostgreSQL store) claims under
//! a token: the transaction id of the rebalance in which it last took
//! partitions. PostgreSQL hands out transaction ids in increasing order,
//! and a partition changes owner only after its previous owner let go, so
//! for each partition the tokens of its successive owners increase. The
//! worker publishes each batch inside the token's scope; a transport (or a
//! test's) reads it with [`fencing_token`] and may pass it on, so a
//! receiver that remembers the highest token per aggregate (an aggregate
//! lives in one partition) can refuse a publish from an owner older than
//! one it has already seen.

use std::future::Future;

tokio::task_local! {
    static FENCING_TOKEN: Option<u64>;
}

/// The fencing token of the batch being published, when called from inside
/// [`Transport::publish`](crate::transport::Transport::publish) by a relay
/// worker whose claim carries one; `None` elsewhere (the pooled claim, a
/// store without partitions, outside a publish).
pub fn fencing_token() -> Option<u64> {
    FENCING_TOKEN.try_with(|token| *token).ok().flatten()
}

/// Runs `publish` with `token` as the current fencing token.
pub(crate) async fn publishing<F: Future>(token: Option<u64>, publish: F) -> F::Output {
    FENCING_TOKEN.scope(token, publish).await
}
