"""``swarmjax train`` / ``swarmjax eval``: warm start then PARL, and evaluating its
checkpoints (see :mod:`swarmjax.train.job`).

    swarmjax train --config configs/parl_widesearch_cpu.py --workdir runs/cpu
    swarmjax train --config ... --workdir ... --set parl.update.optim.learning_rate=3e-4 --set parl_steps=50
    swarmjax train --config ... --workdir runs/cpu --resume          # continue from the newest checkpoint
    swarmjax eval --config ... --workdir runs/cpu [--checkpoint best] [--sizes 1,16] [--split validation]
"""

from __future__ import annotations

import argparse
import os

from swarmjax.cli import register


def _job_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True,
                   help="Python file whose get_config() returns a TrainJob or a TextToolJob")
    p.add_argument("--workdir", required=True, help="where metrics, traces, checkpoints and the summary go")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field, e.g. parl.group_size=4 (repeatable)")


def _jobs() -> dict[type, tuple]:
    """Job config type -> (run, summary table): the registry ``swarmjax train`` dispatches on."""
    from swarmjax.train.job import TrainJob, run_job
    from swarmjax.train.logs import summary_table
    from swarmjax.train.text_job import TextToolJob, run_text_job, text_summary_table

    return {TrainJob: (run_job, summary_table), TextToolJob: (run_text_job, text_summary_table)}


def _load(args: argparse.Namespace, types: tuple[type, ...] | None = None):
    from swarmjax.config_file import apply_overrides, load_config

    types = tuple(_jobs()) if types is None else types
    job = load_config(args.config)
    if not isinstance(job, types):
        raise ValueError(f"config file {args.config!r}: get_config() returned {type(job).__name__}, "
                         f"expected one of {', '.join(t.__name__ for t in types)}")
    job = apply_overrides(job, args.overrides)
    job.validate()
    return job


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    _job_arguments(p)
    p.add_argument("--resume", action="store_true", help="continue from the workdir's newest checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def run_train(args: argparse.Namespace) -> int:
    job = _load(args)
    run, table = _jobs()[type(job)]
    summary = run(job, args.workdir, progress=not args.no_progress, resume=args.resume)
    print(table(summary))
    written = sorted(os.listdir(args.workdir))
    print(f"written to {args.workdir}: {', '.join(written)}")
    return 0


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    _job_arguments(p)
    p.add_argument("--checkpoint", default="latest", help="'latest', 'best' (by eval item-F1) or a PARL step")
    p.add_argument("--sizes", help="task sizes to evaluate, e.g. 1,8,16 (default: the config's eval_sizes)")
    p.add_argument("--split", default="test", choices=("test", "validation"), help="held-out split (default test)")


def run_eval(args: argparse.Namespace) -> int:
    from swarmjax.train.job import TrainJob, evaluate_checkpoint
    from swarmjax.train.logs import summary_table

    sizes = None
    if args.sizes:
        try:
            sizes = tuple(int(x) for x in args.sizes.split(","))
        except ValueError:
            raise ValueError(f"--sizes takes comma-separated integers, got {args.sizes!r}") from None
    job = _load(args, (TrainJob,))          # text jobs keep no checkpoints yet
    if sizes:
        import dataclasses
        job = dataclasses.replace(job, eval_sizes=sizes)
        job.validate()
    out = evaluate_checkpoint(job, args.workdir, which=args.checkpoint, split=args.split)
    print(f"checkpoint at PARL step {out['step']} of {args.workdir} (final = that checkpoint's policy):")
    print(summary_table(out))
    return 0


register("train", "warm start (SFT) then PARL; writes metrics, traces, checkpoints and a summary")(
    (add_train_arguments, run_train))
register("eval", "evaluate a training run's checkpoint per task size on held-out tasks")(
    (add_eval_arguments, run_eval))
