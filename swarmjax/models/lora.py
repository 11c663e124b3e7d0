"""LoRA adapters over the decoder's linear maps, many adapters over one base in one batch.

LoRA (Hu et al. 2021, arXiv 2106.09685) freezes a weight W and trains a low-rank update.
For a target weight mapping its ``in`` dims to its ``out`` dims, adapter ``i`` adds::

    y = x W + (alpha / R) (x A_i) B_i        A_i [in..., R], B_i [R, out...]

A_i is drawn as PEFT draws it (kaiming-uniform with a = sqrt(5): U(-1/sqrt(fan_in),
1/sqrt(fan_in))), B_i is zero, so at the start y = x W. Several adapters share the
base: the adapters of one target are stacked on an adapter axis ``A`` and every row of a
batch picks its own (``adapter [B]`` int; -1: the bare base), as multi-adapter serving
does (S-LoRA, arXiv 2311.03285; Punica, arXiv 2310.18547): an orchestrator's trained
adapter and its frozen sub-agents' snapshot decode in one forward over one copy of W.

Written here rather than with qwix (the LoRA library Tunix uses) because qwix keeps one
adapter per weight (no per-row index) and, on these linen modules, fails on ``jnp.einsum``
projections and matches k/v weights by shape (checked with qwix 0.1.8).

The adapters are a pytree beside the params (never inside them: the optimizer sees only
the adapters), shaped like the ``layers`` subtree of the targets::

    {"attn": {"q_proj": {"a": [L, A, D, R], "b": [L, A, R, N, H]}, ...},
     "mlp":  {"up_proj": {"a": [L, A, D, R], "b": [L, A, R, F]}, ...}}

:func:`swarmjax.models.transformer.forward` takes them (``lora=``, ``adapter=``);
:func:`merge` folds one adapter into the weights (export, QK-Clip's view of the
weights). Dimension letters as in :mod:`swarmjax.models.transformer`; A adapters, R rank.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from swarmjax.models.config import LORA_TARGETS as TARGETS
from swarmjax.models.config import LoraConfig, ModelConfig  # noqa: F401  (re-exported)

Array = jax.Array

def target_shapes(cfg: ModelConfig, target: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(in dims, out dims) of ``target``'s weight in ``cfg``."""
    _, ins, outs = TARGETS[target]
    return tuple(getattr(cfg, n) for n in ins), tuple(getattr(cfg, n) for n in outs)


def init_lora(cfg: ModelConfig, key: Array, *, adapters: int = 1, dtype: Any = None) -> dict[str, Any]:
    """``adapters`` fresh adapters of every target of ``cfg.lora`` (module docstring: a
    [L, A, in..., R] uniform in +-1/sqrt(fan_in), b [L, A, R, out...] zeros; the params'
    dtype by default): each adds nothing yet. Beside them ``attn.q_clip`` [L, N] and
    ``attn.k_clip`` [L, K], ones: per-head factors on the queries and keys that QK-Clip
    lowers instead of the frozen weights (:func:`swarmjax.optim.qk_clip`; not trained)."""
    lcfg = cfg.lora
    if lcfg is None:
        raise ValueError("init_lora: the model config has no lora (ModelConfig.lora=LoraConfig(...))")
    dtype = cfg.jnp_param_dtype if dtype is None else dtype
    L, R = cfg.num_layers, lcfg.rank
    out = clip_factors(cfg, dtype)
    for i, t in enumerate(lcfg.targets):
        ins, outs = target_shapes(cfg, t)
        bound = 1.0 / math.sqrt(math.prod(ins))
        a = jax.random.uniform(jax.random.fold_in(key, i), (L, adapters, *ins, R), dtype, -bound, bound)
        out.setdefault(TARGETS[t][0], {})[t] = {"a": a, "b": jnp.zeros((L, adapters, R, *outs), dtype)}
    return out


def clip_factors(cfg: ModelConfig, dtype: Any) -> dict[str, Any]:
    """QK-Clip's per-head factors of a LoRA model, none lowered yet: ``{"attn": {"q_clip":
    ones [L, N], "k_clip": ones [L, K]}}``, the tree the adapters are added to."""
    L = cfg.num_layers
    return {"attn": {"q_clip": jnp.ones((L, cfg.num_heads), dtype), "k_clip": jnp.ones((L, cfg.num_kv_heads), dtype)}}


def attach(layers: dict[str, Any], lora: dict[str, Any] | None) -> dict[str, Any]:
    """The ``layers`` subtree with each adapter's a, b beside its weight (``q_proj_lora_a``,
    ``q_proj_lora_b``), where the modules read them; ``layers`` as given without ``lora``."""
    if not lora:
        return layers
    out = dict(layers)
    for module, targets in lora.items():
        sub = dict(out[module])
        for t, ab in targets.items():
            if isinstance(ab, dict):
                sub[f"{t}_lora_a"], sub[f"{t}_lora_b"] = ab["a"], ab["b"]
            else:                                   # q_clip / k_clip
                sub[t] = ab
        out[module] = sub
    return out


def delta(x: Array, a: Array, b: Array, adapter: Array | None, scale: float, *,
          dropout: float = 0.0, key: Array | None = None) -> Array:
    """One layer's adapter update of one target, per row.

    x [B, T, in...]; a [A, in..., R]; b [A, R, out...]; adapter None (adapter 0 for
    every row) or [B] int (-1: the bare base, no update). Returns scale (x A_i) B_i
    [B, T, out...] in x's dtype; with ``key`` and ``dropout`` > 0 the inputs of the
    adapter path are dropped with that probability (the kept ones scaled by 1/(1-p))."""
    B, T = x.shape[:2]
    A, R = a.shape[0], a.shape[-1]
    outs = b.shape[2:]
    xf = x.reshape(B, T, -1)                                                # [B, T, I]
    if key is not None and dropout > 0:
        keep = jax.random.bernoulli(key, 1.0 - dropout, xf.shape)
        xf = jnp.where(keep, xf / (1.0 - dropout), 0).astype(x.dtype)
    a2, b2 = a.reshape(A, -1, R).astype(x.dtype), b.reshape(A, R, -1).astype(x.dtype)   # [A, I, R], [A, R, O]
    if adapter is None:
        y = (xf @ a2[0]) @ b2[0]                                            # [B, T, O]
    else:
        idx = jnp.asarray(adapter, jnp.int32)
        pick = jnp.maximum(idx, 0)
        xa = jnp.einsum("BTI,BIR->BTR", xf, jnp.take(a2, pick, axis=0))     # [B, T, R]
        y = jnp.einsum("BTR,BRO->BTO", xa, jnp.take(b2, pick, axis=0))      # [B, T, O]
        y = jnp.where((idx >= 0)[:, None, None], y, 0)
    return (y * jnp.asarray(scale, y.dtype)).reshape(B, T, *outs)


def merge(params: dict[str, Any], cfg: ModelConfig, *, index: int = 0) -> dict[str, Any]:
    """The params of ``cfg`` with its adapter ``index`` (``params["lora"]``) folded into
    the weights: W + (alpha / R) A_i B_i per layer, W's dtype kept, no "lora" left: the
    model that adapter makes (for ``cfg.replace(lora=None)``), for export or QK-Clip."""
    scale = cfg.lora.scale
    params = dict(params)
    lora = params.pop("lora")
    layers = dict(params["layers"])
    for module, targets in lora.items():
        sub = dict(layers[module])
        for t, ab in targets.items():
            if not isinstance(ab, dict):
                continue
            w = sub[t]                                                      # [L, in..., out...]
            a, b = ab["a"][:, index], ab["b"][:, index]                     # [L, in..., R], [L, R, out...]
            L, R = a.shape[0], a.shape[-1]
            upd = jnp.einsum("LIR,LRO->LIO", a.reshape(L, -1, R).astype(jnp.float32),
                             b.reshape(L, R, -1).astype(jnp.float32)) * scale
            sub[t] = (w.astype(jnp.float32) + upd.reshape(w.shape)).astype(w.dtype)
        layers[module] = sub
    layers["attn"] = _fold_clip(layers["attn"], lora["attn"]["q_clip"], lora["attn"]["k_clip"], cfg)
    return {**params, "layers": layers}


def _fold_clip(attn: dict[str, Any], q: Array, k: Array, cfg: ModelConfig) -> dict[str, Any]:
    """QK-Clip's per-head factors (q [L, N], k [L, K]) folded into the merged weights as
    :func:`swarmjax.optim.qk_clip` folds them without LoRA: the q/k norm scales (one
    factor a layer with qk-norm) or the projections and their biases."""
    attn = dict(attn)
    scale = lambda x, f: (x.astype(jnp.float32) * f).astype(x.dtype)
    if cfg.qk_norm:
        attn["q_norm"] = {"scale": scale(attn["q_norm"]["scale"], q[:, :1])}
        attn["k_norm"] = {"scale": scale(attn["k_norm"]["scale"], k[:, :1])}
        return attn
    attn["q_proj"] = scale(attn["q_proj"], q[:, None, :, None])
    attn["k_proj"] = scale(attn["k_proj"], k[:, None, :, None])
    if cfg.attention_bias:
        attn["q_bias"], attn["k_bias"] = scale(attn["q_bias"], q[:, :, None]), scale(attn["k_bias"], k[:, :, None])
    return attn


def frozen_part(params: dict[str, Any]) -> dict[str, Any]:
    """What a frozen copy of ``params`` (sub-agents, KL reference, judge) must hold: with
    adapters only ``{"lora": ...}`` (the base is frozen anyway and is shared, so a copy
    costs the adapters' few MB), else all of ``params``."""
    return {"lora": params["lora"]} if "lora" in params else params


def over_base(frozen: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """A frozen copy (:func:`frozen_part`) made whole over ``params``' base: the same base
    arrays (held once) with the copy's adapters; a whole copy as it is."""
    return {**params, "lora": frozen["lora"]} if set(frozen) == {"lora"} else frozen


def bare(lora: dict[str, Any]) -> dict[str, Any]:
    """``lora`` with every B zero and QK-Clip's factors one: adapters that add nothing (the
    bare base, bit for bit: ``x A 0 = 0``), shaped as the trained ones, e.g. sub-agents that
    decode with the base."""
    keep = lambda p, x: jnp.zeros_like(x) if p[-1].key == "b" else jnp.ones_like(x) if p[-1].key.endswith("_clip") \
        else x
    return jax.tree_util.tree_map_with_path(keep, lora)
