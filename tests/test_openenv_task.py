"""An OpenEnv environment as a task (examples/openenv/guess_env.py served by uvicorn in a
child process, played through openenv-core's own client): token-in-token-out over a
multi-turn episode, the environment's rewards summed, errors as ``env_error``, bad
configs refused; and (slow tier) the example job trained, stopped by SIGTERM in its
first RL step and resumed bit for bit."""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("openenv.core")

from swarmjax.envs.openenv import OpenEnvEnv, OpenEnvTask  # noqa: E402
from swarmjax.envs.task import EnvContext, TaskError  # noqa: E402
from swarmjax.text.bpe import train_bpe_tokenizer  # noqa: E402
from swarmjax.text.chat import chat_format  # noqa: E402
from swarmjax.text.runner import ToolRunner  # noqa: E402
from swarmjax.text.tokenizer import TextTokenizer  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "openenv")
sys.path.insert(0, EXAMPLE)
import guess_env  # noqa: E402  (the example's environment module: its secrets, to script right guesses)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    task = OpenEnvTask(app="guess_env:app", pythonpath=(EXAMPLE,), problems="guess_env:problems",
                       system="Guess the number.", server_log=str(tmp_path_factory.mktemp("log") / "server.log"))
    corpus = task.corpus() + [f"{n} is too low. {n} is too high. {n} is correct!" for n in range(1, 9)]
    chat = chat_format("qwen3", TextTokenizer.from_dir(train_bpe_tokenizer(
        corpus * 10, tmp_path_factory.mktemp("tok"), vocab_size=320)))
    runner = ToolRunner([], max_workers=2, timeout_s=5.0)
    yield task, chat, EnvContext(chat, runner)
    runner.close()


def _secret(problem):
    env = guess_env.GuessEnvironment()
    env.reset(**problem)
    return env.state.secret


def test_a_multi_turn_episode_keeps_the_sampled_ids_and_sums_the_rewards(world):
    task, chat, ctx = world
    problem = task.records("train")[3]
    secret = _secret(problem)
    wrong = 1 if secret != 1 else 2
    env = task.env(problem, ctx)
    prompt = env.reset(problem)
    want = chat.prompt_ids([{"role": "system", "content": "Guess the number."},
                            {"role": "user", "content": "I picked a number from 1 to 8. Guess it in 4 tries."}])
    np.testing.assert_array_equal(prompt, want)

    turn = chat.assistant_ids(f"  {wrong} ")      # the action is the visible text, stripped
    step = env.step(turn)
    feedback = f"{wrong} is too {'low' if wrong < secret else 'high'}."
    np.testing.assert_array_equal(step.reply, np.concatenate(
        [chat.after_turn_ids(turn), chat.continuation_ids([{"role": "user", "content": feedback}])]))
    assert not step.done and step.rewards == {"r_perf": 0.0}

    last = env.step(chat.assistant_ids(f"It is {secret}."))
    assert last.done and last.answer == f"It is {secret}." and last.reply.size == 0
    assert last.rewards == {"r_perf": 1.0, "env_error": 0.0, "truncated": 0.0}
    assert env.client is None                                   # the session is closed at the end


def test_running_out_of_tries_scores_zero_and_a_refused_action_is_an_env_error(world):
    task, chat, ctx = world
    problem = task.records("validation")[0]
    secret = _secret(problem)
    env = task.env(problem, ctx)
    env.reset(problem)
    wrong = 1 if secret != 1 else 2
    steps = [env.step(chat.assistant_ids(str(wrong))) for _ in range(4)]
    assert [s.done for s in steps] == [False, False, False, True]
    assert sum(s.rewards["r_perf"] for s in steps) == 0.0 and steps[-1].rewards["env_error"] == 0.0

    bad = OpenEnvEnv(chat, task.connect, action="guess")      # GuessAction forbids other fields
    bad.reset(problem)
    step = bad.step(chat.assistant_ids("3"))
    assert step.done and step.rewards["env_error"] == 1.0 and step.rewards["r_perf"] == 0.0


def test_a_missing_observation_field_and_bad_configs_are_refused(world):
    task, chat, ctx = world
    env = OpenEnvEnv(chat, task.connect, observation="prompt")
    with pytest.raises(TaskError, match="no field 'prompt'.*'text'"):
        env.reset({"seed": 1})
    env.close()
    with pytest.raises(TaskError, match="one of app= .* or base_url="):
        OpenEnvTask(problems={})
    with pytest.raises(TaskError, match="exited with code"):
        OpenEnvTask(app="no_such_module:app", problems={}).url()
    with pytest.raises(TaskError, match="has no 'test' split"):
        OpenEnvTask(base_url="http://127.0.0.1:1", problems={"train": []}).records("test")


@pytest.mark.slow
def test_the_openenv_example_trains_and_resumes_exactly(tmp_path):
    from small_job import log_lines, trains_and_resumes_exactly

    full = trains_and_resumes_exactly(os.path.join(EXAMPLE, "config.py"), str(tmp_path), [
        "rl.steps=2", "rl.tasks_per_step=2", "rl.group_size=2", "eval_episodes=4", "eval_every=1"])
    rl = [r for r in log_lines(full, "metrics.jsonl") if r.get("stage") == "rl"]
    assert len(rl) == 2 and all(r["env_error"] == 0 and r["turns"] >= 1 for r in rl)
