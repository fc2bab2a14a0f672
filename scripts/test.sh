#!/usr/bin/env bash
# Runs every test of the workspace against real services: makes sure
# PostgreSQL and NATS JetStream are up (starting them when installed but
# down), then runs the unit, ui (trybuild), behaviour, integration and
# fault-injection tests, and the schema registry check.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
cargo test --workspace --all-targets "$@"
cargo test --workspace --doc
