"""The host parser of a finished assistant turn: content, reasoning and tool calls.

:func:`parse_turn` splits the decoded text of one assistant turn (special tokens kept,
with or without its stop string) into the text the user sees, the ``<think>`` block
and the tool calls, in the call syntax of the model family (:data:`CALL_SYNTAXES`).

A malformed call never raises and never becomes content: it is a :class:`ToolCall`
with an error code (:class:`CallError`), so the environment can answer it with
:func:`error_reply` and the mistake costs the policy a step.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # tools.py imports CallError from here; only the types flow back
    from swarmjax.text.tools import Tool


class CallError(IntEnum):
    """Why a tool call is not run. The values are part of the protocol: the device-side
    parser reports the same codes, so never renumber them (append new ones).

    - ``NONE`` (0): a well-formed call of a known tool with valid arguments.
    - ``BAD_JSON`` (1): the call is not a JSON object ``{"name": str, "arguments": {..}}``
      (a syntax error, a missing ``name``, or ``arguments`` that are not an object).
    - ``UNKNOWN_TOOL`` (2): ``name`` is not one of the tools.
    - ``MISSING_ARGUMENT`` (3): a required argument is absent.
    - ``BAD_ARGUMENT`` (4): an argument has the wrong type, a value outside its enum
      (or another schema violation), or is not an argument of the tool.
    - ``INCOMPLETE`` (5): the call was cut off (``<tool_call>`` opened but never closed,
      e.g. by the length limit).
    """

    NONE = 0
    BAD_JSON = 1
    UNKNOWN_TOOL = 2
    MISSING_ARGUMENT = 3
    BAD_ARGUMENT = 4
    INCOMPLETE = 5


@dataclass(frozen=True)
class ToolCall:
    """One parsed call. ``name``/``arguments`` are None where they could not be read;
    ``message`` is a human-readable sentence ("" when ok); ``text`` is the raw text of
    the call (between the tags for hermes)."""

    name: str | None
    arguments: dict[str, Any] | None
    error: CallError = CallError.NONE
    message: str = ""
    text: str = ""

    @property
    def ok(self) -> bool:
        return self.error == CallError.NONE


@dataclass(frozen=True)
class ParsedTurn:
    """A finished assistant turn: ``content`` outside calls and thinking (stripped),
    ``reasoning`` inside ``<think>`` (None when there is no think block) and the calls
    in order."""

    content: str
    reasoning: str | None
    calls: tuple[ToolCall, ...] = ()

    @property
    def ok_calls(self) -> tuple[ToolCall, ...]:
        return tuple(c for c in self.calls if c.ok)

    @property
    def has_errors(self) -> bool:
        return any(not c.ok for c in self.calls)


Tools = Mapping[str, "Tool"]  # a ToolSet, or any name -> Tool mapping


# --------------------------------------------------------------------------- blocks

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


@dataclass(frozen=True)
class _Block:
    opener: str
    body: str
    closed: bool


def _walk(text: str, blocks: Mapping[str, str]) -> tuple[list[str], list[_Block]]:
    """Split ``text`` into the pieces outside any block and the blocks (opener -> closer)
    in order. Inside a block only its closer counts; an unclosed block runs to the end.
    A ``</think>`` before any block closes a think block the prompt opened (Qwen3
    thinking templates end the generation prompt with ``<think>``); any other stray
    closer is ordinary text."""
    tags = re.compile("|".join(re.escape(t) for t in sorted({*blocks, *blocks.values()}, key=len, reverse=True)))
    outside: list[str] = []
    found: list[_Block] = []
    start = search = 0
    while (m := tags.search(text, search)) is not None:
        tag = m.group()
        if tag in blocks:
            outside.append(text[start:m.start()])
            end = text.find(blocks[tag], m.end())
            if end < 0:
                found.append(_Block(tag, text[m.end():], closed=False))
                return outside, found
            found.append(_Block(tag, text[m.end():end], closed=True))
            start = search = end + len(blocks[tag])
        elif tag == THINK_CLOSE and THINK_OPEN in blocks and not found:
            found.append(_Block(THINK_OPEN, text[:m.start()], closed=True))
            start = search = m.end()
        else:
            search = m.end()
    outside.append(text[start:])
    return outside, found


def _join(pieces: list[str]) -> str:
    return "\n".join(p.strip() for p in pieces if p.strip())


def _reasoning(blocks: list[_Block]) -> str | None:
    thoughts = [b.body.strip() for b in blocks if b.opener == THINK_OPEN]
    return "\n".join(thoughts) if thoughts else None


def _cut(text: str, stops: tuple[str, ...]) -> str:
    """The text before the first stop string (the turn ends there)."""
    ends = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[:min(ends)] if ends else text


# --------------------------------------------------------------------------- one call

_ARGUMENT_KEYS = ("arguments", "parameters")  # hermes says arguments, Llama 3.1 parameters
_NAME_HINT = re.compile(r'"name"\s*:\s*"([^"\\]*)"')


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _decode_call(raw: str, tools: Tools) -> ToolCall:
    """The call written as the JSON text ``raw``; never raises."""
    def fail(code: CallError, message: str, name: str | None = None,
             arguments: dict[str, Any] | None = None) -> ToolCall:
        return ToolCall(name, arguments, code, message, raw)

    try:
        obj = json.loads(raw, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        return fail(CallError.BAD_JSON, f"invalid JSON in the tool call: {e.msg} "
                                        f"(line {e.lineno}, column {e.colno}).")
    except (ValueError, RecursionError) as e:
        return fail(CallError.BAD_JSON, f"invalid JSON in the tool call: {e}.")
    if not isinstance(obj, dict):
        return fail(CallError.BAD_JSON, f"a tool call must be a JSON object, not {_json_type(obj)}.")
    name = obj.get("name")
    if not isinstance(name, str):
        return fail(CallError.BAD_JSON, 'the tool call has no "name" string.')
    key = next((k for k in _ARGUMENT_KEYS if k in obj), "arguments")
    arguments = obj.get(key)
    if arguments is None:
        arguments = {}
    elif isinstance(arguments, str):  # some models JSON-encode the arguments object
        try:
            arguments = json.loads(arguments, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            pass
    is_object = isinstance(arguments, dict)
    tool = tools.get(name)
    if tool is None:
        available = ", ".join(tools) or "none"
        return fail(CallError.UNKNOWN_TOOL, f"unknown tool {name!r}. Available tools: {available}.",
                    name, arguments if is_object else None)
    if not is_object:
        return fail(CallError.BAD_JSON, f'"{key}" of the call to {name!r} must be a JSON object '
                                        f"(or a string encoding one), not {_json_type(obj[key])}.", name)
    code, message = tool.validate(arguments)
    return ToolCall(name, arguments, code, message, raw)


def _incomplete(raw: str, where: str) -> ToolCall:
    hint = _NAME_HINT.search(raw)
    name = hint.group(1) if hint else None
    what = f"the call to {name!r}" if name else "the tool call"
    return ToolCall(name, None, CallError.INCOMPLETE, f"{what} was cut off {where}.", raw)


# --------------------------------------------------------------------------- syntaxes

def _parse_hermes(text: str, tools: Tools) -> ParsedTurn:
    """Qwen2.5/Qwen3: ``<tool_call>\\n{"name": .., "arguments": {..}}\\n</tool_call>``, any
    number per turn; calls inside ``<think>`` are reasoning."""
    outside, blocks = _walk(text, {THINK_OPEN: THINK_CLOSE, CALL_OPEN: CALL_CLOSE})
    calls = tuple(_decode_call(b.body, tools) if b.closed else _incomplete(b.body, f"before {CALL_CLOSE}")
                  for b in blocks if b.opener == CALL_OPEN)
    return ParsedTurn(_join(outside), _reasoning(blocks), calls)


def _object_end(text: str, start: int) -> int | None:
    """The index after the bracket that closes the one at ``start`` (JSON strings
    skipped), or None when the text ends first."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


_PYTHON_TAG = "<|python_tag|>"


def _parse_llama3_json(text: str, tools: Tools) -> ParsedTurn:
    """Llama 3.1 JSON tool calling: the message (after an optional ``<|python_tag|>``) is
    ``{"name": .., "parameters": {..}}``, or several such objects separated by ``;``. A
    message that does not start with ``{`` is content; text after the last call is
    content too."""
    outside, blocks = _walk(text, {THINK_OPEN: THINK_CLOSE})
    message = _join(outside)
    if message.startswith(_PYTHON_TAG):
        message = message[len(_PYTHON_TAG):].lstrip()
    calls: list[ToolCall] = []
    pos = 0
    while message.startswith("{", pos):
        end = _object_end(message, pos)
        if end is None:
            calls.append(_incomplete(message[pos:], "before its JSON object was closed"))
            pos = len(message)
            break
        calls.append(_decode_call(message[pos:end], tools))
        pos = len(message) - len(message[end:].lstrip())
        if not message.startswith(";", pos):
            break
        pos = len(message) - len(message[pos + 1:].lstrip())
    return ParsedTurn(message[pos:].strip(), _reasoning(blocks), tuple(calls))


@dataclass(frozen=True)
class CallSyntax:
    """How one model family writes tool calls: the strings that end its turn and the
    parser of the turn's text (already cut at the first stop string)."""

    name: str
    stop_strings: tuple[str, ...]
    parse: Callable[[str, Tools], ParsedTurn]


CALL_SYNTAXES: dict[str, CallSyntax] = {s.name: s for s in (
    CallSyntax("hermes", ("<|im_end|>", "<|endoftext|>"), _parse_hermes),
    CallSyntax("llama3_json", ("<|eom_id|>", "<|eot_id|>", "<|end_of_text|>"), _parse_llama3_json),
)}


def parse_turn(text: str, tools: Tools, *, syntax: str = "hermes") -> ParsedTurn:
    """Parse one finished assistant turn (decoded with special tokens kept; a trailing
    stop string is optional and everything from the first one on is dropped).
    ``tools`` is a :class:`~swarmjax.text.tools.ToolSet` (any name -> Tool mapping).
    Raises only for an unknown ``syntax``; malformed calls are error-coded calls."""
    try:
        spec = CALL_SYNTAXES[syntax]
    except KeyError:
        raise ValueError(f"unknown call syntax {syntax!r}; known: {', '.join(CALL_SYNTAXES)}") from None
    return spec.parse(_cut(text, spec.stop_strings), tools)


_HINTS: dict[CallError, str] = {
    CallError.BAD_JSON: ' Write each call as one JSON object: {"name": <tool name>, "arguments": {...}}.',
    CallError.UNKNOWN_TOOL: "",
    CallError.MISSING_ARGUMENT: "",
    CallError.BAD_ARGUMENT: "",
    CallError.INCOMPLETE: " Nothing was run; write the whole call again.",
}


def error_reply(call: ToolCall) -> str:
    """The tool response for a call that was not run, e.g. ``Error: unknown tool 'foo'.
    Available tools: a, b.``"""
    if call.ok:
        raise ValueError("error_reply needs a failed call; run the ok ones")
    return f"Error: {call.message}{_HINTS[call.error]}"
