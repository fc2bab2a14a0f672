//! Wake-ups without LISTEN/NOTIFY: an emitting connection gets a commit
//! hook that bumps a process-wide counter; each relay's listener waits for
//! the counter to move. A wake-up is never lost between two waits (the
//! listener compares counter values, it does not need to be waiting when
//! the commit happens), and relays in other processes find the events at
//! their next poll (`RelayConfig::poll_interval`).
//!
//! The hook runs when the commit starts, before it is durable; the woken
//! relay's claim needs the write lock, which the committing connection
//! holds until its commit is done, so the claim sees the events.

use std::sync::OnceLock;

use tokio::sync::watch;

fn commits() -> &'static watch::Sender<u64> {
    static COMMITS: OnceLock<watch::Sender<u64>> = OnceLock::new();
    COMMITS.get_or_init(|| watch::channel(0).0)
}

/// Counts a commit of an emitting transaction: wakes every waiting relay
/// listener of this process.
pub(crate) fn committed() {
    commits().send_modify(|count| *count = count.wrapping_add(1));
}

/// A receiver that resolves at the next counted commit.
pub(crate) fn subscribe() -> watch::Receiver<u64> {
    commits().subscribe()
}
