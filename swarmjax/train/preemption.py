"""Preemption: on SIGTERM a training job stops at its next safe point, saves a
checkpoint there and exits with :data:`PREEMPTED_EXIT_CODE` (143 = 128 + SIGTERM, the
status a shell reports for a SIGTERM-killed process, so schedulers that restart failed
jobs, e.g. a Kubernetes Job or SLURM ``--requeue``, restart this one; 0 would mark an
unfinished run as done). Rerunning the command with ``--resume auto`` continues
exactly where it stopped.

Safe points are the ends of steps: every warm-start (SFT) step, the warm-start
checkpoint (PARL step 0) and every PARL step. A stop during the warm start saves
nothing (its optimizer state is not checkpointed): the rerun starts it again.

How: a Python SIGTERM handler sets a flag (the first SIGTERM also restores the default
action, so a second one terminates at once, as SIGKILL always does). With several
processes they agree on where to stop through one all-gather of that flag per safe
point, so all stop at the same step whichever host got the signal.

Why not JAX's preemption service (``jax.distributed``'s SIGTERM notifier, read through
orbax's ``multihost.reached_preemption`` / ``multihost_utils.
reached_preemption_sync_point``): its C++ handler absorbs every SIGTERM, so a second
one could not stop a job stuck in a long step; its sync protocol needs one monotone
step counter per process, and orbax's ``CheckpointManager`` already feeds it checkpoint
step numbers (in ``save`` and in its async finalisation thread), which leaves the warm
start (no checkpoint steps) out; and single-process runs have no service at all. The
Python handler replaces JAX's notifier while the watch is active (orbax's
``PreemptionCheckpointingPolicy`` in :class:`~swarmjax.train.checkpoint.Checkpointer`
then never fires; the watch decides). The all-gather costs one tiny collective per
step, and nothing with one process.
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["PREEMPTED_EXIT_CODE", "Preempted", "PreemptionWatch"]

PREEMPTED_EXIT_CODE = 143


class Preempted(Exception):
    """Raised by a job that stopped for a preemption notice, after its checkpoint (if
    any: ``step`` is None when it stopped in the warm start, ``warm_step`` then the
    warm start's steps saved, :mod:`swarmjax.train.warm_steps`) is on disk."""

    def __init__(self, step: int | None, workdir: str, *, stage: str = "PARL", warm_step: int | None = None):
        self.step, self.workdir, self.warm_step = step, workdir, warm_step
        where = (f"checkpoint at {stage} step {step} saved" if step is not None else
                 "during the warm start: nothing to keep, the rerun starts the warm start again"
                 if warm_step is None else f"during the warm start: its checkpoint at step {warm_step} saved")
        super().__init__(f"preempted (SIGTERM) {where}; continue with --resume auto on {workdir}")


class PreemptionWatch:
    """Context manager watching for a preemption notice; :meth:`reached` at every safe
    point says whether to stop there (the same answer on every process).

    >>> with PreemptionWatch() as watch:
    ...     for step in ...:
    ...         train_step()
    ...         if watch.reached():
    ...             save(); raise Preempted(step, workdir)

    ``enabled=False``: never stops, touches no signal handler. Outside the main thread
    no Python handler can be installed: the watch then never stops the job.
    """

    def __init__(self, *, enabled: bool = True):
        self.enabled = enabled
        self.requested = False            # this process got SIGTERM (Python handler)
        self._previous = None
        self._installed = False
        self._multi = False

    # ------------------------------------------------------------------ context
    def __enter__(self) -> PreemptionWatch:
        if not self.enabled:
            return self
        import jax

        self._multi = jax.process_count() > 1
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGTERM)
            signal.signal(signal.SIGTERM, self._on_sigterm)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:
            # a handler not installed from Python (None) cannot be put back: default action
            previous = self._previous if self._previous is not None else signal.SIG_DFL
            current = signal.getsignal(signal.SIGTERM)
            if current == self._on_sigterm or (self.requested and current == signal.SIG_DFL):
                signal.signal(signal.SIGTERM, previous)
            self._installed = False

    def _on_sigterm(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)      # a second SIGTERM terminates
        # os.write, not print: the handler may interrupt a print to stderr (reentrant write)
        os.write(2, b"swarmjax: SIGTERM: stopping at the end of the current step with a checkpoint "
                    b"(send SIGTERM again to stop at once)\n")

    # ------------------------------------------------------------------ queries
    def reached(self) -> bool:
        """Whether to stop at this safe point. Every process must call this at the same
        safe points (it may synchronise them)."""
        if not self.enabled:
            return False
        if self._multi:
            import numpy as np
            from jax.experimental import multihost_utils

            flags = multihost_utils.process_allgather(np.asarray([self.requested], np.int32))
            return bool(np.asarray(flags).any())
        return self.requested

