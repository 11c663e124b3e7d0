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

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from swarmjax.models.config import ModelConfig

Array = jax.Array

# target -> (module, its input dims, its output dims) as names of ModelConfig sizes
TARGETS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "q_proj": ("attn", ("hidden_size",), ("num_heads", "head_dim")),
    "k_proj": ("attn", ("hidden_size",), ("num_kv_heads", "head_dim")),
    "v_proj": ("attn", ("hidden_size",), ("num_kv_heads", "head_dim")),
    "o_proj": ("attn", ("num_heads", "head_dim"), ("hidden_size",)),
    "gate_proj": ("mlp", ("hidden_size",), ("intermediate_size",)),
    "up_proj": ("mlp", ("hidden_size",), ("intermediate_size",)),
    "down_proj": ("mlp", ("intermediate_size",), ("hidden_size",)),
}
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """Low-rank adapters of rank ``rank`` on the ``targets`` (weight names of the model's
    attention and MLP: :data:`TARGETS`), scaled by ``alpha / rank``; ``dropout``: the
    probability of dropping each input of an adapter's path in training (the base path
    keeps all of them), as PEFT's ``lora_dropout``."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] = ATTENTION + MLP

    def __post_init__(self):
        if not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"lora.rank must be an int >= 1, got {self.rank!r}")
        if not self.alpha > 0:
            raise ValueError(f"lora.alpha must be > 0, got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout!r}")
        unknown = [t for t in self.targets if t not in TARGETS]
        if not self.targets or unknown or len(set(self.targets)) < len(self.targets):
            raise ValueError(f"lora.targets: distinct names of the model's linear maps, one or more of "
                             f"{', '.join(TARGETS)}; got {self.targets!r}" +
                             (f" ({', '.join(map(repr, unknown))} matches no module)" if unknown else ""))

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def check(self, cfg: ModelConfig) -> None:
        """A one-line error for targets this model cannot carry (a mixture of experts has
        no dense MLP weights: its experts are not LoRA targets yet)."""
        dense = [t for t in self.targets if TARGETS[t][0] == "mlp"]
        if cfg.is_moe and dense:
            raise ValueError(f"lora.targets {dense}: this model's MLP is a mixture of experts, whose "
                             f"experts take no adapters yet; target {', '.join(ATTENTION)}")


def target_shapes(cfg: ModelConfig, target: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(in dims, out dims) of ``target``'s weight in ``cfg``."""
    _, ins, outs = TARGETS[target]
    return tuple(getattr(cfg, n) for n in ins), tuple(getattr(cfg, n) for n in outs)


def init_lora(cfg: ModelConfig, lcfg: LoraConfig, key: Array, *, adapters: int = 1,
              dtype: Any = jnp.float32) -> dict[str, Any]:
    """``adapters`` fresh adapters of every target (module docstring: a [L, A, in..., R]
    uniform in +-1/sqrt(fan_in), b [L, A, R, out...] zeros): each adds nothing yet."""
    lcfg.check(cfg)
    L, R, out = cfg.num_layers, lcfg.rank, {}
    for i, t in enumerate(lcfg.targets):
        ins, outs = target_shapes(cfg, t)
        bound = 1.0 / math.sqrt(math.prod(ins))
        a = jax.random.uniform(jax.random.fold_in(key, i), (L, adapters, *ins, R), dtype, -bound, bound)
        out.setdefault(TARGETS[t][0], {})[t] = {"a": a, "b": jnp.zeros((L, adapters, R, *outs), dtype)}
    return out


def attach(layers: dict[str, Any], lora: dict[str, Any] | None) -> dict[str, Any]:
    """The ``layers`` subtree with each adapter's a, b beside its weight (``q_proj_lora_a``,
    ``q_proj_lora_b``), where the modules read them; ``layers`` as given without ``lora``."""
    if not lora:
        return layers
    out = dict(layers)
    for module, targets in lora.items():
        sub = dict(out[module])
        for t, ab in targets.items():
            sub[f"{t}_lora_a"], sub[f"{t}_lora_b"] = ab["a"], ab["b"]
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


def merge(params: dict[str, Any], lora: dict[str, Any], scale: float, *, index: int = 0) -> dict[str, Any]:
    """The params with adapter ``index`` folded into its weights: W + scale A_i B_i (per
    layer; W's dtype kept): the model that adapter makes, for export or QK-Clip."""
    layers = dict(params["layers"])
    for module, targets in lora.items():
        sub = dict(layers[module])
        for t, ab in targets.items():
            w = sub[t]                                                      # [L, in..., out...]
            a, b = ab["a"][:, index], ab["b"][:, index]                     # [L, in..., R], [L, R, out...]
            L, R = a.shape[0], a.shape[-1]
            upd = jnp.einsum("LIR,LRO->LIO", a.reshape(L, -1, R).astype(jnp.float32),
                             b.reshape(L, R, -1).astype(jnp.float32)) * scale
            sub[t] = (w.astype(jnp.float32) + upd.reshape(w.shape)).astype(w.dtype)
        layers[module] = sub
    return {**params, "layers": layers}
