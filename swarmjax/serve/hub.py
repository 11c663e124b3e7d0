"""Where HTTP requests meet the episodes that answer them.

A :class:`Hub` holds the open episodes, each under a key of 128 random bits (the
harness sends it with every request: the ``X-Episode-Id`` header, or the ``user``
field). An :class:`Episode` is a queue of what its harness did: a request that awaits a
reply (:class:`Request`), or the harness's end (:class:`Finished`: its answer, or the
error it raised). The engine side (:class:`~swarmjax.serve.harness_env.HarnessEnv`)
takes the events in order and answers each request once.

Isolation: a key names one episode; a request without a known key is refused (404), and
one whose episode is over gets 410, so no request reads or extends another episode's
stream. An episode serves one request at a time: a second while one awaits is refused
(409), since a stream cannot fork.
"""

from __future__ import annotations

import dataclasses
import queue
import secrets
import threading
import time
from collections.abc import Callable, Mapping
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


def refuse_queued(events: queue.Queue, error: APIError) -> None:
    """Answer every :class:`Request` still in ``events`` with ``error`` (other events
    are dropped), until the queue is empty."""
    while True:
        try:
            ev = events.get_nowait()
        except queue.Empty:
            return
        if isinstance(ev, Request):
            ev.respond(error.status, error.body())


class Episode:
    """One harness episode's side of the server (module docstring)."""

    def __init__(self, key: str):
        self.key = key
        self._events: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._awaiting = False
        self.closed = False
        self.requests = 0                 # requests accepted
        self.refused = 0                  # requests refused (4xx) after they were accepted by the HTTP layer

    def submit(self, request: ChatRequest, respond: Respond) -> None:
        """A request from the harness (HTTP side). Raises :class:`APIError` 410 when the
        episode is over, 409 when a request already awaits its reply."""
        with self._lock:
            if self.closed:
                raise APIError(410, "this episode is over; its stream takes no more requests",
                               code="episode_closed")
            if self._awaiting:
                raise APIError(409, "a request of this episode awaits its reply: an episode's requests are "
                                    "sequential (give a concurrent agent an episode of its own)",
                               code="episode_busy")
            self._awaiting = True
            self.requests += 1

        def once(status: int, body: dict) -> None:
            with self._lock:
                self._awaiting = False
            respond(status, body)

        self._events.put(Request(request, once))

    def finish(self, answer: Any = None, *, error: BaseException | str | None = None) -> None:
        """The harness ended (its thread): returned ``answer`` (text, or a
        :class:`~swarmjax.serve.harness_env.Scored` answer, kept as it is) or raised ``error``."""
        text = None if answer is None else answer if isinstance(answer, Scored) else str(answer)
        self._events.put(Finished(text,
                                  None if error is None else f"{type(error).__name__}: {error}"
                                  if isinstance(error, BaseException) else str(error)))

    def next_event(self, timeout: float | None) -> Request | Finished | None:
        """The harness's next event (engine side), or None after ``timeout`` seconds."""
        try:
            return self._events.get(timeout=None if timeout is None else max(timeout, 0.0))
        except queue.Empty:
            return None

    def close(self) -> None:
        """The episode is over (engine side): later requests get 410, and one still
        queued is answered with it."""
        with self._lock:
            self.closed = True
        refuse_queued(self._events, APIError(410, "this episode is over", code="episode_closed"))


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
