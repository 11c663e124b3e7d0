"""Host views of the device tool-call parser (:mod:`swarmjax.text.device.calls`), for
tests and logs: every row's calls as Python values (:func:`device_summaries`), and the
same summary from the host parser's reading of a turn (:func:`host_summary`), so the two
compare with ``==``."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from swarmjax.text.device.calls import CallGrammar, ParserState, call_record, fnv1a
from swarmjax.text.device.json_parser import K_ARR, K_FALSE, K_INT, K_NULL, K_NUM, K_OBJ, K_STR, K_TRUE
from swarmjax.text.toolcalls import CallError, ParsedTurn

__all__ = ["ArgValue", "CallSummary", "TurnSummary", "device_summaries", "host_summary"]

_SHOWN = (CallError.NONE, CallError.MISSING_ARGUMENT, CallError.BAD_ARGUMENT)  # calls whose slots are reported

class ArgValue(NamedTuple):
    """One present argument: K_* kind, enum index (-1), integer value (wrapped to int32;
    booleans 1/0), FNV-1a of the string's UTF-8 bytes (0), mention ids in order."""

    kind: int
    enum: int
    int: int
    hash: int
    mentions: tuple[int, ...]


class CallSummary(NamedTuple):
    """tool id (-1: unknown or unread), CallError, per slot an ArgValue or None (absent);
    ``args`` is () unless the call's arguments were read (NONE, MISSING_ARGUMENT, BAD_ARGUMENT)."""

    tool: int
    error: CallError
    args: tuple[ArgValue | None, ...]


class TurnSummary(NamedTuple):
    count: int                       # calls in the turn (may exceed max_calls)
    calls: tuple[CallSummary, ...]   # the first max_calls


_call_record_jit = jax.jit(lambda g, state: call_record(g, state))


def device_summaries(g: CallGrammar, state: ParserState) -> list[TurnSummary]:
    """Every row of a batched state as Python values (:func:`call_record` on the device,
    then one transfer)."""
    rec, count = jax.device_get((_call_record_jit(g, state), state.count))
    out = []
    for row, n in enumerate(count.tolist()):
        calls = []
        for c in range(min(n, g.spec.max_calls)):
            tool, err = int(rec.tool[row, c]), CallError(int(rec.error[row, c]))
            args: tuple[ArgValue | None, ...] = ()
            if tool >= 0 and err in _SHOWN:
                args = tuple(ArgValue(int(rec.kind[row, c, a]), int(rec.enum[row, c, a]), int(rec.ival[row, c, a]),
                                      int(rec.hash[row, c, a]),
                                      tuple(int(m) for m in rec.mentions[row, c, a] if m >= 0))
                             if rec.present[row, c, a] else None for a in range(len(g.spec.args[tool])))
            calls.append(CallSummary(tool, err, args))
        out.append(TurnSummary(n, tuple(calls)))
    return out


def _value(g: CallGrammar, tool: int, slot: int, v: Any) -> ArgValue:
    kind = (K_STR if isinstance(v, str) else K_TRUE if v is True else K_FALSE if v is False else
            K_INT if isinstance(v, int) or (isinstance(v, float) and v.is_integer()) else
            K_NUM if isinstance(v, float) else K_NULL if v is None else K_OBJ if isinstance(v, dict) else K_ARR)
    enum = g.spec.enums[tool][slot]
    number = 1 if v is True else int(v) if kind == K_INT else 0
    mentions: tuple[int, ...] = ()
    if kind == K_STR and g.spec.mention_slots[tool][slot]:
        hits = sorted((v.find(p), i) for i, p in enumerate(g.spec.phrases) if p in v)
        mentions = tuple(i for _, i in hits)[:g.spec.max_mentions]
    return ArgValue(kind, enum.index(v) if kind == K_STR and enum and v in enum else -1,
                    (number + 2 ** 31) % 2 ** 32 - 2 ** 31,
                    fnv1a(v.encode("utf-8", "surrogatepass")) if kind == K_STR else 0, mentions)


def host_summary(g: CallGrammar, turn: ParsedTurn) -> TurnSummary:
    """The same summary from the host parser's reading of the turn (the reference)."""
    calls = []
    for call in turn.calls[:g.spec.max_calls]:
        known = call.error != CallError.INCOMPLETE and call.name in g.spec.tools
        tool = g.spec.tools.index(call.name) if known else -1
        args: tuple[ArgValue | None, ...] = ()
        if tool >= 0 and call.error in _SHOWN:
            args = tuple(_value(g, tool, a, call.arguments[n]) if n in call.arguments else None
                         for a, n in enumerate(g.spec.args[tool]))
        calls.append(CallSummary(tool, CallError(call.error), args))
    return TurnSummary(len(turn.calls), tuple(calls))
