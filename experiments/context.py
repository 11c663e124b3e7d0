"""The K2.5 context-management table on a task whose binding constraint is the context.

    python experiments/context.py                          # seeds 0-4, one after the other
    python experiments/context.py --jobs 2                 # two seeds side by side (more than 2 cores)
    python experiments/context.py --warm-only --jobs 5     # the warm starts alone (e.g. on an accelerator)
    python experiments/context.py --set sft.steps=5 --set sft.demos=64 --rl-steps 1 --episodes 2 --seeds 0 \
        --sizes 4 --needle-sizes 4 --runs /tmp/context_try --out /tmp/context_try   # a try of the pipeline

Claim (Kimi K2.5, arXiv 2602.02276, BrowseComp: single agent 60.6, discard-all context
management 74.9, Agent Swarm 78.4): where one agent's context cannot hold the task, a swarm
whose sub-agents each hold a part of it ("context sharding") answers better than the single
agent with or without reactive context management (ReSum's summaries, arXiv 2509.13313;
discard-all), in fewer critical steps.

Per seed, on ``configs/context_widesearch.py`` (wide search with pages for lookup results,
every agent limited to 1280 ids: a serial agent's context holds ~2/3 of what n = 16 needs,
a sub-agent's holds its chunk of 4 with room to spare):

1. ``warm_s<seed>``: the config's job (its warm start: one policy for the serial agent,
   the serial agent with ``summarize`` and the orchestrator), exported as a Hugging Face
   checkpoint (``warm_s<seed>/hf``) that the other runs load (``--warm-only`` stops
   there); ``single_s<seed>``: that policy as a single agent (no RL);
2. ``parl_s<seed>``: ``--rl-steps`` PARL steps of the orchestrator with frozen sub-agents
   at a peak learning rate of ``--parl-lr`` (5e-5; the config's 2e-4 cut the share the
   orchestrator delegates within 10 steps: ``experiments/context_lr_probe.py``)
   (the default PARL reward: r_parallel ``novel`` and r_finish, 0.3 annealed to 0 over 70
   steps; 0.005 a step of any agent, 0.004 a critical step);
3. greedy evaluations of ``--episodes`` tasks of each size in ``--sizes`` (the same tasks
   for every arm of a seed): the warm start as a single agent with ``none``,
   ``summary`` and ``discard_all`` (past 1024 ids), and as an orchestrator (``swarm``);
   ``parl_swarm`` after PARL. Columns: item-F1, ran out of context, critical steps, peak
   context, the share of the task the orchestrator delegated, the sub-agents' own return
   item-F1 and the orchestrator's copy fidelity (its answer against what came back),
   compactions;
4. the same arms on ``--episodes`` needle questions of each size in ``--needle-sizes``
   ("which of these entities has the value X?", a quarter of the training problems),
   sampled at the rollout's temperature: one line answers them, so an agent that discards
   its results and starts again can still find it (K2.5's order single < discard-all <
   swarm is possible there, unlike in wide search, which needs every result).

Outputs: ``<results>/results_s<seed>.json`` (every arm's figures per size, PARL's training
curves, and the command and every override it ran with; ``docs/experiments/context/``,
committed: a seed finished on one machine stays when its runs do not; so does each seed's
warm start, ``warm_s<seed>/``, its Hugging Face export, the longest stage), then
``<out>/context.md`` (mean and worst seed per arm and size) and ``<out>/context.png``
(item-F1 and critical steps by size; PARL's training curves), both made from those files
alone. Runs found finished are reused, interrupted ones resume. ``--set`` overrides go to
every job of the experiment.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import time

from common import (ROOT, invocation, rl_curve, run_and_report, save_figure, seed_results, seeds_parser,
                    train_missing)

CONFIG = os.path.join(ROOT, "configs", "context_widesearch.py")
SINGLE = ("none", "summary", "discard_all")           # the single agent's context strategies
ARMS = (*SINGLE, "swarm", "parl_swarm")
# (figure, header, worst of the seeds, format)
COLUMNS = (("accuracy", "item-F1", min, "{:.3f}"), ("context_ended", "ran out of context", max, "{:.2f}"),
           ("critical_steps", "critical steps", max, "{:.1f}"), ("peak_context", "peak context", max, "{:.0f}"),
           ("delegated", "delegated", min, "{:.2f}"), ("return_f1", "sub-agents' return F1", min, "{:.3f}"),
           ("copy_fidelity", "copy fidelity", min, "{:.3f}"), ("compactions", "compactions", max, "{:.1f}"))
# PARL's training-batch figures per step kept in each seed's results (the report's curves)
CURVES = ("accuracy", "critical_steps", "delegated", "return_f1", "copy_fidelity")
OLD_LR = 2e-4               # PARL's learning rate of the seeds kept before it was an argument
SMOOTH = 10                  # PARL's curves: the mean of the last SMOOTH steps (each step's batch is 16 episodes)


def _jobs(overrides: list[str], seed: int, runs: str, rl_steps: int, *, parl_lr: float = 5e-5):
    """The experiment's jobs for ``seed``: {name: (AgentJob, workdir)}."""
    from swarmjax.config_file import apply_overrides, load_config
    from swarmjax.rl.parl import PARLConfig
    from swarmjax.train.agent_job import AgentJob
    from swarmjax.train.frame import CheckpointConfig

    base = apply_overrides(load_config(CONFIG, AgentJob), [*overrides, f"seed={seed}"])
    base = dataclasses.replace(base, eval_episodes=2)    # the jobs' own evaluations; the table's are run_seed's
    warm = os.path.join(runs, f"warm_s{seed}")
    from_warm = dataclasses.replace(base, hf_path=os.path.join(warm, "hf"), chat=base.chat, sft=None)
    update = from_warm.rl.update
    update = dataclasses.replace(update, optim=dataclasses.replace(update.optim, learning_rate=parl_lr, decay_steps=max(
        rl_steps * update.num_minibatches, 1)))
    parl = PARLConfig(lambda1=0.3, lambda2=0.3, anneal_steps=max(min(70, rl_steps), 1), parallel="novel",
                      parallel_target=base.max_subagents, step_cost=0.005, critical_cost=0.004)
    return {"warm": (base, warm),
            "single": (from_warm, os.path.join(runs, f"single_s{seed}")),
            # checkpointed every 10 PARL steps, a stopped run losing at most 10 (not part of its
            # identity); all kept: the swarm arm is its step 0
            "parl": (dataclasses.replace(from_warm, role="orchestrator",
                                         checkpoint=CheckpointConfig(every=10, keep_last=rl_steps // 10 + 2),
                                         rl=dataclasses.replace(from_warm.rl, steps=rl_steps, parl=parl,
                                                                update=update)), os.path.join(runs, f"parl_s{seed}"))}


def _with_strategy(job, strategy: str):
    ctx = dataclasses.replace(job.rl.rollout.context, strategy=strategy)
    return dataclasses.replace(job, rl=dataclasses.replace(
        job.rl, rollout=dataclasses.replace(job.rl.rollout, context=ctx)))


def _problems(job, n: int, count: int, seed: int, *, needle: bool = False) -> list:
    """``count`` wide-search tasks (or needle questions) of ``n`` entities, the same for
    every arm of a seed."""
    from swarmjax.envs.task import resolve_task

    task = resolve_task(job.task)
    rng = random.Random(1_000_003 * (seed + 1) + n + (7_919 if needle else 0))
    return [task.episode(rng, n, needle=needle) for _ in range(count)]


def _mean(xs) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def run_seed(seed: int, args) -> dict:
    """Train what is missing for ``seed`` and evaluate every arm; writes and returns
    ``results_s<seed>.json``."""
    from swarmjax.train.agent_job import evaluate_agent_checkpoint

    out_file = seed_results(args, seed)
    if os.path.exists(out_file):
        return json.load(open(out_file))
    jobs = _jobs(args.set, seed, args.runs, args.rl_steps, parl_lr=args.parl_lr)
    clock = train_missing(jobs, ("warm",) if args.warm_only else ("warm", "single", "parl"), f"context s{seed}",
                          kept_warm=os.path.join(args.results, f"warm_s{seed}"))
    if args.warm_only:
        return {}
    single, parl = jobs["single"], jobs["parl"]
    arms = {s: (_with_strategy(single[0], s), single[1], "0") for s in SINGLE}
    arms.update(swarm=(parl[0], parl[1], "0"), parl_swarm=(parl[0], parl[1], "latest"))
    results = {"seed": seed, "sizes": args.sizes, "needle_sizes": args.needle_sizes, "episodes": args.episodes,
               "rl_steps": args.rl_steps,
               "overrides": args.set, "command": invocation(__file__),
               "rl": {"tasks_per_step": parl[0].rl.tasks_per_step, "group_size": parl[0].rl.group_size,
                      "learning_rate": args.parl_lr},
               "train_s": clock, "arms": {},
               "parl_curves": {k: rl_curve(parl[1], k)[1] for k in CURVES}}
    partial = os.path.join(args.runs, f"results_s{seed}.json.partial")
    if os.path.exists(partial):                      # arms an interrupted attempt evaluated
        old = json.load(open(partial))
        results.update({k: old[k] for k in ("arms", "needle") if k in old})
    E = args.episodes
    for table, sizes, needle in (("arms", args.sizes, False), ("needle", args.needle_sizes, True)):
        results.setdefault(table, {})
        for arm, (job, workdir, which) in arms.items():
            if arm in results[table] or not sizes:
                continue
            t0 = time.perf_counter()                     # every size in one call: one compiled rollout
            problems = [p for n in sizes for p in _problems(job, n, E, seed, needle=needle)]
            got = evaluate_agent_checkpoint(job, workdir, which=which, problems=problems, sampled=needle)["episodes"]
            results[table][arm] = {str(n): {k: _mean(v[i * E:(i + 1) * E]) for k, v in got.items()}
                                   for i, n in enumerate(sizes)}
            results[table][arm]["eval_s"] = time.perf_counter() - t0
            for n in sizes:
                r = results[table][arm][str(n)]
                print(f"[context s{seed}] {'needle ' if needle else ''}{arm} n={n}: item-F1 {r['accuracy']:.3f}, "
                      f"critical steps {r['critical_steps']:.1f}, peak context {r['peak_context']:.0f}, return F1 "
                      f"{r.get('return_f1', float('nan')):.3f}, copy {r.get('copy_fidelity', float('nan')):.3f}",
                      flush=True)
            with open(partial, "w") as f:
                json.dump(results, f, indent=1)
    with open(out_file, "w") as f:
        json.dump(results, f, indent=1)
    return results


def _cell(results: list[dict], table: str, arm: str, n: int, key: str, worst, fmt: str) -> str:
    xs = [x for r in results if not math.isnan(x := r[table][arm][str(n)].get(key, float("nan")))]
    return f"{fmt.format(_mean(xs))} ({fmt.format(worst(xs))})" if xs else "-"


def _tables(results: list[dict], table: str, sizes: list[int]) -> list[str]:
    """One markdown table per size of ``table`` ("arms": wide search, "needle")."""
    arms = [a for a in ARMS if all(a in r.get(table, {}) for r in results)]
    lines = []
    for n in sizes:
        lines += [f"**n = {n}**", "", "| arm | " + " | ".join(h for _, h, _, _ in COLUMNS) + " |",
                  "|---|" + "---|" * len(COLUMNS)]
        lines += [f"| {arm} | " + " | ".join(_cell(results, table, arm, n, key, worst, fmt)
                                             for key, _, worst, fmt in COLUMNS) + " |" for arm in arms]
        lines.append("")
    if arms and sizes:
        lines.append(f"Item-F1 per seed at n = {sizes[-1]}: " + "; ".join(
            f"{arm} " + " / ".join(f"{r[table][arm][str(sizes[-1])]['accuracy']:.3f}" for r in results)
            for arm in arms) + ".")
        lines.append("")
    return lines


def report(results: list[dict], args) -> str:
    """``<out>/context.md`` (tables) and ``context.png``; returns the markdown."""
    results = [r for r in results if r]
    first = results[0]
    lrs = {r["rl"].get("learning_rate", OLD_LR) for r in results}      # seeds kept before --parl-lr: 2e-4
    if len(lrs) > 1:
        raise SystemExit(f"the seeds' PARL learning rates differ ({sorted(lrs)}): report them apart (--results)")
    lines = [f"Seeds {', '.join(str(r['seed']) for r in results)}; {first['episodes']} held-out tasks per size "
             f"and seed, no budget; PARL {first['rl_steps']} steps of {first['rl']['tasks_per_step']} tasks x "
             f"{first['rl']['group_size']} rollouts at a peak learning rate of {lrs.pop():g}. "
             f"Command: `{first['command']}`"
             + (f" (overrides: {', '.join(first['overrides'])})" if first["overrides"] else "")
             + ". Each cell: mean over seeds (worst seed); '-': no episode has the figure (no sub-agent "
             "returned).", "", "**Wide search** (greedy):", ""]
    lines += _tables(results, "arms", first["sizes"])
    if first.get("needle_sizes"):
        lines += ["**Needle questions** (sampled at the rollout's temperature; item-F1 is the share "
                  "answered right):", ""]
        lines += _tables(results, "needle", first["needle_sizes"])
    md = "\n".join(lines)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "context.md"), "w") as f:
        f.write(md + "\n")
    _plot(results, [a for a in ARMS if all(a in r["arms"] for r in results)], args)
    return md


def _plot(results: list[dict], arms: list[str], args) -> None:
    """item-F1 and critical steps by task size (mean over seeds, the worst seed dashed) and
    PARL's training curves (mean over seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 5, figsize=(21, 3.6))
    panels = ((axes[0], "arms", "accuracy", min, "wide search: item-F1"),
              (axes[1], "arms", "critical_steps", max, "wide search: critical steps"),
              (axes[2], "needle", "accuracy", min, "needle: answered right"))
    for ax, table, key, worst, title in panels:
        sizes = results[0]["sizes" if table == "arms" else "needle_sizes"]
        for i, arm in enumerate(arms):
            if not sizes or any(arm not in r.get(table, {}) for r in results):
                continue
            xs = [[r[table][arm][str(n)][key] for r in results] for n in sizes]
            ax.plot(sizes, [sum(x) / len(x) for x in xs], "o-", color=f"C{i}", label=arm)
            ax.plot(sizes, [worst(x) for x in xs], ":", color=f"C{i}")
        ax.set(title=f"{title} (dotted: worst seed)", xlabel="entities n")
    for ax, keys in zip(axes[3:], (("accuracy", "return_f1", "copy_fidelity"), ("critical_steps",))):
        for i, key in enumerate(keys):
            curves = [r["parl_curves"][key] for r in results if r.get("parl_curves", {}).get(key)]
            if curves:
                T = min(map(len, curves))
                mean = [_mean(c[t] for c in curves) for t in range(T)]
                smooth = [_mean(mean[max(0, t - SMOOTH + 1):t + 1]) for t in range(T)]
                ax.plot(range(1, T + 1), mean, color=f"C{4 + i}", alpha=0.25, lw=0.8)
                ax.plot(range(1, T + 1), smooth, color=f"C{4 + i}", label=key)
        ax.legend(fontsize=7)
        ax.set(title=f"PARL: training batch ({SMOOTH}-step mean)", xlabel="RL step (mean over seeds)")
    save_figure(fig, axes, "context-bound wide search: swarm against single agents", os.path.join(args.out,
                                                                                                 "context.png"))


def main() -> None:
    p = seeds_parser(__doc__, "runs/experiments/context", "docs/experiments/context")
    p.set_defaults(seeds=[0, 1, 2, 3, 4])
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 12, 16])
    p.add_argument("--needle-sizes", type=int, nargs="*", default=[8, 16],
                   help="sizes of the needle questions (sampled episodes; none: no needle table)")
    p.add_argument("--episodes", type=int, default=48, help="held-out tasks per size")
    p.add_argument("--rl-steps", type=int, default=100, help="PARL steps of the swarm")
    p.add_argument("--parl-lr", type=float, default=5e-5,
                   help="PARL's peak learning rate (2e-4, the config's own, cut the orchestrator's delegation: "
                        "experiments/context_lr_probe.py)")
    p.add_argument("--warm-only", action="store_true", help="only the warm starts (e.g. on an accelerator; the rest "
                                                             "then runs where their hf/ directories are copied)")
    args = p.parse_args()
    if args.warm_only:
        args.no_report = True
    own = ["--sizes", *map(str, args.sizes), "--needle-sizes", *map(str, args.needle_sizes),
           "--episodes", str(args.episodes), "--rl-steps", str(args.rl_steps), "--parl-lr", str(args.parl_lr), *(["--warm-only"] if args.warm_only else [])]
    run_and_report(__file__, args, run_seed, report, own)


if __name__ == "__main__":
    main()
