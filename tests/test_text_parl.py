"""`swarmjax train --config configs/parl_widesearch_text_cpu.py`, shrunk: the text PARL recipe
(the relay task's streams and demonstrations, swarmjax/envs/widesearch_relay_parl.py) through
the one job on the device engine end to end (tokenizer, played demonstrations, a two-role warm
start, PARL on the jitted text swarm, evaluations, summary), its preemption and exact resume in
a ``gs://`` workdir (a fake GCS, tests/fake_gcs.py), over two processes, with rollouts in
flight, its reward and its bad-input errors."""

import contextlib
import dataclasses
import io
import json
import os

import jax
import numpy as np
import pytest
from etils import epath

from small_job import close_lines, restored_states, sigterm_in_rl_step
from swarmjax.cli import main
from swarmjax.config_file import load_config
from swarmjax.envs.widesearch_relay_parl import RelayPARLTask
from swarmjax.models.transformer import init_params
from swarmjax.rl.parl import PARLConfig
from swarmjax.train.agent import TextRLConfig
from swarmjax.train.agent_job import AgentJob
from swarmjax.train.checkpoint import Checkpointer
from swarmjax.train.preemption import PREEMPTED_EXIT_CODE
from swarmjax.train.agent_rl import episode_rewards
from swarmjax.train.jobs import evaluate_checkpoint
from swarmjax.train.warm_start import load_warm_start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "parl_widesearch_text_cpu.py")

TINY = '''
import dataclasses
from swarmjax.config_file import load_config
from swarmjax.envs.widesearch import WideSearchConfig
from swarmjax.optim import OptimConfig
from swarmjax.roles import Roles
from swarmjax.swarm.text_types import SwarmConfig

def get_config():
    job = load_config({config!r})
    env = WideSearchConfig(num_entities=12, num_values=12, min_task_size=1, max_task_size=4, max_subagents=2,
                           subagent_steps=3, budget=None)
    r = job.rl
    return dataclasses.replace(
        job, task=dataclasses.replace(job.task, cfg=env, max_calls=6, max_mentions=4, max_pairs=4, focus_min_n=3,
                                      eval_sizes=(1, 4)),
        tokenizer_vocab=600,
        model=job.model.replace(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                                intermediate_size=64),
        sft=dataclasses.replace(job.sft, steps=3, batch=4, demos=24, bucket=1280,
                                optim=OptimConfig(learning_rate=3e-3, warmup_steps=1, decay_steps=3)),
        rl=dataclasses.replace(r, steps=2, tasks_per_step=2, group_size=2,
                               swarm=SwarmConfig(buckets=1, episode_keys=True),
                               update=dataclasses.replace(r.update, num_minibatches=2),
                               rollout=dataclasses.replace(r.rollout, contexts=Roles(1280, 512),
                                                           max_turn_tokens=192, subagent_turns=3, budget=6)),
        eval_episodes=4, eval_every=1)
'''
TIMING = {"seconds", "rollout_s", "update_s", "tok_s", "wall_clock_s", "warm_start_s"}


def test_shipped_config_is_valid():
    job = load_config(CONFIG)
    assert isinstance(job, AgentJob) and isinstance(job.task, RelayPARLTask)
    job.validate()
    assert job.engine == "device" and job.chat == "qwen3" and job.sft.per_role
    assert max(job.task.eval_sizes) == job.task.cfg.max_task_size == 16
    assert job.eval_episodes == 16 * len(job.task.eval_sizes)


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The shrunk job, run once for the module: (config path, workdir, its stdout)."""
    base = tmp_path_factory.mktemp("text_parl")
    config = tiny_config(base)
    workdir = str(base / "run")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["train", "--config", str(config), "--workdir", workdir, "--no-progress"]) == 0
    return config, workdir, buf.getvalue()


def lines(run, name, *, drop=TIMING, stage=None):
    """A run's log lines without their timings (only ``stage``'s when given); local or ``gs://``."""
    rows = [json.loads(x) for x in (epath.Path(run) / name).read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in drop} for r in rows if stage in (None, r.get("stage"))]


@pytest.mark.slow
def test_text_parl_job_runs_and_writes_its_summary(tiny_run, tmp_path, capsys):
    config, workdir, out = tiny_run
    assert "per task size (test split)" in out and "| final |" in out
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert sorted(summary["final_sizes"]) == sorted(summary["initial_sizes"]) == ["1", "4"]
    assert summary["held_out"] == {"validation": 4, "test": 4} and summary["seed"] == summary["rl_seed"] == 0
    assert summary["role"] == "orchestrator" and summary["subagents"] == "frozen"
    assert 0.0 <= summary["final_sizes"]["4"]["accuracy"] <= 1.0 and summary["final_sizes"]["1"]["critical_steps"] >= 1
    sft = lines(workdir, "metrics.jsonl", stage="sft")
    # two roles a step, QK-Clip after each (the optimiser's tau, 100 by default), as in RL
    assert [r["step"] for r in sft] == [0, 1, 2]
    assert all({"orch_acc", "worker_acc"} <= set(r) and r["max_attn_logit"] > 0 for r in sft)
    rl = lines(workdir, "metrics.jsonl", stage="rl")
    assert [r["step"] for r in rl] == [0, 1]
    for r in rl:
        assert np.isfinite(r["learner/loss"]) and r["cut_by_max_ticks"] == 0 and r["orch_sampled_tokens"] > 0
        assert {"accuracy", "reward/r_parallel", "reward/r_finish", "reward/cost", "reward/lambda1"} <= set(r)
    # the held-out sizes in turn (the final test episodes' traces)
    test = lines(workdir, "traces.jsonl", drop=())
    assert [t["trace_id"].split("-")[2] for t in test] == ["n1", "n4", "n1", "n4"]
    assert [(e["policy"], e["split"]) for e in lines(workdir, "eval.jsonl")] == [
        ("initial", "validation"), ("initial", "test"), ("rl", "validation"), ("rl", "validation"),
        ("final", "test")]
    assert os.path.isfile(os.path.join(workdir, "tokenizer", "tokenizer.json"))
    # the RL state at each evaluation and at the end; evaluating the last one (`swarmjax eval`)
    # gives the run's own final table (same tasks, greedy)
    with Checkpointer(os.path.join(workdir, "checkpoints"), save_every=1, read_only=True) as ckpt:
        assert ckpt.all_steps() == [1, 2]
    got = evaluate_checkpoint(load_config(str(config)), workdir, which="latest")
    assert got["step"] == 2
    for n in ("1", "4"):
        for k, v in summary["final_sizes"][n].items():
            assert got["final_sizes"][n][k] == pytest.approx(v, abs=1e-6), (n, k)
    capsys.readouterr()
    assert main(["eval", "--config", str(config), "--workdir", workdir, "--set", "seed=3"]) == 2
    assert "another seed" in capsys.readouterr().err
    # RL ablations and RL seeds reuse the warm start: it restores for the same job, not for another seed
    job = load_config(str(config))
    cfg = job.model.replace(vocab_size=summary["vocab_size"])
    params, meta = load_warm_start(job, workdir, jax.eval_shape(lambda: init_params(cfg, jax.random.key(0))))
    assert meta["identity"] == job.warm_identity()
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--workdir", str(tmp_path / "c"), "--no-progress",
                 "--set", f"warm_start_from={workdir}", "--set", "seed=1"]) == 2
    assert "made with another seed" in capsys.readouterr().err and not (tmp_path / "c").exists()
    # a finished workdir is refused; so is --resume latest (no checkpoints)
    assert main(["train", "--config", str(config), "--workdir", workdir, "--no-progress"]) == 2
    assert "already holds a finished run" in capsys.readouterr().err
    assert main(["train", "--config", str(config), "--workdir", str(tmp_path / "b"), "--resume", "latest"]) == 2


def test_bad_configs_are_refused():
    job = load_config(CONFIG)
    task = job.task
    with pytest.raises(ValueError, match="eval_sizes"):
        dataclasses.replace(task, eval_sizes=(1, 17))
    with pytest.raises(ValueError, match="max_pairs"):
        dataclasses.replace(task, max_pairs=8)
    with pytest.raises(ValueError, match="focus_min_n"):
        dataclasses.replace(task, focus_min_n=20)
    with pytest.raises(ValueError, match="split_fraction"):
        dataclasses.replace(task, split_fraction=1.5)
    with pytest.raises(ValueError, match="divisible"):
        TextRLConfig(tasks_per_step=3, group_size=1, update=job.rl.update)
    with pytest.raises(ValueError, match="warm_start_from reuses"):
        dataclasses.replace(job, sft=None, warm_start_from="runs/x").validate()


def test_two_role_demonstrations(tmp_path):
    """The recipe's demonstrations as two roles: every orchestrator's conversation, then
    its sub-agents' in spawn order (a delegating demonstration's chunks cover its task);
    without a delegating one the second role has no rows: one line."""
    from swarmjax.envs.task import EnvContext
    from swarmjax.envs.widesearch_relay import relay_corpus
    from swarmjax.text.bpe import train_bpe_tokenizer
    from swarmjax.text.chat import chat_format
    from swarmjax.text.runner import ToolRunner
    from swarmjax.text.tokenizer import TextTokenizer
    from swarmjax.train.agent import demonstrations

    task = load_config(tiny_config(tmp_path)).task
    chat = chat_format("qwen3", TextTokenizer.from_dir(train_bpe_tokenizer(relay_corpus(task.cfg), tmp_path / "tok",
                                                                           vocab_size=600)))
    ctx = EnvContext(chat, ToolRunner([]), role="orchestrator")
    scripts = task.demonstration_set(12, 0, chat)
    again = task.demonstration_set(12, 0, chat)                               # one seed, one set
    assert [p for p, _ in scripts] == [p for p, _ in again]
    assert all(np.array_equal(a, b) for (_, d), (_, e) in zip(scripts, again) for a, b in zip(d.turns, e.turns))
    orch, work = demonstrations(task, [], ctx, np.random.default_rng(0), scripts=scripts, per_role=True)
    assert len(orch) == 12 and len(work) == sum(len(d.workers) for _, d in scripts) > 0
    one = demonstrations(task, [], ctx, np.random.default_rng(0), scripts=scripts)
    assert len(one) == len(orch) + len(work)
    serial = dataclasses.replace(task, split_fraction=0.0)
    with pytest.raises(ValueError, match="no demonstration starts a sub-agent"):
        demonstrations(serial, [], ctx, np.random.default_rng(0), scripts=serial.demonstration_set(4, 0, chat),
                       per_role=True)


def tiny_config(tmp_path):
    """The shrunk config's file (what :func:`tiny_run` trains)."""
    path = tmp_path / "tiny.py"
    path.write_text(TINY.format(config=CONFIG))
    return str(path)


def test_reward_uses_the_rollouts_counts():
    """The text jobs' one reward (episode_rewards) with a PARL stage's config =
    parl_reward over the text rollout's counts: a serial answer pays r_perf - costs; a
    split that returned 2 entities beside the busiest pays lambda1 * 2 / target too, at
    step 0 and nothing of it after the anneal."""
    cfg = PARLConfig(lambda1=0.3, lambda2=0.3, anneal_steps=10, parallel="parallel", parallel_target=16,
                     step_cost=0.005, critical_cost=0.004)
    res = type("R", (), {})()
    res.rewards = {"r_perf": np.array([1.0, 1.0], np.float32), "novel": np.array([0.0, 2.0], np.float32),
                   "returned": np.array([0.0, 4.0], np.float32), "parallel": np.array([0.0, 2.0], np.float32)}
    res.spawned, res.finished = np.array([0, 2]), np.array([0, 2])
    res.total_steps, res.critical_steps = np.array([5, 9]), np.array([5, 5])
    res.length, res.orch_steps = np.array([40, 50]), np.array([3, 2])
    pcfg = TextRLConfig(parl=cfg)
    reward, ch = episode_rewards(res, pcfg, 0)
    np.testing.assert_allclose(reward, [1 + 0.3 - 0.025 - 0.02, 1 + 0.3 * 2 / 16 + 0.3 - 0.045 - 0.02], rtol=1e-6)
    reward, _ = episode_rewards(res, pcfg, 10)
    np.testing.assert_allclose(reward, [1 - 0.045, 1 - 0.065], rtol=1e-6)
    assert ch["r_parallel"].tolist() == [0.0, 0.125]


def test_the_recipes_streams():
    """Training tasks: half focused on n >= 12, replayed exactly from their count; held-out
    tasks: the sizes in turn, each split its own, the same for any count asked."""
    task = load_config(CONFIG).task
    eps = task.stream("train", 0).take(400)
    big = np.mean([len(e.task) >= 12 for e in eps])
    assert 0.55 < big < 0.75          # half focused, plus the 5/16 of the rest that are >= 12 anyway
    again = task.stream("train", 0)
    again.restore(json.loads(json.dumps({"drawn": 100})))
    assert again.take(3) == eps[100:103] and task.stream("train", 1).take(3) != eps[:3]
    test = task.stream("test", 0).take(8)
    assert [len(e.task) for e in test] == [1, 4, 8, 16] * 2 and task.stream("test", 0).take(4) == test[:4]
    assert task.stream("validation", 0).take(8) != test
    with pytest.raises(ValueError, match="unknown split"):
        task.stream("dev", 0)


@pytest.fixture
def gcs(monkeypatch):
    """A fake GCS (tests/fake_gcs.py) holding the bucket ``test-bucket``, for one test."""
    import fake_gcs

    server, env = fake_gcs.start()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    yield "gs://test-bucket"
    server.stop()


@pytest.mark.slow
def test_preempted_text_parl_job_resumes_exactly(tiny_run, gcs, capsys):
    """The RL stage over the tiny run's warm start (``warm_start_from``) in a ``gs://``
    workdir, stopped by SIGTERM in its first step (exit 143, a checkpoint at step 1) and
    continued with ``--resume auto``, writes what the tiny run wrote locally: the same RL
    and evaluation lines, summary and final parameters, bit for bit (a reused warm start is
    the run's own). The frozen sub-agents keep their weights while an update moves the
    policy; the final test episodes' traces are valid; resumed once more, it recomputes
    nothing."""
    config, full, _ = tiny_run
    args = lambda run: ["train", "--config", str(config), "--workdir", str(run), "--no-progress",   # noqa: E731
                        "--set", f"warm_start_from={full}"]
    cut = epath.Path(gcs) / "cut"
    with sigterm_in_rl_step(0):                  # the notice arrives during RL step 0
        assert main(args(cut)) == PREEMPTED_EXIT_CODE
    assert "checkpoint at RL step 1 saved" in capsys.readouterr().err
    assert main(args(cut)) == 2                  # --resume never: a workdir with checkpoints is refused
    assert "pass --resume auto" in capsys.readouterr().err
    assert main(args(cut) + ["--resume", "auto"]) == 0
    assert lines(cut, "metrics.jsonl", stage="rl") == lines(full, "metrics.jsonl", stage="rl")
    assert lines(cut, "eval.jsonl") == lines(full, "eval.jsonl")
    drop = lambda s: {k: v for k, v in s.items() if k not in TIMING}          # noqa: E731
    assert drop(json.loads((cut / "summary.json").read_text())) == \
        drop(json.load(open(os.path.join(full, "summary.json"))))
    equal = lambda a, b: all(jax.tree.leaves(jax.tree.map(np.array_equal, a, b)))     # noqa: E731
    a, b = restored_states((full, str(cut)), lambda ckpt, s: ckpt.read(s), 2)
    assert equal(a, b)
    # the sub-agents keep their weights, bit for bit, while an update moves the policy
    (before,), (after,) = (restored_states((str(cut),), lambda ckpt, s: ckpt.read(s), step) for step in (1, 2))
    assert equal(before["frozen"]["subagents"], after["frozen"]["subagents"])
    assert not equal(before["params"], after["params"]) and not equal(after["params"], after["frozen"]["subagents"])
    from test_traces import check
    traces = lines(cut, "traces.jsonl", drop=())
    assert len(traces) == 4
    for t in traces:
        check(t)
    # a finished run resumed again: nothing recomputed, its lines stay as they are
    logs = {name: (cut / name).read_text() for name in ("metrics.jsonl", "eval.jsonl")}
    assert main(args(cut) + ["--resume", "auto"]) == 0
    assert {name: (cut / name).read_text() for name in logs} == logs


@pytest.mark.slow
def test_text_parl_job_over_two_processes_writes_the_one_device_figures(tiny_run, tmp_path, capsys):
    """The tiny job over two processes of 2 devices each, warm start included
    (jax.distributed on 127.0.0.1, a 2x1x2 (data, fsdp, tensor) mesh: the two-role warm
    start's and the learner's rows and params over it, each process decoding its share of a
    step's episodes, process 0 writing), and its RL stage on 8 devices (a data = 8 mesh:
    the learner's and the swarm's rows over it, more devices than episodes): the one-device
    run's lines (to float32 rounding)."""
    from small_job import two_processes

    config, full, _ = tiny_run
    eight, two = str(tmp_path / "eight"), str(tmp_path / "two")
    argv = lambda run: ["train", "--config", str(config), "--workdir", run, "--no-progress"]   # noqa: E731
    assert main(argv(eight) + ["--set", "mesh.data=8", "--set", f"warm_start_from={full}"]) == 0
    outs = two_processes(argv(two) + ["--set", "mesh.data=2", "--set", "mesh.tensor=2"])
    assert "| final |" in outs[0] and f"written to {two}" in outs[0] and f"written to {two}" not in outs[1]
    for run, stage in ((two, None), (eight, "rl")):
        for name in ("metrics.jsonl", "eval.jsonl"):
            rows = [lines(d, name, stage=stage if name == "metrics.jsonl" else None) for d in (full, run)]
            assert len(rows[0]) == len(rows[1]) > 0
            close_lines(*rows, f"{run} {name}")


@pytest.mark.slow
def test_async_text_parl_stage(tiny_run, tmp_path):
    """The RL stage over the tiny run's warm start with one batch in flight on the device
    engine: batch 1 decodes with the policy before update 0, each batch's task ids are the
    stream's next."""
    config, full, _ = tiny_run
    run = tmp_path / "async"
    assert main(["train", "--config", str(config), "--workdir", str(run), "--no-progress", "--set",
                 f"warm_start_from={full}", "--set", "rl.async_rollout.depth=1", "--set", "eval_every=0"]) == 0
    rl = lines(run, "metrics.jsonl", stage="rl")
    assert [(r["async/version"], r["async/staleness"], r["async/trained"]) for r in rl] == [(0, 0, 1), (1, 1, 1)]
    assert [r["tasks"] for r in rl] == [["train/0", "train/1"], ["train/2", "train/3"]]
    assert all(r["learner/mismatch_kl"] >= 0 for r in rl)


def test_summary_says_worse_when_a_run_got_worse():
    """The summary's words follow the figures, per task size too: more critical steps and
    a lower accuracy are 'worse'."""
    from swarmjax.train.agent_eval import agent_summary_table

    row = lambda f, c: {"accuracy": f, "critical_steps": c, "total_steps": c, "subagents": 0.0,  # noqa: E731
                        "answered": 1.0, "no_spawn": 1.0}
    summary = {"initial": row(0.6, 9.5), "final": row(0.55, 16.0),
               "initial_sizes": {"1": row(1.0, 2.0), "16": row(0.2, 17.0)},
               "final_sizes": {"1": row(1.0, 2.0), "16": row(0.1, 30.0)},
               "held_out": {"test": 8}, "rl_steps": 3, "wall_clock_s": 1.0, "backend": "cpu"}
    text = agent_summary_table(summary)
    assert "accuracy 0.600 -> 0.550 (worse)" in text
    assert "n = 16: accuracy 0.200 -> 0.100 (worse); critical steps 17.00 -> 30.00 (worse)" in text
    assert "n = 1: accuracy 1.000 -> 1.000 (same)" in text
    summary["final_sizes"]["16"] = row(0.9, 5.0)
    assert "(better); critical steps 17.00 -> 5.00 (better)" in agent_summary_table(summary)
