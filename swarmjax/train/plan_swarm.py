"""Will the swarm rollout fit? Per-device memory of the jitted text swarm's rows and
one tick of their decoding, planned ahead of time (nothing allocated).

The jitted text swarm (:class:`~swarmjax.swarm.text_engine.TextSwarm`) holds, for a
batch of B episodes with K sub-agent slots each:

* the orchestrator's B rows: a KV cache of ``context`` slots each, their logits
  ``[B, V]`` f32 and conversation traces ``[B, context]`` int32, decoded with the
  trained params;
* the sub-agents' rows: one per slot (``B x K``) or, with ``lanes``, a pool of that
  many rows the slots borrow (the token world's :mod:`swarmjax.swarm.lanes`), each with
  a cache of ``subagent_context`` slots, decoded with the frozen sub-agent params;
* per tick, each model's forward: one id for every row, and a ``chunk``-wide forward
  (replies and prompts being read) for up to ``wide_rows`` of its rows.

:func:`plan_swarm` compiles that tick (both models' 1-wide and chunk-wide forwards,
the caches donated and written in place) from abstract shapes on the mesh, rows over
the data axes and weights by the logical rules. Sizes per device:

* ``orch_cache`` / ``sub_cache``: the two models' KV caches (exact arithmetic);
* ``sub_params``: the frozen sub-agent weights (another model's when given);
* ``tick_temp``: XLA's temporaries of the tick;
* ``total``: XLA's arguments + outputs - donated + temporaries of the tick (params,
  frozen params, caches, traces and logits), plus what stays resident from the rest of
  the RL step (the optimizer state, and any other frozen tree such as a reference model).

As :mod:`swarmjax.train.plan`, the compile is XLA:CPU's view of the SPMD program (a
TPU compile differs; leave headroom); the cache and weight arithmetic is exact.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from swarmjax.models.config import ModelConfig
from swarmjax.models.lora import frozen_part, over_base
from swarmjax.models.transformer import abstract_params, cache_logical_axes, init_cache, param_logical_axes
from swarmjax.sharding.mesh import batch_sharding, tree_shardings
from swarmjax.swarm.text_device import Rows
from swarmjax.swarm.text_engine_feed import RoleModel, forward_rows
from swarmjax.train.plan import per_device_bytes, with_shardings, xla_total


@dataclasses.dataclass(frozen=True)
class SwarmPlan:
    """Per-device bytes of a swarm rollout (see the module docstring)."""

    episodes: int
    subagents: int
    sub_rows: int
    orch_cache: int
    sub_cache: int
    sub_params: int
    tick_temp: int
    tick_total: int
    resident: int

    @property
    def total(self) -> int:
        return self.tick_total + self.resident

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "total": self.total}


def abstract_rows(cfg: ModelConfig, mesh: Mesh, rows: int, context: int) -> Rows:
    """:class:`Rows` of ``rows`` rows with ``context`` cache slots as shapes, sharded as
    the engine shards them (rows over the data axes, the cache by its logical axes)."""
    shapes = jax.eval_shape(lambda: Rows(cache=init_cache(cfg, rows, context),
                                         logits=jnp.zeros((rows, cfg.vocab_size), jnp.float32),
                                         pos=jnp.zeros((rows,), jnp.int32), offset=jnp.zeros((rows,), jnp.int32)))
    row = lambda nd: batch_sharding(mesh, nd, batch_size=rows)
    shardings = Rows(cache=tree_shardings(cache_logical_axes(cfg), shapes.cache, mesh),
                     logits=row(2), pos=row(1), offset=row(1))
    return with_shardings(shapes, shardings)


def plan_swarm(cfg: ModelConfig, mesh: Mesh, *, episodes: int, subagents: int, context: int,
               subagent_context: int | None = None, lanes: int = 0, chunk: int = 16, wide_rows: float = 0.25,
               subagent_model: ModelConfig | None = None, resident: int = 0) -> SwarmPlan:
    """Per-device memory of the jitted text swarm's rows and one tick on ``mesh``.

    Args:
      cfg: the orchestrator (policy) model.
      mesh: a ``(data, fsdp, tensor)`` mesh.
      episodes: B, orchestrator rows.
      subagents: K, sub-agent slots an episode (0: the orchestrator alone).
      context: the orchestrator's cache slots (its conversation's length).
      subagent_context: a sub-agent's cache slots (default ``context``).
      lanes: sub-agent rows holding a cache, shared by the slots (0: one per slot,
        ``B x K``, as the jitted text swarm runs today).
      chunk, wide_rows: the engine's chunk width F and the fraction of rows fed a chunk in
        one tick (:class:`~swarmjax.swarm.text_engine.TextSwarm`).
      subagent_model: the sub-agents' model (None: a frozen copy of ``cfg``; with
        ``cfg.lora`` a copy of its adapters over the same base weights, held once).
      resident: bytes a device keeps from the rest of the step (optimizer state,
        reference model), added to ``total``.
    """
    if episodes < 1 or subagents < 0 or context < 2 or chunk < 1 or lanes < 0:
        raise ValueError(f"need episodes >= 1, subagents >= 0, context >= 2, chunk >= 1, lanes >= 0; got "
                         f"{episodes}, {subagents}, {context}, {chunk}, {lanes}")
    sub_cfg = subagent_model or cfg
    sub_ctx = subagent_context or context
    sub_rows = (lanes or episodes * subagents) if subagents else 0
    roles = [(cfg, episodes, context)] + ([(sub_cfg, sub_rows, sub_ctx)] if sub_rows else [])

    def weights(c):
        p = abstract_params(c)
        return with_shardings(p, tree_shardings(param_logical_axes(c), p, mesh))

    params = [weights(c) for c, _, _ in roles]
    shared = sub_rows and subagent_model is None and cfg.lora is not None
    if shared:                  # LoRA: the sub-agents are their adapters over the orchestrator's base arrays
        params[1] = frozen_part(params[1])
    rows = [abstract_rows(c, mesh, n, x) for c, n, x in roles]
    traces = [jax.ShapeDtypeStruct((n, x), jnp.int32, sharding=batch_sharding(mesh, 2, batch_size=n))
              for _, n, x in roles]
    models = [RoleModel(cfg=c, grammar=None, context=x, sampling=None) for c, _, x in roles]

    def local(n: int) -> tuple[int, int]:
        """(groups, wide rows a group): the rows fed a chunk are taken from every device's
        own rows (the groups the rows' sharding makes), so the chunk-wide forward moves no
        cache between devices."""
        groups = n // batch_sharding(mesh, 1, batch_size=n).shard_shape((n,))[0]
        return groups, max(1, int(round(wide_rows * n / groups)))

    def tick(params, rows, traces):
        out = []
        if shared:
            params = [params[0], over_base(params[1], params[0])]
        for p, m, r, ids in zip(params, models, rows, traces):
            rope = r.rope(m.cfg, m.context)
            r = forward_rows(p, m, r, ids, jnp.ones(r.pos.shape, jnp.int32), 1, rope)      # every row: one id
            groups, w = local(r.pos.shape[0])
            pick = lambda a: a.reshape(groups, -1, *a.shape[1:])[:, :w].reshape(groups * w, *a.shape[1:])
            sub = forward_rows(p, m, jax.tree.map(pick, r), pick(ids), jnp.full((groups * w,), chunk, jnp.int32),
                               chunk, rope)                                                 # a chunk each
            put = lambda a, s: a.reshape(groups, -1, *a.shape[1:]).at[:, :w].set(
                s.reshape(groups, w, *s.shape[1:])).reshape(a.shape)
            out.append(jax.tree.map(put, r, sub))
        return out

    shard = lambda tree: jax.tree.map(lambda x: x.sharding, tree)
    compiled = jax.jit(tick, donate_argnums=1, in_shardings=(shard(params), shard(rows), shard(traces)),
                       out_shardings=shard(rows)).lower(params, rows, traces).compile()
    tick_total, tick_temp = xla_total(compiled)
    return SwarmPlan(episodes=episodes, subagents=subagents, sub_rows=sub_rows,
                     orch_cache=per_device_bytes(rows[0].cache),
                     sub_cache=per_device_bytes(rows[1].cache) if sub_rows else 0,
                     sub_params=per_device_bytes(params[1]) if sub_rows else 0,
                     tick_temp=tick_temp, tick_total=tick_total, resident=resident)
