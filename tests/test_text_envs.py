"""Host environments of text agents: the arithmetic tool task, the orchestration tools,
the generic tool environment, and the README's plug-in-your-own-tool example (run
as written)."""

import os
import re

import numpy as np
import pytest

from swarmjax.envs.api import Step, SubAgentResult
from swarmjax.envs.arith import ArithConfig, ArithTask, calculate, corpus, final_number, play, sample_problem
from swarmjax.envs.task import EnvContext, make_env
from swarmjax.envs.orchestration import Orchestration, result_text
from swarmjax.text.bpe import train_bpe_tokenizer
from swarmjax.text.chat import chat_format
from swarmjax.text.runner import ToolRunner
from swarmjax.text.tokenizer import TextTokenizer
from swarmjax.text.toolcalls import CallError, ToolCall

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    path = train_bpe_tokenizer(corpus(ArithConfig(), count=300), tmp_path_factory.mktemp("tok"), vocab_size=600)
    return chat_format("qwen3", TextTokenizer.from_dir(path))


@pytest.fixture(scope="module")
def runner():
    with ToolRunner([], max_workers=4, timeout_s=5.0) as r:
        yield r


def test_calculator_accepts_integer_arithmetic_only():
    assert calculate("(37 + 18) * 2 - -3") == 113
    for bad in ("2 ** 10", "__import__('os')", "1 / 2", "1.5 + 1", "x + 1", "(1 +", ""):
        with pytest.raises(ValueError):
            calculate(bad)
    assert final_number("so 12 then The answer is -43.") == -43 and final_number("no number") is None


def test_problems_are_consistent():
    rng = np.random.default_rng(0)
    for _ in range(200):
        p = sample_problem(ArithConfig(), rng)
        value = p.start
        for op, x in p.ops:
            value = calculate(f"{value} {op} {x}")
            assert value > 0
        assert value == p.answer and str(p.start) in p.text and 2 <= len(p.ops) <= 3


def test_demonstrations_played_through_the_environment_are_right(chat, runner):
    """Both demonstration kinds reach reward 1; the calculator path calls the tool once
    per operation, and the played ids hold the tool's results."""
    task = ArithTask(ArithConfig(tool_fraction=1.0))
    rng = np.random.default_rng(1)
    p = task.sample(rng, 1)[0]
    turns = task.demonstration(p, chat, rng)
    assert len(turns) == len(p.ops) + 1
    env = make_env(task, p, EnvContext(chat, runner))
    ids, mask = play(env, p, turns)
    assert mask.sum() == sum(len(t) for t in turns)
    text = chat.tokenizer.decode(ids)
    assert f"<tool_response>\n{p.answer}\n</tool_response>" in text or len(p.ops) == 0
    final = env.step(np.asarray(turns[-1]))
    assert final.done and final.rewards["r_perf"] == 1.0 and final.rewards["tool_calls"] == len(p.ops)
    direct = ArithTask(ArithConfig(tool_fraction=0.0))
    assert len(direct.demonstration(p, chat, rng)) == 1


def test_tool_env_errors_cost_a_step_and_are_replied(chat, runner):
    task = ArithTask(ArithConfig())
    p = task.sample(np.random.default_rng(2), 1)[0]
    env = make_env(task, p, EnvContext(chat, runner))
    env.reset(p)
    turn = chat.assistant_ids("", [{"name": "calculator", "arguments": {"expression": "2 ** 9"}},
                                   {"name": "calculator", "arguments": {"value": 3}},
                                   {"name": "calculator", "arguments": {"expression": "6 * 7"}}])
    step = env.step(turn)
    assert not step.done and not step.spawn
    reply = chat.tokenizer.decode(step.reply)
    responses = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", reply, re.S)
    assert len(responses) == 3 and responses[0].startswith("Error: ValueError")
    assert responses[1].startswith("Error:") and "expression" in responses[1] and responses[2] == "42"
    assert (env.tool_calls, env.errors) == (1, 2)
    # a turn cut by the length limit without a call is read as its answer, and flagged
    cut = chat.tokenizer.encode("The answer is").tolist()
    final = env.step(np.asarray(cut), truncated=True)
    assert final.done and final.rewards["truncated"] == 1.0 and final.rewards["r_perf"] == 0.0


def test_orchestration_stage_order_and_limits():
    made = []
    orch = Orchestration(lambda system: made.append(system) or system, max_subagents=2)
    call = lambda tool, **args: ToolCall(tool, args)
    calls = [call("assign_task", agent="a", prompt="early"), call("create_subagent", name="a", system_prompt="A"),
             call("assign_task", agent="a", prompt="x"), call("assign_task", agent="a", prompt="y"),
             call("assign_task", agent="a", prompt="z"), ToolCall("assign_task", None, CallError.BAD_JSON)]
    stage, replies = orch.handle(calls)
    assert [a.position for a in stage] == [2, 3] and [a.task.task for a in stage] == ["x", "y"]
    assert "no sub-agent named 'a'" in replies[0] and replies[1] == "Created sub-agent 'a'."
    assert "limit of 2" in replies[4] and 5 not in replies and made == ["A", "A"]
    ok = SubAgentResult(agent="a", answer="42", steps=2, ok=True, reason="answer")
    failed = SubAgentResult(agent="b", answer=None, steps=5, ok=False, reason="turns")
    assert result_text(ok) == "Sub-agent 'a' answered:\n42"
    assert "turn limit" in result_text(failed)
    with pytest.raises(ValueError):
        Step(reply=np.ones(2, np.int32), spawn=(stage[0].task,))


def _readme_block(title: str) -> str:
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    section = text[text.index(title):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_user_tool_example_runs(tmp_path, monkeypatch):
    """The README's "Plug in your own tool and task" example, executed as written."""
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_readme_block("### Plug in your own tool and task"), "README.md", "exec"), scope)
    result = scope["result"]
    assert result.orch_steps[0] == 2 and result.rewards["r_perf"][0] == 1.0
    assert result.rewards["tool_calls"][0] == 1
    assert result.loss_mask[0].sum() > 0
