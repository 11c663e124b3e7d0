"""What the experiment scripts share: the repository root, the default CPU config, their
common command-line arguments, the end of every figure."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = os.path.join(ROOT, "configs", "parl_widesearch_cpu.py")


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
