"""The job frame every ``swarmjax train`` job runs in (the token-world PARL job, the
agent job): the resume mode, the workdir, the checkpoints, the
SIGTERM watch, and the end of a training step (evaluation cadence, checkpoint,
preemption).

Resume (``resume=``, ``--resume MODE``): "latest" continues from the newest finished
checkpoint (an error if there is none), "auto" does that when there is one and starts
afresh otherwise, "never" (the default) refuses a workdir that holds checkpoints or a
finished run. A job's ``identity()`` (the fields that define what it computes) is saved
with its checkpoints; a resumed or evaluated run must match it (:func:`check_identity`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from typing import Any

from etils import epath

from swarmjax.train.checkpoint import Checkpointer
from swarmjax.train.preemption import PreemptionWatch

RESUME_MODES = ("never", "latest", "auto")
WARM_STEPS = "warm_start_steps"          # <workdir>/<this>: a warm start's own checkpoints (warm_steps.py)


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """How often a job checkpoints and how many checkpoints it keeps: the token-world job's
    ``checkpoint=`` field; the text jobs save at every evaluation and on preemption
    (:func:`run_checkpointed`'s default: ``every=1``, ``keep_last=2``)."""

    every: int = 50                # PARL steps between checkpoints (also after the warm start,
                                   # at every evaluation and at the last step)
    keep_last: int = 2             # plus the best one by mean validation item-F1
    async_save: bool = True
    warm_every: int = 100          # warm-start steps between its own checkpoints (0: only at a
                                   # preemption notice; the newest kept until it ends: warm_steps.py)

    def __post_init__(self):
        if self.every < 1 or self.keep_last < 1:
            raise ValueError("checkpoint.every and checkpoint.keep_last must be >= 1")
        if self.warm_every < 0:
            raise ValueError(f"checkpoint.warm_every must be >= 0, got {self.warm_every}")


def resume_mode(resume: bool | str | None) -> str:
    """One of :data:`RESUME_MODES` for a job's ``resume`` (True: "latest", False or None:
    "never"); ValueError for anything else."""
    if resume is True:
        return "latest"
    if resume is False or resume is None:
        return "never"
    if resume not in RESUME_MODES:
        raise ValueError(f"resume must be one of {', '.join(RESUME_MODES)} (or a bool), got {resume!r}")
    return resume


def check_resume(mode: str, latest: int | None, workdir: Any, checkpoints: Any, *, stage: str = "PARL") -> None:
    """Refuse what resume ``mode`` does not allow: "never" on a workdir whose
    ``checkpoints`` directory holds a finished checkpoint (``latest``: its ``stage``
    step) or a warm start's own (:mod:`swarmjax.train.warm_steps`), "latest" on one
    that holds neither."""
    warm = None if latest is not None else finished_step(os.path.join(str(workdir), WARM_STEPS))
    if latest is not None and mode == "never":
        raise ValueError(f"{workdir} already holds checkpoints (newest: {stage} step {latest}); "
                         "pass --resume auto to continue that run, or use a new --workdir")
    if warm is not None and mode == "never":
        raise ValueError(f"{workdir} holds a warm start stopped at step {warm}; "
                         "pass --resume auto to continue it, or use a new --workdir")
    if mode == "latest" and latest is None and warm is None:
        raise ValueError(f"--resume: no finished checkpoint in {checkpoints} "
                         "(--resume auto starts afresh when there is none)")


def check_identity(mine: dict[str, str], saved: dict[str, str], what: str, may_change: str) -> None:
    """Raise ValueError naming the fields where a job's identity (``mine``: field name ->
    repr) differs from the one a run saved; ``may_change`` names what is left out of it."""
    diff = sorted(k for k in set(mine) | set(saved) if mine.get(k) != saved.get(k))
    if diff:
        raise ValueError(f"{what}: the config differs from the run's in {', '.join(diff)} "
                         f"(only {may_change} may change)")


def check_workdir(workdir: str, mode: str) -> None:
    """Check a job's ``workdir`` for resume ``mode`` ("never", "latest" or "auto",
    :func:`resume_mode`): under "never" no finished run in it. Creates nothing."""
    if mode == "never" and (epath.Path(workdir) / "summary.json").exists():
        raise ValueError(f"workdir {workdir!r} already holds a finished run; choose another "
                         "(--resume auto reads its summary back)")


def finished_step(directory: str) -> int | None:
    """The newest finished checkpoint in ``directory`` (None: none, or no such directory),
    read without creating or cleaning anything there."""
    path = epath.Path(directory)
    if not path.exists() or not any(path.iterdir()):
        return None
    with Checkpointer(directory, save_every=1, read_only=True) as ckpt:
        return ckpt.latest_step()


def run_checkpointed(job: Any, workdir: str, resume: bool | str,
                     run: Callable[[Checkpointer, int | None, PreemptionWatch], dict], *, best_metric: str,
                     handle_sigterm: bool, stage: str = "PARL",
                     checkpoint: CheckpointConfig = CheckpointConfig(every=1, keep_last=2)) -> dict:
    """Every job's frame: ``resume`` read (:func:`resume_mode`), the job validated
    (``job.validate()``), the newest finished step (None: none) checked against the mode
    (:func:`check_resume`; ``stage`` names the training stage in its errors), a finished
    run refused under "never" (:func:`check_workdir`): a config error leaves the workdir
    as it was. Then the workdir created, its checkpoints opened (``workdir/checkpoints``:
    ``checkpoint.keep_last`` and the best by ``best_metric`` kept), then
    ``run(ckpt, latest, watch)`` under a SIGTERM watch; the checkpoints are closed after
    it (waiting for a save in flight)."""
    mode = resume_mode(resume)
    job.validate()
    directory = os.path.join(str(workdir), "checkpoints")
    check_workdir(workdir, mode)                                                      # nothing created yet
    check_resume(mode, finished_step(directory), workdir, directory, stage=stage)
    epath.Path(workdir).mkdir(parents=True, exist_ok=True)
    ckpt = Checkpointer(directory, save_every=checkpoint.every, keep_last=checkpoint.keep_last,
                        best_metric=best_metric, async_save=checkpoint.async_save)
    try:
        latest = ckpt.latest_step()
        with PreemptionWatch(enabled=handle_sigterm) as watch:
            return run(ckpt, latest, watch)
    finally:
        ckpt.close()                                  # waits for a save in flight
