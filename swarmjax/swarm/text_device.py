"""The device half of the host-driven text rollout: a jitted decode segment and a
jitted chunked prefill over the rows of two models (orchestrators and sub-agents).

Every agent of a text swarm is a *row*: B orchestrator rows decode with the
trainable params, ``L`` sub-agent lanes with the frozen params. A row's
conversation sits in its own KV-cache row, slot ``j`` = token ``j`` of the
conversation (RoPE position ``j``), so a row only ever grows by appending:

* :func:`decode_segment` runs every active row until it samples a stop id or
  reaches its per-row token limit (one ``lax.while_loop``; both models step
  together, each model's forward skipped when none of its rows emits). Every
  sampled token, the stop id included, is fed back into the cache: the
  conversation continues after it.
* :func:`prefill_chunk` appends up to ``F`` environment ids per row (tool replies,
  sub-agent results, a new sub-agent's prompt) in one forward, and keeps each
  row's logits after its last appended id: they predict the next turn's first token.

A cache row holds ``S`` conversation slots plus ``F_max`` scratch slots at the end:
rows that do not write in a call write there (never out of bounds, never over a
real token), and a chunk's padding lands on slots past the row's end that later
writes overwrite. Token-in-token-out: nothing here tokenises anything.
"""

from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from swarmjax.models.config import ModelConfig
from swarmjax.models.transformer import KVCache, forward, init_cache, rope_table
from swarmjax.sampling.processors import SamplingConfig, select_tokens

Array = jax.Array


@flax.struct.dataclass
class Rows:
    """Decoding state of one model's R rows (S conversation slots + scratch).

    cache:  :class:`KVCache` with ``S + F_max`` slots per row;
    logits: [R, V] f32  the model's prediction of each row's next token;
    pos:    [R] int32   next free slot (= conversation length) of each row.
    """

    cache: KVCache
    logits: Array
    pos: Array
    slots: int = flax.struct.field(pytree_node=False)   # S; slot S is the first scratch slot

    @property
    def scratch(self) -> int:
        """First scratch slot (= S): where rows that do not write in a call write."""
        return self.slots


def init_rows(cfg: ModelConfig, rows: int, slots: int, scratch: int) -> Rows:
    """Empty rows: a zero cache of ``slots + scratch`` slots, zero logits, pos 0."""
    return Rows(cache=init_cache(cfg, rows, slots + scratch),
                logits=jnp.zeros((rows, cfg.vocab_size), jnp.float32),
                pos=jnp.zeros((rows,), jnp.int32), slots=slots)


@flax.struct.dataclass
class Turns:
    """One model's output of a decode segment (T: the segment's longest turn).

    tokens:         [R, T] int32 sampled ids (-1 past a row's length);
    logprobs:       [R, T] f32   log-prob under the sampling distribution used;
    model_logprobs: [R, T] f32   log-prob under the plain temperature-1 model;
    lengths:        [R] int32    tokens sampled by each row in this segment;
    stopped:        [R] bool     the row's last token is a stop id (else it hit its limit
                                 or was not active).
    """

    tokens: Array
    logprobs: Array
    model_logprobs: Array
    lengths: Array
    stopped: Array


@flax.struct.dataclass
class _Decoding:
    """Carry of one model in the decode loop (R rows, T steps)."""

    rows: Rows
    turns: Turns
    done: Array        # [R] bool: stopped, at its limit, or not active


@flax.struct.dataclass
class _Carry:
    """The decode loop's carry: step index, PRNG key, both models' decoding state."""

    i: Array
    key: Array
    orch: _Decoding
    work: _Decoding


def _choose(logits: Array, key: Array, scfg: SamplingConfig, forced: Array | None) -> tuple[Array, Array, Array]:
    """Tokens [R] with both log-probs: sampled, or ``forced`` [R] where >= 0 (then
    both log-probs are the temperature-1 model's: a replay is scored as the model sees it)."""
    tok, lp, mlp = select_tokens(logits, key, scfg)
    if forced is None:
        return tok, lp, mlp
    model = jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.maximum(forced, 0)[:, None], 1)[:, 0]
    use = forced >= 0
    return jnp.where(use, forced, tok), jnp.where(use, model, lp), jnp.where(use, model, mlp)


def _feed(params: Any, cfg: ModelConfig, rows: Rows, tok: Array, emit: Array) -> Rows:
    """Append one token per emitting row at its ``pos``; other rows keep their logits
    and write the scratch slot. Skipped when no row emits."""
    def run(rows: Rows) -> Rows:
        slot = jnp.where(emit, rows.pos, rows.scratch)
        out = forward(params, cfg, tok[:, None], positions=slot[:, None], token_mask=emit[:, None],
                      cache=rows.cache, cache_index=slot, rope_table=rope_table(cfg, rows.cache.max_len))
        return rows.replace(cache=out.cache, logits=jnp.where(emit[:, None], out.logits[:, 0], rows.logits),
                            pos=rows.pos + emit)
    return lax.cond(jnp.any(emit), run, lambda rows: rows, rows)


def _start(rows: Rows, active: Array, steps: int) -> _Decoding:
    R = rows.pos.shape[0]
    turns = Turns(tokens=jnp.full((R, steps), -1, jnp.int32), logprobs=jnp.zeros((R, steps), jnp.float32),
                  model_logprobs=jnp.zeros((R, steps), jnp.float32), lengths=jnp.zeros((R,), jnp.int32),
                  stopped=jnp.zeros((R,), bool))
    return _Decoding(rows=rows, turns=turns, done=~active)


def _advance(params, cfg: ModelConfig, scfg: SamplingConfig, d: _Decoding, i: Array, key: Array,
             limit: Array, stops: Array, forced: Array | None) -> _Decoding:
    """One step of one model: choose, record, feed, and mark rows that stop."""
    f = None if forced is None else lax.dynamic_index_in_dim(forced, i, axis=1, keepdims=False)
    tok, lp, mlp = _choose(d.rows.logits, key, scfg, f)
    emit = ~d.done
    t = d.turns
    col = lambda buf, value, idle: lax.dynamic_update_index_in_dim(buf, jnp.where(emit, value, idle), i, 1)
    lengths = t.lengths + emit
    hit = emit & jnp.any(tok[:, None] == stops[None, :], axis=-1)
    turns = t.replace(tokens=col(t.tokens, tok, -1), logprobs=col(t.logprobs, lp, 0.0),
                      model_logprobs=col(t.model_logprobs, mlp, 0.0), lengths=lengths, stopped=t.stopped | hit)
    rows = _feed(params, cfg, d.rows, tok, emit)
    return _Decoding(rows=rows, turns=turns, done=d.done | hit | (lengths >= limit))


def decode_segment(orch_params: Any, work_params: Any, orch_cfg: ModelConfig, work_cfg: ModelConfig,
                   orch_sampling: SamplingConfig, work_sampling: SamplingConfig,
                   orch: Rows, work: Rows, key: Array, *, orch_active: Array, work_active: Array,
                   orch_limit: Array, work_limit: Array, stop_ids: Array, steps: int,
                   orch_forced: Array | None = None, work_forced: Array | None = None
                   ) -> tuple[Rows, Rows, Turns, Turns]:
    """Decode every active row of both models until each samples a stop id or its limit.

    Args:
      orch_params / work_params: trainable orchestrator and frozen sub-agent params.
      orch, work: :class:`Rows` of B orchestrator rows and L sub-agent lanes.
      orch_active [B], work_active [L] bool: rows that take a turn now.
      orch_limit [B], work_limit [L] int32: most tokens each row may sample now
        (the turn limit, or less when the row's context is nearly full); >= 1 on active rows.
      stop_ids: [K] int32 ids that end a turn (the chat format's stops).
      steps: static length of the output buffers (>= every limit).
      orch_forced [B, steps], work_forced [L, steps]: optional ids to replay instead of
        sampling (-1: sample); replayed ids are scored by the temperature-1 model.

    Returns:
      the advanced rows of both models and their :class:`Turns`.
    """
    carry = _Carry(i=jnp.int32(0), key=key, orch=_start(orch, orch_active, steps),
                   work=_start(work, work_active, steps))

    def body(c: _Carry) -> _Carry:
        with jax.named_scope("text_decode_step"):
            key, ko, kw = jax.random.split(c.key, 3)
            o = _advance(orch_params, orch_cfg, orch_sampling, c.orch, c.i, ko, orch_limit, stop_ids,
                         orch_forced)
            w = _advance(work_params, work_cfg, work_sampling, c.work, c.i, kw, work_limit, stop_ids,
                         work_forced)
            return _Carry(i=c.i + 1, key=key, orch=o, work=w)

    def cond(c: _Carry) -> Array:
        return (c.i < steps) & ~(jnp.all(c.orch.done) & jnp.all(c.work.done))

    c = lax.while_loop(cond, body, carry)
    return c.orch.rows, c.work.rows, c.orch.turns, c.work.turns


def prefill_chunk(params: Any, cfg: ModelConfig, rows: Rows, ids: Array, counts: Array, reset: Array) -> Rows:
    """Append ``ids[r, :counts[r]]`` to each row's conversation in one forward.

    Args:
      rows: the model's :class:`Rows`.
      ids: [R, F] int32 environment ids, right-padded (F <= the scratch size).
      counts: [R] int32 ids to append per row (0: the row is untouched).
      reset: [R] bool rows whose conversation starts over (a lane given to a new
        sub-agent): their cache is invalidated and they write from slot 0.

    Returns:
      rows with the ids in their caches, ``pos += counts``, and on rows with
      ``counts > 0`` the logits after their last appended id.
    """
    R, F = ids.shape
    pos = jnp.where(reset, 0, rows.pos)
    cache = rows.cache.replace(valid=jnp.where(reset[:, None], False, rows.cache.valid))
    write = counts > 0
    start = jnp.where(write, pos, rows.scratch)                          # [R]
    mask = jnp.arange(F)[None, :] < counts[:, None]                      # [R, F]
    out = forward(params, cfg, ids, positions=start[:, None] + jnp.arange(F)[None, :], token_mask=mask,
                  cache=cache, cache_index=start, rope_table=rope_table(cfg, cache.max_len))
    last = jnp.take_along_axis(out.logits, jnp.maximum(counts - 1, 0)[:, None, None], axis=1)[:, 0]   # [R, V]
    return rows.replace(cache=out.cache, logits=jnp.where(write[:, None], last, rows.logits),
                        pos=pos + counts)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5), static_argnames=("steps",), donate_argnums=(6, 7))
def decode_segment_jit(orch_params, work_params, orch_cfg, work_cfg, orch_sampling, work_sampling,
                       orch, work, key, **kwargs):
    """:func:`decode_segment` jitted, both models' rows donated (caches updated in place)."""
    return decode_segment(orch_params, work_params, orch_cfg, work_cfg, orch_sampling, work_sampling,
                          orch, work, key, **kwargs)


@functools.partial(jax.jit, static_argnums=(1,), donate_argnums=(2,))
def prefill_chunk_jit(params, cfg, rows, ids, counts, reset):
    """:func:`prefill_chunk` jitted, the rows donated. One compile per chunk bucket ``F``."""
    return prefill_chunk(params, cfg, rows, ids, counts, reset)
