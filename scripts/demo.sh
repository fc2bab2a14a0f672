#!/usr/bin/env bash
# The project's main job: runs the example order service end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/services.sh
cargo run --quiet -p outbox-examples --bin contracts
