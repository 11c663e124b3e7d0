"""Mixture-of-experts MLP (Qwen3-MoE): a linear router picks k of E SwiGLU experts per token.

Math (per token x [D]; Qwen3-MoE as transformers implements it):
``p = softmax(x R)`` over the E experts (float32), the k largest ``p_e`` kept and, with
``norm_topk_prob``, divided by their sum; ``y = sum_e p_e down_e(silu(gate_e x) * up_e x)``.

Two ways to run the experts, the same arithmetic:

* :func:`moe_local`: every expert on this device. The N x k (token, expert) assignments are
  sorted by expert and the three matmuls are grouped matmuls over the sorted rows
  (``jax.lax.ragged_dot``): each row meets only its own expert's weights, none is dropped.
* :func:`moe_expert_parallel`: the experts split over mesh axes (the ``experts`` logical
  axis, ``fsdp`` under the default rules), each device holding E / n of them. Inside a
  ``shard_map`` each device routes its own tokens, packs each assignment into the buffer of
  the device that owns its expert (C slots per destination), exchanges the buffers with one
  ``all_to_all``, runs its local experts as grouped matmuls, and sends the results back with
  a second ``all_to_all`` (GShard's dispatch, Lepikhin et al. 2020, arXiv 2006.16668).
  ``C = max(16, ceil(expert_capacity x N k / n))`` (:func:`capacity`), at most the worst
  case ``N min(k, E / n)``: a device that would receive more assignments than that from
  one sender drops the rest (the token keeps its other experts and the residual); every
  drop is reported by a warning naming the fix. ``expert_capacity = 0`` sizes the buffers
  for the worst case: exact always, up to n times the memory.

Shapes: N tokens, D hidden, E experts (E_loc on one device), F expert width, k experts a
token (lower case: K is the kv heads), A = N k assignments, C slots a destination device.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from swarmjax.models.config import ModelConfig
from swarmjax.sharding.mesh import logical_to_spec

Array = jax.Array

# Logical axes of the expert weights (stacked layers add "layers" in front).
EXPERT_AXES = {"expert_gate": ("experts", "embed", "mlp"), "expert_up": ("experts", "embed", "mlp"),
               "expert_down": ("experts", "mlp", "embed")}


def route(x: Array, router: Array, cfg: ModelConfig) -> tuple[Array, Array]:
    """The k experts of each token and their weights.

    x [N, D], router [D, E] -> (ids [N, k] int32, weights [N, k] in x's dtype):
    ``softmax(x R)`` in float32, its top k, divided by their sum when ``cfg.norm_topk_prob``.
    The logits are rounded to x's dtype before the softmax, as transformers computes
    them, so a bfloat16 model picks the experts its reference does."""
    logits = jnp.dot(x, router.astype(x.dtype))                                          # [N, E]
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, ids = lax.top_k(probs, cfg.experts_per_token)                              # [N, k]
    if cfg.norm_topk_prob:
        weights = weights / weights.sum(-1, keepdims=True)
    return ids.astype(jnp.int32), weights.astype(x.dtype)


def grouped_swiglu(rows: Array, group_sizes: Array, gate: Array, up: Array, down: Array) -> Array:
    """SwiGLU of each row with its group's expert: rows [R, D] sorted by expert, group_sizes
    [E] (rows past their sum give zeros), gate / up [E, D, F], down [E, F, D] -> [R, D]."""
    dt = rows.dtype
    h = jax.nn.silu(lax.ragged_dot(rows, gate.astype(dt), group_sizes)) * \
        lax.ragged_dot(rows, up.astype(dt), group_sizes)                                 # [R, F]
    return lax.ragged_dot(h, down.astype(dt), group_sizes)                               # [R, D]


def _combine(per_assignment: Array, weights: Array) -> Array:
    """[A, D] expert outputs of the N x k assignments (token-major) -> [N, D], weighted."""
    N, k = weights.shape
    out = per_assignment.reshape(N, k, -1) * weights[..., None]
    return out.sum(1)


def moe_local(x: Array, params: dict[str, Array], cfg: ModelConfig) -> Array:
    """The MoE MLP with every expert here: x [N, D] -> [N, D] (see the module docstring).
    ``params``: router [D, E], expert_gate / expert_up [E, D, F], expert_down [E, F, D]."""
    ids, weights = route(x, params["router"], cfg)                                      # [N, k]
    flat = ids.reshape(-1)                                                              # [A]
    order = jnp.argsort(flat, stable=True)                                              # [A] by expert
    sizes = jnp.bincount(flat, length=cfg.num_experts)                                  # [E]
    rows = x[order // cfg.experts_per_token]                                            # [A, D]
    y = grouped_swiglu(rows, sizes, params["expert_gate"], params["expert_up"], params["expert_down"])
    return _combine(jnp.zeros_like(y).at[order].set(y), weights)


def _warn_dropped(dropped, total) -> None:
    if dropped:
        warnings.warn(f"mixture of experts: {int(dropped)} of {int(total)} token-expert assignments "
                      "exceeded a device's expert capacity and were dropped; raise "
                      "ModelConfig.expert_capacity (0 = never drop)", RuntimeWarning, stacklevel=2)


# Fewest slots per destination: a device's few tokens (a short chunk, a handful of rows)
# then never drop (a token sends at most min(k, E_loc) assignments to one device), for the
# cost of n x 16 rows of D.
_MIN_SLOTS = 16


def capacity(tokens: int, cfg: ModelConfig, devices: int) -> int:
    """Slots C one device keeps for each destination device: ``ceil(expert_capacity x N k / n)``
    of its N tokens' N k assignments, at least 16 and at most the worst case
    ``N min(k, E / n)`` (``expert_capacity`` 0: the worst case, nothing ever dropped)."""
    worst = tokens * min(cfg.experts_per_token, cfg.num_experts // devices)
    if not cfg.expert_capacity:
        return worst
    even = math.ceil(cfg.expert_capacity * tokens * cfg.experts_per_token / devices)
    return min(worst, max(even, _MIN_SLOTS))


def _dispatch(x: Array, live: Array, params: dict[str, Array], cfg: ModelConfig, ep: tuple[str, ...],
              n: int, tensor: tuple[str, ...], counted: tuple[str, ...]) -> Array:
    """One device's part of :func:`moe_expert_parallel` (inside ``shard_map``): its tokens
    x [N, D] (``live`` [N]: False on padding, which is not sent), its E_loc experts;
    returns [N, D]."""
    N, D = x.shape
    k = cfg.experts_per_token
    local = cfg.num_experts // n
    C = capacity(N, cfg, n)
    ids, weights = route(x, params["router"], cfg)                                      # [N, k]
    flat = ids.reshape(-1)                                                              # [A]
    dest = flat // local                                                                # [A] owner device
    token = jnp.arange(N * k) // k
    sent = live[token]                                                                  # [A]
    onehot = jax.nn.one_hot(dest, n, dtype=jnp.int32) * sent[:, None]                   # [A, n]
    slot = jnp.where(sent, jnp.sum((jnp.cumsum(onehot, 0) - 1) * onehot, 1), C)        # [A] place in its buffer
    kept = slot < C
    send = jnp.zeros((n, C, D), x.dtype).at[dest, slot].set(x[token], mode="drop")     # [n, C, D]
    send_e = jnp.full((n, C), local, jnp.int32).at[dest, slot].set(flat % local, mode="drop")
    with jax.named_scope("moe_all_to_all"):
        recv = lax.all_to_all(send, ep, 0, 0, tiled=True)                               # [n, C, D] by sender
        recv_e = lax.all_to_all(send_e, ep, 0, 0, tiled=True)                           # [n, C]; local = empty
    rows_e = recv_e.reshape(-1)                                                         # [n C]
    order = jnp.argsort(rows_e, stable=True)
    sizes = jnp.bincount(rows_e, length=local + 1)[:local]                              # [E_loc]
    y = grouped_swiglu(recv.reshape(-1, D)[order], sizes, params["expert_gate"], params["expert_up"],
                       params["expert_down"])                                           # [n C, D]
    if tensor:   # each device ran a 1/t slice of F: the down projection's partial sums
        y = lax.psum(y, tensor)
    y = jnp.zeros_like(y).at[order].set(y).reshape(n, C, D)
    with jax.named_scope("moe_all_to_all"):
        back = lax.all_to_all(y, ep, 0, 0, tiled=True)                                  # [n, C, D] by owner
    out = jnp.where(kept[:, None], back[dest, jnp.minimum(slot, C - 1)], 0)             # [A, D]
    dropped = lax.psum(jnp.sum(sent & ~kept), counted)
    # the host hears of drops only (no callback on a step that drops nothing)
    lax.cond(dropped > 0, lambda: jax.debug.callback(_warn_dropped, dropped, lax.psum(jnp.sum(sent), counted)),
             lambda: None)
    return _combine(out, weights)


def _names(entry: Any) -> tuple[str, ...]:
    """The mesh axes of one ``PartitionSpec`` entry (None, a name or a tuple of names)."""
    return () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))


def expert_axes(mesh, cfg: ModelConfig) -> tuple[str, ...]:
    """Mesh axes the experts are split over (the ``experts`` rule; empty: not split)."""
    return _names(logical_to_spec(("experts",), (cfg.num_experts,), mesh)[0])


def moe_expert_parallel(x: Array, params: dict[str, Array], cfg: ModelConfig,
                        sharding: NamedSharding) -> Array:
    """The MoE MLP with the experts split over devices: x [B, T, D] laid out as ``sharding``
    (rows or positions over the batch axes) -> [B, T, D] in the same layout. Falls back to
    :func:`moe_local` (XLA then gathers the experts) when the mesh does not split them."""
    mesh = sharding.mesh
    ep = expert_axes(mesh, cfg)
    B, T, D = x.shape
    if not ep:
        return moe_local(x.reshape(-1, D), params, cfg).reshape(B, T, D)
    n = math.prod(mesh.shape[a] for a in ep)
    spec = tuple(sharding.spec) + (None,) * (3 - len(sharding.spec))
    fits = all(size % math.prod(mesh.shape[a] for a in _names(s)) == 0 for s, size in zip(spec, x.shape))
    x_spec = PartitionSpec(*spec) if fits else PartitionSpec()   # tokens that do not split: whole on each
    # tokens not split over the expert axes (whole, or split over other axes only): each
    # device of an expert group dispatches its 1/n of them, then the group gathers the results
    token_axes = {a for s in x_spec for a in _names(s)}
    share = not set(ep) <= token_axes
    w = {name: logical_to_spec(axes, params[name].shape, mesh) for name, axes in EXPERT_AXES.items()}
    tensor = _names(w["expert_gate"][2])                          # the expert width split: partial sums
    # the axes over which devices hold different tokens (drop counts summed over these)
    counted = tuple(a for a in mesh.axis_names if a in set(ep) | token_axes)

    def body(x, p):
        b, t, _ = x.shape
        tokens = x.reshape(b * t, D)
        if not share:
            return _dispatch(tokens, jnp.ones((b * t,), bool), p, cfg, ep, n, tensor, counted).reshape(b, t, D)
        per = -(-(b * t) // n)
        start = lax.axis_index(ep) * per
        mine = lax.dynamic_slice_in_dim(jnp.pad(tokens, ((0, per * n - b * t), (0, 0))), start, per)
        live = start + jnp.arange(per) < b * t
        y = _dispatch(mine, live, p, cfg, ep, n, tensor, counted)                  # [per, D]
        return lax.all_gather(y, ep, tiled=True)[:b * t].reshape(b, t, D)

    in_specs = (x_spec, {"router": PartitionSpec(), **w})
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs, out_specs=x_spec, check_vma=False)(
        x, {k: params[k] for k in ("router", *EXPERT_AXES)})


class MoE(nn.Module):
    """The MoE MLP as a layer: router [D, E], expert_gate / expert_up [E, D, F_e],
    expert_down [E, F_e, D], each with its logical axes. ``sharding``: the hidden state's
    sharding on a mesh (``forward(activation_sharding=)``): the experts then run expert
    parallel (:func:`moe_expert_parallel`); None: :func:`moe_local`."""

    cfg: ModelConfig
    sharding: Any = None

    @nn.compact
    def __call__(self, x: Array) -> Array:                                              # [B, T, D]
        cfg = self.cfg
        D, E, F = cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size
        init = nn.initializers.normal(stddev=0.02)
        p = {"router": self.param("router", nn.with_logical_partitioning(init, ("embed", None)), (D, E),
                                  cfg.jnp_param_dtype)}
        for name, axes in EXPERT_AXES.items():
            shape = (E, D, F) if axes[1] == "embed" else (E, F, D)
            p[name] = self.param(name, nn.with_logical_partitioning(init, axes), shape, cfg.jnp_param_dtype)
        with jax.named_scope("moe"):
            if isinstance(self.sharding, NamedSharding):
                return moe_expert_parallel(x, p, cfg, self.sharding)
            B, T, _ = x.shape
            return moe_local(x.reshape(B * T, D), p, cfg).reshape(B, T, D)
