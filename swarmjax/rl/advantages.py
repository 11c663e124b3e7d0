"""Group-relative advantages and the reward-side tricks around them (pure, jittable).

Groups are given by integer ids ``group_ids [B]`` (rows of the same prompt share
an id; ids need not be contiguous or sorted), so filtered or refilled batches
work without reshaping. All statistics are segment sums with a static number of
segments (B), hence jit- and shard-friendly.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Array = jax.Array


def _dense_ids(group_ids: Array) -> Array:
    """Relabel arbitrary integer ids to 0..n_groups-1 (jittable: static size B)."""
    _, inverse = jnp.unique(group_ids, return_inverse=True, size=group_ids.shape[0])
    return inverse.reshape(group_ids.shape)


def _group_stats(rewards: Array, group_ids: Array) -> tuple[Array, Array, Array]:
    """Per-row group mean, population std (ddof=0) and group size, each [B]."""
    B = rewards.shape[0]
    group_ids = _dense_ids(group_ids)
    r = rewards.astype(jnp.float32)
    count = jax.ops.segment_sum(jnp.ones_like(r), group_ids, num_segments=B)
    mean = jax.ops.segment_sum(r, group_ids, num_segments=B) / jnp.maximum(count, 1.0)
    mean_row = mean[group_ids]
    var = jax.ops.segment_sum((r - mean_row) ** 2, group_ids, num_segments=B) / jnp.maximum(count, 1.0)
    return mean_row, jnp.sqrt(var)[group_ids], count[group_ids]


def grpo_advantages(rewards: Array, group_ids: Array, eps: float = 1e-6) -> Array:
    """GRPO: ``A_i = (r_i - mean_g r) / (std_g r + eps)`` within each group g.

    rewards, group_ids: [B]. Singleton and zero-variance groups give exactly 0
    (their numerator is 0), never NaN.
    """
    mean, std, _ = _group_stats(rewards, group_ids)
    centred = rewards - mean
    return jnp.where(std > 0, centred / (std + eps), 0.0)


def drgrpo_advantages(rewards: Array, group_ids: Array, eps: float = 1e-6) -> Array:
    """Dr. GRPO (Liu et al. 2025): ``A_i = r_i - mean_g r`` (no std division)."""
    del eps
    mean, _, _ = _group_stats(rewards, group_ids)
    return rewards - mean


def batch_std_advantages(rewards: Array, group_ids: Array, eps: float = 1e-6) -> Array:
    """Group-centred, scaled by the std of the centred rewards over the whole batch:
    ``A_i = (r_i - mean_g r) / (std_batch(r - mean_g r) + eps)``; 0 when the batch
    has no spread."""
    mean, _, _ = _group_stats(rewards, group_ids)
    centred = rewards - mean
    std = jnp.std(centred)
    return jnp.where(std > 0, centred / (std + eps), 0.0)


ADVANTAGES: dict[str, Callable[..., Array]] = {
    "grpo": grpo_advantages,
    "drgrpo": drgrpo_advantages,
    "batch_std": batch_std_advantages,
}


def compute_advantages(name: str, rewards: Array, group_ids: Array, eps: float = 1e-6) -> Array:
    """Dispatch through :data:`ADVANTAGES` by name."""
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGES)}")
    return ADVANTAGES[name](rewards, group_ids, eps)


def uniform_groups(rewards: Array, group_ids: Array, atol: float = 0.0) -> Array:
    """DAPO dynamic sampling: [B] bool, True on rows whose group's rewards are all
    equal (within ``atol``) -- such groups carry no learning signal, so the caller
    drops and refills them."""
    B = rewards.shape[0]
    group_ids = _dense_ids(group_ids)
    hi = jax.ops.segment_max(rewards, group_ids, num_segments=B)[group_ids]
    lo = jax.ops.segment_min(rewards, group_ids, num_segments=B)[group_ids]
    return (hi - lo) <= atol


def overlong_penalty(lengths: Array, max_length: int, cache_length: int) -> Array:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv 2503.14476), added to the
    reward. lengths: [B] response lengths (sampled tokens); returns [B] f32 in [-1, 0].

    ``0`` if ``L <= L_max - L_cache``; ``((L_max - L_cache) - L) / L_cache`` in the
    soft zone (linear from 0 to -1); ``-1`` if ``L > L_max``. Used by the text RL
    trainer (``TextRLConfig.overlong``).
    """
    if not 0 < cache_length <= max_length:
        raise ValueError(f"need 0 < cache_length ({cache_length}) <= max_length ({max_length})")
    L = lengths.astype(jnp.float32)
    start = max_length - cache_length
    soft = (start - L) / cache_length
    return jnp.where(L <= start, 0.0, jnp.where(L <= max_length, soft, -1.0))

