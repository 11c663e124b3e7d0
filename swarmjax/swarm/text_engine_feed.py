"""How a tick of the jitted text swarm (:mod:`swarmjax.swarm.text_engine`) feeds each
role's rows to its model: every row gets the ids of its trace it has not fed yet, in a
1-wide forward (a row that just sampled) and a ``chunk``-wide one (rows with a backlog of
replies or prompts), each compacted to the rows it feeds and the cache slots they use
(``lax.switch`` over a few static row counts x windows), the new keys and values
scattered back into the caches."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from swarmjax.models.config import ModelConfig
from swarmjax.swarm.text_device import Rows, gather_rows, scatter_rows
from swarmjax.swarm.text_engine_state import Agents
from swarmjax.text.device import calls as dc

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class RoleModel:
    """What one role's rows need (static per rollout)."""

    cfg: ModelConfig
    grammar: dc.CallGrammar
    context: int
    sampling: Any


def forward_rows(params: Any, m: RoleModel, rows: Rows, trace_ids: Array, counts: Array, width: int, rope) -> Rows:
    """Feed each row ``counts[r]`` (<= width) trace ids from its first unfed one; ``rope``:
    the model's RoPE table over its whole cache (:meth:`Rows.rope`, built once outside the
    tick loop: XLA evaluated it inside every forward of every tick otherwise)."""
    fed = rows.offset + rows.pos
    col = jnp.clip(fed[:, None] + jnp.arange(width)[None, :], 0, trace_ids.shape[1] - 1)
    ids = jnp.take_along_axis(trace_ids, col, axis=1)                                   # [R, width]
    out = rows.forward(params, m.cfg, ids, token_mask=jnp.arange(width)[None, :] < counts[:, None],
                       rope=rope, logits_at=jnp.maximum(counts - 1, 0))
    write = counts > 0
    return rows.replace(cache=out.cache, logits=jnp.where(write[:, None], out.logits[:, 0], rows.logits),
                        pos=rows.pos + counts)


def sizes(full: int, count: int, *, least: int = 1, linear: bool = False) -> tuple[int, ...]:
    """``count`` static sizes, ascending, the largest ``full``, none below ``least``
    (duplicates dropped): ``ceil(full / 2^i)``, or ``ceil(full i / count)`` with
    ``linear`` (windows: a conversation's reach grows evenly, and a window's cost is
    linear in it). The shapes a compacted forward is compiled for."""
    cut = (lambda i: -(-full * (count - i) // count)) if linear else (lambda i: -(-full // 2 ** i))
    return tuple(sorted({max(least, cut(i)) for i in range(count)} | {full}))


def compact_forward(params: Any, m: RoleModel, rows: Rows, trace_ids: Array, counts: Array, width: int,
                     row_sizes: tuple[int, ...], windows: tuple[int, ...], rope) -> Rows:
    """:func:`forward_rows` of only the rows with ``counts > 0`` over only the slots they use.

    A tick feeds few rows (most are waiting: for their sub-agents, for their turn's
    replies, or ended), and a conversation fills its cache slowly, so the rows fed are
    gathered into the smallest of ``row_sizes`` that holds them over the smallest of
    ``windows`` slots past every one's ``pos + width`` (both static: ``lax.switch``
    over the ``len(row_sizes) x len(windows)`` compiled forwards). The branch returns
    only what the rows wrote (keys and values of their ``width`` new slots, their
    logits), scattered into the caches after it: a conditional that updated the whole
    cache would copy it every tick (measured: 15 ms on a 1m model's 128 x 528 sub-agent
    cache). The cost is then ~ rows fed x slots used, as in the host rollout's compact
    windows, not every row over the whole cache; the values are :func:`forward_rows`'s
    (a row's attention reads only its own slots and the shared prefix). At most
    ``row_sizes[-1]`` rows may be fed."""
    R = counts.shape[0]
    feed = counts > 0
    order = jnp.argsort(~feed, stable=True)                                              # [R] fed rows first
    reach = jnp.max(jnp.where(feed, rows.pos + width, 0))
    pick = lambda table, x: jnp.minimum(jnp.searchsorted(jnp.asarray(table), x), len(table) - 1)
    top = row_sizes[-1]

    def branch(nr: int, w: int):
        def run(rows: Rows):
            idx = order[:nr]
            live = feed[idx]
            sub = gather_rows(rows, idx, w)
            sub = sub.replace(pos=jnp.where(live, sub.pos, 0))          # padding writes inside its window
            out = forward_rows(params, m, sub, trace_ids[idx], jnp.where(live, counts[idx], 0), width, rope)
            pad = lambda a: jnp.pad(a, [(0, top - nr)] + [(0, 0)] * (a.ndim - 1))
            new = lambda buf, axis: pad(jax.vmap(lambda b, p: lax.dynamic_slice_in_dim(b, p, width, axis))(
                buf, sub.pos))
            drop = jnp.full((top,), R, jnp.int32).at[:nr].set(jnp.where(live, idx, R))    # R: dropped
            return (drop, tuple(new(k, 2) for k in out.cache.k),                              # [top, K, hd, width]
                    tuple(new(v, 1) for v in out.cache.v), pad(out.logits))              # [top, K, width, hd]
        return run
    branches = [branch(nr, w) for nr in row_sizes for w in windows]
    shapes = jax.eval_shape(branches[0], rows)

    def idle(rows: Rows):              # no row fed: nothing computed, every entry dropped
        return (jnp.full((top,), R, jnp.int32),) + jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype), shapes[1:])
    n = jnp.sum(feed)
    index = jnp.where(n > 0, 1 + pick(row_sizes, n) * len(windows) + pick(windows, reach), 0)
    idx, ks, vs, logits = lax.switch(index, [idle] + branches, rows)
    at = jnp.minimum(idx, R - 1)                                                         # entries at R: dropped
    r = idx[:, None]                                                                     # [top, 1]
    slot = rows.pos[at][:, None] + jnp.arange(width)[None, :]                            # [top, width]
    written = jnp.arange(width)[None, :] < counts[at][:, None]                           # [top, width]
    put = lambda a, u, *index: a.at[index].set(u, mode="drop")                          # updates [top, width, ...]
    cache = rows.cache.replace(k=tuple(put(a, u.transpose(0, 3, 1, 2), r, slice(None), slice(None), slot)
                                       for a, u in zip(rows.cache.k, ks)),
                               v=tuple(put(a, u.transpose(0, 2, 1, 3), r, slice(None), slot)
                                       for a, u in zip(rows.cache.v, vs)),
                               valid=put(rows.cache.valid, written, r, slot))
    return rows.replace(cache=cache, logits=rows.logits.at[idx].set(logits, mode="drop"), pos=rows.pos + counts)


def feed(params: Any, m: RoleModel, a: Agents, mask: Array, chunk: int, wide_rows: int,
          buckets: int, rope) -> Agents:
    """Feed every row in ``mask`` [R] what it has not yet fed of its trace: one
    1-wide forward (a row that just sampled, or one id of a longer backlog), and one
    ``chunk``-wide forward over at most ``wide_rows`` rows with a backlog. Each is
    compacted to the rows it feeds and the slots they use (:func:`compact_forward`,
    ``buckets`` sizes of each) and skipped when no row needs it; ``buckets`` = 1: the
    1-wide forward runs every row over the whole cache, the wide one the ``wide_rows``
    rows gathered whole."""
    rows, ids = a.rows, a.trace.ids
    pending = jnp.where(mask, a.trace.length - rows.offset - rows.pos, 0)                # [R]
    wide = pending > 1
    R, X = pending.shape[0], rows.cache.max_len
    idx = jnp.argsort(~wide, stable=True)[:wide_rows]                                    # [Rf] backlog rows first
    chosen = jnp.zeros((R,), bool).at[idx].set(wide[idx])
    narrow = jnp.where(chosen, 0, jnp.minimum(pending, 1))
    counts = jnp.where(chosen, jnp.minimum(pending, chunk), 0)
    if buckets == 1:           # every row over the whole cache (on a mesh: no gathers across shards)
        rows = lax.cond(jnp.any(narrow > 0), lambda r: forward_rows(params, m, r, ids, narrow, 1, rope), lambda r: r,
                        rows)

        def go_wide(rows: Rows) -> Rows:
            sub = gather_rows(rows, idx, rows.cache.max_len)
            return scatter_rows(rows, idx, forward_rows(params, m, sub, ids[idx], counts[idx], chunk, rope))
        return a.replace(rows=lax.cond(jnp.any(chosen), go_wide, lambda r: r, rows))
    windows = lambda width: sizes(X, buckets, least=min(X, width + 1), linear=True)
    rows = compact_forward(params, m, rows, ids, narrow, 1, sizes(R, buckets), windows(1), rope)
    rows = compact_forward(params, m, rows, ids, counts, chunk, sizes(wide_rows, buckets), windows(chunk),
                            rope)
    return a.replace(rows=rows)
