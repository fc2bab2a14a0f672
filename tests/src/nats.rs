//! Private nats-server processes with JetStream, one per test that needs
//! to stop and restart its broker without disturbing other tests.

use crate::ports::{free_port, wait_until};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A nats-server child process with its own port and store directory.
pub struct NatsServer {
    port: u16,
    store: tempfile::TempDir,
    child: Option<Child>,
}

fn binary() -> PathBuf {
    if let Ok(path) = std::env::var("OUTBOX_NATS_SERVER_BIN") {
        return PathBuf::from(path);
    }
    for candidate in [
        "/usr/sbin/nats-server",
        "/usr/bin/nats-server",
        "/usr/local/bin/nats-server",
    ] {
        if std::path::Path::new(candidate).exists() {
            return PathBuf::from(candidate);
        }
    }
    panic!(
        "nats-server is not installed; run scripts/services.sh (it installs it) or set OUTBOX_NATS_SERVER_BIN"
    )
}

impl NatsServer {
    /// Starts a server with JetStream on a free port; waits until it accepts.
    pub fn start() -> NatsServer {
        let mut server = NatsServer {
            port: free_port(),
            store: tempfile::tempdir().expect("tempdir for JetStream"),
            child: None,
        };
        server.resume();
        server
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Kills the server (the broker goes down; its store stays).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        wait_until(self.port, false, "nats-server");
    }

    /// Starts the server again on the same port with the same store.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "server already running");
        let child = Command::new(binary())
            .args([
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-js",
                "-sd",
            ])
            .arg(self.store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start nats-server: {e}"));
        self.child = Some(child);
        wait_until(self.port, true, "nats-server");
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
