"""The state layout of the device tool-call parser (:mod:`swarmjax.text.device.calls`).

Every dataclass here describes ONE row (shapes in the comments); the batched state
has a leading ``B`` on every leaf. ``C`` = max_calls, ``A`` = argument slots of the
widest tool, ``G`` = distinct argument names over all tools, ``M`` = max_mentions
(0 without phrases), ``W`` = ceil(phrases / 32).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from swarmjax.text.device.json_parser import K_NONE, JsonState, json_init
from swarmjax.text.toolcalls import CALL_CLOSE, CALL_OPEN, CALL_SYNTAXES, THINK_CLOSE, THINK_OPEN

# where the turn is
MODE_OUT, MODE_THINK, MODE_CALL, MODE_DONE = range(4)
# tags (a stop string anywhere ends the turn, as the host's _cut)
TAG_NONE, TAG_CALL_OPEN, TAG_CALL_CLOSE, TAG_THINK_OPEN, TAG_THINK_CLOSE, TAG_STOP = range(6)
TAGS = (CALL_OPEN, CALL_CLOSE, THINK_OPEN, THINK_CLOSE, *CALL_SYNTAXES["hermes"].stop_strings)
# the role of the current key of the call object
ROLE_OTHER, ROLE_NAME, ROLE_ARGS, ROLE_PARAMS = range(4)
# the arguments value: null/absent (= {}), object, string being parsed, string that held an object, anything else
AK_NULL, AK_OBJ, AK_STR, AK_SOBJ, AK_BAD = range(5)
# the name value: absent, a string, anything else
NAME_ABSENT, NAME_STR, NAME_OTHER = range(3)
# how a recorded call ended: (unused slot), its body was one JSON object, it was not, cut off (INCOMPLETE)
END_NONE, END_JSON, END_BAD, END_CUT = range(4)
_EMPTY_KEY = jnp.iinfo(jnp.int32).max


@struct.dataclass
class TextState:
    """The string being read (its unescaped bytes)."""

    node: jax.Array   # int32 [] string-automaton state
    hash: jax.Array   # uint32 [] FNV-1a so far
    pos: jax.Array    # int32 [] bytes so far
    seen: jax.Array   # uint32 [W] phrases found (bit set)
    keys: jax.Array   # int32 [M] ascending start * P + phrase of the first M phrases found (max int: empty)


@struct.dataclass
class CallValues:
    """What a call's body said (its verdict is computed from this by calls.call_record)."""

    name_kind: jax.Array  # int32 [] NAME_*
    name_sid: jax.Array   # int32 [] exact-string id of the name, -1
    args_kind: jax.Array  # int32 [] AK_*
    unknown: jax.Array    # bool [] a key no tool has
    present: jax.Array    # bool [G] per argument name: given
    kind: jax.Array       # int32 [G] K_* of its value
    sid: jax.Array        # int32 [G] exact-string id of a string value, -1
    ival: jax.Array       # int32 [G] integral value (booleans 1/0)
    hash: jax.Array       # uint32 [G] FNV-1a of a string value
    ments: jax.Array      # int32 [G, M] mention ids of a string value, -1 padded


@struct.dataclass
class CallRegs:
    """The open call: both JSON parsers, the string being read, and where the parse is."""

    j1: JsonState         # the call body
    j2: JsonState         # the "arguments" string's content
    text: TextState
    seen_args: jax.Array  # bool [] an "arguments" key was read
    cur_we: jax.Array     # bool [] the current arguments/parameters value is the one that counts
    k1: jax.Array         # int32 [] ROLE_* of the current top-level key
    k2: jax.Array         # int32 [] argument name id of the current argument key, -1
    values: CallValues


@struct.dataclass
class CallRecord:
    """The verdicts of a turn's calls (calls.call_record); one row of it (without
    the leading C) is one call. Slots at or past ``count`` hold tool -1, error 0."""

    tool: jax.Array       # int32 [C] tool id; -1 unknown, unreadable or INCOMPLETE
    error: jax.Array      # int32 [C] CallError
    present: jax.Array    # bool [C, A] the slot's argument was given (and the call's arguments were read)
    kind: jax.Array       # int32 [C, A] K_* of its value
    enum: jax.Array       # int32 [C, A] index in the slot's enum, -1
    ival: jax.Array       # int32 [C, A] integer value mod 2**32 (booleans 1/0), 0
    hash: jax.Array       # uint32 [C, A] FNV-1a of a string value's UTF-8 bytes, 0
    mentions: jax.Array   # int32 [C, A, M] phrase ids in order of first occurrence, -1 padded


@struct.dataclass
class ParserState:
    """One row of the parser."""

    mode: jax.Array       # int32 [] MODE_*
    tag: jax.Array        # int32 [] tag-automaton state
    snap: jax.Array       # bool [] the call body was one complete object before the last "<"
    count: jax.Array      # int32 [] calls so far (may exceed C)
    call: CallRegs
    ended: jax.Array      # int32 [C] END_* of each recorded call
    calls: CallValues     # leaves [C, ...]: what each recorded call said
    ring: jax.Array       # uint8 [Q] bytes sampled but not read yet (the backlog), at head..tail mod Q
    head: jax.Array       # int32 [] bytes of the turn read so far
    tail: jax.Array       # int32 [] bytes of the turn queued so far (tail - head <= Q)


def ring_size(g: Any) -> int:
    """Q: the backlog ring of a CallGrammar, the power of two >= twice its longest token."""
    return 1 << max(0, 2 * g.tok_bytes.shape[1] - 1).bit_length()


def _sizes(g: Any) -> tuple[int, int, int, int]:
    """(A, G, M, W) of a CallGrammar."""
    return (g.slot_arg.shape[1], g.arg_in_tool.shape[1], g.spec.max_mentions,
            max(1, -(-len(g.spec.phrases) // 32)))


def text_init(g: Any) -> TextState:
    """A string before its first byte."""
    _, _, m, w = _sizes(g)
    return TextState(node=jnp.int32(0), hash=jnp.uint32(2166136261), pos=jnp.int32(0),
                     seen=jnp.zeros([w], jnp.uint32), keys=jnp.full([m], _EMPTY_KEY, jnp.int32))


def values_init(g: Any) -> CallValues:
    """Nothing read yet."""
    _, n_g, m, _ = _sizes(g)
    return CallValues(name_kind=jnp.int32(NAME_ABSENT), name_sid=jnp.int32(-1), args_kind=jnp.int32(AK_NULL),
                      unknown=jnp.bool_(False), present=jnp.zeros([n_g], bool), kind=jnp.zeros([n_g], jnp.int32),
                      sid=jnp.full([n_g], -1, jnp.int32), ival=jnp.zeros([n_g], jnp.int32),
                      hash=jnp.zeros([n_g], jnp.uint32), ments=jnp.full([n_g, m], -1, jnp.int32))


def regs_init(g: Any) -> CallRegs:
    """A call just opened."""
    f = jnp.bool_(False)
    return CallRegs(j1=json_init(), j2=json_init(), text=text_init(g), seen_args=f, cur_we=f, k1=jnp.int32(0),
                    k2=jnp.int32(-1), values=values_init(g))


def row_init(g: Any) -> CallRecord:
    """One empty call (leaves without the leading C)."""
    a, _, m, _ = _sizes(g)
    return CallRecord(tool=jnp.int32(-1), error=jnp.int32(0), present=jnp.zeros([a], bool),
                      kind=jnp.full([a], K_NONE, jnp.int32), enum=jnp.full([a], -1, jnp.int32),
                      ival=jnp.zeros([a], jnp.int32), hash=jnp.zeros([a], jnp.uint32),
                      mentions=jnp.full([a, m], -1, jnp.int32))


def where_rows(mask: jax.Array, new: Any, old: Any) -> Any:
    """``new`` where ``mask`` [B] else ``old``, leaf by leaf (leaves with leading B)."""
    return jax.tree.map(lambda a, b: jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b), new, old)
