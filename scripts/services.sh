#!/usr/bin/env bash
# Makes sure the services the tests and the example need are reachable:
# PostgreSQL (127.0.0.1:5432) and NATS with JetStream (127.0.0.1:4222), plus
# the nats-server binary (tests start private servers they can stop and
# restart). Starts a service that is installed but down; fails loudly when
# one cannot be had. Sourced by scripts/test.sh and scripts/demo.sh.
set -euo pipefail

PGHOST_ADDR=${OUTBOX_PG_HOST:-127.0.0.1}
PGPORT_NUM=${OUTBOX_PG_PORT:-5432}
NATS_PORT=${OUTBOX_NATS_PORT:-4222}

say() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: FATAL: %s\n' "$*" >&2; exit 1; }

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

wait_port() {
    local host=$1 port=$2 what=$3
    for _ in $(seq 1 60); do
        port_open "$host" "$port" && return 0
        sleep 0.5
    done
    die "$what did not come up on $host:$port"
}

ensure_postgres() {
    if command -v pg_isready >/dev/null && pg_isready -q -h "$PGHOST_ADDR" -p "$PGPORT_NUM"; then
        return 0
    fi
    if ! port_open "$PGHOST_ADDR" "$PGPORT_NUM"; then
        if command -v pg_ctlcluster >/dev/null && [ -d /etc/postgresql ]; then
            say "PostgreSQL is down; starting it"
            pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start \
                || die "could not start PostgreSQL (pg_ctlcluster failed)"
        else
            die "PostgreSQL is not reachable on $PGHOST_ADDR:$PGPORT_NUM and is not installed here"
        fi
    fi
    wait_port "$PGHOST_ADDR" "$PGPORT_NUM" PostgreSQL
    for _ in $(seq 1 60); do
        pg_isready -q -h "$PGHOST_ADDR" -p "$PGPORT_NUM" && return 0
        sleep 0.5
    done
    die "PostgreSQL accepts TCP but not connections"
}

nats_server_bin() {
    command -v nats-server 2>/dev/null || { [ -x /usr/sbin/nats-server ] && echo /usr/sbin/nats-server; } || true
}

ensure_nats() {
    local bin
    bin=$(nats_server_bin)
    if [ -z "$bin" ]; then
        if command -v apt-get >/dev/null; then
            say "nats-server is not installed; installing it from Debian's packages"
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q nats-server >/dev/null \
                || die "could not install nats-server"
            bin=$(nats_server_bin)
        fi
        [ -n "$bin" ] || die "nats-server is not installed and cannot be installed"
    fi
    export OUTBOX_NATS_SERVER_BIN="$bin"
    if ! port_open 127.0.0.1 "$NATS_PORT"; then
        say "NATS is down; starting it with JetStream"
        mkdir -p /var/lib/nats-server
        start-stop-daemon --start --oknodo --background --exec "$bin" -- \
            -a 127.0.0.1 -p "$NATS_PORT" -js -sd /var/lib/nats-server -l /var/log/nats-server.log \
            || die "could not start nats-server"
        wait_port 127.0.0.1 "$NATS_PORT" NATS
    fi
}

ensure_postgres
ensure_nats
export DATABASE_URL=${DATABASE_URL:-postgres://postgres@$PGHOST_ADDR:$PGPORT_NUM/postgres}
export OUTBOX_NATS_URL=${OUTBOX_NATS_URL:-nats://127.0.0.1:$NATS_PORT}
say "PostgreSQL at $PGHOST_ADDR:$PGPORT_NUM, NATS at 127.0.0.1:$NATS_PORT, nats-server at $OUTBOX_NATS_SERVER_BIN"
