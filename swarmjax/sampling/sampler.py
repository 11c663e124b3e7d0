"""On-device autoregressive sampling with a KV cache: prefill + ``lax.while_loop``
decode inside one ``jax.jit``.

:func:`generate` is the pure, traceable core (use it inside your own jitted
code); :class:`Sampler` jits it once with ``NamedSharding``s over a mesh (batch
over the data axes, weights by the logical rule table) and donates the cache.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import (KVCache, cache_logical_axes, default_positions, forward,
                                         grow_cache, init_cache, param_logical_axes, rope_table,
                                         unstack_layers)
from swarmjax.sampling.processors import SamplingConfig, select_tokens
from swarmjax.sharding.mesh import DEFAULT_RULES, batch_sharding, tree_shardings

Array = jax.Array


@flax.struct.dataclass
class SampleOutput:
    """Result of :func:`generate` for B rows and N = ``max_new_tokens``.

    tokens:         [B, N] int32 sampled ids, ``pad_id`` after a row stopped.
    logprobs:       [B, N] f32 log-prob under the sampling distribution used (0 where masked).
    model_logprobs: [B, N] f32 log-prob under the plain temperature-1 model (0 where masked).
    token_mask:     [B, N] bool, True on generated tokens (the stop token included).
    lengths:        [B] int32 number of generated tokens.
    done:           [B] bool, row stopped (stop token or its own max_new_tokens).
    cache:          the KV cache after decoding (prompt left-aligned at slot 0).
    """

    tokens: Array
    logprobs: Array
    model_logprobs: Array
    token_mask: Array
    lengths: Array
    done: Array
    cache: KVCache


@flax.struct.dataclass
class DecodeState:
    """What :func:`generate` records per step (B rows, N = ``max_new_tokens``).

    tokens:         [B, N] int32 sampled ids, ``pad_id`` where a row had stopped.
    logprobs:       [B, N] f32 log-prob under the sampling distribution (0 where masked).
    model_logprobs: [B, N] f32 log-prob under the plain temperature-1 model (0 where masked).
    lengths:        [B] int32 tokens generated so far.
    done:           [B] bool, row stopped (stop token or its limit).
    """

    tokens: Array
    logprobs: Array
    model_logprobs: Array
    lengths: Array
    done: Array


@flax.struct.dataclass
class DecodeCarry:
    """The decode ``lax.while_loop`` carry of :func:`generate` (B rows, S cache slots
    of the current segment's window).

    i:     [] int32 decode step; this step writes cache slot P + i.
    state: :class:`DecodeState`, the recorded tokens and log-probs.
    tok:   [B] int32 last sampled token of each row, fed in this step.
    feed:  [B] bool, row still running (its token is written as valid).
    cache: :class:`KVCache` window: per layer k [B, Hkv, hd, S], v [B, Hkv, S, hd]
           (cache dtype), valid [B, S] bool.
    pos:   [B] int32 RoPE position of ``tok``.
    key:   PRNG key.
    """

    i: Array
    state: DecodeState
    tok: Array
    feed: Array
    cache: KVCache
    pos: Array
    key: Array


def left_align(tokens: Array, mask: Array) -> tuple[Array, Array]:
    """Move padding of each row to the front, keeping token order (works for
    right-, left- or already-aligned padding). tokens, mask: [B, P]."""
    order = jnp.argsort(mask.astype(jnp.int32), axis=1, stable=True)    # pads first
    return (jnp.take_along_axis(tokens, order, axis=1),
            jnp.take_along_axis(mask.astype(bool), order, axis=1))


def generate(params: Any, cfg: ModelConfig, scfg: SamplingConfig, prompts: Array,
             prompt_mask: Array, key: Array, cache: KVCache, *,
             max_new_tokens: Array | None = None, stop_tokens: Array | None = None,
             constrain_cache: Callable[[KVCache], KVCache] | None = None,
             activation_sharding: Any = None, adapter: Array | None = None) -> SampleOutput:
    """Sample continuations of a batch of prompts (traceable; jit it or call it in jit).

    Args:
      params: model parameters.
      cfg, scfg: static model and sampling configs.
      prompts: [B, P] int token ids; prompt_mask: [B, P] bool (False on padding,
        left or right). Every row needs at least one real token.
      key: PRNG key.
      cache: a :class:`KVCache` with ``max_len >= P + scfg.max_new_tokens``; its
        contents are overwritten (pass the previous call's ``out.cache`` to reuse the buffer).
      max_new_tokens: optional [B] int per-row limit (<= ``scfg.max_new_tokens``).
      stop_tokens: optional [B, K] int per-row stop ids, padded with -1.
      constrain_cache: optional sharding constraint for the cache windows built
        inside (see ``scfg.decode_segments``); :class:`Sampler` lays them out as the cache.
      activation_sharding: optional sharding of the prefill's hidden states [B, P, D]
        (:class:`Sampler`: rows over the data axes). Left free, XLA kept the whole batch's
        activations on every device and split the FSDP-sharded weights instead (Qwen3-8B,
        64 rows x 2048 prompt ids on 64 devices: [64, 2048, 12288] float32 MLP arrays).
      adapter: with ``cfg.lora``, [B] int: each row's LoRA adapter (-1: the bare base), so
        rows of several adapters decode in one batch over one copy of the base weights
        (:mod:`swarmjax.models.lora`); None: adapter 0 for every row.

    Decoding stops for a row at its first stop token or its limit, and the whole
    loop ends when every row has stopped. The decode loop runs in
    ``scfg.decode_segments`` segments, each over a window of the cache that ends at
    the last slot it writes; the returned cache is the full ``cache.max_len`` buffer.
    """
    B, P = prompts.shape
    N = scfg.max_new_tokens
    if cache.max_len < P + N:
        raise ValueError(f"cache holds {cache.max_len} slots, need prompt {P} + {N} new tokens")
    limit = jnp.full((B,), N, jnp.int32) if max_new_tokens is None else \
        jnp.minimum(jnp.asarray(max_new_tokens, jnp.int32), N)
    stops = jnp.full((B, 0), -1, jnp.int32) if stop_tokens is None else jnp.asarray(stop_tokens, jnp.int32)

    if "lm_head" not in params:            # tied: a [D, V] copy, the layout XLA:CPU's dot reads fastest
        params = {**params, "lm_head": lax.optimization_barrier(params["embed"].T)}
    stacked, params = params, unstack_layers(params)   # decode: the layer stack sliced once, not once per step
    prompts, prompt_mask = left_align(prompts, prompt_mask)
    rope = rope_table(cfg, cache.max_len)  # positions stay below the cache length
    # window of a segment ending at step `end`: P + end slots, rounded up to a multiple
    # of 16 (odd slot counts made XLA:CPU's q.k dot 40% slower, measured at 191 vs 192)
    window = lambda end: min(-(-(P + end) // 16) * 16, cache.max_len)
    constrain_cache = constrain_cache or (lambda c: c)
    ends = segment_ends(N - 1, scfg.decode_segments)
    first = constrain_cache(init_cache(cfg, B, window(ends[0]), cache.k[0].dtype))
    out = forward(stacked, cfg, prompts, positions=default_positions(prompt_mask),   # on a mesh: a layer scan
                  token_mask=prompt_mask, cache=first, cache_index=0,
                  logits_to_keep=1,            # left-aligned: the last column is every row's last token
                  rope_table=rope, activation_sharding=activation_sharding, adapter=adapter)
    next_pos = jnp.sum(prompt_mask, axis=1, dtype=jnp.int32)              # [B]

    def record(state: DecodeState, i, logits, key):
        tok, lp, mlp = select_tokens(logits, key, scfg)                    # [B] each
        active = ~state.done
        tok = jnp.where(active, tok, scfg.pad_id)
        tokens = state.tokens.at[:, i].set(tok)
        lps = state.logprobs.at[:, i].set(jnp.where(active, lp, 0.0))
        mlps = state.model_logprobs.at[:, i].set(jnp.where(active, mlp, 0.0))
        lengths = state.lengths + active
        hit_stop = jnp.any(tok[:, None] == stops, axis=-1)
        done = state.done | (active & hit_stop) | (lengths >= limit)
        # only rows still running feed their token back (finished rows stay invalid)
        return DecodeState(tokens=tokens, logprobs=lps, model_logprobs=mlps, lengths=lengths,
                           done=done), tok, ~done

    state = DecodeState(tokens=jnp.full((B, N), scfg.pad_id, jnp.int32),
                        logprobs=jnp.zeros((B, N), jnp.float32),
                        model_logprobs=jnp.zeros((B, N), jnp.float32),
                        lengths=jnp.zeros((B,), jnp.int32), done=limit <= 0)
    key, sub = jax.random.split(key)
    state, tok, feed = record(state, 0, out.logits[:, -1], sub)

    def body(c: DecodeCarry) -> DecodeCarry:
        step = forward(params, cfg, c.tok[:, None], positions=c.pos[:, None], token_mask=c.feed[:, None],
                       cache=c.cache, cache_index=P + c.i, rope_table=rope, adapter=adapter)
        key, sub = jax.random.split(c.key)
        state, tok, feed = record(c.state, c.i + 1, step.logits[:, 0], sub)
        return DecodeCarry(i=c.i + 1, state=state, tok=tok, feed=feed, cache=step.cache,
                           pos=c.pos + 1, key=key)

    # Step i writes slot P + i; a segment ending at step `end` attends over window(end)
    # slots (the prefill writes its cache at the first segment's size; each later
    # segment pads it once). Segments end early, like the loop, once all rows are done.
    carry = DecodeCarry(i=jnp.int32(0), state=state, tok=tok, feed=feed, cache=out.cache,
                        pos=next_pos, key=key)
    for end in ends:
        cond = lambda c, end=end: (c.i < end) & ~jnp.all(c.state.done)
        grown = constrain_cache(grow_cache(carry.cache, window(end)))
        carry = lax.while_loop(cond, body, carry.replace(cache=grown))
    state, last = carry.state, carry.cache
    # into the donated buffer (in place): slots past the window keep stale, invalid entries
    put = lambda buf, new: lax.dynamic_update_slice(buf, new, (0,) * buf.ndim)
    cache = KVCache(k=tuple(map(put, cache.k, last.k)), v=tuple(map(put, cache.v, last.v)),
                    valid=put(jnp.zeros_like(cache.valid), last.valid))
    token_mask = jnp.arange(N)[None, :] < state.lengths[:, None]
    return SampleOutput(tokens=state.tokens, logprobs=state.logprobs,
                        model_logprobs=state.model_logprobs, token_mask=token_mask,
                        lengths=state.lengths, done=state.done, cache=cache)


def segment_ends(steps: int, segments: int) -> list[int]:
    """Exclusive ends of up to ``segments`` equal shares of ``steps`` loop steps
    (at least one segment, even for 0 steps): ``segment_ends(127, 4) == [32, 64, 96, 127]``."""
    if steps == 0:
        return [0]
    return sorted({-(-steps * j // segments) for j in range(1, segments + 1)})


class Sampler:
    """Jitted :func:`generate` for one model/sampling config, optionally over a mesh.

    >>> sampler = Sampler(cfg, SamplingConfig(temperature=0.0, max_new_tokens=16))
    >>> out = sampler(params, prompts, prompt_mask=prompt_mask, key=jax.random.key(0))

    With ``mesh``, inputs are placed with ``NamedSharding``s: batch over the mesh's
    data axes (replicated if not divisible), weights and cache by the logical
    rule table. The cache argument is donated: pass ``out.cache`` back in to
    decode the next batch in the same buffer.
    """

    def __init__(self, cfg: ModelConfig, scfg: SamplingConfig, *, mesh: Mesh | None = None,
                 rules=DEFAULT_RULES):
        self.cfg, self.scfg, self.mesh, self.rules = cfg, scfg, mesh, rules
        self._jitted: dict[tuple, Any] = {}

    def param_shardings(self, params: Any) -> Any:
        """NamedShardings of ``params`` on this sampler's mesh (None without a mesh)."""
        if self.mesh is None:
            return None
        return tree_shardings(param_logical_axes(self.cfg), params, self.mesh, self.rules)

    def _cache_shardings(self, batch: int, max_len: int):
        shapes = jax.eval_shape(lambda: init_cache(self.cfg, batch, max_len))
        return tree_shardings(cache_logical_axes(self.cfg), shapes, self.mesh, self.rules)

    def init_cache(self, batch: int, prompt_len: int) -> KVCache:
        """An empty cache sized for ``prompt_len + max_new_tokens`` (sharded on the mesh)."""
        max_len = prompt_len + self.scfg.max_new_tokens
        if self.mesh is None:
            return init_cache(self.cfg, batch, max_len)
        return jax.jit(lambda: init_cache(self.cfg, batch, max_len),
                       out_shardings=self._cache_shardings(batch, max_len))()

    def _compile(self, params, batch: int, cache: KVCache, per_row: tuple[bool, bool, bool]):
        sig = (batch, cache.max_len, per_row)
        if sig in self._jitted:
            return self._jitted[sig]
        constrain = None if self.mesh is None else lambda c: jax.lax.with_sharding_constraint(
            c, self._cache_shardings(batch, c.max_len))

        def fn(params, prompts, prompt_mask, key, cache, max_new_tokens, stop_tokens, adapter):
            return generate(params, self.cfg, self.scfg, prompts, prompt_mask, key, cache,
                            max_new_tokens=max_new_tokens, stop_tokens=stop_tokens, adapter=adapter,
                            constrain_cache=constrain,
                            activation_sharding=None if self.mesh is None else batch_sharding(
                                self.mesh, 3, rules=self.rules, batch_size=batch))

        if self.mesh is None:
            jitted = jax.jit(fn, donate_argnums=4)
        else:
            rows = lambda nd: batch_sharding(self.mesh, nd, rules=self.rules, batch_size=batch)
            repl = NamedSharding(self.mesh, PartitionSpec())
            jitted = jax.jit(
                fn, donate_argnums=4,
                in_shardings=(self.param_shardings(params), rows(2), rows(2), repl,
                              self._cache_shardings(batch, cache.max_len),
                              rows(1) if per_row[0] else None, rows(2) if per_row[1] else None,
                              rows(1) if per_row[2] else None))
        self._jitted[sig] = jitted
        return jitted

    def __call__(self, params: Any, prompts: Array, *, prompt_mask: Array | None = None,
                 key: Array | None = None, max_new_tokens: Array | None = None,
                 stop_tokens: Array | None = None, cache: KVCache | None = None,
                 adapter: Array | None = None) -> SampleOutput:
        """Sample; shapes as in :func:`generate` (``adapter`` [B]: each row's LoRA adapter).
        ``prompt_mask`` defaults to all True, ``key`` to ``jax.random.key(0)``, ``cache``
        to a fresh one."""
        prompts = jnp.asarray(prompts, jnp.int32)
        B, P = prompts.shape
        prompt_mask = jnp.ones((B, P), bool) if prompt_mask is None else jnp.asarray(prompt_mask, bool)
        if not bool(jnp.all(jnp.any(prompt_mask, axis=1))):
            raise ValueError("every prompt row needs at least one real (unmasked) token")
        if int(jnp.max(prompts)) >= self.cfg.vocab_size or int(jnp.min(prompts)) < 0:
            raise ValueError(f"prompt token ids must be in [0, {self.cfg.vocab_size})")
        key = jax.random.key(0) if key is None else key
        cache = self.init_cache(B, P) if cache is None else cache
        if adapter is not None and self.cfg.lora is None:
            raise ValueError("adapter= picks LoRA adapters: the sampler's model config has no lora")
        adapter = None if adapter is None else jnp.asarray(adapter, jnp.int32)
        fn = self._compile(params, B, cache, (max_new_tokens is not None, stop_tokens is not None,
                                              adapter is not None))
        return fn(params, prompts, prompt_mask, key, cache, max_new_tokens, stop_tokens, adapter)


def pad_prompts(prompts: Sequence[Sequence[int]], *, pad_id: int = 0,
                length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Ragged lists of token ids -> left-padded ``tokens [B, P]`` and ``mask [B, P]``."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("need at least one prompt, and every prompt needs at least one token")
    P = max(len(p) for p in prompts) if length is None else length
    if any(len(p) > P for p in prompts):
        raise ValueError(f"a prompt is longer than length={P}")
    tokens = np.full((len(prompts), P), pad_id, np.int32)
    mask = np.zeros((len(prompts), P), bool)
    for b, p in enumerate(prompts):
        tokens[b, P - len(p):] = p
        mask[b, P - len(p):] = True
    return tokens, mask
