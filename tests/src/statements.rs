//! Where a benchmark's database time goes: the statements a private
//! server with `pg_stat_statements` ran during a measured run, with the
//! client's and the server's CPU, per event.

use std::future::Future;
use std::time::Instant;

use sqlx::Row;

use crate::TestDb;

/// One statement of `pg_stat_statements`: text, calls, planning plus
/// execution time (ms), rows, planning time (ms).
pub type Statement = (String, i64, f64, i64, f64);

/// A measured run: wall time, client and server CPU (seconds), and the
/// statements the server ran.
#[derive(Debug)]
pub struct RunCost {
    /// Wall seconds.
    pub wall: f64,
    /// CPU seconds of this process.
    pub client_cpu: f64,
    /// CPU seconds of the server (postmaster and its children).
    pub server_cpu: f64,
    /// The statements, most expensive first.
    pub statements: Vec<Statement>,
}

async fn reset(db: &TestDb) {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(&db.pool)
        .await
        .expect("pg_stat_statements is installed");
}

async fn read(db: &TestDb) -> Vec<Statement> {
    let rows = sqlx::query(
        "SELECT regexp_replace(query, '\\s+', ' ', 'g'), calls, total_exec_time + total_plan_time, rows, total_plan_time
         FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND query NOT LIKE '%pg_stat_statements%'
         ORDER BY total_exec_time + total_plan_time DESC",
    )
    .fetch_all(&db.pool)
    .await
    .expect("read pg_stat_statements");
    rows.iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// Runs `work` with the statement counters reset before and read after.
pub async fn measured<F: Future<Output = ()>>(db: &TestDb, server_pid: u32, work: F) -> RunCost {
    reset(db).await;
    let (client, server) = (
        crate::cpu::own_seconds(),
        crate::cpu::tree_seconds(server_pid),
    );
    let started = Instant::now();
    work.await;
    let wall = started.elapsed().as_secs_f64();
    RunCost {
        wall,
        client_cpu: crate::cpu::own_seconds() - client,
        server_cpu: crate::cpu::tree_seconds(server_pid) - server,
        statements: read(db).await,
    }
}

/// Prints a run's rate and CPU per event, and its `top` statements as a
/// Markdown table (calls, ms per call with planning, rows per call, µs
/// per event).
pub fn print(name: &str, events: i64, cost: &RunCost, top: usize) {
    let per = |seconds: f64| seconds * 1e6 / events as f64;
    println!(
        "  {name}: {:.0} events/s; per event: wall {:.1} µs, client CPU {:.1} µs, server CPU {:.1} µs",
        events as f64 / cost.wall,
        per(cost.wall),
        per(cost.client_cpu),
        per(cost.server_cpu)
    );
    println!("    | statement | calls | ms/call (planning) | rows/call | µs/event |");
    for (query, calls, total, rows, plan) in cost.statements.iter().take(top) {
        let mut text: String = query.trim().chars().take(70).collect();
        if query.trim().chars().count() > 70 {
            text.push('…');
        }
        println!(
            "    | `{text}` | {calls} | {:.3} ({:.3}) | {:.0} | {:.1} |",
            total / (*calls).max(1) as f64,
            plan / (*calls).max(1) as f64,
            *rows as f64 / (*calls).max(1) as f64,
            total * 1000.0 / events as f64
        );
    }
}
