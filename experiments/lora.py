"""LoRA RL against full fine-tuning on the arithmetic tool task.

    python experiments/lora.py                      # seeds 0 1 2, one after the other
    python experiments/lora.py --jobs 2             # two seeds side by side
    python experiments/lora.py --seeds 0 --set rl.steps=2 --set sft.steps=5 --runs /tmp/lora_try \
        --results /tmp/lora_try --out /tmp/lora_try   # a try of the pipeline

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

Outputs: ``<results>/results_s<seed>.json`` (both arms' final figures, the start's, the
command and overrides; ``docs/experiments/lora/``, committed: a seed found there is not run
again), then ``<out>/lora.md`` (the table, the command, every override) made from them alone.
"""

from __future__ import annotations

import json
import os

from common import ROOT, invocation, run_and_report, seed_results, seeds_parser

CONFIG = os.path.join(ROOT, "configs", "arith_tools_cpu.py")


def run_seed(seed: int, args) -> dict:
    """Both arms of ``seed`` (trained when missing); writes ``results_s<seed>.json``:
    {"seed", "command", "overrides", "rank", "lora_lr", "start", "full", "lora"} (final test figures)."""
    from swarmjax.config_file import apply_overrides, load_config
    from swarmjax.train.agent_job import AgentJob
    from swarmjax.train.jobs import run_job

    out_file = seed_results(args, seed)
    if os.path.exists(out_file):
        return json.load(open(out_file))
    full_dir, lora_dir = (os.path.join(args.runs, f"{arm}_s{seed}") for arm in ("full", "lora"))
    base = [*args.set, f"seed={seed}"]
    lora = [*base, f"lora.rank={args.rank}", "lora.warm_start=False", f"rl.update.optim.learning_rate={args.lora_lr}",
            f"warm_start_from='{os.path.abspath(full_dir)}'"]
    out = {"seed": seed, "command": invocation(__file__), "overrides": args.set, "rank": args.rank,
           "lora_lr": args.lora_lr}
    for arm, workdir, sets in (("full", full_dir, base), ("lora", lora_dir, lora)):
        if not os.path.exists(os.path.join(workdir, "summary.json")):
            print(f"[lora s{seed}] {arm} -> {workdir}", flush=True)
            run_job(apply_overrides(load_config(CONFIG, AgentJob), sets), workdir, progress=False, resume="auto")
        summary = json.load(open(os.path.join(workdir, "summary.json")))
        out[arm], out["start"] = summary["final"], summary["initial"]
    with open(out_file, "w") as f:
        json.dump(out, f, indent=1)
    return out


def report(results: list[dict], args) -> str:
    """``<out>/lora.md`` from the seeds' results; returns the markdown."""
    rows = ["| seed | start accuracy | full FT final | LoRA final |", "|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r['seed']} | " + " | ".join(f"{r[k]['accuracy']:.3f}" for k in ("start", "full", "lora")) + " |")
    for name, agg in (("mean", lambda xs: sum(xs) / len(xs)), ("worst", min)):
        rows.append(f"| {name} | " + " | ".join(f"{agg([r[k]['accuracy'] for r in results]):.3f}"
                                            for k in ("start", "full", "lora")) + " |")
    first = results[0]
    text = "\n".join(["# LoRA RL against full fine-tuning (arithmetic tool task)\n",
                      f"Command: `{first['command']}`; LoRA rank {first['rank']}, AdamW at {first['lora_lr']}, "
                      "every linear map; overrides of both arms: "
                      f"{', '.join(f'`--set {o}`' for o in first['overrides']) or 'none'}.\n", *rows])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "lora.md"), "w") as f:
        f.write(text + "\n")
    return text


def main() -> None:
    p = seeds_parser(__doc__, "runs/experiments/lora", "docs/experiments/lora")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--lora-lr", type=float, default=1e-3, help="the adapters' AdamW learning rate")
    args = p.parse_args()
    run_and_report(__file__, args, run_seed, report,
                   ["--rank", str(args.rank), "--lora-lr", str(args.lora_lr)])


if __name__ == "__main__":
    main()
