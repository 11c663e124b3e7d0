"""`swarmjax train --config configs/parl_widesearch_text_cpu.py`, shrunk: the text PARL job
end to end (tokenizer, played demonstrations, warm start, PARL on the jitted text swarm,
evaluations, summary), over two processes, its preemption and exact resume, its reward, and its
bad-input errors."""

import contextlib
import dataclasses
import io
import json
import os
import random

import jax
import numpy as np
import pytest

from small_job import close_lines, restored_states, sigterm_in_rl_step
from swarmjax.cli import main
from swarmjax.config_file import load_config
from swarmjax.envs.widesearch import WideSearchConfig
from swarmjax.models.transformer import init_params
from swarmjax.rl.parl import PARLConfig
from swarmjax.train.checkpoint import Checkpointer
from swarmjax.train.preemption import PREEMPTED_EXIT_CODE
from swarmjax.train.agent_rl import episode_rewards
from swarmjax.train.jobs import evaluate_checkpoint
from swarmjax.train.text_parl import RelayWarmStartConfig, TextPARLConfig, TextPARLJob, sample_episodes
from swarmjax.train.warm_start import load_warm_start

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "parl_widesearch_text_cpu.py")

TINY = '''
import dataclasses
from swarmjax.config_file import load_config
from swarmjax.envs.widesearch import WideSearchConfig
from swarmjax.optim import OptimConfig
from swarmjax.rl.update import UpdateConfig
from swarmjax.swarm.text_types import SwarmConfig

def get_config():
    job = load_config({config!r})
    env = WideSearchConfig(num_entities=12, num_values=12, min_task_size=1, max_task_size=4, max_subagents=2,
                           subagent_steps=3, budget=None)
    p = job.parl
    return dataclasses.replace(
        job, env=env, tokenizer_vocab=600, max_calls=6, max_mentions=4, max_pairs=4,
        model=job.model.replace(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                                intermediate_size=64),
        sft=dataclasses.replace(job.sft, steps=3, batch=4, demos=24, bucket=1280,
                                optim=OptimConfig(learning_rate=3e-3, warmup_steps=1, decay_steps=3)),
        parl=dataclasses.replace(p, steps=2, tasks_per_step=2, group_size=2, focus_min_n=3,
                                 swarm=SwarmConfig(buckets=1, episode_keys=True),
                                 update=dataclasses.replace(p.update, num_minibatches=2),
                                 rollout=dataclasses.replace(p.rollout, orch_context=1280, worker_context=512,
                                                             max_turn_tokens=96, subagent_turns=3, budget=6)),
        eval_sizes=(1, 4), eval_episodes=2, eval_every=1)
'''


def test_shipped_config_is_valid():
    job = load_config(CONFIG)
    assert isinstance(job, TextPARLJob)
    job.validate()
    assert job.chat == "qwen3" and max(job.eval_sizes) == job.env.max_task_size == 16


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The shrunk job, run once for the module: (config path, workdir, its stdout)."""
    base = tmp_path_factory.mktemp("text_parl")
    config = base / "tiny.py"
    config.write_text(TINY.format(config=CONFIG))
    workdir = str(base / "run")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["train", "--config", str(config), "--workdir", workdir, "--no-progress"]) == 0
    return config, workdir, buf.getvalue()


@pytest.mark.slow
def test_text_parl_job_runs_and_writes_its_summary(tiny_run, tmp_path, capsys):
    config, workdir, out = tiny_run
    assert "| 4 | warm start |" in out and "| 4 | final |" in out and "critical steps" in out
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert set(summary["headline"]) == {"n", "critical_reduction", "item_f1", "n1_no_spawn"}
    for policy in ("warm_start", "final"):
        assert sorted(summary[policy]) == ["1", "4"]
        assert 0.0 <= summary[policy]["4"]["item_f1"] <= 1.0 and summary[policy]["1"]["critical_steps"] >= 1
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [r["step"] for r in rows if r["stage"] == "sft"] == [0, 1, 2]
    # QK-Clip follows each warm-start step (the optimiser's tau, 100 by default), as in RL
    assert all(r["max_attn_logit"] > 0 and r["qk_clip_heads"] >= 0 for r in rows if r["stage"] == "sft")
    parl = [r for r in rows if r["stage"] == "parl"]
    assert [r["step"] for r in parl] == [0, 1]
    for r in parl:
        assert np.isfinite(r["learner/loss"]) and r["cut_by_max_ticks"] == 0 and r["orch_sampled_tokens"] > 0
        assert {"accuracy", "reward/r_parallel", "reward/r_finish", "reward/cost", "reward/lambda1"} <= set(r)
    evals = [json.loads(line) for line in open(os.path.join(workdir, "eval.jsonl"))]
    # the warm start and the final policy on the test split; every evaluation on validation
    assert [(e["policy"], e["split"], e["n"]) for e in evals] == [
        ("warm_start", "test", 1), ("warm_start", "test", 4), ("parl", "validation", 1), ("parl", "validation", 4),
        ("parl", "validation", 1), ("parl", "validation", 4), ("final", "test", 1), ("final", "test", 4)]
    assert os.path.isfile(os.path.join(workdir, "tokenizer", "tokenizer.json"))
    assert summary["seed"] == summary["parl_seed"] == 0
    # the PARL state at each evaluation and at the end, scored by the validation F1 at the largest n;
    # evaluating the last one (`swarmjax eval`) gives the run's own final table (same tasks, greedy)
    with Checkpointer(os.path.join(workdir, "checkpoints"), save_every=1, read_only=True) as ckpt:
        assert ckpt.all_steps() == [1, 2] and ckpt.best_step() in (1, 2)
    out = evaluate_checkpoint(load_config(str(config)), workdir, which="latest")
    assert out["step"] == 2
    for policy in ("warm_start", "final"):
        for n in (1, 4):
            for k, v in summary[policy][str(n)].items():
                if k != "seconds":
                    assert out[policy][n][k] == pytest.approx(v, abs=1e-6), (policy, n, k)
    capsys.readouterr()
    assert main(["eval", "--config", str(config), "--workdir", workdir, "--set", "seed=3"]) == 2
    assert "made by a job with another seed" in capsys.readouterr().err
    # PARL ablations reuse the warm start: it restores for the same job, not for another seed
    job = load_config(str(config))
    cfg = job.model.replace(vocab_size=summary["vocab_size"])
    params, meta = load_warm_start(job, workdir, jax.eval_shape(lambda: init_params(cfg, jax.random.key(0))))
    assert meta["identity"] == job.warm_identity()
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(params))
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--workdir", str(tmp_path / "c"), "--no-progress",
                 "--set", f"warm_start_from={workdir}", "--set", "seed=1"]) == 2
    assert "made with another seed" in capsys.readouterr().err
    # a finished workdir is refused; so is --resume latest (no checkpoints)
    assert main(["train", "--config", str(config), "--workdir", workdir, "--no-progress"]) == 2
    assert "already holds a finished run" in capsys.readouterr().err
    assert main(["train", "--config", str(config), "--workdir", str(tmp_path / "b"), "--resume", "latest"]) == 2


def test_bad_configs_are_refused():
    job = load_config(CONFIG)
    with pytest.raises(ValueError, match="eval_sizes"):
        dataclasses.replace(job, eval_sizes=(1, 17)).validate()
    with pytest.raises(ValueError, match="max_pairs"):
        dataclasses.replace(job, max_pairs=8).validate()
    with pytest.raises(ValueError, match="focus_min_n"):
        dataclasses.replace(job, parl=dataclasses.replace(job.parl, focus_min_n=20)).validate()
    with pytest.raises(ValueError, match="divisible"):
        TextPARLConfig(tasks_per_step=3, group_size=1)
    with pytest.raises(ValueError, match="spawn_fraction"):
        RelayWarmStartConfig(spawn_fraction=1.5)


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
    pcfg = TextPARLConfig(parl=cfg)
    reward, ch = episode_rewards(res, pcfg, 0)
    np.testing.assert_allclose(reward, [1 + 0.3 - 0.025 - 0.02, 1 + 0.3 * 2 / 16 + 0.3 - 0.045 - 0.02], rtol=1e-6)
    reward, _ = episode_rewards(res, pcfg, 10)
    np.testing.assert_allclose(reward, [1 - 0.045, 1 - 0.065], rtol=1e-6)
    assert ch["r_parallel"].tolist() == [0.0, 0.125]


def test_focus_tasks():
    env = WideSearchConfig(num_entities=32, num_values=32, min_task_size=1, max_task_size=16, max_subagents=8)
    eps = sample_episodes(env, random.Random(0), 400, focus_fraction=0.5, focus_min_n=12)
    big = np.mean([len(e.task) >= 12 for e in eps])
    assert 0.55 < big < 0.75          # half focused, plus the 5/16 of the rest that are >= 12 anyway


@pytest.mark.slow
def test_preempted_text_parl_job_resumes_exactly(tiny_run, tmp_path, capsys):
    """A PARL stage over the tiny run's warm start, stopped by SIGTERM after its first
    step (exit 143, a checkpoint at step 1) and continued with ``--resume auto``, writes
    what the uninterrupted run wrote: the same PARL and evaluation lines, the same
    summary and the same final parameters."""
    import swarmjax.train.text_parl_job as text_parl_job

    config, full, _ = tiny_run
    cut = tmp_path / "cut"
    args = ["train", "--config", str(config), "--workdir", str(cut), "--no-progress", "--set",
            f"warm_start_from={full}"]
    with sigterm_in_rl_step(0):                  # the notice arrives during PARL step 0
        assert main(args) == PREEMPTED_EXIT_CODE
    assert "checkpoint at PARL step 1 saved" in capsys.readouterr().err
    assert main(args) == 2                       # --resume never: a workdir with checkpoints is refused
    assert "pass --resume auto" in capsys.readouterr().err
    assert main(args + ["--resume", "auto"]) == 0

    def lines(run, name, drop):
        rows = [json.loads(x) for x in open(os.path.join(run, name))]
        return [{k: v for k, v in r.items() if k not in drop} for r in rows if r.get("stage") != "sft"]
    timing = {"seconds", "rollout_s", "update_s", "wall_clock_s", "warm_start_s"}
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert lines(cut, name, timing) == lines(full, name, timing), name

    def summary(run):
        s = json.load(open(os.path.join(run, "summary.json")))
        return {k: {n: {m: x for m, x in r.items() if m not in timing} for n, r in v.items()}
                if k in ("warm_start", "final") else v for k, v in s.items() if k not in timing}
    assert summary(cut) == summary(full)
    job = load_config(str(config))
    cfg = job.model.replace(vocab_size=summary(full)["vocab_size"])
    learner = text_parl_job.Learner(cfg, job.parl.update)
    shapes = text_parl_job._state_shapes(cfg, learner)
    from swarmjax.train import loop
    states = restored_states((full, cut), lambda ckpt, step: loop.restore(ckpt, step, shapes, learner), 2)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, *states)))
    # a finished run resumed again: nothing recomputed, its lines stay as they are
    logs = {name: (cut / name).read_text() for name in ("metrics.jsonl", "eval.jsonl")}
    assert main(args + ["--resume", "auto"]) == 0
    assert {name: (cut / name).read_text() for name in logs} == logs


@pytest.mark.slow
def test_text_parl_job_over_two_processes_writes_the_one_device_figures(tiny_run, tmp_path, capsys):
    """The tiny job, warm start included, over two processes of 2 devices each
    (jax.distributed on 127.0.0.1, a 2x1x2 (data, fsdp, tensor) mesh: the warm start's and
    the learner's rows and params over it, each process decoding its share of a step's
    episodes, process 0 writing): the one-device run's lines (to float32 rounding). A mesh
    the batch does not split over is one line."""
    from small_job import two_processes

    config, full, _ = tiny_run
    two = str(tmp_path / "two")
    argv = ["train", "--config", str(config), "--workdir", two, "--no-progress"]
    assert main(argv + ["--set", "mesh.data=8"]) == 2
    assert "not divisible by the mesh's data x fsdp = 8" in capsys.readouterr().err and not os.path.exists(two)
    outs = two_processes(argv + ["--set", "mesh.data=2", "--set", "mesh.tensor=2"])
    assert "| 4 | final |" in outs[0] and f"written to {two}" in outs[0] and f"written to {two}" not in outs[1]
    drop = {"seconds", "rollout_s", "update_s", "wall_clock_s", "warm_start_s"}
    for name in ("metrics.jsonl", "eval.jsonl"):
        rows = [[{k: v for k, v in json.loads(x).items() if k not in drop} for x in open(os.path.join(d, name))]
                for d in (full, two)]
        assert len(rows[0]) == len(rows[1]) > 0
        close_lines(*rows, f"{two} {name}")


@pytest.mark.slow
def test_async_text_parl_stage(tiny_run, tmp_path):
    """The PARL stage over the tiny run's warm start with one batch in flight: batch 1
    decodes with the policy before update 0, each batch's task ids are the stream's next."""
    config, full, _ = tiny_run
    run = tmp_path / "async"
    assert main(["train", "--config", str(config), "--workdir", str(run), "--no-progress", "--set",
                 f"warm_start_from={full}", "--set", "parl.async_rollout.depth=1", "--set", "eval_every=0"]) == 0
    rl = [json.loads(x) for x in open(run / "metrics.jsonl")]
    rl = [r for r in rl if r["stage"] == "parl"]
    assert [(r["async/version"], r["async/staleness"], r["async/trained"]) for r in rl] == [(0, 0, 1), (1, 1, 1)]
    assert [r["tasks"] for r in rl] == [["train/0", "train/1"], ["train/2", "train/3"]]
    assert all(r["learner/mismatch_kl"] >= 0 for r in rl)


def test_summary_says_worse_when_a_run_got_worse():
    """The summary's words follow the figures: more critical steps and a lower item-F1 are
    'worse', the headline says 'more than' (never 'below' for a rise)."""
    from swarmjax.train.logs import summary_table

    row = lambda f, c: {"item_f1": f, "critical_steps": c, "total_steps": c, "subagents": 0.0,  # noqa: E731
                        "no_spawn_fraction": 1.0}
    summary = {"warm_start": {"1": row(1.0, 2.0), "16": row(0.2, 17.0)},
               "final": {"1": row(1.0, 2.0), "16": row(0.1, 30.0)},
               "headline": {"n": 16, "critical_reduction": 17 / 30, "item_f1": 0.1}}
    text = summary_table(summary)
    assert "n = 16: item-F1 0.200 -> 0.100 (worse); critical steps 17.00 -> 30.00 (worse)" in text
    assert "n = 1: item-F1 1.000 -> 1.000 (same)" in text
    assert "critical steps 1.76x more than the warm start's" in text
    summary["final"]["16"] = row(0.9, 5.0)
    summary["headline"]["critical_reduction"] = 17 / 5
    text = summary_table(summary)
    assert "(better); critical steps 17.00 -> 5.00 (better)" in text and "3.40x fewer than" in text
