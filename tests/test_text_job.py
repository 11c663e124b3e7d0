"""`swarmjax train --config configs/arith_tools_cpu.py`, shrunk: the agent job on the built-in
arithmetic task end to end (tokenizer, warm start on played demonstrations, RL on text
rollouts, evaluations on the validation and test splits), and its reward shaping."""

import contextlib
import dataclasses
import io
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from swarmjax.cli import main
from swarmjax.config_file import apply_overrides
from swarmjax.train.agent import OverlongConfig, TextRLConfig
from swarmjax.train.agent_rl import episode_rewards, row_width
from swarmjax.train.agent_job import AgentJob

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "arith_tools_cpu.py")
SMALL = ["sft.steps=4", "sft.demos=64", "sft.batch=8", "rl.steps=2", "rl.tasks_per_step=2", "rl.group_size=4",
         "eval_episodes=4", "eval_every=1", "model.num_layers=1",
         "rl.overlong.max_length=48", "rl.overlong.cache_length=16",
         "judge.mix.verifier=0.5", "judge.mix.judge=0.5",        # half the reward from an LLM judge,
         "judge.reference=True",                                  # which reads the reference answer
         "rl.async_rollout.depth=1", "rl.async_rollout.rollout_devices=1"]  # rollouts a batch ahead, on their device


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """The shrunk job run once: (its workdir, the CLI's arguments, what it printed)."""
    workdir = str(tmp_path_factory.mktemp("text_job") / "run")
    argv = ["train", "--config", CONFIG, "--workdir", workdir, "--no-progress"]
    args = argv + [a for s in SMALL for a in ("--set", s)]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(args) == 0
    return workdir, args, out.getvalue()


@pytest.mark.slow
def test_text_job_runs_and_writes_its_summary(small_run, capsys):
    workdir, args, out = small_run
    assert "| initial |" in out and "| final |" in out and "accuracy " in out
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    assert summary["held_out"] == {"validation": 4, "test": 4}
    for policy in ("initial", "final"):
        assert set(summary[policy]) >= {"accuracy", "tool_calls", "turns", "answered"}
        assert 0.0 <= summary[policy]["accuracy"] <= 1.0
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [r["step"] for r in rows if r["stage"] == "sft"] == [0, 1, 2, 3]
    rl = [r for r in rows if r["stage"] == "rl"]
    assert len(rl) == 2 and all(r["segments"] >= 1 and "learner/loss" in r for r in rl)
    assert all(r["orch_sampled_tokens"] > 0 for r in rl)
    # asynchronous: batch 1 decoded with the policy before update 0, every problem of the stream trained once
    assert [(r["async/version"], r["async/staleness"], r["async/trained"]) for r in rl] == [(0, 0, 1), (1, 1, 1)]
    ids = [int(i.split("/")[1]) for r in rl for i in r["tasks"]]
    assert ids == list(range(ids[0], ids[0] + 4)) and all("learner/mismatch_kl" in r for r in rl)
    for r in rl:                # the judge (a frozen copy of the warm-started policy) scored every episode
        assert 0 <= r["reward/judge"] <= 1 and r["judge_unparseable"] == 0 and r["accuracy"] == r["reward/r_verifier"]
        assert r["reward/r_perf"] == pytest.approx(0.5 * r["reward/r_verifier"] + 0.5 * r["reward/judge"], abs=1e-6)
    evals = [json.loads(line) for line in open(os.path.join(workdir, "eval.jsonl"))]
    assert [(r["policy"], r["step"], r["split"]) for r in evals] == [
        ("initial", 0, "validation"), ("initial", 0, "test"), ("rl", 1, "validation"),
        ("rl", 2, "validation"), ("final", 2, "test")]
    assert evals[-1]["accuracy"] == summary["final"]["accuracy"]
    assert all(r["judge_gap"] == pytest.approx(r["judge"] - r["accuracy"], abs=1e-6) for r in evals)  # truth kept
    from test_traces import check                       # the final test episodes as orchestration traces
    traces = [json.loads(line) for line in open(os.path.join(workdir, "traces.jsonl"))]
    assert [t["trace_id"] for t in traces] == [f"final-s2-n1-{b}" for b in range(4)]
    for t in traces:
        check(t)
        assert {e["agent"] for e in t["events"]} == {"environment", "agent"}     # a single agent, by its role
    assert np.mean([t["rewards"]["r_perf"] for t in traces]) == pytest.approx(summary["final"]["accuracy"])
    assert os.path.isfile(os.path.join(workdir, "tokenizer", "tokenizer.json"))
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) >= ["1", "2"]
    # a finished workdir is refused; resumed, it recomputes nothing
    assert main(args) == 2
    assert "already holds a finished run" in capsys.readouterr().err
    logs = {name: open(os.path.join(workdir, name)).read() for name in ("metrics.jsonl", "eval.jsonl", "traces.jsonl")}
    assert main(args + ["--resume", "auto"]) == 0
    assert {name: open(os.path.join(workdir, name)).read() for name in logs} == logs
    # `swarmjax eval` of the last checkpoint: the run's final row again (the same problems, greedy)
    assert main(["eval", "--config", CONFIG, "--workdir", workdir] + [a for s in SMALL for a in ("--set", s)]) == 0
    out = capsys.readouterr().out
    assert "checkpoint at RL step 2" in out
    final = next(line for line in out.splitlines() if line.startswith("| final |"))
    assert final == next(line for line in open(os.path.join(workdir, "summary.md")) if line.startswith("| final |")
                         ).rstrip("\n")
    assert main(["eval", "--config", CONFIG, "--workdir", workdir, "--sizes", "4"]) == 2
    assert "no sizes" in capsys.readouterr().err


def _result(r_perf, orch_steps, sampled):
    """The fields of a TextRolloutResult the reward reads; episode b's policy sampled
    ``sampled[b]`` ids, each followed by an observation id (so the conversation is longer)."""
    C = 2 * max(sampled) + 2
    loss_mask = np.zeros((len(sampled), C), bool)
    for b, n in enumerate(sampled):
        loss_mask[b, 1:2 * n + 1:2] = True
    return SimpleNamespace(rewards={"r_perf": np.asarray(r_perf, np.float32)}, length=np.asarray(sampled),
                           orch_steps=np.asarray(orch_steps, np.int32), loss_mask=loss_mask)


def test_overlong_penalty_shapes_the_rewards():
    """DAPO's soft overlong punishment on the sampled-token count L, L_max = 20, L_cache = 4:
    0 for L <= 16, (16 - L) / 4 for 16 < L <= 20, -1 beyond; off (None) by default."""
    res = _result([1.0, 1.0, 1.0, 0.0, 1.0], [1, 2, 3, 1, 2], sampled=[10, 16, 18, 20, 25])
    plain = np.asarray([1.0, 1.0, 1.0, 0.0, 1.0]) - 0.1 * np.asarray([1, 2, 3, 1, 2])
    rcfg = TextRLConfig(turn_cost=0.1)
    assert rcfg.overlong is None
    np.testing.assert_array_equal(episode_rewards(res, rcfg)[0], res.rewards["r_perf"] - 0.1 * res.orch_steps)
    np.testing.assert_allclose(episode_rewards(res, rcfg)[0], plain, atol=1e-6)
    shaped = episode_rewards(res, dataclasses.replace(rcfg, overlong=OverlongConfig(max_length=20, cache_length=4)))[0]
    np.testing.assert_allclose(shaped, plain + [0.0, 0.0, -0.5, -1.0, -1.0], atol=1e-6)


def test_learner_widths_double_so_a_job_compiles_few_updates():
    widths = {row_width(w, 64, 1000) for w in range(1, 1001)}
    assert widths == {64, 128, 256, 512, 1000}               # log2(cap / bucket) + 1 programs, not cap / bucket
    assert row_width(300, 64, 1000) == 512 and row_width(513, 64, 1000) == 1000
    assert row_width(1200, 64, 1000) == 1200                 # rows past the rollout's width (segments) are kept whole


def test_overlong_config_from_overrides():
    job = apply_overrides(AgentJob(), ["rl.overlong.max_length=128"])
    assert job.rl.overlong == OverlongConfig(max_length=128, cache_length=64)
    assert apply_overrides(job, ["rl.overlong=None"]).rl.overlong is None
    with pytest.raises(ValueError, match=r"cache_length \(0\) <= max_length"):
        apply_overrides(job, ["rl.overlong.cache_length=0"])


def test_shared_subagent_rows_have_their_own_role_advantages():
    """subagents="shared": every sub-agent conversation becomes a training row (its own
    sampled ids in the loss, none in a dropped group), with the episode's reward
    normalised over the sub-agent rows of its group (GRPO per role), padded with empty
    rows (groups of their own) to a multiple of the learner's splits."""
    from swarmjax.swarm.text_types import AgentTrace
    from swarmjax.train.agent_rl import _subagent_rows

    def trace(n_prompt, n_sampled):
        t = AgentTrace(name="w")
        t.append(np.arange(n_prompt, dtype=np.int32), sampled=False)
        t.append(np.arange(n_sampled, dtype=np.int32) + 100, sampled=True, logprobs=np.full(n_sampled, -0.5),
                 model_logprobs=np.full(n_sampled, -0.5), turn=1)
        return t
    # 4 episodes in 2 groups; episode 1 has no sub-agent, episode 2 two; group 1 is dropped
    res = SimpleNamespace(subagents=[[trace(3, 2)], [], [trace(2, 4), trace(5, 1)], [trace(1, 1)]])
    reward = np.asarray([1.0, 0.0, 0.5, 0.5], np.float32)
    groups, keep = np.asarray([0, 0, 1, 1]), np.asarray([True, True, False, False])
    rows = _subagent_rows(res, reward, groups, keep, TextRLConfig(), multiple=8)
    assert rows["tokens"].shape == (8, 6) and rows["token_mask"].sum(1).tolist() == [5, 6, 6, 2, 0, 0, 0, 0]
    assert rows["loss_mask"].sum(1).tolist() == [2, 0, 0, 0, 0, 0, 0, 0]       # group 1 dropped, prompts never
    assert rows["group"][:4].tolist() == [0, 1, 1, 1] and len(set(rows["group"][4:]) - {0, 1}) == 4
    # GRPO over the sub-agent rows of each group: group 0 has one row (advantage 0), group 1's are equal
    np.testing.assert_allclose(rows["advantages"], 0.0, atol=1e-6)
    rows = _subagent_rows(res, np.asarray([1.0, 0.0, 1.0, 0.0], np.float32), groups, np.ones(4, bool),
                          TextRLConfig(), multiple=4)
    adv = rows["advantages"]
    assert adv.shape == (4,) and adv[1] == adv[2] > 0 > adv[3] and adv[0] == 0.0
    assert rows["loss_mask"].sum(1).tolist() == [2, 4, 1, 1]


@pytest.mark.slow
def test_a_runs_checkpoint_gives_verdicts_to_train_a_judge_on(small_run, tmp_path):
    """The final checkpoint's test episodes as (task, answer, right) triples: the answered
    ones, right exactly where the verifier scored 1 (the judge's score beside it is not
    the verdict); each episode's agreement is the judge's verdict against the truth.
    Sampled episodes come from a seeded key; another judge (the trained policy exported as
    a Hugging Face checkpoint) scores them as that judge does on the host."""
    from swarmjax.config_file import load_config
    from swarmjax.envs.task import problem_text, resolve_task
    from swarmjax.train.streams import held_out
    from swarmjax.train.agent_job import evaluate_agent_checkpoint
    from swarmjax.models.hf import from_hf
    from swarmjax.rl.judge import Judge
    from swarmjax.text.chat import chat_format
    from swarmjax.train.export import export_run
    from swarmjax.train.judge_sft import episode_triples
    from swarmjax.train.policy import read_tokenizer
    workdir, _, _ = small_run
    job = apply_overrides(load_config(CONFIG, AgentJob), SMALL)
    task, triples = resolve_task(job.task), []
    out = evaluate_agent_checkpoint(job, workdir, on_result=lambda res, problems, first: triples.extend(
        episode_triples(task, problems, res)))
    answered = np.asarray(out["episodes"]["answered"], bool)
    assert triples and len(triples) == answered.sum() and all(isinstance(a, str) for _, a, _ in triples)
    assert sum(right for *_, right in triples) == np.asarray(out["episodes"]["accuracy"])[answered].sum()
    problems = held_out(task, "test", job.seed, job.eval_episodes)              # the episodes' own tasks
    assert [t for t, _, _ in triples] == [problem_text(task, p) for p, a in zip(problems, answered) if a]
    assert all(problem_text(task, p, reference=True).endswith(f"Reference answer:\nThe answer is {p.answer}.")
               for p in problems)
    e = {k: np.asarray(v) for k, v in out["episodes"].items()}
    assert (e["judge_agreement"] == ((e["judge"] > 0.5) == (e["accuracy"] > 0.5))).all()
    export_run(workdir, str(tmp_path / "hf"))                           # the trained policy as another judge
    other, got = dataclasses.replace(job.judge, hf_path=str(tmp_path / "hf")), []
    runs = [evaluate_agent_checkpoint(job, workdir, sampled=True, judge=other, on_result=lambda res, ps, first:
                                      got.extend(zip(ps, res.answers)))["episodes"] for _ in range(2)]
    assert runs[0] == runs[1] and got[:len(problems)] == got[len(problems):]     # one key: the same episodes
    cfg, params = from_hf(str(tmp_path / "hf"))
    ref = Judge(job.judge.judge, cfg, params, chat_format("qwen3", read_tokenizer(str(tmp_path / "hf"))))
    scores = ref([problem_text(task, p, reference=True) for p, _ in got[:len(problems)]],
                 [a for _, a in got[:len(problems)]])
    assert runs[0]["judge"] == pytest.approx(scores.total.tolist(), abs=1e-5)
