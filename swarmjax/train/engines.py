"""Rollout engines behind one call: what the RL step and the evaluation run episodes with.

An *engine* turns problems into a :class:`~swarmjax.swarm.text_types.TextRolloutResult`
(the one result type of every text rollout)::

    engine(orch_params, worker_params, problems, key, *, episode_ids, greedy) -> TextRolloutResult

* :class:`HostEngine`: :class:`~swarmjax.swarm.text_rollout.TextRollout`, the host-driven
  rollout that runs any task's Python tools (``make(problem) -> HostEnv``); a sampling
  rollout and a greedy one (both roles at temperature 0, for evaluations).
* :class:`DeviceEngine`: :class:`~swarmjax.swarm.text_engine.TextSwarm`, the whole swarm
  in one jitted program (tool calls parsed and answered on the device), for tasks with a
  device twin; greedy calls lift the critical-step budget, as evaluations do. Its
  result's ``rewards["n"]`` holds each task's size (the count of the PARL reward's
  ``r_parallel="coverage"``).

``batch``: the episode count an engine's calls are compiled for (None: any). The
evaluation (:func:`swarmjax.train.agent.evaluate`) runs its episodes in calls of that
size, the last one filled with repeats, so evaluations reuse the training rollout's
compiled program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from swarmjax.swarm.text_types import TextRolloutResult


class Engine(Protocol):
    """What the RL step and the evaluation call (module docstring)."""

    batch: int | None

    def __call__(self, orch_params: Any, worker_params: Any, problems: Sequence[Any], key: jax.Array, *,
                 episode_ids: range, greedy: bool = False) -> TextRolloutResult: ...


@dataclasses.dataclass
class HostEngine:
    """:class:`~swarmjax.swarm.text_rollout.TextRollout` over fresh environments
    ``make(problem)``: ``rollout`` samples, ``greedy_rollout`` (None: ``rollout``) runs the
    greedy calls. Episode ``e`` draws its tokens from ``fold_in(key, episode_ids[e])``, so
    a share of the episodes run on one process samples what one process would."""

    rollout: Any
    make: Callable[[Any], Any]
    greedy_rollout: Any = None
    batch: int | None = None

    def __call__(self, orch_params, worker_params, problems, key, *, episode_ids, greedy=False):
        run = self.greedy_rollout if greedy and self.greedy_rollout is not None else self.rollout
        return run(orch_params, worker_params, [self.make(p) for p in problems], list(problems), key,
                   episode_ids=episode_ids)

    def close(self) -> None:
        self.rollout.close()
        if self.greedy_rollout is not None and self.greedy_rollout is not self.rollout:
            self.greedy_rollout.close()


@dataclasses.dataclass
class DeviceEngine:
    """:class:`~swarmjax.swarm.text_engine.TextSwarm` on episodes of its task; greedy
    calls lift the budget (``budget=None``). ``batch``: the training step's episode count
    (one compiled program for rollouts and evaluations). One process: the keys are the
    call's, not per episode."""

    swarm: Any
    batch: int | None = None

    def __call__(self, orch_params, worker_params, problems, key, *, episode_ids=None, greedy=False):
        res = self.swarm(orch_params, worker_params, list(problems), key, greedy=greedy,
                         **({"budget": None} if greedy else {}))
        n = np.asarray([len(p.task) for p in problems], np.float32)
        return dataclasses.replace(res, rewards={**res.rewards, "n": n})

    def close(self) -> None:
        pass
