//! `outbox console`: the web console served standalone, on any store.

use outbox_console::{Console, ConsoleStore, Identify};

use crate::args::ConsoleArgs;
use crate::{EXIT_OK, Outcome};

/// Serves the console until interrupted (Ctrl-C or SIGTERM).
///
/// With a token every request signs in with HTTP Basic (the user name is
/// the operator the audit records). Without one only a loopback address is
/// served, every request acting as the one operator, and the tool says so
/// loudly: anyone who can open a connection to that address on this
/// machine acts as that operator.
pub(crate) async fn serve<S: ConsoleStore>(store: S, args: ConsoleArgs) -> Outcome {
    let identify = match (&args.token, args.listen.ip().is_loopback()) {
        (Some(token), _) if token.len() < 16 => {
            return Err(
                "OUTBOX_CONSOLE_TOKEN is shorter than 16 characters: use a long random secret"
                    .to_owned(),
            );
        }
        (Some(token), _) => {
            eprintln!(
                "outbox console: sign in with HTTP Basic: your name as the user, the console token as the password"
            );
            Identify::basic_token(token.clone())
        }
        (None, true) => {
            let operator = args
                .operator
                .clone()
                .or_else(|| std::env::var("USER").ok())
                .or_else(|| std::env::var("LOGNAME").ok())
                .filter(|name| !name.trim().is_empty())
                .ok_or("no operator: pass --operator NAME (the name the audit records)")?;
            eprintln!(
                "WARNING: outbox console without a token: every request to {} acts as operator {operator:?}; anyone who can connect to it on this machine can {}",
                args.listen,
                if args.read_only {
                    "read the outbox (read-only)"
                } else {
                    "repair the outbox in that name"
                }
            );
            Identify::fixed(operator)
        }
        (None, false) => {
            return Err(format!(
                "refusing to serve {} without a token: set OUTBOX_CONSOLE_TOKEN (browsers sign in with it), or listen on a loopback address",
                args.listen
            ));
        }
    };
    let router = Console::new(store, identify)
        .read_only(args.read_only)
        .router();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot read the listening address: {e}"))?;
    // One line a script (or a test) can wait for.
    println!("outbox console listening on http://{local}/");
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown())
        .await
        .map_err(|e| format!("the console stopped: {e}"))?;
    Ok(EXIT_OK)
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
