"""`swarmjax train` / `swarmjax eval` end to end on a tiny job: every output file, exact
resume from a checkpoint, bad configs as one line before anything compiles; and the job
over two local processes: the first run through the CLI's own flags (``--coordinator
127.0.0.1:PORT --num-processes 2 --process-id I``), the resumed one through
``launch/local.py`` (each process gets the JAX_* environment a pod gives, and the CLI
starts the distributed runtime from it). jax.distributed on 127.0.0.1, gloo CPU
collectives, 2 devices each, one 4-way data mesh: every process reads the same batches and
rolls out its share, process 0 alone writes the logs, both report the same summary; a
SIGTERM to one process stops both at the same step with a checkpoint (exit 143),
``--resume auto`` over two processes continues, and the run's figures are those of the
same job in one process on one device (to float32 rounding)."""

import contextlib
import glob
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from small_job import CONFIG, SMALL_JOB, TIMING, free_port, rows, sigterm_in_warm_step, subprocess_xla_flags
from swarmjax.cli import main
from swarmjax.config_file import apply_overrides, load_config
from swarmjax.train.agent_eval import FIGURES
from swarmjax.train.checkpoint import Checkpointer
from swarmjax.rl.update import Learner
from swarmjax.train.agent_job import AgentJob, _state_shapes
from swarmjax.train.loop import restore
from swarmjax.train.preemption import PREEMPTED_EXIT_CODE


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    data_dir = str(tmp_path_factory.mktemp("tasks"))
    return SMALL_JOB + ["sft.steps=6", "sft.bucket=160", "rl.tasks_per_step=4", "rl.group_size=2",
                        "checkpoint.async_save=True", f"task.data.data_dir='{data_dir}'", "mesh=None"]


def train(workdir, small, *extra, resume=False):
    args = ["train", "--config", CONFIG, "--workdir", str(workdir), "--no-progress"]
    args += [a for s in small + list(extra) for a in ("--set", s)]
    return main(args + (["--resume"] if resume else []))


def final_state(workdir, small, steps):
    job = apply_overrides(load_config(CONFIG, AgentJob), small + [f"rl.steps={steps}"])
    ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), save_every=2)
    try:
        assert ckpt.latest_step() == steps
        learner = Learner(job.model, job.rl.update)
        state, meta = restore(ckpt, steps, _state_shapes(job, learner, job.model), learner)
    finally:
        ckpt.close()
    return state, meta


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, small):
    """The job run to PARL step 2 (read only: a test that resumes it copies it first)."""
    run = tmp_path_factory.mktemp("two") / "run"
    assert train(run, small, "rl.steps=2") == 0
    return run


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory, small):
    """The job run to PARL step 4 on one device (read only), and what it printed: the
    reference of the resume and two-process tests."""
    run = tmp_path_factory.mktemp("four") / "full"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert train(run, small, "rl.steps=4") == 0
    return run, out.getvalue()


@pytest.mark.slow
def test_train_outputs_and_exact_resume(tmp_path, small, two_steps, four_steps, capsys):
    (full, printed), split = four_steps, tmp_path / "split"
    for name in ("config.txt", "metrics.jsonl", "eval.jsonl", "traces.jsonl", "summary.json", "summary.md",
                 "curves.png"):
        assert os.path.getsize(full / name) > 0, name
    summary = json.loads((full / "summary.json").read_text())
    assert set(summary["initial_sizes"]) == set(summary["final_sizes"]) == {"1", "16"}
    assert set(summary["final_sizes"]["16"]) == set(FIGURES)            # every job's figures, per task size
    assert [r["step"] for r in rows(full / "metrics.jsonl")] == [0, 1, 2, 3]
    assert len(rows(full / "metrics.jsonl", "sft")) == 6
    assert "per task size (test split)" in printed and "\n| 16 | " in printed
    # every trace validates, with all reward channels and a measured wall clock; `trace show` draws each
    from test_traces import _check_rollout_trace
    traces = [json.loads(line) for line in open(full / "traces.jsonl")]
    assert {"initial-s0-n1-0", "initial-s0-n16-0"} <= {t["trace_id"] for t in traces}
    for i, trace in enumerate(traces):
        _check_rollout_trace(trace)
        assert trace["costs"]["wall_clock_s"] > 0 and trace["costs"]["batch_episodes"] == 4
        assert main(["trace", "show", str(full / "traces.jsonl"), "--index", str(i)]) == 0
    atif = [json.loads(line) for line in open(full / "atif.jsonl")]        # the same episodes with their ids
    assert [d["trajectory_id"] for d in atif] == [t["trace_id"] for t in traces]
    assert main(["trace", "export", str(full), "--out", str(tmp_path / "atif")]) == 0
    assert len(list((tmp_path / "atif").iterdir())) == len(atif)

    # 2 steps, stop, resume to 4: the same steps, metrics and parameters as 4 in one go
    shutil.copytree(two_steps, split)
    assert train(split, small, "rl.steps=2") == 2                     # would overwrite: refused
    assert "--resume" in capsys.readouterr().err
    assert train(split, small, "rl.steps=4", resume=True) == 0
    assert rows(split / "metrics.jsonl") == rows(full / "metrics.jsonl")
    assert rows(split / "metrics.jsonl", "sft") == rows(full / "metrics.jsonl", "sft")
    evals = lambda d: [json.loads(line) for line in open(d / "eval.jsonl")]
    assert evals(split) == evals(full)
    a, meta_a = final_state(full, small, 4)
    b, meta_b = final_state(split, small, 4)
    same = jax.tree.map(lambda x, y: np.array_equal(np.asarray(x), np.asarray(y)), a, b)
    assert all(jax.tree.leaves(same))
    assert meta_a["stream"] == meta_b["stream"] and meta_a["step"] == 4

    # as if the run had died after logging steps 2 and 3 but before checkpoint 4 was finished:
    # resume from 2 drops those lines and computes them again, identically
    shutil.rmtree(split / "checkpoints" / "4")
    assert train(split, small, "rl.steps=4", resume=True) == 0
    assert rows(split / "metrics.jsonl") == rows(full / "metrics.jsonl") and evals(split) == evals(full)
    # TensorBoard, as it reads the runs (resumes purge the PARL events from their step on)
    tb_full, tb_split = tb_scalars(full / "tb" / "rl"), tb_scalars(split / "tb" / "rl")
    assert [s for s, _ in tb_full["rl/accuracy"]] == [1, 2, 3, 4]          # RL steps done
    assert set(tb_split) == set(tb_full)
    for tag, series in tb_full.items():
        assert [s for s, _ in tb_split[tag]] == [s for s, _ in series], tag
        if tag.rsplit("/", 1)[-1] not in TIMING:
            np.testing.assert_allclose([v for _, v in tb_split[tag]], [v for _, v in series], err_msg=tag)
    assert [s for s, _ in tb_scalars(full / "tb" / "sft")["sft/loss"]] == list(range(6))

    # swarmjax eval: the newest and the best checkpoint, on held-out tasks
    base = ["eval", "--config", CONFIG, "--workdir", str(full)] + [a for s in small for a in ("--set", s)]
    capsys.readouterr()
    assert main(base + ["--sizes", "16"]) == 0
    out = capsys.readouterr().out
    assert "RL step 4" in out and "\n| 16 | " in out and "\n| 1 | " not in out
    summary = json.loads((full / "summary.json").read_text())
    start, final = summary["initial_sizes"]["16"]["accuracy"], summary["final_sizes"]["16"]["accuracy"]
    assert f"| 16 | {start:.3f} | {final:.3f} |" in out                # same tasks, same greedy policies
    assert main(base + ["--checkpoint", "best"]) == 0
    assert main(base + ["--checkpoint", "7"]) == 2
    assert "no finalised checkpoint for step 7" in capsys.readouterr().err


@pytest.mark.slow
def test_warm_start_from_another_run(tmp_path, small, two_steps, capsys):
    base, arm = two_steps, tmp_path / "arm"
    assert os.path.exists(base / "warm_start" / "meta.json")
    # an RL ablation from the same warm start: no SFT stage, the same frozen sub-agents
    assert train(arm, small, "rl.steps=2", "rl.parl.lambda1=0.0", f"warm_start_from='{base}'") == 0
    assert rows(arm / "metrics.jsonl", "sft") == [] and len(rows(arm / "metrics.jsonl")) == 2
    summary = lambda d: json.loads((d / "summary.json").read_text())
    assert summary(arm)["initial_sizes"] == summary(base)["initial_sizes"]
    assert summary(arm)["warm_start_data"] == summary(base)["warm_start_data"]
    assert os.path.exists(arm / "warm_start" / "meta.json")          # a source for the next ablation
    a, _ = final_state(base, small, 2)
    b, _ = final_state(arm, small, 2)
    same = jax.tree.map(lambda x, y: np.array_equal(np.asarray(x), np.asarray(y)),
                        a.frozen["subagents"], b.frozen["subagents"])
    assert all(jax.tree.leaves(same))
    # a warm start made for another model, or none at all: one line
    capsys.readouterr()
    assert train(tmp_path / "bad", small, "model.num_layers=2", f"warm_start_from='{base}'") == 2
    err = capsys.readouterr().err.strip()
    assert "warm_start_from" in err and "another policy" in err and len(err.splitlines()) == 1
    assert train(tmp_path / "none", small, f"warm_start_from='{tmp_path}'") == 2
    assert "holds no warm start" in capsys.readouterr().err
    # a variant of the task: refused by default, transferred when only the model must match,
    # and the copy keeps the identity it was made with (not the variant's)
    variant = (f"warm_start_from='{base}'", "task.cfg.subagent_steps=3", "rl.steps=1")
    assert train(tmp_path / "variant", small, *variant) == 2
    assert "another task" in capsys.readouterr().err
    assert train(tmp_path / "variant", small, *variant, "warm_start_match=('policy',)") == 0
    meta = lambda d: json.loads((d / "warm_start" / "meta.json").read_text())
    assert meta(tmp_path / "variant") == meta(base)


def tb_scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    """Scalar series of a TensorBoard run directory, read the way TensorBoard does:
    event files in name order, and a ``SessionLog.START`` at step s (tensorboardX's
    ``purge_step``) drops the events read so far at steps >= s."""
    import struct

    from tensorboardX.proto import event_pb2

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "events.*"))):
        data, i = open(path, "rb").read(), 0
        while i < len(data):                         # TFRecord: u64 length, u32 crc, data, u32 crc
            (n,) = struct.unpack("<Q", data[i:i + 8])
            ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
            i += 16 + n
            if ev.HasField("session_log") and ev.session_log.status == ev.session_log.START:
                out = {k: [(s, v) for s, v in series if s < ev.step] for k, series in out.items()}
            for val in ev.summary.value:
                out.setdefault(val.tag, []).append((ev.step, val.simple_value))
    return out


@pytest.mark.parametrize("override, message", [
    ("rl.update.optim.lr=1", "has no field 'lr'"),
    ("task.eval_sizes=(1, 40)", "within the task sizes 1..16"),
    ("rl.steps='many'", "is not a int"),
    ("task.cfg.budget=4", "below 5, the fewest critical steps"),
    ("mesh.data=3", "needs 3 devices"),
    ("mesh.tensor=2", "not divisible by the mesh's data x fsdp = 4"),
    ("task.data.focus_min_n=20", "task.data.focus_min_n 20 is outside the task sizes 1..16"),
    ("task.data.focus_fraction=1.0", "task.data.focus_fraction must be in [0, 1)"),
    ("eval_episodes=30", "must be a multiple of the 4"),
    ("engine='host'", "engine='host' takes rl=TextRLConfig"),
    ("task='arith'", "engine='token' runs the token world's task"),
    ("role='single'", "trains an orchestrator with frozen sub-agents"),
])
def test_bad_config_is_one_line(tmp_path, override, message, capsys):
    args = ["train", "--config", CONFIG, "--workdir", str(tmp_path / "x"), "--set", "eval_episodes=24",
            "--set", override]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(tmp_path / "x")                          # nothing ran


@pytest.mark.slow
def test_a_warm_start_stopped_by_sigterm_continues_exactly(tmp_path, small, two_steps, capsys):
    """SIGTERM during the warm start (step 3 of 6, saves every 2): exit 143 with its own
    checkpoint at 3; ``--resume never`` refuses the workdir, ``--resume`` continues it, and
    the run's logs and params equal an uninterrupted run's."""
    run, saves = tmp_path / "warm", "checkpoint.warm_every=2"
    with sigterm_in_warm_step(3):
        assert train(run, small, "rl.steps=2", saves) == PREEMPTED_EXIT_CODE
    assert "checkpoint at step 3 saved" in capsys.readouterr().err
    assert os.listdir(run / "warm_start_steps") == ["3"] and len(rows(run / "metrics.jsonl", "sft")) == 3
    assert train(run, small, "rl.steps=2", saves) == 2
    assert "holds a warm start stopped at step 3" in capsys.readouterr().err
    assert train(run, small, "rl.steps=2", saves, resume=True) == 0
    assert "continuing from its checkpoint at step 3" in capsys.readouterr().err
    assert not os.path.exists(run / "warm_start_steps")                # done: warm_start/ holds it
    for stage in ("sft", "rl"):
        assert rows(run / "metrics.jsonl", stage) == rows(two_steps / "metrics.jsonl", stage)
    a, _ = final_state(two_steps, small, 2)
    b, _ = final_state(run, small, 2)
    assert all(jax.tree.leaves(jax.tree.map(lambda x, y: np.array_equal(np.asarray(x), np.asarray(y)), a, b)))


@pytest.mark.slow
def test_lora_rl_adapts_a_full_warm_start(tmp_path, small, two_steps):
    """``lora.warm_start=False``: the warm start trains the whole model (the run without
    LoRA's warm start, bit for bit), RL trains adapters over it: the checkpoints hold the
    adapters, the base every step trains over is the warm-started model, unchanged; a
    resumed run continues exactly."""
    run, lora = tmp_path / "lora", ("lora.rank=4", "lora.warm_start=False")
    assert train(run, small, "rl.steps=2", *lora) == 0
    assert rows(run / "metrics.jsonl", "sft") == rows(two_steps / "metrics.jsonl", "sft")
    with Checkpointer(os.path.join(run, "checkpoints"), save_every=1, read_only=True) as ckpt:
        saved, meta = ckpt.read(2)
    assert set(saved["params"]) == {"lora"} and meta["lora"]["warm_start"]
    from swarmjax.train.agent_job import AgentRun

    job = apply_overrides(load_config(CONFIG, AgentJob), small + ["rl.steps=2", *lora])
    base = AgentRun(job, str(run), fresh=False, progress=False).lora_base()       # what a resume restores over
    start = final_state(two_steps, small, 2)[0].frozen["subagents"]        # the full run's warm start
    assert all(jax.tree.leaves(jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), base, start)))
    assert np.abs(np.asarray(saved["params"]["lora"]["attn"]["q_proj"]["b"])).max() > 0     # the adapters moved
    # stopped after PARL step 1 and resumed: the adapters, their optimizer state and the
    # metrics of 2 steps in one go, over the same restored base
    cut = tmp_path / "cut"
    assert train(cut, small, "rl.steps=1", *lora) == 0
    assert train(cut, small, "rl.steps=2", *lora, resume=True) == 0
    assert rows(cut / "metrics.jsonl") == rows(run / "metrics.jsonl")
    with Checkpointer(os.path.join(cut, "checkpoints"), save_every=1, read_only=True) as ckpt:
        resumed, _ = ckpt.read(2)
    same = jax.tree.map(lambda a, b: np.array_equal(np.asarray(a), np.asarray(b)), resumed, saved)
    assert all(jax.tree.leaves(same))


def test_resume_without_checkpoint(tmp_path, capsys):
    assert main(["train", "--config", CONFIG, "--workdir", str(tmp_path), "--resume"]) == 2
    assert "no finished checkpoint" in capsys.readouterr().err


# ------------------------------------------------------------------ two processes

ROOT = Path(__file__).resolve().parents[1]


def process_env(cache) -> dict[str, str]:
    """Each process's environment: 2 devices, the suite's compiler flags, one shared compilation cache."""
    return {**os.environ, "XLA_FLAGS": subprocess_xla_flags(2), "JAX_COMPILATION_CACHE_DIR": str(cache),
            "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "PYTHONUNBUFFERED": "1"}


def launch(workdir, cache, sets, *extra) -> list[subprocess.Popen]:
    """Both processes of one run, output to <workdir>.<i>.out."""
    port = free_port()
    env = process_env(cache)
    return [subprocess.Popen([sys.executable, "-m", "swarmjax.cli", "train", "--config", CONFIG, "--workdir",
                              str(workdir), "--no-progress", *sets, "--coordinator", f"127.0.0.1:{port}",
                              "--num-processes", "2", "--process-id", str(i), *extra],
                             stdout=open(f"{workdir}.{i}.out", "w"), stderr=subprocess.STDOUT, env=env)
            for i in range(2)]


def launch_local(workdir, cache, sets, *extra) -> list[str]:
    """Both processes of one run through ``launch/local.py``, which gives each the
    ``JAX_COORDINATOR_ADDRESS`` / ``JAX_NUM_PROCESSES`` / ``JAX_PROCESS_ID`` environment a
    pod gives its workers (``--no-cli-flags``: the CLI starts the distributed runtime from
    that environment alone). Returns each process's output."""
    env = process_env(cache)
    logs = Path(f"{workdir}.logs")
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


@pytest.mark.slow
def test_two_processes_preempt_resume_and_match_one_process(tmp_path, small, four_steps):
    """The job over two processes of 2 devices each (jax.distributed on 127.0.0.1, a 4-way
    data mesh): stopped by SIGTERM, resumed through launch/local.py, it writes the
    one-device run's metrics (four_steps)."""
    one, _ = four_steps
    cache = tmp_path / "jax_cache"
    # eval_every=0: evaluations only before and after RL (the figures compared)
    sets = [a for s in small + ["mesh.data=-1", "rl.steps=4", "eval_every=0"] for a in ("--set", s)]

    # two processes (the CLI's own flags); SIGTERM to process 1 alone (not the one writing
    # the logs) once PARL has begun: both stop after the same step, with its checkpoint, exit 143
    cut = tmp_path / "cut"
    procs = launch(cut, cache, sets, "--resume", "auto")
    t = time.monotonic()
    while not (cut / "metrics.jsonl").exists() or '"stage": "rl"' not in (cut / "metrics.jsonl").read_text():
        assert procs[1].poll() is None and time.monotonic() - t < 600, open(f"{cut}.1.out").read()[-3000:]
        time.sleep(0.02)
    procs[1].send_signal(signal.SIGTERM)
    outs = wait(procs, cut)
    assert [p.returncode for p in procs] == [PREEMPTED_EXIT_CODE] * 2, outs[0][-3000:] + outs[1][-3000:]
    stopped = len(rows(cut / "metrics.jsonl"))
    assert 1 <= stopped < 4
    assert all(f"checkpoint at RL step {stopped} saved" in out for out in outs)

    # --resume auto through launch/local.py (the JAX_* environment a pod gives its workers)
    outs = launch_local(cut, cache, sets, "--resume", "auto")
    procs_ok = [f"written to {cut}" in outs[0], f"written to {cut}" not in outs[1]]
    assert all(procs_ok) and table(outs[0]) and table(outs[0]) == table(outs[1]), outs[0][-3000:] + outs[1][-3000:]
    parl = rows(cut / "metrics.jsonl")
    assert [r["step"] for r in parl] == [0, 1, 2, 3]                    # each once, written by process 0
    assert summary(cut)["rl_steps"] == 4 and set(summary(cut)["final_sizes"]) == {"1", "16"}
    assert len((cut / "traces.jsonl").read_text().splitlines()) == 8   # initial + final, 2 sizes, 2 each
    # every process reads the one process's batches: the figures of one device
    assert close(parl, rows(one / "metrics.jsonl")), (parl, rows(one / "metrics.jsonl"))
    for stage in ("initial", "final", "initial_sizes", "final_sizes"):
        assert close(summary(cut)[stage], summary(one)[stage]), stage
