"""Rollout engines behind one call: what the RL step and the evaluation run episodes with.

An *engine* turns problems into a :class:`~swarmjax.swarm.text_types.TextRolloutResult`
(the one result type of every text rollout)::

    engine(params, problems, key, *, episode_ids, greedy) -> TextRolloutResult

``params``: a :class:`~swarmjax.roles.Roles` of the orchestrator's and the
sub-agents' params.

* :class:`HostEngine`: :class:`~swarmjax.swarm.text_rollout.TextRollout`, the host-driven
  rollout that runs any task's Python tools (``make(problem) -> HostEnv``); a sampling
  rollout and a greedy one (both roles at temperature 0, for evaluations).
* :class:`DeviceEngine`: :class:`~swarmjax.swarm.text_engine.TextSwarm`, the whole swarm
  in one jitted program (tool calls parsed and answered on the device), for tasks with a
  device twin; greedy calls lift the critical-step budget, as evaluations do. Its
  result's ``rewards["n"]`` holds each problem's size (``size(problem)``: the count of
  the PARL reward's ``r_parallel="coverage"``).

* :class:`TokenEngine`: the token world's jitted swarm
  (:class:`~swarmjax.swarm.engine.SwarmRollout`: its own fast program, every episode's
  rows over the mesh as one global batch), its result adapted onto the one type
  (:func:`~swarmjax.swarm.outcome.text_result`); greedy calls lift the budget.

* :class:`JudgedEngine`: either of them with an LLM judge's reward (:mod:`swarmjax.rl.judge`)
  mixed into ``r_perf`` on training calls; greedy calls (evaluations) keep the verifier's
  ``r_perf`` and log the judge beside it.

``batch``: the episode count an engine's calls are compiled for (None: any). The
evaluation (:func:`swarmjax.train.agent_eval.evaluate`) runs its episodes in calls of that
size, the last one filled with repeats, so evaluations reuse the training rollout's
compiled program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from swarmjax.roles import Roles
from swarmjax.swarm.text_types import SwarmConfig, TextRolloutResult


class Engine(Protocol):
    """What the RL step and the evaluation call (module docstring).

    whole_batch: every process passes a call's whole problems and keeps the rows of
      ``episode_ids`` (else each passes its own share).
    publish: the params the rollout decodes with, from the learner's (None: the job's
      default copy).
    step_key(rl_key, step): RL step ``step``'s rollout key."""

    batch: int | None
    whole_batch: bool
    publish: Callable[[Any], Any] | None

    def __call__(self, params: Roles, problems: Sequence[Any], key: jax.Array, *,
                 episode_ids: range, greedy: bool = False) -> TextRolloutResult: ...

    def step_key(self, rl_key: jax.Array, step: int) -> jax.Array: ...


class _Keys:
    """The defaults of :class:`Engine`: each process its share; step ``s`` rolls out with
    ``fold_in(rl_key, 100 + s)``."""

    whole_batch = False
    publish = None

    def step_key(self, rl_key: jax.Array, step: int) -> jax.Array:
        return jax.random.fold_in(rl_key, 100 + step)


@dataclasses.dataclass
class HostEngine(_Keys):
    """:class:`~swarmjax.swarm.text_rollout.TextRollout` over fresh environments
    ``make(problem)``: ``rollout`` samples, ``greedy_rollout`` (None: ``rollout``) runs the
    greedy calls. Episode ``e`` draws its tokens from ``fold_in(key, episode_ids[e])``, so
    a share of the episodes run on one process samples what one process would."""

    rollout: Any
    make: Callable[[Any], Any]
    greedy_rollout: Any = None
    batch: int | None = None

    def __call__(self, params, problems, key, *, episode_ids, greedy=False):
        run = self.greedy_rollout if greedy and self.greedy_rollout is not None else self.rollout
        return run(params, [self.make(p) for p in problems], list(problems), key,
                   episode_ids=episode_ids)

    def close(self) -> None:
        self.rollout.close()
        if self.greedy_rollout is not None and self.greedy_rollout is not self.rollout:
            self.greedy_rollout.close()


@dataclasses.dataclass
class DeviceEngine(_Keys):
    """:class:`~swarmjax.swarm.text_engine.TextSwarm` on episodes of its task; greedy
    calls lift the budget (``budget=None``). ``batch``: the training step's episode count
    (one compiled program for rollouts and evaluations). Episode ``e`` is keyed by its
    ``episode_ids[e]`` (with the swarm's ``episode_keys``), so a share of the episodes
    run on one process samples what one process would."""

    swarm: Any
    batch: int | None = None
    size: Callable[[Any], int] | None = None         # a problem's size (the task's size(problem)); None: 1

    @classmethod
    def over(cls, twin: Any, cfg: Any, rcfg: Any, *, episodes: int, size: Callable[[Any], int] | None = None,
             mesh: Any = None, swarm: SwarmConfig = SwarmConfig()) -> DeviceEngine:
        """The jitted swarm (:class:`~swarmjax.swarm.text_engine.TextSwarm`, ``swarm`` its
        :class:`~swarmjax.swarm.text_types.SwarmConfig`) over the device
        twin ``twin`` for calls of ``episodes`` episodes (a training step's), its rows over
        ``mesh``'s batch axes. With several processes each decodes
        its share (``episodes / processes``) on its first device with a local copy of the
        params (the swarm's ``episode_keys``: the ids one process would sample)."""
        from swarmjax.swarm.text_engine import TextSwarm

        procs = jax.process_count()
        return cls(TextSwarm(twin, cfg, rcfg, swarm=swarm, mesh=mesh if procs == 1 else None),
                   batch=episodes // procs, size=size)

    def __call__(self, params, problems, key, *, episode_ids=None, greedy=False):
        res = self.swarm(params, list(problems), key, greedy=greedy,
                         episode_ids=None if episode_ids is None else list(episode_ids),
                         **({"budget": None} if greedy else {}))
        n = np.asarray([1 if self.size is None else self.size(p) for p in problems], np.float32)
        return dataclasses.replace(res, rewards={**res.rewards, "n": n})

    def close(self) -> None:
        pass


@dataclasses.dataclass
class TokenEngine:
    """The token world's :class:`~swarmjax.swarm.engine.SwarmRollout` on problems of
    :func:`~swarmjax.envs.widesearch_jax.problems`: ``rollout`` samples,
    ``greedy_rollout`` runs the greedy calls (the budget lifted). ``whole_batch``: every
    process passes the whole call's problems (its tasks go on the rollout's ``mesh`` as one
    global batch, sampled from one key, as one process would) and ``episode_ids`` names the
    episodes whose rows it keeps, counted from the call's first. ``stats["seconds"]``: the
    rollout's wall time until its results were ready, compilation excluded
    (:func:`~swarmjax.traces.timing.stopwatch`). Step ``s`` rolls out with
    ``split(fold_in(fold_in(rl_key, 3), s))[1]``. ``publish``: the params laid out on the
    rollout's own devices (an asynchronous job's), or None."""

    rollout: Any
    greedy_rollout: Any
    batch: int | None = None
    publish: Callable[[Any], Any] | None = None
    whole_batch = True

    def step_key(self, rl_key: jax.Array, step: int) -> jax.Array:
        return jax.random.split(jax.random.fold_in(jax.random.fold_in(rl_key, 3), step))[1]

    def __call__(self, params, problems, key, *, episode_ids, greedy=False):
        from swarmjax.envs import widesearch_jax as wsj
        from swarmjax.swarm.outcome import text_result
        from swarmjax.traces.timing import stopwatch

        run = self.greedy_rollout if greedy else self.rollout
        with stopwatch() as clock:
            result = jax.block_until_ready(run(params, _on_mesh(wsj.stack(list(problems)), run.mesh), key))
        res = text_result(run.rcfg.env, result, slice(episode_ids.start, episode_ids.stop))
        res.stats["seconds"] = clock["seconds"]
        return res

    def close(self) -> None:
        pass


def _on_mesh(tasks: Any, mesh: Any) -> Any:
    """Host task arrays every process holds whole as one global batch over ``mesh``'s
    batch axes (one process, or no mesh: a plain device put)."""
    if jax.process_count() == 1 or mesh is None:
        return jax.tree.map(jax.numpy.asarray, tasks)
    from swarmjax.sharding.mesh import batch_sharding
    from swarmjax.train.distributed import global_whole

    return global_whole(tasks, jax.tree.map(lambda x: batch_sharding(mesh, np.ndim(x), batch_size=len(x)), tasks))


@dataclasses.dataclass
class JudgedEngine:
    """``engine`` whose episodes a :class:`~swarmjax.rl.judge.Judge` also scores (its
    ``judge(problem_text, answer)`` on every episode with an answer): on training calls
    ``r_perf`` becomes :func:`~swarmjax.rl.judge.mix_rewards`'s mix (the verifier's kept
    as ``r_verifier``); on greedy calls (evaluations) ``r_perf`` stays the verifier's, so
    accuracy stays the truth, and the judge's score is logged beside it (``judge``,
    ``judge/<rubric>``). ``stats["judge_unparseable"]``: score replies without a tag."""

    engine: Any
    judge: Any
    mix: Any
    text: Callable[[Any], str]

    @property
    def batch(self) -> int | None:
        return self.engine.batch

    @property
    def whole_batch(self) -> bool:
        return self.engine.whole_batch

    @property
    def publish(self) -> Callable[[Any], Any] | None:
        return self.engine.publish

    def step_key(self, rl_key: jax.Array, step: int) -> jax.Array:
        return self.engine.step_key(rl_key, step)

    def __call__(self, params, problems, key, *, episode_ids, greedy=False):
        from swarmjax.envs.task import reward_terms
        from swarmjax.rl.judge import RewardMix, mix_rewards

        res = self.engine(params, problems, key, episode_ids=episode_ids, greedy=greedy)
        scores = self.judge([self.text(p) for p in problems], res.answers, key=jax.random.fold_in(key, 0x7e57))
        mix = RewardMix(verifier=1.0, judge=0.0) if greedy else self.mix
        rewards = mix_rewards(reward_terms(res.rewards, len(res.length)), scores, mix)
        stats = {**res.stats, "judge_unparseable": int(sum(scores.unparseable.values()))}
        return dataclasses.replace(res, rewards=rewards, stats=stats)

    def close(self) -> None:
        self.engine.close()
