"""LoRA RL against full fine-tuning on the arithmetic tool task.

    python experiments/lora.py                      # seeds 0 1 2
    python experiments/lora.py --seeds 0 --set rl.steps=2 --set sft.steps=5 --runs /tmp/lora_try --out /tmp/lora_try

Claim (LoRA, arXiv 2106.09685; LoRA RL as Tunix, verl and TRL train it): RL of rank-16
adapters on every linear map over the warm-started model reaches the accuracy of full
fine-tuning with the same RL steps.

Per seed, on ``configs/arith_tools_cpu.py``: ``full_s<seed>``: the config's job (a full
warm start, then its RL steps on every weight); ``lora_s<seed>``: the same RL steps on
LoRA adapters (``lora.rank``, AdamW at ``--lora-lr``) over that run's warm start
(``warm_start_from``, ``lora.warm_start=False``: the same start, bit for bit). Table: the
start's and each arm's final held-out accuracy (the run's test split, greedy), per seed,
mean and worst. Runs found finished are reused, interrupted ones resume; ``--set``
overrides go to both arms.

Outputs: ``<out>/lora.md`` (the table, the command, every override).
"""

from __future__ import annotations

import json
import os

from common import ROOT, invocation

CONFIG = os.path.join(ROOT, "configs", "arith_tools_cpu.py")


def run_seed(seed: int, args) -> dict:
    """Both arms of ``seed`` (trained when missing): {arm: final test figures, "start": ...}."""
    from swarmjax.config_file import apply_overrides, load_config
    from swarmjax.train.agent_job import AgentJob
    from swarmjax.train.jobs import run_job

    full_dir, lora_dir = (os.path.join(args.runs, f"{arm}_s{seed}") for arm in ("full", "lora"))
    base = [*args.set, f"seed={seed}"]
    lora = [*base, f"lora.rank={args.rank}", "lora.warm_start=False", f"rl.update.optim.learning_rate={args.lora_lr}",
            f"warm_start_from='{os.path.abspath(full_dir)}'"]
    out = {}
    for arm, workdir, sets in (("full", full_dir, base), ("lora", lora_dir, lora)):
        if not os.path.exists(os.path.join(workdir, "summary.json")):
            print(f"[lora s{seed}] {arm} -> {workdir}", flush=True)
            run_job(apply_overrides(load_config(CONFIG, AgentJob), sets), workdir, progress=False, resume="auto")
        summary = json.load(open(os.path.join(workdir, "summary.json")))
        out[arm], out["start"] = summary["final"], summary["initial"]
    return out


def report(results: dict[int, dict], args) -> str:
    rows = ["| seed | start accuracy | full FT final | LoRA final |", "|---|---|---|---|"]
    acc = lambda s, k: results[s][k]["accuracy"]
    for s in sorted(results):
        rows.append(f"| {s} | {acc(s, 'start'):.3f} | {acc(s, 'full'):.3f} | {acc(s, 'lora'):.3f} |")
    for name, agg in (("mean", lambda xs: sum(xs) / len(xs)), ("worst", min)):
        rows.append(f"| {name} | " + " | ".join(f"{agg([acc(s, k) for s in results]):.3f}"
                                            for k in ("start", "full", "lora")) + " |")
    return "\n".join(["# LoRA RL against full fine-tuning (arithmetic tool task)\n",
                      f"Command: `{invocation(__file__)}`; LoRA rank {args.rank}, AdamW at {args.lora_lr}, "
                      f"every linear map; overrides of both arms: {args.set or 'none'}.\n", *rows])


def main() -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", action="append", default=[], help="an override of both arms (field=value)")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--lora-lr", type=float, default=1e-3, help="the adapters' AdamW learning rate")
    p.add_argument("--runs", default="runs/experiments/lora")
    p.add_argument("--out", default="docs/experiments")
    args = p.parse_args()
    os.makedirs(args.runs, exist_ok=True)
    results = {s: run_seed(s, args) for s in args.seeds}
    text = report(results, args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "lora.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
