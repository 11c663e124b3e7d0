"""Where HTTP requests meet the episodes that answer them.

A :class:`Hub` holds the open episodes, each under a key of 128 random bits (the
harness sends it with every request: the ``X-Episode-Id`` header, or the ``user``
field). An :class:`Episode` is a queue of what its harness did: a request that awaits a
reply (:class:`Request`), or the harness's end (:class:`Finished`: its answer, or the
error it raised). The engine side (:class:`~swarmjax.serve.harness_env.HarnessEnv`)
takes the events in order and answers each request once.

Agents: a harness that starts sub-agents names each one's requests (the ``X-Agent-Id``
header); its own requests name none. Each agent of an episode has its own events, so the
engine serves the orchestrator and its sub-agents concurrently (a sub-agent's first
request is what starts it: :meth:`Episode.next_event` with ``new_agents``).

Isolation: a key names one episode; a request without a known key is refused (404), and
one whose episode is over gets 410, so no request reads or extends another episode's
stream. An agent serves one request at a time: a second while one awaits is refused
(409), since a stream cannot fork.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from swarmjax.serve.protocol import APIError, ChatRequest

__all__ = ["Hub", "Episode", "Request", "Finished", "Scored", "refuse_queued"]

Respond = Callable[[int, dict], None]     # (HTTP status, JSON body) -> None; called once


@dataclasses.dataclass
class Request:
    """A harness request awaiting its reply: call ``respond(status, body)`` once."""

    request: ChatRequest
    respond: Respond
    received: float = dataclasses.field(default_factory=time.monotonic)
    agent: str | None = None          # the sub-agent it is for (None: the harness's own agent)


@dataclasses.dataclass(frozen=True)
class Scored:
    """What a harness that scores its own episodes returns (an environment hub whose
    rubric runs with its rollout, :mod:`swarmjax.envs.verifiers`): the final answer text
    and its reward terms (``"r_perf"`` the task reward), taken in place of the task's
    verifier."""

    answer: str
    rewards: Mapping[str, float]


@dataclasses.dataclass(frozen=True)
class Finished:
    """The harness returned ``answer`` (a str or :class:`Scored`; None when it returned
    nothing) or raised ``error`` (its text)."""

    answer: "str | Scored | None" = None
    error: str | None = None


def refuse(events: Iterable, error: APIError) -> None:
    """Answer every :class:`Request` in ``events`` with ``error`` (other events are dropped)."""
    for ev in events:
        if isinstance(ev, Request):
            ev.respond(error.status, error.body())


def refuse_queued(events: queue.Queue, error: APIError) -> None:
    """:func:`refuse` what is still in the queue ``events``, until it is empty."""
    while True:
        try:
            refuse([events.get_nowait()], error)
        except queue.Empty:
            return


class Episode:
    """One harness episode's side of the server (module docstring)."""

    def __init__(self, key: str):
        self.key = key
        self._cond = threading.Condition()
        self._events: dict[str | None, collections.deque] = collections.defaultdict(collections.deque)
        self._awaiting: set[str | None] = set()
        self._claimed: set[str] = set()    # sub-agents an engine serves
        self.closed = False
        self.requests = 0                  # requests accepted

    def submit(self, request: ChatRequest, respond: Respond, *, agent: str | None = None) -> None:
        """A request from the harness (HTTP side), for ``agent`` (None: its own). Raises
        :class:`APIError` 410 when the episode is over, 409 when a request of the same
        agent already awaits its reply."""
        with self._cond:
            if self.closed:
                raise APIError(410, "this episode is over; its stream takes no more requests",
                               code="episode_closed")
            if agent in self._awaiting:
                raise APIError(409, "a request of this agent awaits its reply: an agent's requests are "
                                    "sequential (give a concurrent agent a name of its own: the X-Agent-Id header)",
                               code="request_in_flight")
            self._awaiting.add(agent)
            self.requests += 1

            def once(status: int, body: dict) -> None:
                with self._cond:
                    self._awaiting.discard(agent)
                respond(status, body)

            self._events[agent].append(Request(request, once, agent=agent))
            self._cond.notify_all()

    def finish(self, answer: Any = None, *, error: BaseException | str | None = None) -> None:
        """The harness ended (its thread): returned ``answer`` (text, or a :class:`Scored`
        answer, kept as it is) or raised ``error``."""
        text = None if answer is None else answer if isinstance(answer, Scored) else str(answer)
        with self._cond:
            self._events[None].append(Finished(text, None if error is None else f"{type(error).__name__}: {error}"
                                               if isinstance(error, BaseException) else str(error)))
            self._cond.notify_all()

    def next_event(self, timeout: float | None, *, agent: str | None = None, new_agents: bool = False,
                   own: bool = True) -> Request | Finished | None:
        """The next event of ``agent`` (engine side; None: the harness's own agent and its
        end; ``own=False``: none of them), or with ``new_agents`` the first request of a
        sub-agent no engine serves yet (it is then claimed: :meth:`release` gives it
        back); None after ``timeout`` seconds, or for a sub-agent once the harness has
        ended or the episode is closed."""
        deadline = None if timeout is None else time.monotonic() + max(timeout, 0.0)
        with self._cond:
            while True:
                if own and self._events[agent]:
                    return self._events[agent].popleft()
                if agent is not None and (self.closed or any(isinstance(e, Finished) for e in self._events[None])):
                    return None                # a sub-agent waits no longer once its harness has ended
                if new_agents:
                    for name, events in self._events.items():
                        if name is not None and name not in self._claimed and events:
                            self._claimed.add(name)
                            return events.popleft()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._cond.wait(left)

    def release(self, agent: str) -> None:
        """``agent``'s engine is done: a later request of that name starts a new sub-agent."""
        with self._cond:
            self._claimed.discard(agent)

    def close(self) -> None:
        """The episode is over (engine side): later requests get 410, and those still
        queued are answered with it."""
        with self._cond:
            self.closed = True
            queued = [ev for events in self._events.values() for ev in events]
            self._events.clear()
            self._cond.notify_all()
        refuse(queued, APIError(410, "this episode is over", code="episode_closed"))


class Hub:
    """The open episodes by key (module docstring). Thread-safe."""

    def __init__(self):
        self._episodes: dict[str, Episode] = {}
        self._closed: set[str] = set()         # keys of episodes that are over (410, not 404)
        self._lock = threading.Lock()

    def open(self) -> Episode:
        """A new episode under a fresh random key."""
        ep = Episode(secrets.token_hex(16))
        with self._lock:
            self._episodes[ep.key] = ep
        return ep

    def get(self, key: str | None) -> Episode:
        """The episode of ``key``; :class:`APIError` 404 for a missing or unknown key."""
        if not key:
            raise APIError(404, "no episode named: send the episode id in the X-Episode-Id header or the user "
                                "field", param="user", code="episode_not_found")
        with self._lock:
            ep = self._episodes.get(key)
            closed = key in self._closed
        if closed:
            raise APIError(410, "this episode is over; its stream takes no more requests", code="episode_closed")
        if ep is None:
            raise APIError(404, "unknown episode id", param="user", code="episode_not_found")
        return ep

    def close(self, ep: Episode) -> None:
        """Close ``ep`` and forget it."""
        ep.close()
        with self._lock:
            self._episodes.pop(ep.key, None)
            self._closed.add(ep.key)

    def __len__(self) -> int:
        with self._lock:
            return len(self._episodes)
