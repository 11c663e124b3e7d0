"""Optimizers for the policy: Muon (hidden matrices) + AdamW (everything else), or AdamW.

Built on ``optax.contrib.muon``: it already partitions params into a Muon group
and an AdamW group and orthogonalises N-d weights through
``MuonDimensionNumbers``. What we add is the *labelling* of our parameter tree
(:func:`muon_dimension_numbers`): the stacked ``[L, ...]`` attention and MLP
projections go to Muon with the layer axis as a batch axis (each layer's matrix
orthogonalised on its own), embeddings / output head / norms / biases go to AdamW.

Muon update (Jordan 2024; Liu et al. 2025 "Muon is Scalable", arXiv 2502.16982):
``M_t = beta M_{t-1} + (1 - beta) G_t``; Nesterov ``M^ = beta M_t + (1 - beta) G_t``
(optax's bias-corrected form); ``O = NS5(M^ / ||M^||_F)`` with the quintic
Newton-Schulz iteration ``X <- a X + (b A + c A^2) X``, ``A = X X^T``,
``(a, b, c) = (3.4445, -4.7750, 2.0315)``; update ``-lr * (0.2 sqrt(max(fan_in, fan_out)) O + wd W)``
(``consistent_rms=0.2`` matches AdamW's update RMS, so one learning rate serves both groups).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers

NS_COEFFS = (3.4445, -4.7750, 2.0315)

# Parameter names (last path key) that are hidden projection matrices: their rank,
# and (reduction axes, output axes) for the whole layer matrix and for one head.
# Shapes: q/k/v [L, D, H, hd]; o [L, H, hd, D]; gate/up [L, D, F]; down [L, F, D].
_D = MuonDimensionNumbers
_HIDDEN: dict[str, tuple[int, MuonDimensionNumbers, MuonDimensionNumbers]] = {
    **{n: (4, _D((1,), (2, 3)), _D((1,), (3,))) for n in ("q_proj", "k_proj", "v_proj")},
    "o_proj": (4, _D((1, 2), (3,)), _D((2,), (3,))),
    **{n: (3, _D((1,), (2,)), _D((1,), (2,))) for n in ("gate_proj", "up_proj", "down_proj")},
}


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimizer and QK-Clip settings."""

    name: str = "muon"                  # key of OPTIMIZERS
    learning_rate: float = 1e-3
    warmup_steps: int = 0
    decay_steps: int = 0                # cosine decay to 10% after warmup; 0 = constant
    weight_decay: float = 0.0
    b1: float = 0.9                     # AdamW
    b2: float = 0.95
    eps: float = 1e-8
    max_grad_norm: float = 1.0          # global-norm clipping; 0 = off
    muon_beta: float = 0.95
    ns_steps: int = 5
    consistent_rms: float | None = 0.2
    muon_per_head: bool = False         # orthogonalise each head's slice of q/k/v/o separately
    qk_clip_tau: float = 100.0          # QK-Clip threshold; 0 = off
    qk_clip_alpha: float = 0.5
    float32_state: bool = True          # optimizer state and update math in float32 for bf16/f16 params

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.name!r}; known: {sorted(OPTIMIZERS)}")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not 0 <= self.qk_clip_alpha <= 1:
            raise ValueError(f"qk_clip_alpha must be in [0, 1], got {self.qk_clip_alpha}")


def muon_dimension_numbers(params: Any, per_head: bool = False) -> Any:
    """Tree like ``params``: ``MuonDimensionNumbers`` on hidden projections, None elsewhere
    (None = AdamW). The leading ``layers`` axis is a batch axis, never flattened in."""
    def label(path, x):
        rank, whole, head = _HIDDEN.get(getattr(path[-1], "key", None), (None, None, None))
        if rank is None or x.ndim != rank:
            return None
        return head if per_head else whole
    return jax.tree_util.tree_map_with_path(label, params)


def learning_rate_schedule(cfg: OptimConfig) -> optax.Schedule:
    """Linear warmup, then constant or cosine decay to 10% over ``decay_steps``."""
    if cfg.decay_steps:
        return optax.warmup_cosine_decay_schedule(
            0.0, cfg.learning_rate, max(cfg.warmup_steps, 1), cfg.warmup_steps + cfg.decay_steps,
            end_value=0.1 * cfg.learning_rate)
    if cfg.warmup_steps:
        return optax.linear_schedule(0.0, cfg.learning_rate, cfg.warmup_steps)
    return optax.constant_schedule(cfg.learning_rate)


def _muon(cfg: OptimConfig, dims: Callable[[Any], Any]) -> optax.GradientTransformation:
    return optax.contrib.muon(
        learning_rate=learning_rate_schedule(cfg), ns_coeffs=NS_COEFFS, ns_steps=cfg.ns_steps,
        beta=cfg.muon_beta, eps=cfg.eps, weight_decay=cfg.weight_decay, adam_b1=cfg.b1,
        adam_b2=cfg.b2, adam_weight_decay=cfg.weight_decay, muon_weight_dimension_numbers=dims,
        consistent_rms=cfg.consistent_rms)


def _adamw(cfg: OptimConfig, dims: Callable[[Any], Any]) -> optax.GradientTransformation:
    del dims
    return optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                       weight_decay=cfg.weight_decay)


# name -> builder(cfg, dimension_numbers_fn) -> GradientTransformation
OPTIMIZERS: dict[str, Callable[[OptimConfig, Callable], optax.GradientTransformation]] = {
    "muon": _muon,
    "adamw": _adamw,
}


def make_optimizer(cfg: OptimConfig,
                   dimension_numbers: Callable[[Any], Any] | None = None) -> optax.GradientTransformation:
    """Global-norm clipping, then the configured optimizer.

    ``dimension_numbers`` maps a param tree to Muon dimension numbers (None leaves
    use AdamW); default :func:`muon_dimension_numbers` for swarmjax's transformer.
    """
    dims = dimension_numbers or (lambda p: muon_dimension_numbers(p, cfg.muon_per_head))
    opt = OPTIMIZERS[cfg.name](cfg, dims)
    if cfg.max_grad_norm:
        opt = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), opt)
    return float32_state(opt) if cfg.float32_state else opt


def _upcast(tree: Any) -> Any:
    return jax.tree.map(lambda x: x.astype(jnp.float32) if _low_float(x) else x, tree)


def _low_float(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and jnp.finfo(x.dtype).bits < 32


def float32_state(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """``inner`` with its state and arithmetic in float32 when params and gradients are
    bfloat16 / float16: gradients and params are upcast before ``inner.update`` (so
    momenta, second moments, the clipping norm and Newton-Schulz run in float32) and
    the updates are cast back to each gradient's dtype. A no-op for float32 params.

    Hand-written because optax offers this per optimizer only (``adam(mu_dtype=)``
    keeps the first moment alone), not for Muon or a chain."""
    def init(params):
        return inner.init(_upcast(params))

    def update(updates, state, params=None):
        new, state = inner.update(_upcast(updates), state, None if params is None else _upcast(params))
        new = jax.tree.map(lambda u, g: u.astype(g.dtype) if hasattr(g, "dtype") else u, new, updates)
        return new, state

    return optax.GradientTransformation(init, update)
