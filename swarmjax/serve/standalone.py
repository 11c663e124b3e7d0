"""Any checkpoint behind an OpenAI-compatible chat endpoint, on the rollout engine
(``swarmjax serve --hf DIR``).

Every request is self-contained, as in OpenAI's API (the whole history each time). The
engine is one :class:`~swarmjax.swarm.text_rollout.TextRollout` over ``slots`` rows
that runs while the server does. Each row belongs to a :class:`Slot`, an asynchronous
environment: it takes the next request from the :class:`Inbox`, renders the
conversation (the chat format's template, tools included) as the ids of a new segment
of its row (``Step(restart=...)``), and answers with the turn the row sampled (tool
calls parsed: :func:`~swarmjax.serve.harness_env.reply_message`). A request that comes
while others decode takes a free row and joins the next decode segment: continuous
batching at segment granularity (``TextRolloutConfig.segment_exit``). A row whose slot
waits for a request idles; with no request at all, nothing runs.

The rollout keeps every segment it served (a trajectory), so the engine serves in
*rounds*: after ``requests_per_slot`` requests a slot closes the round, the other slots
finish what they hold (waiting ones close at once), the rollout returns and the next
round starts on fresh rows; requests that come meanwhile wait in the inbox (first in,
first out). Sampling is the server's (``ServeConfig.sampling``), whatever a request's
``temperature``; its ``max_tokens`` bounds its turn (at most ``max_tokens`` of the config).
"""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from swarmjax.envs.api import Step
from swarmjax.models.config import ModelConfig
from swarmjax.roles import Roles
from swarmjax.sampling.processors import SamplingConfig
from swarmjax.serve.harness_env import context_error, reply_message
from swarmjax.serve.hub import Request, Respond, refuse_queued
from swarmjax.serve.protocol import APIError, ChatRequest, completion
from swarmjax.swarm.context import MAX_SEGMENTS, ContextConfig
from swarmjax.swarm.text_rollout import TextRollout
from swarmjax.swarm.text_types import TextRolloutConfig
from swarmjax.text.chat import ChatFormat

__all__ = ["ServeConfig", "ChatEngine", "Inbox", "Slot"]


@dataclasses.dataclass(frozen=True)
class ServeConfig:
    """What ``swarmjax serve`` runs.

    slots: rows decoding at once (requests beyond them wait for a free one).
    context: ids a conversation may hold, its reply included (a longer one is refused
      with ``context_length_exceeded``).
    max_tokens: the most ids one reply may sample (``finish_reason`` ``length`` past it).
    requests_per_slot: requests a slot serves before its round ends (the rollout's
      trajectory of a round is then dropped: this bounds what a long-running server holds).
    sampling: how every reply is sampled (temperature 0: greedy).
    """

    slots: int = 16
    context: int = 4096
    max_tokens: int = 512
    requests_per_slot: int = 64
    sampling: SamplingConfig = SamplingConfig(temperature=0.0)

    def __post_init__(self):
        if min(self.slots, self.context, self.max_tokens, self.requests_per_slot) < 1:
            raise ValueError("slots, context, max_tokens and requests_per_slot must be >= 1")
        if self.max_tokens >= self.context:
            raise ValueError(f"max_tokens ({self.max_tokens}) must be below the context ({self.context})")
        if self.requests_per_slot >= MAX_SEGMENTS:
            raise ValueError(f"requests_per_slot must be below {MAX_SEGMENTS} (a row's segments each have "
                             "a sampling key of their own)")


class Inbox:
    """The requests no slot has taken yet; what the HTTP front routes every request to
    (it stands where a training job's :class:`~swarmjax.serve.hub.Hub` does)."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self.closing = threading.Event()       # the round ends: waiting slots stop taking requests
        self.stopping = threading.Event()      # the server stops (never cleared)
        self.refusal: APIError | None = None   # set: the server takes no more requests

    def get(self, key: str | None) -> Inbox:
        """Every request goes to the one inbox (an episode id or ``user`` is ignored)."""
        return self

    def submit(self, request: ChatRequest, respond: Respond, *, agent: str | None = None) -> None:
        """A request (HTTP side); a standalone server's requests are independent, so the
        agent they name changes nothing."""
        if self.refusal is not None:
            raise self.refusal
        self._queue.put(Request(request, respond))

    def take(self, *, poll: float = 0.1) -> Request | None:
        """The oldest request (waiting for one: a request is taken as it comes, the round's
        close is seen within ``poll`` seconds); None once the round is closing."""
        while not (self.closing.is_set() or self.stopping.is_set()):
            try:
                return self._queue.get(timeout=poll)
            except queue.Empty:
                pass
        return None

    def refuse_all(self, error: APIError) -> None:
        """Take no more requests and answer the waiting ones with ``error``."""
        self.refusal = error
        refuse_queued(self._queue, error)


class Slot:
    """One row's environment: the requests it serves, one segment each (module docstring)."""

    asynchronous = True              # the rollout decodes the other rows while it waits

    def __init__(self, engine: ChatEngine):
        self.engine = engine
        self.served = 0
        self.turn_limit: int | None = None   # the held request's max_tokens (TextRollout reads it)
        self.held: Request | None = None     # the request its row is answering
        self._prompt_len = 0

    def reset(self, task: Any) -> np.ndarray | None:
        return self._next()

    def step(self, turn: np.ndarray, *, truncated: bool = False) -> Step:
        req, self.held = self.held, None
        turn = np.asarray(turn, np.int32).reshape(-1)
        e = self.engine
        n = next(e.counter)
        message = reply_message(e.chat, req.request, turn, call_id=f"call_{n}")
        req.respond(200, completion(message, model=e.model, request_id=f"chatcmpl-{n}",
                                    prompt_tokens=self._prompt_len, completion_tokens=len(turn),
                                    truncated=truncated))
        self.served += 1
        if self.served >= e.config.requests_per_slot:
            e.inbox.closing.set()
            return Step(done=True)
        ids = self._next()
        return Step(done=True) if ids is None else Step(restart=ids)

    def resume(self, results: Sequence[Any]) -> Step:
        raise RuntimeError("a served conversation starts no sub-agents")

    def _next(self) -> np.ndarray | None:
        """The next request's prompt ids (bad ones answered with their error); None when
        the round closes."""
        e = self.engine
        while (req := e.inbox.take()) is not None:
            r = req.request
            try:
                try:          # the whole conversation (check_request: it ends with a user or tool message)
                    ids = e.chat.conversation_ids(r.messages, tools=list(r.tools) or None)
                except ValueError as err:
                    raise APIError(400, f"messages: {err}", param="messages") from None
                if len(ids) + 1 > e.config.context:
                    raise context_error(e.config.context, len(ids))
            except APIError as err:
                req.respond(err.status, err.body())
                continue
            self.held, self._prompt_len = req, len(ids)
            self.turn_limit = min(r.max_tokens or e.config.max_tokens, e.config.max_tokens)
            return ids
        return None


class ChatEngine:
    """The rollout engine serving the inbox's requests from a background thread.

    >>> engine = ChatEngine(params, cfg, chat, model="my-model").start()
    >>> server = HarnessServer(engine.inbox, model="my-model").start()   # the HTTP front

    Args:
      params: the model's parameters; cfg: its :class:`ModelConfig`.
      chat: the chat format (its tokenizer inside) requests are rendered in.
      stop_ids: ids that end a reply (default: the chat format's).
      model: the name replies carry.
      config: :class:`ServeConfig`.
      seed: the sampling key's seed (each round folds in its number).
    """

    def __init__(self, params: Any, cfg: ModelConfig, chat: ChatFormat, *, stop_ids: Sequence[int] | None = None,
                 model: str = "swarmjax", config: ServeConfig = ServeConfig(), seed: int = 0):
        self.params, self.chat, self.model, self.config = params, chat, model, config
        rcfg = TextRolloutConfig(contexts=Roles(config.context, 16), max_turn_tokens=config.max_tokens,
                                 subagent_lanes=1, subagent_turns=1, sampling=Roles.both(config.sampling),
                                 env_threads=1, async_wait=0.0,     # a request joins the next segment as it comes
                                 context=ContextConfig("none", max_compactions=config.requests_per_slot))
        self.rollout = TextRollout(cfg, rcfg, stop_ids=chat.stop_ids if stop_ids is None else stop_ids)
        self.inbox = Inbox()
        self.counter = itertools.count()
        self.key = jax.random.key(seed)
        self.rounds = 0                  # rounds finished
        self._served_before = 0          # requests answered in finished rounds
        self.failure: BaseException | None = None
        self._slots: list[Slot] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def served(self) -> int:
        """Requests answered so far (finished rounds and the current one)."""
        return self._served_before + sum(s.served for s in self._slots)

    def start(self) -> ChatEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="swarmjax-engine", daemon=True)
            self._thread.start()
        return self

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                self.inbox.closing.clear()
                self._slots = [Slot(self) for _ in range(self.config.slots)]
                self.rollout(Roles.both(self.params), self._slots, [None] * len(self._slots),
                             jax.random.fold_in(self.key, self.rounds))
                self._served_before += sum(s.served for s in self._slots)
                self._slots = []
                self.rounds += 1
        except BaseException as e:  # noqa: BLE001 - every waiting client gets the error
            self.failure = e
            self.inbox.stopping.set()                # the slots' threads stop waiting
            error = APIError(500, f"the engine failed: {type(e).__name__}: {e}", type="server_error")
            for s in self._slots:
                if s.held is not None:
                    s.held.respond(error.status, error.body())
            self.inbox.refuse_all(error)

    def stop(self) -> None:
        """Finish the requests being decoded, refuse the waiting ones (503), stop."""
        self._stop.set()
        self.inbox.stopping.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.inbox.refuse_all(APIError(503, "the server is shutting down", type="server_error",
                                       code="server_shutdown"))
        self.rollout.close()
