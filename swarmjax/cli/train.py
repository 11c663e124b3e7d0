"""``swarmjax train`` / ``swarmjax eval``: warm start then PARL, and evaluating its
checkpoints (see :mod:`swarmjax.train.agent_job`).

    swarmjax train --config configs/parl_widesearch_cpu.py --workdir runs/cpu
    swarmjax train --config ... --workdir ... --set rl.update.optim.learning_rate=3e-4 --set rl.steps=50
    swarmjax train --config ... --workdir runs/cpu --resume auto     # continue if there is a checkpoint
    swarmjax train --config ... --workdir gs://bucket/runs/cpu        # workdirs may be in an object store
    swarmjax train ... --coordinator 10.0.0.1:1234 --num-processes 2 --process-id 0   # multi-host
    swarmjax eval --config ... --workdir runs/cpu [--checkpoint best] [--sizes 1,16] [--split validation]

Multi-host: both commands start JAX's distributed runtime first (see
:mod:`swarmjax.train.distributed`) when given --coordinator/--num-processes/--process-id,
the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID variables, or when
running in a cluster JAX detects (Cloud TPU VM, GKE, SLURM...); --no-distributed
turns that off. Exit codes of ``train``: 0 done, 2 bad input, 143 stopped by SIGTERM
after saving a checkpoint (rerun with --resume auto).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from swarmjax.cli import register


def _job_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True,
                   help="Python file whose get_config() returns an AgentJob")
    p.add_argument("--workdir", required=True, help="where metrics, traces, checkpoints and the summary go")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field, e.g. parl.group_size=4 (repeatable)")


def _distributed_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("multi-host", "default: JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / "
                             "JAX_PROCESS_ID, else a cluster JAX detects (Cloud TPU, GKE, SLURM), else one process")
    g.add_argument("--coordinator", metavar="HOST:PORT", help="address of process 0's coordinator service")
    g.add_argument("--num-processes", type=int, metavar="N", help="processes in the job (one per host)")
    g.add_argument("--process-id", type=int, metavar="I", help="this process's id, 0..N-1")
    g.add_argument("--no-distributed", action="store_true",
                   help="one process: ignore the JAX_* variables and cluster detection")


def _start_distributed(args: argparse.Namespace) -> None:
    """jax.distributed.initialize per the flags, before anything touches the backend."""
    from swarmjax.train.distributed import maybe_initialize

    maybe_initialize(coordinator=args.coordinator, num_processes=args.num_processes,
                     process_id=args.process_id, enabled=not args.no_distributed)


def _load(args: argparse.Namespace):
    from swarmjax.config_file import apply_overrides, load_config
    from swarmjax.train.jobs import RUNS

    job = load_config(args.config)
    if type(job) not in RUNS:
        raise ValueError(f"config file {args.config!r}: get_config() returned {type(job).__name__}, "
                         f"expected one of {', '.join(t.__name__ for t in RUNS)}")
    job = apply_overrides(job, args.overrides)
    job.validate()
    return job


def add_train_arguments(p: argparse.ArgumentParser) -> None:
    _job_arguments(p)
    p.add_argument("--resume", nargs="?", const="latest", default="never", choices=("auto", "latest", "never"),
                   help="auto: continue from the workdir's newest finished checkpoint if it has one, else "
                        "start afresh (use it to restart preempted jobs); latest (also a bare --resume): "
                        "continue, an error without a checkpoint; never (default): refuse a workdir "
                        "with checkpoints")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    _compile_cache_argument(p)
    _distributed_arguments(p)


def _compile_cache_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--compile-cache", metavar="DIR|off", default=None,
                   help="JAX's persistent compilation cache (a directory, gs:// too, or off); default "
                        "$SWARMJAX_COMPILE_CACHE, else $JAX_COMPILATION_CACHE_DIR, else ~/.cache/swarmjax/xla: a resumed or "
                        "repeated job loads "
                        "its compiled programs instead of compiling them again")


def _enable_compile_cache(args: argparse.Namespace) -> str | None:
    from swarmjax.train.compile_cache import cache_dir, enable

    return enable(cache_dir(args.compile_cache))


def _log_compile(workdir: str, cache: str | None, figures: dict) -> None:
    """One line per start in ``<workdir>/compile.jsonl`` (process 0), and on stdout."""
    import json
    import time

    import jax
    from etils import epath

    if jax.process_index() != 0:
        return
    row = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "cache": cache, **figures}
    path = epath.Path(workdir) / "compile.jsonl"
    old = path.read_text() if path.exists() else ""
    path.write_text(old + json.dumps(row) + "\n")
    print(f"compiling: {figures['compile_s']:.1f} s in XLA, {figures['cache_hits']} programs loaded from the "
          f"cache ({figures['cache_load_s']:.1f} s), {figures['cache_misses']} compiled"
          + (f" and cached in {cache}" if cache else " (no cache)"))


def run_train(args: argparse.Namespace) -> int:
    from etils import epath

    from swarmjax.train.jobs import job_table, run_job
    from swarmjax.train.compile_cache import CompileClock
    from swarmjax.train.preemption import PREEMPTED_EXIT_CODE, Preempted

    cache = _enable_compile_cache(args)
    _start_distributed(args)
    job = _load(args)
    with CompileClock() as clock:
        try:
            summary = run_job(job, args.workdir, progress=not args.no_progress, resume=args.resume)
        except Preempted as e:
            print(f"swarmjax train: {e}", file=sys.stderr)
            _log_compile(args.workdir, cache, clock.figures())
            return PREEMPTED_EXIT_CODE
    print(job_table(job)(summary))
    _log_compile(args.workdir, cache, clock.figures())
    import jax

    if jax.process_index() == 0:
        written = sorted(p.name for p in epath.Path(args.workdir).iterdir())
        print(f"written to {args.workdir}: {', '.join(written)}")
    return 0


def add_eval_arguments(p: argparse.ArgumentParser) -> None:
    _job_arguments(p)
    p.add_argument("--checkpoint", default="latest",
                   help="'latest', 'best' (by validation item-F1; agent jobs: accuracy) or a training step")
    p.add_argument("--sizes", help="task sizes to evaluate, e.g. 1,8,16 (default: the task's eval_sizes)")
    p.add_argument("--split", default="test", choices=("test", "validation"), help="held-out split (default test)")
    _compile_cache_argument(p)
    _distributed_arguments(p)


def with_sizes(job, sizes: tuple[int, ...]):
    """``job`` evaluating held-out problems of ``sizes`` (its task's ``eval_sizes``), as
    many of each as before."""
    from swarmjax.envs.task import resolve_task

    task = resolve_task(job.task)
    if not dataclasses.is_dataclass(task) or not hasattr(task, "eval_sizes") or not task.eval_sizes:
        raise ValueError(f"task {type(task).__name__}: its held-out problems have no sizes to pick: drop --sizes")
    per = job.eval_episodes // len(task.eval_sizes)
    return dataclasses.replace(job, task=dataclasses.replace(task, eval_sizes=sizes), eval_episodes=per * len(sizes))


def run_eval(args: argparse.Namespace) -> int:
    from swarmjax.train.jobs import evaluate_checkpoint, job_table, run_type

    _enable_compile_cache(args)
    _start_distributed(args)
    job = _load(args)
    if args.sizes:
        try:
            sizes = tuple(int(x) for x in args.sizes.split(","))
        except ValueError:
            raise ValueError(f"--sizes takes comma-separated integers, got {args.sizes!r}") from None
        job = with_sizes(job, sizes)
        job.validate()
    out = evaluate_checkpoint(job, args.workdir, which=args.checkpoint, split=args.split)
    print(f"checkpoint at {run_type(job).title} step {out['step']} of {args.workdir} "
          "(final = that checkpoint's policy):")
    print(job_table(job)(out))
    return 0


register("train", "warm start (SFT) then PARL; writes metrics, traces, checkpoints and a summary")(
    (add_train_arguments, run_train))
register("eval", "evaluate a training run's checkpoint per task size on held-out tasks")(
    (add_eval_arguments, run_eval))
