#!/usr/bin/env bash
# The soak: a million events through relay and consumer processes while
# faults hit them every few seconds (see docs/reliability.md). Starts what
# it needs like scripts/test.sh, builds in release mode, and writes
# soak.json and soak.png to --out (default target/soak).
#
#   scripts/soak.sh [--events 1000000] [--rate 2500] [--seed <n>] [--fault-every 5]
#                   [--aggregates 1000] [--threshold 2] [--out target/soak]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
ensure_c_toolchain
# The chart's font (DejaVu Sans), unless OUTBOX_SOAK_FONT names another.
if [[ -z "${OUTBOX_SOAK_FONT:-}" && ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ]]; then
  apt_install fonts-dejavu-core
fi
cargo build --release -p outbox-tests --bin soak --bin fault-node
target="${CARGO_TARGET_DIR:-target}"
exec "$target/release/soak" "$@"
