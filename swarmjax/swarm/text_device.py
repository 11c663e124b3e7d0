"""The device half of the host-driven text rollout: a jitted decode segment and a
jitted chunked prefill over the rows of two models (orchestrators and sub-agents).

Every agent of a text swarm is a *row*: B orchestrator rows decode with the
trainable params, ``L`` sub-agent lanes with the frozen params. A row's
conversation sits in its own KV-cache row, slot ``j`` = token ``j`` of the
conversation (RoPE position ``j``), so a row only ever grows by appending:

* :func:`decode_segment` runs the rows that take a turn now until each samples a
  stop id or reaches its limit (one ``lax.while_loop``; both models step together,
  each model's forward skipped when none of its rows emits). Every sampled token,
  the stop id included, is fed back into the cache: the conversation continues after it.
* :func:`prefill_chunk` appends up to ``F`` environment ids to each of the rows
  given (tool replies, sub-agent results, a new sub-agent's prompt) in one forward,
  and keeps each row's logits after its last appended id: they predict the next
  turn's first token (only that position's logits are computed).

Both work on a *compact window* of the cache: the rows named by ``idx`` (the
others are neither computed nor copied; the host pads ``idx`` to a few bucket sizes
with the spare last row) and the first ``window`` slots (a static bound past every
slot the call writes, so attention never reads the empty tail of the buffer). A
row that writes nothing in a step (a turn already over, a padded entry) writes a
masked entry at its own next free slot, which the next real write overwrites.
Token-in-token-out: nothing here tokenises anything.
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
    """Decoding state of one model's R rows (the last one a spare that pads ``idx``).

    cache:  :class:`KVCache` of the rows;
    logits: [R, V] f32  the model's prediction of each row's next token;
    pos:    [R] int32   next free slot (= conversation length) of each row.
    """

    cache: KVCache
    logits: Array
    pos: Array


def init_rows(cfg: ModelConfig, rows: int, slots: int) -> Rows:
    """``rows`` rows and the spare: a zero cache of ``slots`` slots, zero logits, pos 0."""
    return Rows(cache=init_cache(cfg, rows + 1, slots),
                logits=jnp.zeros((rows + 1, cfg.vocab_size), jnp.float32),
                pos=jnp.zeros((rows + 1,), jnp.int32))


def gather_rows(rows: Rows, idx: Array, window: int) -> Rows:
    """The rows ``idx`` [Rb] and their first ``window`` slots."""
    take = lambda a: jnp.take(a, idx, axis=0)
    cache = KVCache(k=tuple(take(a)[..., :window] for a in rows.cache.k),
                    v=tuple(take(a)[:, :, :window] for a in rows.cache.v),
                    valid=take(rows.cache.valid)[:, :window])
    return Rows(cache=cache, logits=take(rows.logits), pos=take(rows.pos))


def scatter_rows(rows: Rows, idx: Array, sub: Rows) -> Rows:
    """Write a :func:`gather_rows` window back (entries of the spare row may repeat)."""
    W = sub.cache.max_len
    cache = KVCache(k=tuple(a.at[idx, :, :, :W].set(s) for a, s in zip(rows.cache.k, sub.cache.k)),
                    v=tuple(a.at[idx, :, :W].set(s) for a, s in zip(rows.cache.v, sub.cache.v)),
                    valid=rows.cache.valid.at[idx, :W].set(sub.cache.valid))
    return Rows(cache=cache, logits=rows.logits.at[idx].set(sub.logits), pos=rows.pos.at[idx].set(sub.pos))


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


def _feed(params: Any, cfg: ModelConfig, rows: Rows, tok: Array, emit: Array, rope) -> Rows:
    """Append one token per emitting row at its ``pos``; other rows keep their logits
    and write a masked entry at their free ``pos``. Skipped when no row emits."""
    def run(rows: Rows) -> Rows:
        out = forward(params, cfg, tok[:, None], positions=rows.pos[:, None], token_mask=emit[:, None],
                      cache=rows.cache, cache_index=rows.pos, rope_table=rope)
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
             limit: Array, stops: Array, forced: Array | None, rope) -> _Decoding:
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
    rows = _feed(params, cfg, d.rows, tok, emit, rope)
    return _Decoding(rows=rows, turns=turns, done=d.done | hit | (lengths >= limit))


def decode_segment(orch_params: Any, work_params: Any, orch_cfg: ModelConfig, work_cfg: ModelConfig,
                   orch_sampling: SamplingConfig, work_sampling: SamplingConfig,
                   orch: Rows, work: Rows, key: Array, *, orch_idx: Array, work_idx: Array,
                   orch_limit: Array, work_limit: Array, stop_ids: Array, steps: int,
                   orch_window: int, work_window: int,
                   orch_forced: Array | None = None, work_forced: Array | None = None
                   ) -> tuple[Rows, Rows, Turns, Turns]:
    """Decode the given rows of both models until each samples a stop id or its limit.

    Args:
      orch_params / work_params: trainable orchestrator and frozen sub-agent params.
      orch, work: :class:`Rows` of the B orchestrator rows and the L sub-agent lanes.
      orch_idx [Bo], work_idx [Bw] int32: the rows that take a turn now (padded with
        the spare row, whose limit is 0).
      orch_limit [Bo], work_limit [Bw] int32: most tokens each may sample now (the turn
        limit, or less when its context is nearly full); 0 on padding.
      stop_ids: [K] int32 ids that end a turn (the chat format's stops).
      steps: static length of the output buffers (>= every limit).
      orch_window, work_window: static slots attended over (> every pos + limit).
      orch_forced [Bo, steps], work_forced [Bw, steps]: optional ids to replay instead of
        sampling (-1: sample); replayed ids are scored by the temperature-1 model.

    Returns:
      both models' rows (the turns written into their caches) and the :class:`Turns`
      of the rows in ``orch_idx`` / ``work_idx`` order.
    """
    o_rope, w_rope = rope_table(orch_cfg, orch_window), rope_table(work_cfg, work_window)
    carry = _Carry(i=jnp.int32(0), key=key,
                   orch=_start(gather_rows(orch, orch_idx, orch_window), orch_limit > 0, steps),
                   work=_start(gather_rows(work, work_idx, work_window), work_limit > 0, steps))

    def body(c: _Carry) -> _Carry:
        with jax.named_scope("text_decode_step"):
            key, ko, kw = jax.random.split(c.key, 3)
            o = _advance(orch_params, orch_cfg, orch_sampling, c.orch, c.i, ko, orch_limit, stop_ids,
                         orch_forced, o_rope)
            w = _advance(work_params, work_cfg, work_sampling, c.work, c.i, kw, work_limit, stop_ids,
                         work_forced, w_rope)
            return _Carry(i=c.i + 1, key=key, orch=o, work=w)

    def cond(c: _Carry) -> Array:
        return (c.i < steps) & ~(jnp.all(c.orch.done) & jnp.all(c.work.done))

    c = lax.while_loop(cond, body, carry)
    return (scatter_rows(orch, orch_idx, c.orch.rows), scatter_rows(work, work_idx, c.work.rows),
            c.orch.turns, c.work.turns)


def prefill_chunk(params: Any, cfg: ModelConfig, rows: Rows, idx: Array, ids: Array, counts: Array,
                  reset: Array, *, window: int) -> Rows:
    """Append ``ids[j, :counts[j]]`` to row ``idx[j]``'s conversation, in one forward.

    Args:
      rows: the model's :class:`Rows`.
      idx: [Rb] int32 rows to append to (padded with the spare row, count 0).
      ids: [Rb, F] int32 environment ids, right-padded.
      counts: [Rb] int32 ids to append per row.
      reset: [Rb] bool rows whose conversation starts over (a lane given to a new
        sub-agent): they write from slot 0 and their window is invalidated (slots past
        it are never read before being written again: attention is causal in slots).
      window: static slots attended over (>= every row's pos + F).

    Returns:
      rows with the ids in their caches, ``pos += counts``, and on rows with
      ``counts > 0`` the logits after their last appended id.
    """
    sub = gather_rows(rows, idx, window)
    F = ids.shape[1]
    pos = jnp.where(reset, 0, sub.pos)
    cache = sub.cache.replace(valid=jnp.where(reset[:, None], False, sub.cache.valid))
    write = counts > 0
    out = forward(params, cfg, ids, positions=pos[:, None] + jnp.arange(F)[None, :],
                  token_mask=jnp.arange(F)[None, :] < counts[:, None], cache=cache, cache_index=pos,
                  logits_at=jnp.maximum(counts - 1, 0), rope_table=rope_table(cfg, window))
    sub = Rows(cache=out.cache, logits=jnp.where(write[:, None], out.logits[:, 0], sub.logits),
               pos=pos + counts)
    return scatter_rows(rows, idx, sub)


def copy_prefix(rows: Rows, src: Array, idx: Array, length: Array, *, window: int) -> Rows:
    """Rows ``idx`` [Rb] start over holding the first ``length`` slots of row ``src``
    (a prompt prefix they share, e.g. the system turn with the tool schemas, prefilled
    once: vLLM / SGLang's prefix caching, for one batch). Their slots past ``length``
    are left as they were: attention is causal in slots, and a row writes every slot
    before it reads it. ``window`` (static) >= ``length``."""
    sub = gather_rows(rows, jnp.full(idx.shape, src, jnp.int32), window)
    sub = sub.replace(cache=sub.cache.replace(valid=sub.cache.valid & (jnp.arange(window) < length)[None]),
                      pos=jnp.full(idx.shape, length, jnp.int32))
    return scatter_rows(rows, idx, sub)


@functools.partial(jax.jit, static_argnames=("window",), donate_argnums=(0,))
def copy_prefix_jit(rows, src, idx, length, *, window):
    """:func:`copy_prefix` jitted, the rows donated."""
    return copy_prefix(rows, src, idx, length, window=window)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5),
                   static_argnames=("steps", "orch_window", "work_window"), donate_argnums=(6, 7))
def decode_segment_jit(orch_params, work_params, orch_cfg, work_cfg, orch_sampling, work_sampling,
                       orch, work, key, **kwargs):
    """:func:`decode_segment` jitted, both models' rows donated (caches updated in place)."""
    return decode_segment(orch_params, work_params, orch_cfg, work_cfg, orch_sampling, work_sampling,
                          orch, work, key, **kwargs)


@functools.partial(jax.jit, static_argnums=(1,), static_argnames=("window",), donate_argnums=(2,))
def prefill_chunk_jit(params, cfg, rows, idx, ids, counts, reset, *, window):
    """:func:`prefill_chunk` jitted, the rows donated. One compile per (rows, chunk, window) bucket."""
    return prefill_chunk(params, cfg, rows, idx, ids, counts, reset, window=window)
