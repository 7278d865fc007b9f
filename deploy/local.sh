#!/usr/bin/env bash
# Try the distributed mode by hand on one machine: a `flower sim` server
# (playing the demo's scenario), one coordinator service and N workers,
# against the machine's Postgres and NATS JetStream. Ctrl-C stops everything.
#
#   deploy/local.sh [WORKERS]          # default 3
#   FLOWER_SERVER=http://127.0.0.1:7777 target/debug/flower submit examples/demo/job.yaml --watch
#
# Settings (environment): FLOWER_DATABASE_URL (default: a `flower` database on
# 127.0.0.1:5432, created if missing), FLOWER_NATS_URL, FLOWER_OBJECT_STORE
# (default file://$PWD/target/flower-local/objects), FLOWER_LISTEN (127.0.0.1:7777).
set -euo pipefail
cd "$(dirname "$0")/.."
workers="${1:-3}"
state="$PWD/target/flower-local"
mkdir -p "$state"

cargo build -q --bin flower
flower="$PWD/target/debug/flower"

if [ -z "${FLOWER_DATABASE_URL:-}" ]; then
  psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'flower'" | grep -q 1 ||
    psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE flower" >/dev/null
  export FLOWER_DATABASE_URL="postgres://postgres@127.0.0.1:5432/flower"
fi
export FLOWER_NATS_URL="${FLOWER_NATS_URL:-nats://127.0.0.1:4222}"
export FLOWER_OBJECT_STORE="${FLOWER_OBJECT_STORE:-file://$state/objects}"
export FLOWER_LISTEN="${FLOWER_LISTEN:-127.0.0.1:7777}"
export FLOWER_PROVIDERS="${FLOWER_PROVIDERS:-sim=http://127.0.0.1:8787}"

pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT INT TERM
"$flower" sim --listen 127.0.0.1:8787 --scenario examples/demo/scenario.yaml >"$state/sim.log" 2>&1 & pids+=($!)
"$flower" coordinator >"$state/coordinator.log" 2>&1 & pids+=($!)
for i in $(seq 1 "$workers"); do
  "$flower" worker --concurrency 1 >"$state/worker-$i.log" 2>&1 & pids+=($!)
done
echo "flower: sim, coordinator on http://$FLOWER_LISTEN and $workers workers running (logs in $state)"
echo "try:    FLOWER_SERVER=http://$FLOWER_LISTEN $flower submit examples/demo/job.yaml --watch"
wait
