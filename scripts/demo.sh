#!/usr/bin/env bash
# The project's main job: the example order service end to end. Commands
# write orders and emit events in one transaction, a relay publishes them,
# and two consumers (billing, order status) apply them once each; the run
# checks the outcome and fails when anything is off.
#
# By default everything runs on one SQLite file (target/outbox-demo.db,
# OUTBOX_SQLITE_PATH to move it) with in-process delivery: no database
# server, no broker, nothing to install but Rust.
#
# The production shape, OUTBOX_STORE=postgres: PostgreSQL (DATABASE_URL) and
# a broker, NATS JetStream by default or OUTBOX_BROKER=kafka|rabbitmq
# (setting OUTBOX_BROKER alone also picks it); services are started or
# installed as scripts/services.sh does for the tests.
#
# `scripts/demo.sh --schemas` also prints every contract's JSON Schema.
set -euo pipefail
cd "$(dirname "$0")/.."
store=${OUTBOX_STORE:-}
if [[ -z "$store" ]]; then
    if [[ -n "${OUTBOX_BROKER:-}" ]]; then store=postgres; else store=sqlite; fi
fi
case $store in
    sqlite)
        # No broker crates: nothing but Rust is built (no librdkafka).
        cargo run --quiet -p outbox-examples --no-default-features --bin contracts -- "$@"
        echo "flow: order commands emit in their own transaction -> outbox_events in ${OUTBOX_SQLITE_PATH:-target/outbox-demo.db} -> relay -> in-process bus -> consumers billing (RejectStale) and order-status (Strict) on the same file; a publish counts once both committed"
        exec cargo run --quiet -p outbox-examples --no-default-features --bin order-service-embedded
        ;;
    postgres) ;;
    *)
        echo "OUTBOX_STORE=$store: use sqlite (the default) or postgres" >&2
        exit 2
        ;;
esac
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
