#!/usr/bin/env bash
# Idempotent swarmjax setup of one TPU worker: a Python >= 3.11 virtualenv, the package
# source, `pip install jax[tpu]` + the package. Each step is skipped when already done;
# network steps are retried. Rendered by launch/tpu.py (the @@...@@ values below) and run
# on every worker (`tpu.py setup`: ssh --worker=all; `tpu.py create --startup`: at boot).
set -euo pipefail

# ---- rendered settings
REMOTE_DIR=@@REMOTE_DIR@@          # venv/, src/, logs/ and the scripts; relative = under $HOME
SOURCE_KIND=@@SOURCE_KIND@@        # git | gcs | tarball
SOURCE_URL=@@SOURCE_URL@@          # git URL | gs://.../src.tar.gz | tarball name in REMOTE_DIR
SOURCE_REF=@@SOURCE_REF@@          # git ref (empty: the default branch)
JAX_SPEC=@@JAX_SPEC@@              # the TPU jax, e.g. jax[tpu]
EXTRA_PIP=(@@EXTRA_PIP@@)          # more pip requirements
PYTHON_VERSION=@@PYTHON_VERSION@@  # at least the package's requires-python
RETRIES=@@RETRIES@@
# ----

case "$REMOTE_DIR" in /*) ;; *) REMOTE_DIR="${HOME:-/root}/$REMOTE_DIR" ;; esac
VENV="$REMOTE_DIR/venv"
SRC_DIR="$REMOTE_DIR/src"
STAMP="$VENV/.swarmjax-installed"
mkdir -p "$REMOTE_DIR/logs"

log() { echo "[setup $(hostname) $(date -u +%H:%M:%S)] $*" >&2; }

retry() {  # retry CMD...: up to RETRIES tries, 10 s, 20 s, ... apart
  local n=1
  until "$@"; do
    if (( n >= RETRIES )); then log "giving up after $n tries: $*"; return 1; fi
    log "try $n failed: $*; again in $((n * 10)) s"
    sleep $((n * 10))
    n=$((n + 1))
  done
}

python_ok() {  # python_ok EXE: EXE runs and is at least PYTHON_VERSION
  "$1" -c "import sys; sys.exit(sys.version_info[:2] < tuple(map(int, '$PYTHON_VERSION'.split('.'))))" 2>/dev/null
}

install_uv() {
  python3 -m pip install --user --upgrade uv \
    || python3 -m pip install --user --upgrade --break-system-packages uv \
    || { curl -LsSf https://astral.sh/uv/install.sh | sh; }
}

# 1. the virtualenv
if [[ -x "$VENV/bin/python" ]] && python_ok "$VENV/bin/python"; then
  log "venv $VENV: present"
elif command -v "python$PYTHON_VERSION" >/dev/null && "python$PYTHON_VERSION" -m venv "$VENV"; then
  log "venv $VENV: made with python$PYTHON_VERSION"
elif python_ok python3 && python3 -m venv "$VENV"; then
  log "venv $VENV: made with python3"
else
  # the TPU images' python3 is older than 3.11: a uv-managed interpreter
  rm -rf "$VENV"
  export PATH="${HOME:-/root}/.local/bin:$PATH"
  command -v uv >/dev/null || retry install_uv
  retry uv venv --seed --python "$PYTHON_VERSION" "$VENV"
  log "venv $VENV: made with uv (python $PYTHON_VERSION)"
fi

# 2. the source, in $SRC_DIR; SOURCE_ID names what is there
case "$SOURCE_KIND" in
  git)
    if [[ ! -d "$SRC_DIR/.git" ]]; then
      rm -rf "$SRC_DIR"
      retry git clone --quiet --no-checkout "$SOURCE_URL" "$SRC_DIR"
    fi
    retry git -C "$SRC_DIR" fetch --quiet origin "${SOURCE_REF:-HEAD}"
    git -C "$SRC_DIR" checkout --quiet --force --detach FETCH_HEAD
    SOURCE_ID=$(git -C "$SRC_DIR" rev-parse HEAD)
    ;;
  gcs | tarball)
    TARBALL="$REMOTE_DIR/$(basename "$SOURCE_URL")"
    if [[ "$SOURCE_KIND" == gcs ]]; then
      retry gcloud storage cp --quiet "$SOURCE_URL" "$TARBALL"
    fi
    SOURCE_ID=$(sha256sum "$TARBALL" | cut -d' ' -f1)
    if [[ "$(cat "$SRC_DIR/.source-sha256" 2>/dev/null || true)" == "$SOURCE_ID" ]]; then
      log "source $SRC_DIR: already $SOURCE_ID"
    else
      rm -rf "$SRC_DIR" && mkdir -p "$SRC_DIR"
      tar -xzf "$TARBALL" -C "$SRC_DIR" --strip-components=1
      echo "$SOURCE_ID" > "$SRC_DIR/.source-sha256"
    fi
    ;;
  *) log "unknown SOURCE_KIND $SOURCE_KIND"; exit 2 ;;
esac
log "source: $SOURCE_KIND $SOURCE_URL ${SOURCE_REF:+@$SOURCE_REF} -> $SOURCE_ID"

# 3. the packages (skipped when this exact source and these requirements are installed)
WANT="$SOURCE_ID $JAX_SPEC ${EXTRA_PIP[*]+${EXTRA_PIP[*]}}"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
  log "packages: already installed ($WANT)"
else
  PIP=("$VENV/bin/python" -m pip install --quiet --disable-pip-version-check)
  retry "${PIP[@]}" "$JAX_SPEC" ${EXTRA_PIP[@]+"${EXTRA_PIP[@]}"}
  retry "${PIP[@]}" "$SRC_DIR"
  retry "${PIP[@]}" --no-deps --force-reinstall "$SRC_DIR"   # same version number, new source
  "$VENV/bin/swarmjax" --help >/dev/null
  echo "$WANT" > "$STAMP"
  log "packages: installed ($WANT)"
fi
# no jax.devices() here: on a pod slice it waits for the other workers' runtimes
log "jax $("$VENV/bin/python" -c 'import jax; print(jax.__version__)'), libtpu: $("$VENV/bin/python" -m pip show libtpu 2>/dev/null | sed -n 's/^Version: //p')"
log "done"
