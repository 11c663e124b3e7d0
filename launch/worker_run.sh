#!/usr/bin/env bash
# One worker's share of `swarmjax train --resume auto` on a TPU VM / pod slice. Rendered by
# launch/tpu.py (the @@...@@ values below); every worker runs it at the same time.
#
# Worker id, worker count and worker 0's address come from the TPU metadata server (the keys
# jax's Cloud TPU detection reads), or from SWARMJAX_PROCESS_ID / SWARMJAX_NUM_PROCESSES /
# SWARMJAX_COORDINATOR. The log, $REMOTE_DIR/logs/worker-<id>.log, is copied to
# WORKDIR/logs/worker-<id>.log every SYNC_SECONDS and at the end (gcloud storage cp for gs://).
# The exit status is swarmjax's. A lock keeps a second run off a worker's TPU.
set -euo pipefail

# ---- rendered settings
REMOTE_DIR=@@REMOTE_DIR@@              # where worker_setup.sh put venv/ and src/; relative = under $HOME
CONFIG=@@CONFIG@@                      # relative = relative to $REMOTE_DIR/src
WORKDIR=@@WORKDIR@@                    # gs://bucket/path (a pod: every worker must see it) or a path
TRAIN_ARGS=(@@TRAIN_ARGS@@)            # more `swarmjax train` arguments, e.g. --set rl.steps=50
DISTRIBUTED=@@DISTRIBUTED@@            # flags: pass --coordinator/--num-processes/--process-id; auto: don't
COORDINATOR_PORT=@@COORDINATOR_PORT@@
SYNC_SECONDS=@@SYNC_SECONDS@@
# ----

case "$REMOTE_DIR" in /*) ;; *) REMOTE_DIR="${HOME:-/root}/$REMOTE_DIR" ;; esac
case "$WORKDIR" in gs://* | /*) ;; *) WORKDIR="$REMOTE_DIR/$WORKDIR" ;; esac
VENV="$REMOTE_DIR/venv"
mkdir -p "$REMOTE_DIR/logs"

metadata() {  # metadata KEY: a TPU VM's instance attribute (fails off Google Cloud)
  curl -sf --max-time 5 -H "Metadata-Flavor: Google" \
    "http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1"
}

PROCESS_ID=${SWARMJAX_PROCESS_ID:-${TPU_WORKER_ID:-}}
if [[ -z "$PROCESS_ID" ]]; then PROCESS_ID=$(metadata agent-worker-number || echo 0); fi
ENDPOINTS=""
if [[ -z "${SWARMJAX_NUM_PROCESSES:-}" || -z "${SWARMJAX_COORDINATOR:-}" ]]; then
  ENDPOINTS=$(metadata worker-network-endpoints || true)   # "name:id:ip,..." or "host,..."
fi
if [[ -n "$ENDPOINTS" ]]; then
  IFS=, read -r -a EPS <<< "$ENDPOINTS"
  FIRST=${EPS[0]}
  NUM=${#EPS[@]}
  HOST=${FIRST##*:}
else
  NUM=1
  HOST=127.0.0.1
fi
NUM_PROCESSES=${SWARMJAX_NUM_PROCESSES:-$NUM}
COORDINATOR=${SWARMJAX_COORDINATOR:-$HOST:$COORDINATOR_PORT}
LOG="$REMOTE_DIR/logs/worker-$PROCESS_ID.log"

trap '' PIPE   # a closed ssh channel must not kill this script: writes to it just fail
log() {
  local line
  line="[run worker $PROCESS_ID $(date -u +%H:%M:%S)] $*"
  echo "$line" >> "$LOG"
  echo "$line" >&2 || true
}

exec 9> "$REMOTE_DIR/logs/run.lock"
if ! flock -n 9; then
  log "another run holds $REMOTE_DIR/logs/run.lock on this worker: not starting a second one"
  exit 75
fi

sync_logs() {
  local dest="$WORKDIR/logs/worker-$PROCESS_ID.log"
  case "$WORKDIR" in
    gs://*) gcloud storage cp --quiet "$LOG" "$dest" 2>/dev/null ;;
    *) mkdir -p "$WORKDIR/logs" && cp "$LOG" "$dest" ;;
  esac
}

CMD=("$VENV/bin/swarmjax" train --config "$CONFIG" --workdir "$WORKDIR" --resume auto --no-progress)
if [[ "$DISTRIBUTED" == flags && "$NUM_PROCESSES" -gt 1 ]]; then
  export JAX_COORDINATOR_ADDRESS="$COORDINATOR" JAX_NUM_PROCESSES="$NUM_PROCESSES" JAX_PROCESS_ID="$PROCESS_ID"
  CMD+=(--coordinator "$COORDINATOR" --num-processes "$NUM_PROCESSES" --process-id "$PROCESS_ID")
fi
CMD+=(${TRAIN_ARGS[@]+"${TRAIN_ARGS[@]}"})

sync_loop() {  # copy the log every SYNC_SECONDS; on TERM, stop its sleep too
  local nap=""
  trap '[[ -n "$nap" ]] && kill "$nap" 2>/dev/null; exit 0' TERM
  while true; do
    sleep "$SYNC_SECONDS" & nap=$!
    wait "$nap" || true
    sync_logs || true
  done
}
sync_loop < /dev/null > /dev/null 2>&1 &
SYNC_PID=$!
trap 'kill "$SYNC_PID" 2>/dev/null || true; sync_logs || log "could not copy the log to $WORKDIR/logs"' EXIT

# Signals. A SIGTERM makes swarmjax save a checkpoint at its next step and exit 143; a
# second one stops it at once. So this script passes none on: on a preemption or shutdown
# every process gets its own SIGTERM, and `tpu.py stop` signals swarmjax alone (its pid is
# in logs/run.pid). This script waits for swarmjax (bash runs a trap once the pipeline
# ends), then copies the log. tee ignores the signals and a closed ssh channel (-p), so
# swarmjax never writes into a dead pipe while it saves.
trap 'log "signal received: waiting for swarmjax to finish (SIGTERM: it saves a checkpoint first)"' TERM INT HUP
PID_FILE="$REMOTE_DIR/logs/run.pid"
if [[ -d "$REMOTE_DIR/src" ]]; then cd "$REMOTE_DIR/src"; fi
log "worker $PROCESS_ID of $NUM_PROCESSES (coordinator $COORDINATOR): ${CMD[*]}"
set +e
# shellcheck disable=SC2016  # $$ and $0 belong to the inner bash
bash -c 'echo "$$" > "$0" && exec "$@"' "$PID_FILE" "${CMD[@]}" 2>&1 | (trap '' TERM INT HUP; exec tee -p -a "$LOG")
RC=${PIPESTATUS[0]}
set -e
rm -f "$PID_FILE"
log "swarmjax exited with status $RC"
exit "$RC"
