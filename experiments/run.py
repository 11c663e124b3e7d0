"""The claims behind PARL and GSPO as experiments on the default CPU job.

    python experiments/run.py serial_collapse            # seeds 0 1 2
    python experiments/run.py spurious_parallelism --jobs 3
    python experiments/run.py budget --seeds 0 1 2 --jobs 2
    python experiments/run.py gspo_vs_grpo --base 'runs/cpu_s{seed}'

Each experiment compares arms of ``configs/parl_widesearch_cpu.py`` that differ only in
their PARL stage (the ``--set`` overrides below), over several seeds. Every arm of a
seed starts from the same warm start: the ``default`` arm is the default job itself
(``--base``, a workdir pattern with ``{seed}``; run there if it does not exist yet), and
the other arms reuse its warm start (``AgentJob.warm_start_from``), so an experiment
costs one PARL stage per extra arm and seed (~6 minutes alone on the 2-core dev machine).

Outputs, in ``--out`` (default ``docs/experiments``): ``<name>.md`` (the claim, its
source, the arms, a table of the final held-out figures per arm and seed with the mean
and the worst seed, and the n = 16 validation curve at every evaluation) and
``<name>.png`` (training-batch curves, mean over seeds, one line per arm). The runs
themselves go to ``--runs`` (default ``runs/experiments/<name>/<arm>_s<seed>``), and what the
report needs of each finished one to ``--records`` (``docs/experiments/<name>/<arm>_s<seed>.json``,
committed): an arm and seed found there is not run again, so the seeds of an experiment can
finish in separate sessions, on separate machines. ``docs/experiments.md`` collects the tables
and plots of every experiment with a verdict (does the claim hold here?) written from them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from common import CONFIG, ROOT, experiment_parser, invocation, rl_rows, save_figure


@dataclasses.dataclass(frozen=True)
class Experiment:
    claim: str
    source: str
    arms: dict[str, tuple[str, ...]]          # arm -> --set overrides ("default": the base job)
    curves: tuple[str, ...]                   # metrics.jsonl keys plotted per PARL step
    # overrides of every arm: a variant of the task. Then the "default" arm is a run of
    # the variant too, and every arm starts from the base job's warm start, transferred
    # (warm_start_match = ("policy",): the SFT demonstrations were the base task's)
    variant: tuple[str, ...] = ()
    # metrics.jsonl keys whose mean over all PARL steps goes into the table
    train_means: tuple[str, ...] = ()
    # overrides of the base job itself, its warm start included: then it runs in
    # <runs>/<name>/base_s<seed> (the "default" arm) instead of --base, and every arm
    # starts from its warm start with the same overrides
    base: tuple[str, ...] = ()


EXPERIMENTS = {
    "serial_collapse": Experiment(
        claim="Without the r_parallel channel (lambda1 = 0) the orchestrator stays serial: a "
              "serial warm start is a local optimum that the outcome reward alone does not leave "
              "(\"serial collapse\").",
        source="Kimi K2.5 technical report, arXiv 2602.02276, section on PARL (r_parallel "
               "against serial collapse)",
        arms={"default": (), "no_r_parallel": ("rl.parl.lambda1=0.0",)},
        curves=("subagents", "no_spawn", "critical_steps", "accuracy"),
        # where collapse can happen and parallel work still pays: a warm start that
        # delegates 3% of its demonstrations, no budget, and only critical steps cost
        # (0.01 each: serial n = 16 costs 0.17, 8 x 2 costs 0.05), so that 8 x 2 is the
        # better plan at n = 16 with or without r_parallel
        base=("sft.spawn_fraction=0.03", "task.cfg.budget=None", "rl.parl.step_cost=0.0",
              "rl.parl.critical_cost=0.01")),
    "budget": Experiment(
        claim="Training under a critical-step budget below the serial cost is what makes "
              "parallel plans necessary; without it the step costs alone must carry that "
              "pressure (our budget rule, in the spirit of K2.5's critical-steps metric).",
        source="Kimi K2.5 technical report, arXiv 2602.02276 (critical steps as the cost); "
               "the budget rule is ours (docs/design.md section 4)",
        arms={"default": (), "no_budget": ("task.cfg.budget=None",),
              # the serial-collapse claim where K2.5 makes it: no budget and no r_parallel
              "no_budget_no_r_parallel": ("task.cfg.budget=None", "rl.parl.lambda1=0.0")},
        curves=("subagents", "critical_steps", "accuracy", "reward")),
    "gspo_vs_grpo": Experiment(
        claim="GSPO (one clipped, length-normalised sequence ratio, clip 3e-4 / 4e-4) trains "
              "at least as well as token-level GRPO (clip 0.2) for the same number of steps, "
              "with far more tokens clipped.",
        source="GSPO, arXiv 2507.18071 (sequence-level ratio and clipping; clip fractions "
               "two orders of magnitude above GRPO's)",
        arms={"default": (), "grpo": ("rl.update.loss.name='grpo'", "rl.update.loss.eps_low=0.2",
                                       "rl.update.loss.eps_high=0.2")},
        curves=("reward", "accuracy", "learner/clip_fraction", "critical_steps"),
        train_means=("learner/clip_fraction", "learner/approx_kl", "reward")),
    "spurious_parallelism": Experiment(
        claim="Without the r_finish channel (lambda2 = 0) the orchestrator learns to spawn "
              "sub-agents that do not finish (\"spurious parallelism\"): r_parallel pays for "
              "spawning, r_finish for sub-agents that return.",
        source="Kimi K2.5 technical report, arXiv 2602.02276, section on PARL (r_finish against "
               "spurious parallelism)",
        # r_parallel in K2.5's instantiation form (paid per sub-agent spawned, not per result
        # returned as our default "parallel" is), with and without r_finish
        arms={"spawned": ("rl.parl.parallel='spawned'", "rl.parl.parallel_target=8"),
              "spawned_no_r_finish": ("rl.parl.parallel='spawned'", "rl.parl.parallel_target=8",
                                      "rl.parl.lambda2=0.0")},
        curves=("subagents", "finished/spawned", "critical_steps", "accuracy"),
        train_means=("subagents", "finished_subagents", "accuracy"),
        # sub-agents that can fail: a worker has 2 steps, so it finishes one lookup and its
        # return; a chunk of 2 entities (half the warm start's delegations) is stopped.
        # Budget 12 = the fewest critical steps at n = 16 then (8 x 1 delegated, 8 serial)
        variant=("task.cfg.subagent_steps=2", "task.cfg.budget=12")),
    "lora_parl": Experiment(
        claim="PARL with LoRA adapters (rank 16 on every linear map, AdamW, frozen sub-agents a copy "
              "of the adapters over the same base) over the warm-started model keeps the full run's "
              "critical-step cut at item-F1 >= 0.95.",
        source="LoRA, arXiv 2106.09685; LoRA RL as Tunix (qwix), verl and TRL (PEFT) train it; "
               "multi-adapter batching as S-LoRA (arXiv 2311.03285)",
        # RL adapts the default job's own warm start (lora.warm_start=False keeps the warm start
        # the whole model's, so the arm reuses it); the default arm trains every weight
        arms={"default": (), "lora": ("lora.rank=16", "lora.warm_start=False")},
        curves=("critical_steps", "accuracy", "subagents", "reward"),
        train_means=("accuracy", "critical_steps")),
    "staleness": Experiment(
        claim="Rollouts that run ahead of the learner (asynchronous RL, the batch decoded with the "
              "policy 1 or 2 updates old) learn about as well per step as synchronous ones at this "
              "scale, with GSPO's clip and the sampler's log-probs as the only correction.",
        source="the asynchronous RL of GLM-5 and Kimi K2.5 (arXiv 2602.02276), verl's one-step "
               "off-policy and fully-async modes; AReaL (arXiv 2505.24298) for staleness-bounded training",
        # the first 100 PARL steps (the default job's F1 at n = 16 is ~0.99 by then), every
        # arm from the default job's warm start
        arms={"sync": ("rl.steps=100", "eval_every=25"),
              "stale1": ("rl.steps=100", "eval_every=25", "rl.async_rollout.depth=1"),
              "stale2": ("rl.steps=100", "eval_every=25", "rl.async_rollout.depth=2")},
        curves=("reward", "accuracy", "critical_steps", "subagents"),
        train_means=("async/staleness", "learner/mismatch_kl", "learner/clip_fraction", "reward")),
}


def _train(workdir: str, seed: int, overrides: tuple[str, ...], log: str) -> None:
    """Run one arm; an arm interrupted before its summary continues from its checkpoints
    (the RL stage's, or those of a warm start in progress)."""
    args = [sys.executable, "-m", "swarmjax.cli", "train", "--config", CONFIG, "--workdir", workdir,
            "--no-progress", "--set", f"seed={seed}"]
    for o in overrides:
        args += ["--set", o]
    args += ["--resume", "auto"]              # an RL checkpoint, or the warm start's own steps
    with open(log, "a") as f:                 # a resumed run's lines after the interrupted one's
        subprocess.run(args, check=True, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)


def run_arms(exp: Experiment, name: str, seeds: list[int], base: str, runs: str, jobs: int,
             records: str) -> dict:
    """Run what is missing; returns {arm: {seed: record}} (:func:`record`, one JSON file a
    finished arm and seed in ``<records>/<name>/``: committed with the report, so an arm
    finished on one machine is not run again on another)."""
    if exp.base:                                      # the experiment's own base job
        base = os.path.join(runs, name, "base_s{seed}")
    own = lambda arm: arm != "default" or bool(exp.variant)       # arms run here (not the base job)
    dirs = {arm: {s: (os.path.join(runs, name, f"{arm}_s{s}") if own(arm) else base.format(seed=s))
                  for s in seeds} for arm in exp.arms}
    kept = lambda arm, s: os.path.join(records, name, f"{arm}_s{s}.json")   # noqa: E731
    missing = [(arm, s) for arm in exp.arms for s in seeds if not os.path.exists(kept(arm, s))]
    done = lambda d: os.path.exists(os.path.join(d, "summary.json"))
    for s in sorted({s for _, s in missing}):         # the base runs first: the others need their warm start
        d = base.format(seed=s)
        if not done(d):
            os.makedirs(os.path.dirname(os.path.abspath(d)), exist_ok=True)
            print(f"[{name}] {'base' if exp.base else 'default'} job, seed {s} -> {d}", flush=True)
            _train(d, s, exp.base, d.rstrip("/") + ".log")
    todo = [(arm, s) for arm, s in missing if own(arm) and not done(dirs[arm][s])]
    transfer = exp.variant + (("warm_start_match=('policy',)",) if exp.variant else ())

    def one(item):
        arm, s = item
        d = dirs[arm][s]
        os.makedirs(os.path.dirname(d), exist_ok=True)
        print(f"[{name}] {arm}, seed {s} -> {d}", flush=True)
        _train(d, s, exp.base + exp.arms[arm] + transfer +
               (f"warm_start_from='{os.path.abspath(base.format(seed=s))}'",), d + ".log")

    with ThreadPoolExecutor(max(jobs, 1)) as pool:
        list(pool.map(one, todo))
    os.makedirs(os.path.join(records, name), exist_ok=True)
    for arm, s in missing:
        with open(kept(arm, s), "w") as f:
            json.dump(record(exp, dirs[arm][s]), f)
    return {arm: {s: json.load(open(kept(arm, s))) for s in seeds} for arm in exp.arms}


def _final(d: str) -> dict:
    """The held-out figures of the finished run in ``d``, every size, before and after PARL."""
    s = json.load(open(os.path.join(d, "summary.json")))
    return {"sizes": s["final_sizes"], "initial_sizes": s["initial_sizes"]}


def _columns(final: dict) -> dict:
    """The table's columns of one arm and seed (a record's ``final``)."""
    f16, f8, f1 = final["sizes"]["16"], final["sizes"]["8"], final["sizes"]["1"]
    return {"f1_16": f16["accuracy"], "crit_16": f16["critical_steps"], "subagents_16": f16["subagents"],
            "finished_16": f16["finished_subagents"], "total_16": f16["total_steps"], "nospawn_1": f1["no_spawn"],
            "crit_8": f8["critical_steps"], "subagents_8": f8["subagents"]}


def _mean(xs: list[float]) -> float:
    return sum(xs) / max(len(xs), 1)


# curves computed from a step's metrics
DERIVED = {"finished/spawned": lambda r: r["finished_subagents"] / r["subagents"] if r["subagents"] else float("nan")}


def _curve(d: str, key: str) -> list[float]:
    """``key`` at each PARL step of the run in ``d`` (from its ``metrics.jsonl``)."""
    rows = rl_rows(d)
    if key in DERIVED:
        return [DERIVED[key](r) for r in rows]
    return [float(r.get(key, 0.0 if key.startswith("async/") else "nan")) for r in rows]   # synchronous: staleness 0


EARLY, LATE = 60, 100         # the windows of the finished / spawned columns: the first and the last PARL steps


def _finished_shares(curves: dict[str, list[float]]) -> dict[str, float]:
    """Finished / spawned sub-agents of a run's training batches (sums of the per-step
    means, every step an equal batch): over all PARL steps, the first ``EARLY``, the last
    ``LATE``, and the worst single step."""
    spawned, finished = curves["subagents"], curves["finished_subagents"]
    share = lambda lo, hi: sum(finished[lo:hi]) / sum(spawned[lo:hi]) if sum(spawned[lo:hi]) else float("nan")  # noqa: E731
    steps = [f / s for f, s in zip(finished, spawned) if s]
    return {"finished_all": share(0, None), "finished_early": share(0, EARLY), "finished_late": share(-LATE, None),
            "finished_worst": min(steps, default=float("nan"))}


def _validation(d: str) -> dict[str, dict]:
    out = {}
    for line in open(os.path.join(d, "eval.jsonl")):
        r = json.loads(line)
        if r["policy"] in ("rl", "final") and r["split"] == "validation" and "16" in r.get("sizes", {}):
            out[str(r["step"])] = r["sizes"]["16"]
    return out


def record(exp: Experiment, d: str) -> dict:
    """What the report needs of the finished run in ``d``: its final held-out figures
    (``final``), the training curves of ``exp`` per PARL step (``curves``) and the n = 16
    validation figures at each evaluation (``validation``, by step)."""
    return {"final": _final(d), "curves": {k: _curve(d, k) for k in (*exp.curves, *exp.train_means)},
            "validation": _validation(d)}


def report(exp: Experiment, name: str, dirs: dict, out: str) -> str:
    """Write ``<out>/<name>.md`` and ``<name>.png`` from the arms' records ({arm: {seed:
    record}}); returns the markdown."""
    seeds = sorted(next(iter(dirs.values())))
    # (key of _columns, header, worst of the seeds)
    cols = [("f1_16", "n=16 item-F1", min), ("crit_16", "n=16 critical steps", max),
            ("subagents_16", "n=16 sub-agents", min)]
    finished = {"subagents", "finished_subagents"} <= {*exp.curves, *exp.train_means}
    if finished:
        cols.append(("finished_16", "n=16 finished sub-agents", min))
    cols += [("total_16", "n=16 total steps", max), ("crit_8", "n=8 critical steps", max),
             ("subagents_8", "n=8 sub-agents", min), ("nospawn_1", "n=1 no-spawn", min)]
    cols += [(k, f"{k} (mean over PARL steps)", None) for k in exp.train_means]   # no "worst"
    shares = (("finished_all", "finished / spawned over training"),
              ("finished_early", f"finished / spawned, steps 1-{EARLY}"),
              ("finished_late", f"finished / spawned, last {LATE} steps"),
              ("finished_worst", "finished / spawned, worst training step")) if finished else ()
    cols += [(k, h, min) for k, h in shares]      # the failure mode of spurious parallelism, over training
    fmt = lambda k, v: (f"{v:.3f}" if k == "f1_16" or k in dict(shares) else f"{v:.2e}" if k in exp.train_means and abs(v) < 0.01
                        else f"{v:.4f}" if k in exp.train_means else f"{v:.2f}")
    arms = "; ".join(f"`{a}`: " + (", ".join(f"`--set {o}`" for o in ov) or
                                  ("no other override" if exp.variant else "the default job"))
                     for a, ov in exp.arms.items())
    lines = [f"### {name}", "", f"**Claim.** {exp.claim}", "", f"**Source.** {exp.source}", "",
             f"**Command.** `{invocation(__file__)}`", ""]
    if exp.base:
        lines += ["**Base job** (`configs/parl_widesearch_cpu.py` with these overrides, its warm start "
                  "included; every arm starts from its warm start with them): " +
                  ", ".join(f"`--set {o}`" for o in exp.base), ""]
    if exp.variant:
        lines += ["**Task variant** (every arm, PARL stage only, from the default job's warm start): " +
                  ", ".join(f"`--set {o}`" for o in exp.variant), ""]
    lines += ["**Arms** (overrides of `configs/parl_widesearch_cpu.py`, same warm start per seed): " + arms, "",
              "Held-out test tasks, greedy, budget lifted, after the last PARL step:", "",
              "| arm | seed | " + " | ".join(h for _, h, _ in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for arm, by_seed in dirs.items():
        rows = {s: {**_columns(rec["final"]), **{k: _mean(rec["curves"][k]) for k in exp.train_means},
                    **(_finished_shares(rec["curves"]) if finished else {})} for s, rec in by_seed.items()}
        for s in seeds:
            lines.append(f"| {arm} | {s} | " + " | ".join(fmt(k, rows[s][k]) for k, _, _ in cols) + " |")
        mean = {k: sum(r[k] for r in rows.values()) / len(rows) for k, _, _ in cols}
        worst = {k: agg(r[k] for r in rows.values()) if agg else None for k, _, agg in cols}
        for label, vals in (("mean", mean), ("worst", worst)):
            lines.append(f"| {arm} | **{label}** | " + " | ".join("-" if vals[k] is None else fmt(k, vals[k])
                                                                  for k, _, _ in cols) + " |")
    lines += ["", "n = 16 validation tasks during training (mean over seeds: item-F1 / critical steps / "
                  "sub-agents):", "", "| PARL step | " + " | ".join(dirs) + " |", "|---|" + "---|" * len(dirs)]
    vals = {arm: [rec["validation"] for rec in by_seed.values()] for arm, by_seed in dirs.items()}
    steps = sorted(set.intersection(*[set(v) for vs in vals.values() for v in vs]), key=int)
    for st in steps:
        cells = []
        for arm in dirs:
            rs = [v[st] for v in vals[arm]]
            m = lambda k: sum(r[k] for r in rs) / len(rs)
            cells.append(f"{m('accuracy'):.3f} / {m('critical_steps'):.2f} / {m('subagents'):.2f}")
        lines.append(f"| {st} | " + " | ".join(cells) + " |")
    lines += ["", f"![{name}]({name}.png)", ""]
    md = "\n".join(lines)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(md)
    _plot(exp, name, dirs, os.path.join(out, f"{name}.png"))
    return md


def _plot(exp: Experiment, name: str, dirs: dict, path: str, smooth: int = 10) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(exp.curves), figsize=(4.2 * len(exp.curves), 3.2))
    for ax, key in zip(np.atleast_1d(axes), exp.curves):
        for arm, by_seed in dirs.items():
            ys = [np.asarray(rec["curves"][key]) for rec in by_seed.values()]
            n = min(len(y) for y in ys)
            y = np.nanmean([y[:n] for y in ys], axis=0)
            y = np.convolve(y, np.ones(smooth) / smooth, mode="valid") if n >= smooth else y
            ax.plot(np.arange(len(y)) + (smooth if n >= smooth else 1), y, label=arm)
        ax.set_title(f"{key} (training batch, mean of {len(next(iter(dirs.values())))} seeds)", fontsize=8)
        ax.set_xlabel("PARL step")
    save_figure(fig, axes, name, path)


def main(argv=None) -> None:
    p = experiment_parser(__doc__, EXPERIMENTS)
    p.add_argument("--base", default="runs/experiments/default_s{seed}",
                   help="workdir pattern of the default job per seed (run there if missing)")
    p.add_argument("--jobs", type=int, default=1, help="arms run at once")
    p.add_argument("--records", default="docs/experiments",
                   help="where each finished arm and seed is kept (<records>/<experiment>/<arm>_s<seed>.json)")
    args = p.parse_args(argv)
    if "{seed}" not in args.base:
        p.error("--base must contain {seed}")
    exp = EXPERIMENTS[args.experiment]
    dirs = run_arms(exp, args.experiment, args.seeds, args.base, args.runs, args.jobs, args.records)
    print(report(exp, args.experiment, dirs, args.out))


if __name__ == "__main__":
    main()
