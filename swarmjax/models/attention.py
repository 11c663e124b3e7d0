"""The attention arithmetic of :class:`~swarmjax.models.transformer.Attention` over
head-major arrays (queries [B, K, G, T, H], keys and values [B, K, T, H]): causal
self-attention of long rows by query blocks, cascade attention over a shared prefix, and
the in-place writes of a KV cache's slots."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Array = jax.Array
NEG = float(np.finfo(np.float32).min)     # the logit of a masked key
# queries per block of the causal self-attention of rows of 2 blocks or more
# (:func:`causal_blocks`; 128 was the fastest of 128 / 256 / whole rows at 16 x 1280 on a CPU)
ATTENTION_BLOCK = 128


def causal_blocks(qg, keys, values, mask, dt, want_max):
    """Causal self-attention :data:`ATTENTION_BLOCK` queries at a time: block ``[t0, t1)``
    attends over keys ``[0, t1)`` only (the keys after it are masked for all of its
    queries), so the [T, T] logits are never held at once and the upper blocks are never
    computed: ~T^2 / 2 instead of T^2 scores, and each block's logits stay in cache. The
    same outputs as one softmax over the whole masked row (``mask [B, T, T]`` must be
    causal, as :func:`forward`'s is without a cache).

    qg [B, K, G, T, H] (scaled queries), keys, values [B, K, T, H]. Returns out
    [B, K, G, T, H] and the max masked logit per head [N] (or None)."""
    B, K, G, T, H = qg.shape
    outs, maxes = [], []
    for t0 in range(0, T, ATTENTION_BLOCK):
        t1 = min(t0 + ATTENTION_BLOCK, T)
        logits = jnp.einsum("BKGTH,BKSH->BKGTS", qg[:, :, :, t0:t1], keys[:, :, :t1].astype(dt),
                            preferred_element_type=jnp.float32)                  # [B, K, G, t1 - t0, t1]
        logits = jnp.where(mask[:, None, None, t0:t1, :t1], logits, NEG)
        if want_max:
            maxes.append(logits.max(axis=(0, 3, 4)))                                # [K, G]
        probs = jax.nn.softmax(logits, axis=-1).astype(dt)
        outs.append(jnp.einsum("BKGTS,BKSH->BKGTH", probs, values[:, :, :t1].astype(dt)))
    max_logit = jnp.max(jnp.stack(maxes), axis=0).reshape(K * G) if want_max else None
    return jnp.concatenate(outs, axis=3), max_logit


def cascade(qg, logits, values, prefix_k, prefix_v, prefix_mask, dt, want_max):
    """Attention over a shared prefix and the rows' own keys in one softmax, merged by
    log-sum-exp instead of concatenating the logits (which cost 2.5x in a prefill).

    qg [B, K, G, T, H] (scaled queries), logits [B, K, G, T, S] (own keys, masked),
    values [B, K, S, H], prefix_k [K, H, P], prefix_v [K, P, H], prefix_mask [B, T, P].
    The prefix part runs kv-head-major ([K, B*G*T, H] x [K, H, P]): one matmul per kv
    head for the whole batch, the prefix read once. Returns out [B, K, G, T, H] and the
    max logit per head [N] (or None)."""
    B, K, G, T, H = qg.shape
    P = prefix_k.shape[-1]
    q = qg.transpose(1, 0, 2, 3, 4).reshape(K, B * G * T, H)
    shared = jnp.einsum("KMH,KHP->KMP", q, prefix_k.astype(dt),
                        preferred_element_type=jnp.float32).reshape(K, B, G, T, P)
    shared = jnp.where(prefix_mask[None, :, None], shared, NEG)                      # [K, B, G, T, P]
    m = jnp.maximum(shared.max(-1).transpose(1, 0, 2, 3), logits.max(-1))              # [B, K, G, T]
    e_own = jnp.exp(logits - m[..., None])
    e_shared = jnp.exp(shared - m.transpose(1, 0, 2, 3)[..., None])
    denom = e_own.sum(-1) + e_shared.sum(-1).transpose(1, 0, 2, 3)                     # [B, K, G, T]
    out_shared = jnp.einsum("KMP,KPH->KMH", e_shared.reshape(K, B * G * T, P).astype(dt), prefix_v.astype(dt))
    out = jnp.einsum("BKGTS,BKSH->BKGTH", e_own.astype(dt), values.astype(dt)) + \
        out_shared.reshape(K, B, G, T, H).transpose(1, 0, 2, 3, 4)
    max_logit = m.max(axis=(0, 3)).reshape(K * G) if want_max else None
    return out / denom[..., None].astype(dt), max_logit


def write_slots(buf: Array, new: Array, index: Array, axis: int = -2) -> Array:
    """Write a chunk into a cache buffer along its slot axis (``axis``, negative).

    buf [B, ..., S, H], new [B, ..., T, H] (``axis=-2``; or [B, ..., H, S] and
    [B, ..., H, T] with ``axis=-1``); index: a scalar slot for every row, or [B]
    per-row slots (rows of a swarm rollout advance at different rates).
    """
    def start(ndim, i):
        at = [0] * ndim
        at[ndim + axis] = i
        return tuple(at)

    if jnp.ndim(index) == 0:
        return lax.dynamic_update_slice(buf, new, start(buf.ndim, index))
    # vmap of dynamic_update_slice stays in place inside a decode loop (measured on
    # XLA:CPU: as fast as one shared slot); a one-hot select or ``.at[].set`` rewrote
    # the whole buffer every step (2x slower per swarm tick).
    return jax.vmap(lambda b, n, i: lax.dynamic_update_slice(b, n, start(b.ndim, i)))(buf, new, index)
