//! CPU time of processes, read from `/proc`, for benchmarks that report
//! where the time of a run went (client against server).

use std::process::Command;

/// (parent pid, user + system seconds, user + system seconds of waited-for
/// children) of one process.
fn stat(pid: u32) -> Option<(u32, f64, f64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces.
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let number = |i: usize| fields.get(i)?.parse::<u64>().ok();
    let tick = ticks_per_second();
    let own = (number(11)? + number(12)?) as f64 / tick;
    let children = (number(13)? + number(14)?) as f64 / tick;
    Some((number(1)? as u32, own, children))
}

fn ticks_per_second() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// The parent of a process (a PostgreSQL backend's is the postmaster).
pub fn parent_of(pid: u32) -> Option<u32> {
    stat(pid).map(|s| s.0)
}

/// CPU seconds this process has used.
pub fn own_seconds() -> f64 {
    stat(std::process::id()).map(|s| s.1).unwrap_or(0.0)
}

/// CPU seconds of `root`, its live children and the children it has
/// waited for: a PostgreSQL server's postmaster gives the whole server.
pub fn tree_seconds(root: u32) -> f64 {
    let Some((_, own, exited)) = stat(root) else {
        return 0.0;
    };
    let live: f64 = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(stat)
        .filter(|(parent, _, _)| *parent == root)
        .map(|(_, own, _)| own)
        .sum();
    own + exited + live
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_work_shows_in_own_seconds() {
        let before = own_seconds();
        let started = std::time::Instant::now();
        let mut x = 0_u64;
        while started.elapsed() < std::time::Duration::from_millis(300) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(
            own_seconds() - before >= 0.1,
            "300 ms of spinning not counted"
        );
    }
}
