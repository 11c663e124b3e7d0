"""The two roles of a swarm as one record: whatever an orchestrator and its sub-agents
each have (params, model configs, sampling settings, context sizes) travels as
``Roles(orchestrator=..., subagents=...)`` instead of an ``orch_*`` / ``worker_*`` pair.

``Roles`` is a pytree (both fields are children), so ``Roles`` of params go through
``jax.jit``, ``jax.tree.map`` and sharding like any pytree; it is a frozen, hashable
dataclass, so ``Roles`` of ints or configs sit in static configs and ``--set`` reaches
each side (``--set rl.rollout.contexts.subagents=256``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import jax

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Roles(Generic[T]):
    """The orchestrator's and the sub-agents' values of one thing.

    orchestrator: the trained agent's (the one whose tokens the loss reads).
    subagents: what every sub-agent shares (frozen by default)."""

    orchestrator: T
    subagents: T

    @classmethod
    def both(cls, value: T) -> Roles[T]:
        """The same ``value`` for both roles (e.g. one model config, the start's params)."""
        return cls(value, value)

    @classmethod
    def of(cls, value: T | Roles[T]) -> Roles[T]:
        """``value`` itself if it is a ``Roles``, else :meth:`both` of it."""
        return value if isinstance(value, Roles) else cls.both(value)

    def map(self, fn: Callable[..., Any], *others: Roles) -> Roles:
        """``Roles(fn(self.orchestrator, *o.orchestrator), fn(self.subagents, *o.subagents))``."""
        return Roles(fn(self.orchestrator, *(o.orchestrator for o in others)),
                     fn(self.subagents, *(o.subagents for o in others)))


jax.tree_util.register_dataclass(Roles, data_fields=["orchestrator", "subagents"], meta_fields=[])
