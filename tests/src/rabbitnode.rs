//! A private RabbitMQ node for one test: its own node name, AMQP and
//! distribution ports, data directory and Erlang cookie, so a test can kill
//! it (SIGKILL, no clean shutdown) and start it again on the same store
//! while the shared server at `AMQP_URL` serves every other test.
//!
//! The server comes from Debian's `rabbitmq-server` package
//! (`/usr/lib/rabbitmq/bin/rabbitmq-server`, or `OUTBOX_RABBITMQ_SERVER`),
//! which `scripts/services.sh` installs. A node takes 5–15 s to boot.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::ports::free_port;

/// A running (or killed) private node.
pub struct RabbitNode {
    amqp_port: u16,
    dist_port: u16,
    name: String,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

fn server_script() -> PathBuf {
    if let Ok(path) = std::env::var("OUTBOX_RABBITMQ_SERVER") {
        return PathBuf::from(path);
    }
    let path = PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server");
    if path.exists() {
        return path;
    }
    panic!(
        "RabbitMQ is not installed ({} is missing); run scripts/services.sh (it installs rabbitmq-server) or set OUTBOX_RABBITMQ_SERVER",
        path.display()
    )
}

/// How long a boot may take before the test gives up on the node.
const BOOT_LIMIT: Duration = Duration::from_secs(90);

impl RabbitNode {
    /// Starts a node on free ports and waits until it accepts AMQP
    /// connections; panics with the node's output when it does not.
    pub fn start() -> RabbitNode {
        let dir = tempfile::tempdir().expect("tempdir for the RabbitMQ node");
        let amqp_port = free_port();
        let dist_port = free_port();
        std::fs::create_dir_all(dir.path().join("home")).expect("node home");
        std::fs::write(
            dir.path().join("rabbitmq.conf"),
            format!("listeners.tcp.local = 127.0.0.1:{amqp_port}\nloopback_users = none\n"),
        )
        .expect("node config");
        std::fs::write(dir.path().join("env.conf"), "").expect("node env file");
        std::fs::write(dir.path().join("enabled_plugins"), "[].\n").expect("node plugins");
        let mut node = RabbitNode {
            amqp_port,
            dist_port,
            name: format!("outbox-test-{amqp_port}@localhost"),
            dir,
            child: None,
        };
        node.resume();
        node
    }

    /// `amqp://guest:guest@127.0.0.1:<port>/%2f`.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.amqp_port)
    }

    /// `127.0.0.1:<port>` of its AMQP listener.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.amqp_port)
    }

    /// Kills the node with SIGKILL (every process of it); its store stays.
    pub fn kill(&mut self) {
        self.kill_processes();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.accepts() {
            assert!(Instant::now() < deadline, "RabbitMQ node did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill_processes(&mut self) {
        if let Some(mut child) = self.child.take() {
            // The script's process group: the shell, beam and its helpers.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .stderr(Stdio::null())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the node again on its ports and store; waits until it accepts.
    pub fn resume(&mut self) {
        assert!(self.child.is_none(), "node already running");
        let dir = self.dir.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("node.log"))
            .expect("node log");
        let child = Command::new(server_script())
            .current_dir(dir)
            .env("HOME", dir.join("home"))
            .env("RABBITMQ_CONF_ENV_FILE", dir.join("env.conf"))
            .env("RABBITMQ_CONFIG_FILE", dir.join("rabbitmq.conf"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", dir.join("enabled_plugins"))
            .env("RABBITMQ_MNESIA_BASE", dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", dir.join("log"))
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.amqp_port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("node log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", server_script().display()));
        self.child = Some(child);
        let deadline = Instant::now() + BOOT_LIMIT;
        while !self.accepts() {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "RabbitMQ node {} exited while booting ({status}):\n{}",
                    self.name,
                    self.output_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "RabbitMQ node {} did not accept connections within {BOOT_LIMIT:?}:\n{}",
                self.name,
                self.output_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn accepts(&self) -> bool {
        std::net::TcpStream::connect(("127.0.0.1", self.amqp_port)).is_ok()
    }

    fn output_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.path().join("node.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        self.kill_processes();
    }
}
