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

Rows that open with the same ids (every orchestrator's system turn and tool schemas)
can share them as a *prefix* (:func:`make_prefix`): one batch-1 cache of P slots
that those rows attend over before their own slots (cascade attention,
``forward(prefix=)``); their own slot ``j`` then holds conversation position
``offset + j`` (``offset`` = P). The prefix is computed once per rollout and read
once per decode step for all of them, and their own caches hold only what follows.

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
from swarmjax.programs import BoundedJit
from swarmjax.roles import Roles
from swarmjax.sampling.processors import SamplingConfig, select_tokens

Array = jax.Array


@flax.struct.dataclass
class Rows:
    """Decoding state of one model's R rows (the last one a spare that pads ``idx``).

    cache:  :class:`KVCache` of the rows;
    logits: [R, V] f32  the model's prediction of each row's next token;
    pos:    [R] int32   next free slot of each row;
    offset: [R] int32   conversation position of each row's slot 0: the length of the
                        shared prefix for rows that attend over it, else 0 (a row's
                        conversation length is ``offset + pos``);
    prefix: the shared prefix, a batch-1 :class:`KVCache` of P slots, or None.
    """

    cache: KVCache
    logits: Array
    pos: Array
    offset: Array
    prefix: KVCache | None = None

    def positions(self, n: int = 1) -> Array:
        """[R, n] conversation positions of each row's next ``n`` slots."""
        return (self.offset + self.pos)[:, None] + jnp.arange(n)[None, :]

    def rope(self, cfg: ModelConfig, window: int):
        """The RoPE table of a call over ``window`` own slots (after the prefix, if any)."""
        return rope_table(cfg, window + (0 if self.prefix is None else self.prefix.max_len))

    def forward(self, params: Any, cfg: ModelConfig, ids: Array, *, token_mask: Array,
                rope: tuple[Array, Array], logits_at: Array | None = None):
        """``forward`` of ``ids`` [R, F] written at each row's ``pos`` (positions
        :meth:`positions`; over the prefix for rows with an offset); ``rope`` from
        :meth:`rope` (built outside decode loops)."""
        return forward(params, cfg, ids, positions=self.positions(ids.shape[1]), token_mask=token_mask,
                       cache=self.cache, cache_index=self.pos, logits_at=logits_at, rope_table=rope,
                       prefix=self.prefix, prefix_rows=None if self.prefix is None else self.offset > 0)


def init_rows(cfg: ModelConfig, rows: int, slots: int) -> Rows:
    """``rows`` rows and the spare: a zero cache of ``slots`` slots, zero logits, pos 0."""
    return Rows(cache=init_cache(cfg, rows + 1, slots),
                logits=jnp.zeros((rows + 1, cfg.vocab_size), jnp.float32),
                pos=jnp.zeros((rows + 1,), jnp.int32), offset=jnp.zeros((rows + 1,), jnp.int32))


def gather_rows(rows: Rows, idx: Array, window: int) -> Rows:
    """The rows ``idx`` [Rb] and their first ``window`` slots."""
    take = lambda a: jnp.take(a, idx, axis=0)
    cache = KVCache(k=tuple(take(a)[..., :window] for a in rows.cache.k),
                    v=tuple(take(a)[:, :, :window] for a in rows.cache.v),
                    valid=take(rows.cache.valid)[:, :window])
    return Rows(cache=cache, logits=take(rows.logits), pos=take(rows.pos), offset=take(rows.offset),
                prefix=rows.prefix)


def scatter_rows(rows: Rows, idx: Array, sub: Rows) -> Rows:
    """Write a :func:`gather_rows` window back (entries of the spare row may repeat)."""
    W = sub.cache.max_len
    cache = KVCache(k=tuple(a.at[idx, :, :, :W].set(s) for a, s in zip(rows.cache.k, sub.cache.k)),
                    v=tuple(a.at[idx, :, :W].set(s) for a, s in zip(rows.cache.v, sub.cache.v)),
                    valid=rows.cache.valid.at[idx, :W].set(sub.cache.valid))
    return Rows(cache=cache, logits=rows.logits.at[idx].set(sub.logits), pos=rows.pos.at[idx].set(sub.pos),
                offset=rows.offset.at[idx].set(sub.offset), prefix=rows.prefix)


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


def choose(logits: Array, key: Array, scfg: SamplingConfig, forced: Array | None, *,
           greedy: Array | None = None) -> tuple[Array, Array, Array]:
    """Tokens [R] with both log-probs: sampled (greedy where the traced ``greedy`` is
    true: :func:`select_tokens`), or ``forced`` [R] where >= 0 (then both log-probs are
    the temperature-1 model's: a replay is scored as the model sees it)."""
    tok, lp, mlp = select_tokens(logits, key, scfg, greedy=greedy)
    if forced is None:
        return tok, lp, mlp
    model = jnp.take_along_axis(jax.nn.log_softmax(logits), jnp.maximum(forced, 0)[:, None], 1)[:, 0]
    use = forced >= 0
    return jnp.where(use, forced, tok), jnp.where(use, model, lp), jnp.where(use, model, mlp)


def _feed(params: Any, cfg: ModelConfig, rows: Rows, tok: Array, emit: Array, rope) -> Rows:
    """Append one token per emitting row at its ``pos``; other rows keep their logits
    and write a masked entry at their free ``pos``. Skipped when no row emits."""
    def run(rows: Rows) -> Rows:
        out = rows.forward(params, cfg, tok[:, None], token_mask=emit[:, None], rope=rope)
        return rows.replace(cache=out.cache, logits=jnp.where(emit[:, None], out.logits[:, 0], rows.logits),
                            pos=rows.pos + emit)
    return lax.cond(jnp.any(emit), run, lambda rows: rows, rows)


def _start(rows: Rows, active: Array, steps: int) -> _Decoding:
    R = rows.pos.shape[0]
    turns = Turns(tokens=jnp.full((R, steps), -1, jnp.int32), logprobs=jnp.zeros((R, steps), jnp.float32),
                  model_logprobs=jnp.zeros((R, steps), jnp.float32), lengths=jnp.zeros((R,), jnp.int32),
                  stopped=jnp.zeros((R,), bool))
    return _Decoding(rows=rows, turns=turns, done=~active)


def row_keys(key: Array, agents: Array, positions: Array) -> Array:
    """One PRNG key per row [R] from the rollout's ``key``: folded with the row's agent
    (``agents`` int32 [R, 2]: episode, agent within it) and the position in its
    conversation of the token it samples (``positions`` int32 [R]). A token's draw then
    depends on what was sampled before it in its own conversation only: not on the batch,
    its compaction, the segments or the process that decodes it."""
    return position_keys(agent_keys(key, agents), positions)


def agent_keys(key: Array, agents: Array) -> Array:
    """The first two folds of :func:`row_keys`: one key per row [R] for its agent
    (``agents`` int32 [R, 2]), computed once per rollout."""
    return jax.vmap(lambda agent: jax.random.fold_in(jax.random.fold_in(key, agent[0]), agent[1]))(agents)


def position_keys(keys: Array, positions: Array) -> Array:
    """The last fold of :func:`row_keys`: each row's agent key [R] with the position of
    the token it samples [R]."""
    return jax.vmap(jax.random.fold_in)(keys, positions)


def _advance(params, cfg: ModelConfig, scfg: SamplingConfig, d: _Decoding, i: Array, key: Array,
             limit: Array, stops: Array, forced: Array | None, rope) -> _Decoding:
    """One step of one model: choose, record, feed, and mark rows that stop. ``key``: one
    key, or one per row [R]."""
    f = None if forced is None else lax.dynamic_index_in_dim(forced, i, axis=1, keepdims=False)
    tok, lp, mlp = choose(d.rows.logits, key, scfg, f)
    emit = ~d.done
    t = d.turns
    col = lambda buf, value, idle: lax.dynamic_update_index_in_dim(buf, jnp.where(emit, value, idle), i, 1)
    lengths = t.lengths + emit
    hit = emit & jnp.any(tok[:, None] == stops[None, :], axis=-1)
    turns = t.replace(tokens=col(t.tokens, tok, -1), logprobs=col(t.logprobs, lp, 0.0),
                      model_logprobs=col(t.model_logprobs, mlp, 0.0), lengths=lengths, stopped=t.stopped | hit)
    rows = _feed(params, cfg, d.rows, tok, emit, rope)
    return _Decoding(rows=rows, turns=turns, done=d.done | hit | (lengths >= limit))


def decode_segment(params: Roles, cfgs: Roles[ModelConfig], sampling: Roles[SamplingConfig],
                   orch: Rows, work: Rows, key: Array, *, orch_idx: Array, work_idx: Array,
                   orch_limit: Array, work_limit: Array, stop_ids: Array, steps: int,
                   orch_window: int, work_window: int,
                   orch_forced: Array | None = None, work_forced: Array | None = None,
                   min_done: Array | None = None, orch_agents: Array | None = None,
                   work_agents: Array | None = None, orch_start: Array | None = None,
                   work_start: Array | None = None) -> tuple[Rows, Rows, Turns, Turns]:
    """Decode the given rows of both models until each samples a stop id or its limit,
    or (``min_done``) until enough of them have.

    Args:
      params: the trainable orchestrator's and the frozen sub-agents' params (``Roles``);
        cfgs, sampling: their model configs and sampling settings (static ``Roles``).
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
      min_done: optional int32 scalar: the segment also ends once this many of the
        active rows (both models) are done, so a few long turns do not keep the whole
        batch decoding: continuous batching at segment granularity. A row cut this way
        resumes where it was in a later call (every sampled token is already in its
        cache and its logits are current); its :class:`Turns` entry is not ``stopped``.
      orch_agents [Bo, 2], work_agents [Bw, 2] int32 with orch_start [Bo], work_start [Bw]
        int32: optional (all four or none) per-row keys: the row's (episode, agent) and
        the conversation position of its first token now; step ``i`` draws with
        :func:`row_keys` at ``start + i``. Without them one key is split per step.

    Returns:
      both models' rows (the turns written into their caches) and the :class:`Turns`
      of the rows in ``orch_idx`` / ``work_idx`` order.
    """
    o_rope, w_rope = orch.rope(cfgs.orchestrator, orch_window), work.rope(cfgs.subagents, work_window)
    carry = _Carry(i=jnp.int32(0), key=key,
                   orch=_start(gather_rows(orch, orch_idx, orch_window), orch_limit > 0, steps),
                   work=_start(gather_rows(work, work_idx, work_window), work_limit > 0, steps))

    per_row = orch_agents is not None

    def body(c: _Carry) -> _Carry:
        with jax.named_scope("text_decode_step"):
            if per_row:
                key = c.key
                ko, kw = row_keys(key, orch_agents, orch_start + c.i), row_keys(key, work_agents, work_start + c.i)
            else:
                key, ko, kw = jax.random.split(c.key, 3)
            o = _advance(params.orchestrator, cfgs.orchestrator, sampling.orchestrator, c.orch, c.i, ko,
                         orch_limit, stop_ids, orch_forced, o_rope)
            w = _advance(params.subagents, cfgs.subagents, sampling.subagents, c.work, c.i, kw, work_limit,
                         stop_ids, work_forced, w_rope)
            return _Carry(i=c.i + 1, key=key, orch=o, work=w)

    active_o, active_w = orch_limit > 0, work_limit > 0
    enough = jnp.int32(active_o.sum() + active_w.sum()) if min_done is None else min_done

    def cond(c: _Carry) -> Array:
        finished = jnp.sum(c.orch.done & active_o) + jnp.sum(c.work.done & active_w)
        return (c.i < steps) & ~(jnp.all(c.orch.done) & jnp.all(c.work.done)) & (finished < enough)

    c = lax.while_loop(cond, body, carry)
    return (scatter_rows(orch, orch_idx, c.orch.rows), scatter_rows(work, work_idx, c.work.rows),
            c.orch.turns, c.work.turns)


def prefill_chunk(params: Any, cfg: ModelConfig, rows: Rows, idx: Array, ids: Array, counts: Array,
                  reset: Array, offset: Array, *, window: int) -> Rows:
    """Append ``ids[j, :counts[j]]`` to row ``idx[j]``'s conversation, in one forward.

    Args:
      rows: the model's :class:`Rows`.
      idx: [Rb] int32 rows to append to (padded with the spare row, count 0).
      ids: [Rb, F] int32 environment ids, right-padded.
      counts: [Rb] int32 ids to append per row.
      reset: [Rb] bool rows whose conversation starts over (a lane given to a new
        sub-agent): they write from slot 0 and their window is invalidated (slots past
        it are never read before being written again: attention is causal in slots).
      offset: [Rb] int32, on ``reset`` rows: the new conversation's position of slot 0
        (the shared prefix's length if it opens with ``rows.prefix``, else 0).
      window: static slots attended over (>= every row's pos + F).

    Returns:
      rows with the ids in their caches, ``pos += counts``, and on rows with
      ``counts > 0`` the logits after their last appended id.
    """
    sub = gather_rows(rows, idx, window)
    F = ids.shape[1]
    sub = sub.replace(pos=jnp.where(reset, 0, sub.pos), offset=jnp.where(reset, offset, sub.offset),
                      cache=sub.cache.replace(valid=jnp.where(reset[:, None], False, sub.cache.valid)))
    write = counts > 0
    out = sub.forward(params, cfg, ids, token_mask=jnp.arange(F)[None, :] < counts[:, None],
                      logits_at=jnp.maximum(counts - 1, 0), rope=sub.rope(cfg, window))
    sub = sub.replace(cache=out.cache, logits=jnp.where(write[:, None], out.logits[:, 0], sub.logits),
                      pos=sub.pos + counts)
    return scatter_rows(rows, idx, sub)


def make_prefix(params: Any, cfg: ModelConfig, ids: Array, length: Array) -> KVCache:
    """The shared prefix of :class:`Rows`: ``ids[:length]`` ([P] int32, right-padded to a
    static P) prefilled once into a batch-1 cache of P slots (vLLM / SGLang's prefix
    caching for one batch; the rows that open with it attend over it, :func:`forward`'s
    ``prefix``). Its keys and values are the ones each row would have computed for it."""
    P = ids.shape[0]
    out = forward(params, cfg, ids[None], token_mask=(jnp.arange(P) < length)[None], cache=init_cache(cfg, 1, P),
                  cache_index=0, logits_to_keep=1)
    return out.cache


@functools.partial(jax.jit, static_argnums=(1,))
def make_prefix_jit(params, cfg, ids, length):
    """:func:`make_prefix` jitted (one compile per prefix bucket)."""
    return make_prefix(params, cfg, ids, length)


# Compiled programs a host rollout keeps (the most recently used; swarmjax/programs.py): a
# decode segment is compiled for each combination of the two roles' row counts and cache
# windows it meets (a few sizes each), and a long run meets hundreds
DECODE_PROGRAMS, PREFILL_PROGRAMS = 48, 48

decode_segment_jit = BoundedJit(decode_segment, size=DECODE_PROGRAMS, static_argnums=(1, 2),
                                static_argnames=("steps", "orch_window", "work_window"), donate_argnums=(3, 4))
""":func:`decode_segment` jitted, both models' rows donated (caches updated in place); the
:data:`DECODE_PROGRAMS` most recently used programs kept."""

prefill_chunk_jit = BoundedJit(prefill_chunk, size=PREFILL_PROGRAMS, static_argnums=(1,), static_argnames=("window",),
                               donate_argnums=(2,))
""":func:`prefill_chunk` jitted, the rows donated: one program per (rows, chunk, window)
bucket, the :data:`PREFILL_PROGRAMS` most recently used kept."""
