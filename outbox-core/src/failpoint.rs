//! Failpoints for fault-injection tests (feature `failpoints`): named
//! places in the relay and consumer loops where a test makes the process panic or hang,
//! to force a failure window instead of hoping for it. Without the feature
//! every hit compiles to nothing.

/// Relay: between the broker's acks and recording the outcome.
pub const AFTER_PUBLISH: &str = "relay::after_publish";
/// Relay: a claim came back with events, nothing of it is published yet.
pub const AFTER_CLAIM: &str = "relay::after_claim";
/// Relay store (MySQL/MariaDB): the claim transaction has locked and
/// leased its rows and not committed yet; a test checks here that
/// producers are not held up by a claim in flight.
pub const IN_CLAIM: &str = "relay::in_claim";
/// Consumer: after the inbox row and the effect committed, before the
/// broker message is acknowledged.
pub const CONSUMER_AFTER_COMMIT: &str = "consumer::after_commit";
/// Consumer, strict ordering: a parked message's start was counted and
/// committed, its handler's transaction has not begun (another instance
/// may settle the message in between).
pub const CONSUMER_DRAIN_BETWEEN: &str = "consumer::drain_between";

/// What a failpoint does when hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Panic (the task dies; its claim transaction rolls back).
    Panic,
    /// Never return (the process hangs there until killed).
    Hang,
    /// Wait until the test calls `release` for this failpoint, then go on:
    /// the test acts inside the window and lets the code continue.
    Pause,
}

#[cfg(feature = "failpoints")]
mod active {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};

    use super::Action;

    fn table() -> &'static Mutex<HashMap<&'static str, (Action, u32)>> {
        static TABLE: OnceLock<Mutex<HashMap<&'static str, (Action, u32)>>> = OnceLock::new();
        TABLE.get_or_init(Default::default)
    }

    /// Per paused failpoint: whether code waits there, and the signal to go.
    #[derive(Default)]
    struct Gate {
        waiting: std::sync::atomic::AtomicBool,
        go: tokio::sync::Notify,
    }

    fn gates() -> &'static Mutex<HashMap<&'static str, std::sync::Arc<Gate>>> {
        static GATES: OnceLock<Mutex<HashMap<&'static str, std::sync::Arc<Gate>>>> =
            OnceLock::new();
        GATES.get_or_init(Default::default)
    }

    fn gate(name: &'static str) -> std::sync::Arc<Gate> {
        std::sync::Arc::clone(
            gates()
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(name)
                .or_default(),
        )
    }

    /// Whether code is waiting at the paused failpoint `name`.
    pub fn is_paused(name: &'static str) -> bool {
        gate(name).waiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Lets code waiting at the paused failpoint `name` go on (and the next
    /// one that arrives, if none waits yet).
    pub fn release(name: &'static str) {
        gate(name).go.notify_one();
    }

    /// Arms `name` for the next `times` hits.
    pub fn arm(name: &'static str, action: Action, times: u32) {
        table()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name, (action, times));
    }

    /// Disarms `name`.
    pub fn disarm(name: &'static str) {
        table()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    /// Reads `OUTBOX_FAILPOINTS=name=panic|hang[,...]` (for test processes).
    pub fn arm_from_env() {
        let Ok(spec) = std::env::var("OUTBOX_FAILPOINTS") else {
            return;
        };
        for item in spec.split(',').filter(|s| !s.is_empty()) {
            let (name, action) = item.split_once('=').unwrap_or((item, "panic"));
            let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
            let action = match action {
                "hang" => Action::Hang,
                _ => Action::Panic,
            };
            arm(name, action, u32::MAX);
        }
    }

    /// Does what the failpoint `name` is armed to do, if it is armed.
    pub async fn hit(name: &'static str) {
        let action = {
            let mut table = table().lock().unwrap_or_else(|e| e.into_inner());
            match table.get_mut(name) {
                Some((action, times)) if *times > 0 => {
                    *times -= 1;
                    Some(*action)
                }
                _ => None,
            }
        };
        match action {
            Some(Action::Panic) => panic!("failpoint {name} hit"),
            Some(Action::Hang) => {
                eprintln!("failpoint {name} hit: hanging");
                std::future::pending::<()>().await
            }
            Some(Action::Pause) => {
                let gate = gate(name);
                gate.waiting
                    .store(true, std::sync::atomic::Ordering::SeqCst);
                gate.go.notified().await;
                gate.waiting
                    .store(false, std::sync::atomic::Ordering::SeqCst);
            }
            None => {}
        }
    }
}

#[cfg(feature = "failpoints")]
pub use active::{arm, arm_from_env, disarm, is_paused, release};

#[cfg(feature = "failpoints")]
pub use active::hit;

/// Does what the failpoint `name` is armed to do (nothing: this build has
/// no `failpoints` feature). Stores call it at their own windows.
#[cfg(not(feature = "failpoints"))]
pub async fn hit(_name: &'static str) {}
