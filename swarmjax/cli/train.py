"""``swarmjax train``: warm start then PARL (see :mod:`swarmjax.train.job`).

    swarmjax train --config configs/parl_widesearch_cpu.py --workdir runs/cpu
    swarmjax train --config ... --workdir ... --set parl.update.optim.learning_rate=3e-4 --set parl_steps=50
"""

from __future__ import annotations

import argparse

from swarmjax.cli import register


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="Python file whose get_config() returns a TrainJob")
    p.add_argument("--workdir", required=True, help="where metrics, traces and the summary go")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field, e.g. parl.group_size=4 (repeatable)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run(args: argparse.Namespace) -> int:
    from swarmjax.config_file import apply_overrides, load_config
    from swarmjax.train.job import TrainJob, run_job, summary_table

    job = apply_overrides(load_config(args.config, TrainJob), args.overrides)
    job.validate()
    summary = run_job(job, args.workdir, progress=not args.no_progress)
    print(summary_table(summary))
    print(f"written to {args.workdir}: summary.json, summary.md, curves.png, metrics.jsonl, eval.jsonl, traces.jsonl")
    return 0


register("train", "warm start (SFT) then PARL; writes metrics, traces and a summary")((add_arguments, run))
