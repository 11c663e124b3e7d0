"""Asynchronous RL: rollouts overlapped with learner updates, bounded staleness, and
every task trained on exactly once across kills and resumes.

The synchronous loop rolls out batch j with the policy after j updates, then updates
on it. With ``AsyncConfig(depth=D)`` the rollouts of the next D batches run while the
learner updates, in a worker thread (JAX releases the GIL while a program runs; with
``rollout_devices`` the two run on disjoint devices):

    learner:  update(0)       update(1)       update(2)      ...
    rollout:  roll(1, v = 0)  roll(2, v = 1)  roll(3, v = 2) ...     (D = 1, sync_every = 1)

**Versions.** The policy version ``v`` is the number of updates applied. The learner
pushes its weights to the rollout every ``sync_every`` updates (a copy placed on the
rollout's devices: the update donates its state). A rolled-out batch records the
version it decoded with for every sampled token (``versions`` [B, T] int32, -1 off the
loss mask); its staleness when trained on is the learner's version minus its oldest
token's, at most ``depth + sync_every - 1``. A batch staler than ``max_staleness`` is not
trained on: dropped and counted (``on_stale="drop"``) or rolled out again with the
learner's weights (``"regenerate"``). The sampler's log-probs travel with the batch: the
learner's ``LossConfig.is_cap`` / ``is_mode`` correct the mismatch
(:mod:`swarmjax.rl.losses`), its ``mismatch_kl`` measures it.

**Exactly once.** Batches are drawn from the job's task stream in order; each in-flight
batch keeps the stream's state from before it was drawn and its task ids.
:meth:`AsyncRollouts.checkpoint` returns the stream state of the oldest batch not yet
trained on, the queue's ids and the version; a resumed job restores that stream state,
so it draws, rolls out and trains those batches again, every task of the stream once.
They are rolled out with the restored policy, not the stale weights an uninterrupted
run would have used: a resumed asynchronous run continues exactly-once but not
bit-identically (the synchronous loop resumes bit for bit).

``depth=0`` is not this module: jobs keep their synchronous loop, unchanged.
Several processes are refused (each process's rollout thread would issue collectives
in its own order).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

STALE = ("drop", "regenerate")


@dataclasses.dataclass(frozen=True)
class AsyncConfig:
    """Rollouts overlapped with updates (the module docstring).

    depth: rollout batches in flight ahead of the learner; 0: the synchronous loop.
    sync_every: learner updates between weight pushes to the rollout.
    max_staleness: a batch more updates old than this is not trained on (None:
      ``depth + sync_every - 1``, the most the schedule produces: never).
    on_stale: ``"drop"`` (counted in ``async/dropped``) or ``"regenerate"`` (rolled out
      again, synchronously, with the learner's weights).
    rollout_devices: the rollout runs on the last N devices, the learner on the others
      (0: both on the job's devices).
    """

    depth: int = 0
    sync_every: int = 1
    max_staleness: int | None = None
    on_stale: str = "drop"
    rollout_devices: int = 0

    def __post_init__(self):
        if self.depth < 0 or self.sync_every < 1 or self.rollout_devices < 0:
            raise ValueError(f"async_rollout: need depth >= 0, sync_every >= 1, rollout_devices >= 0; got {self}")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"async_rollout.max_staleness must be >= 0 or None, got {self.max_staleness}")
        if self.on_stale not in STALE:
            raise ValueError(f"async_rollout.on_stale must be one of {', '.join(STALE)}, got {self.on_stale!r}")

    @property
    def enabled(self) -> bool:
        return self.depth > 0

    @property
    def bound(self) -> int:
        """The staleness bound in force."""
        return self.depth + self.sync_every - 1 if self.max_staleness is None else self.max_staleness

    def check(self, device_count: int, process_count: int) -> None:
        """One-line errors for a setting this machine cannot run."""
        if not self.enabled:
            if self.rollout_devices:
                raise ValueError("async_rollout.rollout_devices needs async_rollout.depth >= 1")
            return
        if process_count > 1:
            raise ValueError(f"asynchronous RL runs in one process ({process_count} given): use a mesh of its "
                             "devices, or async_rollout.depth=0")
        if self.rollout_devices >= device_count:
            raise ValueError(f"async_rollout.rollout_devices={self.rollout_devices} leaves the learner none of the "
                             f"{device_count} devices")


def logged_update(update: Any, cfg: AsyncConfig) -> Any:
    """An ``UpdateConfig`` whose loss logs the sampler / learner mismatch
    (``LossConfig.log_mismatch``) when ``cfg`` is asynchronous; else ``update`` itself."""
    if not cfg.enabled or update.loss.log_mismatch:
        return update
    return dataclasses.replace(update, loss=dataclasses.replace(update.loss, log_mismatch=True))


def split_devices(cfg: AsyncConfig) -> tuple[list, list | None]:
    """(the learner's devices, the rollout's or None when they share them)."""
    devices = jax.devices()
    if not cfg.rollout_devices:
        return devices, None
    return devices[:-cfg.rollout_devices], devices[-cfg.rollout_devices:]


def token_versions(loss_mask: np.ndarray, version: int) -> np.ndarray:
    """[B, T] int32: ``version`` on the sampled tokens (``loss_mask``), -1 elsewhere."""
    return np.where(np.asarray(loss_mask), np.int32(version), np.int32(-1))


def staleness_of(versions: np.ndarray, learner_version: int, decoded_with: int) -> int:
    """The learner's version minus the oldest sampled token's (``decoded_with``, the
    rollout's version, for a batch with no sampled token left: dynamic sampling)."""
    sampled = versions[versions >= 0]
    return int(learner_version - (sampled.min() if sampled.size else decoded_with))


@dataclasses.dataclass
class InFlight:
    """One batch of the stream between its draw and its update."""

    step: int                 # its index in the stream of batches (the training step it feeds)
    version: int              # the policy version its rollout decodes with
    tasks: Any                # what the job's collect() takes
    ids: list[str]            # its task ids (JSON-able)
    stream_state: Any         # the task stream's state before it was drawn
    future: concurrent.futures.Future


@dataclasses.dataclass
class Ready:
    """A batch ready for the learner: ``collected`` (the job's collect() output),
    ``versions`` [B, T] of its sampled tokens, ``staleness`` now, whether it is trained on
    and whether it was rolled out again."""

    step: int
    ids: list[str]
    collected: Any
    versions: np.ndarray
    staleness: int
    learner_version: int      # the learner's version when it took the batch
    train: bool
    regenerated: bool
    wait_s: float             # how long the learner waited for it


class AsyncRollouts:
    """The rollout side of an asynchronous job: a queue of in-flight batches.

    ``draw()`` -> (tasks, ids): the stream's next batch; ``stream_state()``: the stream's
    state now; ``collect(step, tasks, params, frozen)`` -> the job's learner input (run in
    the worker thread, returning once its arrays are ready; ``frozen``: the frozen
    sub-agents' params, or None); ``loss_mask(collected)`` -> its [B, T] sampled-token
    mask; ``publish(params)`` -> a copy of the learner's params (or the frozen ones) for
    the rollout (on its devices).

    >>> rollouts = AsyncRollouts(cfg, draw=..., stream_state=..., collect=..., loss_mask=..., publish=...)
    >>> rollouts.begin(state.params, step=start, steps=steps, version=0)
    >>> for step in range(start, steps):
    ...     ready = rollouts.take(state.params)
    ...     if ready.train:
    ...         state, m = learn(state, ready.collected); rollouts.trained(state.params)
    """

    def __init__(self, cfg: AsyncConfig, *, draw: Callable[[], tuple[Any, list[str]]],
                 stream_state: Callable[[], Any], collect: Callable[[int, Any, Any], Any],
                 loss_mask: Callable[[Any], np.ndarray], publish: Callable[[Any], Any]):
        if not cfg.enabled:
            raise ValueError("AsyncRollouts needs async_rollout.depth >= 1 (0 is the synchronous loop)")
        self.cfg = cfg
        self._draw, self._stream_state, self._collect = draw, stream_state, collect
        self._loss_mask, self._publish = loss_mask, publish
        self.queue: collections.deque[InFlight] = collections.deque()
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="swarmjax-rollout")
        self.version = 0                  # the learner's: updates applied
        self.pushed: tuple[Any, int] | None = None
        self.frozen: Any = None           # the frozen sub-agents' params, published
        self.next_step = self.steps = 0
        self.dropped = self.regenerated = 0

    def begin(self, params: Any, *, step: int, steps: int, frozen: Any = None, version: int = 0, dropped: int = 0,
              regenerated: int = 0) -> None:
        """Start at training step ``step`` of ``steps`` with the learner at ``version``
        (a resumed job: :meth:`checkpoint`'s counts); ``frozen``: the sub-agents' params
        (None: the job's collect() has none, or uses the policy's)."""
        self.version, self.next_step, self.steps = version, step, steps
        self.refresh(frozen)
        self.dropped, self.regenerated = dropped, regenerated
        self.pushed = (self._publish(params), version)

    def _fill(self) -> None:
        """Launch rollouts until ``depth + 1`` batches are in flight (or the stream's end)."""
        while len(self.queue) <= self.cfg.depth and self.next_step < self.steps:
            before = self._stream_state()
            tasks, ids = self._draw()
            params, version = self.pushed
            step = self.next_step
            self.queue.append(InFlight(step, version, tasks, list(ids), before,
                                       self.pool.submit(self._collect, step, tasks, params, self.frozen)))
            self.next_step += 1

    def take(self, params: Any) -> Ready:
        """The oldest batch, once rolled out (the next ones launched first, so they run
        while the learner trains on this one); ``params``: the learner's, for a regeneration."""
        self._fill()
        if not self.queue:
            raise RuntimeError("no batch left: the stream's steps are done")
        b = self.queue.popleft()
        t0 = time.perf_counter()
        collected = b.future.result()
        wait = time.perf_counter() - t0
        versions = token_versions(self._loss_mask(collected), b.version)
        stale = staleness_of(versions, self.version, b.version)
        train, regenerated = stale <= self.cfg.bound, False
        if not train and self.cfg.on_stale == "regenerate":
            fresh = self._publish(params)
            collected = self._collect(b.step, b.tasks, fresh, self.frozen)
            versions = token_versions(self._loss_mask(collected), self.version)
            stale, train, regenerated = 0, True, True
            self.regenerated += 1
        elif not train:
            self.dropped += 1
        return Ready(b.step, b.ids, collected, versions, stale, self.version, train, regenerated, wait)

    def trained(self, params: Any) -> None:
        """After an update: the learner's version advances; its weights go to the rollout
        every ``sync_every`` updates."""
        self.version += 1
        if self.version % self.cfg.sync_every == 0:
            self.pushed = (self._publish(params), self.version)

    def refresh(self, frozen: Any) -> None:
        """New frozen sub-agents (:class:`SubagentRefresh`) for the batches launched from now on."""
        self.frozen = None if frozen is None else self._publish(frozen)

    def step(self, state: Any, learn: Callable[[Any, Any], tuple[Any, dict]],
             untrained: Callable[[Any], dict]) -> tuple[Any, dict]:
        """One asynchronous training step: the oldest batch in flight
        (:meth:`take`), ``learn(state, collected)`` on it unless it is staler than the
        bound (then ``untrained(collected)``: its rollout figures alone), the weights
        pushed (:meth:`trained`). Metrics: the step's, :meth:`figures`, and ``tasks``
        (the batch's task ids)."""
        ready = self.take(state.params)
        if ready.train:
            state, metrics = learn(state, ready.collected)
            self.trained(state.params)
        else:
            metrics = untrained(ready.collected)
        return state, {**metrics, **self.figures(ready), "tasks": ready.ids}

    def figures(self, ready: Ready) -> dict[str, float]:
        """The step's ``async/`` metrics: the learner's version the batch met, its
        staleness (oldest token) and its tokens' mean staleness, whether it was trained
        on, the drop / regeneration counts so far, the learner's wait for it, the batches
        still in flight."""
        sampled = ready.versions[ready.versions >= 0]
        v = ready.learner_version
        return {"async/version": v, "async/staleness": ready.staleness,
                "async/token_staleness": float(np.mean(v - sampled)) if sampled.size else float(ready.staleness),
                "async/trained": int(ready.train), "async/dropped": self.dropped,
                "async/regenerated": self.regenerated, "async/wait_s": ready.wait_s,
                "async/in_flight": len(self.queue)}

    def checkpoint(self) -> dict[str, Any]:
        """What a checkpoint keeps (JSON): the stream's state before the oldest batch not
        yet trained on, the in-flight batches' steps and task ids, the version and counts."""
        return {"stream": self.queue[0].stream_state if self.queue else self._stream_state(),
                "queue": [{"step": b.step, "version": b.version, "ids": b.ids} for b in self.queue],
                "version": self.version, "dropped": self.dropped, "regenerated": self.regenerated}

    def close(self) -> None:
        """Stop the worker (a rollout in flight finishes first; its batch is discarded)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.queue.clear()
