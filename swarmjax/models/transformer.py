"""Qwen3 / Llama decoder-only transformer as pure-functional Flax (linen) modules.

Architecture (Qwen3): token embedding -> L x [RMSNorm -> grouped-query attention
with per-head q/k RMSNorm and RoPE -> residual -> RMSNorm -> SwiGLU MLP ->
residual] -> RMSNorm -> output head (optionally tied to the embedding).
Llama is the same with ``qk_norm=False``; Qwen2 is Llama with biases on the q, k, v
projections (``attention_bias=True, o_bias=False``). RoPE (default, Llama-3.1, YaRN)
is in :mod:`swarmjax.models.rope`.

Shapes, one upper-case letter a dimension in shape comments and einsums (Gemma's
``gm/nn`` convention): B rows, T positions fed in this call, S positions attended (cache
slots; T without a cache), P shared-prefix positions, D model width, N query heads, K kv
heads, G query heads a kv head (N = K G), H head dim, F MLP width, V vocabulary, L layers,
M the B G T queries of one kv head flattened (cascade attention). The mixture of experts
(:mod:`swarmjax.models.moe`) names its own: tokens, experts and assignments.

Layer weights are stacked on a leading ``layers`` axis (plain ``[L, ...]`` arrays
that Muon orthogonalises per matrix). Without a KV cache the stack runs under
``lax.scan`` (one compiled layer body whatever the depth); with a cache (decoding)
it is unrolled over per-layer weights and per-layer cache buffers, so a decode
step copies neither.

Functional entry points (all take and return plain pytrees):

* :func:`init_params` / :func:`abstract_params` / :func:`param_logical_axes`
* :func:`forward` -> :class:`ForwardOutput` (logits, updated KV cache, and on
  request the per-layer per-head max pre-softmax attention logit ``[L, N]``
  that QK-Clip needs; when not requested it is not computed at all).
* :func:`init_cache` -> :class:`KVCache`.

Every parameter carries logical axis names next to its definition; the mesh
mapping lives in :mod:`swarmjax.sharding.mesh`.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from swarmjax.models import attention
from swarmjax.models.attention import NEG, cascade, causal_blocks, write_slots  # noqa: F401  (write_slots re-exported)
from swarmjax.models.config import LORA_TARGETS, ModelConfig
from swarmjax.models.dense import dense
from swarmjax.models.lora import attach as attach_lora
from swarmjax.models.lora import delta, init_lora
from swarmjax.models.moe import MoE
from swarmjax.models.remat import remat_policy
from swarmjax.models.rope import (apply_rope, rope_attention_factor, rope_inv_freq,  # noqa: F401  (re-exported)
                                  rope_table, rope_tables)

Array = jax.Array
_INIT = nn.initializers.normal(stddev=0.02)


@flax.struct.dataclass
class KVCache:
    """Fixed-size key/value cache.

    k:     L-tuple of [B, K, H, S]  keys per layer and kv head, slot axis last;
    v:     L-tuple of [B, K, S, H]  values per layer and kv head, slot axis second to last;
    valid: [B, S] bool                 slot holds a real (non-pad) token.

    Both layouts put the axis that attention contracts first in memory
    (``q.k`` over H, ``p.v`` over S), the layout XLA:CPU's dot runs without
    re-packing the cache: keys stored [S, H] made the ``q.k`` dot 3.4x slower
    (measured at B 32, S 192, H 64; it was a third of a 30m decode step).
    """

    k: Array
    v: Array
    valid: Array

    @property
    def max_len(self) -> int:
        return self.valid.shape[1]


@flax.struct.dataclass
class ForwardOutput:
    """logits [B, T, V] float32 (None with ``return_hidden``); cache (or None);
    max_logits [L, N] float32 (or None); hidden [B, T, D]: the final-normed hidden
    state, only with ``forward(return_hidden=True)``."""

    logits: Array | None
    cache: KVCache | None
    max_logits: Array | None
    hidden: Array | None = None


def _param(module: nn.Module, name: str, shape, logical, init=_INIT):
    """A parameter with its logical axis names (for the sharding rule table)."""
    return module.param(name, nn.with_logical_partitioning(init, logical), shape,
                        module.cfg.jnp_param_dtype)


def _adapted(module: nn.Module, name: str, x: Array, y: Array, adapter: Array | None) -> Array:
    """``y`` (= x W of weight ``name``) plus the row's LoRA update when the params carry
    an adapter of ``name`` (:mod:`swarmjax.models.lora`: ``name_lora_a`` / ``_b``)."""
    lora = module.cfg.lora
    if lora is None or not module.has_variable("params", f"{name}_lora_a"):
        return y
    a, b = (module.get_variable("params", f"{name}_lora_{ab}") for ab in "ab")
    key = module.make_rng("lora") if lora.dropout > 0 and module.has_rng("lora") else None
    return y + delta(x, a, b, adapter, lora.scale, dropout=lora.dropout, key=key)


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


class Attention(nn.Module):
    """Grouped-query attention with optional q/k RMSNorm, RoPE and a KV cache.

    Without a cache the chunk attends over itself (``mask [B, T, T]``) and its
    keys, values ``[B, K, T, H]`` are returned. With a layer's cache buffers
    (keys ``[B, K, H, S]``, values ``[B, K, S, H]``, see :class:`KVCache`) the
    chunk's k, v are written at slot ``cache_index`` first, the chunk attends over
    the whole buffer (``mask [B, T, S]``) and the updated buffers are returned.
    With a shared prefix (``prefix_k [K, H, P]``, ``prefix_v [K, P, H]``, one copy
    for the whole batch, ``prefix_mask [B, T, P]``) the queries also attend over it,
    in one softmax with the rest: cascade attention, so B rows that open with the
    same P ids read those keys once per step instead of B times.
    """

    cfg: ModelConfig
    want_max: bool = False

    @nn.compact
    def __call__(self, x, cos, sin, mask, cache_k=None, cache_v=None, cache_index=None,
                 prefix_k=None, prefix_v=None, prefix_mask=None, adapter=None):
        cfg = self.cfg
        dt = cfg.jnp_dtype
        B, T, D = x.shape
        N, K, G, H = cfg.num_heads, cfg.num_kv_heads, cfg.num_groups, cfg.head_dim
        wq = _param(self, "q_proj", (D, N, H), ("embed", "heads", "head_dim"))
        wk = _param(self, "k_proj", (D, K, H), ("embed", "kv_heads", "head_dim"))
        wv = _param(self, "v_proj", (D, K, H), ("embed", "kv_heads", "head_dim"))
        wo = _param(self, "o_proj", (N, H, D), ("heads", "head_dim", "embed"))
        q = _adapted(self, "q_proj", x, jnp.einsum("BTD,DNH->BTNH", x, wq.astype(dt)), adapter)   # [B, T, N, H]
        k = _adapted(self, "k_proj", x, jnp.einsum("BTD,DKH->BTKH", x, wk.astype(dt)), adapter)   # [B, T, K, H]
        v = _adapted(self, "v_proj", x, jnp.einsum("BTD,DKH->BTKH", x, wv.astype(dt)), adapter)   # [B, T, K, H]
        if cfg.attention_bias:
            zeros = nn.initializers.zeros
            q = q + _param(self, "q_bias", (N, H), ("heads", "head_dim"), zeros).astype(dt)
            k = k + _param(self, "k_bias", (K, H), ("kv_heads", "head_dim"), zeros).astype(dt)
            v = v + _param(self, "v_bias", (K, H), ("kv_heads", "head_dim"), zeros).astype(dt)
        if cfg.qk_norm:
            q = RMSNorm(cfg, "head_dim", name="q_norm")(q)
            k = RMSNorm(cfg, "head_dim", name="k_norm")(k)
        if self.has_variable("params", "q_clip"):      # LoRA: QK-Clip's factors, the weights frozen
            q = q * self.get_variable("params", "q_clip")[:, None].astype(dt)   # [N, 1]
            k = k * self.get_variable("params", "k_clip")[:, None].astype(dt)   # [K, 1]
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)

        # Head-major layouts ([B, K, G, T, .], cache [B, K, S, H]) let XLA's CPU dot
        # run without transposing the cache (b-t-k einsum outputs were ~7x slower).
        qg = (q.reshape(B, T, K, G, H) * jnp.asarray(H ** -0.5, dt)).transpose(0, 2, 3, 1, 4)
        keys, values = k.swapaxes(1, 2), v.swapaxes(1, 2)                 # [B, K, T, H]
        if cache_k is None and prefix_k is None and T >= 2 * attention.ATTENTION_BLOCK:   # long rows: by query blocks
            out, max_logit = causal_blocks(qg, keys, values, mask, dt, self.want_max)
        else:
            if cache_k is None:
                logits = jnp.einsum("BKGTH,BKSH->BKGTS", qg, keys.astype(dt),
                                    preferred_element_type=jnp.float32)      # [B, K, G, T, T]
            else:   # write first (in place in a decode loop), then read all
                keys = write_slots(cache_k, keys.swapaxes(2, 3).astype(cache_k.dtype), cache_index,
                                   axis=-1)                                  # [B, K, H, S]
                values = write_slots(cache_v, values.astype(cache_v.dtype), cache_index)  # [B, K, S, H]
                logits = jnp.einsum("BKGTH,BKHS->BKGTS", qg, keys.astype(dt),
                                    preferred_element_type=jnp.float32)      # [B, K, G, T, S]
            logits = jnp.where(mask[:, None, None], logits, NEG)
            if prefix_k is None:
                max_logit = logits.max(axis=(0, 3, 4)).reshape(N) if self.want_max else None  # [N]
                probs = jax.nn.softmax(logits, axis=-1).astype(dt)
                out = jnp.einsum("BKGTS,BKSH->BKGTH", probs, values.astype(dt))  # [B, K, G, T, H]
            else:
                out, max_logit = cascade(qg, logits, values, prefix_k, prefix_v, prefix_mask, dt, self.want_max)
        out = out.transpose(0, 3, 1, 2, 4).reshape(B, T, N, H)
        # "BTNH,NHD->BTD", contracting N then H as they are laid out (jnp.einsum orders
        # contracted letters alphabetically, H before N: XLA then transposes both operands)
        y = _adapted(self, "o_proj", out, lax.dot_general(out, wo.astype(dt), (((2, 3), (0, 1)), ((), ()))),
                     adapter)                                                        # [B, T, D]
        if cfg.has_o_bias:
            y = y + _param(self, "o_bias", (D,), ("embed",), nn.initializers.zeros).astype(dt)
        return y, keys, values, max_logit


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x, adapter=None):
        dt, D, F = self.cfg.jnp_dtype, self.cfg.hidden_size, self.cfg.intermediate_size
        gate = _param(self, "gate_proj", (D, F), ("embed", "mlp"))
        up = _param(self, "up_proj", (D, F), ("embed", "mlp"))
        down = _param(self, "down_proj", (F, D), ("mlp", "embed"))
        h = jax.nn.silu(_adapted(self, "gate_proj", x, dense(x, gate.astype(dt)), adapter)) * \
            _adapted(self, "up_proj", x, dense(x, up.astype(dt)), adapter)            # [B, T, F]
        return _adapted(self, "down_proj", h, dense(h, down.astype(dt)), adapter)


class Block(nn.Module):
    """One pre-norm decoder layer. Returns the new hidden state, k and v (the updated
    cache buffers, see :class:`KVCache`, when given, else this chunk's ``[B, K, T, H]``)
    and the max logit per head (or None). The MLP is a SwiGLU, or a mixture of experts
    (:class:`swarmjax.models.moe.MoE`, run expert parallel over ``sharding``'s mesh)."""

    cfg: ModelConfig
    want_max: bool = False
    sharding: Any = None

    @nn.compact
    def __call__(self, x, cos, sin, mask, cache_k=None, cache_v=None, cache_index=None,
                 prefix_k=None, prefix_v=None, prefix_mask=None, adapter=None):
        h = RMSNorm(self.cfg, name="input_norm")(x)
        with jax.named_scope("attention"):
            a, k, v, max_logit = Attention(self.cfg, self.want_max, name="attn")(
                h, cos, sin, mask, cache_k, cache_v, cache_index, prefix_k, prefix_v, prefix_mask, adapter)
        x = x + a
        h = RMSNorm(self.cfg, name="post_attn_norm")(x)
        with jax.named_scope("mlp"):
            x = x + (MoE(self.cfg, self.sharding, name="mlp")(h) if self.cfg.is_moe else
                     MLP(self.cfg, name="mlp")(h, adapter))
        return x, k, v, max_logit


# ----------------------------------------------------------------------------- parameters
#
# Top level: {"embed": [V, D], "final_norm": {"scale": [D]}, "layers": <Block params with a
# leading [L] axis>, "lm_head": [D, V] (untied only)}. ``forward`` uses an "lm_head"
# beside a tied "embed" too: the sampler adds embed.T, copied once per call into the
# layout XLA:CPU's dot reads fastest (20% off the 1m decode step's head, measured).
# The layer stack is built from Block.init under jax.vmap; the layers are run by
# lax.scan (training, scoring) or, with a KV cache, unrolled over per-layer weights
# and caches (decode: no per-step copies of stacked weights or caches, which is what
# dominated CPU decode time).

_TOP_LOGICAL = {"embed": ("vocab", "embed"), "final_norm": {"scale": ("norm",)},
                "lm_head": ("embed", "vocab")}


def _block_dummies(cfg: ModelConfig):
    x = jnp.zeros((1, 1, cfg.hidden_size), cfg.jnp_dtype)
    cs = jnp.zeros((1, 1, cfg.head_dim), jnp.float32)
    return x, cs, cs, jnp.ones((1, 1, 1), bool)


def _init_block(cfg: ModelConfig, key: Array):
    return Block(cfg).init(key, *_block_dummies(cfg))["params"]


def init_params(cfg: ModelConfig, key: Array) -> dict[str, Any]:
    """Random parameters (normal(0.02) weights, unit norms, zero biases) as a plain
    nested dict of arrays with stacked ``[L, ...]`` layer weights; with ``cfg.lora``
    fresh adapters under ``"lora"`` (:func:`swarmjax.models.lora.init_lora`)."""
    return _init_jit(cfg, key)


@functools.partial(jax.jit, static_argnums=0)
def _init_jit(cfg: ModelConfig, key: Array) -> dict[str, Any]:
    k_embed, k_head, k_layers = jax.random.split(key, 3)
    pdt = cfg.jnp_param_dtype
    layers = jax.vmap(lambda k: nn.meta.unbox(_init_block(cfg, k)))(
        jax.random.split(k_layers, cfg.num_layers))
    params = {"embed": _INIT(k_embed, (cfg.vocab_size, cfg.hidden_size), pdt),
              "final_norm": {"scale": jnp.ones((cfg.hidden_size,), pdt)},
              "layers": layers}
    if not cfg.tie_embeddings:
        params["lm_head"] = _INIT(k_head, (cfg.hidden_size, cfg.vocab_size), pdt)
    if cfg.lora is not None:
        params["lora"] = init_lora(cfg, jax.random.fold_in(key, 7))
    return params


def abstract_params(cfg: ModelConfig) -> dict[str, Any]:
    """Parameter pytree of ``jax.ShapeDtypeStruct`` (no allocation)."""
    return jax.eval_shape(lambda: _init_jit(cfg, jax.random.key(0)))


@functools.lru_cache(maxsize=32)
def param_logical_axes(cfg: ModelConfig) -> dict[str, Any]:
    """Pytree (same structure as the params) of ``PartitionSpec``s holding the
    *logical* axis names of every parameter, e.g. ``P('layers', 'embed', 'mlp')``."""
    P = jax.sharding.PartitionSpec
    boxed = jax.eval_shape(lambda: _init_block(cfg, jax.random.key(0)))
    per_layer = nn.get_partition_spec(boxed)
    axes = {"embed": P(*_TOP_LOGICAL["embed"]),
            "final_norm": {"scale": P(*_TOP_LOGICAL["final_norm"]["scale"])},
            "layers": jax.tree.map(lambda spec: P("layers", *spec), per_layer,
                                   is_leaf=lambda x: isinstance(x, P))}
    if not cfg.tie_embeddings:
        axes["lm_head"] = P(*_TOP_LOGICAL["lm_head"])
    if cfg.lora is not None:        # an adapter's in and out dims split as its weight's
        axes["lora"] = {"attn": {"q_clip": P("layers", "heads"), "k_clip": P("layers", "kv_heads")}}
        for t in cfg.lora.targets:
            module = LORA_TARGETS[t][0]
            spec, n_in = per_layer[module][t], len(LORA_TARGETS[t][1])
            axes["lora"].setdefault(module, {})[t] = {"a": P("layers", "adapters", *spec[:n_in], "lora_rank"),
                                                      "b": P("layers", "adapters", "lora_rank", *spec[n_in:])}
    return axes


def unstack_layers(params: dict[str, Any]) -> dict[str, Any]:
    """Params with ``layers`` as a tuple of L per-layer trees (from the stacked
    ``[L, ...]`` form). :func:`forward` accepts both; decoding loops use this form
    so no layer weights are sliced inside the loop."""
    layers = params["layers"]
    if isinstance(layers, (list, tuple)):
        return params
    L = jax.tree.leaves(layers)[0].shape[0]
    return {**params, "layers": tuple(jax.tree.map(lambda a, l=l: a[l], layers) for l in range(L))}


# ----------------------------------------------------------------------------- cache


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=None) -> KVCache:
    """Empty cache: L keys [B, K, H, S] and values [B, K, S, H] of zeros in
    ``dtype`` (default: compute dtype), valid all False [B, S]."""
    dtype = cfg.jnp_dtype if dtype is None else dtype
    B, K, H = batch, cfg.num_kv_heads, cfg.head_dim
    zeros = lambda shape: tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers))
    return KVCache(k=zeros((B, K, H, max_len)), v=zeros((B, K, max_len, H)),
                   valid=jnp.zeros((batch, max_len), bool))


def grow_cache(cache: KVCache, max_len: int) -> KVCache:
    """The cache with its slot axis zero-padded to ``max_len`` slots (new slots
    invalid); the contents of the first ``cache.max_len`` slots are kept."""
    extra = max_len - cache.max_len
    if extra < 0:
        raise ValueError(f"cannot grow a cache of {cache.max_len} slots to {max_len}")
    if extra == 0:
        return cache
    pad = lambda a, axis: jnp.pad(a, [(0, extra if d == a.ndim + axis else 0) for d in range(a.ndim)])
    return KVCache(k=tuple(pad(a, -1) for a in cache.k), v=tuple(pad(a, -2) for a in cache.v),
                   valid=pad(cache.valid, -1))


def cache_logical_axes(cfg: ModelConfig) -> KVCache:
    """Logical axis names of the cache arrays (for :mod:`swarmjax.sharding`)."""
    P = jax.sharding.PartitionSpec
    k = (P("batch", "kv_heads", "head_dim", "cache_seq"),) * cfg.num_layers
    v = (P("batch", "kv_heads", "cache_seq", "head_dim"),) * cfg.num_layers
    return KVCache(k=k, v=v, valid=P("batch", "cache_seq"))


# ----------------------------------------------------------------------------- forward


def default_positions(token_mask: Array) -> Array:
    """Positions [B, T] that count only real tokens: cumsum(mask) - 1, clipped at 0
    (so a left-padded row starts at position 0 on its first real token)."""
    return jnp.maximum(jnp.cumsum(token_mask.astype(jnp.int32), axis=-1) - 1, 0)


def forward(params: dict[str, Any], cfg: ModelConfig, tokens: Array, *,
            positions: Array | None = None, token_mask: Array | None = None,
            cache: KVCache | None = None, cache_index: Array | int = 0,
            return_max_logits: bool = False, logits_to_keep: int = 0,
            logits_at: Array | None = None,
            rope_table: tuple[Array, Array] | None = None,
            prefix: KVCache | None = None, prefix_rows: Array | None = None,
            remat: str = "none", activation_sharding: Any = None,
            return_hidden: bool = False, adapter: Array | None = None,
            lora_key: Array | None = None) -> ForwardOutput:
    """Run the decoder.

    Args:
      params: parameter pytree from :func:`init_params` or :func:`swarmjax.models.hf.from_hf`
        (stacked layers, or per-layer from :func:`unstack_layers`).
      tokens: [B, T] int token ids.
      positions: [B, T] RoPE positions; default :func:`default_positions` of the mask.
      token_mask: [B, T] bool, False on padding (never attended to); default all True.
      cache: optional :class:`KVCache`; the chunk is written at slots
        ``[cache_index, cache_index + T)`` and attends over the valid slots before
        ``cache_index`` and causally over itself.
      cache_index: slot of ``tokens[:, 0]`` in the cache: a scalar, or [B] per-row slots.
        The Python int 0 means the cache holds nothing before this chunk (a prefill):
        the cached part of attention is skipped at trace time.
      return_max_logits: also return ``max_logits [L, N]``, the largest masked
        pre-softmax logit ``q.k / sqrt(H)`` per layer and query head (over batch,
        queries and keys). Static: when False nothing extra is computed.
      logits_to_keep: static; n > 0 computes logits for the last n positions only
        (a sampler's prefill needs just the last: the [B, T, V] head is skipped).
      logits_at: optional [B] int, the one position of each row whose logits are
        computed (a right-padded chunk's last real token): logits [B, 1, V].
      rope_table: optional cos, sin [S, H] from :func:`rope_table`, looked up at
        ``positions`` (which must be < S; larger ones give NaN) instead of evaluated.
        Decode loops build one outside the loop: XLA:CPU evaluates cos/sin element
        by element inside every fusion that reads them (measured: 60 us of a 30m
        layer's 120 us query path at batch 32; a lookup costs 20 us).
      prefix: optional shared prefix, a batch-1 :class:`KVCache` of P slots (e.g. a
        system prompt and tool schemas prefilled once): the rows in ``prefix_rows``
        attend over its valid slots before their own (cascade attention; their
        ``positions`` continue after it). Needs ``cache``.
      prefix_rows: [B] bool, the rows that attend over ``prefix`` (default: all).
      remat: static; without a cache, what each layer keeps for the backward pass
        (:func:`~swarmjax.models.remat.remat_policy`: "none", "dots", "block" or a
        ``jax.checkpoint_policies`` name).
        The values are the same; only the memory of a gradient and its compute change.
      activation_sharding: optional sharding of the hidden state [B, T, D] (e.g. rows over
        the data axes), imposed after the embedding and after every layer so the SPMD
        partitioner keeps the batch split instead of following the weights' ``embed``
        split (without it, an FSDP-sharded learner step replicated the activations).
        A prefill (an empty cache written from slot 0) with it and stacked weights runs
        its layers under ``lax.scan``, one layer's weights gathered at a time. A mixture of
        experts runs expert parallel over its mesh (:mod:`swarmjax.models.moe`).
      return_hidden: static; return the final-normed hidden state [B, T, D] instead of
        logits (the head is not applied): a learner computes log-probs from it a chunk
        of positions at a time (:func:`swarmjax.rl.losses.chunked_token_logprobs`).
      adapter: with ``cfg.lora`` (the params' ``"lora"``: per target a [L, A, in..., R],
        b [L, A, R, out...], :func:`swarmjax.models.lora.init_lora`; every targeted map
        computes x W + (alpha / R) (x A_i) B_i and the rest of the params take no
        gradient): [B] int, the adapter of each row (-1: the bare base); None: adapter 0
        for every row.
      lora_key: a PRNG key for the adapters' dropout (training); None: no dropout.

    Returns:
      :class:`ForwardOutput` with float32 logits [B, T, V] ([B, n, V] with ``logits_to_keep=n``).
    """
    if cfg.lora is not None:
        if "lora" not in params:
            raise ValueError("ModelConfig.lora is set but the params hold no adapters (params['lora']: "
                             "swarmjax.models.lora.init_lora)")
        base = jax.lax.stop_gradient({k: v for k, v in params.items() if k != "lora"})   # frozen
        params = {**base, "layers": _with_lora(base["layers"], params["lora"])}
    elif "lora" in params:          # adapters a config without lora would silently leave out
        raise ValueError("the params hold LoRA adapters (params['lora']) but ModelConfig.lora is None: pass "
                         "the config they were made with, or merge them (swarmjax.models.lora.merge)")
    B, T = tokens.shape
    token_mask = jnp.ones((B, T), bool) if token_mask is None else token_mask.astype(bool)
    positions = default_positions(token_mask) if positions is None else positions
    dt = cfg.jnp_dtype
    pin = (lambda a: a) if activation_sharding is None else \
        (lambda a: lax.with_sharding_constraint(a, activation_sharding))
    x = pin(jnp.take(params["embed"], tokens, axis=0).astype(dt))          # [B, T, D]
    if rope_table is None:
        cos, sin = rope_tables(positions, cfg)                             # [B, T, H]
    else:
        cos, sin = (jnp.take(t, positions, axis=0, mode="fill") for t in rope_table)
    mask_new = token_mask[:, None, :] & jnp.tril(jnp.ones((T, T), bool))[None]   # [B, T, T]
    block = Block(cfg, return_max_logits, activation_sharding)
    rngs = lambda l: {} if lora_key is None else {"rngs": {"lora": jax.random.fold_in(lora_key, l)}}
    layer_ids = jnp.arange(cfg.num_layers)

    if cache is None:
        if prefix is not None:
            raise ValueError("forward(prefix=...) needs a cache (the rows' own slots after the prefix)")

        def body(x, layer):
            layer_params, l = layer
            x, _, _, max_logit = block.apply({"params": layer_params}, x, cos, sin, mask_new, adapter=adapter,
                                             **rngs(l))
            return pin(x), max_logit
        if remat != "none":
            body = jax.checkpoint(body, policy=remat_policy(remat), prevent_cse=False)   # inside scan: no CSE guard
        x, max_logits = lax.scan(body, x, (params["layers"], layer_ids))   # max_logits [L, N]
        new_cache = None
    else:
        empty = isinstance(cache_index, int) and cache_index == 0
        index = jnp.asarray(cache_index, jnp.int32)                        # [] or [B]
        valid = write_slots(cache.valid[..., None], token_mask[..., None], index)[..., 0]  # [B, S]
        slots = jnp.arange(cache.max_len)
        query_slots = jnp.reshape(index, (-1, 1)) + jnp.arange(T)          # [B or 1, T]
        # a prefill attends over itself and is then written; later chunks are written
        # into the layer's buffer and attend over every valid slot up to themselves
        mask = mask_new if empty else \
            valid[:, None, :] & (slots[None, None, :] <= query_slots[:, :, None])
        if prefix is not None:
            rows = jnp.ones((B,), bool) if prefix_rows is None else prefix_rows
            prefix_mask = rows[:, None, None] & prefix.valid[0][None, None, :]   # [B, 1, P]
        new_k, new_v, maxes = [], [], []
        layers = params["layers"]
        if empty and prefix is None and activation_sharding is not None and not isinstance(layers, (list, tuple)):
            # A prefill on a mesh over stacked weights: one layer at a time under lax.scan,
            # each layer's weights gathered inside its step (unrolled, XLA issued every
            # layer's FSDP all-gather at once: the whole model on each device).
            def body(x, layer):
                layer_params, l = layer
                x, k, v, max_logit = block.apply({"params": layer_params}, x, cos, sin, mask, None, None, index,
                                                 adapter=adapter, **rngs(l))
                return pin(x), (k, v, max_logit)
            x, (ks, vs, stacked_max) = lax.scan(body, x, (layers, layer_ids))   # ks, vs [L, B, K, T, H]
            layers, maxes = (), [] if stacked_max is None else list(stacked_max)
            new_k = [lax.dynamic_update_slice(c, k.swapaxes(2, 3).astype(c.dtype), (0, 0, 0, 0))
                     for c, k in zip(cache.k, ks)]
            new_v = [lax.dynamic_update_slice(c, v.astype(c.dtype), (0, 0, 0, 0)) for c, v in zip(cache.v, vs)]
        for l, layer_params in enumerate(unstack_layers({**params, "layers": layers})["layers"]):
            ck, cv = (None, None) if empty else (cache.k[l], cache.v[l])
            shared = () if prefix is None else (prefix.k[l][0], prefix.v[l][0], prefix_mask)
            x, k, v, max_logit = block.apply({"params": layer_params}, x, cos, sin, mask,
                                             ck, cv, index, *shared, adapter=adapter, **rngs(l))
            if empty:
                k = lax.dynamic_update_slice(cache.k[l], k.swapaxes(2, 3).astype(cache.k[l].dtype),
                                             (0, 0, 0, 0))
                v = lax.dynamic_update_slice(cache.v[l], v.astype(cache.v[l].dtype), (0, 0, 0, 0))
            new_k.append(k)
            new_v.append(v)
            maxes.append(max_logit)
        new_cache = KVCache(k=tuple(new_k), v=tuple(new_v), valid=valid)
        max_logits = jnp.stack(maxes) if return_max_logits else None

    if logits_to_keep:
        x = x[:, -logits_to_keep:]
    if logits_at is not None:
        x = jnp.take_along_axis(x, jnp.asarray(logits_at, jnp.int32)[:, None, None], axis=1)   # [B, 1, D]
    x = RMSNorm(cfg).apply({"params": params["final_norm"]}, x)
    if return_hidden:
        return ForwardOutput(logits=None, cache=new_cache, max_logits=max_logits, hidden=x)
    logits = jnp.einsum("BTD,DV->BTV", x, output_head(params).astype(dt), preferred_element_type=jnp.float32)
    return ForwardOutput(logits=logits.astype(jnp.float32), cache=new_cache, max_logits=max_logits)


def _with_lora(layers: Any, lora: dict[str, Any]) -> Any:
    """``layers`` (stacked, or a tuple of per-layer trees) with ``lora``'s adapters beside
    their weights (:func:`swarmjax.models.lora.attach`), sliced per layer for a tuple."""
    if isinstance(layers, (list, tuple)):
        return tuple(attach_lora(lp, jax.tree.map(lambda a, l=l: a[l], lora)) for l, lp in enumerate(layers))
    return attach_lora(layers, lora)


def forward_after_head(params: dict[str, Any], cfg: ModelConfig, head: Array, tokens: Array, *,
                       token_mask: Array | None = None, return_max_logits: bool = False,
                       **kwargs) -> ForwardOutput:
    """:func:`forward` of rows ``tokens`` [B, T] that all continue the same ``head`` [P]
    (a system turn and tool schemas): the head runs once, as a batch of one, and every
    row attends over its keys and values (cascade attention, ``forward(prefix=)``), its
    positions continuing after P. P + B T positions run instead of B (P + T); the
    outputs (logits or ``return_hidden`` hidden states [B, T, ...]) equal those of
    ``forward`` over the rows ``[head, tokens_b]`` at the rows' positions, gradients
    included; ``max_logits`` [L, N] covers both passes. ``kwargs``: more of
    :func:`forward`'s keywords for the rows' pass (``activation_sharding``,
    ``return_hidden``); ``remat`` does not apply to this cached form."""
    P, (B, T) = head.shape[0], tokens.shape
    token_mask = jnp.ones((B, T), bool) if token_mask is None else token_mask
    pre = forward(params, cfg, head[None], cache=init_cache(cfg, 1, P), cache_index=0, logits_to_keep=1,
                  return_max_logits=return_max_logits)
    out = forward(params, cfg, tokens, token_mask=token_mask, positions=P + default_positions(token_mask),
                  cache=init_cache(cfg, B, T), cache_index=0, prefix=pre.cache,
                  return_max_logits=return_max_logits, **kwargs)
    if return_max_logits:
        out = out.replace(max_logits=jnp.maximum(out.max_logits, pre.max_logits))
    return out


def output_head(params: dict[str, Any]) -> Array:
    """The output projection [D, V]: ``lm_head``, or the tied embedding transposed."""
    return params["lm_head"] if "lm_head" in params else params["embed"].T


# ``forward`` compiled once per (config, shapes): for callers outside their own jit.
forward_jit = jax.jit(forward, static_argnums=1, static_argnames=("return_max_logits", "logits_to_keep", "remat", "activation_sharding",
                                                   "return_hidden"))
