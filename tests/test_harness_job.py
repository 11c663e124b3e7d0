"""An existing agent harness trained by `swarmjax train` (examples/harness: a loop over the
openai client with its own tool, not written against swarmjax): the warm start plays the
teacher's demonstrations through the harness, RL samples every turn through the job's
server, and a run stopped by SIGTERM in its first RL step and resumed with --resume auto
writes the uninterrupted run's metrics, evaluations and parameters."""

import json
import os

import pytest

pytest.importorskip("openai")
pytest.importorskip("aiohttp")

from small_job import log_lines, trains_and_resumes_exactly  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "examples", "harness", "config.py")
SMALL = ["sft.steps=20", "sft.demos=32", "task.corpus_episodes=16", "rl.steps=2", "rl.tasks_per_step=2",
         "rl.group_size=2", "rl.dynamic_sampling=False", "eval_episodes=4", "eval_every=1"]


def test_the_harness_example_trains_and_resumes_exactly(tmp_path, capsys):
    full = trains_and_resumes_exactly(CONFIG, str(tmp_path), SMALL)
    rl = [r for r in log_lines(full, "metrics.jsonl") if r.get("stage") == "rl"]
    assert len(rl) == 2 and all(r["requests"] >= 1 and r["template_drift"] == 0 for r in rl)
    assert all(r["harness_error"] == 0 and r["timeout"] == 0 for r in rl)
    summary = json.load(open(os.path.join(full, "summary.json")))
    assert summary["task"].startswith("HarnessTask(run='agent:solve'") and summary["warm_start_steps"] == 20
    atif = pytest.importorskip("atif")
    docs = [json.loads(x) for x in open(os.path.join(full, "atif.jsonl"))]
    assert len(docs) == 4 and all(atif.Trajectory.model_validate(d) for d in docs)   # the final test episodes
