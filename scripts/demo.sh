#!/usr/bin/env bash
# The project's main job: the example order service end to end. Commands
# write orders and emit events in one transaction, the relay publishes them
# to NATS JetStream, and two consumers (billing, order status) apply them
# once each; the run checks the outcome and fails when anything is off.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
cargo run --quiet -p outbox-examples --bin contracts
cargo run --quiet -p outbox-examples --bin order-service
