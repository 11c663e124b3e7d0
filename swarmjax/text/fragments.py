"""Token fragments: pieces of text tokenised once on the host, joined on the device.

An environment that runs inside ``jit`` cannot call a tokenizer, yet its replies are
text ("Sub-agent 'worker3' answered:\\nDoravin Kelt: sub-tarno\\n"). It says them as a
sequence of *fragments*: each a constant id array built once (a value's name, an
error sentence, the chat format's tool-response header), so a reply is a row of
fragment indices and :func:`render` concatenates their ids.

Joining tokenisations equals tokenising the joined text only where the pre-tokenizer
splits at the joints and never merges across them (byte-level BPE merges stay inside
a pre-token). Which joints are safe depends on the tokenizer's split pattern, so an
environment that uses fragments verifies every family of them against the tokenizer
at build time (:func:`check_joins`) and refuses to build where a joint is unsafe,
instead of saying ids the host would never produce.

Fragment 0 is always the empty fragment: a row pads its sequence with 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
EMPTY = 0


@flax.struct.dataclass
class Fragments:
    """``N`` fragments on the device: ``ids`` [N, Lf] int32 (0-padded), ``lens`` [N] int32."""

    ids: Array
    lens: Array

    @classmethod
    def build(cls, pieces: Sequence[np.ndarray]) -> Fragments:
        """Fragments from id arrays; ``pieces[0]`` must be empty (the padding fragment)."""
        if not pieces or len(pieces[0]):
            raise ValueError("fragment 0 must be the empty fragment")
        width = max(1, max(len(p) for p in pieces))
        ids = np.zeros((len(pieces), width), np.int32)
        for i, p in enumerate(pieces):
            ids[i, :len(p)] = p
        return cls(ids=jnp.asarray(ids), lens=jnp.asarray([len(p) for p in pieces], jnp.int32))

    @property
    def max_len(self) -> int:
        return int(self.ids.shape[1])


def render(frags: Fragments, seq: Array, *, width: int) -> tuple[Array, Array]:
    """Concatenate each row's fragments.

    seq [R, M] int32 fragment indices (``EMPTY`` where there is none, anywhere in the
    row). Returns ids [R, width] int32 (0 past the end) and lengths [R] int32; a row
    whose fragments hold more than ``width`` ids is cut at ``width`` (its length says
    how many it holds, so callers can tell).

    Output position q of row r comes from the fragment j with
    ``start[r, j] <= q < end[r, j]`` (``end`` = cumulative lengths): ``j`` = the number
    of fragments that end at or before q (a binary search in the row's ends).
    """
    lens = frags.lens[seq]                                   # [R, M]
    ends = jnp.cumsum(lens, axis=1)                          # [R, M]
    q = jnp.arange(width, dtype=jnp.int32)                   # [W]
    j = jax.vmap(lambda e: jnp.searchsorted(e, q, side="right"))(ends)   # [R, W]: O(W log M) a row
    j = jnp.minimum(j, seq.shape[1] - 1)
    start = jnp.take_along_axis(ends - lens, j, axis=1)      # [R, W]
    frag = jnp.take_along_axis(seq, j, axis=1)               # [R, W]
    col = jnp.clip(q[None, :] - start, 0, frags.max_len - 1)
    total = ends[:, -1]
    ids = jnp.where(q[None, :] < total[:, None], frags.ids[frag, col], 0)
    return ids.astype(jnp.int32), total.astype(jnp.int32)


def compose(pieces: Sequence[np.ndarray], seq: Sequence[int]) -> np.ndarray:
    """Host twin of :func:`render` for one row: the ids of fragments ``seq``. -> int32 [T]."""
    parts = [np.asarray(pieces[i], np.int32) for i in seq]
    return np.concatenate(parts) if parts else np.zeros([0], np.int32)


def check_joins(encode: Callable[[list[str]], np.ndarray], families: Sequence[Sequence[str]],
                *, name: str, samples: int = 64, seed: int = 0) -> None:
    """Check that tokenising a text of ``len(families)`` slots, each filled from its
    family, equals joining the tokenisations of the slots, for every member of every
    family (each at least once) and ``samples`` random fills.

    encode: ``list of slot texts -> ids of the joined text``, e.g. a chat-format render.
    Raises ValueError naming the first text whose joints are unsafe.
    """
    rng = np.random.RandomState(seed)
    fills = [[f[rng.randint(len(f))] for f in families] for _ in range(samples)]
    for s, fam in enumerate(families):
        for member in fam:
            fill = [f[rng.randint(len(f))] for f in families]
            fill[s] = member
            fills.append(fill)
    for fill in fills:
        whole = encode(list(fill))
        joined = np.concatenate([encode([t]) for t in fill]) if fill else np.zeros([0], np.int32)
        if not np.array_equal(whole, joined):
            raise ValueError(f"{name}: the tokenizer merges across a fragment joint in {''.join(fill)!r}; "
                             "its ids differ from the fragments' (choose joints at pre-token boundaries)")


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading ids ``a`` and ``b`` share (a prompt head every prompt opens with)."""
    n = min(len(a), len(b))
    return int(np.argmin(np.append(a[:n] == b[:n], False)))


FRAME = ("open", "between", "close", "close_ended", "close_cut")


def reply_frame(chat) -> dict[str, np.ndarray]:
    """The ids of a tool reply's frame (a :class:`~swarmjax.text.chat.ChatFormat` with a
    ``tool_response_frame``): ``open``, ``between``, ``close`` and the closing ids of the
    turn it answers, ended by a stop id (``close_ended``) or cut at its length limit
    (``close_cut``)."""
    open_, between, close, _, _ = chat.tool_response_frame()
    return {"open": open_, "between": between, "close": close,
            "close_ended": chat.after_turn_ids(chat.stop_ids[:1]),
            "close_cut": chat.after_turn_ids(np.zeros([0], np.int32))}


def reply_seq(c: dict, grid: Array, responses: Array, cut: Array) -> Array:
    """A turn's reply fragments: closing ids (``cut``: the turn hit its length limit),
    the frame's open, the responses (rows of ``grid`` [N, G] below ``responses``) in
    order with ``between`` joints, close; ``c`` maps :data:`FRAME` names to fragment ids.
    -> [2 + N (G + 1) + 1] fragment ids."""
    n = grid.shape[0]
    live = jnp.arange(n) < responses
    joint = jnp.where(live & (jnp.arange(n) > 0), c["between"], EMPTY)
    body = jnp.concatenate([joint[:, None], jnp.where(live[:, None], grid, EMPTY)], axis=1).reshape(-1)
    closing = jnp.where(cut, c["close_cut"], c["close_ended"])
    return jnp.concatenate([jnp.stack([closing, jnp.int32(c["open"])]), body, jnp.asarray([c["close"]])])
