//! Wake-ups without LISTEN/NOTIFY: every emit bumps a process-wide counter
//! right after its insert; each relay's listener waits for the counter to
//! move. A wake-up is never lost between two waits (the listener compares
//! counter values, it does not need to be waiting when the emit happens),
//! and relays in other processes find the events at their next poll
//! (`RelayConfig::poll_interval`).
//!
//! The wake-up comes before the emitting transaction commits, and that is
//! enough: SQLite has one writer, the emitting transaction holds the write
//! lock from its insert on, and the woken relay's claim (`BEGIN
//! IMMEDIATE`) waits for the lock, so it runs after the commit (and sees
//! the event) or after the rollback (and finds nothing). A commit hook
//! would say "committed" exactly, but installing one on the caller's
//! connection costs a round trip to SQLite's worker thread per emit
//! (measured: a quarter of an emit's time).

use std::sync::OnceLock;

use tokio::sync::watch;

fn commits() -> &'static watch::Sender<u64> {
    static COMMITS: OnceLock<watch::Sender<u64>> = OnceLock::new();
    COMMITS.get_or_init(|| watch::channel(0).0)
}

/// Counts an emit: wakes every relay listener of this process.
pub(crate) fn emitted() {
    commits().send_modify(|count| *count = count.wrapping_add(1));
}

/// A receiver that resolves at the next counted commit.
pub(crate) fn subscribe() -> watch::Receiver<u64> {
    commits().subscribe()
}
