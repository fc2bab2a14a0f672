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
# The crates' default destinations; OUTBOX_DEMO_NAMES=1 uses the demo's own.
if [[ -n "${OUTBOX_DEMO_NAMES:-}" && "${OUTBOX_DEMO_NAMES}" != 0 ]]; then
    case ${OUTBOX_BROKER:-nats} in
        kafka) broker="Kafka topics demo.event.<aggregate_type>" ;;
        rabbitmq) broker="RabbitMQ exchange outbox-demo" ;;
        *) broker="JetStream stream OUTBOX_DEMO" ;;
    esac
else
    case ${OUTBOX_BROKER:-nats} in
        kafka) broker="Kafka topics outbox.event.<aggregate_type>" ;;
        rabbitmq) broker="RabbitMQ exchange outbox" ;;
        *) broker="JetStream stream OUTBOX (subjects events.<aggregate_type>.<event_type>)" ;;
    esac
fi
echo "flow: order commands emit in their own transaction -> outbox_demo.outbox_events -> relay -> $broker -> consumers billing (RejectStale) and order-status (Strict)"
cargo run --quiet -p outbox-examples --bin order-service
