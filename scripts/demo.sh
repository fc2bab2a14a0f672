#!/usr/bin/env bash
# The project's main job: the example order service end to end. Commands
# write orders and emit events in one transaction, the relay publishes them
# to NATS JetStream (or Kafka, RabbitMQ: OUTBOX_BROKER=kafka|rabbitmq), and
# two consumers (billing, order status) apply them
# once each; the run checks the outcome and fails when anything is off.
# `scripts/demo.sh --schemas` also prints every contract's JSON Schema.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
ensure_c_toolchain
cargo run --quiet -p outbox-examples --bin contracts -- "$@"
case ${OUTBOX_BROKER:-nats} in
    kafka) broker="Kafka topics demo.event.<aggregate_type>" ;;
    rabbitmq) broker="RabbitMQ exchange outbox-demo" ;;
    *) broker="JetStream stream OUTBOX_DEMO" ;;
esac
echo "flow: order commands emit in their own transaction -> outbox_demo.outbox_events -> relay -> $broker -> consumers billing (RejectStale) and order-status (Strict)"
cargo run --quiet -p outbox-examples --bin order-service
