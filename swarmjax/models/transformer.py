"""Qwen3 / Llama decoder-only transformer as pure-functional Flax (linen) modules.

Architecture (Qwen3): token embedding -> L x [RMSNorm -> grouped-query attention
with per-head q/k RMSNorm and RoPE -> residual -> RMSNorm -> SwiGLU MLP ->
residual] -> RMSNorm -> output head (optionally tied to the embedding).
Llama is the same with ``qk_norm=False``.

Layers are stacked on a leading ``layers`` axis and run under ``nn.scan``: one
compiled layer body regardless of depth (compile time matters on CPU and in
tests), and per-layer weights are plain ``[L, ...]`` arrays that Muon can
orthogonalise per matrix.

Functional entry points (all take and return plain pytrees):

* :func:`init_params` / :func:`abstract_params` / :func:`param_logical_axes`
* :func:`forward` -> :class:`ForwardOutput` (logits, updated KV cache, and on
  request the per-layer per-head max pre-softmax attention logit ``[L, H]``
  that QK-Clip needs; when not requested it is not computed at all).
* :func:`init_cache` -> :class:`KVCache`.

Every parameter carries logical axis names next to its definition; the mesh
mapping lives in :mod:`swarmjax.sharding.mesh`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from swarmjax.models.config import ModelConfig

Array = jax.Array
_NEG = float(np.finfo(np.float32).min)
_INIT = nn.initializers.normal(stddev=0.02)


@flax.struct.dataclass
class KVCache:
    """Fixed-size key/value cache.

    k, v:  [L, B, S, Hkv, hd]  keys/values per layer and cache slot.
    valid: [B, S] bool          slot holds a real (non-pad) token.
    """

    k: Array
    v: Array
    valid: Array

    @property
    def max_len(self) -> int:
        return self.k.shape[2]


@flax.struct.dataclass
class ForwardOutput:
    """logits [B, T, V] float32; cache (or None); max_logits [L, H] float32 (or None)."""

    logits: Array
    cache: KVCache | None
    max_logits: Array | None


def _param(module: nn.Module, name: str, shape, logical, init=_INIT):
    """A parameter with its logical axis names (for the sharding rule table)."""
    return module.param(name, nn.with_logical_partitioning(init, logical), shape,
                        module.cfg.jnp_param_dtype)


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * scale, computed in float32."""

    cfg: ModelConfig
    logical: str = "norm"

    @nn.compact
    def __call__(self, x: Array) -> Array:
        scale = _param(self, "scale", (x.shape[-1],), (self.logical,), nn.initializers.ones)
        xf = x.astype(jnp.float32)
        y = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.cfg.rms_norm_eps)
        return (y * scale.astype(jnp.float32)).astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies [hd/2]: theta^(-2i/hd), with Llama-3.1 wavelength scaling
    when ``rope_type == "llama3"``."""
    hd = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    if cfg.rope_type == "llama3":
        factor, low, high, old_ctx = cfg.rope_scaling
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = np.where(medium, smoothed, scaled)
    return inv.astype(np.float32)


def rope_tables(positions: Array, cfg: ModelConfig) -> tuple[Array, Array]:
    """cos, sin [B, T, hd] for integer positions [B, T] (half-rotation layout, as HF)."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope_inv_freq(cfg))  # [B, T, hd/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """x [B, T, N, hd] rotated by position: x*cos + rotate_half(x)*sin (in float32)."""
    xf = x.astype(jnp.float32)
    x1, x2 = jnp.split(xf, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (xf * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(x.dtype)


class Attention(nn.Module):
    """Grouped-query attention with optional q/k RMSNorm, RoPE and a KV cache."""

    cfg: ModelConfig
    want_max: bool = False

    @nn.compact
    def __call__(self, x, cos, sin, mask, cache_k, cache_v, cache_index, layer):
        cfg = self.cfg
        dt = cfg.jnp_dtype
        B, T, D = x.shape
        H, K, G, hd = cfg.num_heads, cfg.num_kv_heads, cfg.num_groups, cfg.head_dim
        wq = _param(self, "q_proj", (D, H, hd), ("embed", "heads", "head_dim"))
        wk = _param(self, "k_proj", (D, K, hd), ("embed", "kv_heads", "head_dim"))
        wv = _param(self, "v_proj", (D, K, hd), ("embed", "kv_heads", "head_dim"))
        wo = _param(self, "o_proj", (H, hd, D), ("heads", "head_dim", "embed"))
        q = jnp.einsum("btd,dhk->bthk", x, wq.astype(dt))   # [B, T, H, hd]
        k = jnp.einsum("btd,dhk->bthk", x, wk.astype(dt))   # [B, T, K, hd]
        v = jnp.einsum("btd,dhk->bthk", x, wv.astype(dt))   # [B, T, K, hd]
        if cfg.attention_bias:
            zeros = nn.initializers.zeros
            q = q + _param(self, "q_bias", (H, hd), ("heads", "head_dim"), zeros).astype(dt)
            k = k + _param(self, "k_bias", (K, hd), ("kv_heads", "head_dim"), zeros).astype(dt)
            v = v + _param(self, "v_bias", (K, hd), ("kv_heads", "head_dim"), zeros).astype(dt)
        if cfg.qk_norm:
            q = RMSNorm(cfg, "head_dim", name="q_norm")(q)
            k = RMSNorm(cfg, "head_dim", name="k_norm")(k)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)

        if cache_k is not None:
            # Write this chunk into layer `layer` at slot `cache_index`, then attend over
            # the whole cache (masked). The full [L, ...] buffer is the scan carry, so the
            # write is in place.
            start = (layer, 0, cache_index, 0, 0)
            cache_k = lax.dynamic_update_slice(cache_k, k[None].astype(cache_k.dtype), start)
            cache_v = lax.dynamic_update_slice(cache_v, v[None].astype(cache_v.dtype), start)
            keys = lax.dynamic_index_in_dim(cache_k, layer, 0, keepdims=False).astype(dt)
            values = lax.dynamic_index_in_dim(cache_v, layer, 0, keepdims=False).astype(dt)
        else:
            keys, values = k, v                              # [B, S=T, K, hd]

        qg = q.reshape(B, T, K, G, hd)
        logits = jnp.einsum("btkgh,bskh->bkgts", qg, keys,
                            preferred_element_type=jnp.float32) * (hd ** -0.5)  # [B, K, G, T, S]
        logits = jnp.where(mask[:, None, None, :, :], logits, _NEG)
        max_logit = logits.max(axis=(0, 3, 4)).reshape(H) if self.want_max else None  # [H]
        probs = jax.nn.softmax(logits, axis=-1).astype(dt)
        out = jnp.einsum("bkgts,bskh->btkgh", probs, values).reshape(B, T, H, hd)
        y = jnp.einsum("bthk,hkd->btd", out, wo.astype(dt))
        if cfg.attention_bias:
            y = y + _param(self, "o_bias", (D,), ("embed",), nn.initializers.zeros).astype(dt)
        return y, cache_k, cache_v, max_logit


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x):
        dt, D, F = self.cfg.jnp_dtype, self.cfg.hidden_size, self.cfg.intermediate_size
        gate = _param(self, "gate_proj", (D, F), ("embed", "mlp"))
        up = _param(self, "up_proj", (D, F), ("embed", "mlp"))
        down = _param(self, "down_proj", (F, D), ("mlp", "embed"))
        h = jax.nn.silu(x @ gate.astype(dt)) * (x @ up.astype(dt))   # [B, T, F]
        return h @ down.astype(dt)


class Block(nn.Module):
    """One pre-norm decoder layer; scanned over the ``layers`` axis."""

    cfg: ModelConfig
    want_max: bool = False

    @nn.compact
    def __call__(self, carry, cos, sin, mask, cache_index):
        x, cache_k, cache_v, layer = carry
        h = RMSNorm(self.cfg, name="input_norm")(x)
        a, cache_k, cache_v, max_logit = Attention(self.cfg, self.want_max, name="attn")(
            h, cos, sin, mask, cache_k, cache_v, cache_index, layer)
        x = x + a
        x = x + MLP(self.cfg, name="mlp")(RMSNorm(self.cfg, name="post_attn_norm")(x))
        return (x, cache_k, cache_v, layer + 1), max_logit


class Transformer(nn.Module):
    """The full decoder. See :func:`forward` for the functional call."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, tokens, positions, token_mask, cache=None, cache_index=0,
                 return_max_logits=False):
        cfg = self.cfg
        B, T = tokens.shape
        embed = _param(self, "embed", (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"))
        x = jnp.take(embed, tokens, axis=0).astype(cfg.jnp_dtype)   # [B, T, D]
        cos, sin = rope_tables(positions, cfg)                       # [B, T, hd]

        if cache is None:
            key_valid, k_slots = token_mask, jnp.arange(T)
            q_slots, ck, cv = jnp.arange(T), None, None
        else:
            key_valid = lax.dynamic_update_slice(cache.valid, token_mask, (0, cache_index))
            k_slots = jnp.arange(cache.max_len)
            q_slots, ck, cv = cache_index + jnp.arange(T), cache.k, cache.v
        # [B, T, S]: key is a real token and not in the future of the query.
        mask = key_valid[:, None, :] & (k_slots[None, None, :] <= q_slots[None, :, None])

        stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True},
                        in_axes=(nn.broadcast,) * 4, length=cfg.num_layers,
                        metadata_params={nn.PARTITION_NAME: "layers"})
        (x, ck, cv, _), max_logits = stack(cfg, return_max_logits, name="layers")(
            (x, ck, cv, jnp.int32(0)), cos, sin, mask, cache_index)

        x = RMSNorm(cfg, name="final_norm")(x)
        if cfg.tie_embeddings:
            logits = jnp.einsum("btd,vd->btv", x, embed.astype(cfg.jnp_dtype),
                                preferred_element_type=jnp.float32)
        else:
            head = _param(self, "lm_head", (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"))
            logits = jnp.einsum("btd,dv->btv", x, head.astype(cfg.jnp_dtype),
                                preferred_element_type=jnp.float32)
        new_cache = None if cache is None else KVCache(k=ck, v=cv, valid=key_valid)
        return ForwardOutput(logits=logits.astype(jnp.float32), cache=new_cache,
                             max_logits=max_logits)


def _dummy_inputs(cfg: ModelConfig):
    tokens = jnp.zeros((1, 1), jnp.int32)
    return tokens, tokens, jnp.ones((1, 1), bool)


def init_params(cfg: ModelConfig, key: Array) -> dict[str, Any]:
    """Random parameters (normal(0.02) weights, unit norms, zero biases) as a plain
    nested dict of arrays with stacked ``[L, ...]`` layer weights."""
    return _init_jit(cfg, key)


@functools.partial(jax.jit, static_argnums=0)
def _init_jit(cfg: ModelConfig, key: Array) -> dict[str, Any]:
    return nn.meta.unbox(Transformer(cfg).init(key, *_dummy_inputs(cfg))["params"])


@functools.lru_cache(maxsize=32)
def _boxed_abstract(cfg: ModelConfig):
    return jax.eval_shape(lambda: Transformer(cfg).init(jax.random.key(0), *_dummy_inputs(cfg)))


def abstract_params(cfg: ModelConfig) -> dict[str, Any]:
    """Parameter pytree of ``jax.ShapeDtypeStruct`` (no allocation)."""
    return nn.meta.unbox(_boxed_abstract(cfg)["params"])


def param_logical_axes(cfg: ModelConfig) -> dict[str, Any]:
    """Pytree (same structure as the params) of ``PartitionSpec``s holding the
    *logical* axis names of every parameter, e.g. ``P('layers', 'embed', 'mlp')``."""
    return nn.get_partition_spec(_boxed_abstract(cfg))["params"]


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """Empty cache: k, v zeros [L, B, S, Hkv, hd] in ``dtype`` (default: compute dtype),
    valid all False [B, S]."""
    dtype = cfg.jnp_dtype if dtype is None else dtype
    shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                   valid=jnp.zeros((batch, max_len), bool))


def cache_logical_axes() -> KVCache:
    """Logical axis names of the cache arrays (for :mod:`swarmjax.sharding`)."""
    kv = jax.sharding.PartitionSpec("layers", "batch", "cache_seq", "kv_heads", "head_dim")
    return KVCache(k=kv, v=kv, valid=jax.sharding.PartitionSpec("batch", "cache_seq"))


def default_positions(token_mask: Array) -> Array:
    """Positions [B, T] that count only real tokens: cumsum(mask) - 1, clipped at 0
    (so a left-padded row starts at position 0 on its first real token)."""
    return jnp.maximum(jnp.cumsum(token_mask.astype(jnp.int32), axis=-1) - 1, 0)


def forward(params: dict[str, Any], cfg: ModelConfig, tokens: Array,
            positions: Array | None = None, token_mask: Array | None = None,
            cache: KVCache | None = None, cache_index: Array | int = 0,
            return_max_logits: bool = False) -> ForwardOutput:
    """Run the decoder.

    Args:
      params: parameter pytree from :func:`init_params` or :func:`swarmjax.models.hf.from_hf`.
      tokens: [B, T] int token ids.
      positions: [B, T] RoPE positions; default :func:`default_positions` of the mask.
      token_mask: [B, T] bool, False on padding (never attended to); default all True.
      cache: optional :class:`KVCache`; the chunk is written at slots
        ``[cache_index, cache_index + T)`` and attends over every valid slot up to itself.
      cache_index: scalar int slot of ``tokens[:, 0]`` in the cache.
      return_max_logits: also return ``max_logits [L, H]``, the largest masked
        pre-softmax logit ``q.k / sqrt(hd)`` per layer and query head (over batch,
        queries and keys). Static: when False nothing extra is computed.

    Returns:
      :class:`ForwardOutput` with float32 logits [B, T, V].
    """
    if token_mask is None:
        token_mask = jnp.ones(tokens.shape, bool)
    token_mask = token_mask.astype(bool)
    if positions is None:
        positions = default_positions(token_mask)
    return Transformer(cfg).apply({"params": params}, tokens, positions, token_mask, cache,
                                  jnp.asarray(cache_index, jnp.int32), return_max_logits)


# ``forward`` compiled once per (config, shapes): for callers outside their own jit.
forward_jit = jax.jit(forward, static_argnums=1, static_argnames="return_max_logits")
