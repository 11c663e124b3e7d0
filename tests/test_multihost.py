"""`swarmjax train` over two local processes (jax.distributed on 127.0.0.1, gloo CPU
collectives, 2 devices each, one 4-way data mesh): each process reads its own slice of
the task set, process 0 alone writes the logs, and a resume across processes continues
exactly."""

import json
import os
import shutil
import socket
import subprocess
import sys

from small_job import rows

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_processes(workdir, steps, resume=False):
    port, env = free_port(), {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    args = [str(workdir), str(steps)] + (["--resume"] if resume else [])
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "multihost_worker.py"), str(i), str(port), *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for i in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for i, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"DONE {i} 4" in out, out[-3000:]


def test_two_process_run_and_resume(tmp_path):
    full = tmp_path / "full"
    two_processes(full, 4)
    parl = rows(full / "metrics.jsonl")
    assert [r["step"] for r in parl] == [0, 1, 2, 3]                    # written once, by process 0
    summary = json.loads((full / "summary.json").read_text())
    assert summary["parl_steps"] == 4 and set(summary["final"]) == {"1", "16"}
    assert len((full / "traces.jsonl").read_text().splitlines()) == 4  # warm + final, 2 sizes, 1 each
    # drop the last checkpoint and resume from step 2 over two processes again
    cut = tmp_path / "cut"
    shutil.copytree(full, cut)
    shutil.rmtree(cut / "checkpoints" / "4")
    two_processes(cut, 4, resume=True)
    assert rows(cut / "metrics.jsonl") == parl
