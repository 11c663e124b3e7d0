"""What a job says while it runs: the no-learning-signal warning (unit, and an agent job
whose random policy never earns a reward)."""

import contextlib
import io
import json
import os

import pytest

from swarmjax.cli import main
from swarmjax.train.logs import SignalWatch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_signal_watch_warns_once_per_flat_stretch():
    watch = SignalWatch(patience=3)
    flat, alive = {"signal_groups": 0.0, "reward": 0.0}, {"signal_groups": 0.25, "reward": 0.4}
    said = [watch(i, m) for i, m in enumerate([flat, flat, alive, flat, flat, flat, flat, alive, flat])]
    assert [i for i, s in enumerate(said) if s] == [5]            # three flat steps in a row, once
    assert "RL steps 4-6 had no learning signal" in said[5] and "mean reward 0.000" in said[5]
    assert "warm start" in said[5] and "group_size" in said[5]
    assert SignalWatch()(0, {"reward": 1.0}) is None               # a metric it does not know: nothing


@pytest.mark.slow
def test_a_job_without_learning_signal_says_so(tmp_path):
    """A random policy with no warm start never answers right: every group's rewards are
    0, the updates are zero, and the job says so by its third RL step."""
    sets = ["sft=None", "rl.steps=3", "rl.tasks_per_step=1", "rl.group_size=2", "rl.update.num_minibatches=1",
            "eval_episodes=1", "eval_every=0", "model.num_layers=1", "model.hidden_size=32", "model.head_dim=8",
            "model.intermediate_size=64", "rl.rollout.contexts.orchestrator=320", "rl.rollout.max_turn_tokens=16"]
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        assert main(["train", "--config", os.path.join(ROOT, "configs", "arith_tools_cpu.py"), "--workdir",
                     str(tmp_path / "run"), "--no-progress"] + [a for s in sets for a in ("--set", s)]) == 0
    rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert [r["signal_groups"] for r in rows] == [0.0, 0.0, 0.0]
    assert "RL steps 1-3 had no learning signal" in err.getvalue()
