#!/usr/bin/env bash
# Startup script of a TPU VM / queued resource made by `launch/tpu.py create --startup`:
# every worker runs it as root at every boot. It writes the rendered setup and run scripts
# into REMOTE_DIR, runs the setup, then starts the run in the background (the run resumes
# from the workdir's newest checkpoint, so a recreated slice carries on where the last one
# stopped). Logs: REMOTE_DIR/logs/{startup.log,worker-<id>.log}, the latter also under
# WORKDIR/logs/.
set -euo pipefail

REMOTE_DIR=@@REMOTE_DIR@@              # absolute: /opt/swarmjax unless --remote-dir says otherwise
case "$REMOTE_DIR" in /*) ;; *) REMOTE_DIR="${HOME:-/root}/$REMOTE_DIR" ;; esac
export HOME="${HOME:-/root}"
mkdir -p "$REMOTE_DIR/logs"

cat > "$REMOTE_DIR/worker_setup.sh" <<'SWARMJAX_SETUP_EOF'
@@SETUP_SCRIPT@@
SWARMJAX_SETUP_EOF

cat > "$REMOTE_DIR/worker_run.sh" <<'SWARMJAX_RUN_EOF'
@@RUN_SCRIPT@@
SWARMJAX_RUN_EOF

{
  echo "[startup $(date -u +%FT%TZ)] setup"
  bash "$REMOTE_DIR/worker_setup.sh"
  echo "[startup $(date -u +%FT%TZ)] run, in the background"
} >> "$REMOTE_DIR/logs/startup.log" 2>&1
nohup bash "$REMOTE_DIR/worker_run.sh" >> "$REMOTE_DIR/logs/startup.log" 2>&1 < /dev/null &
