"""One agent's token stream across the chat requests of a harness: token-in-token-out
through a chat API.

A harness (any loop over an OpenAI-style client) resends the whole message history with
every request. Re-tokenising that history drifts from what the model sampled: the model
may have chosen another tokenization of the same text, ended a turn with another stop
id, or been cut by the length limit, and a harness may drop the reasoning it was sent.
So the server keeps each agent's stream S (:class:`ChatStream`: ids, sampled mask and
log-probs, an :class:`~swarmjax.swarm.text_types.AgentTrace`) and, for a request with
messages M:

* **M extends S** when M's first k messages are the conversation S was last extended to
  (the request before, plus the reply sent for it), compared as :func:`message_key`s, and
  M[k:] holds only tool and user messages. Only their ids
  (:meth:`~swarmjax.text.chat.ChatFormat.continuation_ids`) are appended: the sampled ids
  are never re-encoded.
* **Otherwise** (the harness edited, dropped or reordered history, changed the tools, or
  sent an old request again) the current segment is closed
  (:meth:`~swarmjax.swarm.text_types.AgentTrace.restart`, it keeps what was sampled) and a
  new one opens with the re-render of M
  (:meth:`~swarmjax.text.chat.ChatFormat.conversation_ids`, loss mask 0). This is counted
  as ``template_drift``.

An assistant message is compared by its visible content and its calls, not its reasoning.
Dropping earlier turns' reasoning is what Qwen3's published template does by design, and
the stream keeps the think block as sampled.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from swarmjax.swarm.text_types import AgentTrace
from swarmjax.text.chat import ChatFormat, Message, call_parts, message_text

__all__ = ["ChatStream", "message_key"]


def _canonical_arguments(arguments: Any) -> str:
    """A call's arguments as one string for comparison: JSON objects (or strings encoding
    one) with sorted keys, anything else as given."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def _visible(text: str) -> str:
    """An assistant content without a leading think block, stripped."""
    if text.lstrip().startswith("<think>") and "</think>" in text:
        text = text.split("</think>", 1)[1]
    return text.strip()


def message_key(message: Message) -> tuple:
    """What decides whether two messages are the same turn of a conversation.

    user / system / tool: (role, text). assistant: (role, visible content, ((name,
    arguments), ...)), with the content stripped, a leading think block and
    ``reasoning_content`` ignored, and arguments compared as parsed JSON."""
    role = message.get("role")
    if role not in ("system", "user", "assistant", "tool"):
        raise ValueError(f"unknown message role {role!r} (system, user, assistant or tool)")
    if role != "assistant":
        return role, message_text(message)
    calls = tuple((name, _canonical_arguments(arguments))
                  for name, arguments in map(call_parts, message.get("tool_calls") or ()))
    return role, _visible(message_text(message)), calls


@dataclasses.dataclass
class _Undo:
    """What :meth:`ChatStream.cancel` puts back: the trace's lists before the request,
    and the counters."""

    parts: int
    current: dict | None          # the segment a drift closed, to reopen
    drift: int
    tools: str | None


class ChatStream:
    """One agent's id stream across chat requests (module docstring).

    ``prompt(messages, tools=)`` appends what a request adds and returns the ids the model
    continues from; ``reply(ids, logprobs, message)`` records the sampled turn and the
    message sent back for it; ``cancel()`` takes back a request that got no reply. The
    requests of one stream are sequential: one awaits its reply at a time.

    Attributes:
      trace: the :class:`~swarmjax.swarm.text_types.AgentTrace` (its ``segments`` the
        closed ones, ``turn`` the reply a token belongs to, 0: the first prompt).
      template_drift: requests that did not extend the stream (each opened a segment).
      requests: requests answered or awaiting an answer.
    """

    def __init__(self, fmt: ChatFormat, *, name: str = "agent"):
        self.fmt = fmt
        self.trace = AgentTrace(name)
        self.template_drift = 0
        self.requests = 0
        self._conversation: tuple | None = None   # message keys the stream is extended to
        self._tools: str | None = None            # the tools of the segment (canonical JSON)
        self._pending: tuple | None = None        # the awaiting request's message keys
        self._undo: _Undo | None = None

    @property
    def awaiting(self) -> bool:
        """Whether a request awaits its reply."""
        return self._pending is not None

    def prompt(self, messages: Sequence[Message], *, tools: Sequence[Mapping] | None = None) -> np.ndarray:
        """Append what the request ``messages`` (ending with a user or tool message) adds
        to the stream. -> int32 [T]: the current segment's ids, which the model continues."""
        if self.awaiting:
            raise RuntimeError(f"stream {self.trace.name!r}: a request awaits its reply; the requests of one "
                               "agent are sequential (give a concurrent one its own agent name)")
        messages = list(messages)
        if not messages or messages[-1].get("role") not in ("user", "tool"):
            raise ValueError("a request's messages end with a user or tool message")
        keys = tuple(message_key(m) for m in messages)
        tools_key = json.dumps(list(tools or []), sort_keys=True, ensure_ascii=False)
        t = self.trace
        self._undo = _Undo(len(t.ids), None, self.template_drift, self._tools)
        k = len(self._conversation) if self._conversation is not None else -1
        if (0 <= k < len(keys) and keys[:k] == self._conversation and tools_key == self._tools
                and all(key[0] in ("user", "tool") for key in keys[k:])):
            t.append(self.fmt.continuation_ids(messages[k:]), sampled=False)
        else:
            if len(t):                             # a stream this request does not extend
                self._undo.current = t.restart()
                self.template_drift += 1
            t.append(self.fmt.conversation_ids(messages, tools=tools), sampled=False)
        self._tools, self._pending = tools_key, keys
        self.requests += 1
        return np.concatenate(t.ids).astype(np.int32)

    def reply(self, ids: Sequence[int] | np.ndarray, logprobs: Sequence[float] | np.ndarray, message: Message, *,
              model_logprobs: Sequence[float] | np.ndarray | None = None) -> None:
        """Record the turn sampled for the awaiting request: ``ids`` [T] and their
        ``logprobs`` [T] (``model_logprobs`` [T]: the model's own, before sampling
        processors; default ``logprobs``), and ``message``, the assistant message sent
        back for it (what the harness will echo). The turn is closed with
        :meth:`~swarmjax.text.chat.ChatFormat.after_turn_ids`."""
        if not self.awaiting:
            raise RuntimeError(f"stream {self.trace.name!r}: no request awaits a reply")
        ids = np.asarray(ids, np.int32).reshape(-1)
        logprobs = np.asarray(logprobs, np.float32).reshape(-1)
        if ids.shape != logprobs.shape:
            raise ValueError(f"ids {ids.shape} and logprobs {logprobs.shape} differ in length")
        if message.get("role") != "assistant":
            raise ValueError(f"a reply is an assistant message, got role {message.get('role')!r}")
        t = self.trace
        t.steps += 1
        t.append(ids, sampled=True, logprobs=logprobs,
                 model_logprobs=logprobs if model_logprobs is None else model_logprobs)
        t.append(self.fmt.after_turn_ids(ids), sampled=False)
        self._conversation = self._pending + (message_key(message),)
        self._pending = self._undo = None

    def cancel(self) -> None:
        """Take back the awaiting request (it got no reply: the client went away, the
        decode failed): the stream is as it was before it."""
        if not self.awaiting:
            raise RuntimeError(f"stream {self.trace.name!r}: no request awaits a reply")
        t, u = self.trace, self._undo
        if u.current is not None:                 # reopen the segment the request closed
            t.segments.pop()
            t.ids, t.sampled, t.logprobs, t.model_logprobs, t.turn = (
                [u.current[k]] for k in ("ids", "sampled", "logprobs", "model_logprobs", "turn"))
        else:
            for part in (t.ids, t.sampled, t.logprobs, t.model_logprobs, t.turn):
                del part[u.parts:]
        self.template_drift, self._tools = u.drift, u.tools
        self.requests -= 1
        self._pending = self._undo = None
