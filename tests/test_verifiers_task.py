"""A verifiers environment as a task (examples/verifiers/vf_calc: a verifiers taskset
with an MCP calculator and a rubric): verifiers' own chat program plays each episode
against the job's server, verifiers runs the tool and scores the trace; the rollout
records the ids it sampled, with no drift. Slow tier: the example job trained, stopped
by SIGTERM in its first RL step and resumed bit for bit."""

import os

import jax
import numpy as np
import pytest

pytest.importorskip("verifiers.v1")
pytest.importorskip("openai")
pytest.importorskip("aiohttp")

from swarmjax.envs.task import EnvContext, TaskError  # noqa: E402
from swarmjax.envs.verifiers import VerifiersTask  # noqa: E402
from swarmjax.models import init_params  # noqa: E402
from swarmjax.models.config import ModelConfig  # noqa: E402
from swarmjax.roles import Roles  # noqa: E402
from swarmjax.swarm.text_rollout import TextRollout, TextRolloutConfig, TextScripts  # noqa: E402
from swarmjax.text.bpe import train_bpe_tokenizer  # noqa: E402
from swarmjax.text.chat import chat_format  # noqa: E402
from swarmjax.text.runner import ToolRunner  # noqa: E402
from swarmjax.text.tokenizer import TextTokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "verifiers")


def test_verifiers_episodes_are_scored_by_the_rubric_on_the_ids_sampled(tmp_path):
    task = VerifiersTask(taskset="vf_calc:CalcConfig", pythonpath=(EXAMPLE,), max_turns=3, timeout_s=120.0,
                         splits={"train": "2:", "validation": "0:2", "test": "0:2"})
    problems = task.records("test")
    chat = chat_format("qwen3", TextTokenizer.from_dir(train_bpe_tokenizer(task.corpus() * 4, tmp_path,
                                                                           vocab_size=320)))
    model = ModelConfig(vocab_size=chat.tokenizer.vocab_size, hidden_size=32, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=16, intermediate_size=64)
    engine = TextRollout(model, TextRolloutConfig(contexts=Roles(1024, 64), max_turn_tokens=64, subagent_lanes=1,
                                                  subagent_turns=1, prefill_buckets=(16, 64, 256), min_window=256),
                         stop_ids=chat.stop_ids)
    # the right computation and answer for the first task, the right call and a wrong answer for the second
    turns = []
    for i, index in enumerate(problems):
        data = task.tasks()[index].data
        expression = data.prompt.removeprefix("Compute ").rstrip(".")
        answer = data.answer if i == 0 else str(int(data.answer) + 1)
        turns.append([chat.assistant_ids("", [{"name": "calc_evaluate", "arguments": {"expression": expression}}]),
                      chat.assistant_ids(f"ANSWER: {answer}")])
    runner = ToolRunner([], max_workers=2, timeout_s=5.0)
    try:
        got = engine(Roles.both(init_params(model, jax.random.key(0))),
                     [task.env(p, EnvContext(chat, runner, context=1024)) for p in problems], problems,
                     jax.random.key(1), scripts=TextScripts(orch=[list(t) for t in turns]))
    finally:
        engine.close()
        runner.close()
    assert got.rewards["r_perf"].tolist() == [1.0, 0.0]
    assert got.rewards["vf_correct"].tolist() == [1.0, 0.0] and got.rewards["vf_tool_calls"].tolist() == [1.0, 1.0]
    assert (got.rewards["env_error"] == 0).all() and (got.rewards["template_drift"] == 0).all()
    assert (got.rewards["requests"] == 2).all() and got.orch_steps.tolist() == [2, 2]
    for b, index in enumerate(problems):
        ids = got.tokens[b, :got.length[b]]
        sampled = ids[got.loss_mask[b, :got.length[b]] > 0]
        np.testing.assert_array_equal(sampled, np.concatenate(turns[b]))       # the script's ids, as sampled
        text = chat.tokenizer.decode(ids)
        assert task.tasks()[index].data.answer in text.split("<tool_response>")[1]   # verifiers ran the tool
    assert got.answers[0] == f"ANSWER: {task.tasks()[problems[0]].data.answer}"


def test_bad_verifiers_configs_are_refused():
    with pytest.raises(TaskError, match="not a slice"):
        VerifiersTask(taskset="vf_calc:CalcConfig", splits={"train": "a:b"})
    with pytest.raises(TaskError, match="has no 'test'"):
        VerifiersTask(taskset="vf_calc:CalcConfig", pythonpath=(EXAMPLE,), splits={"train": ":"}).records("test")


@pytest.mark.slow
def test_the_verifiers_example_trains_and_resumes_exactly(tmp_path):
    from small_job import log_lines, trains_and_resumes_exactly

    full = trains_and_resumes_exactly(os.path.join(EXAMPLE, "config.py"), str(tmp_path), [
        "rl.steps=2", "rl.tasks_per_step=2", "rl.group_size=2", "eval_episodes=2", "eval_every=1",
        "task.max_turns=2"])
    rl = [r for r in log_lines(full, "metrics.jsonl") if r.get("stage") == "rl"]
    assert len(rl) == 2 and all(r["env_error"] == 0 and r["requests"] >= 1 and r["template_drift"] == 0 for r in rl)
