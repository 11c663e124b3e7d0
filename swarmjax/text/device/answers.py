"""Answer lines ``entity: value`` read on the device, one sampled token per row per tick.

The wide-search environments end a turn with one ``entity: value`` line per answer.
This module reads those lines as the turn is sampled, inside ``jit``, and its host twin
reads them from the finished turn; both follow the same rules.

Canonical semantics. A turn is a sequence of token ids; each id contributes its UTF-8
bytes (:func:`byte_tries.token_byte_table`), except a *control id* (an added token such
as ``<|im_end|>``, ``<tool_call>``, ``<think>``), which is a line break and contributes
no bytes (a control token spelled in ordinary tokens is just its bytes). Lines are split
at byte ``\\n`` and at control ids; the end of the turn ends the last line. A line that
holds a ``:`` is one answered pair ``(e, v)``: left = the bytes before its FIRST ``:``,
right = the bytes after it, both stripped of spaces and tabs (0x20, 0x09 only: ``\\r``
and other whitespace are kept); ``e`` = index of left in ``entity_names`` (exact bytes;
the first index if a name repeats), else -1; ``v`` likewise in ``value_names``. Lines
without ``:`` give nothing. Pairs keep their order; the first ``max_pairs`` are
recorded, ``count`` counts them all.

Build once on the host, then step on the device::

    g = AnswerGrammar.build(tokenizer, entity_names, value_names, max_pairs=16)
    state = init(g, batch)                           # or reset(g, state, mask)
    state = step(g, state, token_ids, active)        # [B] ids, [B] bool; every tick
    state = finish(g, state, active)                 # the turn ended: close its last line
    pairs_, count = pairs(state)                     # [B, P, 2] (-1 padded), [B]

How it reads. Both name lists live in one dense byte automaton ``next [S, 256]``: the
entity trie (states ``[0, value_root)``, root 0), the value trie (root ``value_root``)
and an absorbing dead state (the last); ``term [S]`` is the name id ending at a state,
else -1. A row holds the side of the line it is on (``right``: after the first ``:``),
``cur`` (the trie state of the side's bytes from its first non-blank byte on, inner
blanks included) and ``last`` (``cur`` just after the last non-blank byte, i.e. the
state of the stripped side). Since no edge enters a root, ``cur == root`` means "only
blanks so far", so a blank there is skipped (leading blanks) and trailing blanks move
``cur`` but not ``last``. At the first ``:`` the entity is ``term[last]`` and the row
moves to the value root; at a line end a row on the right records
``(entity, term[last])``. An empty side ends at its root, which is not terminal (unless
the empty string is a name: then it matches, as on the host).

Host twins: :func:`answer_pairs_from_bytes` / :func:`answer_pairs_from_text` (text as
UTF-8) apply the rules to a byte string; :func:`turn_bytes` builds a turn's bytes
(control ids as ``b"\\n"``); :func:`host_answer_pairs` does both. Text decoded from ids
agrees with the ids when control tokens are replaced by ``"\\n"`` (not kept as their
text) and the bytes are valid UTF-8 (or no name holds U+FFFD).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from swarmjax.text import byte_tries
from swarmjax.text.device.calls_state import where_rows
from swarmjax.text.tokenizer import TextTokenizer

__all__ = ["AnswerGrammar", "AnswerState", "init", "reset", "step", "finish", "pairs", "parse_tokens",
           "answer_pairs_from_bytes", "answer_pairs_from_text", "turn_bytes", "host_answer_pairs"]

NL, COLON, SPACE, TAB = 0x0A, 0x3A, 0x20, 0x09
BLANKS = b" \t"


# --------------------------------------------------------------------------- host twin

def _lookup(names: Sequence[str]) -> dict[bytes, int]:
    """UTF-8 name -> its first index."""
    out: dict[bytes, int] = {}
    for i, n in enumerate(names):
        out.setdefault(n.encode("utf-8"), i)
    return out


def answer_pairs_from_bytes(data: bytes, entity_names: Sequence[str],
                            value_names: Sequence[str]) -> list[tuple[int, int]]:
    """Every answered pair ``(e, v)`` of ``data`` (lines split at ``\\n``), -1 for unknown names."""
    ents, vals = _lookup(entity_names), _lookup(value_names)
    out = []
    for line in data.split(b"\n"):
        left, colon, right = line.partition(b":")
        if colon:
            out.append((ents.get(left.strip(BLANKS), -1), vals.get(right.strip(BLANKS), -1)))
    return out


def answer_pairs_from_text(text: str, entity_names: Sequence[str],
                           value_names: Sequence[str]) -> list[tuple[int, int]]:
    """:func:`answer_pairs_from_bytes` of ``text``'s UTF-8 bytes."""
    return answer_pairs_from_bytes(text.encode("utf-8"), entity_names, value_names)


def turn_bytes(tok_bytes: np.ndarray, tok_len: np.ndarray, ids: Iterable[int], control_ids: Iterable[int]) -> bytes:
    """A turn's bytes: each id's bytes (tok_bytes uint8 [V, L], tok_len [V]), control ids as ``b"\\n"``."""
    ctrl = {int(i) for i in control_ids}
    return b"".join(b"\n" if int(i) in ctrl else tok_bytes[int(i), :tok_len[int(i)]].tobytes() for i in ids)


def host_answer_pairs(tokenizer: TextTokenizer, ids: Iterable[int], entity_names: Sequence[str],
                      value_names: Sequence[str], *, control_ids: Iterable[int] | None = None,
                      byte_table: tuple[np.ndarray, np.ndarray] | None = None) -> list[tuple[int, int]]:
    """Every answered pair of the turn ``ids`` (all of them: the device records the first
    ``max_pairs``). ``control_ids`` default to the tokenizer's added tokens; pass
    ``byte_table`` (:func:`byte_tries.token_byte_table`) to skip rebuilding it."""
    tok_bytes, tok_len = byte_table if byte_table is not None else byte_tries.token_byte_table(tokenizer)
    ctrl = tokenizer.added_tokens.values() if control_ids is None else control_ids
    return answer_pairs_from_bytes(turn_bytes(tok_bytes, tok_len, ids, ctrl), entity_names, value_names)


# --------------------------------------------------------------------------- device tables

def _name_automaton(entity_names: Sequence[str], value_names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """(next int32 [S, 256], term int32 [S], value_root): both tries and the dead state."""
    tries = [byte_tries._trie([n.encode("utf-8") for n in names]) for names in (entity_names, value_names)]
    value_root = len(tries[0][0])
    dead = value_root + len(tries[1][0])
    nxt = np.full([dead + 1, 256], dead, np.int32)
    term = np.full([dead + 1], -1, np.int32)
    for base, (children, ends) in zip((0, value_root), tries):
        for node, kids in enumerate(children):
            for b, child in kids.items():
                nxt[base + node, b] = base + child
            if ends[node]:
                term[base + node] = min(ends[node])
    return nxt, term, value_root


@struct.dataclass
class AnswerGrammar:
    """The device tables of two name lists over one tokenizer (build with :meth:`build`).
    V ids of at most L bytes; S automaton states; P = max_pairs."""

    tok_bytes: jax.Array    # uint8 [V, L] each id's bytes
    tok_len: jax.Array      # int32 [V]
    control: jax.Array      # bool [V] the id is a line break without bytes
    next: jax.Array         # int32 [S, 256] entity trie, value trie, dead state
    term: jax.Array         # int32 [S] name id ending at the state, -1
    value_root: int = struct.field(pytree_node=False)
    max_pairs: int = struct.field(pytree_node=False)

    @classmethod
    def build(cls, tokenizer: TextTokenizer, entity_names: Sequence[str], value_names: Sequence[str], *,
              control_ids: Iterable[int] | None = None, max_pairs: int = 16) -> AnswerGrammar:
        """Tables for a byte-level BPE ``tokenizer``. ``control_ids`` (line breaks without
        bytes) default to all the tokenizer's added tokens; ``max_pairs`` >= 1."""
        if max_pairs < 1:
            raise ValueError(f"max_pairs must be >= 1, got {max_pairs}")
        tok_bytes, tok_len = byte_tries.token_byte_table(tokenizer)
        control = np.zeros(len(tok_len), bool)
        control[list(tokenizer.added_tokens.values() if control_ids is None else control_ids)] = True
        nxt, term, value_root = _name_automaton(entity_names, value_names)
        return cls(tok_bytes=jnp.asarray(tok_bytes), tok_len=jnp.asarray(tok_len), control=jnp.asarray(control),
                   next=jnp.asarray(nxt), term=jnp.asarray(term), value_root=value_root, max_pairs=max_pairs)


@struct.dataclass
class AnswerState:
    """The rows' parse (leading B on every leaf)."""

    right: jax.Array        # bool [B] the line's first ':' was read
    cur: jax.Array          # int32 [B] automaton state of the side's bytes (its root: only blanks so far)
    last: jax.Array         # int32 [B] the state after the side's last non-blank byte
    entity: jax.Array       # int32 [B] entity id of the line's left side (once right), -1
    pairs: jax.Array        # int32 [B, P, 2] (entity, value) of the first P pairs, -1 padded
    count: jax.Array        # int32 [B] pairs so far (may exceed P)


# --------------------------------------------------------------------------- device steps

def _end_line(g: AnswerGrammar, s: AnswerState, end: jax.Array) -> AnswerState:
    """Close the line of the rows where ``end`` [B]: a row on the right records its pair."""
    rec = end & s.right                                                        # [B]
    pair = jnp.stack([s.entity, g.term[s.last]], -1)                           # [B, 2]
    slot = rec[:, None] & (jnp.arange(g.max_pairs) == s.count[:, None])        # [B, P]
    return AnswerState(right=s.right & ~end, cur=jnp.where(end, 0, s.cur), last=jnp.where(end, 0, s.last),
                       entity=jnp.where(end, -1, s.entity),
                       pairs=jnp.where(slot[..., None], pair[:, None, :], s.pairs),
                       count=s.count + rec.astype(jnp.int32))


def _byte(g: AnswerGrammar, s: AnswerState, b: jax.Array, valid: jax.Array) -> AnswerState:
    """One byte per row: b int32 [B], valid bool [B]."""
    newline = valid & (b == NL)
    colon = valid & (b == COLON) & ~s.right
    plain = valid & ~newline & ~colon
    blank = (b == SPACE) | (b == TAB)
    root = jnp.where(s.right, g.value_root, 0)                                 # [B]
    nxt = g.next[s.cur, b]                                                     # [B]
    cur = jnp.where(plain & ~(blank & (s.cur == root)), nxt, s.cur)
    last = jnp.where(plain & ~blank, nxt, s.last)
    s = s.replace(right=s.right | colon, entity=jnp.where(colon, g.term[s.last], s.entity),
                  cur=jnp.where(colon, g.value_root, cur), last=jnp.where(colon, g.value_root, last))
    return _end_line(g, s, newline)


def init(g: AnswerGrammar, batch: int) -> AnswerState:
    """``batch`` rows before a turn's first token."""
    zeros = jnp.zeros([batch], jnp.int32)
    return AnswerState(right=jnp.zeros([batch], bool), cur=zeros, last=zeros, entity=zeros - 1,
                       pairs=jnp.full([batch, g.max_pairs, 2], -1, jnp.int32), count=zeros)


def reset(g: AnswerGrammar, state: AnswerState, mask: jax.Array) -> AnswerState:
    """``state`` with the rows where ``mask`` [B] back to :func:`init`."""
    return where_rows(mask, init(g, mask.shape[0]), state)


def step(g: AnswerGrammar, state: AnswerState, token_ids: jax.Array, active: jax.Array) -> AnswerState:
    """Feed one id per row: token_ids int [B], active bool [B] (inactive rows are
    unchanged). A control id ends the line; other ids feed their bytes (a
    ``lax.fori_loop`` to the longest active token's length)."""
    tok = token_ids.astype(jnp.int32)
    ctrl = active & g.control[tok]                                             # [B]
    state = _end_line(g, state, ctrl)
    length = jnp.where(active & ~ctrl, g.tok_len[tok], 0)                     # [B]

    def body(i: jax.Array, st: AnswerState) -> AnswerState:
        return _byte(g, st, g.tok_bytes[tok, i].astype(jnp.int32), i < length)
    return jax.lax.fori_loop(0, jnp.max(length, initial=0), body, state)


def finish(g: AnswerGrammar, state: AnswerState, active: jax.Array) -> AnswerState:
    """End the turn of the ``active`` [B] rows: their open line is closed (as a line break)."""
    return _end_line(g, state, active)


def pairs(state: AnswerState) -> tuple[jax.Array, jax.Array]:
    """(pairs int32 [B, P, 2]: (entity, value) ids, -1 for unknown names and unused slots;
    count int32 [B]: all pairs read, may exceed P)."""
    return state.pairs, state.count


def parse_tokens(g: AnswerGrammar, ids: jax.Array, lengths: jax.Array) -> AnswerState:
    """Whole turns: ids int [B, T], lengths int [B] (ids past a row's length are ignored),
    then :func:`finish`. For tests and offline use (a ``lax.scan`` of :func:`step`)."""
    def body(st: AnswerState, col: tuple[jax.Array, jax.Array]) -> tuple[AnswerState, None]:
        t, tok = col
        return step(g, st, tok, t < lengths), None
    state, _ = jax.lax.scan(body, init(g, ids.shape[0]), (jnp.arange(ids.shape[1]), ids.T))
    return finish(g, state, jnp.ones(ids.shape[0], bool))
