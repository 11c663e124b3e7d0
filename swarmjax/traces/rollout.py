"""Orchestration traces of jitted swarm rollouts (:class:`~swarmjax.swarm.engine.SwarmRollout`).

The engine's :class:`~swarmjax.swarm.engine.RolloutResult` goes through the reference
simulator's per-episode format (:func:`swarmjax.swarm.outcome.to_outcomes`) into
:func:`swarmjax.traces.export.trace_from_outcome`, with every PARL reward channel and a
measured wall-clock time.

``costs.wall_clock_s`` of a rollout trace: the rollout batch's wall time, measured
around the jitted call until its results were ready with JAX's tracing and compilation
time taken out (:func:`swarmjax.traces.timing.stopwatch`), divided evenly by the
batch's B episodes. The B episodes run in lockstep in one program, so one episode's
own time cannot be measured; ``T / B`` is what each cost at the measured throughput.
The batch's own numbers are kept beside it: ``batch_wall_clock_s`` (T) and
``batch_episodes`` (B).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from swarmjax.envs import widesearch_jax as wsj
from swarmjax.envs.widesearch import WideSearchConfig
from swarmjax.rl.parl import PARLConfig
from swarmjax.swarm.engine import RolloutResult
from swarmjax.swarm.outcome import episode_rewards, episodes, to_outcomes
from swarmjax.traces.export import trace_from_outcome


def reward_channels(result: RolloutResult, pcfg: PARLConfig, step: int) -> dict[str, np.ndarray]:
    """Every PARL reward channel per episode, host arrays [B]: ``reward`` (the total the
    learner would use at training step ``step``), ``r_perf`` (item-F1), ``r_parallel``,
    ``r_finish``, ``cost`` (``c * total_steps + c_crit * critical_steps``) and the
    schedule's weights at ``step``, ``lambda1`` and ``lambda2`` (the same for every
    episode), so ``reward = r_perf + lambda1 r_parallel + lambda2 r_finish - cost``."""
    reward, channels = jax.device_get(episode_rewards(result, pcfg, step))
    B = np.shape(reward)[0]
    out = {"reward": np.asarray(reward, np.float64)}
    out.update({k: np.broadcast_to(np.asarray(v, np.float64), (B,)) for k, v in sorted(channels.items())})
    return out


def rollout_traces(cfg: WideSearchConfig, tasks: wsj.Tasks, result: RolloutResult, *,
                   rewards: dict[str, Any], wall_clock_s: float, prefix: str = "ep",
                   limit: int | None = None) -> list[dict[str, Any]]:
    """Traces of the first ``limit`` (default: all) of a rollout's B episodes, ids
    ``{prefix}-{b}`` (task ids ``{prefix}-task-{b}``).

    ``rewards``: channel name -> per-episode values [B] (e.g. :func:`reward_channels`);
    ``wall_clock_s``: the whole batch's measured seconds (see the module docstring),
    charged ``1 / B`` to each episode."""
    outs, eps = to_outcomes(cfg, result), episodes(tasks)
    B = len(outs)
    chans = {k: np.broadcast_to(np.asarray(v, np.float64), (B,)) for k, v in rewards.items()}
    count = B if limit is None else min(limit, B)
    batch = {"batch_wall_clock_s": float(wall_clock_s), "batch_episodes": B}
    return [trace_from_outcome(cfg, eps[b], outs[b], {k: float(v[b]) for k, v in chans.items()},
                               f"{prefix}-{b}", f"{prefix}-task-{b}", wall_clock_s / max(B, 1),
                               extra_costs=batch)
            for b in range(count)]
