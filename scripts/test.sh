#!/usr/bin/env bash
# Runs every test of the workspace against real services: makes sure
# PostgreSQL, NATS JetStream, RabbitMQ and MariaDB are up (starting them when
# installed but down) and a C toolchain for librdkafka is there (Kafka's
# tests use librdkafka's in-process mock cluster), then runs the unit, ui (trybuild), behaviour, integration and
# fault-injection tests, the schema registry check, and the alert rules
# (promtool, installed from the `prometheus` package when missing), and the
# console's browser suite (Chromium and chromedriver, installed when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
ensure_c_toolchain
ensure_tansu
ensure_promtool
ensure_chromium
ensure_mariadb
cargo test --workspace --all-targets "$@"
cargo test --workspace --doc
# A user's crate outside the workspace that follows the README's SQLite
# section (outbox-core with its default features, outbox-sqlite): it emits, relays and
# applies an event once, and its dependency tree holds no PostgreSQL driver.
cargo run --quiet --manifest-path tests/readme-sqlite/Cargo.toml
if cargo tree --manifest-path tests/readme-sqlite/Cargo.toml -e normal --prefix none | grep -q '^sqlx-postgres '; then
    echo "tests/readme-sqlite pulls in sqlx-postgres: the README's SQLite set-up must not" >&2
    exit 1
fi
# The same for the README's MySQL section (outbox-core, outbox-mysql, the
# in-process bus) against the MariaDB of MYSQL_URL, in a database of its own.
cargo run --quiet --manifest-path tests/readme-mysql/Cargo.toml
if cargo tree --manifest-path tests/readme-mysql/Cargo.toml -e normal --prefix none | grep -qE '^sqlx-(postgres|sqlite) '; then
    echo "tests/readme-mysql pulls in another database's driver: the README's MySQL set-up must not" >&2
    exit 1
fi
