"""Tool use across generated environments: what a warm start and RL reach on the
environments they trained in, and on held-out environments whose tools they never saw.

    python experiments/synth.py                       # seeds 0 1 2, one after the other
    python experiments/synth.py --jobs 2              # two seeds side by side
    python experiments/synth.py --set sft.steps=5 --rl-steps 1 --episodes 4   # a try of the pipeline

Per seed, on ``configs/synth_tools_cpu.py`` (generated environments, a third held out):

1. ``warm_s<seed>``: the config's warm start (demonstrations of both roles), exported as a
   Hugging Face checkpoint that the RL runs load;
2. ``single_s<seed>``: GSPO as a single agent; ``swarm_s<seed>``: GSPO as an
   orchestrator whose sub-agents are frozen copies of the warm start (``--no-swarm``
   skips it);
3. greedy evaluations of each run before (its step 0: the warm start) and after RL on
   ``--episodes`` tasks of the training environments (the ``seen`` split: tasks no
   training step used) and of the held-out environments (half from ``validation``,
   half from ``test``: every held-out environment).

Outputs: ``<results>/results_s<seed>.json`` (``docs/experiments/synth/``), then ``<out>/synth.md`` (mean and worst seed;
the held-out score by task kind, calls and parts) and ``<out>/synth.png`` (RL curves).
Runs found finished are reused. ``--set`` overrides go to every job.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

from common import (ROOT, invocation, plot_rl_means, run_and_report, seed_results, seeds_parser,
                    train_missing)

CONFIG = os.path.join(ROOT, "configs", "synth_tools_cpu.py")
SETS = (("seen", ("seen",)), ("held_out", ("validation", "test")))   # (name in the table, the task set's splits)
FIGURES = ("accuracy", "tool_calls", "tool_errors", "answered", "subagents", "critical_steps")


def _jobs(overrides: list[str], seed: int, runs: str, rl_steps: int) -> dict:
    from swarmjax.config_file import apply_overrides, load_config
    from swarmjax.train.agent_job import AgentJob

    base = apply_overrides(load_config(CONFIG, AgentJob), [*overrides, f"seed={seed}"])
    base = dataclasses.replace(base, eval_episodes=4, eval_every=0)   # the table's evaluations are run_seed's
    warm = os.path.join(runs, f"warm_s{seed}")
    rl = dataclasses.replace(base.rl, steps=rl_steps)
    from_warm = dataclasses.replace(base, hf_path=os.path.join(warm, "hf"), sft=None, rl=rl)
    return {"warm": (dataclasses.replace(base, rl=dataclasses.replace(base.rl, steps=0)), warm),
            "single": (from_warm, os.path.join(runs, f"single_s{seed}")),
            "swarm": (dataclasses.replace(from_warm, role="orchestrator"), os.path.join(runs, f"swarm_s{seed}"))}


def _breakdown(problems: list, accuracy: list[float]) -> dict[str, float]:
    """Mean accuracy per task kind, number of calls and parts."""
    groups: dict[str, list[float]] = {}
    for p, a in zip(problems, accuracy):
        calls = sum(len(part["calls"]) for part in p["parts"])
        for key in (f"kind={p['kind']}", f"calls={min(calls, 3)}", f"parts={len(p['parts'])}",
                    f"method={p['method']}"):
            groups.setdefault(key, []).append(a)
    return {k: sum(v) / len(v) for k, v in sorted(groups.items())}


def run_seed(seed: int, args) -> dict:
    """Train what is missing for ``seed``, evaluate every arm; writes ``results_s<seed>.json``."""
    from swarmjax.envs.task import resolve_task
    from swarmjax.train.agent_job import evaluate_agent_checkpoint

    out_file = seed_results(args, seed)
    if os.path.exists(out_file):
        return json.load(open(out_file))
    jobs = _jobs(args.set, seed, args.runs, args.rl_steps)
    arms = ("single",) if args.no_swarm else ("single", "swarm")
    clock = train_missing(jobs, ("warm", *arms), f"synth s{seed}")
    task = resolve_task(jobs["single"][0].task)
    results = {"seed": seed, "episodes": args.episodes, "command": invocation(__file__), "overrides": args.set,
               "train_s": clock, "arms": {}}
    for arm in arms:
        job, workdir = jobs[arm]
        for when, which in (("before", "0"), ("after", "latest")):
            for name, splits in SETS:      # the first tasks of each split: they span its environments
                problems = []
                for split in splits:
                    records = task.records(split)
                    problems += [records[i] for i in range(min(args.episodes // len(splits), len(records)))]
                t0 = time.perf_counter()
                got = evaluate_agent_checkpoint(job, workdir, which=which, problems=problems)["episodes"]
                row = {k: sum(got[k]) / len(problems) for k in FIGURES if k in got}
                row["by"] = _breakdown(problems, got["accuracy"])
                row["eval_s"] = time.perf_counter() - t0
                results["arms"][f"{arm}/{when}/{name}"] = row
                print(f"[synth s{seed}] {arm} {when} RL, {name}: accuracy {row['accuracy']:.3f}", flush=True)
    with open(out_file, "w") as f:
        json.dump(results, f, indent=1)
    return results


def report(results: list[dict], args) -> str:
    """``<out>/synth.md`` and ``synth.png``; returns the markdown."""
    seeds = [r["seed"] for r in results]
    cell = lambda xs, fmt="{:.3f}": f"{fmt.format(sum(xs) / len(xs))} ({fmt.format(min(xs))})"   # noqa: E731
    arms = sorted({k.split("/")[0] for k in results[0]["arms"]}, key=lambda a: a != "single")
    lines = [f"Command: `{results[0].get('command', 'python experiments/synth.py')}`.",
             f"Seeds {', '.join(map(str, seeds))}; {results[0]['episodes']} tasks per set and seed, greedy. "
             "Each cell: mean over seeds (worst seed). *seen*: tasks of the training environments that no "
             "training step used; *held-out*: environments (and tools) no training task used.", "",
             "| arm | seen, before RL | seen, after RL | held-out, before RL | held-out, after RL |",
             "|---|---|---|---|---|"]
    for arm in arms:
        lines.append(f"| {arm} | " + " | ".join(
            cell([r["arms"][f"{arm}/{when}/{name}"]["accuracy"] for r in results])
            for name, _ in SETS for when in ("before", "after")) + " |")
    keys = sorted({k for r in results for a in arms for n, _ in SETS for w in ("before", "after")
                   for k in r["arms"][f"{a}/{w}/{n}"]["by"]})
    lines += ["", "By task (accuracy, mean over the seeds whose tasks have the kind; before -> after RL):", "",
              "| arm | set | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for arm in arms:
        for name, _ in SETS:
            def mean(when, k):
                xs = [r["arms"][f"{arm}/{when}/{name}"]["by"][k] for r in results
                      if k in r["arms"][f"{arm}/{when}/{name}"]["by"]]
                return sum(xs) / max(len(xs), 1)
            lines.append(f"| {arm} | {name} | " + " | ".join(f"{mean('before', k):.2f} -> {mean('after', k):.2f}"
                                                            for k in keys) + " |")
    lines += ["", "Other figures per episode (mean over seeds):", "",
              "| arm | set | RL | " + " | ".join(FIGURES[1:]) + " |", "|---|---|---|" + "---|" * (len(FIGURES) - 1)]
    for arm in arms:
        for name, _ in SETS:
            for when in ("before", "after"):
                lines.append(f"| {arm} | {name} | {when} | " + " | ".join(
                    f"{sum(r['arms'][f'{arm}/{when}/{name}'].get(k, 0.0) for r in results) / len(results):.2f}"
                    for k in FIGURES[1:]) + " |")
    md = "\n".join(lines)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "synth.md"), "w") as f:
        f.write(md + "\n")
    plot_rl_means({arm: [os.path.join(args.runs, f"{arm}_s{s}") for s in seeds] for arm in arms},
                  ("accuracy", "reward", "tool_calls"), "generated environments: RL, mean over seeds",
                  os.path.join(args.out, "synth.png"))
    return md


def main() -> None:
    p = seeds_parser(__doc__, "runs/experiments/synth", "docs/experiments/synth")
    p.add_argument("--episodes", type=int, default=48, help="tasks per evaluation set")
    p.add_argument("--rl-steps", type=int, default=10)
    p.add_argument("--no-swarm", action="store_true", help="skip the orchestrator arm")
    args = p.parse_args()
    run_and_report(__file__, args, run_seed, report, [
        "--episodes", str(args.episodes), "--rl-steps", str(args.rl_steps), *(["--no-swarm"] if args.no_swarm else [])])

if __name__ == "__main__":
    main()
