"""An existing agent harness trained by `swarmjax train` (examples/harness: a loop over the
openai client with its own tool, not written against swarmjax): the warm start plays the
teacher's demonstrations through the harness, RL samples every turn through the job's
server, and a run stopped by SIGTERM in its first RL step and resumed with --resume auto
writes the uninterrupted run's metrics, evaluations and parameters."""

import json
import os

import jax
import numpy as np
import pytest

pytest.importorskip("openai")
pytest.importorskip("aiohttp")

from small_job import restored_states, sigterm_in_rl_step  # noqa: E402
from swarmjax.cli import main  # noqa: E402
from swarmjax.train.preemption import PREEMPTED_EXIT_CODE  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "harness", "config.py")
SMALL = ["sft.steps=20", "sft.demos=32", "task.corpus_episodes=16", "rl.steps=2", "rl.tasks_per_step=2",
         "rl.group_size=2", "rl.dynamic_sampling=False", "eval_episodes=4", "eval_every=1"]
TIMING = {"rollout_s", "update_s", "tok_s", "wall_clock_s", "warm_start_s"}


def _args(workdir, *more):
    return ["train", "--config", CONFIG, "--workdir", workdir, "--no-progress"] + [
        a for s in SMALL for a in ("--set", s)] + list(more)


def _lines(run, name):
    return [{k: v for k, v in json.loads(x).items() if k not in TIMING} for x in open(os.path.join(run, name))]


def test_the_harness_example_trains_and_resumes_exactly(tmp_path, capsys):
    full, cut = str(tmp_path / "full"), str(tmp_path / "cut")
    assert main(_args(full)) == 0
    rl = [r for r in _lines(full, "metrics.jsonl") if r.get("stage") == "rl"]
    assert len(rl) == 2 and all(r["requests"] >= 1 and r["template_drift"] == 0 for r in rl)
    assert all(r["harness_error"] == 0 and r["timeout"] == 0 for r in rl)
    atif = pytest.importorskip("atif")
    docs = [json.loads(x) for x in open(os.path.join(full, "atif.jsonl"))]
    assert len(docs) == 4 and all(atif.Trajectory.model_validate(d) for d in docs)   # the final test episodes
    summary = json.load(open(os.path.join(full, "summary.json")))
    assert summary["task"].startswith("HarnessTask(run='agent:solve'") and summary["warm_start_steps"] == 20
    with sigterm_in_rl_step(0):
        assert main(_args(cut)) == PREEMPTED_EXIT_CODE
    assert main(_args(cut, "--resume", "auto")) == 0
    for name in ("metrics.jsonl", "eval.jsonl"):
        assert _lines(cut, name) == _lines(full, name), name
    states = restored_states((full, cut), lambda ckpt, s: ckpt.read(s), 2)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, states[0]["params"], states[1]["params"])))
