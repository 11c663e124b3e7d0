"""Kill and preempt `swarmjax train` at (seeded) random moments, restart it with
``--resume auto`` each time, and end with exactly what an uninterrupted run writes:
the same log lines once each, the same summary, the same parameters.

The job runs as a subprocess of the CLI (``python -m swarmjax.cli train``), the way a
scheduler runs it. The moments: kill -9 during the warm start (SFT), SIGTERM during the
warm start (exit 143, nothing saved), SIGTERM between PARL checkpoints (exit 143 after
a checkpoint at the end of the current step), kill -9 right after a checkpoint. The
subprocesses share one persistent compilation cache so that only the first one
compiles."""

import json
import os
import random
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from small_job import CONFIG, SMALL_JOB, TIMING, rows, subprocess_xla_flags
from swarmjax.cli import main
from swarmjax.config_file import apply_overrides, load_config
from swarmjax.train.checkpoint import Checkpointer
from swarmjax.rl.update import Learner
from swarmjax.train.agent_job import AgentJob, _state_shapes
from swarmjax.train.loop import restore
from swarmjax.train.logs import JobLog, truncate
from swarmjax.train.preemption import PREEMPTED_EXIT_CODE

pytestmark = pytest.mark.slow     # the whole file: end-to-end runs (the README's whole suite)

SEED = 14
STEPS = 6
# the smallest job with a warm start of many short steps (one compiled SFT step:
# sft.bucket = the context) and PARL with checkpoints every 2 steps, evaluations every 3
OVERRIDES = SMALL_JOB + ["sft.steps=80", "sft.bucket=160", "rl.tasks_per_step=2", "rl.group_size=4",
                         "task.eval_sizes=(16,)", "eval_episodes=4", "eval_every=3", "mesh=None", f"rl.steps={STEPS}"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """Subprocess environment and overrides: one device, a shared task set and compilation cache."""
    base = tmp_path_factory.mktemp("resume")
    e = dict(os.environ)
    e.update(XLA_FLAGS=subprocess_xla_flags(), JAX_COMPILATION_CACHE_DIR=str(base / "jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
             PYTHONUNBUFFERED="1")
    return e, OVERRIDES + [f"task.data.data_dir='{base / 'tasks'}'"]


def argv(workdir, overrides, *extra):
    return (["train", "--config", CONFIG, "--workdir", str(workdir), "--no-progress"]
            + [a for s in overrides for a in ("--set", s)] + list(extra))


def start(workdir, env, *extra):
    e, overrides = env
    out = open(f"{workdir}.out", "a")                        # beside the workdir: all attempts' output
    return subprocess.Popen([sys.executable, "-m", "swarmjax.cli", *argv(workdir, overrides, *extra)],
                            stdout=out, stderr=subprocess.STDOUT, env=e, text=True)


def output(workdir) -> str:
    return open(f"{workdir}.out").read()


def lines(workdir, stage):
    """The metrics lines of ``stage`` written so far (a line being written does not count)."""
    try:
        text = (workdir / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [r for r in map(json.loads, text.split("\n")[:-1]) if r["stage"] == stage]


def wait_until(proc, workdir, cond, what, timeout=300):
    t = time.monotonic()
    while not cond():
        assert proc.poll() is None, f"the job ended (rc {proc.returncode}) before {what}:\n{output(workdir)[-3000:]}"
        assert time.monotonic() - t < timeout, f"no {what} after {timeout} s"
        time.sleep(0.01)


def finish(proc, workdir, timeout=300) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"the job did not end:\n{output(workdir)[-3000:]}") from None


def finished_steps(workdir):
    if not (workdir / "checkpoints").exists():
        return []
    ckpt = Checkpointer(workdir / "checkpoints", save_every=2, read_only=True)
    try:
        return ckpt.all_steps()
    finally:
        ckpt.close()


def strip_timing(x):
    if isinstance(x, dict):
        return {k: strip_timing(v) for k, v in x.items()
                if k not in TIMING and not k.endswith(("wall_clock_s", "warm_start_s"))}
    if isinstance(x, list):
        return [strip_timing(v) for v in x]
    return x


def jsonl(path):
    return [strip_timing(json.loads(line)) for line in open(path)]


def final_params(workdir, overrides):
    job = apply_overrides(load_config(CONFIG, AgentJob), overrides)
    ckpt = Checkpointer(workdir / "checkpoints", save_every=2, read_only=True)
    try:
        learner = Learner(job.model, job.rl.update)
        state, meta = restore(ckpt, STEPS, _state_shapes(job, learner, job.model), learner)
    finally:
        ckpt.close()
    return jax.device_get(state), meta


@pytest.fixture(scope="module")
def full(tmp_path_factory, env):
    """The uninterrupted run (it fills the compile cache; its warm start serves the asynchronous run)."""
    run = tmp_path_factory.mktemp("full") / "full"
    assert finish(start(run, env), run) == 0
    return run


def test_kill_and_preempt_then_resume_auto_is_exact(tmp_path, env, full):
    rng = random.Random(SEED)
    cut = tmp_path / "cut"

    # 1. kill -9 during the warm start: nothing was checkpointed, auto starts afresh
    p = start(cut, env, "--resume", "auto")
    k = rng.randint(1, 30)
    wait_until(p, cut, lambda: len(lines(cut, "sft")) >= k, f"{k} SFT steps")
    time.sleep(rng.uniform(0, 0.05))
    p.kill()
    p.wait()
    assert finished_steps(cut) == []

    # 2. SIGTERM during the warm start: it stops at the end of the SFT step, saves nothing, exits 143
    stale = len(lines(cut, "sft"))                           # attempt 1's lines, until the restart drops them
    p = start(cut, env, "--resume", "auto")
    k = rng.randint(1, 30)
    emptied = stale == 0

    def ready():                     # the restart has started its log afresh, then logged k steps
        nonlocal emptied
        n = len(lines(cut, "sft"))
        emptied = emptied or n < stale
        return emptied and n >= k
    wait_until(p, cut, ready, f"{k} SFT steps of the restart")
    p.send_signal(signal.SIGTERM)
    assert finish(p, cut) == PREEMPTED_EXIT_CODE
    assert "preempted (SIGTERM) during the warm start" in output(cut)
    assert finished_steps(cut) == []

    # 3. SIGTERM between PARL checkpoints: the current step ends, then a checkpoint, then exit 143
    p = start(cut, env, "--resume", "auto")
    j = rng.randint(1, 3)
    wait_until(p, cut, lambda: len(lines(cut, "rl")) >= j + 1, f"PARL step {j}")
    p.send_signal(signal.SIGTERM)
    assert finish(p, cut) == PREEMPTED_EXIT_CODE
    stopped = max(finished_steps(cut))
    assert len(rows(cut / "metrics.jsonl")) == stopped >= j + 1   # stopped at the end of a step
    assert f"checkpoint at RL step {stopped} saved" in output(cut)

    # 4. kill -9 right after a checkpoint is finalised (on POSIX orbax renames
    # <step>.orbax-checkpoint-tmp to <step> when it is; the final one: before the summary)
    p = start(cut, env, "--resume", "auto")
    c = stopped + 1 + (stopped + 1) % 2                      # the next multiple of 2
    wait_until(p, cut, lambda: (cut / "checkpoints" / str(c)).exists(), f"checkpoint {c}")
    p.kill()
    p.wait()
    assert c in finished_steps(cut)

    # 5. resume to the end
    assert finish(start(cut, env, "--resume", "auto"), cut) == 0
    for name in ("metrics.jsonl", "eval.jsonl", "traces.jsonl"):
        assert jsonl(cut / name) == jsonl(full / name), name
    assert len(rows(cut / "metrics.jsonl", "sft")) == 80
    assert strip_timing(json.loads((cut / "summary.json").read_text())) == \
        strip_timing(json.loads((full / "summary.json").read_text()))
    (a, meta_a), (b, meta_b) = final_params(full, env[1]), final_params(cut, env[1])
    assert all(jax.tree.leaves(jax.tree.map(lambda x, y: np.array_equal(x, y), a, b)))
    assert meta_a["stream"] == meta_b["stream"]

    # a finished run resumed again: nothing recomputed, the final evaluation lines stay
    before = {name: (cut / name).read_text() for name in ("metrics.jsonl", "eval.jsonl", "traces.jsonl")}
    assert main(argv(cut, env[1], "--resume", "auto")) == 0
    assert {name: (cut / name).read_text() for name in before} == before


def test_async_kill_and_preempt_trains_every_task_once(tmp_path, env, full):
    """An asynchronous run (two batches in flight) killed with -9 between checkpoints,
    then preempted with SIGTERM, resumed each time: every batch of the task stream is
    trained on once, in order, and nothing else is."""
    rng = random.Random(SEED + 1)
    e, overrides = env
    overrides = overrides + ["rl.async_rollout.depth=2", "rl.refresh_subagents.every=3",
                             f"warm_start_from='{full}'"]
    run = tmp_path / "async"
    p = start(run, (e, overrides))
    k = rng.randint(1, 2)
    wait_until(p, run, lambda: len(lines(run, "rl")) >= k, f"PARL step {k}")
    p.kill()
    p.wait()
    reached = len(lines(run, "rl"))
    assert reached <= 3 and 0 in finished_steps(run)       # killed before the run could end

    p = start(run, (e, overrides), "--resume", "auto")
    wait_until(p, run, lambda: len(lines(run, "rl")) >= reached + 1, "a step past the killed run's")
    p.send_signal(signal.SIGTERM)
    assert finish(p, run) == PREEMPTED_EXIT_CODE
    assert finish(start(run, (e, overrides), "--resume", "auto"), run) == 0

    job = apply_overrides(load_config(CONFIG, AgentJob), overrides)
    stream = job.task.prepare(str(run)).stream("train", job.seed)
    expected = [(stream.ids(2), stream.take(2))[0] for _ in range(STEPS)]
    done = lines(run, "rl")
    assert [r["step"] for r in done] == list(range(STEPS))
    assert [r["tasks"] for r in done] == expected
    assert all(r["async/trained"] == 1 and r["async/staleness"] <= 2 for r in done)
    assert max(r["async/staleness"] for r in done) >= 1 and done[-1]["async/version"] == STEPS - 1
    assert "checkpoint at RL step" in output(run)
    state, _ = final_params(run, overrides)         # refreshed after step 6: the sub-agents are the policy
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, state.params, state.frozen["subagents"])))


def test_second_sigterm_terminates(tmp_path):
    """The first SIGTERM only asks for a stop at the next safe point; the second one
    terminates at once (the default action), as the job would in a long step."""
    code = ("import os, signal, time\n"
            "from swarmjax.train.preemption import PreemptionWatch\n"
            "with PreemptionWatch() as w:\n"
            "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2)\n"
            "    print('first', w.reached(), flush=True)\n"
            "    os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n"
            "    print('survived', flush=True)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={k: v for k, v in os.environ.items() if k != "XLA_FLAGS"})
    assert p.returncode == -signal.SIGTERM, p.stderr
    assert "first True" in p.stdout and "survived" not in p.stdout


def test_logs_cut_back_consistently(tmp_path):
    """Truncation keeps what a checkpoint covers, drops a line torn by a kill, keeps the
    final evaluation of a finished run only when asked; the object-store mode (rewrite
    on sync) gives the same files as the local one (append)."""
    def rec(**kw):
        return json.dumps(kw) + "\n"
    m = tmp_path / "metrics.jsonl"
    m.write_text(rec(stage="sft", step=0) + rec(stage="rl", step=0) + rec(stage="rl", step=1)
                 + rec(stage="rl", step=2) + '{"stage": "r')
    e = tmp_path / "eval.jsonl"
    e.write_text(rec(policy="warm_start", split="test", step=0, n=1) + rec(policy="rl", split="validation",
                 step=2, n=1) + rec(policy="final", split="test", step=2, n=1))
    assert [json.loads(x)["step"] for x in truncate(m, 2)] == [0, 0, 1]
    assert m.read_text().count("\n") == 3 and not (tmp_path / "metrics.jsonl.tmp").exists()
    assert [json.loads(x)["policy"] for x in truncate(e, 2, keep_final=True)] == ["warm_start", "rl", "final"]
    assert [json.loads(x)["policy"] for x in truncate(e, 2)] == ["warm_start", "rl"]

    written = {}
    for append in (True, False):
        d = tmp_path / f"append{append}"
        d.mkdir()
        (d / "metrics.jsonl").write_text(m.read_text())
        log = JobLog(d, 2, append=append)
        log.write("metrics.jsonl", {"stage": "rl", "step": 2})
        log.sync()
        assert (d / "metrics.jsonl").read_text().count("\n") == 4
        log.close()
        written[append] = [(d / n).read_text() for n in JobLog.NAMES]
        fresh = JobLog(d, None, append=append)                # a fresh start empties the logs and tb/
        fresh.close()
        assert all((d / n).read_text() == "" for n in JobLog.NAMES)
        assert len(list((d / "tb" / "rl").glob("events.*"))) <= 1       # the earlier events are gone
    assert written[True] == written[False]
