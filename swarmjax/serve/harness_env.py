"""A harness episode as a host environment: the rollout samples, the harness decides.

An agent harness (any loop over an OpenAI-style client) runs in its own thread; its
requests reach this environment through the server's :class:`~swarmjax.serve.hub.Episode`.
To :class:`~swarmjax.swarm.text_rollout.TextRollout` it is an ordinary
:class:`~swarmjax.envs.api.HostEnv` (or an asynchronous one, ``asynchronous=True``: the
rollout decodes the other rows while this harness runs its tools), so a harness episode
shares the batched decode, cache rows, prefix sharing and continuous batching of every
other episode; a request's ``max_tokens`` bounds its turn (``turn_limit``; the reply's
``finish_reason`` is then ``length``):

* ``reset(problem)`` starts the harness and waits for its first request: the prompt ids
  are that request's conversation, rendered (:class:`~swarmjax.serve.record.ChatStream`);
* ``step(turn)`` sends the sampled turn back as the request's reply (an assistant message
  with ``tool_calls``: :func:`~swarmjax.serve.protocol.assistant_message`) and waits
  for the harness's next request. One that extends the stream gives the reply ids (the
  turn's closing ids, then only the new tool and user messages, tokenised: the sampled
  ids are never re-encoded); one that does not (the harness edited its history) opens a
  new segment (``Step(restart=...)``) and counts as ``template_drift``; the harness
  returning ends the episode, its answer scored by the task's verifier (or by the harness
  itself: it returns a :class:`~swarmjax.serve.hub.Scored`).

A request whose conversation does not fit the agent's context gets OpenAI's
``context_length_exceeded`` error (the stream unchanged), as a server would answer it;
the harness may go on or give up. The episode ends after ``timeout`` seconds in all
(reward terms ``timeout`` 1, no answer), or when the harness raises (``harness_error``).
Reward terms at the end: the verifier's, ``template_drift``, ``requests``, ``refused``
(requests answered with an error), ``tool_calls`` (calls sent to the harness, which runs
them), ``harness_error``, ``timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from swarmjax.envs.api import Step, SubAgentResult
from swarmjax.serve.hub import Episode, Finished, Hub, Request, Scored
from swarmjax.serve.protocol import APIError, ChatRequest, assistant_message, completion, tool_set
from swarmjax.serve.record import ChatStream
from swarmjax.text.chat import ChatFormat
from swarmjax.text.toolcalls import parse_turn

__all__ = ["HarnessEnv", "HarnessError", "reply_message", "context_error"]

Launch = Callable[[Any, Episode], None]     # (problem, episode) -> None: starts the harness


def reply_message(chat: ChatFormat, request: ChatRequest, turn: np.ndarray, *, call_id: str) -> dict:
    """The assistant message answering ``request`` with the sampled ``turn`` [T] ids: its
    text, think block and tool calls parsed against the request's tools (none with
    ``tool_choice="none"``)."""
    parsed = parse_turn(chat.tokenizer.decode(turn), tool_set(request.tools), syntax=chat.call_syntax)
    return assistant_message(parsed, calls=request.tool_choice != "none", call_id=call_id)


def context_error(context: int, n: int) -> APIError:
    """OpenAI's ``context_length_exceeded`` for a conversation of ``n`` ids."""
    return APIError(400, f"this model's context holds {context} tokens; the conversation is {n} (with room for "
                         "at least one sampled token)", param="messages", code="context_length_exceeded")


class HarnessError(RuntimeError):
    """A harness that cannot be trained on: it ended, or waited past its time limit,
    before its first request."""


class HarnessEnv:
    """One harness episode (module docstring).

    Args:
      chat: the chat format (tokenizer inside) the stream is rendered in.
      hub: where the episode is opened (the server routes its requests there).
      launch: ``(problem, episode)``: start the harness for ``problem``, in a thread or
        process of its own, its requests naming ``episode.key``; it calls
        ``episode.finish(answer)`` (or ``finish(error=e)``) when it returns.
      verify: ``(problem, answer) -> reward terms`` (``"r_perf"`` the task reward).
      model: the model name replies carry.
      timeout: seconds an episode may take in all.
      context: the most ids the agent's conversation may hold (None: unbounded); a
        request past it is refused with ``context_length_exceeded``.
      asynchronous: the rollout decodes the other rows while this harness works
        (:mod:`~swarmjax.swarm.text_rollout`; for harnesses whose tools take longer than a
        decode segment); by default it waits for every harness's next request.
    """

    def __init__(self, chat: ChatFormat, hub: Hub, launch: Launch, *,
                 verify: Callable[[Any, str], Mapping[str, float]] | None = None, model: str = "swarmjax",
                 timeout: float = 300.0, context: int | None = None, asynchronous: bool = False):
        self.chat, self.hub, self.launch, self.verify = chat, hub, launch, verify
        self.model, self.timeout, self.context = model, timeout, context
        self.task: Any = None
        self.episode: Episode | None = None
        self.stream: ChatStream | None = None
        self._request: Request | None = None
        self._deadline = 0.0
        self._error: str | None = None          # what the harness raised
        self.refused = self.tool_calls = 0
        self.asynchronous = asynchronous
        self.turn_limit: int | None = None      # the awaiting request's max_tokens

    # ------------------------------------------------------------------ HostEnv
    def reset(self, task: Any) -> np.ndarray:
        """Start the harness on ``task``; -> [P] int32: its first request's prompt ids."""
        self.task, self.refused, self.tool_calls, self._request, self._error = task, 0, 0, None, None
        self.episode = self.hub.open()
        self.stream = ChatStream(self.chat, name=f"harness-{self.episode.key[:8]}")
        self._deadline = time.monotonic() + self.timeout
        self.launch(task, self.episode)
        got = self._next()
        if isinstance(got, Step):
            why = (f"no request within {self.timeout:g} s" if got.rewards["timeout"] else
                   f"it raised {self._error}" if self._error else "it returned without calling the model")
            raise HarnessError(f"the harness ended before its first request: {why}")
        return got

    def step(self, turn: np.ndarray, *, truncated: bool = False) -> Step:
        """Reply to the awaiting request with the sampled ``turn`` [T]; then the next
        request's ids, a new segment, or the end (module docstring)."""
        request, self._request = self._request, None
        if request is None:
            raise RuntimeError("step() without a request awaiting its reply")
        turn = np.asarray(turn, np.int32).reshape(-1)
        message = reply_message(self.chat, request.request, turn,
                                call_id=f"call_{self.episode.key[:12]}_{self.stream.requests}")
        self.tool_calls += len(message.get("tool_calls", ()))
        prompt_len, drift = len(self.stream.trace), self.stream.template_drift
        self.stream.reply(turn, np.zeros(len(turn), np.float32), message)   # the rollout records the log-probs
        request.respond(200, completion(message, model=self.model, request_id=f"chatcmpl-{self.episode.key[:12]}-"
                                        f"{self.stream.requests}", prompt_tokens=prompt_len,
                                        completion_tokens=len(turn), truncated=truncated))
        got = self._next()
        if isinstance(got, Step):
            return got
        if self.stream.template_drift > drift:
            return Step(restart=got)
        return Step(reply=got[prompt_len + len(turn):])

    def resume(self, results: Sequence[SubAgentResult]) -> Step:
        raise RuntimeError("a harness episode starts no sub-agents through the rollout")

    # ------------------------------------------------------------------ inside
    def _refuse(self, request: Request, error: APIError) -> None:
        self.refused += 1
        request.respond(error.status, error.body())

    def _next(self) -> np.ndarray | Step:
        """Wait for the harness: the next request's prompt ids (the stream's current
        segment), or the episode's last :class:`Step`."""
        while True:
            event = self.episode.next_event(self._deadline - time.monotonic())
            if event is None:
                return self._end(None, timeout=True)
            if isinstance(event, Finished):
                self._error = event.error
                return self._end(event.answer if event.error is None else None)
            try:
                ids = self.stream.prompt(event.request.messages, tools=list(event.request.tools) or None)
            except ValueError as e:
                self._refuse(event, APIError(400, f"messages: {e}", param="messages"))
                continue
            if self.context is not None and len(ids) + 1 > self.context:
                self.stream.cancel()
                self._refuse(event, context_error(self.context, len(ids)))
                continue
            self._request, self.turn_limit = event, event.request.max_tokens
            return ids

    def _end(self, answer: str | None, *, timeout: bool = False) -> Step:
        terms = {"template_drift": float(self.stream.template_drift), "requests": float(self.stream.requests),
                 "refused": float(self.refused), "tool_calls": float(self.tool_calls),
                 "harness_error": float(self._error is not None),
                 "timeout": float(timeout)}
        if isinstance(answer, Scored):
            terms.update({k: float(v) for k, v in answer.rewards.items()})
            answer = answer.answer
        elif self.verify is not None:
            terms.update(self.verify(self.task, answer) if answer is not None else {"r_perf": 0.0})
        if self._request is not None:                     # (never: a request always has a reply first)
            self._refuse(self._request, APIError(410, "this episode is over", code="episode_closed"))
        self.hub.close(self.episode)
        return Step(done=True, answer=answer, rewards=terms)
