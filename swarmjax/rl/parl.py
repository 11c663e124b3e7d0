"""PARL reward shaping (Parallel-Agent RL, Kimi K2.5 Agent Swarm, arXiv 2602.02276; docs/design.md section 6).

    r = r_perf + lambda1(t) r_parallel + lambda2(t) r_finish - c * total_steps - c_crit * critical_steps

* ``r_perf``: item-level F1 of the answered (entity, value) pairs against the truth;
  0 when the episode ended without an answer.
* ``r_parallel`` rewards delegating (against serial collapse); its closed form is
  picked from :data:`PARALLEL` by ``PARLConfig.parallel``:

  - ``"novel"`` (default): ``min(novel, parallel_target) / parallel_target``, with
    ``novel`` the sub-agents whose spawn block holds at least one asked-for entity
    that no earlier sub-agent of the episode was given. A bonus per *spawn*
    (``"spawned"``) is hacked by spawning many sub-agents on the same entity (seen in
    our runs: all of them return, so ``r_finish`` does not object); a bonus per new
    piece of work is not.
  - ``"coverage"``: the fraction of the asked-for entities that sub-agents returned
    (``returned / n``): it saturates only when the whole task went to sub-agents
    that finished, so it does not pay eight one-entity sub-agents on a 16-entity
    task as much as eight two-entity ones; but it pays a one-entity task in full
    for delegating its entity.
  - ``"work"``: ``min(returned, parallel_target) / parallel_target`` — asked-for
    entities that came back from sub-agents, counted against a fixed amount of work
    (set ``parallel_target`` to the largest task size): like ``coverage`` it grows
    with every entity delegated successfully, but a one-entity task earns
    ``1 / parallel_target`` for delegating it. With lambda1 = 0.3 and a target of 16
    that is 0.019, more than the 2 extra steps delegating costs at c = 0.005 (0.010):
    for the first ~100 steps of the schedule spawning at n = 1 paid (measured on the token world).
  - ``"parallel"``: ``min(parallel, parallel_target) / parallel_target`` with
    ``parallel`` the asked-for entities returned by a stage's sub-agents *beyond its
    busiest one* (summed over stages): the work that ran beside the stage's critical
    path. Zero for any delegation of a one-entity task, for a single sub-agent, and
    for copies of the same entity; 14 for eight sub-agents x 2 entities at n = 16,
    12 for seven (so the eighth sub-agent is worth 2 / target, not nothing).
* ``r_finish = finished / spawned`` (1 when nothing was spawned): the share of
  sub-agents that returned, against spurious parallelism. It only ever takes away:
  with 0 for "nothing spawned" (our first form) it paid every spawn that returned,
  and a one-entity task was delegated for the bonus (seen in our runs).
* ``lambda1``, ``lambda2`` anneal from their initial values to 0 over
  ``anneal_steps`` (linear or cosine), so the final policy optimises task
  performance alone; ``c`` is a small per-step compute cost.
* ``c_crit`` (``critical_cost``) charges the critical path, the cost the swarm
  exists to cut (our first reward charged ``c * total_steps`` only). Without it the
  annealed reward *prefers* one sub-agent fewer than the task needs whenever both
  fit the budget: at n = 16, 7 sub-agents and 2 own lookups take 25 total steps
  (critical 7), 8 sub-agents 26 (critical 5), so ``-c * total`` ranks 7 first: the
  "K - 1" optimum our runs settled in. With ``c_crit > c / 2`` the 8th wins at every
  point of the schedule, and a task that needs one agent still never profits from
  delegating (it lengthens both paths): ``tests/test_parl_shaping.py`` checks both
  over the whole schedule. Too large a ``c_crit`` moves small tasks to one entity per
  sub-agent (at n = 4, 4 x 1 takes 4 critical steps, serial 5), a habit that costs
  coverage at n = 16 (seen with 0.01 = 2c); the default config uses 0.004.

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


# name -> r_parallel [B] from per-episode counts (see the module docstring)
PARALLEL: dict[str, Callable[[dict[str, Array], "PARLConfig"], Array]] = {
    "spawned": lambda c, cfg: jnp.minimum(c["spawned"], cfg.parallel_target) / cfg.parallel_target,
    "novel": lambda c, cfg: jnp.minimum(c["novel"], cfg.parallel_target) / cfg.parallel_target,
    "coverage": lambda c, cfg: c["returned"] / jnp.maximum(c["n"], 1.0),
    "work": lambda c, cfg: jnp.minimum(c["returned"], cfg.parallel_target) / cfg.parallel_target,
    "parallel": lambda c, cfg: jnp.minimum(c["parallel"], cfg.parallel_target) / cfg.parallel_target,
}
# the per-episode counts each form needs beyond ``spawned``
NEEDS = {"novel": ("novel",), "coverage": ("returned", "n"), "work": ("returned",), "parallel": ("parallel",)}


@dataclasses.dataclass(frozen=True)
class PARLConfig:
    lambda1: float = 0.3          # initial weight of r_parallel
    lambda2: float = 0.3          # initial weight of r_finish
    anneal_steps: int = 200       # both reach 0 here
    schedule: str = "linear"      # key of SCHEDULES
    parallel: str = "novel"       # key of PARALLEL: the closed form of r_parallel
    parallel_target: int = 8      # sub-agents ("novel", "spawned") or entities ("work", "parallel") at which r_parallel saturates
    step_cost: float = 0.005      # c, per step of any agent
    critical_cost: float = 0.0    # c_crit, per critical step

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; known: {sorted(SCHEDULES)}")
        if self.parallel not in PARALLEL:
            raise ValueError(f"unknown parallel reward {self.parallel!r}; known: {sorted(PARALLEL)}")
        if self.anneal_steps < 1 or self.parallel_target < 1:
            raise ValueError("anneal_steps and parallel_target must be >= 1")
        if self.step_cost < 0 or self.critical_cost < 0:
            raise ValueError("step_cost and critical_cost must be >= 0")


def anneal(initial: float, step: Array, cfg: PARLConfig) -> Array:
    """``initial * s(min(step / anneal_steps, 1))`` with s the configured schedule (1 -> 0)."""
    frac = jnp.clip(jnp.asarray(step, jnp.float32) / cfg.anneal_steps, 0.0, 1.0)
    return initial * SCHEDULES[cfg.schedule](frac)


def parl_reward(f1: Array, spawned: Array, finished: Array, total_steps: Array, step: Array,
                cfg: PARLConfig, counts: dict[str, Array] | None = None, *,
                critical_steps: Array | None = None) -> tuple[Array, dict[str, Array]]:
    """Total reward [B] and each channel [B] (``r_perf``, ``r_parallel``, ``r_finish``,
    ``cost``) plus the current ``lambda1`` / ``lambda2``. ``counts``: the per-episode
    counts [B] the chosen ``r_parallel`` needs beyond ``spawned`` (:data:`NEEDS`;
    ``novel``: sub-agents given new asked-for work; ``returned``: asked-for entities
    sub-agents returned; ``parallel``: those beyond each stage's busiest sub-agent;
    ``n``: task sizes). ``critical_steps`` [B]: needed when ``critical_cost > 0``."""
    spawned = spawned.astype(jnp.float32)
    c = {"spawned": spawned, **{k: jnp.asarray(v, jnp.float32) for k, v in (counts or {}).items()}}
    missing = NEEDS.get(cfg.parallel, ())
    if any(k not in c for k in missing):
        raise ValueError(f"r_parallel {cfg.parallel!r} needs counts {missing}")
    if cfg.critical_cost and critical_steps is None:
        raise ValueError("critical_cost > 0 needs critical_steps")
    r_parallel = PARALLEL[cfg.parallel](c, cfg)
    r_finish = jnp.where(spawned > 0, finished / jnp.maximum(spawned, 1.0), 1.0)
    cost = cfg.step_cost * total_steps.astype(jnp.float32)
    if critical_steps is not None:
        cost = cost + cfg.critical_cost * jnp.asarray(critical_steps, jnp.float32)
    l1, l2 = anneal(cfg.lambda1, step, cfg), anneal(cfg.lambda2, step, cfg)
    reward = f1 + l1 * r_parallel + l2 * r_finish - cost
    return reward, {"r_perf": f1, "r_parallel": r_parallel, "r_finish": r_finish, "cost": cost,
                    "lambda1": l1, "lambda2": l2}
