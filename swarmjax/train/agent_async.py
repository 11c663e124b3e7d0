"""The text jobs' asynchronous RL stage: :class:`~swarmjax.train.async_rl.AsyncRollouts`
over :func:`swarmjax.train.agent_rl.collect` (the agent job, on either engine)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.models.lora import over_base
from swarmjax.rl.update import TrainState
from swarmjax.roles import Roles
from swarmjax.train.agent import TextRLConfig
from swarmjax.train.agent_rl import collect
from swarmjax.train.async_rl import AsyncRollouts, split_devices
from swarmjax.train.engines import Engine


def async_rollouts(rcfg: TextRLConfig, engine: Engine, state: TrainState, *, draw: Callable[[], tuple[list, list]],
                   stream_state: Callable[[], Any], key: jax.Array, step: int, saved: dict | None,
                   subagents: str = "frozen") -> AsyncRollouts:
    """The rollout side of an asynchronous text RL stage (:mod:`swarmjax.train.async_rl`)
    begun at training ``step`` of ``rcfg.steps`` (``saved``: a resumed run's
    ``AsyncRollouts.checkpoint()``); batch j is rolled out with the synchronous step's key
    (``engine.step_key(key, j)``). The rollout decodes with the engine's ``publish`` of the
    params when it has one, else with copies on the last device when
    ``rcfg.async_rollout.rollout_devices`` is 1, on the params' own devices otherwise;
    frozen sub-agents are copied there once."""
    _, devices = split_devices(rcfg.async_rollout)

    def copy(params):             # the learner donates its state: a copy
        if devices is None:
            return jax.tree.map(jnp.copy, params)
        return jax.device_put(params, jax.sharding.SingleDeviceSharding(devices[0]))

    def collect_step(j, problems, params, frozen):        # frozen None: the sub-agents decode with the policy
        roles = Roles(params, params if frozen is None else over_base(frozen, params))   # LoRA: adapters over one base
        return collect(engine, roles, problems, engine.step_key(key, j), rcfg, step=j, subagents=subagents)

    rollouts = AsyncRollouts(rcfg.async_rollout, draw=draw, stream_state=stream_state, collect=collect_step,
                             loss_mask=lambda c: np.asarray(c.batch.loss_mask), publish=engine.publish or copy)
    saved = saved or {}
    has_frozen = bool(state.frozen) and "subagents" in state.frozen
    rollouts.begin(state.params, step=step, steps=rcfg.steps, version=saved.get("version", 0),
                   frozen=state.frozen["subagents"] if has_frozen else None,
                   dropped=saved.get("dropped", 0), regenerated=saved.get("regenerated", 0))
    return rollouts
