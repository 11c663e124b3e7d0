"""`swarmjax train --config configs/arith_tools_cpu.py`, shrunk: the text job end to end
(tokenizer, warm start on played demonstrations, RL on text rollouts, evaluations)."""

import json
import os

from swarmjax.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "arith_tools_cpu.py")
SMALL = ["sft.steps=4", "sft.demos=64", "sft.batch=8", "rl.steps=2", "rl.tasks_per_step=2", "rl.group_size=4",
         "eval_episodes=4", "eval_every=1", "model.num_layers=1"]


def test_text_job_runs_and_writes_its_summary(tmp_path, capsys):
    workdir = str(tmp_path / "run")
    argv = ["train", "--config", CONFIG, "--workdir", workdir, "--no-progress"]
    assert main(argv + [a for s in SMALL for a in ("--set", s)]) == 0
    out = capsys.readouterr().out
    assert "| warm start |" in out and "| final |" in out
    summary = json.load(open(os.path.join(workdir, "summary.json")))
    for policy in ("warm_start", "final"):
        assert set(summary[policy]) >= {"accuracy", "tool_calls", "turns", "answered"}
        assert 0.0 <= summary[policy]["accuracy"] <= 1.0
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    assert [r["step"] for r in rows if r["stage"] == "sft"] == [0, 1, 2, 3]
    rl = [r for r in rows if r["stage"] == "rl"]
    assert len(rl) == 2 and all(r["segments"] >= 1 and "learner/loss" in r for r in rl)
    assert [r["policy"] for r in rows if r["stage"] == "eval"] == ["warm_start", "rl", "final"]
    assert os.path.isfile(os.path.join(workdir, "tokenizer", "tokenizer.json"))
    # a finished workdir is refused, and text jobs have no checkpoints to evaluate
    assert main(argv) == 2
    assert "already holds a finished run" in capsys.readouterr().err
    assert main(["eval", "--config", CONFIG, "--workdir", workdir]) == 2
    assert "expected one of TrainJob" in capsys.readouterr().err
