"""The one job: every job config's run in the one frame and loop, and the one checkpoint
evaluation (what ``swarmjax train`` and ``swarmjax eval`` call).

    from swarmjax.train.jobs import evaluate_checkpoint, job_table, run_job
    summary = run_job(config, "runs/x", resume="auto")
    print(job_table(config)(evaluate_checkpoint(config, "runs/x", which="best")))

A job config (:data:`RUNS`: :class:`~swarmjax.train.agent_job.AgentJob`, any task on the
host, device or token engine) names its :class:`~swarmjax.train.loop.JobRun`: the pieces it
plugs into the loop. Everything else is
shared: the resume mode, the workdir and checkpoint checks before anything is created
(:func:`~swarmjax.train.frame.run_checkpointed`), the loop
(:func:`~swarmjax.train.loop.run_loop`), the checkpoint's restore and identity check
(:func:`~swarmjax.train.loop.open_checkpoint`).
"""

from __future__ import annotations

import os
from typing import Any

import jax

from swarmjax.train.agent_job import AgentJob, AgentRun
from swarmjax.train.frame import finished_step, resume_mode, run_checkpointed
from swarmjax.train.loop import JobRun, evaluate_checkpoint as evaluate_run, run_loop

__all__ = ["RUNS", "evaluate_checkpoint", "job_table", "run_job", "run_type"]

# job config type -> the run that plugs it into the loop
RUNS: dict[type, type[JobRun]] = {AgentJob: AgentRun}


def run_type(job: Any) -> type[JobRun]:
    """The :class:`~swarmjax.train.loop.JobRun` of a job config; ValueError for an object
    that is no job config."""
    try:
        return RUNS[type(job)]
    except KeyError:
        raise ValueError(f"{type(job).__name__} is not a job config; expected one of "
                         f"{', '.join(t.__name__ for t in RUNS)}") from None


def job_table(job: Any):
    """The table that prints a job's summary and its checkpoint evaluations (markdown)."""
    return run_type(job).table


def run_job(job: Any, workdir: str, *, progress: bool = True, resume: bool | str = False,
            handle_sigterm: bool = True) -> dict:
    """Train ``job`` in ``workdir`` through the one loop, or continue its unfinished run
    from the newest finished checkpoint; returns the summary (``summary.json``).

    ``resume``: "never" / False (default: refuses a workdir holding checkpoints or a
    finished run), "latest" / True (continue; an error without a checkpoint) or "auto"
    (continue when there is one); without an RL checkpoint both continue a warm start
    from its own checkpoints (:mod:`swarmjax.train.warm_steps`). The config is validated
    and the workdir checked before anything is created in it. ``handle_sigterm``: on
    SIGTERM stop at the next safe point (a checkpoint there) and raise
    :class:`~swarmjax.train.preemption.Preempted`."""
    Run = run_type(job)
    progress = progress and jax.process_index() == 0

    def run(ckpt, latest, watch):
        return run_loop(Run(job, str(workdir), fresh=latest is None, progress=progress), str(workdir), ckpt, latest,
                        watch, progress, resume_warm=resume_mode(resume) != "never")
    return run_checkpointed(job, str(workdir), resume, run, best_metric=Run.best_metric,
                            handle_sigterm=handle_sigterm, stage=Run.title, checkpoint=Run.checkpointing(job))


def evaluate_checkpoint(job: Any, workdir: str, *, which: str = "latest", split: str = "test") -> dict:
    """Evaluate checkpoint ``which`` ("latest", "best" or a step) of the run in ``workdir``
    on ``split`` of ``job``'s held-out problems, as the run's own evaluations do (the
    start's figures from the run's own evaluation of it); ``job`` may differ from
    the run's config outside its run's ``checked`` fields (e.g. more held-out episodes).
    Opens the checkpoints read-only and writes nothing. Returns what :func:`job_table`
    prints, with ``step``."""
    job.validate()
    if finished_step(os.path.join(str(workdir), "checkpoints")) is None:       # before the run reads anything
        raise ValueError(f"no checkpoints in {workdir}")
    run = run_type(job)(job, str(workdir), fresh=False, progress=False)
    try:
        return evaluate_run(run, str(workdir), which=which, split=split)
    finally:
        run.close()
