"""What the experiment scripts share: the repository root, the default CPU config, their
common command-line arguments, the end of every figure."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "parl_widesearch_cpu.py")

# XLA's persistent compilation cache for the scripts and every job they start (read by jax
# at import; the scripts import jax after this module): an experiment evaluates many
# checkpoints of one config, each evaluation a fresh run that would otherwise compile its
# rollout again (~3 minutes of a context-experiment evaluation's ~4 on 2 cores)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "swarmjax", "xla"))


def invocation(script: str) -> str:
    """The command line that ran ``script`` (every experiment records it beside its results
    and prints it in its report, so each published figure names the command and overrides
    that made it)."""
    return " ".join(["python", os.path.relpath(os.path.abspath(script), ROOT), *map(shlex.quote, sys.argv[1:])])


def save_figure(fig, axes, title: str, path: str) -> None:
    """Legend on the first panel, ``title`` above, written to ``path`` (PNG) and closed."""
    import matplotlib.pyplot as plt
    import numpy as np

    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def experiment_parser(doc: str, experiments) -> argparse.ArgumentParser:
    """The arguments both experiment scripts take: which experiment, the seeds, where
    the runs and the report (tables, PNGs) go."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("experiment", choices=sorted(experiments))
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--runs", default="runs/experiments")
    p.add_argument("--out", default="docs/experiments")
    return p


def seeds_parser(doc: str, runs: str, results: str) -> argparse.ArgumentParser:
    """The arguments of an experiment that runs its seeds as separate processes: the
    seeds, overrides of every job, how many seeds side by side, where the runs, each
    seed's results and the report go, and whether to only run the seeds or only report.

    ``--results`` (default ``results``, under ``docs/experiments/``: committed with the
    report) holds one ``results_s<seed>.json`` a finished seed, everything the report
    needs, so that the seeds of a long experiment can be run in separate sessions or on
    separate machines, and the runs themselves (checkpoints, gigabytes) thrown away."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", action="append", default=[], help="an override of every job (field=value)")
    p.add_argument("--jobs", type=int, default=1, help="seeds run side by side (one process each)")
    p.add_argument("--runs", default=runs)
    p.add_argument("--results", default=results, help="each finished seed's results_s<seed>.json (reused: a seed "
                                                       "found there is not run again)")
    p.add_argument("--out", default="docs/experiments")
    p.add_argument("--no-report", action="store_true", help="only run the seeds (a --jobs worker)")
    p.add_argument("--report-only", action="store_true", help="the report of the seeds' results found in --runs")
    return p


def run_seeds_side_by_side(script: str, seeds: list[int], jobs: int, runs: str, args: list[str]) -> None:
    """Run ``script`` once per seed (``--seeds S --no-report`` added to ``args``), at most
    ``jobs`` processes at a time, each logging to ``<runs>/seed<S>.log``; the first that
    fails stops the others and exits with its log's name."""
    pending, running = list(seeds), []
    while pending or running:
        while pending and len(running) < jobs:
            s = pending.pop(0)
            log = open(os.path.join(runs, f"seed{s}.log"), "w")
            running.append(subprocess.Popen([sys.executable, os.path.abspath(script), *args, "--seeds", str(s),
                                             "--no-report"], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
        time.sleep(2)
        for proc in [r for r in running if r.poll() is not None]:
            running.remove(proc)
            if proc.returncode:
                for other in running:
                    other.kill()
                raise SystemExit(f"a seed's process failed ({proc.returncode}): see {runs}/seed*.log")


def run_and_report(script: str, args, run_seed, report, own: list[str]) -> None:
    """Every seed of ``args.seeds`` (a :func:`seeds_parser`'s): read from
    ``<results>/results_s<seed>.json`` (``--report-only``), run side by side (``--jobs`` > 1:
    one process a seed, given ``own``, the script's own flags, and the common ones) or
    run here one after the other (``run_seed(seed, args)``); then ``report(results,
    args)`` printed, unless ``--no-report``."""
    load = lambda s: json.load(open(seed_results(args, s)))  # noqa: E731
    os.makedirs(args.runs, exist_ok=True)
    os.makedirs(args.results, exist_ok=True)
    if args.report_only:
        results = [load(s) for s in args.seeds]
    elif args.jobs > 1 and len(args.seeds) > 1:
        run_seeds_side_by_side(script, args.seeds, args.jobs, args.runs, [
            *own, "--runs", args.runs, "--results", args.results, "--out", args.out, "--jobs", "1",
            *(a for o in args.set for a in ("--set", o))])
        if args.no_report:
            return
        results = [load(s) for s in args.seeds]
    else:
        results = [run_seed(s, args) for s in args.seeds]
    if not args.no_report:
        print(report(results, args))


def seed_results(args, seed: int) -> str:
    """Where a :func:`seeds_parser` experiment keeps ``seed``'s finished results."""
    return os.path.join(args.results, f"results_s{seed}.json")


def rl_rows(workdir: str) -> list[dict]:
    """A run's logged RL steps, in order (the ``stage == "rl"`` rows of its ``metrics.jsonl``)."""
    rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl")) if line.strip()]
    return [r for r in rows if r.get("stage") == "rl"]


def rl_curve(workdir: str, key: str) -> tuple[list[int], list[float]]:
    """A run's RL steps (from 1) and ``key`` per step, from its ``metrics.jsonl``
    (NaN at a step that does not log ``key``)."""
    rows = rl_rows(workdir)
    return [r["step"] + 1 for r in rows], [float(r.get(key, "nan")) for r in rows]


def plot_rl_means(arms: dict[str, list[str]], keys: tuple[str, ...], title: str, path: str, *,
                  arm_keys: dict[str, tuple[str, ...]] | None = None) -> None:
    """One panel per key: each arm's RL curve, the mean over its runs (``arms``: label ->
    workdirs; runs without metrics are left out), cut to the shortest run; ``arm_keys``:
    the only keys an arm is drawn in (default: every key)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2))
    for i, (label, dirs) in enumerate(arms.items()):
        for ax, key in zip(axes, keys):
            if key not in (arm_keys or {}).get(label, keys):
                continue
            curves = [rl_curve(d, key) for d in dirs if os.path.exists(os.path.join(d, "metrics.jsonl"))]
            if not curves or not curves[0][0]:
                continue
            T = min(len(c[1]) for c in curves)
            ax.plot(curves[0][0][:T], [sum(c[1][t] for c in curves) / len(curves) for t in range(T)], label=label,
                    color=f"C{i}")                      # one colour an arm in every panel
            ax.set_title(f"{key} (training batch)")
            ax.set_xlabel("RL step")
    save_figure(fig, axes, title, path)


def train_missing(jobs: dict, names, tag: str, *, kept_warm: str | None = None) -> dict[str, float]:
    """Run the agent jobs ``names`` of ``jobs`` (name -> (AgentJob, workdir)) that have no
    ``summary.json`` yet (resuming an interrupted one), in order; the ``"warm"`` run is
    exported as a Hugging Face checkpoint (``<workdir>/hf``, its step 0) for the runs that
    start from it. ``kept_warm``: a directory (committed beside the results) that keeps that
    export once made, and gives it back to a machine that lacks the run: a warm start
    finished in one session is not trained again in the next. Returns each trained run's
    wall clock (s)."""
    from swarmjax.train.jobs import run_job
    from swarmjax.train.export import export_run

    clock = {}
    for name in names:
        job, workdir = jobs[name]
        hf = os.path.join(workdir, "hf")
        if name == "warm" and kept_warm and os.path.exists(os.path.join(kept_warm, "config.json")):
            if not os.path.exists(os.path.join(hf, "config.json")):
                print(f"[{tag}] warm start from the kept {kept_warm}", flush=True)
                shutil.copytree(kept_warm, hf, dirs_exist_ok=True)
            continue
        if not os.path.exists(os.path.join(workdir, "summary.json")):
            t0 = time.perf_counter()
            print(f"[{tag}] {name} -> {workdir}", flush=True)
            run_job(job, workdir, progress=False, resume="auto")
            clock[name] = time.perf_counter() - t0
        if name == "warm" and not os.path.exists(os.path.join(hf, "config.json")):
            export_run(workdir, hf, which="0")
        if name == "warm" and kept_warm:
            shutil.copytree(hf, kept_warm, dirs_exist_ok=True)
    return clock
