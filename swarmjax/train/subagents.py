"""Refreshed sub-agents: the frozen sub-agents replaced by a copy of the policy at
chosen training steps.

Kimi K2.5 (arXiv 2602.02276) instantiates its frozen sub-agents from fixed intermediate
policy checkpoints rather than the model RL started from. :class:`SubagentRefresh` names
those checkpoints by training step (``at``) or a period (``every``); after such a step the
job's ``TrainState.frozen[name]`` becomes a copy of ``state.params``, so the checkpoint
that follows carries the new sub-agents and a resumed run continues with them. The
default, nothing, keeps the sub-agents the job started with.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from swarmjax.models.lora import frozen_part


@dataclasses.dataclass(frozen=True)
class SubagentRefresh:
    """every: after every N training steps (0: never); at: after these training steps."""

    every: int = 0
    at: tuple[int, ...] = ()

    def __post_init__(self):
        if self.every < 0 or any(s < 1 for s in self.at):
            raise ValueError(f"refresh_subagents: need every >= 0 and steps in at >= 1, got {self}")

    @property
    def enabled(self) -> bool:
        """Whether the frozen sub-agents are ever replaced (then they are not the warm start)."""
        return bool(self.every or self.at)

    def due(self, done: int) -> bool:
        """Whether the sub-agents become the policy after ``done`` training steps."""
        return bool(self.every and done % self.every == 0) or done in self.at


def refresh_subagents(state: Any, name: str) -> Any:
    """``state`` (a ``TrainState``) with ``frozen[name]`` replaced by a copy of its params
    (a copy: the learner's update donates the state's buffers; same shardings); with LoRA
    a copy of the adapters alone (:func:`~swarmjax.models.lora.frozen_part`)."""
    if not state.frozen or name not in state.frozen:
        raise ValueError(f"refresh_subagents: the state has no frozen {name!r} sub-agents to refresh")
    return state.replace(frozen={**state.frozen, name: jax.tree.map(jnp.copy, frozen_part(state.params))})
