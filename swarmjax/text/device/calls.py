"""The hermes tool-call parser on the device: one sampled token per row per decode tick.

The host parser (:func:`swarmjax.text.toolcalls.parse_turn` + the tool schemas) reads
a finished turn's text. This module reads the same turn as it is sampled, inside
``jit``, and ends with the same verdict for every call: the :class:`CallError` code
with the host's precedence, the tool, and per argument slot the kind, enum id,
integer value, FNV-1a hash of the string and the mention phrases in it.

Build once on the host, then step on the device::

    grammar = CallGrammar.build(tokenizer, tools, max_calls=8, mention_phrases=names)
    state = init(grammar, batch)                         # or reset_turn(grammar, state, mask)
    state = step(grammar, state, token_ids, active)      # [B] ids, [B] bool; every tick
    state = drain(grammar, state, ended)                 # turns that ended: read their backlog
    state = finish(grammar, state, cut)                  # the turn hit the length limit (drains too)
    record = call_record(grammar, state)                 # CallRecord [B, C, ...]; state.count [B]

and on the host, for tests and logs, :mod:`swarmjax.text.device.call_views`:
``device_summaries`` (every row's calls as Python values) and ``host_summary`` (the same
from :func:`parse_turn`'s output).

The state (:mod:`calls_state`, one row; shapes there): the mode, the tag
automaton's state, the call count, the open call's registers (the body's JSON parser,
the arguments-string parser, the string being read: automaton state, FNV-1a, first
mentions; and what was read per argument name) and, per recorded call [C], what it
read and how it ended; and the backlog, the sampled bytes not read yet (a tick reads at
most ``byte_cap`` per row, see :func:`step`). :func:`call_record` turns those into
verdicts, vectorised, so the per-byte work never evaluates a schema. With ``skip_idle`` (default) the stages
no row needs at a byte are skipped by batch-level ``lax.cond``s; each stage itself is
branch-free per row.

How it reads. Every token is its bytes (:func:`byte_tries.token_byte_table`). An
Aho-Corasick automaton finds ``<tool_call>``, ``</tool_call>``, ``<think>``,
``</think>`` and the stop strings in the byte stream, so a tag written as its added
token or spelled in ordinary tokens is the same tag (as on the host, which reads the
decoded text); an added token that is a tag where it stands is handled as one symbol
without its bytes. Modes follow ``_walk``: outside, in a think block (calls there are
reasoning), in a call (only ``</tool_call>`` ends it), done (a stop string anywhere
ends the turn; an open call becomes INCOMPLETE). In a call the bytes go to a JSON
parser (:mod:`json_parser`) and the strings' unescaped bytes to one string automaton
(:func:`byte_tries.string_automaton`): a trie naming keys, tool names and enum values,
times an Aho-Corasick automaton of the mention phrases. ``arguments`` written as a
JSON string is parsed by a second JSON parser fed with the first one's unescaped
bytes. Keys may come in any order (``arguments`` before ``name``): argument values
are kept per argument name and matched to the tool's slots when the call ends.

Host liberties that are implemented (same code as the host): duplicate keys (the last
wins), the ``parameters`` alias (``arguments`` wins when both are given), arguments as
a JSON-encoded string, ``null`` arguments, extra top-level keys, nested objects and
arrays anywhere (values of the wrong type are BAD_ARGUMENT), integral floats for
integer arguments (``3.0``, ``1e2`` and ``150e-1`` are integers as for jsonschema),
``\\uXXXX`` escapes and surrogate pairs decoded to UTF-8 before tries, hashes and
mentions, lone low surrogates (hashed as Python's ``surrogatepass`` bytes).

Calls past ``max_calls`` are counted in ``count`` but not recorded.

Documented differences (the only inputs where the device and the host disagree; the
fuzz test covers everything else):

1. A high-surrogate escape (``\\ud800``-``\\udbff``) not followed by a low-surrogate
   escape: Python keeps a lone surrogate; the device's bytes for that string differ,
   so its hash differs (its code and everything else agree).
2. Nesting deeper than 32 containers: BAD_JSON on the device, parsed by the host.
3. A number written with a fraction or exponent whose magnitude is 2**53 or more (or
   whose double rounds to an integer, e.g. 17+ significant digits, or overflows to
   inf): the device decides integrality and value on the exact decimal, the host on
   the double.
4. Token bytes that are not valid UTF-8 as a whole (the host decodes U+FFFD there).
5. INCOMPLETE calls report tool -1 (the host's message names a tool read by a regex
   hint from the cut-off text).
6. Strings longer than 2**31 / (phrases + 1) bytes (33 MB with 64 phrases): the
   mention order may differ.

Supported schemas: per tool ``{"type": "object", "properties": {...}, "required":
[...]}`` with ``additionalProperties`` absent, true or false, and properties of type
string (optionally with a string ``enum``), integer, number or boolean (annotations
like ``description`` are ignored); anything else raises ValueError at build time.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from swarmjax.text import byte_tries
from swarmjax.text.device.calls_state import (
    AK_BAD, AK_NULL, AK_OBJ, AK_SOBJ, AK_STR, END_BAD, END_CUT, END_JSON, END_NONE, MODE_CALL, MODE_DONE, MODE_OUT,
    MODE_THINK, NAME_OTHER, NAME_STR, ROLE_ARGS, ROLE_NAME, ROLE_PARAMS, TAG_CALL_CLOSE, TAG_CALL_OPEN, TAG_STOP,
    TAG_THINK_CLOSE, TAG_THINK_OPEN, TAGS, CallRecord, CallRegs, CallValues, ParserState, TextState, regs_init,
    ring_size, text_init, values_init, where_rows)
from swarmjax.text.device.json_parser import (
    J_DONE, K_FALSE, K_INT, K_NONE, K_NULL, K_NUM, K_OBJ, K_STR, K_TRUE, JsonEvents, JsonState, json_byte,
    json_table)
from swarmjax.text.tokenizer import TextTokenizer
from swarmjax.text.toolcalls import CallError
from swarmjax.text.tools import Tool

__all__ = ["CallGrammar", "GrammarSpec", "ParserState", "CallRecord", "init", "reset_turn", "step", "drain", "finish",
           "call_record", "parse_tokens", "fnv1a", "ring_size"]

FNV_OFFSET, FNV_PRIME = 2166136261, 16777619
TYPE_NONE, TYPE_STRING, TYPE_INTEGER, TYPE_NUMBER, TYPE_BOOLEAN = range(5)
_TYPES = {"string": TYPE_STRING, "integer": TYPE_INTEGER, "number": TYPE_NUMBER, "boolean": TYPE_BOOLEAN}
_ANNOTATIONS = {"description", "title", "default", "examples", "deprecated", "readOnly", "writeOnly"}
_TOP_KEYS = ("name", "arguments", "parameters")  # roles ROLE_NAME, ROLE_ARGS, ROLE_PARAMS
# TYPE_OK[slot type, value kind]: the kinds jsonschema accepts for the type
_TYPE_OK = np.zeros([5, 9], bool)
_TYPE_OK[TYPE_NONE] = True
_TYPE_OK[TYPE_STRING, K_STR] = True
_TYPE_OK[TYPE_INTEGER, K_INT] = True
_TYPE_OK[TYPE_NUMBER, [K_INT, K_NUM]] = True
_TYPE_OK[TYPE_BOOLEAN, [K_TRUE, K_FALSE]] = True
_ARGS_KIND = np.full(9, AK_BAD, np.int32)  # the arguments value's kind -> AK_*
_ARGS_KIND[[K_OBJ, K_STR, K_NULL]] = [AK_OBJ, AK_STR, AK_NULL]


@dataclasses.dataclass(frozen=True)
class GrammarSpec:
    """The host-side facts of a grammar (hashable: a static field of :class:`CallGrammar`)."""

    tools: tuple[str, ...]                            # tool id -> name
    args: tuple[tuple[str, ...], ...]                 # [tool][slot] -> argument name (schema order)
    enums: tuple[tuple[tuple[str, ...] | None, ...], ...]  # [tool][slot] -> enum values or None
    mention_slots: tuple[tuple[bool, ...], ...]       # [tool][slot] -> reports mentions
    phrases: tuple[str, ...]                          # mention phrase id -> text
    max_calls: int
    max_mentions: int
    control_ids: tuple[tuple[str, int], ...]          # tag string -> its added-token id


def _slot_schema(tool: str, name: str, schema: Any) -> tuple[int, tuple[str, ...] | None]:
    extra_keys = set(schema) - {"type", "enum"} - _ANNOTATIONS if isinstance(schema, Mapping) else {"?"}
    if extra_keys or schema.get("type") not in _TYPES:
        raise ValueError(f"tool {tool!r}, argument {name!r}: the device parser supports properties of type "
                         f"string (with an optional string enum), integer, number or boolean; got {schema!r}")
    kind, enum = _TYPES[schema["type"]], schema.get("enum")
    if enum is not None and (kind != TYPE_STRING or not all(isinstance(v, str) for v in enum)):
        raise ValueError(f"tool {tool!r}, argument {name!r}: only string enums are supported, got {enum!r}")
    return kind, None if enum is None else tuple(enum)


def _tool_schema(tool: Tool) -> tuple[dict[str, tuple[int, tuple[str, ...] | None]], list[str], bool]:
    p = tool.parameters
    extra = p.get("additionalProperties", False)
    keys = {"type", "properties", "required", "additionalProperties"}
    if not isinstance(extra, bool) or set(p) - keys - _ANNOTATIONS:
        raise ValueError(f"tool {tool.name!r}: unsupported schema keywords for the device parser: {dict(p)!r}")
    slots = {n: _slot_schema(tool.name, n, s) for n, s in p.get("properties", {}).items()}
    return slots, list(p.get("required", [])), "additionalProperties" in p and extra


def _string_tables(exact: list[str], names: Sequence[str], arg_names: list[str],
                   phrases: Sequence[str]) -> dict[str, np.ndarray]:
    """The string automaton over the exact strings and phrases, and what each exact string is."""
    auto = byte_tries.string_automaton([s.encode("utf-8") for s in exact], [p.encode("utf-8") for p in phrases])
    packed = np.where(auto.outputs >= 0, auto.outputs | (auto.phrase_len[np.maximum(auto.outputs, 0)] << 12), 0)
    index = {s: i + 1 for i, s in enumerate(exact)}                    # string id + 1 (0: not an exact string)
    sid_role, sid_tool, sid_arg = np.zeros(len(exact) + 1, np.int32), *(np.full(len(exact) + 1, -1, np.int32)
                                                                        for _ in range(2))
    sid_role[[index[k] for k in _TOP_KEYS]] = [ROLE_NAME, ROLE_ARGS, ROLE_PARAMS]
    sid_tool[[index[n] for n in names]] = np.arange(len(names))
    sid_arg[[index[n] for n in arg_names]] = np.arange(len(arg_names))
    tag_next, tag_accept = byte_tries.tag_automaton(TAGS)
    return dict(tag_next=tag_next, tag_accept=np.minimum(tag_accept, TAG_STOP), json=json_table(),
                str_next=auto.next, str_accept=auto.accept, str_out=packed, sid_role=sid_role, sid_tool=sid_tool,
                sid_arg=sid_arg)


def _slot_tables(schemas: list, exact: list[str], arg_names: list[str],
                 phrases: Sequence[str]) -> dict[str, np.ndarray]:
    """Per tool and slot: its argument name, type, enum, whether required / reports mentions."""
    n_t, n_a, n_g = len(schemas), max(1, max(len(s) for s, _, _ in schemas)), len(arg_names)
    index = {s: i + 1 for i, s in enumerate(exact)}
    slot_arg, slot_type = np.full([n_t, n_a], -1, np.int32), np.zeros([n_t, n_a], np.int32)
    slot_enum = np.full([n_t, n_a, len(exact) + 1], -1, np.int32)
    required, has_enum, mention = (np.zeros([n_t, n_a], bool) for _ in range(3))
    arg_in_tool, extra_ok = np.zeros([n_t, n_g], bool), np.zeros(n_t, bool)
    for t, (slots, req, extra) in enumerate(schemas):
        extra_ok[t] = extra
        for a, (n, (kind, enum)) in enumerate(slots.items()):
            slot_arg[t, a], slot_type[t, a], required[t, a] = arg_names.index(n), kind, n in req
            arg_in_tool[t, arg_names.index(n)] = True
            has_enum[t, a] = enum is not None
            mention[t, a] = kind == TYPE_STRING and enum is None and bool(phrases)
            for i, v in enumerate(enum or ()):
                slot_enum[t, a, index[v]] = i
    return dict(slot_arg=slot_arg, arg_in_tool=arg_in_tool, required=required, slot_type=slot_type,
                slot_enum=slot_enum, has_enum=has_enum, mention=mention, extra_ok=extra_ok)


def _token_tables(tokenizer: TextTokenizer) -> dict[str, np.ndarray]:
    """Each id's bytes, and the tag of the added tokens that are tags."""
    tok_bytes, tok_len = byte_tries.token_byte_table(tokenizer)
    tok_tag = np.zeros(len(tok_len), np.int32)
    for tag, i in tokenizer.added_tokens.items():
        if tag in TAGS:
            tok_tag[i] = min(TAGS.index(tag) + 1, TAG_STOP)
    return dict(tok_bytes=tok_bytes, tok_len=tok_len, tok_tag=tok_tag)


@struct.dataclass
class CallGrammar:
    """The device tables of one tool set over one tokenizer (build with :meth:`build`).

    V ids of at most L bytes; T tools with at most A argument slots; G distinct argument
    names; N exact strings (keys, tool names, enum values); S string-automaton states
    with at most K phrases ending per state; P mention phrases."""

    tok_bytes: jax.Array    # uint8 [V, L] each id's bytes
    tok_len: jax.Array      # int32 [V]
    tok_tag: jax.Array      # int32 [V] TAG_* of an added token that is a tag, else 0
    tag_next: jax.Array     # int32 [Sg, 256] tag automaton
    tag_accept: jax.Array   # int32 [Sg] TAG_* ending on entering the state
    json: jax.Array         # int32 [J, 256] json_parser.json_table()
    str_next: jax.Array     # int32 [S, 256] string automaton
    str_accept: jax.Array   # int32 [S] exact string id or -1
    str_out: jax.Array      # int32 [S, K] phrases ending here as phrase | byte length << 12, 0 padded
    sid_role: jax.Array     # int32 [N + 1] ROLE_* of string id - 1
    sid_tool: jax.Array     # int32 [N + 1] tool id or -1
    sid_arg: jax.Array      # int32 [N + 1] argument name id (G) or -1
    slot_arg: jax.Array     # int32 [T, A] the slot's argument name id, -1 padding
    arg_in_tool: jax.Array  # bool [T, G]
    required: jax.Array     # bool [T, A]
    slot_type: jax.Array    # int32 [T, A] TYPE_*
    slot_enum: jax.Array    # int32 [T, A, N + 1] enum index of string id - 1, or -1
    has_enum: jax.Array     # bool [T, A]
    mention: jax.Array      # bool [T, A] the slot reports mentions
    extra_ok: jax.Array     # bool [T] additionalProperties: true
    spec: GrammarSpec = struct.field(pytree_node=False)

    @classmethod
    def build(cls, tokenizer: TextTokenizer, tools: Mapping[str, Tool] | Sequence[Tool], *, max_calls: int = 8,
              max_mentions: int = 8, mention_phrases: Sequence[str] | None = None) -> CallGrammar:
        """Tables for ``tools`` (a ToolSet or Tools, in order: tool id = position) over a
        byte-level BPE ``tokenizer``. Free-string slots report the ids of
        ``mention_phrases`` they contain (first ``max_mentions``, by position of first
        occurrence). Raises ValueError for an unsupported schema."""
        tools = list(tools.values()) if isinstance(tools, Mapping) else list(tools)
        phrases = tuple(mention_phrases or ())
        if not tools or max_calls < 1 or max_mentions < 0:
            raise ValueError("need at least one tool, max_calls >= 1 and max_mentions >= 0")
        if len(phrases) > 4095 or max((len(p.encode("utf-8")) for p in phrases), default=0) >= 1 << 19:
            raise ValueError("at most 4095 mention phrases of under 512 KiB each")
        schemas = [_tool_schema(t) for t in tools]
        names = tuple(t.name for t in tools)
        arg_names = list(dict.fromkeys(a for slots, _, _ in schemas for a in slots)) or [""]
        exact = list(dict.fromkeys([*_TOP_KEYS, *names, *arg_names,
                                    *(v for slots, _, _ in schemas for _, e in slots.values() for v in e or ())]))
        tables = {**_string_tables(exact, names, arg_names, phrases), **_token_tables(tokenizer),
                  **_slot_tables(schemas, exact, arg_names, phrases)}
        spec = GrammarSpec(
            tools=names, args=tuple(tuple(s) for s, _, _ in schemas),
            enums=tuple(tuple(e for _, e in s.values()) for s, _, _ in schemas),
            mention_slots=tuple(tuple(bool(m) for m in tables["mention"][t, :len(s)])
                                for t, (s, _, _) in enumerate(schemas)),
            phrases=phrases, max_calls=max_calls, max_mentions=max_mentions if phrases else 0,
            control_ids=tuple((tag, i) for tag, i in tokenizer.added_tokens.items() if tag in TAGS))
        return cls(**{k: jnp.asarray(v) for k, v in tables.items()}, spec=spec)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """(max_calls C, slots A, argument names G, mentions M)."""
        return (self.spec.max_calls, self.slot_arg.shape[1], self.arg_in_tool.shape[1], self.spec.max_mentions)


# --------------------------------------------------------------------------- one string

def _insert(keys: jax.Array, key: jax.Array, do: jax.Array) -> jax.Array:
    """``key`` into the ascending ``keys`` [M] (the largest falls off) where ``do``."""
    rank = jnp.sum(keys < key)
    idx = jnp.arange(keys.shape[0])
    shifted = jnp.concatenate([keys[:1], keys[:-1]])
    return jnp.where(do, jnp.where(idx < rank, keys, jnp.where(idx == rank, key, shifted)), keys)


def _text_advance(g: CallGrammar, s: TextState, u: jax.Array, emit: jax.Array, reset: jax.Array) -> TextState:
    """One unescaped byte ``u`` of a string (where ``emit``), after a restart where ``reset``."""
    s = jax.tree.map(lambda a, b: jnp.where(reset, a, b), text_init(g), s)
    out = s.replace(node=g.str_next[s.node, u], hash=(s.hash ^ u.astype(jnp.uint32)) * jnp.uint32(FNV_PRIME),
                    pos=jnp.minimum(s.pos + 1, (2 ** 31 - 1) // (len(g.spec.phrases) + 1) - 1))  # keys fit int32
    return jax.tree.map(lambda a, b: jnp.where(emit, a, b), out, s)


def _text_mentions(g: CallGrammar, s: TextState, emit: jax.Array) -> TextState:
    """Record the phrases that end at the byte just read (first occurrences only)."""
    seen, keys = s.seen, s.keys
    n_phrases = len(g.spec.phrases)
    for k in range(g.str_out.shape[1]):
        out = g.str_out[s.node, k]                                     # phrase | length << 12, 0: none
        p = out & 0xFFF
        word, bit = p >> 5, jnp.uint32(1) << (p & 31).astype(jnp.uint32)
        new = emit & (out > 0) & ((seen[word] & bit) == 0)
        seen = jnp.where((jnp.arange(seen.shape[0]) == word) & new, seen | bit, seen)
        keys = _insert(keys, (s.pos - (out >> 12)) * n_phrases + p, new)
    return s.replace(seen=seen, keys=keys)


def _mention_ids(g: CallGrammar, keys: jax.Array) -> jax.Array:
    return jnp.where(keys < jnp.iinfo(jnp.int32).max, keys % max(1, len(g.spec.phrases)), -1)


# --------------------------------------------------------------------------- one call

def _read(g: CallGrammar, r: CallRegs, j1: JsonState, e1: JsonEvents, j2: JsonState, ev: JsonEvents,
          route: jax.Array, text: TextState) -> CallRegs:
    """Give one byte's JSON events a meaning: the call's name and arguments (one row).
    ``e1``: the body parser's events; ``ev``: the events of the parser whose strings
    ``text`` reads (the "arguments" string's parser where ``route``)."""
    sid = g.str_accept[text.node]
    v = r.values
    # the call object (J1 at depth 1): name, arguments, parameters
    top = e1.depth == 1
    k1 = jnp.where(top & e1.kend, g.sid_role[sid + 1], r.k1)
    is_name, is_args = k1 == ROLE_NAME, (k1 == ROLE_ARGS) | (k1 == ROLE_PARAMS)
    vs1, send1 = top & e1.vstart, top & e1.send
    name_kind = jnp.where(vs1 & is_name, jnp.where(e1.vkind == K_STR, NAME_STR, NAME_OTHER), v.name_kind)
    name_sid = jnp.where(send1 & is_name, sid, jnp.where(vs1 & is_name, -1, v.name_sid))
    args_start = vs1 & is_args
    fresh = args_start & ((k1 == ROLE_ARGS) | ~r.seen_args)  # "arguments" beats "parameters"; the last wins
    cur_we = jnp.where(args_start, fresh, r.cur_we)
    args_kind = jnp.where(fresh, jnp.asarray(_ARGS_KIND)[e1.vkind], v.args_kind)
    done2 = send1 & is_args & cur_we & (args_kind == AK_STR)
    args_kind = jnp.where(done2, jnp.where(j2.st == J_DONE, AK_SOBJ, AK_BAD), args_kind)
    v = jax.tree.map(lambda a, o: jnp.where(fresh, a, o), values_init(g), v).replace(
        name_kind=name_kind, name_sid=name_sid, args_kind=args_kind)
    # argument keys and values: J1 at depth 2 inside an arguments object, or J2 at depth 1
    at = (~route & is_args & cur_we & (args_kind == AK_OBJ) & (e1.depth == 2)) | (route & (ev.depth == 1))
    kend = at & ev.kend
    garg = g.sid_arg[sid + 1]
    k2 = jnp.where(kend, garg, jnp.where(fresh, -1, r.k2))
    slot = jnp.arange(v.present.shape[0]) == k2
    vstart, send, nend = slot & at & ev.vstart, slot & at & ev.send, slot & at & ev.nend
    v = v.replace(
        unknown=v.unknown | (kend & (garg < 0)), present=v.present | (slot & kend),
        kind=jnp.where(vstart, ev.vkind, jnp.where(nend, ev.nkind, v.kind)),
        ival=jnp.where(vstart, (ev.vkind == K_TRUE).astype(jnp.int32), jnp.where(nend, ev.nvalue, v.ival)),
        sid=jnp.where(vstart, -1, jnp.where(send, sid, v.sid)),
        hash=jnp.where(vstart, jnp.uint32(0), jnp.where(send, text.hash, v.hash)),
        ments=jnp.where(vstart[:, None], -1, jnp.where(send[:, None], _mention_ids(g, text.keys)[None], v.ments)))
    return r.replace(j1=j1, j2=j2, text=text, seen_args=r.seen_args | (args_start & (k1 == ROLE_ARGS)),
                     cur_we=cur_we, k1=k1, k2=k2, values=v)


def _rows(fn, *args):  # noqa: ANN001, ANN202 - vmap a row function over the batch (grammar shared)
    return jax.vmap(fn, in_axes=(None,) + (0,) * (len(args) - 1))(*args)


def _when(skip_idle: bool, pred: jax.Array, work, idle):  # noqa: ANN001, ANN202
    """``work()``, skipped (``idle()``) when no row needs it: ``pred`` False. ``work`` leaves
    the rows that do not need it unchanged, so both ways give the same state."""
    return jax.lax.cond(pred, work, idle) if skip_idle else work()


def _call_bytes(g: CallGrammar, r: CallRegs, b: jax.Array, valid: jax.Array, skip_idle: bool) -> CallRegs:
    """Feed one byte per row [B] to the open calls (rows where ``valid``). The second JSON
    parser and the mention bookkeeping only run when some row needs them."""
    j1, e1 = jax.vmap(json_byte, in_axes=(None, 0, 0, 0))(g.json, r.j1, b, valid)
    route = valid & (r.values.args_kind == AK_STR) & r.cur_we  # inside an "arguments" string: J2 reads its bytes
    feed = route & e1.emit
    j2, e2 = _when(skip_idle, jnp.any(feed),
                   lambda: jax.vmap(json_byte, in_axes=(None, 0, 0, 0))(g.json, r.j2, e1.u, feed),
                   lambda: (r.j2, jax.tree.map(jnp.zeros_like, e1)))
    ev = jax.tree.map(lambda x2, x1: jnp.where(route.reshape((-1,) + (1,) * (x1.ndim - 1)), x2, x1), e2, e1)
    text = _rows(_text_advance, g, r.text, ev.u, ev.emit, ev.sstart)
    if g.spec.max_mentions:
        hit = ev.emit & (g.str_out[text.node, 0] > 0)
        text = _when(skip_idle, jnp.any(hit), lambda: _rows(_text_mentions, g, text, hit), lambda: text)
    return _rows(_read, g, r, j1, e1, j2, ev, route, text)


def _verdict(g: CallGrammar, v: CallValues, ended: jax.Array) -> CallRecord:
    """The record of one call from what it said and how it ended (END_*)."""
    json_ok, cut = ended == END_JSON, ended == END_CUT
    name_ok = v.name_kind == NAME_STR
    tool = jnp.where(name_ok, g.sid_tool[v.name_sid + 1], -1)
    t = jnp.maximum(tool, 0)
    garg = g.slot_arg[t]                                               # [A]
    gi = jnp.maximum(garg, 0)
    pres = (garg >= 0) & v.present[gi]
    kind = jnp.where(pres, v.kind[gi], K_NONE)
    enum = jnp.where(pres & (kind == K_STR), g.slot_enum[t, jnp.arange(garg.shape[0]), v.sid[gi] + 1], -1)
    value_ok = jnp.asarray(_TYPE_OK)[g.slot_type[t], kind] & (~g.has_enum[t] | (enum >= 0))
    missing = jnp.any(g.required[t] & ~pres)
    unknown = (v.unknown | jnp.any(v.present & ~g.arg_in_tool[t])) & ~g.extra_ok[t]
    args_obj = (v.args_kind == AK_NULL) | (v.args_kind == AK_OBJ) | (v.args_kind == AK_SOBJ)
    code = jnp.select([ended == END_NONE, cut, ~json_ok | ~name_ok, tool < 0, ~args_obj, missing,
                       unknown | jnp.any(pres & ~value_ok)],
                      [CallError.NONE, CallError.INCOMPLETE, CallError.BAD_JSON, CallError.UNKNOWN_TOOL,
                       CallError.BAD_JSON, CallError.MISSING_ARGUMENT, CallError.BAD_ARGUMENT],
                      CallError.NONE).astype(jnp.int32)
    shown = (ended != END_NONE) & ((code == CallError.NONE) | (code == CallError.MISSING_ARGUMENT)
                                   | (code == CallError.BAD_ARGUMENT))
    pres = pres & shown
    is_str = pres & (kind == K_STR)
    return CallRecord(
        tool=jnp.where(json_ok & name_ok, tool, -1), error=code, present=pres, kind=jnp.where(pres, kind, K_NONE),
        enum=jnp.where(pres, enum, -1),
        ival=jnp.where(pres & ((kind == K_INT) | (kind == K_TRUE) | (kind == K_FALSE)), v.ival[gi], 0),
        hash=jnp.where(is_str, v.hash[gi], jnp.uint32(0)),
        mentions=jnp.where((is_str & g.mention[t])[:, None], v.ments[gi], -1))


def _tag_event(g: CallGrammar, st: ParserState, tag: jax.Array, json_ok: jax.Array) -> ParserState:
    """A tag (TAG_*, 0 for none) was read; ``json_ok``: the body before it is one JSON
    object. An ending call's values go to slot ``count`` (when < C) and it is counted."""
    mode = st.mode
    stop = (mode != MODE_DONE) & (tag == TAG_STOP)
    close = (mode == MODE_CALL) & (tag == TAG_CALL_CLOSE)
    cut = (mode == MODE_CALL) & stop
    opened = (mode == MODE_OUT) & (tag == TAG_CALL_OPEN)
    hit = (close | cut) & (jnp.arange(g.spec.max_calls) == st.count)  # [C]
    how = jnp.where(cut, END_CUT, jnp.where(json_ok, END_JSON, END_BAD))
    calls = jax.tree.map(lambda rec, new: jnp.where(hit.reshape((-1,) + (1,) * new.ndim), new[None], rec),
                         st.calls, st.call.values)
    mode = jnp.select([stop, opened, close, (mode == MODE_OUT) & (tag == TAG_THINK_OPEN),
                       (mode == MODE_THINK) & (tag == TAG_THINK_CLOSE)],
                      [MODE_DONE, MODE_CALL, MODE_OUT, MODE_THINK, MODE_OUT], mode).astype(jnp.int32)
    call = jax.tree.map(lambda a, o: jnp.where(opened, a, o), regs_init(g), st.call)
    return st.replace(mode=mode, call=call, ended=jnp.where(hit, how, st.ended), calls=calls,
                      count=st.count + (close | cut).astype(jnp.int32))


def _tags(g: CallGrammar, st: ParserState, b: jax.Array, valid: jax.Array
          ) -> tuple[ParserState, jax.Array, jax.Array]:
    """One byte through the tag automaton (one row): (state, TAG_* read, the byte goes to the call)."""
    valid = valid & (st.mode != MODE_DONE)
    tag_state = jnp.where(valid, g.tag_next[st.tag, b], st.tag)
    in_call = valid & (st.mode == MODE_CALL)
    # a tag starts at its "<": the body's verdict is the JSON state before that byte
    snap = jnp.where(in_call & (b == ord("<")), st.call.j1.st == J_DONE, st.snap)
    return st.replace(tag=tag_state, snap=snap), jnp.where(valid, g.tag_accept[tag_state], 0), in_call


def _byte(g: CallGrammar, st: ParserState, b: jax.Array, valid: jax.Array, skip_idle: bool) -> ParserState:
    """One byte per row: b int32 [B], valid bool [B]."""
    st, tag, in_call = _rows(_tags, g, st, b, valid)
    st = st.replace(call=_when(skip_idle, jnp.any(in_call), lambda: _call_bytes(g, st.call, b, in_call, skip_idle),
                               lambda: st.call))
    return _when(skip_idle, jnp.any(tag > 0), lambda: _rows(_tag_event, g, st, tag, st.snap), lambda: st)


# --------------------------------------------------------------------------- public steps

def init(g: CallGrammar, batch: int) -> ParserState:
    """The state of ``batch`` rows at the start of a turn (every leaf has leading dim B)."""
    c = g.spec.max_calls
    row = ParserState(mode=jnp.int32(MODE_OUT), tag=jnp.int32(0), snap=jnp.bool_(False), count=jnp.int32(0),
                      call=regs_init(g), ended=jnp.zeros([c], jnp.int32),
                      calls=jax.tree.map(lambda x: jnp.broadcast_to(x, (c,) + x.shape), values_init(g)),
                      ring=jnp.zeros([ring_size(g)], jnp.uint8), head=jnp.int32(0), tail=jnp.int32(0))
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,) + x.shape), row)


def reset_turn(g: CallGrammar, state: ParserState, mask: jax.Array) -> ParserState:
    """``state`` with the rows where ``mask`` [B] restarted for a new turn."""
    return where_rows(mask, init(g, mask.shape[0]), state)


def step(g: CallGrammar, state: ParserState, token_ids: jax.Array, active: jax.Array, *,
         skip_idle: bool = True, byte_cap: int | None = 16) -> ParserState:
    """Feed one sampled id per row: token_ids int [B], active bool [B] (inactive rows are
    unchanged). Jittable.

    With ``byte_cap`` (default 16) a tick reads at most ``byte_cap`` bytes per row: the
    token's bytes join the row's backlog (a ring of Q bytes, :func:`ring_size`) and the
    rows read from it, so a tick costs at most ``B x byte_cap`` byte steps whatever the
    tokens (a real vocabulary has 128-byte tokens; a 3-byte token leaves no backlog). The
    rest is read on the following ticks, and at once in three cases: before a tag token
    (read as a tag or as bytes depending on the mode it meets), before a token the ring
    cannot hold, and in :func:`drain` / :func:`finish`. Drain the rows whose turn ended
    before :func:`call_record`: then the state equals, byte for byte, the plain loop's
    (``byte_cap=None``: every row runs to the longest token of the tick, no backlog).

    ``skip_idle`` (static): skip, with a batch-level ``lax.cond``, the stages no row needs
    at a byte (the call parser outside calls, the arguments-string parser, mention
    bookkeeping, tag events): about 4x faster on CPU. False runs every stage for every
    row (no data-dependent control flow besides the byte loops); the state is the same."""
    tok = token_ids.astype(jnp.int32)
    sym = g.tok_tag[tok]
    size = g.tok_len[tok]
    if byte_cap is not None:  # a tag meets the mode the backlog leaves; the ring must hold the token
        late = active & (state.tail > state.head) & ((sym > 0) | (state.tail - state.head + size > ring_size(g)))
        state = _when(skip_idle, jnp.any(late), lambda: drain(g, state, late, skip_idle=skip_idle), lambda: state)
    as_symbol = active & (sym > 0) & ((state.mode != MODE_CALL) | (sym == TAG_CALL_CLOSE) | (sym == TAG_STOP))
    state = _when(skip_idle, jnp.any(as_symbol), lambda: where_rows(as_symbol, _rows(
        _tag_event, g, state.replace(tag=jnp.zeros_like(state.tag)), sym, state.call.j1.st == J_DONE), state),
        lambda: state)
    length = jnp.where(active & ~as_symbol, size, 0)                   # [B]
    if byte_cap is None:
        def body(i: jax.Array, st: ParserState) -> ParserState:
            return _byte(g, st, g.tok_bytes[tok, i].astype(jnp.int32), i < length, skip_idle)
        return jax.lax.fori_loop(0, jnp.max(length, initial=0), body, state)
    # the ring is written only while some row needs it (a backlog, or a token over the cap);
    # otherwise every row reads its token's bytes straight from the table, as the plain loop
    long = jnp.any(length > byte_cap)
    ring = long | jnp.any(state.tail > state.head)
    width = min(byte_cap, g.tok_bytes.shape[1])
    state = jax.lax.cond(ring, lambda st: jax.lax.cond(long, lambda s: _queue(g, s, tok, length, None),
                                                       lambda s: _queue(g, s, tok, length, width), st),
                         lambda st: st.replace(tail=st.tail + length), state)
    reads = jnp.minimum(state.tail - state.head, byte_cap)                # [B]
    at = state.head & (ring_size(g) - 1)

    def body(i: jax.Array, st: ParserState) -> ParserState:
        queued = jnp.take_along_axis(st.ring, ((at + i) & (ring_size(g) - 1))[:, None], axis=1)[:, 0]
        b = jnp.where(ring, queued, g.tok_bytes[tok, i])
        return _byte(g, st, b.astype(jnp.int32), i < reads, skip_idle)
    state = jax.lax.fori_loop(0, jnp.max(reads, initial=0), body, state)
    return state.replace(head=state.head + reads)


def _queue(g: CallGrammar, state: ParserState, tok: jax.Array, length: jax.Array, width: int | None
           ) -> ParserState:
    """Append the first ``length`` [B] bytes of each row's token to its backlog (``width``:
    a static bound on ``length``, None for the longest token L: the scatter's width)."""
    q = ring_size(g)
    i = jnp.arange(g.tok_bytes.shape[1] if width is None else width)  # [W]
    pos = jnp.where(i[None] < length[:, None], (state.tail[:, None] + i[None]) & (q - 1), q)   # [B, W], q: none
    ring = jax.vmap(lambda r, p, b: r.at[p].set(b, mode="drop"))(state.ring, pos, g.tok_bytes[tok, :i.shape[0]])
    return state.replace(ring=ring, tail=state.tail + length)


def _read_backlog(g: CallGrammar, state: ParserState, rows: jax.Array, skip_idle: bool) -> ParserState:
    """Read one backlog byte on each of the ``rows`` [B] (rows with a backlog)."""
    b = jnp.take_along_axis(state.ring, (state.head & (ring_size(g) - 1))[:, None], axis=1)[:, 0]
    state = _byte(g, state, b.astype(jnp.int32), rows, skip_idle)
    return state.replace(head=state.head + rows)


def drain(g: CallGrammar, state: ParserState, rows: jax.Array, *, skip_idle: bool = True) -> ParserState:
    """Read the whole backlog of the ``rows`` [B] (a ``lax.while_loop``; at most Q bytes).
    Call it on the rows whose turn ended before :func:`call_record`."""
    def more(st: ParserState) -> jax.Array:
        return jnp.any(rows & (st.tail > st.head))
    return jax.lax.while_loop(more, lambda st: _read_backlog(g, st, rows & (st.tail > st.head), skip_idle), state)


def finish(g: CallGrammar, state: ParserState, active: jax.Array) -> ParserState:
    """End the turn of the ``active`` [B] rows without a stop token (length limit): their
    backlog is read (:func:`drain`), then an open call becomes INCOMPLETE. Rows already
    stopped are unchanged."""
    state = drain(g, state, active)
    tag = jnp.where(active, TAG_STOP, 0).astype(jnp.int32)
    return _rows(_tag_event, g, state, tag, jnp.zeros_like(active))


def call_record(g: CallGrammar, state: ParserState) -> CallRecord:
    """The verdicts of the recorded calls: CallRecord with leaves [B, C, ...] (slots at
    or past ``state.count`` are empty). Jittable; call it when a turn ends, on rows with
    no backlog (:func:`drain`, :func:`finish`); mid-turn it shows the bytes read so far."""
    per_call = jax.vmap(_verdict, in_axes=(None, 0, 0))
    return jax.vmap(per_call, in_axes=(None, 0, 0))(g, state.calls, state.ended)


def parse_tokens(g: CallGrammar, ids: jax.Array, lengths: jax.Array, *, skip_idle: bool = True,
                 byte_cap: int | None = 16) -> ParserState:
    """Whole turns: ids int [B, T], lengths int [B] (ids past a row's length are ignored),
    then :func:`finish`. A convenience for tests and offline use (a ``lax.scan`` of step)."""
    def body(st: ParserState, col: tuple[jax.Array, jax.Array]) -> tuple[ParserState, None]:
        t, tok = col
        return step(g, st, tok, t < lengths, skip_idle=skip_idle, byte_cap=byte_cap), None
    state, _ = jax.lax.scan(body, init(g, ids.shape[0]), (jnp.arange(ids.shape[1]), ids.T))
    return finish(g, state, jnp.ones(ids.shape[0], bool))


def fnv1a(data: bytes) -> int:
    """32-bit FNV-1a: the host twin of the hash the parser keeps of each string."""
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFF
    return h
