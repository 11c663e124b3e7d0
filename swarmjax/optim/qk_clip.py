"""QK-Clip (MuonClip, Kimi K2 report, arXiv 2507.20534), applied after the optimizer step.

With ``S_h`` the largest pre-softmax logit of query head ``h`` in the step's forward
pass (``forward(..., return_max_logits=True).max_logits [L, N]``) and
``gamma_h = min(1, tau / S_h)``, Kimi rescales ``W_q^h <- gamma_h^alpha W_q^h`` and
``W_k^h <- gamma_h^(1-alpha) W_k^h``, so head h's max logit becomes ``<= tau`` and
heads under tau are untouched.

Grouped-query attention: key head ``k`` serves query heads ``g(k)``, so it gets one
factor. We use ``kappa_k = (min_{h in g(k)} gamma_h)^(1-alpha)`` for the key and
``gamma_h / kappa_k`` for each query head: every head's logits scale by exactly
``gamma_h`` (<= tau after the clip, unchanged when under tau), and without GQA
this is Kimi's split ``gamma^alpha`` / ``gamma^(1-alpha)``. Biases of the q/k
projections are scaled with their weights. (A query head under tau in a group
whose key shrinks gets a factor > 1 on its query weights that cancels the
key's shrink exactly.)

With per-head q/k RMSNorm (Qwen3), ``q = RMSNorm(x W_q) * g_q`` does not depend on
the scale of ``W_q``: the logit scale lives in the norm weights ``g_q, g_k [hd]``,
which all heads of a layer share. There the clip is per layer:
``gamma_l = min_h gamma_{l,h}``, ``g_q <- gamma_l^alpha g_q``, ``g_k <- gamma_l^(1-alpha) g_k``;
every head stays ``<= tau`` and layers with no head over tau are unchanged, but
under-tau heads of a clipped layer shrink too (the architecture has no per-head knob).

Under data, sequence or context sharding ``max_logits`` is already a max over all
shards: the forward computes it inside ``jax.jit`` and GSPMD inserts the all-reduce.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from swarmjax.models.config import ModelConfig

Array = jax.Array


def clip_factors(max_logits: Array, tau: float) -> Array:
    """``gamma = min(1, tau / S)`` per layer and head, [L, N] (1 where S <= tau)."""
    S = max_logits.astype(jnp.float32)
    return jnp.where(S > tau, tau / jnp.maximum(S, 1e-30), 1.0)


def qk_clip(params: dict[str, Any], max_logits: Array, cfg: ModelConfig, *, tau: float = 100.0,
            alpha: float = 0.5) -> tuple[dict[str, Any], dict[str, Array]]:
    """Rescale query/key weights so no head's max logit exceeds ``tau``.

    Args:
      params: transformer params (stacked layers).
      max_logits: [L, N] per-layer per-head max pre-softmax logit of the step.
      cfg: the model config (head grouping, qk-norm).
    Returns:
      (new params, metrics: ``qk_clip_heads`` number of heads over tau,
      ``max_attn_logit`` the largest logit seen).

    With LoRA (``cfg.lora``) the frozen weights stay: the same factors multiply the
    adapters' per-head query and key scales (``params["lora"]["attn"]["q_clip"]`` [L, N],
    ``["k_clip"]`` [L, K], applied after the projection and its norm), so the merged
    model's queries and keys are rescaled exactly as its weights would be.
    """
    L, K, G = cfg.num_layers, cfg.num_kv_heads, cfg.num_groups
    gamma = clip_factors(max_logits, tau)                              # [L, N]
    metrics = {"qk_clip_heads": jnp.sum(gamma < 1.0), "max_attn_logit": jnp.max(max_logits)}
    if cfg.lora is not None:
        if cfg.qk_norm:
            g = jnp.min(gamma, axis=1, keepdims=True)                   # [L, 1]
            q_factor, k_factor = jnp.broadcast_to(g ** alpha, gamma.shape), jnp.broadcast_to(g ** (1.0 - alpha), (L, K))
        else:
            k_factor = jnp.min(gamma.reshape(L, K, G), axis=2) ** (1.0 - alpha)   # [L, K]
            q_factor = gamma / jnp.repeat(k_factor, G, axis=1)                 # [L, N]
        lora_attn = dict(params["lora"]["attn"])
        for name, f in (("q_clip", q_factor), ("k_clip", k_factor)):
            lora_attn[name] = (lora_attn[name] * f).astype(lora_attn[name].dtype)
        return {**params, "lora": {**params["lora"], "attn": lora_attn}}, metrics
    attn = dict(params["layers"]["attn"])
    dt = lambda x: x.dtype

    if cfg.qk_norm:
        g = jnp.min(gamma, axis=1)                                      # [L]
        q_scale, k_scale = g ** alpha, g ** (1.0 - alpha)
        attn["q_norm"] = {"scale": (attn["q_norm"]["scale"] * q_scale[:, None]).astype(dt(attn["q_norm"]["scale"]))}
        attn["k_norm"] = {"scale": (attn["k_norm"]["scale"] * k_scale[:, None]).astype(dt(attn["k_norm"]["scale"]))}
    else:
        kappa = jnp.min(gamma.reshape(L, K, G), axis=2) ** (1.0 - alpha)   # [L, K]
        q_scale = gamma / jnp.repeat(kappa, G, axis=1)                     # [L, N]
        # q_proj [L, D, N, H], k_proj [L, D, K, H]; biases [L, N, H], [L, K, H]
        attn["q_proj"] = (attn["q_proj"] * q_scale[:, None, :, None]).astype(dt(attn["q_proj"]))
        attn["k_proj"] = (attn["k_proj"] * kappa[:, None, :, None]).astype(dt(attn["k_proj"]))
        if cfg.attention_bias:
            attn["q_bias"] = (attn["q_bias"] * q_scale[:, :, None]).astype(dt(attn["q_bias"]))
            attn["k_bias"] = (attn["k_bias"] * kappa[:, :, None]).astype(dt(attn["k_bias"]))

    new = dict(params)
    new["layers"] = dict(params["layers"], attn=attn)
    return new, metrics
