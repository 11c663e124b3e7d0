"""A pool of KV-cache lanes shared by sub-agent slots.

An episode has K sub-agent slots, but few run at once (a serial episode uses none),
so decoding all B x K slots every tick wastes most of the sub-agent forward. Slots
instead borrow one of ``Lg`` lanes (a KV-cache row and its logits) when they start
and give it back when they stop; a slot that finds no free lane waits (emits
nothing) until one frees. Waiting only delays a sub-agent in wall-clock ticks, it
never changes what happens in the episode: steps and critical steps count turns,
not ticks.

The pool is split into ``D`` independent groups (one per data shard of the mesh),
so every gather stays on its device. Shapes: slots ``[D, S]`` (S = B*K / D, the
episodes of a group, episode-major), lanes ``[D, Lg]``; indices are local to a group.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

Array = jax.Array


@flax.struct.dataclass
class Lanes:
    lane_of: Array    # [D, S] int32: lane held by each slot, -1 for none
    owner: Array      # [D, Lg] int32: slot holding each lane, -1 when free


def init_lanes(groups: int, slots: int, lanes: int) -> Lanes:
    return Lanes(lane_of=jnp.full((groups, slots), -1, jnp.int32),
                 owner=jnp.full((groups, lanes), -1, jnp.int32))


def _allocate_group(lane_of: Array, owner: Array, needy: Array):
    Lg, S = owner.shape[0], lane_of.shape[0]
    free = owner < 0
    free_list = jnp.nonzero(free, size=Lg, fill_value=Lg)[0]              # free lanes, in order
    rank = jnp.cumsum(needy) - 1                                          # needy slots, in order
    get = needy & (rank < jnp.sum(free))
    lane = jnp.where(get, free_list[jnp.clip(rank, 0, Lg - 1)], lane_of)
    new_owner = owner.at[jnp.where(get, lane, Lg)].set(jnp.arange(S, dtype=jnp.int32), mode="drop")
    return lane.astype(jnp.int32), new_owner, new_owner != owner


def allocate(lanes: Lanes, needy: Array) -> tuple[Lanes, Array]:
    """Give free lanes to slots that need one (``needy [D, S]``, in slot order).
    Returns the pool and ``fresh [D, Lg]``: lanes handed out now (their cache must be
    cleared before use)."""
    lane_of, owner, fresh = jax.vmap(_allocate_group)(lanes.lane_of, lanes.owner, needy & (lanes.lane_of < 0))
    return Lanes(lane_of=lane_of, owner=owner), fresh


def release(lanes: Lanes, done: Array) -> Lanes:
    """Slots with ``done [D, S]`` give their lanes back."""
    def group(lane_of, owner, done):
        drop = done & (lane_of >= 0)
        owner = owner.at[jnp.where(drop, lane_of, owner.shape[0])].set(-1, mode="drop")
        return jnp.where(drop, -1, lane_of), owner
    lane_of, owner = jax.vmap(group)(lanes.lane_of, lanes.owner, done)
    return Lanes(lane_of=lane_of, owner=owner)


def to_lanes(x: Array, lanes: Lanes) -> Array:
    """Per-slot values ``[D, S, ...]`` -> per-lane ``[D, Lg, ...]`` (free lanes get slot 0's)."""
    return jax.vmap(lambda x, o: x[jnp.maximum(o, 0)])(x, lanes.owner)


def to_slots(x: Array, lanes: Lanes) -> Array:
    """Per-lane values ``[D, Lg, ...]`` -> per-slot ``[D, S, ...]`` (lane-less slots get lane 0's)."""
    return jax.vmap(lambda x, l: x[jnp.maximum(l, 0)])(x, lanes.lane_of)


def _group_errors(lane_of: Array, owner: Array) -> tuple[Array, Array]:
    S, Lg = lane_of.shape[0], owner.shape[0]
    bad_id = ~((lane_of >= -1) & (lane_of < Lg)) | jnp.any((owner < -1) | (owner >= S))
    back = owner[jnp.clip(lane_of, 0, Lg - 1)]                          # [S] owner of each slot's lane
    forth = lane_of[jnp.clip(owner, 0, S - 1)]                          # [Lg] lane of each lane's owner
    bad_owner = ((lane_of >= 0) & (back != jnp.arange(S))) | jnp.any((owner >= 0) & (forth != jnp.arange(Lg)))
    return bad_id, bad_owner


def errors(lanes: Lanes) -> tuple[Array, Array]:
    """Pool invariants broken, per slot ``[D, S]`` bool each: ``bad_id``: the slot's
    lane is outside ``[-1, Lg)``, or a lane of its group has an owner outside
    ``[-1, S)``; ``bad_owner``: ``lane_of`` and ``owner`` are not inverse maps (slot s
    holds lane l iff owner[l] = s), seen from the slot, or from a lane of its group."""
    return jax.vmap(_group_errors)(lanes.lane_of, lanes.owner)
