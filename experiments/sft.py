"""The optimizer claims behind the warm start as experiments: Muon against AdamW, QK-Clip.

    python experiments/sft.py muon_vs_adamw            # seeds 0 1 2
    python experiments/sft.py qk_clip --seeds 0 1 2

Each arm is the SFT stage (the warm start) of ``configs/parl_widesearch_cpu.py`` (the
same demonstrations and batches; the seed draws the initial params, as ``--set seed=S``),
shortened to ``steps`` (cosine decay over them), with the held-out per-role token
accuracy evaluated every ``eval_every`` steps (``train_sft(..., eval_every=)``) and the attention max logit of every step.
An arm with several learning rates is tuned on the first seed (the rate with the best
final held-out accuracy, mean of both roles) and run at that rate on the other seeds.

Outputs: ``<out>/<name>.md`` (claim, source, the sweep, a table per arm and seed with
the mean and the worst seed) and ``<name>.png`` (curves, mean over seeds); every run's
history in ``<runs>/<name>/<arm>_lr<rate>_s<seed>.json`` (a run found there is reused).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time

from common import CONFIG, ROOT, experiment_parser, invocation, save_figure


@dataclasses.dataclass(frozen=True)
class SFTExperiment:
    claim: str
    source: str
    arms: dict[str, dict]                     # arm -> OptimConfig fields it sets
    learning_rates: dict[str, tuple[float, ...]]   # arm -> rates (several: tuned on the first seed)
    curves: tuple[str, ...]                   # history keys plotted against steps
    model: dict = dataclasses.field(default_factory=dict)   # ModelConfig fields every arm sets
    steps: int = 600
    eval_every: int = 50


EXPERIMENTS = {
    "muon_vs_adamw": SFTExperiment(
        claim="Muon reaches a given loss in fewer steps than AdamW, each at its tuned learning "
              "rate (about 2x the compute efficiency of AdamW in compute-optimal training).",
        source="Liu et al., \"Muon is Scalable for LLM Training\", arXiv 2502.16982 (Muon with "
               "weight decay and matched update RMS against AdamW); Jordan et al. 2024 (Muon)",
        arms={"muon": {"name": "muon"}, "adamw": {"name": "adamw"}},
        learning_rates={"muon": (1e-3, 3e-3, 1e-2), "adamw": (1e-3, 3e-3, 1e-2)},
        curves=("heldout_orch_acc", "heldout_worker_acc", "loss")),
    "qk_clip": SFTExperiment(
        claim="At a learning rate where the attention max logit grows, QK-Clip caps it at tau "
              "without hurting the loss (MuonClip: Muon with QK-Clip kept Kimi K2's logits "
              "bounded and its pre-training free of loss spikes).",
        source="Kimi K2 technical report, arXiv 2507.20534, section 2.1 (MuonClip, QK-Clip)",
        arms={"qk_clip": {"qk_clip_tau": 30.0}, "no_clip": {"qk_clip_tau": math.inf}},
        learning_rates={"qk_clip": (3e-2,), "no_clip": (3e-2,)},
        curves=("max_attn_logit", "loss", "heldout_orch_acc"),
        # Kimi's attention (MLA) has no QK-norm, which would bound the logits by its own
        # scale weights: the experiment uses the Llama form of the model (qk_norm=False)
        model={"qk_norm": False}, steps=300),
}


def _job():
    sys.path.insert(0, ROOT)
    from swarmjax.config_file import load_config
    from swarmjax.train.agent_job import AgentJob
    return load_config(CONFIG, AgentJob)


def run_one(exp: SFTExperiment, arm: str, lr: float, seed: int, path: str) -> dict:
    """One SFT run (or the one saved at ``path``): {"history": [...], "after": {...}, "seconds"}.
    ``seed`` is the job's: it draws the params' initialisation as ``swarmjax train --set
    seed=S`` does; the demonstrations and batches are the config's (``sft.seed``)."""
    if os.path.exists(path):
        return json.load(open(path))
    import jax

    from swarmjax.models.transformer import init_params
    from swarmjax.train.sft import train_sft

    job = _job()
    model = dataclasses.replace(job.model, **exp.model)
    optim = dataclasses.replace(job.sft.optim, learning_rate=lr, decay_steps=exp.steps, **exp.arms[arm])
    sft = dataclasses.replace(job.sft, steps=exp.steps, optim=optim)
    env = dataclasses.replace(job.task.cfg, budget=None)
    params = init_params(model, jax.random.fold_in(jax.random.key(seed), 0))
    t0 = time.time()
    bar = lambda i, m: print(f"  step {i + 1}/{exp.steps} loss {m['loss']:.3f}", flush=True) \
        if (i + 1) % exp.eval_every == 0 else None
    _, report = train_sft(params, model, env, sft, bar, eval_every=exp.eval_every)
    out = {"history": report["history"], "after": report["after"], "seconds": time.time() - t0}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f)
    return out


def _score(run: dict) -> float:
    """Final held-out token accuracy, mean of the two roles."""
    return 0.5 * (run["after"]["orch_acc"] + run["after"]["worker_acc"])


def run_all(exp: SFTExperiment, name: str, seeds: list[int], runs: str, *,
            arms: list[str] | None = None) -> tuple[dict, dict]:
    """The sweep on ``seeds[0]`` and every arm (of ``arms``, default all) at its tuned
    rate on every seed. Returns ({arm: {lr: run}} of the sweep, {arm: (lr, {seed: run})})."""
    path = lambda arm, lr, s: os.path.join(runs, name, f"{arm}_lr{lr:g}_s{s}.json")
    sweep, tuned = {}, {}
    for arm, rates in exp.learning_rates.items():
        if arms and arm not in arms:
            continue
        sweep[arm] = {}
        for lr in rates:
            print(f"[{name}] {arm} lr {lr:g} seed {seeds[0]}", flush=True)
            sweep[arm][lr] = run_one(exp, arm, lr, seeds[0], path(arm, lr, seeds[0]))
        best = max(rates, key=lambda lr: _score(sweep[arm][lr]))
        by_seed = {seeds[0]: sweep[arm][best]}
        for s in seeds[1:]:
            print(f"[{name}] {arm} lr {best:g} seed {s}", flush=True)
            by_seed[s] = run_one(exp, arm, best, s, path(arm, best, s))
        tuned[arm] = (best, by_seed)
    return sweep, tuned


def _figures(run: dict) -> dict[str, float]:
    h = run["history"]
    logits = [r.get("max_attn_logit", float("nan")) for r in h]
    first = lambda key, thr: next((i + 1 for i, r in enumerate(h) if r.get(key, 0.0) >= thr), float("nan"))
    return {"orch_acc": run["after"]["orch_acc"], "worker_acc": run["after"]["worker_acc"],
            "orch_nll": run["after"]["orch_nll"], "worker_nll": run["after"]["worker_nll"],
            "loss": sum(r["loss"] for r in h[-20:]) / min(len(h), 20),
            "max_logit": max(logits), "final_logit": logits[-1],
            "steps_to_0.9": first("heldout_orch_acc", 0.9), "seconds": run["seconds"]}


COLUMNS = (("orch_acc", "held-out orch acc", min), ("worker_acc", "held-out worker acc", min),
           ("orch_nll", "held-out orch NLL", max), ("loss", "train loss (last 20)", max),
           ("steps_to_0.9", "steps to orch acc 0.9", max), ("max_logit", "max attn logit (run)", max),
           ("final_logit", "max attn logit (last step)", max))


def report(exp: SFTExperiment, name: str, sweep: dict, tuned: dict, out: str, seeds: list[int]) -> str:
    """Write ``<out>/<name>.md`` and ``<name>.png``; returns the markdown."""
    fmt = lambda v: "n/a" if v != v else (f"{v:.0f}" if abs(v) >= 100 else f"{v:.3f}")
    model = ", ".join(f"`{k}={v}`" for k, v in exp.model.items()) or "the default model"
    lines = [f"### {name}", "", f"**Claim.** {exp.claim}", "", f"**Source.** {exp.source}", "",
             f"**Command.** `{invocation(__file__)}`", "",
             f"**Setup.** The warm start (SFT) of `configs/parl_widesearch_cpu.py`, {model}, "
             f"{exp.steps} steps (cosine decay over them), held-out demonstrations evaluated every "
             f"{exp.eval_every} steps. Arms (`sft.optim` fields): " +
             "; ".join(f"`{a}`: " + ", ".join(f"`{k}={v}`" for k, v in ov.items()) for a, ov in exp.arms.items()), ""]
    if any(len(r) > 1 for r in exp.learning_rates.values()):
        lines += [f"Learning-rate sweep on seed {seeds[0]} (final held-out token accuracy, orch / worker):", "",
                  "| arm | " + " | ".join(f"lr {lr:g}" for lr in sorted({lr for r in exp.learning_rates.values() for lr in r}))
                  + " | tuned |", "|---|" + "---|" * (len({lr for r in exp.learning_rates.values() for lr in r}) + 1)]
        for arm, runs in sweep.items():
            cells = [f"{runs[lr]['after']['orch_acc']:.3f} / {runs[lr]['after']['worker_acc']:.3f}" if lr in runs else "-"
                     for lr in sorted({lr for r in exp.learning_rates.values() for lr in r})]
            lines.append(f"| {arm} | " + " | ".join(cells) + f" | {tuned[arm][0]:g} |")
        lines.append("")
    lines += [f"Each arm at its learning rate, seeds {', '.join(map(str, seeds))}:", "",
              "| arm | lr | seed | " + " | ".join(h for _, h, _ in COLUMNS) + " |", "|---|---|---|" + "---|" * len(COLUMNS)]
    for arm, (lr, by_seed) in tuned.items():
        figs = {s: _figures(r) for s, r in by_seed.items()}
        for s in seeds:
            lines.append(f"| {arm} | {lr:g} | {s} | " + " | ".join(fmt(figs[s][k]) for k, _, _ in COLUMNS) + " |")
        mean = {k: sum(f[k] for f in figs.values()) / len(figs) for k, _, _ in COLUMNS}
        worst = {k: agg(f[k] for f in figs.values()) for k, _, agg in COLUMNS}
        for label, vals in (("mean", mean), ("worst", worst)):
            lines.append(f"| {arm} | {lr:g} | **{label}** | " + " | ".join(fmt(vals[k]) for k, _, _ in COLUMNS) + " |")
    secs = [r["seconds"] for _, by_seed in tuned.values() for r in by_seed.values()]
    lines += ["", f"Wall clock per run {min(secs):.0f}-{max(secs):.0f} s (runs shared the 2 cores with others).",
              "", f"![{name}]({name}.png)", ""]
    md = "\n".join(lines)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(md)
    _plot(exp, name, tuned, os.path.join(out, f"{name}.png"))
    return md


def _plot(exp: SFTExperiment, name: str, tuned: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, len(exp.curves), figsize=(4.2 * len(exp.curves), 3.2))
    for ax, key in zip(np.atleast_1d(axes), exp.curves):
        for arm, (lr, by_seed) in tuned.items():
            rows = [[(i + 1, r[key]) for i, r in enumerate(run["history"]) if key in r] for run in by_seed.values()]
            x = np.array([i for i, _ in rows[0]])
            y = np.mean([[v for _, v in row] for row in rows], axis=0)
            ax.plot(x, y, label=f"{arm} (lr {lr:g})")
        ax.set_title(f"{key} (mean of {len(next(iter(tuned.values()))[1])} seeds)", fontsize=8)
        ax.set_xlabel("SFT step")
        if key == "max_attn_logit":
            ax.set_yscale("log")
    save_figure(fig, axes, name, path)


def main(argv=None) -> None:
    p = experiment_parser(__doc__, EXPERIMENTS)
    p.add_argument("--arms", nargs="+", help="run only these arms, no report (e.g. one arm per "
                                             "process; a later call without --arms reports)")
    args = p.parse_args(argv)
    exp = EXPERIMENTS[args.experiment]
    if args.arms and not set(args.arms) <= set(exp.arms):
        p.error(f"--arms: {args.experiment} has arms {sorted(exp.arms)}")
    sweep, tuned = run_all(exp, args.experiment, args.seeds, args.runs, arms=args.arms)
    if not args.arms:
        print(report(exp, args.experiment, sweep, tuned, args.out, args.seeds))


if __name__ == "__main__":
    main()
