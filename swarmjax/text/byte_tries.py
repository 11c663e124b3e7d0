"""Byte automata built once on the host (numpy) for the device tool-call parser.

* :func:`token_byte_table`: the UTF-8 bytes of every token id of a byte-level BPE
  (``[V, L]`` uint8 + lengths ``[V]``), read through the ByteLevel alphabet; added
  tokens are the bytes of their content.
* :func:`aho_corasick`: a multi-pattern DFA over bytes (goto + failure links folded
  into a full ``[S, 256]`` table) with the patterns ending at each state.
* :func:`string_automaton`: one DFA that reads a JSON string's unescaped bytes and
  knows at once which exact string it is (a trie over keys, tool names and enum
  values) and which mention phrases occur in it (an Aho-Corasick automaton): the
  product of the two, whose size is the trie's plus the AC's.
* :func:`tag_automaton`: the Aho-Corasick DFA of the hermes tags and stop strings.

Everything here is plain numpy; :mod:`swarmjax.text.device.calls` puts the tables
on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import pre_tokenizers

from swarmjax.text.tokenizer import TextTokenizer


def bytes_to_unicode() -> dict[int, str]:
    """The ByteLevel byte -> character map (GPT-2's ``bytes_to_unicode``: printable
    Latin-1 bytes are themselves, the other 68 bytes are U+0100 onwards, in order).
    :func:`byte_decoder` checks it against the ``tokenizers`` library."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def byte_decoder() -> dict[str, int]:
    """ByteLevel character -> byte, verified against ``tokenizers``: the same alphabet as
    ``ByteLevel.alphabet()`` and the same characters as its pre-tokenizer gives for text
    covering every byte that valid UTF-8 can hold. Raises RuntimeError on a mismatch."""
    table = bytes_to_unicode()
    if set(table.values()) != set(pre_tokenizers.ByteLevel.alphabet()):
        raise RuntimeError("the ByteLevel alphabet of this tokenizers version is not GPT-2's")
    # every byte valid UTF-8 can hold: ASCII, all 2-byte characters (leads C2-DF, every
    # continuation byte), one character per 3-byte lead (E0-EF) and per 4-byte lead (F0-F4).
    probe = "".join(chr(c) for c in range(0x800)) + "".join(chr(max(0x800, 0x1000 * i + 0x100)) for i in range(16))
    probe += "".join(chr(c) for c in (0x10000, 0x40000, 0x80000, 0xC0000, 0x100000))
    data = probe.encode("utf-8")
    split = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(probe)
    if "".join(piece for piece, _ in split) != "".join(table[b] for b in data):
        raise RuntimeError("the ByteLevel pre-tokenizer maps bytes differently from bytes_to_unicode")
    return {c: b for b, c in table.items()}


def token_byte_table(tokenizer: TextTokenizer) -> tuple[np.ndarray, np.ndarray]:
    """Every id's bytes: (table uint8 [V, L], length int32 [V]), L the longest token (>= 1).
    Model tokens are ByteLevel strings mapped back to bytes; added tokens are their
    content's UTF-8 bytes. Raises ValueError for a token outside the ByteLevel alphabet
    (not a byte-level BPE)."""
    decode = byte_decoder()
    added = {i: c for c, i in tokenizer.added_tokens.items()}
    size = tokenizer.vocab_size
    pieces: list[bytes] = []
    for i in range(size):
        if i in added:
            pieces.append(added[i].encode("utf-8"))
            continue
        token = tokenizer.backend.id_to_token(i)
        if token is None:
            pieces.append(b"")
            continue
        try:
            pieces.append(bytes(decode[c] for c in token))
        except KeyError:
            raise ValueError(f"token {i} ({token!r}) is not a ByteLevel string: the device parser "
                             "needs a byte-level BPE") from None
    width = max(1, max(len(p) for p in pieces))
    table = np.zeros([size, width], np.uint8)
    for i, p in enumerate(pieces):
        table[i, :len(p)] = np.frombuffer(p, np.uint8)
    return table, np.asarray([len(p) for p in pieces], np.int32)


# --------------------------------------------------------------------------- automata

def _trie(strings: Sequence[bytes]) -> tuple[list[dict[int, int]], list[list[int]]]:
    """(children per node, ids of the strings ending at each node); node 0 is the root."""
    children: list[dict[int, int]] = [{}]
    ends: list[list[int]] = [[]]
    for sid, s in enumerate(strings):
        node = 0
        for b in s:
            if b not in children[node]:
                children[node][b] = len(children)
                children.append({})
                ends.append([])
            node = children[node][b]
        ends[node].append(sid)
    return children, ends


def _bfs(children: list[dict[int, int]]) -> list[int]:
    order, head = [0], 0
    while head < len(order):
        order.extend(children[order[head]].values())
        head += 1
    return order


def aho_corasick(patterns: Sequence[bytes]) -> tuple[np.ndarray, list[list[int]]]:
    """The DFA of ``patterns``: (next int32 [S, 256], the ids of the patterns that end when
    the automaton enters each state, longest first). State 0 is the start."""
    children, ends = _trie(patterns)
    nxt = np.zeros([len(children), 256], np.int32)
    fail = np.zeros(len(children), np.int32)
    out: list[list[int]] = [list(e) for e in ends]
    for node in _bfs(children):
        if node:
            nxt[node] = nxt[fail[node]]
            out[node] = out[node] + [p for p in out[fail[node]] if p not in out[node]]
        for b, child in children[node].items():
            fail[child] = nxt[fail[node], b] if node else 0
        for b, child in children[node].items():
            nxt[node, b] = child
    return nxt, out


@dataclass(frozen=True)
class StringAutomaton:
    """The product of a trie over exact strings and the AC automaton of the phrases.

    Attributes:
      next: int32 [S, 256]; state 0 is the start of every string.
      accept: int32 [S], the id of the exact string read so far, or -1.
      outputs: int32 [S, K], the phrases that end on entering the state (-1 padded, K >= 1).
      phrase_len: int32 [max(P, 1)], each phrase's length in bytes.
    """

    next: np.ndarray
    accept: np.ndarray
    outputs: np.ndarray
    phrase_len: np.ndarray


def string_automaton(exact: Sequence[bytes], phrases: Sequence[bytes]) -> StringAutomaton:
    """One DFA for every JSON string of a call: the trie part names the string when it is
    one of ``exact`` (keys, tool names, enum values), the AC part reports ``phrases``.

    While the string read so far is a prefix of an exact string the state is that trie
    node (the AC state is a function of the prefix); after that it is ``T + ac_state``.
    """
    if len(set(exact)) != len(exact):
        raise ValueError("exact strings must be distinct")
    if any(len(p) == 0 for p in phrases):
        raise ValueError("mention phrases must be non-empty")
    children, ends = _trie(exact)
    ac_next, ac_out = aho_corasick(phrases)
    n_trie = len(children)
    ac_of = np.zeros(n_trie, np.int32)
    for node in _bfs(children):
        for b, child in children[node].items():
            ac_of[child] = ac_next[ac_of[node], b]
    nxt = np.concatenate([ac_next[ac_of] + n_trie, ac_next + n_trie]).astype(np.int32)
    for node, kids in enumerate(children):
        for b, child in kids.items():
            nxt[node, b] = child
    accept = np.full(len(nxt), -1, np.int32)
    for node, e in enumerate(ends):
        if e:
            accept[node] = e[0]
    outs = [ac_out[a] for a in ac_of] + ac_out
    width = max(1, max(len(o) for o in outs))
    outputs = np.full([len(nxt), width], -1, np.int32)
    for s, o in enumerate(outs):
        outputs[s, :len(o)] = o
    lengths = np.asarray([len(p) for p in phrases] or [1], np.int32)
    return StringAutomaton(nxt, accept, outputs, lengths)


def tag_automaton(tags: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(next int32 [S, 256], accept int32 [S]): accept is 1 + the index of the tag that ends
    on entering a state, 0 for none. Tags must not be suffixes of one another."""
    data = [t.encode("utf-8") for t in tags]
    nxt, out = aho_corasick(data)
    if any(len(o) > 1 for o in out):
        raise ValueError("a tag is a suffix of another")
    accept = np.asarray([1 + o[0] if o else 0 for o in out], np.int32)
    return nxt, accept
