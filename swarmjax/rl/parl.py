"""PARL reward shaping (Parallel-Agent RL, Kimi K2.5 Agent Swarm; DESIGN.md section 3).

    r = r_perf + lambda1(t) r_parallel + lambda2(t) r_finish - c * total_steps

* ``r_perf``: item-level F1 of the answered (entity, value) pairs against the truth;
  0 when the episode ended without an answer.
* ``r_parallel = min(novel, parallel_target) / parallel_target``: rewards
  instantiating sub-agents (against serial collapse). ``novel`` counts the
  sub-agents whose spawn block holds at least one asked-for entity that no earlier
  sub-agent of the episode was given: a bonus per *spawn* is hacked by spawning
  many sub-agents on the same entity (seen in our runs: all of them return, so
  ``r_finish`` does not object), a bonus per new piece of work is not.
* ``r_finish = finished / spawned`` (0 when nothing was spawned): rewards sub-agents
  that return (against spurious parallelism).
* ``lambda1``, ``lambda2`` anneal from their initial values to 0 over
  ``anneal_steps`` (linear or cosine), so the final policy optimises task
  performance alone; ``c`` is a small per-step compute cost.

The closed forms of ``r_parallel`` / ``r_finish`` are not published; these are ours.
All functions are pure JAX over per-episode arrays ``[B]``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

Array = jax.Array

SCHEDULES: dict[str, Callable[[Array], Array]] = {
    "linear": lambda frac: 1.0 - frac,
    "cosine": lambda frac: 0.5 * (1.0 + jnp.cos(math.pi * frac)),
}


@dataclasses.dataclass(frozen=True)
class PARLConfig:
    lambda1: float = 0.3          # initial weight of r_parallel
    lambda2: float = 0.3          # initial weight of r_finish
    anneal_steps: int = 200       # both reach 0 here
    schedule: str = "linear"      # key of SCHEDULES
    parallel_target: int = 8      # sub-agents at which r_parallel saturates
    step_cost: float = 0.005      # c

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; known: {sorted(SCHEDULES)}")
        if self.anneal_steps < 1 or self.parallel_target < 1:
            raise ValueError("anneal_steps and parallel_target must be >= 1")


def anneal(initial: float, step: Array, cfg: PARLConfig) -> Array:
    """``initial * s(min(step / anneal_steps, 1))`` with s the configured schedule (1 -> 0)."""
    frac = jnp.clip(jnp.asarray(step, jnp.float32) / cfg.anneal_steps, 0.0, 1.0)
    return initial * SCHEDULES[cfg.schedule](frac)


def item_f1(correct: Array, answered: Array, truth: Array, has_answer: Array) -> Array:
    """Item-level F1 from counts [B]: correct pairs, distinct answered pairs, true pairs."""
    precision = correct / jnp.maximum(answered, 1)
    recall = correct / jnp.maximum(truth, 1)
    f1 = 2 * precision * recall / jnp.maximum(precision + recall, 1e-9)
    return jnp.where(has_answer & (correct > 0), f1, 0.0)


def parl_reward(f1: Array, spawned: Array, finished: Array, total_steps: Array, step: Array,
                cfg: PARLConfig, novel: Array | None = None) -> tuple[Array, dict[str, Array]]:
    """Total reward [B] and each channel [B] (``r_perf``, ``r_parallel``, ``r_finish``,
    ``cost``) plus the current ``lambda1`` / ``lambda2``. ``novel`` [B]: sub-agents
    given new asked-for work (default: every spawned one)."""
    spawned = spawned.astype(jnp.float32)
    novel = spawned if novel is None else novel.astype(jnp.float32)
    r_parallel = jnp.minimum(novel, cfg.parallel_target) / cfg.parallel_target
    r_finish = jnp.where(spawned > 0, finished / jnp.maximum(spawned, 1.0), 0.0)
    cost = cfg.step_cost * total_steps.astype(jnp.float32)
    l1, l2 = anneal(cfg.lambda1, step, cfg), anneal(cfg.lambda2, step, cfg)
    reward = f1 + l1 * r_parallel + l2 * r_finish - cost
    return reward, {"r_perf": f1, "r_parallel": r_parallel, "r_finish": r_finish, "cost": cost,
                    "lambda1": l1, "lambda2": l2}
