"""Checkpoints of a warm start in progress: a stopped warm start continues where it was.

A warm start of a few thousand steps is most of a CPU run's wall clock and a long stretch
of a pod's; without these, a preemption during it threw all of it away. While a job's
warm start runs it saves, every ``CheckpointConfig.warm_every`` steps and at a
preemption notice, into ``<workdir>/warm_start_steps/<steps done>/`` (orbax, through
:class:`~swarmjax.train.checkpoint.Checkpointer`: the newest kept):

* ``state``: ``{"params", "opt_state"}`` (the optimizer's moments and schedule position
  too, so the continued run takes the steps the uninterrupted one would);
* ``meta``: the steps done, the batch sampler's ``numpy`` generator state (the batches
  after a continue are the uninterrupted run's) and the job's warm-start identity
  (``job.warm_identity()``: a continue with another task, policy or SFT config is
  refused).

``--resume auto`` / ``latest`` on a workdir without an RL checkpoint continues from the
newest of them; a fresh start (``--resume never``) removes them. They are deleted once
the warm start is done (``<workdir>/warm_start/`` then holds its result).
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
from etils import epath

from swarmjax.train.checkpoint import Checkpointer, abstract_state
from swarmjax.train.frame import WARM_STEPS, check_identity, finished_step
from swarmjax.train.logs import say
from swarmjax.train.preemption import Preempted

__all__ = ["WarmSteps"]


class WarmSteps:
    """The warm start's checkpoints in ``<workdir>/warm_start_steps`` (module docstring).

    ``every``: steps between saves (0: only at a preemption notice); ``resume``: keep and
    continue from what an earlier attempt saved (False: remove it); ``identity``: the
    job's warm-start identity, saved and checked; ``watch``: the job's
    :class:`~swarmjax.train.preemption.PreemptionWatch` (None: never stops)."""

    def __init__(self, workdir: str, every: int, *, resume: bool, identity: dict[str, str],
                 watch: Any = None):
        self.workdir, self.every, self.identity, self.watch = str(workdir), every, identity, watch
        self.directory = os.path.join(os.path.abspath(self.workdir) if "://" not in self.workdir else self.workdir,
                                      WARM_STEPS)
        self._ckpt: Checkpointer | None = None
        if not resume:
            self.remove()
        self.step = finished_step(self.directory)          # steps the last attempt saved (None: none)

    def _checkpointer(self) -> Checkpointer:
        if self._ckpt is None:
            self._ckpt = Checkpointer(self.directory, save_every=max(self.every, 1), keep_last=1,
                                      best_metric=None)
        return self._ckpt

    def restore(self, params: Any, opt_state: Any, rng: np.random.Generator) -> tuple[int, Any, Any]:
        """(steps done, params, opt_state) of the newest save, laid out as the given ones,
        and ``rng`` set to its state then; (0, params, opt_state) when there is none."""
        if self.step is None:
            return 0, params, opt_state
        state, meta = self._checkpointer().restore(self.step, abstract_state({"params": params,
                                                                              "opt_state": opt_state}))
        check_identity(self.identity, meta["identity"], f"--resume (the warm start in {self.directory})",
                       "what does not change the warm start")
        rng.bit_generator.state = json.loads(meta["rng"])
        say(f"warm start: continuing from its checkpoint at step {self.step}")
        return self.step, state["params"], state["opt_state"]

    def after(self, done: int, params: Any, opt_state: Any, rng: np.random.Generator) -> None:
        """The end of warm-start step ``done`` (1-based): a save when ``every`` says so or
        a preemption notice arrived; at a notice, raise :class:`Preempted` once saved."""
        stop = self.watch is not None and self.watch.reached()
        if stop or (self.every > 0 and done % self.every == 0):
            self._checkpointer().save(done, {"params": params, "opt_state": opt_state},
                                      {"step": done, "rng": json.dumps(rng.bit_generator.state),
                                       "identity": self.identity}, force=True)
        if stop:
            self._checkpointer().wait()
            raise Preempted(None, self.workdir, warm_step=done)

    def close(self) -> None:
        """Wait for a save in flight."""
        if self._ckpt is not None:
            self._ckpt.close()
            self._ckpt = None

    def remove(self) -> None:
        """Delete the saves (the warm start is done, or a fresh start); every process
        calls this (process 0 deletes, the others wait for it)."""
        self.close()
        if jax.process_index() == 0 and epath.Path(self.directory).exists():
            epath.Path(self.directory).rmtree()
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("swarmjax-warm-steps-removed")
        self.step = None
