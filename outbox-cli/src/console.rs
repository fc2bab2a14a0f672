//! `outbox console`: the web console served standalone, on any store.

use outbox_console::{Console, ConsoleStore, Identify, operator_name};
use outbox_core::ops::StatusOptions;

use crate::args::ConsoleArgs;
use crate::{EXIT_OK, Outcome};

/// The environment variable with the console's shared token.
const TOKEN_VARIABLE: &str = "OUTBOX_CONSOLE_TOKEN";

/// Serves the console until interrupted (Ctrl-C or SIGTERM).
///
/// With `OUTBOX_CONSOLE_TOKEN` every request signs in with HTTP Basic (the
/// user name is the operator the audit records). Without it only a
/// loopback address is served, only to requests that name it as their
/// host, every request acting as the one operator, and the tool says so
/// loudly: anyone who can open a connection to that address on this
/// machine acts as that operator.
pub(crate) async fn serve<S: ConsoleStore>(store: S, args: ConsoleArgs) -> Outcome {
    let token = match std::env::var_os(TOKEN_VARIABLE) {
        None => None,
        Some(value) if value.is_empty() => None,
        Some(value) => Some(
            value
                .into_string()
                .map_err(|_| format!("{TOKEN_VARIABLE} is not valid UTF-8"))?,
        ),
    };
    let loopback = args.listen.ip().is_loopback();
    if token.is_none() && !loopback {
        return Err(format!(
            "refusing to serve {} without a token: set {TOKEN_VARIABLE} (browsers sign in with it), or listen on a loopback address",
            args.listen
        ));
    }
    if token.as_ref().is_some_and(|t| t.chars().count() < 16) {
        return Err(format!(
            "{TOKEN_VARIABLE} is shorter than 16 characters: use a long random secret"
        ));
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    let console = match token {
        Some(token) => {
            if args.operator.is_some() {
                eprintln!(
                    "note: --operator is ignored with {TOKEN_VARIABLE}: each browser signs in with its operator's name"
                );
            }
            if !loopback {
                eprintln!(
                    "WARNING: the console at http://{local}/ is plain HTTP: the token crosses the network readable; put a TLS proxy in front of it"
                );
            }
            eprintln!(
                "outbox console: sign in with HTTP Basic: your name as the user, the console token as the password"
            );
            Console::new(store, Identify::basic_token(token))
        }
        None => {
            let name = args
                .operator
                .clone()
                .or_else(|| std::env::var("USER").ok())
                .or_else(|| std::env::var("LOGNAME").ok())
                .unwrap_or_default();
            let operator = operator_name(&name).ok_or(
                "no usable operator name: pass --operator NAME (the name the audit records)",
            )?;
            eprintln!(
                "WARNING: outbox console without a token: every request to http://{local}/ acts as operator {:?}; anyone who can connect to it on this machine can {}",
                operator.0,
                if args.read_only {
                    "read the outbox (read-only)"
                } else {
                    "repair the outbox in that name"
                }
            );
            let port = local.port();
            Console::new(store, Identify::fixed(operator.0))
                .allowed_hosts(loopback_hosts(local.ip(), port))
        }
    };
    let router = console
        .read_only(args.read_only)
        .status_options(StatusOptions {
            max_pending_age: args.max_age,
            max_consumer_lag: args.max_lag,
            ..StatusOptions::default()
        })
        .router();
    // One line a script (or a test) can wait for.
    println!("outbox console listening on http://{local}/");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown())
        .await
        .map_err(|e| format!("the console stopped: {e}"))?;
    Ok(EXIT_OK)
}

/// The `Host` values a browser sends for a loopback listener (without the
/// port when it is 80, HTTP's default).
fn loopback_hosts(ip: std::net::IpAddr, port: u16) -> Vec<String> {
    let own = match ip {
        std::net::IpAddr::V4(v4) => v4.to_string(),
        std::net::IpAddr::V6(v6) => format!("[{v6}]"),
    };
    let mut hosts = Vec::new();
    for name in ["localhost", "127.0.0.1", "[::1]", own.as_str()] {
        let host = if port == 80 {
            name.to_owned()
        } else {
            format!("{name}:{port}")
        };
        if !hosts.contains(&host) {
            hosts.push(host);
        }
    }
    hosts
}

async fn shutdown() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn loopback_hosts_as_browsers_name_them() {
        let v4 = std::net::IpAddr::from([127, 0, 0, 1]);
        assert_eq!(
            super::loopback_hosts(v4, 8080),
            vec!["localhost:8080", "127.0.0.1:8080", "[::1]:8080"]
        );
        assert_eq!(
            super::loopback_hosts(v4, 80),
            vec!["localhost", "127.0.0.1", "[::1]"]
        );
        let other = std::net::IpAddr::from([127, 0, 0, 2]);
        assert_eq!(super::loopback_hosts(other, 8080)[3], "127.0.0.2:8080");
    }
}
