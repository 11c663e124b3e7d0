"""`swarmjax train` over two local processes: the first run through the CLI's own flags
(``--coordinator 127.0.0.1:PORT --num-processes 2 --process-id I``), the resumed one
through ``launch/local.py`` (each process gets the JAX_* environment a pod gives, and the
CLI starts the distributed runtime from it). jax.distributed on 127.0.0.1, gloo CPU
collectives, 2 devices each, one 4-way data mesh: every process reads the same batches and
rolls out its share, process 0 alone writes the logs, both report the same summary; a
SIGTERM to one process stops both at the same step with a checkpoint (exit 143),
``--resume auto`` over two processes continues, and the run's figures are those of the
same job in one process on one device (to float32 rounding)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from small_job import CONFIG, SMALL_JOB, rows, subprocess_xla_flags

from swarmjax.cli import main
from swarmjax.train.preemption import PREEMPTED_EXIT_CODE

ROOT = Path(__file__).resolve().parents[1]

# eval_every=0: evaluations only before and after PARL (the untrained model's episodes run
# to their limits, and the step-2 evaluation was half of each run's time)
SMALL = SMALL_JOB + ["sft.steps=4", "sft.bucket=160", "parl.tasks_per_step=4", "parl.group_size=2", "mesh.data=-1",
                     "parl_steps=4", "eval_every=0"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def process_env(cache) -> dict[str, str]:
    """Each process's environment: 2 devices, the suite's compiler flags, one shared compilation cache."""
    return {**os.environ, "XLA_FLAGS": subprocess_xla_flags(2), "JAX_COMPILATION_CACHE_DIR": str(cache),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "PYTHONUNBUFFERED": "1"}


def launch(workdir, cache, *extra) -> list[subprocess.Popen]:
    """Both processes of one run, output to <workdir>.<i>.out."""
    port = free_port()
    env = process_env(cache)
    sets = [a for s in SMALL for a in ("--set", s)]
    return [subprocess.Popen([sys.executable, "-m", "swarmjax.cli", "train", "--config", CONFIG, "--workdir",
                              str(workdir), "--no-progress", *sets, "--coordinator", f"127.0.0.1:{port}",
                              "--num-processes", "2", "--process-id", str(i), *extra],
                             stdout=open(f"{workdir}.{i}.out", "w"), stderr=subprocess.STDOUT, env=env)
            for i in range(2)]


def launch_local(workdir, cache, *extra) -> list[str]:
    """Both processes of one run through ``launch/local.py``, which gives each the
    ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` environment a
    pod gives its workers (``--no-cli-flags``: the CLI starts the distributed runtime from
    that environment alone). Returns each process's output."""
    env = process_env(cache)
    logs = Path(f"{workdir}.logs")
    sets = [a for s in SMALL for a in ("--set", s)]
    subprocess.run([sys.executable, str(ROOT / "launch" / "local.py"), "-n", "2", "--no-cli-flags", "--echo", "-1",
                    "--log-dir", str(logs), "--", sys.executable, "-m", "swarmjax.cli", "train", "--config", CONFIG,
                    "--workdir", str(workdir), "--no-progress", *sets, *extra], env=env, timeout=600,
                   capture_output=True)
    return [(logs / f"process-{i}.log").read_text() for i in range(2)]


def wait(procs, workdir, timeout=600) -> list[str]:
    """Exit codes checked by the caller; returns each process's output."""
    t = time.monotonic()
    for p in procs:
        try:
            p.wait(timeout=max(1, timeout - (time.monotonic() - t)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
    return [open(f"{workdir}.{i}.out").read() for i in range(len(procs))]


def table(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("|")]


def summary(workdir) -> dict:
    s = json.loads((workdir / "summary.json").read_text())
    s.pop("wall_clock_s")
    return s


def close(a, b) -> bool:
    """Equal strings and integers, floats to float32 rounding, through dicts and lists."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(close, a, b))
    if isinstance(a, float):
        return bool(np.isclose(a, b, rtol=1e-5, atol=1e-6))
    return a == b


def test_two_processes_preempt_resume_and_match_one_process(tmp_path):
    cache = tmp_path / "jax_cache"
    # the reference: the same job in one process on one device
    one = tmp_path / "one"
    sets = [a for s in SMALL[:-3] + ["mesh=None", "parl_steps=4", "eval_every=0"] for a in ("--set", s)]
    assert main(["train", "--config", CONFIG, "--workdir", str(one), "--no-progress", *sets]) == 0

    # two processes (the CLI's own flags); SIGTERM to process 1 alone (not the one writing
    # the logs) once PARL has begun: both stop after the same step, with its checkpoint, exit 143
    cut = tmp_path / "cut"
    procs = launch(cut, cache, "--resume", "auto")
    t = time.monotonic()
    while not (cut / "metrics.jsonl").exists() or '"stage": "parl"' not in (cut / "metrics.jsonl").read_text():
        assert procs[1].poll() is None and time.monotonic() - t < 600, open(f"{cut}.1.out").read()[-3000:]
        time.sleep(0.02)
    procs[1].send_signal(signal.SIGTERM)
    outs = wait(procs, cut)
    assert [p.returncode for p in procs] == [PREEMPTED_EXIT_CODE] * 2, outs[0][-3000:] + outs[1][-3000:]
    stopped = len(rows(cut / "metrics.jsonl"))
    assert 1 <= stopped < 4
    assert all(f"checkpoint at PARL step {stopped} saved" in out for out in outs)

    # --resume auto through launch/local.py (the JAX_* environment a pod gives its workers)
    outs = launch_local(cut, cache, "--resume", "auto")
    procs_ok = [f"written to {cut}" in outs[0], f"written to {cut}" not in outs[1]]
    assert all(procs_ok) and table(outs[0]) and table(outs[0]) == table(outs[1]), outs[0][-3000:] + outs[1][-3000:]
    parl = rows(cut / "metrics.jsonl")
    assert [r["step"] for r in parl] == [0, 1, 2, 3]                    # each once, written by process 0
    assert summary(cut)["parl_steps"] == 4 and set(summary(cut)["final"]) == {"1", "16"}
    assert len((cut / "traces.jsonl").read_text().splitlines()) == 4   # warm + final, 2 sizes, 1 each
    # every process reads the one process's batches: the figures of one device
    assert close(parl, rows(one / "metrics.jsonl")), (parl, rows(one / "metrics.jsonl"))
    for stage in ("warm_start", "final"):
        assert close(summary(cut)[stage], summary(one)[stage]), stage
