"""What the job tests share: the overrides that shrink ``configs/parl_widesearch_cpu.py``
to a job of seconds (single-process tests and the two-process worker), the metrics
rows two runs are compared by, the states of their checkpoints, and the XLA flags of the jobs the tests start as
subprocesses."""

import contextlib
import json
import os
import signal

CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                      "parl_widesearch_cpu.py")

SMALL_JOB = ["model.hidden_size=32", "model.head_dim=8", "model.intermediate_size=64", "model.num_layers=1",
             "sft.demos=32", "sft.eval_demos=8", "rl.update.num_minibatches=2", "task.eval_sizes=(1, 16)",
             "eval_episodes=8", "eval_every=2", "checkpoint.every=2",
             "task.data.train_size=64", "task.data.validation_size=160", "task.data.test_size=160"]

TIMING = {"rollout_s", "update_s", "tok_s"}     # wall-clock fields: differ between equal runs


def rows(path, stage="rl"):
    """The ``stage`` rows of a metrics.jsonl without their timing fields."""
    out = [json.loads(line) for line in open(path)]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in out if r.get("stage", stage) == stage]


def subprocess_xla_flags(devices: int | None = None) -> str:
    """``XLA_FLAGS`` for a job the tests start as a subprocess: the suite's own
    (tests/conftest.py: its compiler settings) with ``devices`` host devices instead of the
    suite's 8 (None: the default, one)."""
    device_count = "--xla_force_host_platform_device_count"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(device_count)]
    return " ".join(flags + ([f"{device_count}={devices}"] if devices else []))


def restored_states(runs, restore, step: int) -> list:
    """The TrainState of checkpoint ``step`` of each run directory in ``runs``, read by
    ``restore(ckpt, step)`` (a job's ``_restore`` with its model config and learner bound)."""
    from swarmjax.train.checkpoint import Checkpointer

    states = []
    for run in runs:
        with Checkpointer(os.path.join(run, "checkpoints"), save_every=1, read_only=True) as ckpt:
            states.append(restore(ckpt, step)[0])
    return states


def close_lines(a, b, where):
    """Two runs' log lines agree: the same keys, integers and strings equal, floats to
    float32 rounding (a sharded reduction may round its last bit differently), but for
    the counts of how a process's batch was decoded."""
    import numpy as np

    assert len(a) == len(b), where
    for x, y in zip(a, b):
        # each process decodes its own batch: its compaction segments and the swarm's ticks
        x, y = ({k: v for k, v in r.items() if k not in ("segments", "ticks")} for r in (x, y))
        assert x.keys() == y.keys(), where
        for k in x:
            same = np.isclose(x[k], y[k], rtol=1e-5, atol=1e-6) if isinstance(x[k], float) else x[k] == y[k]
            assert same, (where, x.get("step"), k, x[k], y[k])


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (a local jax.distributed coordinator)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def sigterm_in_rl_step(at: int = 0):
    """Within the block, a SIGTERM to this process once the one loop's RL step ``at`` has
    run (:func:`swarmjax.train.agent_rl.rl_step`, as the loop calls it): a scheduler's
    preemption notice arriving during that step."""
    from swarmjax.train import loop

    rl_step = loop.rl_step

    def preempted_step(*args, step, **kwargs):
        out = rl_step(*args, step=step, **kwargs)
        if step == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return out
    loop.rl_step = preempted_step
    try:
        yield
    finally:
        loop.rl_step = rl_step


@contextlib.contextmanager
def sigterm_in_warm_step(at: int):
    """Within the block, a SIGTERM to this process once warm-start step ``at`` (1-based)
    has run, before its safe point (:meth:`swarmjax.train.warm_steps.WarmSteps.after`)."""
    from swarmjax.train.warm_steps import WarmSteps

    after = WarmSteps.after

    def preempted(self, done, *args):
        if done == at:
            os.kill(os.getpid(), signal.SIGTERM)
        return after(self, done, *args)
    WarmSteps.after = preempted
    try:
        yield
    finally:
        WarmSteps.after = after


def two_processes(argv: list[str], *, timeout: int = 600) -> list[str]:
    """``python -m swarmjax.cli *argv`` as one job over two local processes of 2 devices
    each (jax.distributed on a free 127.0.0.1 port, the suite's compiler flags); asserts
    both exit 0 and returns each one's output."""
    import subprocess
    import sys

    env = {**os.environ, "XLA_FLAGS": subprocess_xla_flags(2), "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "swarmjax.cli", *argv, "--coordinator", f"127.0.0.1:{free_port()}",
           "--num-processes", "2"]
    procs = [subprocess.Popen(cmd + ["--process-id", str(i)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env=env) for i in range(2)]
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    return outs


WALL_CLOCK = TIMING | {"wall_clock_s", "warm_start_s"}


def log_lines(run, name):
    """The lines of a run's ``name`` log (metrics.jsonl, eval.jsonl) without wall-clock fields."""
    return [{k: v for k, v in json.loads(x).items() if k not in WALL_CLOCK} for x in open(os.path.join(run, name))]


def trains_and_resumes_exactly(config, root, overrides=(), *, step=2):
    """``swarmjax train --config config --set ...`` run once in ``root/full``, then in
    ``root/cut`` stopped by SIGTERM in its first RL step and resumed with ``--resume
    auto``: asserts the two wrote the same metrics and evaluations and the same
    parameters at RL step ``step``. -> the uninterrupted run's workdir."""
    import jax
    import numpy as np

    from swarmjax.cli import main
    from swarmjax.train.preemption import PREEMPTED_EXIT_CODE

    def args(workdir, *more):
        return ["train", "--config", config, "--workdir", workdir, "--no-progress"] + [
            a for s in overrides for a in ("--set", s)] + list(more)

    full, cut = os.path.join(root, "full"), os.path.join(root, "cut")
    assert main(args(full)) == 0
    with sigterm_in_rl_step(0):
        assert main(args(cut)) == PREEMPTED_EXIT_CODE
    assert main(args(cut, "--resume", "auto")) == 0
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert log_lines(cut, name) == log_lines(full, name), name
    states = restored_states((full, cut), lambda ckpt, s: ckpt.read(s), step)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, states[0]["params"], states[1]["params"])))
    return full

