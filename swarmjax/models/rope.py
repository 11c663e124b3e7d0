"""Rotary position embeddings: inverse frequencies (default, Llama-3.1 and YaRN
scaling, as transformers computes them), cos/sin tables, and the rotation."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from swarmjax.models.config import ModelConfig

Array = jax.Array


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse frequencies [H/2]: theta^(-2i/H), with Llama-3.1 wavelength scaling
    when ``rope_type == "llama3"`` and YaRN's when ``"yarn"``."""
    H = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, H, 2, dtype=np.float64) / H))
    if cfg.rope_type == "llama3":
        factor, low, high, old_ctx = cfg.rope_scaling
        low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old_ctx / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = np.where(medium, smoothed, scaled)
    elif cfg.rope_type == "yarn":
        # transformers' _compute_yarn_parameters: interpolate (inv / factor) the dimensions
        # that turn fewer than beta_slow times over the original context, keep those that
        # turn more than beta_fast times, and ramp linearly in between
        y = cfg.rope_scaling

        def dim_of(rotations):  # the dimension that turns ``rotations`` times in the old context
            return H * math.log(y.original_max_position_embeddings / (rotations * 2 * math.pi)) / \
                (2 * math.log(cfg.rope_theta))

        low, high = dim_of(y.beta_fast), dim_of(y.beta_slow)
        if y.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, H - 1)
        if low == high:
            high += 0.001  # as transformers: no division by zero
        ramp = np.clip((np.arange(H // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        keep = 1 - ramp                       # 1: extrapolate (unchanged), 0: interpolate
        inv = inv / y.factor * (1 - keep) + inv * keep
    return inv.astype(np.float32)


def rope_attention_factor(cfg: ModelConfig) -> float:
    """The factor cos and sin are multiplied by: 1, or with YaRN its ``attention_factor``
    (default ``0.1 ln(factor) + 1``; with ``mscale`` and ``mscale_all_dim`` both set, the
    ratio of that form with each as the multiplier of the log), as transformers computes it."""
    if cfg.rope_type != "yarn":
        return 1.0
    y = cfg.rope_scaling
    if y.attention_factor is not None:
        return float(y.attention_factor)

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if y.mscale and y.mscale_all_dim:
        return float(mscale(y.factor, y.mscale) / mscale(y.factor, y.mscale_all_dim))
    return float(mscale(y.factor))


def rope_tables(positions: Array, cfg: ModelConfig) -> tuple[Array, Array]:
    """cos, sin [B, T, H] for integer positions [B, T] (half-rotation layout, as HF),
    times :func:`rope_attention_factor` (YaRN)."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(rope_inv_freq(cfg))  # [B, T, H/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    scale = rope_attention_factor(cfg)
    if scale == 1.0:
        return jnp.cos(emb), jnp.sin(emb)
    return jnp.cos(emb) * scale, jnp.sin(emb) * scale


def rope_table(cfg: ModelConfig, length: int) -> tuple[Array, Array]:
    """cos, sin [length, H] of positions 0 .. length - 1, for :func:`forward`'s
    ``rope_table`` (a lookup instead of evaluating cos/sin at every call)."""
    cos, sin = rope_tables(jnp.arange(length)[None], cfg)
    return cos[0], sin[0]


def apply_rope(x: Array, cos: Array, sin: Array) -> Array:
    """x [B, T, N, H] rotated by position: x*cos + rotate_half(x)*sin (in float32)."""
    xf = x.astype(jnp.float32)
    x1, x2 = jnp.split(xf, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (xf * cos[:, :, None, :] + rotated * sin[:, :, None, :]).astype(x.dtype)
