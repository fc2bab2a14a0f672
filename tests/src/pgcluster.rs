//! A private PostgreSQL cluster for one test: `initdb` into a temporary
//! directory, started on a free port with `pg_ctl`, restarted with
//! `pg_ctl restart -m fast` while clients are connected, removed at the
//! end. Other tests keep using the shared server undisturbed.
//!
//! The server binaries come from the newest `/usr/lib/postgresql/<n>/bin`
//! (Debian's layout) or `OUTBOX_PG_BIN`. PostgreSQL refuses to run as
//! root; as root the cluster runs as the `postgres` user (`runuser`).

use crate::ports::free_port;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sqlx::postgres::PgConnectOptions;

/// A running private cluster.
pub struct PgCluster {
    bin: PathBuf,
    dir: tempfile::TempDir,
    port: u16,
    as_postgres: bool,
    /// Extra ` -c name=value` options for the server.
    settings: String,
}

fn server_bin() -> PathBuf {
    if let Ok(dir) = std::env::var("OUTBOX_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("pg_ctl").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server binaries under /usr/lib/postgresql; install the server (scripts/services.sh does) or set OUTBOX_PG_BIN"
        )
    })
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

impl PgCluster {
    /// Creates and starts a cluster (trust authentication, user
    /// `postgres`, fsync off: the test is about restarts, not disks).
    pub fn start() -> PgCluster {
        PgCluster::start_with(&[])
    }

    /// Like [`PgCluster::start`], with more server settings
    /// (`name=value` without spaces, each passed as `-c`; later ones win, so
    /// `fsync=on` undoes the default).
    pub fn start_with(settings: &[&str]) -> PgCluster {
        let bin = server_bin();
        let dir = tempfile::tempdir().expect("a directory for the cluster");
        let as_postgres = running_as_root();
        if as_postgres {
            let status = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("chown");
            assert!(status.success(), "chown of the cluster directory failed");
        }
        let port = free_port();
        let cluster = PgCluster {
            bin,
            dir,
            port,
            as_postgres,
            settings: settings.iter().map(|s| format!(" -c {s}")).collect(),
        };
        let data = cluster.data();
        cluster.run(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth=trust",
                "--no-sync",
            ],
        );
        cluster.pg_ctl(&["start", "-w"]);
        cluster
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// A server program, run as `postgres` when the test runs as root.
    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        }
    }

    fn run(&self, program: &str, args: &[&str]) {
        let output = self
            .command(program)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        assert!(
            output.status.success(),
            "{program} {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn pg_ctl(&self, args: &[&str]) {
        let data = self.data();
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100{}",
            self.port,
            self.dir.path().display(),
            self.settings
        );
        let log = self.dir.path().join("server.log");
        let mut all = vec![
            "-D",
            data.to_str().unwrap(),
            "-o",
            &options,
            "-l",
            log.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all);
    }

    /// `pg_ctl restart -m fast`: every connection is cut, the server is
    /// back when this returns.
    pub fn restart(&self) {
        self.pg_ctl(&["restart", "-m", "fast", "-w"]);
    }

    /// The postmaster's process id (from `postmaster.pid`).
    pub fn server_pid(&self) -> u32 {
        let file = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .expect("postmaster.pid of a running cluster");
        file.lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .expect("a pid on the first line of postmaster.pid")
    }

    /// The port it listens on (127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Connect options for its `postgres` database.
    pub fn options(&self) -> PgConnectOptions {
        self.url().parse().expect("a PostgreSQL URL")
    }

    /// Where its log is.
    pub fn log(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        let data = self.data();
        let _ = self
            .command("pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["stop", "-m", "immediate"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}
