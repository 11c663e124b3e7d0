"""`python bench/suite.py --quick`: every section at tiny shapes, each as its own process,
and the table with each figure beside its floor (the matmul peak, the copy bandwidth)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_quick_suite_prints_every_figure_beside_its_floor(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}      # one device, as a user runs it
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "suite.py"), "--quick", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    md = (tmp_path / "suite.md").read_text()
    assert md in proc.stdout and "copy bandwidth" in md and "matmul peak" in md
    assert "x floor" in md and "weights / bandwidth" in md and "MFU" in md and "dense, same active width" in md
    assert "a decode step" in md and "| profile | " in md and "| rl_step | RL step" in md
    assert "| swarm | skipped |" in md and "| muon | skipped |" in md
    out = json.load(open(tmp_path / "suite.json"))
    assert out["quick"] and out["floors"]["bandwidth"] > 0 and out["floors"]["peak_flops"] > 0
    assert all(out["sections"][s]["figures"] for s in ("decode", "profile", "update", "moe", "rl_step"))
