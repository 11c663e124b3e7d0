"""Orchestration traces of the token world's rollouts (:class:`~swarmjax.swarm.engine.SwarmRollout`).

The engine's result, as the one result type (:func:`swarmjax.swarm.outcome.text_result`),
goes through the reference simulator's per-episode format
(:func:`swarmjax.swarm.outcome.to_outcomes`) into
:func:`swarmjax.traces.export.trace_from_outcome`, with the caller's reward channels
(e.g. every PARL channel) and a measured wall-clock time.

``costs.wall_clock_s`` of a rollout trace: the rollout batch's wall time, measured
around the jitted call until its results were ready with JAX's tracing and compilation
time taken out (:func:`swarmjax.traces.timing.stopwatch`), divided evenly by the
batch's B episodes. The B episodes run in lockstep in one program, so one episode's
own time cannot be measured; ``T / B`` is what each cost at the measured throughput.
The batch's own numbers are kept beside it: ``batch_wall_clock_s`` (T) and
``batch_episodes`` (B).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from swarmjax.envs import widesearch_jax as wsj
from swarmjax.envs.widesearch import WideSearchConfig
from swarmjax.swarm.outcome import episodes, to_outcomes
from swarmjax.swarm.text_types import TextRolloutResult
from swarmjax.traces.export import trace_from_outcome


def rollout_traces(cfg: WideSearchConfig, problems: Sequence[dict], res: TextRolloutResult, *,
                   rewards: dict[str, Any], wall_clock_s: float, prefix: str = "ep",
                   limit: int | None = None) -> list[dict[str, Any]]:
    """Traces of the first ``limit`` (default: all) of a rollout's B episodes (``problems``:
    their tasks, :func:`~swarmjax.envs.widesearch_jax.problems`), ids ``{prefix}-{b}``
    (task ids ``{prefix}-task-{b}``).

    ``rewards``: channel name -> per-episode values [B] (e.g. PARL's channels and the
    total ``reward``); ``wall_clock_s``: the whole batch's measured seconds (see the
    module docstring), charged ``1 / B`` to each episode."""
    outs = to_outcomes(cfg, res)
    B = len(outs)
    chans = {k: np.broadcast_to(np.asarray(v, np.float64), (B,)) for k, v in rewards.items()}
    count = B if limit is None else min(limit, B)
    batch = {"batch_wall_clock_s": float(wall_clock_s), "batch_episodes": B}
    eps = episodes(wsj.stack(list(problems[:count])))
    return [trace_from_outcome(cfg, eps[b], outs[b], {k: float(v[b]) for k, v in chans.items()},
                               f"{prefix}-{b}", f"{prefix}-task-{b}", wall_clock_s / max(B, 1),
                               extra_costs=batch)
            for b in range(count)]

