"""The K2.5 context-management table on a task whose binding constraint is the context.

    python experiments/context.py                      # seeds 0 1 2, one after the other
    python experiments/context.py --jobs 3             # the seeds side by side
    python experiments/context.py --warm-only --jobs 3    # the warm starts alone (e.g. on an accelerator)
    python experiments/context.py --set sft.steps=5 --rl-steps 1 --episodes 2   # a try of the pipeline

Claims (Kimi K2.5, arXiv 2602.02276, BrowseComp: single agent 60.6, discard-all context
management 74.9, Agent Swarm 78.4; ReSum, arXiv 2509.13313: summaries help untrained,
+4.5%, and more after ReSum-GRPO, +8.2%): swarm > discard_all > single agent; summary >
none untrained, and ReSum-GRPO improves on it.

Per seed, on ``configs/context_widesearch.py`` (wide search with pages for lookup results,
every agent limited to 1280 ids):

1. ``warm_s<seed>``: the config's job (its warm start: one policy for the serial agent,
   the serial agent with ``summarize`` and the orchestrator), exported as a Hugging Face
   checkpoint (``warm_s<seed>/hf``) that the other runs load (``--warm-only`` stops
   there: the warm starts can run on an accelerator, the rest where ``hf/`` is copied);
   ``single_s<seed>``: that policy as a single agent (no RL: the strategies' arms);
2. ``resum_s<seed>``: RL as a single agent with the ``summary`` strategy (ReSum-GRPO: an
   episode's segments are rows that share its advantage);
3. ``parl_s<seed>``: RL as an orchestrator with frozen sub-agents (PARL reward);
4. greedy evaluations on ``--episodes`` tasks of each size in ``--sizes`` of
   the arms: the warm start as a single agent with ``none``, ``discard_all``,
   ``keep_last_round`` and ``summary`` (untrained), and as an orchestrator (``swarm``);
   ``resum_grpo`` and ``parl_swarm`` after their RL.

Outputs: ``<runs>/results_s<seed>.json`` (every arm's figures per size), then
``<out>/context.md`` (the table: mean and worst seed per arm and size) and
``<out>/context.png`` (the RL arms' training curves, mean over seeds). Runs found finished
are reused. ``--set`` overrides go to every job of the experiment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import time

from common import ROOT, plot_rl_means, run_seeds_side_by_side, seeds_parser, train_missing

CONFIG = os.path.join(ROOT, "configs", "context_widesearch.py")
STRATEGIES = ("none", "discard_all", "keep_last_round", "summary")
ARMS = ("none", "discard_all", "keep_last_round", "summary", "resum_grpo", "swarm", "parl_swarm")
# (figure, header, worst of the seeds)
COLUMNS = (("accuracy", "item-F1", min), ("answered", "answered", min), ("context_ended", "ran out of context", max),
           ("critical_steps", "critical steps", max), ("peak_context", "peak context", max),
           ("subagent_peak_context", "sub-agent peak", max), ("compactions", "compactions", max),
           ("context_dropped", "ids dropped", max))
CURVES = ("accuracy", "reward", "compactions", "peak_context")


def _jobs(overrides: list[str], seed: int, runs: str, rl_steps: int):
    """The experiment's jobs for ``seed``: {name: (AgentJob, workdir)}."""
    from swarmjax.config_file import apply_overrides, load_config
    from swarmjax.rl.parl import PARLConfig
    from swarmjax.train.agent_job import AgentJob

    base = apply_overrides(load_config(CONFIG, AgentJob), [*overrides, f"seed={seed}"])
    base = dataclasses.replace(base, eval_episodes=2)    # the jobs' own evaluations; the table's are run_seed's
    warm = os.path.join(runs, f"warm_s{seed}")
    hf = os.path.join(warm, "hf")

    def rl(job, strategy: str = "none", **rl_fields):
        return dataclasses.replace(_with_strategy(job, strategy).rl, steps=rl_steps, **rl_fields)

    from_warm = dataclasses.replace(base, hf_path=hf, chat=base.chat, sft=None)
    jobs = {"warm": (base, warm),
            "single": (from_warm, os.path.join(runs, f"single_s{seed}")),
            "resum": (dataclasses.replace(from_warm, rl=rl(from_warm, strategy="summary")),
                      os.path.join(runs, f"resum_s{seed}")),
            "parl": (dataclasses.replace(from_warm, role="orchestrator", rl=rl(
                from_warm, parl=PARLConfig(lambda1=0.1, lambda2=0.1, anneal_steps=max(rl_steps, 1), parallel="novel",
                                           parallel_target=8, step_cost=0.0))),
                     os.path.join(runs, f"parl_s{seed}"))}
    return jobs


def _with_strategy(job, strategy: str):
    ctx = dataclasses.replace(job.rl.rollout.context, strategy=strategy)
    return dataclasses.replace(job, rl=dataclasses.replace(
        job.rl, rollout=dataclasses.replace(job.rl.rollout, context=ctx)))


def _problems(job, n: int, count: int, seed: int) -> list:
    """``count`` tasks of ``n`` entities (the same for every arm of a seed)."""
    from swarmjax.envs.task import resolve_task
    from swarmjax.envs.widesearch import Episode

    cfg = resolve_task(job.task).cfg
    rng = random.Random(1_000_003 * (seed + 1) + n)
    return [Episode.sample(cfg, rng, n=n) for _ in range(count)]


def run_seed(seed: int, args) -> dict:
    """Train what is missing for ``seed`` and evaluate every arm; writes and returns
    ``results_s<seed>.json``."""
    from swarmjax.train.agent_job import evaluate_agent_checkpoint

    out_file = os.path.join(args.runs, f"results_s{seed}.json")
    if os.path.exists(out_file):
        return json.load(open(out_file))
    jobs = _jobs(args.set, seed, args.runs, args.rl_steps)
    clock = train_missing(jobs, ("warm",) if args.warm_only else ("warm", "single", "resum", "parl"), f"context s{seed}")
    if args.warm_only:
        return {}
    single, resum, parl = jobs["single"], jobs["resum"], jobs["parl"]
    arms = {s: (_with_strategy(single[0], s), single[1], "0") for s in STRATEGIES}
    arms.update(resum_grpo=(resum[0], resum[1], "latest"), swarm=(parl[0], parl[1], "0"),
                parl_swarm=(parl[0], parl[1], "latest"))
    results = {"seed": seed, "sizes": args.sizes, "episodes": args.episodes, "train_s": clock, "arms": {}}
    partial = out_file + ".partial"
    if os.path.exists(partial):                      # arms an interrupted attempt evaluated
        results["arms"] = json.load(open(partial))["arms"]
    E = args.episodes
    for arm, (job, workdir, which) in arms.items():
        if arm in results["arms"]:
            continue
        t0 = time.perf_counter()                     # every size in one call: one compiled rollout
        problems = [p for n in args.sizes for p in _problems(job, n, E, seed)]
        got = evaluate_agent_checkpoint(job, workdir, which=which, problems=problems)["episodes"]
        results["arms"][arm] = {str(n): {k: sum(v[i * E:(i + 1) * E]) / E for k, v in got.items()}
                                for i, n in enumerate(args.sizes)}
        results["arms"][arm]["eval_s"] = time.perf_counter() - t0
        for n in args.sizes:
            r = results["arms"][arm][str(n)]
            print(f"[context s{seed}] {arm} n={n}: item-F1 {r['accuracy']:.3f}, peak context "
                  f"{r['peak_context']:.0f}, compactions {r['compactions']:.2f}", flush=True)
        with open(partial, "w") as f:
            json.dump(results, f, indent=1)
    with open(out_file, "w") as f:
        json.dump(results, f, indent=1)
    return results


def load_results(runs: str, seed: int) -> dict:
    """A seed's ``results_s<seed>.json`` (or the arms an interrupted attempt finished)."""
    path = os.path.join(runs, f"results_s{seed}.json")
    return json.load(open(path if os.path.exists(path) else path + ".partial"))


def report(results: list[dict], args) -> str:
    """``<out>/context.md`` (tables) and ``context.png`` (RL curves); returns the markdown."""
    seeds = [r["seed"] for r in results]
    lines = [f"Seeds {', '.join(map(str, seeds))}; {results[0]['episodes']} held-out tasks per size and seed, "
             "greedy, no budget; every agent's context as in `configs/context_widesearch.py`. "
             "Each cell: mean over seeds (worst seed).", ""]
    for n in results[0]["sizes"]:
        lines += [f"**n = {n}**", "", "| arm | " + " | ".join(h for _, h, _ in COLUMNS) + " |",
                  "|---|" + "---|" * len(COLUMNS)]
        for arm in ARMS:
            if any(arm not in r["arms"] for r in results):     # an attempt cut short: not every seed has it
                continue
            cells = []
            for key, _, worst in COLUMNS:
                xs = [r["arms"][arm][str(n)][key] for r in results]
                fmt = "{:.3f}" if key in ("accuracy", "answered", "context_ended") else "{:.1f}" \
                    if key in ("critical_steps", "compactions") else "{:.0f}"
                cells.append(f"{fmt.format(sum(xs) / len(xs))} ({fmt.format(worst(xs))})")
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        lines.append("")
    md = "\n".join(lines)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "context.md"), "w") as f:
        f.write(md + "\n")
    plot_rl_means({label: [os.path.join(args.runs, f"{name}_s{s}") for s in seeds]
                   for name, label in (("resum", "ReSum-GRPO"), ("parl", "PARL swarm"))}, CURVES,
                  "context experiment: RL arms, mean over seeds", os.path.join(args.out, "context.png"))
    return md


def main() -> None:
    p = seeds_parser(__doc__, "runs/experiments/context")
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16])
    p.add_argument("--episodes", type=int, default=12, help="held-out tasks per size")
    p.add_argument("--rl-steps", type=int, default=10, help="RL steps of the two RL arms")
    p.add_argument("--warm-only", action="store_true", help="only the warm starts (e.g. on an accelerator; the rest "
                                                             "then runs where their hf/ directories are copied)")
    args = p.parse_args()
    os.makedirs(args.runs, exist_ok=True)
    if args.report_only:
        results = [load_results(args.runs, s) for s in args.seeds]
    elif args.jobs > 1 and len(args.seeds) > 1:       # one process per seed, then the report here
        run_seeds_side_by_side(__file__, args.seeds, args.jobs, args.runs, [
            "--sizes", *map(str, args.sizes), "--episodes", str(args.episodes), "--rl-steps", str(args.rl_steps),
            "--runs", args.runs, "--out", args.out, "--jobs", "1", *(a for o in args.set for a in ("--set", o)),
            *(["--warm-only"] if args.warm_only else [])])
        results = [] if args.warm_only else [load_results(args.runs, s) for s in args.seeds]
    else:
        results = [run_seed(s, args) for s in args.seeds]
    if not args.no_report and not args.warm_only:
        print(report(results, args))


if __name__ == "__main__":
    main()
