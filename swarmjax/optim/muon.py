"""Optimizers for the policy: Muon (hidden matrices) + AdamW (everything else), or AdamW.

Composed as ``optax.contrib.muon`` composes it (``optax.partition`` into a Muon group and
an AdamW group, N-d weights orthogonalised through ``MuonDimensionNumbers``). What we
add is the *labelling* of our parameter tree (:func:`muon_dimension_numbers`): the
stacked ``[L, ...]`` attention and MLP projections go to Muon with the layer axis as a
batch axis (each layer's matrix orthogonalised on its own), embeddings / output head /
norms / biases go to AdamW; and, on a mesh, Newton-Schulz with the layers spread over the
devices (:func:`newton_schulz`) instead of every layer's matrix gathered on every device
(a mixture of experts' matrices, each whole on the device of its expert, stay there).

Muon update (Jordan 2024; Liu et al. 2025 "Muon is Scalable", arXiv 2502.16982):
``M_t = beta M_{t-1} + (1 - beta) G_t``; Nesterov ``M^ = beta M_t + (1 - beta) G_t``
(optax's bias-corrected form); ``O = NS5(M^ / ||M^||_F)`` with the quintic
Newton-Schulz iteration ``X <- a X + (b A + c A^2) X``, ``A = X X^T``,
``(a, b, c) = (3.4445, -4.7750, 2.0315)``; update ``-lr * (0.2 sqrt(max(fan_in, fan_out)) O + wd W)``
(``consistent_rms=0.2`` matches AdamW's update RMS, so one learning rate serves both groups).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from optax.contrib import MuonDimensionNumbers

from swarmjax.models.moe import EXPERT_AXES

NS_COEFFS = (3.4445, -4.7750, 2.0315)

# Parameter names (last path key) that are hidden projection matrices: their rank,
# and (reduction axes, output axes) for the whole layer matrix and for one head.
# Shapes: q/k/v [L, D, H, hd]; o [L, H, hd, D]; gate/up [L, D, F]; down [L, F, D]; experts
# [L, E, D, F] / [L, E, F, D], each expert's matrix on its own. A MoE router [L, D, E] stays
# with AdamW (a small classifier over experts, not a hidden projection).
_D = MuonDimensionNumbers
# Expert matrices, which Newton-Schulz leaves on the devices that hold them (each whole on
# the device of its expert under the ``experts`` sharding rule).
_EXPERTS = tuple(EXPERT_AXES)
_HIDDEN: dict[str, tuple[int, MuonDimensionNumbers, MuonDimensionNumbers]] = {
    **{n: (4, _D((1,), (2, 3)), _D((1,), (3,))) for n in ("q_proj", "k_proj", "v_proj")},
    "o_proj": (4, _D((1, 2), (3,)), _D((2,), (3,))),
    **{n: (3, _D((1,), (2,)), _D((1,), (2,))) for n in ("gate_proj", "up_proj", "down_proj")},
    **{n: (4, _D((2,), (3,)), _D((2,), (3,))) for n in _EXPERTS},
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
    (None = AdamW). The leading ``layers`` axis is a batch axis, never flattened in. A LoRA
    adapter's a [L, A, in..., R] and b [L, A, R, out...] (``params["lora"]``) are
    matrices too, one per layer and adapter: in x R and R x out."""
    def label(path, x):
        keys = [getattr(k, "key", None) for k in path]
        if keys[0] == "lora" and keys[-1] in ("a", "b") and x.ndim >= 4:
            return _D(tuple(range(2, x.ndim - 1)), (x.ndim - 1,)) if keys[-1] == "a" else \
                _D((2,), tuple(range(3, x.ndim)))
        rank, whole, head = _HIDDEN.get(keys[-1], (None, None, None))
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


def _is_dims(d: Any) -> bool:
    return d is None or isinstance(d, MuonDimensionNumbers)


def _axes(axes: int | tuple[int, ...], ndim: int) -> tuple[int, ...]:
    """A ``MuonDimensionNumbers`` field as non-negative axes."""
    return tuple(a % ndim for a in ((axes,) if isinstance(axes, int) else axes))


def _resolve(dims: Callable[[Any], Any], tree: Any) -> Any:
    """``dims(tree)`` with ``optax.MaskedNode`` where ``tree`` has one (the leaves of the
    other group inside ``optax.partition``)."""
    masked = lambda x: isinstance(x, optax.MaskedNode)
    return jax.tree.map(lambda d, x: optax.MaskedNode() if masked(x) else d, dims(tree), tree,
                        is_leaf=lambda v: _is_dims(v) or masked(v))


def _each_matrix(fn: Callable, dims: Callable[[Any], Any], tree: Any, *, with_name: bool = False) -> Any:
    """``fn(leaf, dimension numbers)`` on every leaf ``dims`` labels, other leaves as they are
    (``with_name``: ``fn(leaf, dimension numbers, last key of its path)``)."""
    def one(path, d, x):
        if not isinstance(d, MuonDimensionNumbers):
            return x
        return fn(x, d, getattr(path[-1], "key", None)) if with_name else fn(x, d)
    return jax.tree_util.tree_map_with_path(one, _resolve(dims, tree), tree,
                        is_leaf=lambda v: _is_dims(v) or isinstance(v, optax.MaskedNode))


def _spread(x: jax.Array, mesh: Mesh, *, back: bool = False) -> jax.Array:
    """``x`` sharded along axis 0 over every mesh axis (size > 1), the other axes whole;
    ``back``: from there to axis 0 whole, the other axes as XLA sees fit (the parameter's
    sharding, which the update is added to).

    One mesh axis at a time (``fsdp``, ``tensor``, then ``data``, and in reverse order on
    the way back), the other axes left to XLA: each stage is one all-to-all over one axis,
    which XLA's SPMD partitioner emits, where a jump between a two-axis sharding and this
    one makes it replicate the whole tensor on every device first."""
    order = [a for a in ("fsdp", "tensor", "data") if a in mesh.axis_names]
    order = [a for a in order + [a for a in mesh.axis_names if a not in order] if mesh.shape[a] > 1]
    stages = [tuple(order[:i]) for i in range(1, len(order) + 1)]
    if back:
        stages = [tuple(order[:i]) for i in range(len(order) - 1, -1, -1)]
    for axes in stages:
        whole = not back and len(axes) == len(order)
        rest = None if whole else PartitionSpec.UNCONSTRAINED
        x = jax.lax.with_sharding_constraint(
            x, NamedSharding(mesh, PartitionSpec(axes or None, *[rest] * (x.ndim - 1))))
    return x


def newton_schulz(x: jax.Array, dims: MuonDimensionNumbers, *, coeffs: tuple[float, float, float] = NS_COEFFS,
                  steps: int = 5, eps: float = 1e-8, mesh: Mesh | None = None) -> jax.Array:
    """Orthogonalise every matrix of ``x``: ``O = NS(X / (||X||_F + eps))`` with ``steps``
    quintic iterations ``X <- a X + (b A + c A^2) X``, ``A = X X^T`` (on the wide side).

    ``dims`` names the reduction (fan-in) and output (fan-out) axes of one matrix; every
    other axis is a batch axis (e.g. q_proj ``[L, D, H, hd]`` with reduction ``(1,)`` and
    output ``(2, 3)`` is ``L`` matrices of ``D x H*hd``). ``x`` is viewed as a stack
    ``[batch..., fan_in, fan_out]``.

    With a ``mesh`` of more than one device the stack is padded to a multiple of the
    device count (zero matrices orthogonalise to zero) and sharded along it over every
    mesh axis: each device orthogonalises whole matrices of its share, and XLA moves the
    momentum from the parameter's sharding to that one and back with all-to-alls (the
    scheme of Moonlight's distributed Muon, Liu et al. 2025, arXiv 2502.16982).
    Without it, XLA gathers every layer's full float32 matrix on every device at once
    (59 GiB a device for Qwen3-8B on 64 devices). The arithmetic of each matrix is
    unchanged, so the result equals the single-device one to float tolerance.

    Hand-written because optax's Newton-Schulz (``optax.contrib.muon``) is not exported
    and has no place for the sharding between the reshape and the iteration; its
    arithmetic (Frobenius preconditioning, the base quintic step) is the same.
    """
    red, out = _axes(dims.reduction_axis, x.ndim), _axes(dims.output_axis, x.ndim)
    batch = tuple(a for a in range(x.ndim) if a not in red + out)
    perm = batch + red + out
    x = x.transpose(perm)                                                  # [batch..., fan_in..., fan_out...]
    lead = x.shape[0]
    spread = mesh is not None and mesh.devices.size > 1 and len(batch) > 0
    if spread:
        # First batch axis (the layers) over every device, padded to a multiple of their
        # count; from the parameter's sharding one all-to-all a mesh axis (_spread).
        x = jnp.pad(x, [(0, -lead % mesh.devices.size)] + [(0, 0)] * (x.ndim - 1))
        x = _spread(x, mesh)
    size = lambda axes: math.prod(x.shape[perm.index(a)] for a in axes)
    # [batch..., fan_in, fan_out]: the batch axes kept apart (merging them would gather an
    # axis that is split, the experts of [L, E, D, F])
    stack = x.reshape(x.shape[:len(batch)] + (size(red), size(out)))
    wide = stack.shape[-2] > stack.shape[-1]
    if wide:
        stack = stack.mT                                                   # rows <= columns
    a, b, c = coeffs
    with jax.named_scope("newton_schulz"):
        stack = stack / (jnp.linalg.norm(stack, axis=(-2, -1), keepdims=True) + eps)
        for _ in range(steps):
            gram = stack @ stack.mT                                        # [batch..., rows, rows]
            stack = a * stack + (b * gram + c * gram @ gram) @ stack
    if wide:
        stack = stack.mT
    x = stack.reshape(x.shape)
    if spread:
        x = _spread(x, mesh, back=True)[:lead]
    return x.transpose(tuple(perm.index(a) for a in range(len(perm))))


def scale_by_muon(dims: Callable[[Any], Any], *, beta: float = 0.95, coeffs=NS_COEFFS, steps: int = 5,
                  eps: float = 1e-8, mesh: Mesh | None = None) -> optax.GradientTransformation:
    """Muon's orthogonalised momentum for the leaves ``dims`` labels (inside
    ``optax.partition``, the other leaves masked): Nesterov momentum
    ``M^ = beta M_t + (1 - beta) G_t`` (bias-corrected as in optax), orthogonalised by
    :func:`newton_schulz` (spread over ``mesh``). State: ``optax.contrib.MuonState``, as
    ``optax.contrib.scale_by_muon``'s, so checkpoints of either restore into the other."""
    def init(params):
        return optax.contrib.MuonState(count=jnp.zeros([], jnp.int32), mu=optax.tree.zeros_like(params),
                                       ns_coeffs=jnp.asarray(coeffs))

    def update(updates, state, params=None):
        del params
        mu = optax.tree.update_moment(updates, state.mu, beta, 1)
        count = optax.safe_increment(state.count)
        mu_hat = jax.tree.map(lambda m, g: beta * m + (1 - beta) * g,
                              optax.tree.bias_correction(mu, beta, optax.safe_increment(count)),
                              optax.tree.bias_correction(updates, beta, count))
        # experts sharded over the experts axis hold whole matrices already: orthogonalised
        # where they are (spread and brought back, XLA gathered all of them: 110 GiB a
        # device for Qwen3-30B-A3B on 64 devices)
        orthogonal = lambda m, d, name: newton_schulz(m, d, coeffs=coeffs, steps=steps, eps=eps,
                                                      mesh=None if name in _EXPERTS else mesh)
        return (_each_matrix(orthogonal, dims, mu_hat, with_name=True),
                optax.contrib.MuonState(count=count, mu=mu, ns_coeffs=state.ns_coeffs))

    return optax.GradientTransformation(init, update)


def scale_by_shape(dims: Callable[[Any], Any], *, consistent_rms: float | None = 0.2) -> optax.GradientTransformation:
    """Each Muon matrix's update times ``consistent_rms * sqrt(max(fan_in, fan_out))`` (AdamW's
    update RMS, Liu et al. 2025), or ``sqrt(max(1, fan_out / fan_in))`` when None; stateless,
    as ``optax.contrib.muon``'s step of the same name."""
    def scale(u, d):
        fan_in = math.prod(u.shape[a] for a in _axes(d.reduction_axis, u.ndim))
        fan_out = math.prod(u.shape[a] for a in _axes(d.output_axis, u.ndim))
        return u * (math.sqrt(max(1.0, fan_out / fan_in)) if consistent_rms is None
                    else math.sqrt(max(fan_in, fan_out)) * consistent_rms)

    return optax.GradientTransformation(lambda params: optax.EmptyState(),
                                        lambda updates, state, params=None: (_each_matrix(scale, dims, updates), state))


def _muon(cfg: OptimConfig, dims: Callable[[Any], Any], *, mesh: Mesh | None = None) -> optax.GradientTransformation:
    """Muon on the leaves ``dims`` labels, AdamW (Nesterov) on the rest: the composition
    of ``optax.contrib.muon`` (the same state tree), with :func:`scale_by_muon`
    orthogonalising over ``mesh``."""
    lr = learning_rate_schedule(cfg)

    def labels(params):
        return jax.tree.map(lambda d, x: "adam" if d is None else "muon", dims(params), params, is_leaf=_is_dims)

    return optax.partition({
        "muon": optax.chain(
            scale_by_muon(dims, beta=cfg.muon_beta, steps=cfg.ns_steps, eps=cfg.eps, mesh=mesh),
            scale_by_shape(dims, consistent_rms=cfg.consistent_rms),
            optax.add_decayed_weights(cfg.weight_decay),
            optax.scale_by_learning_rate(lr)),
        "adam": optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay, nesterov=True),
    }, labels)


def _adamw(cfg: OptimConfig, dims: Callable[[Any], Any], *, mesh: Mesh | None = None) -> optax.GradientTransformation:
    del dims, mesh
    return optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                       weight_decay=cfg.weight_decay)


# name -> builder(cfg, dimension_numbers_fn, *, mesh) -> GradientTransformation
OPTIMIZERS: dict[str, Callable[[OptimConfig, Callable], optax.GradientTransformation]] = {
    "muon": _muon,
    "adamw": _adamw,
}


def make_optimizer(cfg: OptimConfig, dimension_numbers: Callable[[Any], Any] | None = None, *,
                   mesh: Mesh | None = None, lora: Any = None) -> optax.GradientTransformation:
    """Global-norm clipping, then the configured optimizer.

    ``dimension_numbers`` maps a param tree to Muon dimension numbers (None leaves
    use AdamW); default :func:`muon_dimension_numbers` for swarmjax's transformer.
    ``mesh``: the mesh the params live on; Muon orthogonalises its matrices spread
    over it (:func:`newton_schulz`) instead of gathering them on every device.
    ``lora``: the model's ``ModelConfig.lora`` (a ``LoraConfig``; None: every param
    trained): only ``params["lora"]`` is trained, the rest gets zero updates and no
    optimizer state (``optax.partition`` with ``optax.set_to_zero``), and
    ``lora.optimizer`` (e.g. "adamw"; None: ``cfg.name``) trains the adapters.
    """
    if lora is not None and lora.optimizer is not None:
        cfg = dataclasses.replace(cfg, name=lora.optimizer)
    dims = dimension_numbers or (lambda p: muon_dimension_numbers(p, cfg.muon_per_head))
    opt = OPTIMIZERS[cfg.name](cfg, dims, mesh=mesh)
    if cfg.max_grad_norm:
        opt = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), opt)
    opt = float32_state(opt) if cfg.float32_state else opt
    if lora is not None:
        opt = optax.partition({"adapters": opt, "frozen": optax.set_to_zero()}, adapter_labels)
    return opt


def adapter_labels(params: Any) -> Any:
    """``"adapters"`` on the adapters' a and b (``params["lora"]``), ``"frozen"`` on the
    rest (the base, and QK-Clip's factors, which only QK-Clip changes)."""
    def label(path, _):
        keys = [getattr(k, "key", None) for k in path]
        return "adapters" if keys[0] == "lora" and keys[-1] in ("a", "b") else "frozen"
    return jax.tree_util.tree_map_with_path(label, params)


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
