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

Sub-agents: requests that name an agent (the ``X-Agent-Id`` header) are a sub-agent's
(:class:`SubHarnessEnv`). The first requests of sub-agents that come together (within
``stage_wait`` of each other) make one parallel stage (``Step(spawn=...)``): the rollout
samples their turns with the frozen sub-agent parameters, each its own id stream, and
counts critical steps and PARL's spawned / finished sub-agents as for any orchestrator; a
sub-agent ends at its first turn without tool calls (its answer), its reward terms under
``subagent/``. A stage's sub-agents are taken in the order of their names (so a stage whose
first requests all came within ``stage_wait`` samples the same ids whichever came first);
which requests make a stage depends on when they come. A sub-agent fails (not finished)
when its harness edits its history (the request is refused: a sub-agent's stream cannot
restart), when the harness ends while it is out, or when the rollout stops it (turn or
context limit: its awaiting request gets 410 ``agent_stopped``); past ``max_subagents`` in
an episode a sub-agent's first request is refused (429). The harness's own next request
after the stage continues the orchestrator (``resume``). The first request of an episode is
the harness's own.

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

from swarmjax.envs.api import Step, SubAgentResult, SubAgentTask
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


class _Agent:
    """What a harness's agent and its sub-agents share: requests answered with an error,
    counted in ``refused``."""

    refused = 0

    def _refuse(self, request: Request, error: APIError) -> None:
        self.refused += 1
        request.respond(error.status, error.body())


class HarnessEnv(_Agent):
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
      stage_wait: seconds after a sub-agent's first request within which the first
        requests of others join its stage.
      max_subagents: the most sub-agents an episode may start (None: no bound).
    """

    def __init__(self, chat: ChatFormat, hub: Hub, launch: Launch, *,
                 verify: Callable[[Any, str], Mapping[str, float]] | None = None, model: str = "swarmjax",
                 timeout: float = 300.0, context: int | None = None, asynchronous: bool = False,
                 stage_wait: float = 0.2, max_subagents: int | None = None):
        self.chat, self.hub, self.launch, self.verify = chat, hub, launch, verify
        self.model, self.timeout, self.context, self.stage_wait = model, timeout, context, stage_wait
        self.max_subagents = max_subagents
        self.task: Any = None
        self.episode: Episode | None = None
        self.stream: ChatStream | None = None
        self._request: Request | None = None
        self._deadline = 0.0
        self._error: str | None = None          # what the harness raised
        self.refused = self.tool_calls = 0
        self.asynchronous = asynchronous
        self.turn_limit: int | None = None      # the awaiting request's max_tokens
        self._subs: dict[str, SubHarnessEnv] = {}   # the sub-agents of the stage under way, by name
        self._started = 0                        # sub-agents started this episode
        self._since = (0, 0)                     # (ids the next reply starts after, drift before it)

    # ------------------------------------------------------------------ HostEnv
    def reset(self, task: Any) -> np.ndarray:
        """Start the harness on ``task``; -> [P] int32: its first request's prompt ids."""
        self.task, self.refused, self.tool_calls, self._request, self._error = task, 0, 0, None, None
        self.episode = self.hub.open()
        self.stream = ChatStream(self.chat, name=f"harness-{self.episode.key[:8]}")
        self._subs, self._started, self._since, self.turn_limit = {}, 0, (0, 0), None
        self._deadline = time.monotonic() + self.timeout
        self.launch(task, self.episode)
        got = self._next(stages=False)
        if isinstance(got, Step):
            why = (f"no request within {self.timeout:g} s" if got.rewards["timeout"] else
                   f"it raised {self._error}" if self._error else "it returned without calling the model")
            raise HarnessError(f"the harness ended before its first request: {why}")
        return got

    def step(self, turn: np.ndarray, *, truncated: bool = False) -> Step:
        """Reply to the awaiting request with the sampled ``turn`` [T]; then the next
        request's ids, a new segment, a stage of sub-agents, or the end (module docstring)."""
        request, self._request = self._request, None
        if request is None:
            raise RuntimeError("step() without a request awaiting its reply")
        message, self._since = self._answer(self.stream, request, turn, truncated=truncated)
        self.tool_calls += len(message.get("tool_calls", ()))
        return self._after()

    def resume(self, results: Sequence[SubAgentResult]) -> Step:
        """A stage of sub-agents is over: a sub-agent the rollout stopped (turn or context
        limit) gets its awaiting request refused (410 ``agent_stopped``); then the harness's
        next request, another stage, or the end."""
        for r in results:
            sub = self._subs.pop(r.agent, None)
            if sub is None:
                continue
            if sub.request is not None:
                self._refuse(sub.request, APIError(410, f"sub-agent {r.agent!r} was stopped ({r.reason})",
                                                   code="agent_stopped"))
                sub.request = None
            self.episode.release(r.agent)
        return self._after()

    # ------------------------------------------------------------------ inside
    def _answer(self, stream: ChatStream, request: Request, turn: np.ndarray, *,
                truncated: bool) -> tuple[dict, tuple[int, int]]:
        """Send the sampled ``turn`` [T] as ``request``'s reply and record it in ``stream``.
        -> (the assistant message, (the ids the next reply starts after, drift so far))."""
        turn = np.asarray(turn, np.int32).reshape(-1)
        message = reply_message(self.chat, request.request, turn,
                                call_id=f"call_{self.episode.key[:12]}_{stream.trace.name}_{stream.requests}")
        prompt_len, drift = len(stream.trace), stream.template_drift
        stream.reply(turn, np.zeros(len(turn), np.float32), message)   # the rollout records the log-probs
        request.respond(200, completion(message, model=self.model, request_id=f"chatcmpl-{self.episode.key[:12]}-"
                                        f"{stream.trace.name}-{stream.requests}", prompt_tokens=prompt_len,
                                        completion_tokens=len(turn), truncated=truncated))
        return message, (prompt_len + len(turn), drift)

    def _after(self) -> Step:
        """The harness's next request after a reply (or a stage) as a :class:`Step`."""
        got = self._next()
        if isinstance(got, Step):
            return got
        since, drift = self._since
        return Step(restart=got) if self.stream.template_drift > drift else Step(reply=got[since:])

    def _render(self, stream: ChatStream, event: Request, owner: _Agent) -> np.ndarray | None:
        """``event``'s conversation in ``stream`` -> its prompt ids [P], or None when it is
        refused (400 a malformed history, or the context: the stream unchanged; counted
        in ``owner.refused``)."""
        try:
            ids = stream.prompt(event.request.messages, tools=list(event.request.tools) or None)
        except ValueError as e:
            owner._refuse(event, APIError(400, f"messages: {e}", param="messages"))
            return None
        if self.context is not None and len(ids) + 1 > self.context:
            stream.cancel()
            owner._refuse(event, context_error(self.context, len(ids)))
            return None
        return ids

    def _next(self, *, stages: bool = True) -> np.ndarray | Step:
        """Wait for the harness: its next request's prompt ids (the stream's current
        segment), a stage of the sub-agents whose first requests came (``stages``), or the
        episode's last :class:`Step`."""
        while True:
            event = self.episode.next_event(self._deadline - time.monotonic(), new_agents=stages)
            if event is None:
                return self._end(None, timeout=True)
            if isinstance(event, Finished):
                self._error = event.error
                return self._end(event.answer if event.error is None else None)
            if event.agent is not None:
                spawn = self._stage(event)
                if spawn:
                    return Step(spawn=spawn)
                continue
            ids = self._render(self.stream, event, self)
            if ids is not None:
                self._request, self.turn_limit = event, event.request.max_tokens
                return ids

    def _stage(self, first: Request) -> tuple[SubAgentTask, ...]:
        """The sub-agents whose first requests come within ``stage_wait`` seconds of each
        other, from ``first``'s on: one parallel stage (a later one opens the next), in
        the order of their names."""
        firsts, event = [], first
        while event is not None:
            firsts.append(event)
            event = self.episode.next_event(min(self.stage_wait, self._deadline - time.monotonic()),
                                            new_agents=True, own=False)
        tasks = []
        for event in sorted(firsts, key=lambda e: e.agent):
            stream = ChatStream(self.chat, name=event.agent)
            if self.max_subagents is not None and self._started >= self.max_subagents:
                self._refuse(event, APIError(429, f"this episode has started {self._started} sub-agents, its "
                                                  f"most", code="too_many_subagents"))
                ids = None
            else:
                ids = self._render(stream, event, self)
            if ids is None:
                self.episode.release(event.agent)
                continue
            self._started += 1
            sub = SubHarnessEnv(self, stream, event, ids)
            self._subs[event.agent] = sub
            tasks.append(SubAgentTask(agent=event.agent, env=sub, task=None))
        return tuple(tasks)

    def _end(self, answer: str | Scored | None, *, timeout: bool = False) -> Step:
        for sub in self._subs.values():                 # sub-agents still out when the episode ends
            if sub.request is not None:
                self._refuse(sub.request, APIError(410, "this episode is over", code="episode_closed"))
        self._subs = {}
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


class SubHarnessEnv(_Agent):
    """A sub-agent of a harness episode (the requests naming it, ``X-Agent-Id``): a
    :class:`~swarmjax.envs.api.HostEnv` the rollout runs in a stage with the frozen
    sub-agent parameters (module docstring). Its reward terms (its own ``requests``,
    ``tool_calls``, ``refused``, ``template_drift``) come with its last step."""

    def __init__(self, parent: HarnessEnv, stream: ChatStream, first: Request, ids: np.ndarray):
        self.parent, self.stream, self.request, self._ids = parent, stream, first, ids
        self.turn_limit = first.request.max_tokens
        self.refused = self.tool_calls = 0

    def reset(self, task: Any) -> np.ndarray:
        """-> [P] int32: its first request's prompt ids (already rendered)."""
        return self._ids

    def step(self, turn: np.ndarray, *, truncated: bool = False) -> Step:
        """Reply with the sampled ``turn`` [T]; a turn without tool calls is the
        sub-agent's answer (done), else its next request's ids [R]; done without an
        answer when the harness edits its history or ends first."""
        p, request, self.request = self.parent, self.request, None
        message, (since, drift) = p._answer(self.stream, request, turn, truncated=truncated)
        self.tool_calls += len(message.get("tool_calls", ()))
        if not message.get("tool_calls"):
            return self._done(message.get("content") or "")
        while True:
            event = p.episode.next_event(p._deadline - time.monotonic(), agent=self.stream.trace.name)
            if event is None:
                return self._done(None)
            ids = p._render(self.stream, event, self)
            if ids is None:
                continue
            if self.stream.template_drift > drift:       # a sub-agent's stream cannot restart
                self.stream.cancel()
                self._refuse(event, APIError(400, "messages: a sub-agent's request extends its conversation (its "
                                                  "history was edited)", param="messages", code="history_edited"))
                return self._done(None)
            self.request, self.turn_limit = event, event.request.max_tokens
            return Step(reply=ids[since:])

    def resume(self, results: Sequence[SubAgentResult]) -> Step:
        raise RuntimeError("a harness's sub-agent starts no sub-agents of its own through the rollout")

    def _done(self, answer: str | None) -> Step:
        self.parent.episode.release(self.stream.trace.name)
        return Step(done=True, answer=answer, rewards={
            "requests": float(self.stream.requests), "tool_calls": float(self.tool_calls),
            "refused": float(self.refused), "template_drift": float(self.stream.template_drift)})
