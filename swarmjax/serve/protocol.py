"""The OpenAI chat-completions wire format: what a request may hold, the errors, the reply.

A request body is checked before anything touches a stream (:func:`check_request`);
each problem is an :class:`APIError`, sent back as OpenAI's error object
(``{"error": {"message", "type", "param", "code"}}``) with its HTTP status, so an
``openai`` client raises its usual ``BadRequestError`` / ``NotFoundError`` /
``AuthenticationError``. A sampled turn becomes the assistant message of the reply
(:func:`assistant_message`): the text outside calls as ``content``, the think block as
``reasoning_content``, every call with a name as a ``tool_calls`` entry (its arguments as
the JSON text the model wrote, re-serialised when they parsed), and a call whose name
could not be read stays in ``content`` as written. With ``stream=true`` the same reply
goes out as ``chat.completion.chunk`` server-sent events (:func:`completion_chunks`).

Reference: the OpenAI API's chat-completions object and error shape
(platform.openai.com/docs/api-reference/chat); ``reasoning_content`` as vLLM and
DeepSeek return it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

from swarmjax.text.chat import message_text
from swarmjax.text.toolcalls import ParsedTurn
from swarmjax.text.tools import Tool, ToolSet

__all__ = ["APIError", "ChatRequest", "check_request", "assistant_message", "completion", "completion_chunks",
           "tool_set"]

ROLES = ("system", "user", "assistant", "tool")
# request fields the server reads; others (sampling options a training job sets itself,
# metadata) are accepted and ignored, as OpenAI-compatible servers do with unknown options
_TOOL_CHOICES = ("auto", "none")


@dataclasses.dataclass
class APIError(Exception):
    """A request the server refuses: HTTP ``status`` and OpenAI's error fields."""

    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None

    def __str__(self) -> str:
        return f"{self.status} {self.message}"

    def body(self) -> dict:
        """``{"error": {...}}``, the object an OpenAI client reads."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclasses.dataclass(frozen=True)
class ChatRequest:
    """A checked request: ``messages`` (ending with a user or tool message), the tool
    schemas (OpenAI's ``{"type": "function", "function": {...}}``; () without tools),
    ``tool_choice`` ("auto" or "none"), ``max_tokens`` (None: the engine's limit), the
    episode it names (``user``; the header, when given, wins), and whether the reply is
    streamed (``stream``; ``include_usage``: ``stream_options.include_usage``)."""

    model: str
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] = ()
    tool_choice: str = "auto"
    max_tokens: int | None = None
    user: str | None = None
    stream: bool = False
    include_usage: bool = False


def _bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _check_message(i: int, m: Any) -> dict:
    where = f"messages[{i}]"
    if not isinstance(m, Mapping):
        raise _bad(f"{where} is not an object", where)
    role = m.get("role")
    if role not in ROLES:
        raise _bad(f"{where}.role is {role!r}; one of {', '.join(ROLES)}", f"{where}.role")
    content = m.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise _bad(f"{where}.content is neither a string nor a list of parts", f"{where}.content")
    try:
        message_text(m)
    except (ValueError, AttributeError, TypeError) as e:
        raise _bad(f"{where}.content: {e} (text parts only)", f"{where}.content") from None
    if role == "assistant":
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list):
            raise _bad(f"{where}.tool_calls is not a list", f"{where}.tool_calls")
        for j, c in enumerate(calls):
            fn = c.get("function") if isinstance(c, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise _bad(f"{where}.tool_calls[{j}] has no function name", f"{where}.tool_calls[{j}]")
    elif m.get("tool_calls"):
        raise _bad(f"{where}: only assistant messages carry tool_calls", f"{where}.tool_calls")
    return dict(m)


def check_request(body: Any, *, model: str, max_messages: int = 4096) -> ChatRequest:
    """``body`` (the parsed JSON) as a :class:`ChatRequest`, or :class:`APIError`:
    not an object, ``model`` other than ``model`` (404 ``model_not_found``), no messages
    or more than ``max_messages``, a malformed message or tool, a last message that is
    not a user or tool message, a ``tool_choice`` this server does not support, ``n``
    other than 1, ``stream`` or ``stream_options`` of the wrong type."""
    if not isinstance(body, Mapping):
        raise _bad("the request body is not a JSON object")
    if body.get("model") != model:
        raise APIError(404, f"the model {body.get('model')!r} does not exist; this server serves {model!r}",
                       param="model", code="model_not_found")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list", "messages")
    if len(messages) > max_messages:
        raise _bad(f"{len(messages)} messages; at most {max_messages}", "messages")
    messages = [_check_message(i, m) for i, m in enumerate(messages)]
    if messages[-1]["role"] not in ("user", "tool"):
        raise _bad("the last message must be a user or tool message (the model answers it)", "messages")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise _bad(f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, Mapping) or not isinstance(options.get("include_usage", False), bool):
        raise _bad("stream_options must be an object like {'include_usage': true}", "stream_options")
    if options and not stream:
        raise _bad("stream_options is only allowed with stream=true", "stream_options")
    if body.get("n", 1) != 1:
        raise _bad("n must be 1", "n")
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise _bad("tools must be a list", "tools")
    tool_set(tools)                                    # raises on a malformed schema
    choice = body.get("tool_choice", "auto")
    if choice not in _TOOL_CHOICES:
        raise _bad(f"tool_choice {choice!r} is not supported (this server decodes without constraints): "
                   f"{' or '.join(map(repr, _TOOL_CHOICES))}", "tool_choice")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
                                   or max_tokens < 1):
        raise _bad(f"max_tokens must be a positive integer, got {max_tokens!r}", "max_tokens")
    user = body.get("user")
    return ChatRequest(model=model, messages=tuple(messages), tools=tuple(dict(t) for t in tools),
                       tool_choice=choice, max_tokens=max_tokens, user=user if isinstance(user, str) else None,
                       stream=stream, include_usage=bool(options.get("include_usage", False)))


def tool_set(tools: Sequence[Mapping]) -> ToolSet:
    """The request's tool schemas as a :class:`~swarmjax.text.tools.ToolSet` of tools
    without functions (the harness runs them): what the turn parser checks calls
    against. Raises :class:`APIError` naming the malformed tool.

    A harness sends the same tools with every request, and checking a schema against
    JSON Schema's meta-schema costs milliseconds, so the sets of the last
    :data:`TOOL_SETS` distinct tool lists are kept (read-only, shared by episodes)."""
    try:
        key = json.dumps(tools, sort_keys=True)
    except (TypeError, ValueError):
        raise _bad("tools must be JSON", "tools") from None
    return _tool_set(key)


TOOL_SETS = 256


@functools.lru_cache(maxsize=TOOL_SETS)
def _tool_set(key: str) -> ToolSet:
    tools = json.loads(key)
    out = []
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, Mapping) else None
        if not isinstance(t, Mapping) or t.get("type", "function") != "function" or not isinstance(fn, Mapping):
            raise _bad(f"tools[{i}] is not a {{'type': 'function', 'function': {{...}}}} object", f"tools[{i}]")
        try:
            out.append(Tool(fn.get("name"), str(fn.get("description", "")),
                            fn.get("parameters") or {"type": "object", "properties": {}}, None))
        except ValueError as e:
            raise _bad(f"tools[{i}]: {e}", f"tools[{i}]") from None
    try:
        return ToolSet(out)
    except ValueError as e:
        raise _bad(f"tools: {e}", "tools") from None


def assistant_message(parsed: ParsedTurn, *, call_id: str, calls: bool = True) -> dict:
    """The assistant message of a sampled turn (module docstring); calls get the ids
    ``{call_id}_{i}``. ``calls=False`` (``tool_choice="none"``): every call stays in
    ``content`` as the model wrote it."""
    tool_calls, stray = [], []
    for i, c in enumerate(parsed.calls):
        if c.name is None or not calls:                  # unreadable (or not asked for): as the model wrote it
            stray.append(c.text)
            continue
        arguments = json.dumps(c.arguments, ensure_ascii=False) if c.arguments is not None else c.text
        tool_calls.append({"id": f"{call_id}_{i}", "type": "function",
                           "function": {"name": c.name, "arguments": arguments}})
    content = "\n".join(p for p in (parsed.content, *stray) if p)
    message: dict = {"role": "assistant", "content": content or (None if tool_calls else "")}
    if tool_calls:
        message["tool_calls"] = tool_calls
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    return message


def completion(message: dict, *, model: str, request_id: str, prompt_tokens: int, completion_tokens: int,
               truncated: bool) -> dict:
    """The ``chat.completion`` object of one reply."""
    reason = "length" if truncated else "tool_calls" if message.get("tool_calls") else "stop"
    return {"id": request_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": reason, "logprobs": None}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def completion_chunks(out: dict, *, include_usage: bool = False) -> list[dict]:
    """A ``chat.completion`` object (:func:`completion`) as the ``chat.completion.chunk``
    objects OpenAI streams: the role, the think block, the content, one chunk per tool
    call (its index, id, name and whole arguments), the finish reason; with
    ``include_usage`` a last chunk with no choices and the usage. A turn is sampled whole
    (the batched decode returns it at its end), so its text comes in one chunk: streaming
    serves harnesses written for it, not an earlier first token."""
    choice, message = out["choices"][0], out["choices"][0]["message"]
    head = {"id": out["id"], "object": "chat.completion.chunk", "created": out["created"], "model": out["model"]}

    def chunk(delta: dict, finish: str | None = None) -> dict:
        return {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    chunks = [chunk({"role": "assistant", "content": ""})]
    if message.get("reasoning_content") is not None:
        chunks.append(chunk({"reasoning_content": message["reasoning_content"]}))
    if message.get("content"):
        chunks.append(chunk({"content": message["content"]}))
    chunks += [chunk({"tool_calls": [{"index": i, **call}]}) for i, call in enumerate(message.get("tool_calls", ()))]
    chunks.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        chunks.append({**head, "choices": [], "usage": out["usage"]})
    return chunks
